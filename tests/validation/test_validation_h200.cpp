// Validation against `trainplan exec` measured on one H200 (tests/data/h200, copied from
// ../shared/reference/h200): the trainplan-exec software profile that describes the executor those
// runs came from (tests/data/h200/trainplan-exec-mem-2.json, frozen when the executor moved on),
// against every row:
//   peak reserved memory (the caching allocator's, memory.per_rank[].peak_reserved_bytes) within 10%
//   of the predicted reserved bytes (StageMemory::reserved(): tensors x reserved_over_allocated plus
//   the workspace; the runtime reserve lies outside the allocator), and
//   step time (median) within 10%.
// The profile's tensor bytes and kernel passes are read from exec's code; one figure is read from
// these rows (allocator.reserved_over_allocated, their measured reserved / allocated ratio), so the
// memory check is of the tensor accounting. The cluster is dgx-h200 (the H100's GEMM and attention
// tables, memory-bound times scaled by the H200's bandwidth). The current profile
// (software/trainplan-exec.json) against the one row measured with today's fused kernels:
// tests/data/h200/bench-gpu-fused.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
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
const fs::path kData = fs::path(TRAINPLAN_TEST_DATA_DIR) / "h200";
constexpr double kTolerance = 0.10;

ModelSpec model_named(const std::string& name) {
  if (name == "llama-1b") return parse_model(read_json_file(kData / "llama-1b.json"), "llama-1b.json");
  return load_model(name, kSource);
}

struct Row {
  std::string what;
  Estimate estimate;
  double measured_step = 0, measured_reserved = 0, measured_allocated = 0;
  double reserved() const { return estimate.per_stage.at(0).reserved(); }
  double memory_error() const { return reserved() / measured_reserved - 1; }
  double step_error() const { return estimate.time.step / measured_step - 1; }
};

std::vector<Row> exec_rows(const Software& sw) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kData / "trainplan_exec"))
    if (e.path().string().ends_with(".meas.json")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  const Cluster c = testing::builtin_cluster("dgx-h200");
  std::vector<Row> rows;
  for (const auto& f : files) {
    const json j = read_json_file(f);
    EXPECT_EQ(j.at("cluster"), "dgx-h200") << f;
    EXPECT_EQ(j.at("environment").at("allocator_expandable_segments"), true) << f << ": exec's default allocator";
    const Strategy s = strategy_from_json(j.at("strategy"), f.string());
    const ModelSpec m = model_named(j.at("model"));
    const json& rank = j.at("memory").at("per_rank").at(0);
    rows.push_back({f.filename().string(), predict(LayerGraph(m, s.seq_len), c, sw, s),
                    j.at("step_time").at("median_s").get<double>(), rank.at("peak_reserved_bytes").get<double>(),
                    rank.at("peak_allocated_bytes").get<double>()});
  }
  return rows;
}

Software mem2_profile() { return load_software((kData / "trainplan-exec-mem-2.json").string(), kSource); }

TEST(ValidationH200, TrainplanExecPeakReservedAndStepWithinTenPercent) {
  const std::vector<Row> rows = exec_rows(mem2_profile());
  ASSERT_EQ(rows.size(), 4u);
  for (const Row& r : rows) {
    ASSERT_TRUE(r.estimate.feasible) << r.what << ": it ran on the GPU";
    std::printf("%-24s reserved predicted %6.2f GB measured %6.2f GB (%+5.1f%%)   step predicted %.3f s measured "
                "%.3f s (%+5.1f%%)\n",
                r.what.c_str(), r.reserved() / 1e9, r.measured_reserved / 1e9, 100 * r.memory_error(),
                r.estimate.time.step, r.measured_step, 100 * r.step_error());
    EXPECT_LT(std::fabs(r.memory_error()), kTolerance) << r.what;
    EXPECT_LT(std::fabs(r.step_error()), kTolerance) << r.what;
  }
}

// The profile's one figure from these rows: what the allocator reserved over what it allocated.
// Every row's measured ratio lies within 1% of it, so the memory check above is the tensor
// accounting's.
TEST(ValidationH200, ReservedOverAllocatedIsTheMeasuredRatio) {
  const Software sw = mem2_profile();
  for (const Row& r : exec_rows(sw)) {
    EXPECT_NEAR(r.measured_reserved / r.measured_allocated, sw.allocator.reserved_over_allocated, 0.01) << r.what;
  }
}

// The profile these runs were predicted with at the time (tests/data/h100/trainplan-exec-e64f6de.json,
// which describes the executor measured on the H100) is far off them: the test above checks a
// refit, not a profile that fits any executor. Its memory error is +41..+68% on these rows.
TEST(ValidationH200, TheE64f6deProfileDoesNotDescribeTheseRuns) {
  const fs::path old = fs::path(TRAINPLAN_TEST_DATA_DIR) / "h100" / "trainplan-exec-e64f6de.json";
  const Software sw = load_software(old.string(), kSource);
  EXPECT_NE(sw.describes_executor, mem2_profile().describes_executor);
  for (const Row& r : exec_rows(sw)) EXPECT_GT(r.memory_error(), 0.20) << r.what;
}

// Today's executor (--fused-kernels auto: RMSNorm, RoPE and SwiGLU as trainplan's fused kernels)
// on the llama-1b plan of tests/gpu/bench_gpu.py, measured on the H200 with --fused-kernels on,
// which for a Llama-style model runs the same kernels (LayerNorm and GELU, the only ops on and
// auto differ in, are GPT-2's): the current profile predicts its step and peak reserved memory
// within 10%. The fused ops' passes in the profile were measured in a trace of this plan's step,
// so the step check is of everything else (GEMMs, attention, the loss, the optimizer); the
// memory check is the tensor accounting's, as above. The mem-2 profile, which describes the
// composite ops, misses this run by more than the tolerance (+12% memory, +18% step).
TEST(ValidationH200, TodaysExecutorOnTheFusedLlamaRow) {
  const json bench = read_json_file(kData / "bench-gpu-fused.json");
  const json* row = nullptr;
  for (const json& p : bench.at("plans"))
    if (p.at("plan") == "llama-1b-mb4") row = &p;
  ASSERT_NE(row, nullptr);
  const json& ex = row->at("exec");
  ASSERT_EQ(ex.at("status"), "ok");
  EXPECT_NE(ex.at("command").get<std::string>().find("--fused-kernels on"), std::string::npos);
  Strategy s;
  s.micro_batch = row->at("micro_batch");
  s.global_batch = row->at("global_batch");
  s.seq_len = row->at("seq");
  s.dtype = Dtype::bf16;
  const Cluster c = testing::builtin_cluster("dgx-h200");
  const ModelSpec m = model_named("llama-1b");
  const double measured_step = ex.at("step_s"), measured_reserved = ex.at("max_reserved_bytes");
  for (const bool today : {true, false}) {
    const Software sw = today ? load_software("trainplan-exec", kSource) : mem2_profile();
    const Estimate e = predict(LayerGraph(m, s.seq_len), c, sw, s);
    ASSERT_TRUE(e.feasible);
    const double mem_error = e.per_stage.at(0).reserved() / measured_reserved - 1;
    const double step_error = e.time.step / measured_step - 1;
    std::printf("llama-1b mb4 fused, %s profile: reserved %+5.1f%%, step %+5.1f%%\n", sw.describes_executor.c_str(),
                100 * mem_error, 100 * step_error);
    if (today) {
      EXPECT_LT(std::fabs(mem_error), kTolerance);
      EXPECT_LT(std::fabs(step_error), kTolerance);
    } else {
      EXPECT_GT(mem_error, kTolerance) << "the composite ops' profile should not describe the fused run";
      EXPECT_GT(step_error, kTolerance) << "the composite ops' profile should not describe the fused run";
    }
  }
}

}  // namespace
}  // namespace trainplan
