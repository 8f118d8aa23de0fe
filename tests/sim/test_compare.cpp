// compare(): % errors of hand-made prediction and measurement files (tests/data/compare/), the
// strategy check, and the readers' schema errors.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "reports/compare.hpp"
#include "reports/measurement_json.hpp"
#include "sim/check.hpp"
#include "sim/compare.hpp"
#include "sim/json_reader.hpp"

namespace trainplan {
namespace {

const std::string kDir = std::string(TRAINPLAN_TEST_DATA_DIR) + "/compare/";

PredictionDoc prediction(const std::string& name) {
  return prediction_from_json(read_json_file(kDir + name), kDir + name);
}
Measurement measurement(const std::string& name) {
  return measurement_from_json(read_json_file(kDir + name), kDir + name);
}

const ComparedFigure& find(const std::vector<ComparedFigure>& rows, const std::string& key) {
  for (const ComparedFigure& f : rows)
    if (f.key == key) return f;
  throw std::runtime_error("no figure " + key);
}

TEST(PercentError, Definition) {
  EXPECT_DOUBLE_EQ(*percent_error(1.2, 1.0), 20.0);   // predicted too high: positive
  EXPECT_DOUBLE_EQ(*percent_error(0.5, 1.0), -50.0);
  EXPECT_DOUBLE_EQ(*percent_error(0.0, 0.0), 0.0);    // both zero (e.g. no TP): no error
  EXPECT_FALSE(percent_error(1.0, 0.0));              // measured zero: undefined
  EXPECT_FALSE(percent_error(0.0, 1.0));              // predicted zero: not predicted, not -100%
  EXPECT_FALSE(percent_error(std::nullopt, 1.0));
  EXPECT_FALSE(percent_error(1.0, std::nullopt));
}

TEST(Compare, HandMadeFilesGiveHandWorkedErrors) {
  const PredictionDoc p = prediction("prediction_pp2.json");
  EXPECT_EQ(p.model, "tiny-gpt");
  EXPECT_EQ(p.cluster, "cpu-local");
  const Comparison c = compare(p.estimate, p.model, p.cluster, measurement("measurement_pp2.json"));
  EXPECT_TRUE(c.strategies_match);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(c.warmup, 2);
  EXPECT_NEAR(c.measured_step_time.stdev, 0.2380476142847617, 1e-12);

  // Time: predicted 2.0 s vs measured median 2.55 s -> (2.0 - 2.55) / 2.55 = -21.5686%.
  EXPECT_NEAR(*find(c.time, "step_s").error_pct, -21.568627450980394, 1e-9);
  EXPECT_NEAR(*find(c.time, "compute_s").error_pct, -20.0, 1e-9);   // 1.2 vs 0.5 + 1.0
  EXPECT_NEAR(*find(c.time, "pp_comm_s").error_pct, 25.0, 1e-9);    // 0.1 vs 0.08
  EXPECT_NEAR(*find(c.time, "bubble_s").error_pct, -25.0, 1e-9);    // 0.6 vs 0.8
  EXPECT_NEAR(*find(c.time, "optimizer_s").error_pct, 0.0, 1e-9);   // 0.1 vs 0.1
  EXPECT_DOUBLE_EQ(*find(c.time, "tp_comm_s").error_pct, 0.0);      // 0 vs 0
  const ComparedFigure& other = find(c.time, "other_s");
  EXPECT_FALSE(other.predicted);
  EXPECT_NEAR(*other.measured, 0.07, 1e-12);
  EXPECT_FALSE(other.error_pct);

  // Memory: peak 1.1 GB vs 1.2 GB; stage 0 1.1 vs 1.0 GB; stage 1 0.9 vs 1.2 GB; ranks follow stages.
  EXPECT_NEAR(*find(c.memory, "peak_bytes").error_pct, -8.333333333333332, 1e-9);
  EXPECT_NEAR(*find(c.memory, "stage0_peak_bytes").error_pct, 10.0, 1e-9);
  EXPECT_NEAR(*find(c.memory, "stage1_peak_bytes").error_pct, -25.0, 1e-9);
  EXPECT_NEAR(*find(c.memory, "rank0_peak_bytes").error_pct, 10.0, 1e-9);
  EXPECT_NEAR(*find(c.memory, "rank1_peak_bytes").error_pct, -25.0, 1e-9);
  EXPECT_DOUBLE_EQ(*find(c.memory, "rank1_peak_bytes").predicted, 0.9e9);

  // Throughput: 256 tokens/s vs 512 / 2.55 = 200.78 -> 256 * 2.55 / 512 - 1 = +27.5%.
  EXPECT_NEAR(*find(c.throughput, "tokens_per_s").error_pct, 27.5, 1e-9);
  EXPECT_NEAR(*find(c.throughput, "tokens_per_s_per_gpu").error_pct, 27.5, 1e-9);
  EXPECT_NEAR(*find(c.throughput, "model_tflops_per_gpu").error_pct, 27.5, 1e-9);
}

TEST(Compare, MismatchedStrategyIsWarnedAndListed) {
  const PredictionDoc p = prediction("prediction_pp2.json");
  const Comparison c = compare(p.estimate, p.model, "dgx-a100-80g", measurement("measurement_other_strategy.json"));
  EXPECT_FALSE(c.strategies_match);
  ASSERT_EQ(c.strategy_differences.size(), 2u);
  EXPECT_EQ(c.strategy_differences[0], "micro_batch: predicted 2, measured 1");
  EXPECT_EQ(c.strategy_differences[1], "micro_batches: predicted 4, measured 8");
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_NE(c.warnings[0].find("strategies differ"), std::string::npos);
  EXPECT_NE(c.warnings[1].find("clusters differ"), std::string::npos);
}

// One line where the measurement came from another executor than the prediction's profile
// describes, or only one side names one; nothing for agreeing sides or other stacks.
TEST(Compare, ExecutorMismatchIsOneLine) {
  Measurement m;
  m.software = "trainplan-exec";
  m.executor = "mem-2";
  EXPECT_EQ(executor_mismatch("trainplan-exec", "mem-2", m), "");
  EXPECT_EQ(executor_mismatch("megatron-core", "", m), "");  // another stack: the software warning says it
  EXPECT_EQ(executor_mismatch("", "", m), "");                // a prediction naming no software
  const std::string other = executor_mismatch("trainplan-exec", "mem-1", m);
  EXPECT_NE(other.find("came from executor 'mem-2', the profile 'trainplan-exec' describes executor 'mem-1'"),
            std::string::npos)
      << other;
  EXPECT_EQ(other.find('\n'), std::string::npos);
  EXPECT_NE(executor_mismatch("trainplan-exec", "", m).find("names no executor"), std::string::npos);
  m.executor.clear();
  EXPECT_NE(executor_mismatch("trainplan-exec", "mem-2", m).find("the measurement names no executor"),
            std::string::npos);
}

// A GPU run's peak is the caching allocator's reserved bytes, without the runtime reserve (CUDA
// context, communication buffers): it is compared with the predicted reserved bytes, a CPU run's
// resident set with the predicted total.
TEST(Compare, GpuPeaksAreComparedWithoutTheRuntimeReserve) {
  PredictionDoc p = prediction("prediction_pp2.json");
  for (StageMemory& s : p.estimate.per_stage) s.runtime = 1e9;
  Measurement m = measurement("measurement_pp2.json");
  const Comparison cpu = compare(p.estimate, p.model, p.cluster, m);
  EXPECT_EQ(find(cpu.memory, "stage0_peak_bytes").predicted, p.estimate.per_stage.at(0).total());
  m.device = "cuda";
  const Comparison gpu = compare(p.estimate, p.model, p.cluster, m);
  EXPECT_EQ(find(gpu.memory, "stage0_peak_bytes").predicted, p.estimate.per_stage.at(0).reserved());
  EXPECT_EQ(find(gpu.memory, "stage0_peak_bytes").label, "stage 0 reserved");
  EXPECT_EQ(find(gpu.memory, "peak_bytes").predicted,
            std::max(p.estimate.per_stage.at(0).reserved(), p.estimate.per_stage.at(1).reserved()));
  EXPECT_EQ(find(gpu.memory, "rank1_peak_bytes").predicted, p.estimate.per_stage.at(1).reserved());
}

TEST(Compare, MissingMeasuredModelFlopsLeavesTflopsOpen) {
  const PredictionDoc p = prediction("prediction_pp2.json");
  Measurement m = measurement("measurement_pp2.json");
  m.throughput.model_flops_per_step = 0;
  const Comparison c = compare(p.estimate, p.model, p.cluster, m);
  EXPECT_FALSE(find(c.throughput, "model_tflops_per_gpu").measured);
  EXPECT_FALSE(find(c.throughput, "model_tflops_per_gpu").error_pct);
}

void expect_input_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  }
}

TEST(Compare, WrongSchemaNamesTheFile) {
  // A prediction where the measurement belongs, and the other way round.
  expect_input_error([] { measurement("prediction_pp2.json"); },
                     {kDir + "prediction_pp2.json: schema = \"trainplan/prediction/v1\"", "trainplan/measurement/v1"});
  expect_input_error([] { prediction("measurement_pp2.json"); },
                     {kDir + "measurement_pp2.json: schema", "is this a prediction file?"});
  expect_input_error([] { prediction("truncated.json"); }, {"truncated.json: malformed JSON"});
}

TEST(Compare, PredictionReaderChecksFields) {
  nlohmann::json j = read_json_file(kDir + "prediction_pp2.json");
  j["time"].erase("bubble_s");
  expect_input_error([&] { prediction_from_json(j, "p.json"); }, {"p.json: time.bubble_s is missing"});
  j = read_json_file(kDir + "prediction_pp2.json");
  j["time"]["bubble_s"] = -8.7e-19;  // rounding noise reads as 0
  EXPECT_DOUBLE_EQ(prediction_from_json(j, "p.json").estimate.time.bubble, 0.0);
  j["time"]["bubble_s"] = -0.1;
  expect_input_error([&] { prediction_from_json(j, "p.json"); }, {"p.json: time.bubble_s = -0.1"});
  j = read_json_file(kDir + "prediction_pp2.json");
  j["memory"]["per_stage"][1]["total"] = 1.0;
  expect_input_error([&] { prediction_from_json(j, "p.json"); }, {"p.json: memory.per_stage[1].total = 1"});
}

TEST(CompareReport, TableAndJsonCarryEveryFigure) {
  const PredictionDoc p = prediction("prediction_pp2.json");
  const Comparison c = compare(p.estimate, p.model, p.cluster, measurement("measurement_pp2.json"));
  std::ostringstream os;
  print_comparison(os, c, "p.json", "m.json");
  const std::string text = os.str();
  EXPECT_NE(text.find("-21.6%"), std::string::npos) << text;
  EXPECT_NE(text.find("+27.5%"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("WARNING"), std::string::npos) << text;

  const nlohmann::json j = comparison_to_json(c, "p.json", "m.json");
  EXPECT_EQ(j["schema"], "trainplan/comparison/v1");
  EXPECT_EQ(j["prediction_file"], "p.json");
  EXPECT_TRUE(j["strategies_match"].get<bool>());
  EXPECT_EQ(j["time"].size(), c.time.size());
  EXPECT_EQ(j["time"][0]["key"], "step_s");
  EXPECT_NEAR(j["time"][0]["error_pct"].get<double>(), -21.568627450980394, 1e-9);
  bool other_null = false;
  for (const auto& f : j["time"])
    if (f["key"] == "other_s") other_null = f["predicted"].is_null() && f["error_pct"].is_null();
  EXPECT_TRUE(other_null);
  EXPECT_EQ(j["memory"].size(), 5u);  // peak, 2 stages, 2 ranks
  EXPECT_DOUBLE_EQ(j["measured_step_time"]["median_s"].get<double>(), 2.55);
}

// A phase the prediction has as 0 while the run measured it (here CP communication): no -100%,
// "n/a" and "not predicted" in the table, a null error and not_predicted in the JSON.
TEST(CompareReport, PredictedZeroIsNotPredictedNotMinus100) {
  PredictionDoc p = prediction("prediction_pp2.json");
  Measurement m = measurement("measurement_pp2.json");
  p.estimate.time.cp_comm = 0;
  m.breakdown.cp_comm = 0.25;
  const Comparison c = compare(p.estimate, p.model, p.cluster, m);
  const ComparedFigure& cp = find(c.time, "cp_comm_s");
  EXPECT_FALSE(cp.error_pct);
  EXPECT_TRUE(cp.not_predicted());
  EXPECT_FALSE(find(c.time, "step_s").not_predicted());
  std::ostringstream os;
  print_comparison(os, c, "p.json", "m.json");
  const std::string text = os.str();
  EXPECT_EQ(text.find("-100"), std::string::npos) << text;
  std::string line;
  for (std::istringstream in(text); std::getline(in, line);)
    if (line.find("CP comm") != std::string::npos) break;
  EXPECT_NE(line.find("n/a"), std::string::npos) << line;
  EXPECT_NE(line.find("not predicted"), std::string::npos) << line;
  const nlohmann::json j = comparison_to_json(c, "p.json", "m.json");
  for (const auto& f : j["time"]) {
    EXPECT_EQ(f["not_predicted"].get<bool>(), f["key"] == "cp_comm_s") << f["key"];
    if (f["key"] == "cp_comm_s") {
      EXPECT_TRUE(f["error_pct"].is_null());
    }
  }
}

}  // namespace
}  // namespace trainplan
