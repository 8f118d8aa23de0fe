// Validation against measured training steps on one H100 (tests/data/h100, copied from
// ../shared/reference/h100): the cost model with each software profile against what that stack
// measured. The op tables (topologies/dgx-h100.json) are kernel measurements of the same GPU. One
// constant was fitted on these steps: ops.misaligned_gemm_slowdown, on the six gpt2-family
// PyTorch-eager rows (fitted_row); nothing else here was fitted on them.
//   trainplan-exec profile  vs  `trainplan exec` (trainplan_exec/*.meas.json)   step within 10%
//     (the profile that describes the executor those rows ran, commit e64f6de:
//     trainplan-exec-e64f6de.json here; software/trainplan-exec.json describes today's executor and
//     is checked against the H200 rows in test_validation_h200.cpp)
//   pytorch-eager profile   vs  PyTorch eager rows (pytorch_steps.jsonl)        step within 10%
//   megatron-core profile   vs  torch.compile rows (fused kernels)              step within 15%
// Peak reserved memory against the same rows is checked in test_memory_validation.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/json_reader.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"
#include "sim/software.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kSource = TRAINPLAN_SOURCE_DIR;
const fs::path kData = fs::path(TRAINPLAN_TEST_DATA_DIR) / "h100";

ModelSpec model_named(const std::string& name) {
  if (name == "llama-1b") return parse_model(read_json_file(kData / "llama-1b.json"), "llama-1b.json");
  return load_model(name, kSource);
}

struct Row {
  std::string what;
  Estimate estimate;
  double measured_step = 0;
  double measured_reserved = 0;  // bytes
  double error() const { return (estimate.time.step - measured_step) / measured_step; }
};

// The profile of the executor the trainplan_exec rows measured (see the top of this file).
const std::string kExecE64f6de = (kData / "trainplan-exec-e64f6de.json").string();

Estimate predict_plan(const ModelSpec& m, const Strategy& s, const std::string& software) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const Software sw = load_software(software, kSource);
  return predict(LayerGraph(m, s.seq_len), c, sw, s);
}

std::vector<Row> exec_rows() {
  std::vector<Row> rows;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kData / "trainplan_exec")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    const json j = read_json_file(f);
    const Strategy s = strategy_from_json(j.at("strategy"), f.string());
    Row r{f.stem().string(), predict_plan(model_named(j.at("model")), s, kExecE64f6de),
          j.at("step_time").at("median_s").get<double>(), j.at("memory").at("peak_bytes").get<double>()};
    rows.push_back(std::move(r));
  }
  return rows;
}

// pytorch_reference.py: bf16 autocast over fp32 parameters, no recomputation, flash attention, no dropout.
std::vector<Row> pytorch_rows(const std::string& ref, const char* software) {
  std::vector<Row> rows;
  std::ifstream in(kData / "pytorch_steps.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    if (j.at("ref") != ref) continue;
    Strategy s;
    s.micro_batch = j.at("mb");
    s.global_batch = j.at("gb");
    s.seq_len = j.at("seq");
    s.dtype = Dtype::bf16;
    s.attention = Attention::flash;
    const std::string model = j.at("model");
    ModelSpec m = model_named(model);
    m.dropout = 0;  // pytorch_reference.py trains without dropout, whatever the model file's recipe says
    rows.push_back({fmt::format("{} mb{} gb{}", model, s.micro_batch, s.global_batch), predict_plan(m, s, software),
                    j.at("step_s").get<double>(),
                    j.at("max_reserved_gb").get<double>() * 1e9});
  }
  return rows;
}

// Rows the model misses by more than the tolerance today, each with what is not modelled. They
// are checked against a wider bound so that they cannot get worse unnoticed; the target
// (every row within tolerance) is NOT met for them.
const std::map<std::string, std::pair<double, const char*>> kKnownMisses = {
    {"llama-1b mb2 gb32", {0.20, "the fixed cost per micro-batch is predicted 24 ms against 17 measured, the cost "
                                 "per sequence within 6% (LlamaEagerMissIsInTheFixedCostPerMicroBatch): at M = "
                                 "4096 tokens the GEMM and memory-bound rates interpolate toward the smallest "
                                 "measured shapes (M = 2048 GEMMs, 34 MB kernels), whose single-call timings "
                                 "include the launch latency of a call from an idle GPU"}},
    {"gpt2-medium mb8 gb64 compile", {0.22, "torch.compile fuses the norms and residual adds into neighbouring kernels and the "
                                            "loss into one online-softmax pass, further than Megatron-core"}},
};

// The rows a constant was fitted on: they are printed and held to the tolerance, but they validate
// nothing.
// - topologies/dgx-h100.json ops.misaligned_gemm_slowdown: a least-squares fit over the six
//   gpt2-family PyTorch-eager steps, whose unpadded 50257-token LM head runs misaligned GEMMs. The
//   trainplan-exec gpt2-xl rows check that constant.
// - trainplan-exec-e64f6de.json host.per_kernel_us: a least-squares fit over the phases of the one
//   host-bound executor run, tiny-gpt.
bool fitted_row(const std::string& what) { return what.rfind("gpt2", 0) == 0 || what == "tiny.meas"; }

void check_steps(const std::vector<Row>& rows, double tolerance, std::size_t expected_rows, const char* suffix = "") {
  ASSERT_EQ(rows.size(), expected_rows);
  double sum = 0;
  for (const auto& r : rows) {
    const auto known = kKnownMisses.find(r.what + suffix);
    if (known != kKnownMisses.end()) {
      std::printf("%-22s predicted %8.4f s  measured %8.4f s  error %+6.1f%%  KNOWN MISS (bound %.0f%%): %s\n",
                  r.what.c_str(), r.estimate.time.step, r.measured_step, 100 * r.error(), 100 * known->second.first,
                  known->second.second);
      EXPECT_LT(std::abs(r.error()), known->second.first) << r.what;
      sum += std::abs(r.error());
      continue;
    }
    // Step time is checked whatever the memory verdict: a run that used nearly all of the GPU (eager
    // llama-1b mb8 reserved 81.85 GB) is infeasible under the safety margin, which is the safe
    // answer, and still has a predicted step. Any other reason is a failure.
    for (const auto& why : r.estimate.infeasible) {
      ASSERT_EQ(why.reason, InfeasibleReason::out_of_memory) << r.what << ": " << reason_key(why.reason);
    }
    ASSERT_GT(r.estimate.time.step, 0) << r.what;
    std::printf("%-22s predicted %8.4f s  measured %8.4f s  error %+6.1f%%%s\n", r.what.c_str(), r.estimate.time.step,
                r.measured_step, 100 * r.error(), *suffix == 0 && fitted_row(r.what) ? "  (fitted row)" : "");
    EXPECT_LT(std::abs(r.error()), tolerance) << r.what;
    sum += std::abs(r.error());
  }
  std::printf("mean absolute error %.1f%%\n", 100 * sum / rows.size());
}

TEST(ValidationH100, TrainplanExecStepWithinTenPercent) { check_steps(exec_rows(), 0.10, 6); }

TEST(ValidationH100, PytorchEagerStepWithinTenPercent) {
  check_steps(pytorch_rows("pytorch-eager", "pytorch-eager"), 0.10, 9);
}

// Where the llama-1b eager miss sits. The three eager rows share a global batch (32) and differ in
// micro-batch b (2, 4, 8), so each step is n = 32/b micro-batches plus one optimizer step, and the
// time of one micro-batch splits by least squares into a cost per sequence v (what grows with b:
// GEMMs, attention and activation kernels at training sizes) and a fixed cost F per micro-batch
// (per-parameter work repeated for every micro-batch, gradient accumulation, weight casts, the
// dense embedding gradient, plus whatever the kernel rates lose at the smallest b). The predicted
// optimizer time is taken off both. Asserted: v within 10% of the measured one, so the miss is not
// in the costs at training sizes; printed: F, which holds it.
TEST(ValidationH100, LlamaEagerMissIsInTheFixedCostPerMicroBatch) {
  std::vector<Row> llama;
  for (auto& r : pytorch_rows("pytorch-eager", "pytorch-eager")) {
    if (r.what.rfind("llama-1b", 0) == 0) llama.push_back(std::move(r));
  }
  ASSERT_EQ(llama.size(), 3u);
  // Least-squares line t = F + v b through (b, time of one micro-batch).
  const auto fit = [&llama](bool measured) {
    double sb = 0, st = 0, sbb = 0, sbt = 0;
    for (const auto& r : llama) {
      const double b = r.estimate.strategy.micro_batch;
      const double n = static_cast<double>(r.estimate.strategy.global_batch) / b;
      const double step = measured ? r.measured_step : r.estimate.time.step;
      const double t = (step - r.estimate.time.optimizer) / n;
      sb += b, st += t, sbb += b * b, sbt += b * t;
    }
    const double k = static_cast<double>(llama.size());
    const double v = (k * sbt - sb * st) / (k * sbb - sb * sb);
    return std::pair<double, double>{(st - v * sb) / k, v};
  };
  const auto [f_meas, v_meas] = fit(true);
  const auto [f_pred, v_pred] = fit(false);
  std::printf("llama-1b eager, one micro-batch = F + v x b:  v predicted %.2f ms, measured %.2f ms (%+.1f%%);  "
              "F predicted %.2f ms, measured %.2f ms\n",
              1e3 * v_pred, 1e3 * v_meas, 100 * (v_pred / v_meas - 1), 1e3 * f_pred, 1e3 * f_meas);
  EXPECT_LT(std::abs(v_pred / v_meas - 1), 0.10);
  EXPECT_GT(f_meas, 0);
}

TEST(ValidationH100, CompiledStepWithinFifteenPercentWithMegatronCoreProfile) {
  check_steps(pytorch_rows("pytorch-compile", "megatron-core"), 0.15, 3, " compile");
}

}  // namespace
}  // namespace trainplan
