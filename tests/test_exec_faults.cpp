// trainplan exec fault handling: a rank that dies mid-step stops the whole job within 60 s with a
// message naming that rank and the step; bad launch requests are rejected as input errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

struct RunResult {
  int status = -1;
  std::string output;
  double seconds = 0;
};

RunResult run(const std::string& args) {
  const std::string cmd = std::string(TRAINPLAN_BINARY) + " " + args + " 2>&1";
  RunResult r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

const std::string kTiny = std::string("--model ") + TRAINPLAN_TEST_DATA_DIR +
                          "/exec/tiny-gpt.json --cluster dgx-h100 --dtype fp32 --global-batch 4 --micro-batch 1";

TEST(ExecFaults, KilledRankStopsTheJobAndIsNamed) {
  const RunResult r = run("exec " + kTiny + " --gpus 2 --tp 2 --nproc 2 --steps 4 --warmup 0 --timeout 30"
                          " --fault-kill-rank 1 --fault-step 2");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("rank 1 was killed by signal 9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("in step 2"), std::string::npos) << r.output;
}

TEST(ExecFaults, HungRankStopsTheJob) {
  const RunResult r = run("exec " + kTiny + " --gpus 2 --pp 2 --nproc 2 --steps 4 --warmup 0 --timeout 10"
                          " --fault-hang-rank 1 --fault-step 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("rank 1 is not responding (last seen in step 1)"), std::string::npos) << r.output;
}

TEST(ExecFaults, WrongProcessCountIsAnInputError) {
  const RunResult r = run("exec " + kTiny + " --gpus 2 --nproc 3");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--nproc 3"), std::string::npos) << r.output;
}

TEST(ExecFaults, MultiRankPlanWithoutLauncherIsAnInputError) {
  const RunResult r = run("exec " + kTiny + " --gpus 2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--nproc 2"), std::string::npos) << r.output;
}

TEST(ExecFaults, ContextParallelIsRejected) {
  const RunResult r = run("exec " + kTiny + " --gpus 2 --cp 2 --nproc 2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--cp 2"), std::string::npos) << r.output;
}

}  // namespace
