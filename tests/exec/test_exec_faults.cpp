// trainplan exec fault handling: a rank that dies mid-step stops the whole job within 60 s with a
// message naming that rank and the step, and the --json file says "status": "failed" with the
// rank, step, phase, error and memory; bad launch requests are rejected as input errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_fixture.hpp"

namespace {

using trainplan::testing::run_merged;
namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("trainplan_exec_faults_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  EXPECT_TRUE(f.good()) << p;
  return nlohmann::json::parse(f, nullptr, false);
}

// The folder holds exactly `name` (no temporary left behind by the atomic write).
void expect_only(const fs::path& dir, const std::string& name) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{name});
}

const std::string kTiny = std::string("--model ") + TRAINPLAN_TEST_DATA_DIR +
                          "/exec/tiny-gpt.json --cluster dgx-h100 --dtype fp32 --global-batch 4 --micro-batch 1";

TEST(ExecFaults, KilledRankWritesAFailedMeasurement) {
  const fs::path dir = scratch("kill");
  const fs::path json = dir / "m.json";
  const auto r = run_merged("exec " + kTiny + " --tp 2 --nproc 2 --steps 4 --warmup 0 --timeout 30"
                          " --fault-kill-rank 1 --fault-step 2 --json " + json.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("rank 1 was killed by signal 9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("in step 2"), std::string::npos) << r.output;
  const auto j = read_json(json);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j.at("schema"), "trainplan/measurement/v1");
  EXPECT_EQ(j.at("status"), "failed");
  const auto& f = j.at("failure");
  EXPECT_EQ(f.at("rank"), 1);
  EXPECT_EQ(f.at("step"), 2);
  EXPECT_EQ(f.at("phase"), "forward (micro-batch 0, chunk 0)");  // killed after its first forward
  EXPECT_NE(f.at("error").get<std::string>().find("killed by signal 9"), std::string::npos) << f;
  // Killed by a signal, it reported nothing itself: the launcher's last sample of its memory.
  EXPECT_GT(f.at("memory").at("rss_bytes").get<double>(), 1e6) << f;
  EXPECT_TRUE(f.at("memory").at("allocated_bytes").is_null()) << f;
  EXPECT_EQ(j.at("strategy").at("tp"), 2);
  expect_only(dir, "m.json");
  fs::remove_all(dir);
}

TEST(ExecFaults, AllocationFailureOnOneRankWritesAFailedMeasurement) {
  const fs::path dir = scratch("alloc");
  const fs::path json = dir / "m.json";
  const auto r = run_merged("exec " + kTiny + " --pp 2 --schedule 1f1b --nproc 2 --steps 3 --warmup 0"
                          " --timeout 30 --fault-alloc-rank 1 --fault-step 1 --json " + json.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  const auto j = read_json(json);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j.at("status"), "failed");
  const auto& f = j.at("failure");
  // Rank 1 failed first; rank 0 then lost its peer, which is not the cause.
  EXPECT_EQ(f.at("rank"), 1) << f;
  EXPECT_EQ(f.at("step"), 1) << f;
  EXPECT_EQ(f.at("phase"), "forward (micro-batch 0, chunk 0)") << f;
  EXPECT_NE(f.at("error").get<std::string>().find("allocate"), std::string::npos) << f;
  EXPECT_GT(f.at("memory").at("rss_bytes").get<double>(), 1e6) << f;
  EXPECT_GT(f.at("memory").at("capacity_bytes").get<double>(), 1e8) << f;  // the host's RAM on CPU
  EXPECT_TRUE(f.at("memory").at("reserved_bytes").is_null()) << f;         // no caching allocator on CPU
  expect_only(dir, "m.json");

  // compare refuses it, naming the failure.
  const fs::path pred = dir / "p.json";
  ASSERT_EQ(run_merged("predict " + kTiny + " --pp 2 --schedule 1f1b --gpus 2 --json " + pred.string()).code, 0);
  const auto c = run_merged("compare " + pred.string() + " " + json.string());
  EXPECT_EQ(c.code, 2) << c.output;
  EXPECT_NE(c.output.find("failed"), std::string::npos) << c.output;
  fs::remove_all(dir);
}

TEST(ExecFaults, AllocationFailureOfASingleProcessWritesAFailedMeasurement) {
  // No launcher: the rank itself writes the file, over the previous one.
  const fs::path dir = scratch("alloc1");
  const fs::path json = dir / "m.json";
  { std::ofstream(json) << "previous\n"; }
  const auto r = run_merged("exec " + kTiny + " --steps 2 --warmup 0 --fault-alloc-rank 0 --fault-step 0 --json " +
                            json.string());
  EXPECT_EQ(r.code, 1) << r.output;
  const auto j = read_json(json);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j.at("status"), "failed");
  EXPECT_EQ(j.at("failure").at("rank"), 0);
  EXPECT_EQ(j.at("failure").at("step"), 0);
  EXPECT_EQ(j.at("run").at("backend"), "gloo");
  expect_only(dir, "m.json");
  fs::remove_all(dir);
}

TEST(ExecFaults, NonFiniteLossStopsTheJobInTheStepItAppears) {
  // fp32 has no loss scaling: a NaN gradient on rank 1 after step 1's backward reaches the
  // parameters, so step 2's loss is NaN on every rank. The job stops there (it used to time the
  // remaining steps and write "loss": null, which compare then refused).
  const fs::path dir = scratch("nan");
  const fs::path json = dir / "m.json";
  const auto r = run_merged("exec " + kTiny + " --dp 2 --nproc 2 --steps 4 --warmup 0 --timeout 30"
                          " --fault-nan-rank 1 --fault-step 1 --json " + json.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("in step 2: the loss is nan (training diverged"), std::string::npos) << r.output;
  const auto j = read_json(json);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j.at("status"), "failed");
  EXPECT_EQ(j.at("failure").at("step"), 2);
  EXPECT_NE(j.at("failure").at("error").get<std::string>().find("the loss is nan"), std::string::npos) << j;
  expect_only(dir, "m.json");
  fs::remove_all(dir);
}

TEST(ExecFaults, HungRankStopsTheJob) {
  const auto r = run_merged("exec " + kTiny + " --gpus 2 --pp 2 --nproc 2 --steps 4 --warmup 0 --timeout 10"
                          " --fault-hang-rank 1 --fault-step 1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("rank 1 is not responding (last seen in step 1)"), std::string::npos) << r.output;
}

TEST(ExecFaults, GpusDefaultsToNproc) {
  // No --gpus: the plan has --nproc ranks (here dp = 2 / tp 2 = 1).
  const auto r = run_merged("exec " + kTiny + " --tp 2 --nproc 2 --steps 1 --warmup 0");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 CPU ranks"), std::string::npos) << r.output;
}

TEST(ExecFaults, WrongProcessCountIsAnInputError) {
  const auto r = run_merged("exec " + kTiny + " --gpus 2 --nproc 3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--nproc 3"), std::string::npos) << r.output;
}

TEST(ExecFaults, MultiRankPlanWithoutLauncherIsAnInputError) {
  const auto r = run_merged("exec " + kTiny + " --gpus 2");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--nproc 2"), std::string::npos) << r.output;
}

// Context parallelism runs, but its zigzag split needs 2*cp chunks of the sequence:
// cp 3 on a 64-token sequence is bad input naming the flag.
TEST(ExecFaults, ContextParallelNeedsTwoCpChunksOfTheSequence) {
  const auto r = run_merged("exec " + kTiny + " --gpus 3 --cp 3 --nproc 3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--cp 3"), std::string::npos) << r.output;
}

}  // namespace
