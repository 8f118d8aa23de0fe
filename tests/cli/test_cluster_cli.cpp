// `trainplan cluster derive` end to end on the real binary: the file it writes loads, derives its
// tables by the rule, and predicts as a built-in cluster with the same GPU figures; the copy trap
// (another GPU's figures over H100's measured tables) is refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "cli_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using trainplan::testing::Result;

class ClusterCli : public trainplan::testing::CliTest {};

// The step time `predict` prints, in seconds.
double step_time(const std::string& out) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(step time ([0-9.]+) (s|ms))"))) << out;
  return m.size() < 3 ? 0 : std::stod(m[1]) * (m[2] == "ms" ? 1e-3 : 1);
}

const std::string kB200 =
    "--gpu-name B200-SXM-180GB --peak-bf16 2250 --peak-fp8 4500 --peak-mxfp8 4500 --peak-nvfp4 9000 --peak-fp32 80 "
    "--hbm-gb 191.5 --hbm-bandwidth-gbps 7680 --sm-count 148";

// One GPU (no communication): a derived file with dgx-b200's GPU figures and its published best
// matmul rates predicts dgx-b200's step time, since both derive from dgx-h100 by the one rule.
TEST_F(ClusterCli, DerivedFileLoadsAndMatchesTheBuiltinDerivation) {
  const fs::path peaks_only = dir_ / "peaks.json";
  Result r = run("cluster derive --from dgx-h100 --name peaks " + kB200 + " --out " + peaks_only.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("x 2.274 (GEMM, attention) and x 2.293 (memory-bound); GEMMs at the measured efficiency "
                       "of m x 0.8919, k x 0.4931"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(read(peaks_only).at("ops").at("derive"), json::parse(R"({"from": "dgx-h100"})"));
  const fs::path out = dir_ / "my-b200.json";
  r = run("cluster derive --from dgx-h100 --name my-b200 " + kB200 +
          " --achieved-bf16 1745 --achieved-fp8 3432.5 --price-usd 5 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  // GEMMs 1745 / 788.9 (dgx-h100's best measured GEMM rate); attention by the peaks, 2250 / 989.5.
  EXPECT_NE(r.out.find("x 2.212 (GEMM, by achieved rates), x 2.274 (attention) and x 2.293 (memory-bound)"),
            std::string::npos)
      << r.out;
  const json j = read(out);
  const json& achieved = j.at("ops").at("derive").at("achieved");
  ASSERT_EQ(achieved.size(), 2u);
  EXPECT_EQ(achieved[1].at("dtype"), "fp8");
  EXPECT_EQ(achieved[1].at("tflops"), 3432.5);
  EXPECT_EQ(j.at("price_per_gpu_hour_usd"), 5);
  EXPECT_EQ(j.at("node"), read(fs::path(TRAINPLAN_SOURCE_DIR) / "topologies" / "dgx-h100.json").at("node"));
  const std::string plan = " --model llama3-8b --gpus 1 --global-batch 4 --micro-batch 1 --seq 2048";
  for (const char* dtype : {"bf16", "fp8"}) {
    const Result mine = run("predict --cluster " + out.string() + plan + " --dtype " + dtype);
    const Result builtin = run("predict --cluster dgx-b200" + plan + " --dtype " + dtype);
    ASSERT_EQ(mine.code, 0) << mine.err;
    ASSERT_EQ(builtin.code, 0) << builtin.err;
    EXPECT_NEAR(step_time(mine.out), step_time(builtin.out), 1e-3 * step_time(builtin.out)) << dtype;
  }
  // A format's figure alone has nothing to be a speed-up over; a figure above the peak is a typo.
  r = run("cluster derive --from dgx-h100 --name x " + kB200 + " --achieved-fp8 3000 --out " + (dir_ / "x.json").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--achieved-fp8: needs --achieved-bf16 (the format's speed-up is its rate over bf16's)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  EXPECT_FALSE(fs::exists(dir_ / "x.json"));
  r = run("cluster derive --from dgx-h100 --name x " + kB200 + " --achieved-bf16 3000 --out " + (dir_ / "x.json").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("ops.derive.achieved[0].tflops = 3000.0, exceeds gpu.peak_tflops.bf16 (2250): an achieved rate is at most "
                       "the datasheet peak"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  EXPECT_FALSE(fs::exists(dir_ / "x.json"));
}

// A derived file names a measured cluster FILE relative to its own folder, so the pair can move.
TEST_F(ClusterCli, FromAFileIsWrittenRelativeToTheOutput) {
  fs::create_directories(dir_ / "measured");
  fs::copy_file(fs::path(TRAINPLAN_SOURCE_DIR) / "topologies" / "dgx-h100.json", dir_ / "measured" / "ours.json");
  const fs::path out = dir_ / "derived" / "b.json";
  fs::create_directories(out.parent_path());
  const Result r = run("cluster derive --from " + (dir_ / "measured" / "ours.json").string() + " --name b " + kB200 +
                       " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read(out).at("ops").at("derive").at("from"), "../measured/ours.json");
  EXPECT_EQ(run("predict --model gpt2 --gpus 8 --global-batch 8 --cluster " + out.string()).code, 0);
}

// The trap: dgx-h100.json copied and given B200's peak would keep H100's step time at half the MFU.
TEST_F(ClusterCli, ACopiedFileWithAnotherGpusPeakIsRefusedWithTheWayOut) {
  const Result r = run("predict --model llama3-8b --gpus 8 --global-batch 64 --cluster " +
                       std::string(TRAINPLAN_TEST_DATA_DIR) + "/bad/cluster_copied_h100_as_b200.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("gpu.peak_tflops.bf16 = 2250 differs from the 989.5 TFLOP/s of H100-SXM5-80GB"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("trainplan cluster derive"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
}

TEST_F(ClusterCli, HelpExplainsTheRule) {
  const Result r = run("cluster derive --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("memory-bound kernel times"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kernel floor (launch, host)   kept"), std::string::npos) << r.out;
}

}  // namespace
