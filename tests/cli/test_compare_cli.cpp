// `trainplan compare` end to end on the real binary: table, --json, warnings, exit codes.
#include "cli_fixture.hpp"
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "sim/json_reader.hpp"

namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(TRAINPLAN_TEST_DATA_DIR) + "/compare/";

using trainplan::testing::Result;

class CompareCli : public trainplan::testing::CliTest {};

TEST_F(CompareCli, PrintsTableAndWritesJson) {
  const fs::path json = dir_ / "cmp.json";
  Result r = run("compare " + kDir + "prediction_pp2.json " + kDir + "measurement_pp2.json --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step (median)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-21.6%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stage 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 (stage 1)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
  const nlohmann::json j = trainplan::read_json_file(json);
  EXPECT_EQ(j["schema"], "trainplan/comparison/v1");
  EXPECT_NEAR(j["throughput"][0]["error_pct"].get<double>(), 27.5, 1e-9);
}

TEST_F(CompareCli, WarnsWhenStrategiesDiffer) {
  Result r = run("compare " + kDir + "prediction_pp2.json " + kDir + "measurement_other_strategy.json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: the strategies differ (micro_batch: predicted 2, measured 1"), std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("WARNING"), std::string::npos) << r.out;
}

TEST_F(CompareCli, BadInputExitsTwoWithOneLine) {
  auto one_line = [](const std::string& s) { return !s.empty() && s.find('\n') == s.size() - 1; };
  // Files swapped: the error names the first file and its schema.
  Result r = run("compare " + kDir + "measurement_pp2.json " + kDir + "prediction_pp2.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(one_line(r.err)) << r.err;
  EXPECT_NE(r.err.find("measurement_pp2.json: schema"), std::string::npos) << r.err;

  r = run("compare " + kDir + "prediction_pp2.json " + kDir + "measurement_bad_compute.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(one_line(r.err)) << r.err;
  EXPECT_NE(r.err.find("measurement_bad_compute.json: steps[1].phases.compute_s"), std::string::npos) << r.err;

  r = run("compare " + kDir + "prediction_pp2.json " + kDir + "no_such_file.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no_such_file.json: cannot open"), std::string::npos) << r.err;

  r = run("compare " + kDir + "prediction_pp2.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("two files"), std::string::npos) << r.err;

  r = run("compare " + kDir + "prediction_pp2.json " + kDir + "measurement_pp2.json --colour red");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--colour"), std::string::npos) << r.err;
}

// A measurement of trainplan exec against a prediction with the trainplan-exec profile: compare
// says in one line when the executor that ran is not the one the profile describes. The H200
// measurement predates the executor's name in measurements.
TEST_F(CompareCli, WarnsWhenTheExecutorIsNotTheProfiles) {
  const std::string data = std::string(TRAINPLAN_TEST_DATA_DIR) + "/h200/trainplan_exec/xl-mb4.meas.json";
  const fs::path p = dir_ / "p.json", m = dir_ / "m.json";
  Result r = run("predict --model gpt2-xl --cluster dgx-h200 --gpus 1 --micro-batch 4 --global-batch 32 --seq 1024 "
                 "--software trainplan-exec --json " + p.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(trainplan::read_json_file(p).at("software_executor"), "mem-3");
  auto warnings = [&](const fs::path& meas) {
    const Result c = run("compare " + p.string() + " " + meas.string());
    EXPECT_EQ(c.code, 0) << c.err;
    return c.err;
  };
  EXPECT_NE(warnings(data).find("warning: the measurement names no executor"), std::string::npos);
  nlohmann::json j = trainplan::read_json_file(data);
  j["executor"] = "mem-1";
  std::ofstream(m) << j.dump();
  const std::string other = warnings(m);
  EXPECT_NE(other.find("warning: the measurement came from executor 'mem-1', the profile 'trainplan-exec' describes "
                       "executor 'mem-3'"),
            std::string::npos)
      << other;
  j["executor"] = "mem-3";
  std::ofstream(m) << j.dump();
  EXPECT_EQ(warnings(m).find("executor"), std::string::npos);
}

TEST_F(CompareCli, Help) {
  Result r = run("compare --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("usage: trainplan compare"), std::string::npos);
}

}  // namespace
