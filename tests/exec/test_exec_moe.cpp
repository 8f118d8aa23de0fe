// trainplan exec with mixture-of-experts models on CPU/Gloo. Expert parallelism (the tokens'
// all-to-all dispatch and combine, exec/moe.hpp), expert-data-parallel gradient reduction and
// ZeRO-1 over it, EP over the tensor-parallel ranks (sequence parallel) and EP with a pipeline
// train the same model as one rank: losses step by step, the first step's reduced gradients and
// the final parameters equal the single-rank run's to the equivalence suite's tolerances
// (tests/exec/exec_runs.hpp; dropless routing, fp32). The bytes the executor hands to the all-to-alls
// equal the planner's figure for the same plan, and the CLI refuses what exec does not run.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "exec_runs.hpp"
#include "reports/prediction_json.hpp"
#include "sim/cluster.hpp"
#include "sim/model_spec.hpp"
#include "sim/plan_shape.hpp"
#include "sim/software.hpp"

namespace {

using namespace trainplan::testing::exec_runs;
using trainplan::testing::run_merged;

[[maybe_unused]] ::testing::Environment* const kRemoveWorkDir = ::testing::AddGlobalTestEnvironment(new RemoveWorkDir);

const ExecRun& reference(const std::string& model) {
  static std::map<std::string, ExecRun> cache;
  auto it = cache.find(model);
  if (it == cache.end()) it = cache.emplace(model, exec_run(model, 1, "", model + "_ref")).first;
  return it->second;
}

// The planner's all-to-all bytes of one rank per micro-batch and MoE layer (sim's
// expert_all_to_all_bytes, the figure predict costs the EP group's all-to-alls with) for the plan
// predict wrote: its strategy, cluster and software profile read back from its JSON. Each MoE
// layer sends that many bytes in each of its dispatch and combine, in the forward and again in the
// backward, and once more forward under full recomputation (predict's add_ep_exchange): 4 or 6 calls.
struct PlannerBytes {
  double per_call = 0;
  int calls = 0, micro_batches = 0;
};
PlannerBytes planner_bytes(const nlohmann::json& pred, const trainplan::ModelSpec& spec) {
  const trainplan::PredictionDoc doc = trainplan::prediction_from_json(pred, "predict --json");
  const trainplan::Cluster cluster = trainplan::load_cluster(doc.cluster, TRAINPLAN_SOURCE_DIR);
  const trainplan::Software sw = trainplan::load_software(doc.software, TRAINPLAN_SOURCE_DIR);
  const trainplan::Strategy& s = doc.estimate.strategy;
  const trainplan::PlanShape shape(spec, cluster, sw, s);
  return {trainplan::expert_all_to_all_bytes(spec, shape), s.recompute == trainplan::Recompute::full ? 6 : 4,
          shape.micro_batches};
}

// predict's JSON for a layout (fp32, the runs' batch), or null when predict failed.
nlohmann::json predict_json(const std::string& model, int ranks, const std::string& layout, const std::string& tag) {
  const fs::path json = work_dir() / (tag + ".predict.json");
  const std::string args = "predict --model " + model_path(model) + " --cluster dgx-h100 --dtype fp32 --global-batch 4 "
                           "--micro-batch 1 " + layout + " --gpus " + std::to_string(ranks) + " --json " + json.string();
  const auto r = run_merged(args);
  EXPECT_EQ(r.code, 0) << "trainplan " << args << "\n" << r.output;
  if (r.code != 0) return {};
  std::ifstream jf(json);
  return nlohmann::json::parse(jf);
}

// The run's all-to-all bytes against the planner's, per pipeline stage: the layers of each stage
// as predict splits them (which exec runs), its MoE layers counted by ModelSpec::is_moe_layer.
// Dropless routing sends each rank's own copies out (routing-independent) but brings back as many
// as its experts were sent (routing-dependent), so one rank's bytes are the planner's balanced
// figure only on average: over each EP group, and so over each stage, the sum is exact. With a
// capacity factor every rank sends and receives exactly E x capacity rows: `per_rank` checks each.
void expect_all_to_all_bytes(const ExecRun& run, const std::string& model, int ranks, const std::string& layout,
                             const std::string& tag, bool per_rank) {
  const auto pred = predict_json(model, ranks, layout, tag);
  if (pred.is_null()) return;
  const trainplan::ModelSpec spec = trainplan::load_model(model_path(model), TRAINPLAN_TEST_DATA_DIR);
  const PlannerBytes planner = planner_bytes(pred, spec);
  std::vector<double> figure;  // per stage
  int layer = 0;
  for (const auto& stage : pred.at("memory").at("per_stage")) {
    int moe = 0;
    for (int k = 0; k < stage.at("layers").get<int>(); ++k, ++layer) moe += spec.is_moe_layer(layer) ? 1 : 0;
    figure.push_back(static_cast<double>(moe) * planner.micro_batches * planner.calls * planner.per_call);
  }
  ASSERT_EQ(layer, spec.layers) << layout;
  const auto& env = run.measurement.at("environment");
  std::map<int, int> stage_of;
  for (const auto& r : env.at("model_states").at("per_rank")) stage_of[r.at("rank")] = r.at("stage");
  std::vector<double> sum(figure.size(), 0.0), members(figure.size(), 0.0);
  for (const auto& r : env.at("expert_parallel").at("per_rank")) {
    const int stage = stage_of.at(r.at("rank"));
    const double got = r.at("token_bytes_per_step");
    sum[stage] += got;
    members[stage] += 1;
    if (per_rank) {
      EXPECT_DOUBLE_EQ(got, figure[stage]) << layout << ": rank " << r.at("rank");
    }
  }
  for (size_t k = 0; k < figure.size(); ++k) {
    EXPECT_GT(figure[k], 0) << layout << ": stage " << k << " has no MoE layer to check";
    EXPECT_DOUBLE_EQ(sum[k], members[k] * figure[k]) << layout << ": stage " << k << "'s all-to-all bytes per step";
  }
}

TEST(ExecMoe, SingleRankLossFalls) {
  const ExecRun& ref = reference("tiny-moe");
  ASSERT_EQ(ref.losses.size(), 3u) << ref.output;
  EXPECT_NEAR(ref.losses[0], std::log(256.0), 0.3);  // untrained: about ln(vocab)
  EXPECT_LT(ref.losses[2], ref.losses[0]);
}

// Expert parallelism over two data-parallel ranks (edp = dp / ep = 1): each rank holds two of the
// four experts of every MoE layer and receives the tokens of both ranks routed to them.
TEST(ExecMoe, ExpertParallel2) {
  const std::string layout = "--dp 2 --ep 2";
  const ExecRun got = exec_run("tiny-moe", 2, layout, "ep2");
  ASSERT_EQ(got.code, 0) << got.output;
  expect_equivalent(reference("tiny-moe"), got, layout);
  expect_all_to_all_bytes(got, "tiny-moe", 2, layout, "ep2", false);
  // The all-to-alls' time is a phase of its own (ep_comm_s), which compare sets beside the
  // prediction's; a single rank has none, so it writes none.
  const auto& time = got.measurement.at("time");
  ASSERT_TRUE(time.contains("ep_comm_s")) << time.dump();
  EXPECT_GT(time.at("ep_comm_s").get<double>(), 0);
  EXPECT_FALSE(reference("tiny-moe").measurement.at("time").contains("ep_comm_s"));
}

// Four data-parallel ranks, EP 2: two EP groups, and each expert on two ranks (edp 2), which
// reduce its gradient and, with ZeRO-1, shard its AdamW state; the dense parameters over all four.
TEST(ExecMoe, ExpertParallel2DataParallel2Zero1) {
  const std::string layout = "--dp 4 --ep 2 --zero 1";
  const ExecRun got = exec_run("tiny-moe", 4, layout, "ep2dp2z1");
  ASSERT_EQ(got.code, 0) << got.output;
  expect_equivalent(reference("tiny-moe"), got, layout);
  expect_all_to_all_bytes(got, "tiny-moe", 4, layout, "ep2dp2z1", false);
  // ZeRO-1 over edp 2: each rank keeps AdamW moments for half of its experts (and a quarter of the
  // dense parameters); without sharding it would hold them all.
  for (const auto& r : got.measurement.at("environment").at("model_states").at("per_rank"))
    EXPECT_LT(r.at("optimizer").get<double>(), 2 * r.at("weights").get<double>()) << "rank " << r.at("rank");
}

// EP over the two tensor-parallel ranks (etp 1, edp 1): with sequence parallelism each TP rank
// routes its own half of the sequence; the router's gradient is summed over TP like the norms'.
TEST(ExecMoe, ExpertParallel2TensorParallel2) {
  const std::string layout = "--tp 2 --sequence-parallel on --ep 2";
  const ExecRun got = exec_run("tiny-moe", 2, layout, "ep2tp2");
  ASSERT_EQ(got.code, 0) << got.output;
  expect_equivalent(reference("tiny-moe"), got, layout);
  expect_all_to_all_bytes(got, "tiny-moe", 2, layout, "ep2tp2", false);
}

// EP 2 inside each of two pipeline stages: the stages' MoE layers dispatch within their own stage.
TEST(ExecMoe, ExpertParallel2Pipeline2) {
  const std::string layout = "--dp 2 --ep 2 --pp 2";
  const ExecRun got = exec_run("tiny-moe", 4, layout, "ep2pp2");
  ASSERT_EQ(got.code, 0) << got.output;
  expect_equivalent(reference("tiny-moe"), got, layout);
  expect_all_to_all_bytes(got, "tiny-moe", 4, layout, "ep2pp2", false);
}

// Full recomputation re-runs each MoE layer's dispatch and combine in the backward: still the same
// model, and the planner's six all-to-alls per layer and micro-batch.
TEST(ExecMoe, ExpertParallel2FullRecomputation) {
  const std::string layout = "--dp 2 --ep 2 --recompute full";
  const ExecRun got = exec_run("tiny-moe", 2, layout, "ep2full");
  ASSERT_EQ(got.code, 0) << got.output;
  expect_equivalent(reference("tiny-moe"), got, layout);
  expect_all_to_all_bytes(got, "tiny-moe", 2, layout, "ep2full", false);
}

// GPT-2 style experts: GELU with biases, a sigmoid router with a bias, a gated shared expert, MoE
// every second layer, a tied embedding.
TEST(ExecMoe, GptStyleExpertParallel2) {
  const std::string layout = "--dp 2 --ep 2";
  const ExecRun got = exec_run("tiny-moe-gpt", 2, layout, "gpt_ep2");
  ASSERT_EQ(got.code, 0) << got.output;
  expect_equivalent(reference("tiny-moe-gpt"), got, layout);
}

// A capacity factor of experts / top_k (the largest allowed) gives every expert room for all of a
// rank's tokens: nothing is dropped, the padding rows add nothing, and the run is the dropless
// single-rank run; every rank then sends exactly E x capacity rows per all-to-all, the planner's
// figure with f = C.
TEST(ExecMoe, CapacityThatDropsNothingIsDropless) {
  const std::string layout = "--dp 2 --ep 2 --capacity-factor 2";
  const ExecRun got = exec_run("tiny-moe", 2, layout, "ep2cap2");
  ASSERT_EQ(got.code, 0) << got.output;
  expect_equivalent(reference("tiny-moe"), got, layout);
  expect_all_to_all_bytes(got, "tiny-moe", 2, layout, "ep2cap2", true);
}

// Capacity 1: copies beyond an expert's capacity are dropped, so the run trains a different
// function: at initialisation the experts' outputs are small and the losses stay close to the
// dropless run's, but the gradients of the experts that dropped copies differ from it by far more
// than the equivalence tolerance. Every rank sends exactly the planner's bytes, and the counts
// need no exchange.
TEST(ExecMoe, CapacityOneDropsTokens) {
  const std::string layout = "--dp 2 --ep 2 --capacity-factor 1";
  const ExecRun got = exec_run("tiny-moe", 2, layout, "ep2cap1");
  ASSERT_EQ(got.code, 0) << got.output;
  ASSERT_EQ(got.losses.size(), 3u);
  const ExecRun& ref = reference("tiny-moe");
  ASSERT_EQ(ref.losses.size(), 3u) << ref.output;
  EXPECT_NEAR(got.losses[0], ref.losses[0], 0.01 * ref.losses[0]);
  EXPECT_GT(worst_relative_difference(ref.grads, got.grads), 1e-2) << "no copy was dropped";
  expect_all_to_all_bytes(got, "tiny-moe", 2, layout, "ep2cap1", true);
  for (const auto& r : got.measurement.at("environment").at("expert_parallel").at("per_rank"))
    EXPECT_EQ(r.at("count_bytes_per_step").get<double>(), 0.0) << "rank " << r.at("rank");
}

// Bad values exit 2 with one line naming the flag and the rule.
TEST(ExecMoe, RefusesWhatExecDoesNotRun) {
  const std::string base = "exec --model " + model_path("tiny-moe") + " --cluster cpu-local --dtype fp32 "
                           "--global-batch 4 --micro-batch 1 --steps 1 --warmup 0 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--dp 2 --ep 3 --nproc 2", "--ep 3: must divide the model's experts (4)"},
      {"--dp 2 --ep 4 --nproc 2", "--ep 4: etp x ep (1 x 4) must divide a pipeline stage's tp x cp x dp"},
      {"--dp 2 --etp 2 --nproc 2", "--etp 2: exec runs whole experts"},
      {"--dp 2 --ep 2 --zero 3 --nproc 2", "--zero 3: exec does not gather routed experts"},
      {"--dp 2 --ep 2 --moe-dispatcher allgather --nproc 2", "--moe-dispatcher allgather: exec dispatches tokens by all-to-all"},
      {"--dp 2 --ep 2 --moe-dispatcher flex --nproc 2", "--moe-dispatcher flex: exec dispatches tokens by all-to-all"},
      {"--dp 2 --ep 2 --moe-a2a-overlap on --nproc 2", "--moe-a2a-overlap on: exec runs each micro-batch's all-to-alls"},
      {"--dp 2 --ep 2 --moe-imbalance 1.5 --nproc 2", "--moe-imbalance 1.5: exec routes with the model's router"},
      {"--tp 2 --ep 2 --nproc 2", "--sequence-parallel off: an MoE model with --tp > 1 needs sequence parallelism"},
      {"--dp 2 --ep 2 --capacity-factor 3 --nproc 2", "--capacity-factor 3: must be in (0, experts / top_k]"},
      {"--dp 2 --ep 2 --recompute selective --recompute-modules moe_act --nproc 2", "--recompute-modules moe_act: exec"},
  };
  for (const auto& [flags, rule] : cases) {
    const auto r = run_merged(base + flags);
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(rule), std::string::npos) << flags << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << flags << ": one line\n" << r.output;
  }
  // Expert flags on a dense model.
  const auto dense = run_merged("exec --model " + model_path("tiny-llama") + " --cluster cpu-local --global-batch 4 "
                                "--dp 2 --ep 2 --nproc 2");
  EXPECT_EQ(dense.code, 2) << dense.output;
  EXPECT_NE(dense.output.find("--ep 2: needs a model with experts"), std::string::npos) << dense.output;
}

}  // namespace
