// capacity: GPU counts tried, the figures derived from each best layout, and the picks.
#include <gtest/gtest.h>

#include "sim/capacity.hpp"
#include "sim/check.hpp"
#include "sim/predict.hpp"
#include "default_software.hpp"

namespace {

using namespace trainplan;

Cluster cluster(const std::string& name) { return load_cluster(name, TRAINPLAN_SOURCE_DIR); }

TEST(Capacity, GpuCountsAreWholeNodesInPowersOfTwo) {
  const Cluster a100 = cluster("dgx-a100-80g");  // 8 per node, 8192 at most
  ASSERT_EQ(a100.max_gpus(), 8192);
  EXPECT_EQ(capacity_gpu_counts(a100, 0, 0), (std::vector<int>{8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192}));
  EXPECT_EQ(capacity_gpu_counts(a100, 20, 100), (std::vector<int>{32, 64}));
  EXPECT_EQ(capacity_gpu_counts(a100, 5000, 8000), std::vector<int>{});
  EXPECT_EQ(capacity_gpu_counts(a100, 9000, 20000), std::vector<int>{});
}

TEST(Capacity, FiguresFollowFromTheBestLayout) {
  // Llama-2-7B on 300B tokens, 8..64 GPUs of two cluster kinds.
  const LayerGraph g(load_model("llama2-7b", TRAINPLAN_SOURCE_DIR), 4096);
  CapacityRequest req;
  req.software = trainplan::testing::default_software();
  req.clusters = {cluster("dgx-a100-80g"), cluster("dgx-h100")};
  req.gpus_lo = 8;
  req.gpus_hi = 64;
  req.tokens = 300e9;
  req.global_batch = 256;
  req.deadline_days = 60;
  req.budget_usd = 2e6;
  const CapacityResult r = plan_capacity(g, req);
  ASSERT_EQ(r.options.size(), 8u);  // 8, 16, 32, 64 GPUs x 2 kinds
  for (const CapacityOption& o : r.options) {
    ASSERT_TRUE(o.feasible) << o.cluster << " " << o.gpus << ": " << o.why;
    EXPECT_EQ(o.best.strategy.gpus(), o.gpus);
    const Cluster c = cluster(o.cluster);
    // Hand-checkable chain: hours = tokens / (tokens/s) / 3600, and the rest from it.
    EXPECT_NEAR(o.hours, 300e9 / o.best.throughput.tokens_per_s / 3600, 1e-9 * o.hours);
    EXPECT_NEAR(o.days, o.hours / 24, 1e-12 * o.days);
    EXPECT_NEAR(o.gpu_hours, o.gpus * o.hours, 1e-9 * o.gpu_hours);
    EXPECT_NEAR(o.cost_usd, o.gpu_hours * c.price_per_gpu_hour, 1e-9 * o.cost_usd);
    EXPECT_NEAR(o.energy_kwh, c.power_per_gpu * o.gpus * o.hours / 1000, 1e-9 * o.energy_kwh);
    // The layout is what predict says of it, and it is feasible.
    const Estimate e = predict(g, c, o.best.strategy);
    EXPECT_TRUE(e.feasible);
    EXPECT_DOUBLE_EQ(e.time.step, o.best.time.step);
  }
  // Cheapest within the deadline: meets it, and nothing cheaper does.
  ASSERT_TRUE(r.cheapest_in_deadline.has_value());
  const CapacityOption& cheap = r.options[*r.cheapest_in_deadline];
  EXPECT_LE(cheap.days, 60);
  for (const auto& o : r.options)
    if (o.days <= 60) {
      EXPECT_GE(o.cost_usd, cheap.cost_usd);
    }
  // Fastest within the budget: fits it, and nothing faster does.
  ASSERT_TRUE(r.fastest_in_budget.has_value());
  const CapacityOption& fast = r.options[*r.fastest_in_budget];
  EXPECT_LE(fast.cost_usd, 2e6);
  for (const auto& o : r.options)
    if (o.cost_usd <= 2e6) {
      EXPECT_GE(o.days, fast.days);
    }
  // Pareto front over (cost, time): sorted by time, cost strictly falling, and no option beats
  // a front member on both.
  ASSERT_FALSE(r.pareto.empty());
  for (std::size_t k = 1; k < r.pareto.size(); ++k) {
    EXPECT_LE(r.options[r.pareto[k - 1]].days, r.options[r.pareto[k]].days);
    EXPECT_GT(r.options[r.pareto[k - 1]].cost_usd, r.options[r.pareto[k]].cost_usd);
  }
  for (std::size_t i : r.pareto)
    for (const auto& o : r.options)
      EXPECT_FALSE(o.days < r.options[i].days && o.cost_usd < r.options[i].cost_usd);
}

TEST(Capacity, InfeasibleSizesSayWhyAndImpossibleGoalsPickNothing) {
  // Llama-3-70B does not fit on one node of A100-80GB (1.1 TB of model states); fp8 is not an
  // A100 precision, so every A100 option is infeasible with that reason.
  const LayerGraph g(load_model("llama3-70b", TRAINPLAN_SOURCE_DIR), 8192);
  CapacityRequest req;
  req.software = trainplan::testing::default_software();
  req.clusters = {cluster("dgx-a100-80g")};
  req.gpus_lo = 8;
  req.gpus_hi = 8;
  req.tokens = 1e12;
  req.global_batch = 64;
  req.deadline_days = 1;
  CapacityResult r = plan_capacity(g, req);
  ASSERT_EQ(r.options.size(), 1u);
  EXPECT_FALSE(r.options[0].feasible);
  EXPECT_EQ(r.options[0].why, "out of memory");
  EXPECT_FALSE(r.cheapest_in_deadline.has_value());
  EXPECT_TRUE(r.pareto.empty());

  req.dtype = Dtype::fp8;
  r = plan_capacity(g, req);
  EXPECT_FALSE(r.options[0].feasible);
  EXPECT_NE(r.options[0].why.find("unsupported dtype"), std::string::npos);

  req.tokens = 0;
  EXPECT_THROW(plan_capacity(g, req), InputError);
}

// The buyer's comparison: one option per cluster, each its cheapest within the deadline, ranked by
// cost; a price given for a cluster replaces its file's in every figure.
TEST(Capacity, BuyersComparisonRanksEachClustersCheapestInTheDeadline) {
  const LayerGraph g(load_model("llama2-7b", TRAINPLAN_SOURCE_DIR), 4096);
  CapacityRequest req;
  req.software = trainplan::testing::default_software();
  req.clusters = {cluster("dgx-a100-80g"), cluster("dgx-h100"), cluster("dgx-b200")};
  req.prices = {{"dgx-b200", 4.0}};
  req.gpus_lo = 8;
  req.gpus_hi = 64;
  req.tokens = 300e9;
  req.global_batch = 256;
  req.deadline_days = 60;
  req.reliability = load_reliability("default", TRAINPLAN_SOURCE_DIR);  // the picks read failure-aware figures
  const CapacityResult r = plan_capacity(g, req);
  EXPECT_EQ(r.ranking_rule, RankingRule::cheapest_in_deadline);
  ASSERT_EQ(r.ranking.size(), 3u);
  for (const CapacityOption& o : r.options) {
    EXPECT_EQ(o.price_given, o.cluster == "dgx-b200");
    if (o.cluster == "dgx-b200" && o.feasible) {
      EXPECT_DOUBLE_EQ(o.price_per_gpu_hour, 4.0);
      EXPECT_NEAR(o.cost_usd, o.gpu_hours * 4.0, 1e-9 * o.cost_usd);
    }
  }
  for (std::size_t k = 0; k < r.ranking.size(); ++k) {
    const CapacityOption& pick = r.options[r.ranking[k]];
    EXPECT_LE(pick.days_with_failures, 60);
    // Nothing of the same cluster within the deadline is cheaper; the ranking is by cost.
    for (const CapacityOption& o : r.options) {
      if (o.cluster == pick.cluster && o.feasible && o.days_with_failures <= 60) {
        EXPECT_GE(o.cost_usd_with_failures, pick.cost_usd_with_failures);
      }
    }
    if (k > 0) {
      EXPECT_LE(r.options[r.ranking[k - 1]].cost_usd_with_failures, pick.cost_usd_with_failures);
    }
  }
  // Without a deadline or budget: each cluster's cheapest option; with a budget only: its fastest
  // within it, ranked by time.
  req.deadline_days.reset();
  req.budget_usd = 1e6;
  const CapacityResult b = plan_capacity(g, req);
  EXPECT_EQ(b.ranking_rule, RankingRule::fastest_in_budget);
  for (std::size_t k = 1; k < b.ranking.size(); ++k) {
    EXPECT_LE(b.options[b.ranking[k - 1]].days_with_failures, b.options[b.ranking[k]].days_with_failures);
  }
  req.prices = {{"dgx-z9000", 1.0}};
  EXPECT_THROW(plan_capacity(g, req), InputError);
}

}  // namespace
