// Goodput under failures: a worked Young/Daly example, the checkpoint size, the cited defaults,
// and capacity's failure-aware figures.
#include <gtest/gtest.h>

#include <cmath>

#include "default_software.hpp"
#include "sim/capacity.hpp"
#include "sim/goodput.hpp"
#include "sim/model_spec.hpp"

namespace {

using namespace trainplan;

TEST(Goodput, WorkedExample) {
  // 1000 GPUs, each with an MTBF of 10,000 h: the job's MTBF M = 10 h = 36,000 s.
  // Checkpoint 1.2 TB written at 0.01 GB/s per GPU (10 GB/s for the job): C = 120 s.
  // Young/Daly: tau = sqrt(2 x 120 x 36000) = 2939.388 s (49 minutes).
  // Restart R = 10 min + reading the checkpoint back (120 s) = 720 s. A failure loses on average
  // (tau + C) / 2 = 1529.694 s of work.
  // goodput = (1 - (720 + 1529.694) / 36000) / (1 + 120 / 2939.388) = 0.937509 / 1.040825 = 0.900736.
  Reliability r;
  r.mtbf_gpu_hours = 10000;
  r.checkpoint_per_gpu = 0.01e9;
  r.restart = 600;
  const Goodput g = goodput(r, 1000, 1.2e12, 2.0);
  EXPECT_DOUBLE_EQ(g.job_mtbf, 36000);
  EXPECT_DOUBLE_EQ(g.checkpoint_write, 120);
  EXPECT_NEAR(g.interval, 2939.388, 1e-3);
  EXPECT_NEAR(g.interval_steps, 2939.388 / 2, 1e-3);
  EXPECT_DOUBLE_EQ(g.restart, 720);
  EXPECT_NEAR(g.goodput, 0.900736, 1e-6);
  // Per day: 2.4 failures, 3671.27 s of lost work, 1728 s restarting, 3177.14 s checkpointing,
  // and the useful 0.900736 x 86400 s: a whole day.
  EXPECT_DOUBLE_EQ(g.failures_per_day, 2.4);
  EXPECT_NEAR(g.lost_work_per_day, 3671.265, 1e-3);
  EXPECT_NEAR(g.restart_per_day, 1728, 1e-9);
  EXPECT_NEAR(g.checkpoint_per_day, 3177.135, 1e-3);
  EXPECT_NEAR(g.lost_work_per_day + g.restart_per_day + g.checkpoint_per_day + 86400 * g.goodput, 86400, 1e-6);
}

TEST(Goodput, NoProgressWhenRestartsOutlastTheMtbf) {
  Reliability r;
  r.mtbf_gpu_hours = 1;  // 1000 GPUs: a failure every 3.6 s
  r.checkpoint_per_gpu = 1e9;
  r.restart = 600;
  EXPECT_EQ(goodput(r, 1000, 1e12, 1.0).goodput, 0.0);
}

TEST(Goodput, CheckpointHoldsWeightsAndOptimizerStates) {
  const LayerGraph g(load_model("llama3-70b", TRAINPLAN_SOURCE_DIR), 8192);
  Strategy s;
  s.dtype = Dtype::bf16;
  // Mixed-precision Adam: 2 B weights + 12 B master weights and moments per parameter.
  EXPECT_DOUBLE_EQ(checkpoint_bytes(g, s), 14 * g.total_params());
}

TEST(Goodput, DefaultsFollowLlama3sInterruptionRate) {
  // 419 unexpected interruptions in 54 days on 16,384 GPUs (Dubey et al. 2024, Sec. 3.3.4).
  const Reliability r = load_reliability("default", TRAINPLAN_SOURCE_DIR);
  EXPECT_NEAR(r.mtbf_gpu_hours, 16384.0 * 54 * 24 / 419, 1.0);
  EXPECT_NEAR(r.checkpoint_per_gpu, 2000e9 / 16384, 0.001e9);  // 2 TB/s over 16,384 GPUs (Sec. 3.3.1)
  EXPECT_GT(r.restart, 0);
}

TEST(Goodput, CapacityDividesByGoodputAndReSearchesWithoutANode) {
  const LayerGraph g(load_model("llama2-7b", TRAINPLAN_SOURCE_DIR), 4096);
  CapacityRequest req;
  req.software = trainplan::testing::default_software();
  req.clusters = {load_cluster("dgx-h100", TRAINPLAN_SOURCE_DIR)};
  req.gpus_lo = 16;
  req.gpus_hi = 32;
  req.tokens = 300e9;
  req.global_batch = 256;
  req.reliability = load_reliability("default", TRAINPLAN_SOURCE_DIR);
  req.elastic = true;
  req.threads = 1;
  const CapacityResult r = plan_capacity(g, req);
  ASSERT_EQ(r.options.size(), 2u);
  for (const CapacityOption& o : r.options) {
    ASSERT_TRUE(o.feasible && o.with_failures);
    const Goodput& gp = o.goodput;
    EXPECT_GT(gp.goodput, 0.5);
    EXPECT_LT(gp.goodput, 1.0);
    EXPECT_DOUBLE_EQ(gp.interval, std::sqrt(2 * gp.checkpoint_write * gp.job_mtbf));
    EXPECT_DOUBLE_EQ(o.days_with_failures, o.days / gp.goodput);
    EXPECT_DOUBLE_EQ(o.cost_usd_with_failures, o.cost_usd / gp.goodput);
    ASSERT_TRUE(o.elastic.has_value());
    EXPECT_EQ(o.elastic->gpus, o.gpus - 8);
    ASSERT_TRUE(o.elastic->feasible) << o.elastic->why;
    EXPECT_LE(o.elastic->best.strategy.gpus(), o.gpus - 8);
    EXPECT_GT(o.elastic->throughput_share, 0);
    EXPECT_LT(o.elastic->throughput_share, 1);
    EXPECT_GT(o.elastic->resume, req.reliability->restart);
  }
  // The 32-GPU option restarts on at most the 24 GPUs left, slower than it ran on 32.
  EXPECT_LT(r.options[1].elastic->best.throughput.tokens_per_s, r.options[1].best.throughput.tokens_per_s);
}

}  // namespace
