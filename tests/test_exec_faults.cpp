// trainplan exec fault handling: a rank that dies mid-step stops the whole job within 60 s with a
// message naming that rank and the step; bad launch requests are rejected as input errors.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "cli_fixture.hpp"

namespace {

using trainplan::testing::run_merged;

const std::string kTiny = std::string("--model ") + TRAINPLAN_TEST_DATA_DIR +
                          "/exec/tiny-gpt.json --cluster dgx-h100 --dtype fp32 --global-batch 4 --micro-batch 1";

TEST(ExecFaults, KilledRankStopsTheJobAndIsNamed) {
  const auto r = run_merged("exec " + kTiny + " --gpus 2 --tp 2 --nproc 2 --steps 4 --warmup 0 --timeout 30"
                          " --fault-kill-rank 1 --fault-step 2");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("rank 1 was killed by signal 9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("in step 2"), std::string::npos) << r.output;
}

TEST(ExecFaults, HungRankStopsTheJob) {
  const auto r = run_merged("exec " + kTiny + " --gpus 2 --pp 2 --nproc 2 --steps 4 --warmup 0 --timeout 10"
                          " --fault-hang-rank 1 --fault-step 1");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 60.0) << r.output;
  EXPECT_NE(r.output.find("rank 1 is not responding (last seen in step 1)"), std::string::npos) << r.output;
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

// Context parallelism runs (issue 12), but its zigzag split needs 2*cp chunks of the sequence:
// cp 3 on a 64-token sequence is bad input naming the flag.
TEST(ExecFaults, ContextParallelNeedsTwoCpChunksOfTheSequence) {
  const auto r = run_merged("exec " + kTiny + " --gpus 3 --cp 3 --nproc 3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--cp 3"), std::string::npos) << r.output;
}

}  // namespace
