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

TEST_F(CompareCli, Help) {
  Result r = run("compare --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("usage: trainplan compare"), std::string::npos);
}

}  // namespace
