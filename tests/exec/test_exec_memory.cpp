// What `trainplan exec` allocates, by what it holds, against what `trainplan predict` says under
// the software profile that describes it (software/trainplan-exec.json), on the CPU: one rank,
// `--memory-accounting on` (exec/memory_probe.hpp: the allocator's own reports), fp32 and bf16
// under CPU autocast (the mixed-precision paths a GPU runs), a Llama-style and a GPT-style test
// model (tests/data/exec/mem-*.json) with 2 and 4 layers. Per plan:
//   model states     weights, gradients, AdamW moments: equal to predict's (less GPT-2's key bias,
//                    which exec leaves out: kv_heads x head_dim per layer);
//   weight copies    autocast's 16-bit weight cache: within 1% of predict's (exec caches the GEMMs'
//                    weights and biases; predict counts every layer parameter, norms included);
//   saved per layer  what a forward leaves for the backward, 4 layers less 2 over 2: within 1% of
//                    predict's per-layer stored activations (exec also keeps the norms' rsqrt and
//                    SDPA's log-sum-exp, 24-32 B per token);
//   step peak        the forward/backward peak above the step's start, less the weight copies:
//                    within 5% of predict's activations; with full recomputation predict adds the
//                    recomputed layer to the loss's working set, which do not coexist, so the
//                    measured peak must lie below it;
//   optimizer        no parameter-sized temporaries (at::_fused_adamw_), as predict says.
// Then the figures of each plan are held to those recorded for this executor
// (tests/data/exec/memory_accounting.json, keyed by exec's kExecutorFingerprint): an executor
// whose memory moves fails here until its fingerprint is bumped (exec/exec.hpp and the profile's
// describes_executor, which must stay equal) and its bytes recorded again
// (TRAINPLAN_EXEC_MEMORY_UPDATE=1 rewrites the file; the diff shows what moved).
// One intra-op thread, so that the peaks do not depend on the machine's cores.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_fixture.hpp"
#include "exec/exec.hpp"
#include "sim/json_reader.hpp"
#include "sim/software.hpp"

namespace trainplan {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ScratchDir;

const fs::path kData = fs::path(TRAINPLAN_TEST_DATA_DIR) / "exec";
const fs::path kRecorded = kData / "memory_accounting.json";

struct Plan {
  std::string name, model, dtype, recompute;
};

std::string plan_name(const ::testing::TestParamInfo<Plan>& info) { return info.param.name; }
void PrintTo(const Plan& p, std::ostream* os) { *os << p.name; }

// One run: exec's figures for rank 0 and predict's for stage 0, with its per-layer stored bytes.
struct PlanRun {
  json measurement, accounting, stage;
  double layer_stored = 0;
  int layers = 0;
};

// `trainplan <args>` with one intra-op thread; the command must succeed.
void trainplan(const std::string& args) {
  const auto r = testing::run_shell("OMP_NUM_THREADS=1 '" + std::string(TRAINPLAN_BINARY) + "' " + args + " 2>&1");
  ASSERT_EQ(r.code, 0) << "trainplan " << args << "\n" << r.output;
}

PlanRun run_plan(const ScratchDir& dir, const Plan& p, int layers) {
  json model = read_json_file(kData / (p.model + ".json"));
  model["layers"] = layers;
  const std::string tag = p.name + "-" + std::to_string(layers);
  const std::string model_file = dir.file(tag + ".model.json"), meas = dir.file(tag + ".meas.json"),
                    pred = dir.file(tag + ".pred.json");
  std::ofstream(model_file) << model.dump();
  const std::string plan = "--model " + model_file + " --cluster dgx-h100 --global-batch 8 --micro-batch 4 --dtype " +
                           p.dtype + " --recompute " + p.recompute;
  trainplan("exec " + plan + (p.dtype == "fp32" ? "" : " --cpu-autocast on") +
            " --steps 2 --warmup 1 --seed 7 --memory-accounting on --json " + meas);
  trainplan("predict " + plan + " --gpus 1 --software trainplan-exec --detail layers --json " + pred);
  PlanRun r;
  r.layers = layers;
  if (::testing::Test::HasFatalFailure()) return r;
  r.measurement = read_json_file(meas);
  r.accounting = r.measurement.at("environment").at("memory_accounting").at("per_rank").at(0);
  const json prediction = read_json_file(pred);
  r.stage = prediction.at("memory").at("per_stage").at(0);
  for (const json& row : prediction.at("layers").at("stages").at(0).at("rows"))
    if (row.at("part") == "layers") r.layer_stored = row.at("activations");
  return r;
}

double fig(const PlanRun& r, const char* key) { return r.accounting.at(key).get<double>(); }
double predicted(const PlanRun& r, const char* key) { return r.stage.at(key).get<double>(); }

// The figures of a run as recorded in memory_accounting.json.
json recorded_figures(const PlanRun& r) {
  json out;
  for (const char* k : {"weights", "gradients", "optimizer", "weight_copies", "saved", "activations"})
    out[k] = fig(r, k);
  return out;
}

class ExecMemory : public ::testing::TestWithParam<Plan> {};

TEST_P(ExecMemory, BytesByCategoryAreWhatTheProfilePredicts) {
  const Plan& p = GetParam();
  ScratchDir dir;
  const PlanRun two = run_plan(dir, p, 2);
  ASSERT_FALSE(HasFatalFailure());
  const PlanRun four = run_plan(dir, p, 4);
  ASSERT_FALSE(HasFatalFailure());
  const Software sw = load_software("trainplan-exec", TRAINPLAN_SOURCE_DIR);
  EXPECT_EQ(two.measurement.at("executor"), exec::kExecutorFingerprint);
  EXPECT_EQ(sw.describes_executor, exec::kExecutorFingerprint)
      << "software/trainplan-exec.json describes another executor than exec/exec.hpp names";
  const json model = read_json_file(kData / (p.model + ".json"));
  const bool gpt = model.at("activation") == "gelu";
  for (const PlanRun* r : {&two, &four}) {
    // GPT-2's key bias (zero gradient) is not in exec's model.
    const double key_bias = gpt ? r->layers * model.at("kv_heads").get<double>() * (model.at("hidden").get<double>() /
                                                                                    model.at("heads").get<double>())
                                : 0;
    EXPECT_DOUBLE_EQ(fig(*r, "weights"), predicted(*r, "weights") - 4 * key_bias) << r->layers << " layers";
    EXPECT_DOUBLE_EQ(fig(*r, "gradients"), predicted(*r, "gradients") - 4 * key_bias) << r->layers << " layers";
    EXPECT_DOUBLE_EQ(fig(*r, "optimizer"), predicted(*r, "optimizer") - 8 * key_bias) << r->layers << " layers";
    EXPECT_NEAR(fig(*r, "weight_copies"), predicted(*r, "weight_copies"), 0.01 * predicted(*r, "weight_copies"));
    EXPECT_EQ(predicted(*r, "temporaries"), 0);
    EXPECT_LT(fig(*r, "optimizer_temporaries"), 0.01 * fig(*r, "optimizer")) << "parameter-sized optimizer temporaries";
  }
  const double per_layer = (fig(four, "saved") - fig(two, "saved")) / 2;
  std::printf("%-12s saved per layer %10.0f B (predicted %10.0f, %+5.2f%%)   step peak %10.0f B (predicted %10.0f, "
              "%+5.1f%%)   weight copies %9.0f B (predicted %9.0f)\n",
              p.name.c_str(), per_layer, two.layer_stored, 100 * (per_layer / two.layer_stored - 1),
              fig(two, "activations"), predicted(two, "activations"),
              100 * (fig(two, "activations") / predicted(two, "activations") - 1), fig(two, "weight_copies"),
              predicted(two, "weight_copies"));
  EXPECT_NEAR(per_layer, two.layer_stored, 0.01 * two.layer_stored);
  for (const PlanRun* r : {&two, &four}) {
    if (p.recompute == "full") {
      EXPECT_LT(fig(*r, "activations"), predicted(*r, "activations")) << r->layers << " layers";
    } else {
      EXPECT_NEAR(fig(*r, "activations"), predicted(*r, "activations"), 0.05 * predicted(*r, "activations"))
          << r->layers << " layers";
    }
  }
  // The bytes recorded for this executor.
  json recorded = fs::exists(kRecorded) ? read_json_file(kRecorded) : json::object();
  if (std::getenv("TRAINPLAN_EXEC_MEMORY_UPDATE")) {
    recorded["executor"] = exec::kExecutorFingerprint;
    recorded["torch_version"] = two.measurement.at("environment").at("torch_version");
    recorded["runs"][p.name] = recorded_figures(two);
    std::ofstream(kRecorded) << recorded.dump(2) << "\n";
    return;
  }
  ASSERT_EQ(recorded.value("executor", ""), exec::kExecutorFingerprint)
      << kRecorded << " records another executor: record this one's bytes (TRAINPLAN_EXEC_MEMORY_UPDATE=1)";
  const json& want = recorded.at("runs").at(p.name);
  const json got = recorded_figures(two);
  for (const auto& [key, value] : want.items()) {
    // The peak moves by a fraction of a percent with the CPU's kernels; the rest are exact.
    const double tolerance = key == "activations" ? 0.02 * value.get<double>() : 0.0;
    EXPECT_NEAR(got.at(key).get<double>(), value.get<double>(), tolerance)
        << p.name << " " << key << ": exec's memory moved since " << exec::kExecutorFingerprint
        << " was recorded (LibTorch " << recorded.value("torch_version", "?") << ", now "
        << two.measurement.at("environment").at("torch_version")
        << "): bump kExecutorFingerprint (exec/exec.hpp) and describes_executor (software/trainplan-exec.json), "
           "refit the profile and record the bytes again (TRAINPLAN_EXEC_MEMORY_UPDATE=1)";
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, ExecMemory,
                         ::testing::Values(Plan{"llama_fp32", "mem-llama", "fp32", "none"},
                                           Plan{"llama_bf16", "mem-llama", "bf16", "none"},
                                           Plan{"gpt_fp32", "mem-gpt", "fp32", "none"},
                                           Plan{"gpt_bf16", "mem-gpt", "bf16", "none"},
                                           Plan{"llama_bf16_full", "mem-llama", "bf16", "full"}),
                         plan_name);

}  // namespace
}  // namespace trainplan
