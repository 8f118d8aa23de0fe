// Measurement: Spread arithmetic by hand, summarize(), trainplan/measurement/v1 round trip and
// the strict reader's errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "reports/measurement_json.hpp"
#include "sim/check.hpp"
#include "sim/json_reader.hpp"
#include "sim/measurement.hpp"

namespace trainplan {
namespace {

const std::string kDir = std::string(TRAINPLAN_TEST_DATA_DIR) + "/compare/";

TEST(Spread, OddCount) {
  // {3, 1, 2}: sorted 1 2 3, median 2, mean 2, stdev sqrt(((1-2)^2 + 0 + (3-2)^2) / 2) = 1.
  Spread s = spread_of({3, 1, 2});
  EXPECT_EQ(s.count, 3);
  EXPECT_DOUBLE_EQ(s.median, 2);
  EXPECT_DOUBLE_EQ(s.mean, 2);
  EXPECT_DOUBLE_EQ(s.stdev, 1);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 3);
}

TEST(Spread, EvenCountMedianIsMeanOfMiddlePair) {
  // {2.5, 2.6, 2.5, 3.0}: sorted 2.5 2.5 2.6 3.0, median (2.5 + 2.6) / 2 = 2.55, mean 10.6 / 4 = 2.65,
  // squared deviations 0.0225 + 0.0225 + 0.0025 + 0.1225 = 0.17, stdev sqrt(0.17 / 3) = 0.238048.
  Spread s = spread_of({2.5, 2.6, 2.5, 3.0});
  EXPECT_EQ(s.count, 4);
  EXPECT_NEAR(s.median, 2.55, 1e-12);
  EXPECT_NEAR(s.mean, 2.65, 1e-12);
  EXPECT_NEAR(s.stdev, 0.2380476142847617, 1e-12);
  EXPECT_DOUBLE_EQ(s.min, 2.5);
  EXPECT_DOUBLE_EQ(s.max, 3.0);
}

TEST(Spread, OneAndNoSamples) {
  Spread one = spread_of({0.7});
  EXPECT_EQ(one.count, 1);
  EXPECT_DOUBLE_EQ(one.median, 0.7);
  EXPECT_DOUBLE_EQ(one.stdev, 0);
  Spread none = spread_of({});
  EXPECT_EQ(none.count, 0);
  EXPECT_DOUBLE_EQ(none.median, 0);
}

PhaseTimes phases(double other) {
  PhaseTimes p;
  p.forward = 0.5;
  p.backward = 1.0;
  p.pp_comm = 0.08;
  p.bubble = 0.8;
  p.optimizer = 0.1;
  p.other = other;
  return p;
}

// The run that tests/data/compare/measurement_pp2.json describes.
Measurement pp2_run() {
  Measurement m;
  m.strategy.pp = 2;
  m.strategy.global_batch = 8;
  m.strategy.micro_batch = 2;
  m.strategy.seq_len = 64;
  m.strategy.dtype = Dtype::fp32;
  m.strategy.schedule = ScheduleKind::gpipe;
  m.model = "tiny-gpt";
  m.cluster = "cpu-local";
  m.backend = "gloo";
  m.device = "cpu";
  m.warmup = 2;
  m.seed = 1234;
  const double walls[] = {2.5, 2.6, 2.5, 3.0};
  const double others[] = {0.02, 0.12, 0.02, 0.52};
  for (int i = 0; i < 4; ++i) m.per_step.push_back({2 + i, walls[i], 4.2 - 0.1 * i, phases(others[i])});
  RankMeasurement r0, r1;
  r0.rank = 0;
  r0.max_rss = 1.0e9;
  r0.phases = phases(0.07);
  r1.rank = 1;
  r1.coords.pp = 1;
  r1.max_rss = 1.2e9;
  r1.phases = phases(0.07);
  m.ranks = {r0, r1};
  m.environment = {{"hostname", "test-host"}, {"torch_version", "2.11.0"}, {"devices", {"cpu", "cpu"}}};
  m.throughput.model_flops_per_step = 1e9;
  summarize(m);
  return m;
}

TEST(Summarize, DerivesStepTimeBreakdownMemoryAndThroughput) {
  const Measurement m = pp2_run();
  EXPECT_EQ(m.steps, 4);
  EXPECT_NEAR(m.step_time.median, 2.55, 1e-12);
  EXPECT_NEAR(m.breakdown.compute(), 1.5, 1e-12);
  EXPECT_NEAR(m.breakdown.other, 0.07, 1e-12);  // median of 0.02 0.02 0.12 0.52
  ASSERT_EQ(m.per_stage.size(), 2u);
  EXPECT_DOUBLE_EQ(m.per_stage[0].peak, 1.0e9);
  EXPECT_DOUBLE_EQ(m.per_stage[1].peak, 1.2e9);
  EXPECT_DOUBLE_EQ(m.peak_memory, 1.2e9);
  // 8 sequences x 64 tokens / 2.55 s = 200.78 tokens/s over 2 ranks; 1e9 / 2.55 / 2 / 1e12 TFLOP/s.
  EXPECT_NEAR(m.throughput.tokens_per_s, 512 / 2.55, 1e-9);
  EXPECT_NEAR(m.throughput.tokens_per_s_per_gpu, 256 / 2.55, 1e-9);
  EXPECT_NEAR(m.throughput.model_tflops_per_gpu, 1e9 / 2.55 / 2 / 1e12, 1e-18);
}

TEST(Summarize, GpuPeakUsesReservedBytes) {
  RankMeasurement r;
  r.peak_allocated = 5e9;
  r.peak_reserved = 6e9;
  r.max_rss = 2e9;
  EXPECT_DOUBLE_EQ(r.peak_bytes(), 6e9);
  r.peak_reserved = 0;
  EXPECT_DOUBLE_EQ(r.peak_bytes(), 2e9);
}

TEST(MeasurementJson, WritesSchemaAndPredictionNames) {
  const nlohmann::json j = measurement_to_json(pp2_run());
  EXPECT_EQ(j["schema"], "trainplan/measurement/v1");
  for (const char* k : {"step_s", "compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s",
                        "dp_comm_exposed_s", "bubble_s", "optimizer_s"}) {
    EXPECT_TRUE(j["time"].contains(k)) << k;
  }
  EXPECT_EQ(j["steps"].size(), 4u);
  EXPECT_TRUE(j["steps"][0].contains("loss"));
  EXPECT_DOUBLE_EQ(j["time"]["step_s"].get<double>(), j["step_time"]["median_s"].get<double>());
  EXPECT_DOUBLE_EQ(j["memory"]["peak_bytes"].get<double>(), 1.2e9);
  EXPECT_EQ(j["memory"]["per_rank"][1]["coords"]["pp"], 1);
}

TEST(MeasurementJson, RoundTrip) {
  const Measurement a = pp2_run();
  const Measurement b = measurement_from_json(measurement_to_json(a), "mem");
  EXPECT_EQ(to_json(b.strategy), to_json(a.strategy));
  EXPECT_EQ(b.model, a.model);
  EXPECT_EQ(b.backend, "gloo");
  EXPECT_EQ(b.warmup, 2);
  EXPECT_EQ(b.seed, 1234);
  ASSERT_EQ(b.per_step.size(), 4u);
  EXPECT_EQ(b.per_step[3].step, 5);
  EXPECT_DOUBLE_EQ(b.per_step[3].loss, a.per_step[3].loss);
  EXPECT_DOUBLE_EQ(b.per_step[1].phases.other, 0.12);
  EXPECT_DOUBLE_EQ(b.step_time.stdev, a.step_time.stdev);
  EXPECT_DOUBLE_EQ(b.breakdown.bubble, 0.8);
  ASSERT_EQ(b.ranks.size(), 2u);
  EXPECT_EQ(b.ranks[1].coords.pp, 1);
  EXPECT_DOUBLE_EQ(b.ranks[1].max_rss, 1.2e9);
  EXPECT_EQ(b.environment, a.environment);
  EXPECT_EQ(measurement_to_json(b), measurement_to_json(a));
}

TEST(MeasurementJson, ReadsHandMadeFile) {
  const std::string file = kDir + "measurement_pp2.json";
  const Measurement m = measurement_from_json(read_json_file(file), file);
  EXPECT_EQ(m.strategy.pp, 2);
  EXPECT_EQ(m.steps, 4);
  EXPECT_NEAR(m.step_time.median, 2.55, 1e-12);
  EXPECT_NEAR(m.breakdown.compute(), 1.5, 1e-12);
  EXPECT_NEAR(m.step_time.stdev, 0.2380476142847617, 1e-12);
  ASSERT_EQ(m.ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(m.ranks[1].peak_bytes(), 1.2e9);
  EXPECT_EQ(m.environment["hostname"], "test-host");
}

// Expects measurement_from_json(j) to throw InputError whose message contains every `parts`.
void expect_error(const nlohmann::json& j, std::initializer_list<const char*> parts) {
  try {
    measurement_from_json(j, "m.json");
    ADD_FAILURE() << "no error for " << j.dump().substr(0, 200);
  } catch (const InputError& e) {
    const std::string what = e.what();
    for (const char* p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

TEST(MeasurementJson, RejectsBadInput) {
  const nlohmann::json good = measurement_to_json(pp2_run());
  auto with = [&](auto edit) {
    nlohmann::json j = good;
    edit(j);
    return j;
  };
  expect_error(with([](auto& j) { j["schema"] = "trainplan/prediction/v1"; }), {"m.json", "schema", "measurement/v1"});
  expect_error(with([](auto& j) { j.erase("steps"); }), {"m.json", "steps is missing"});
  expect_error(with([](auto& j) { j["colour"] = "red"; }), {"m.json", "colour is not a known key"});
  expect_error(with([](auto& j) { j["steps"][0]["wall_s"] = -1.0; }), {"steps[0].wall_s = -1"});
  expect_error(with([](auto& j) { j["steps"][0]["loss"] = "x"; }), {"steps[0].loss", "must be a number"});
  expect_error(with([](auto& j) { j["steps"][0]["phases"]["other_s"] = -0.01; }), {"steps[0].phases.other_s = -0.01"});
  expect_error(with([](auto& j) { j["steps"][2]["phases"]["compute_s"] = 9.0; }),
               {"steps[2].phases.compute_s", "forward_s + backward_s"});
  expect_error(with([](auto& j) { j["time"]["step_s"] = 1.0; }), {"time.step_s", "step_time.median_s"});
  expect_error(with([](auto& j) { j["run"]["measured_steps"] = 3; }), {"steps", "measured_steps = 3"});
  expect_error(with([](auto& j) { j["run"]["backend"] = "mpi"; }), {"run.backend", "nccl|gloo"});
  expect_error(with([](auto& j) { j["memory"]["per_rank"][0]["coords"].erase("pp"); }),
               {"memory.per_rank[0].coords.pp is missing"});
  expect_error(with([](auto& j) { j["strategy"]["dp"] = 0; }), {"strategy.dp"});
  expect_error(nlohmann::json::array(), {"m.json", "object"});
}

TEST(MeasurementJson, FileErrorsNameTheFile) {
  const std::string bad = kDir + "measurement_bad_compute.json";
  try {
    measurement_from_json(read_json_file(bad), bad);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("measurement_bad_compute.json: steps[1].phases.compute_s"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(read_json_file(kDir + "truncated.json"), InputError);
}

// CPU ranks compute in fp32 whatever the plan asks: the strategy records fp32 and the
// requested dtype goes beside it, through the JSON and back; on a GPU the dtype is the plan's.
TEST(MeasurementJson, CpuRunRecordsTheDtypeItRan) {
  Measurement a = pp2_run();
  Strategy plan = a.strategy;
  plan.dtype = Dtype::bf16;
  set_run_strategy(a, plan, /*cuda_device=*/false);
  EXPECT_EQ(a.strategy.dtype, Dtype::fp32);
  EXPECT_EQ(a.requested_dtype, "bf16");
  const nlohmann::json j = measurement_to_json(a);
  EXPECT_EQ(j.at("strategy").at("dtype"), "fp32");
  EXPECT_EQ(j.at("run").at("requested_dtype"), "bf16");
  const Measurement b = measurement_from_json(j, "m.json");
  EXPECT_EQ(b.strategy.dtype, Dtype::fp32);
  EXPECT_EQ(b.requested_dtype, "bf16");
  nlohmann::json bad = j;
  bad["run"]["requested_dtype"] = "fp64";
  expect_error(bad, {"m.json: run.requested_dtype = \"fp64\"", "bf16|fp16|fp8|fp32"});

  set_run_strategy(a, plan, /*cuda_device=*/true);
  EXPECT_EQ(a.strategy.dtype, Dtype::bf16);
  EXPECT_EQ(a.requested_dtype, "");
  EXPECT_FALSE(measurement_to_json(a).at("run").contains("requested_dtype"));
  plan.dtype = Dtype::fp32;  // fp32 asked and run on CPU: nothing to record beside it
  set_run_strategy(a, plan, false);
  EXPECT_EQ(a.requested_dtype, "");
}

}  // namespace
}  // namespace trainplan
