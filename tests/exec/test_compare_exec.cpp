// End to end on CPU: `trainplan predict --json p.json`, `trainplan exec ... --json m.json` with two
// Gloo ranks, then `trainplan compare p.json m.json --json c.json`. Checks the files' contracts
// (per-step loss, matching strategies, every compared figure present), not any speed.
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

using trainplan::testing::Result;

class CompareExec : public trainplan::testing::CliTest {};

TEST_F(CompareExec, PredictExecCompareOnCpuLocal) {
  const std::string plan =
      "--model tiny-gpt --cluster cpu-local --gpus 2 --dp 2 --global-batch 8 --micro-batch 2 --dtype fp32";
  const fs::path p = dir_ / "p.json", m = dir_ / "m.json", c = dir_ / "c.json";
  // exec is described by the trainplan-exec software profile: predict with it (compare warns otherwise).
  Result r = run("predict " + plan + " --software trainplan-exec --json " + p.string());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("exec " + plan + " --nproc 2 --steps 3 --warmup 1 --json " + m.string());
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("compare " + p.string() + " " + m.string() + " --json " + c.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("step (median)"), std::string::npos) << r.out;

  const nlohmann::json mj = trainplan::read_json_file(m);
  EXPECT_EQ(mj["schema"], "trainplan/measurement/v1");
  ASSERT_EQ(mj["steps"].size(), 3u);
  for (const auto& s : mj["steps"]) EXPECT_TRUE(s["loss"].is_number()) << s.dump();
  EXPECT_EQ(mj["memory"]["per_rank"].size(), 2u);

  const nlohmann::json cj = trainplan::read_json_file(c);
  EXPECT_EQ(cj["schema"], "trainplan/comparison/v1");
  EXPECT_TRUE(cj["strategies_match"].get<bool>());
  EXPECT_EQ(cj["model"]["measured"], "tiny-gpt");
  EXPECT_EQ(cj["cluster"]["predicted"], "cpu-local");
  ASSERT_FALSE(cj["time"].empty());
  EXPECT_EQ(cj["time"][0]["key"], "step_s");
  EXPECT_TRUE(cj["time"][0]["predicted"].is_number());
  EXPECT_TRUE(cj["time"][0]["measured"].is_number());
  EXPECT_TRUE(cj["time"][0]["error_pct"].is_number());
  EXPECT_EQ(cj["memory"].size(), 4u);  // peak, stage 0, ranks 0 and 1
}

}  // namespace
