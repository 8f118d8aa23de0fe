// The two time engines agree: predict's closed form (compose) and the discrete-event step
// simulator (simulate) cost the same StepCosts, and both charge overlapped communication at
// StepCosts::overlap_cost_rate of the software profile's overlap share (DP reductions, ZeRO-1/2
// parameter all-gather, ZeRO-3 gathers, pipeline sends), count the same sends per stage (one
// fewer at each end of the pipeline), run each ZeRO-3 gather under the slot it serves and send
// the step's last gradients in per-layer buckets whose last one shows. They still differ where
// the simulator sees more than the closed form: the real pipeline fill and drain of unequal
// stages, collectives that queue behind each other on the dp stream. Both advance compute at
// 1 - rate while a collective runs (exposed_comm, predict.hpp), so a ZeRO-3 stream of gathers
// that outlasts the compute sets the pace in both. Those effects are small for the layouts
// below: the test holds both within 2% for every case (measured: -0.8% to +1.0%).
//
// The sweep: ZeRO 0-3 x the three schedules x DP > 1 (with and without pipeline stages, with
// tensor parallelism) x six shipped software profiles (the four of today's stacks and two that
// overlap nothing, megatron-lm-2021 and aleph-alpha-scaling), on five plans over two clusters.
// deepspeed-zero3-2021 is left out: its capped ZeRO-3 traffic outlasts the compute, and with
// pipeline stages (which DeepSpeed's pipeline engine never ran with ZeRO-3) the simulator hides
// part of it in the pipeline's idle time where the closed form cannot (up to -5%); without
// pipelining the engines agree (test_predict, ZeroThreeStackCapAndRegather).
// Then search's top-K under the analytic engine must keep its order under the simulator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "sim/layer_graph.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"
#include "sim/schedule.hpp"
#include "sim/search.hpp"
#include "sim/simulate.hpp"
#include "sim/software.hpp"
#include "test_helpers.hpp"

namespace {

using namespace trainplan;

constexpr double kAgreement = 0.02;  // relative step-time difference allowed between the engines

struct Plan {
  const char* model;
  const char* cluster;
  int gpus, global_batch, tp, pp, micro_batch;
};

Strategy layout(const Plan& p, const ModelSpec& m, int zero, ScheduleKind schedule) {
  Strategy s;
  s.tp = p.tp;
  s.pp = p.pp;
  s.dp = p.gpus / (p.tp * p.pp);
  s.global_batch = p.global_batch;
  s.micro_batch = p.micro_batch;
  s.seq_len = m.seq_len;
  s.zero = zero;
  s.sequence_parallel = p.tp > 1;
  s.schedule = schedule;
  s.vp = schedule == ScheduleKind::interleaved ? 2 : 1;
  return s;
}

TEST(EngineAgreement, ZeroStagesSchedulesAndProfilesWithinTwoPercent) {
  const std::vector<Plan> plans{
      {"llama2-7b", "dgx-h100", 64, 512, 2, 1, 1},     // a case the engines once ranked inverted (pp 1)
      {"llama2-7b", "dgx-h100", 64, 512, 2, 4, 1},     // pipeline within and across nodes
      {"gpt2-xl", "dgx-a100-80g", 32, 256, 1, 4, 1},   // pipeline without TP, DP across nodes
      {"llama3-8b", "dgx-a100-80g", 32, 256, 1, 8, 4}, // 8 stages over 4 nodes, large transfers
      {"llama3-70b", "dgx-h100", 128, 256, 8, 4, 1},   // large model, TP over NVLink
  };
  const std::vector<const char*> profiles{"megatron-core", "pytorch-eager", "trainplan-exec", "llm-foundry",
                                              "megatron-lm-2021", "aleph-alpha-scaling"};
  int compared = 0;
  double lo = 0, hi = 0;
  for (const Plan& p : plans) {
    const ModelSpec m = load_model(p.model, TRAINPLAN_SOURCE_DIR);
    const LayerGraph g(m, m.seq_len);
    const Cluster c = trainplan::testing::builtin_cluster(p.cluster);
    for (const char* profile : profiles) {
      const Software sw = load_software(profile, TRAINPLAN_SOURCE_DIR);
      for (int zero = 0; zero <= 3; ++zero) {
        for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved}) {
          if (p.pp == 1 && k != ScheduleKind::one_f_one_b) continue;  // schedules differ only with stages
          const Strategy s = layout(p, m, zero, k);
          ASSERT_FALSE(validate(s, m).has_value()) << *validate(s, m);
          const StepCosts costs = step_costs(g, c, sw, s);
          const Estimate closed = compose(costs, g, c, s);
          const Seconds analytic = closed.time.step;
          const Seconds simulated = simulate(costs, schedule_for(s)).step;
          std::ostringstream what;
          what << p.model << " on " << p.gpus << " x " << p.cluster << ", " << profile << ", dp" << s.dp << " tp" << s.tp
               << " pp" << s.pp << " zero" << zero << " " << to_string(k) << ": analytic " << analytic
               << " s, simulated " << simulated << " s";
          ASSERT_GT(analytic, 0) << what.str();
          EXPECT_LE(std::abs(simulated / analytic - 1), kAgreement) << what.str();
          lo = std::min(lo, simulated / analytic - 1);
          hi = std::max(hi, simulated / analytic - 1);
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 6 * 4 * (1 + 4 * 3));
  std::printf("%d cases; simulated vs analytic %+.1f%% to %+.1f%%\n", compared, 100 * lo, 100 * hi);
}

// Search ranks with the analytic engine; the simulator must not reorder its short list. Two
// entries may swap only where the analytic figures are closer than the engines' agreement: an
// entry ranked above another is never more than kAgreement slower under the simulator.
TEST(EngineAgreement, SearchTopKKeepsItsOrderUnderTheSimulator) {
  struct Case {
    const char* model;
    const char* cluster;
    int gpus, global_batch;
  };
  for (const Case& k : {Case{"llama2-7b", "dgx-h100", 64, 512}, Case{"llama3-70b", "dgx-h100", 64, 512}}) {
    const ModelSpec m = load_model(k.model, TRAINPLAN_SOURCE_DIR);
    const LayerGraph g(m, m.seq_len);
    const Cluster c = trainplan::testing::builtin_cluster(k.cluster);
    const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
    SearchOptions o;
    o.top_k = 10;
    o.threads = 1;
    const SearchResult r = search(g, c, sw, default_space(c, k.gpus, k.global_batch, m.seq_len), o);
    ASSERT_GE(r.top.size(), 5u) << k.model;
    // Objective values (lower is better) of the short list, re-evaluated by the simulator.
    std::vector<double> simulated;
    for (const Estimate& e : r.top) {
      simulated.push_back(objective_value(o.objective, predict_with_simulation(g, c, sw, e.strategy), c));
    }
    for (std::size_t i = 0; i < simulated.size(); ++i) {
      for (std::size_t j = i + 1; j < simulated.size(); ++j) {
        EXPECT_LE(simulated[i], simulated[j] + kAgreement * std::abs(simulated[j]))
            << k.model << ": rank " << i + 1 << " (analytic " << r.top_value[i] << ") simulates to " << simulated[i]
            << ", rank " << j + 1 << " (analytic " << r.top_value[j] << ") to " << simulated[j];
      }
    }
  }
}

// Beyond the hand-picked plans: a deterministic sample of every layout search would consider for
// eight models on two clusters under the four profiles of today's stacks, and under the two that
// overlap nothing (megatron-lm-2021, aleph-alpha-scaling) (ZeRO 0-3, 1F1B and interleaved, TP, CP,
// recomputation, micro-batches from 1 to the global batch). The engines still differ where the
// simulator follows what the closed form averages: the fill and drain of an interleaved pipeline
// whose chunks are unequal (embedding, LM head, layer counts that do not divide), collectives
// queued behind one another on the dp stream. Bounds (3% and 12%) from the measured spread
// (2026-11-27, 2,228 cases of today's stacks: 1F1B -1.5% to +0.5%, interleaved -7.3% to +10.1%;
// 543 of the two 2021-era stacks, 1F1B -0.1% to +0.1%, since a 1F1B pipeline with fewer
// micro-batches than stages is costed by its critical path; -2.7% to +0.5% and -3.8% to +0.1%
// before), so that a change that pulls the engines apart fails here.
TEST(EngineAgreement, EveryLayoutSearchConsidersAgreesWithinBounds) {
  const std::vector<const char*> models{"gpt2", "gpt2-xl", "llama2-7b", "llama3-8b", "gpt3-20b", "llama2-13b",
                                        "llama3-70b", "gpt3-175b"};
  const std::vector<const char*> clusters{"dgx-h100", "dgx-a100-80g"};
  // The stacks of today, then (a sample of their own, so that the first one's is unchanged) the two
  // that overlap nothing, at the ZeRO stages they ran (Megatron-LM 2021 none, Aleph Alpha's ZeRO-1):
  // a per-micro-batch reduction a stack does not overlap stalls its compute, except where the
  // simulator finds the stage idle in the pipeline's fill and drain, which the closed form cannot.
  for (const std::vector<const char*>& profiles : {std::vector<const char*>{"megatron-core", "pytorch-eager", "trainplan-exec",
                                                                            "llm-foundry"},
                                                  std::vector<const char*>{"megatron-lm-2021", "aleph-alpha-scaling"}}) {
  int compared = 0;
  double lo[2] = {0, 0}, hi[2] = {0, 0};  // [1F1B, interleaved]: simulated / analytic - 1
  for (const char* model : models) {
    const ModelSpec m = load_model(model, TRAINPLAN_SOURCE_DIR);
    const int seq = std::min(m.seq_len, 4096);
    const LayerGraph g(m, seq);
    for (const char* cluster : clusters) {
      const Cluster c = trainplan::testing::builtin_cluster(cluster);
      const std::vector<Strategy> space = enumerate_space(g, c, default_space(c, 64, 256, seq));
      ASSERT_FALSE(space.empty()) << model << " on " << cluster;
      const std::size_t stride = std::max<std::size_t>(1, space.size() / 35);
      for (const char* profile : profiles) {
        const Software sw = load_software(profile, TRAINPLAN_SOURCE_DIR);
        for (std::size_t k = compared % stride; k < space.size(); k += stride) {
          const Strategy& s = space[k];
          if (simulated_slots(s) > 20000) continue;
          if (profiles.size() == 2 && s.zero > 1) continue;
          const StepCosts costs = step_costs(g, c, sw, s);
          const Seconds analytic = compose(costs, g, c, s).time.step;
          const Seconds simulated = simulate(costs, schedule_for(s), Record::usage).step;
          ASSERT_GT(analytic, 0);
          const double d = simulated / analytic - 1;
          const bool interleaved = s.schedule == ScheduleKind::interleaved;
          lo[interleaved] = std::min(lo[interleaved], d);
          hi[interleaved] = std::max(hi[interleaved], d);
          EXPECT_LE(std::abs(d), interleaved ? 0.12 : 0.03)
              << model << " on " << cluster << ", " << profile << ": dp" << s.dp << " tp" << s.tp << " pp" << s.pp
              << " cp" << s.cp << " vp" << s.vp << " zero" << s.zero << " mb" << s.micro_batch << " "
              << to_string(s.schedule) << ": analytic " << analytic << " s, simulated " << simulated << " s";
          ++compared;
        }
      }
    }
  }
  std::printf("%s...: %d layouts; simulated vs analytic: 1F1B %+.1f%% to %+.1f%%, interleaved %+.1f%% to %+.1f%%\n",
              profiles[0], compared, 100 * lo[0], 100 * hi[0], 100 * lo[1], 100 * hi[1]);
  EXPECT_GT(compared, 250 * static_cast<int>(profiles.size()));
  }
}

// Models with experts: a deterministic sample of the layouts search considers (every expert layout
// it enumerates: ep over the divisors of the experts folding over tp x cp x dp, etp 1 or tp), with
// the default expert settings and with an imbalanced, overlapped all-to-all and the module sets
// search tries by default (recomputable_modules). The simulator puts
// each chunk's dispatch and combine on the ep stream between the compute before the experts, the
// experts and the compute after them (backward: the combine's gradient first). Measured
// (2026-11-26, 960 layouts): 1F1B -2.7% to +1.2%. Stages far from equal (gpt-oss-120b at pp 12-16,
// whose sliding and full attention layers cost differently and whose host-bound expert launches
// make a layer's time its host time) were 4-6% apart while the closed form charged every other
// stage's whole work as fill and drain; it now waits only for the round trips of the first and
// the last micro-batch (one_f_one_b_bubble, predict.cpp). Interleaved: -4.9% to +36.2%
// (DeepSeek-V3's dense, MoE and MTP chunks differ much more than one kind's). With the module sets
// in the sample (2026-11-27, 958 layouts): 1F1B -0.7% to +1.4%, interleaved -8.8% to +40.5% (the
// widest, gpt-oss-120b at tp 4 pp 8 vp 2 with 16 micro-batches, recomputes no module: the sample
// moved, not the engines). Bounds: every 1F1B layout within 3%; interleaved 45%, a guard against
// regressions of a relation known to be loose (search re-ranks its analytic top by the simulator).
TEST(EngineAgreement, MoeLayoutsSearchConsidersAgreeWithinBounds) {
  const std::vector<const char*> models{"mixtral-8x7b", "qwen3-30b-a3b", "gpt-oss-120b", "deepseek-v3"};
  const std::vector<const char*> profiles{"megatron-core", "pytorch-eager"};
  ExpertSpace overlapped;
  overlapped.moe_imbalance = 1.5;
  overlapped.moe_a2a_overlap = true;
  int compared = 0, with_ep = 0, one_f_one_b = 0;
  double lo[2] = {0, 0}, hi[2] = {0, 0};  // [1F1B, interleaved]: simulated / analytic - 1
  for (const char* model : models) {
    const ModelSpec m = load_model(model, TRAINPLAN_SOURCE_DIR);
    const int seq = std::min(m.seq_len, 4096);
    const LayerGraph g(m, seq);
    const Cluster c = trainplan::testing::builtin_cluster("dgx-h100");
    for (const ExpertSpace& x : {ExpertSpace{}, overlapped}) {
      SearchSpace sp = default_space(c, 64, 256, seq);
      sp.experts = x;
      // The overlapped space also takes the module sets search tries by default.
      if (x.moe_a2a_overlap) sp.experts.recompute_modules = recomputable_modules(m);
      const std::vector<Strategy> space = enumerate_space(g, c, sp);
      ASSERT_FALSE(space.empty()) << model;
      const std::size_t stride = std::max<std::size_t>(1, space.size() / 60);
      for (const char* profile : profiles) {
        const Software sw = load_software(profile, TRAINPLAN_SOURCE_DIR);
        for (std::size_t k = compared % stride; k < space.size(); k += stride) {
          const Strategy& s = space[k];
          if (simulated_slots(s) > 20000) continue;
          const StepCosts costs = step_costs(g, c, sw, s);
          const Seconds analytic = compose(costs, g, c, s).time.step;
          const Seconds simulated = simulate(costs, schedule_for(s), Record::usage).step;
          ASSERT_GT(analytic, 0);
          const double d = simulated / analytic - 1;
          const bool interleaved = s.schedule == ScheduleKind::interleaved;
          lo[interleaved] = std::min(lo[interleaved], d);
          hi[interleaved] = std::max(hi[interleaved], d);
          EXPECT_LE(std::abs(d), interleaved ? 0.45 : 0.03)
              << model << ", " << profile << ": " << describe(s) << ": analytic " << analytic << " s, simulated "
              << simulated << " s";
          ++compared;
          with_ep += s.ep > 1;
          one_f_one_b += !interleaved;
        }
      }
    }
  }
  std::printf("%d MoE layouts (%d with ep > 1); simulated vs analytic: 1F1B %+.1f%% to %+.1f%%, interleaved %+.1f%% "
              "to %+.1f%%\n",
              compared, with_ep, 100 * lo[0], 100 * hi[0], 100 * lo[1], 100 * hi[1]);
  EXPECT_GT(compared, 600);
  EXPECT_GT(with_ep, compared / 2);
  EXPECT_GT(one_f_one_b, 300);
}

}  // namespace
