// `trainplan calibrate --cpu` with tiny sizes: the topology it writes loads with parse_cluster and
// carries the measured figures. No figure's value is asserted (that would be a speed test).
#include "cli_fixture.hpp"
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "sim/check.hpp"
#include "sim/cluster.hpp"
#include "sim/json_reader.hpp"

namespace {

namespace fs = std::filesystem;

using trainplan::testing::Result;

class CalibrateCli : public trainplan::testing::CliTest {};

const std::string kTiny = " --sizes 16,32,64 --copy-mb 1 --warmup 1 --repeats 3";

TEST_F(CalibrateCli, CpuWritesALoadableTopology) {
  const fs::path file = dir_ / "cpu.json";
  Result r = run("calibrate --cpu" + kTiny + " --link-bytes 4096,65536 --out " + file.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const trainplan::Cluster c = trainplan::parse_cluster(trainplan::read_json_file(file), file.string());
  EXPECT_EQ(c.name, "cpu-local");
  EXPECT_EQ(c.gpus_per_node, 4);
  EXPECT_GT(c.gpu.peak_fp32, 0);
  EXPECT_EQ(c.gpu.peak_bf16, 0);
  ASSERT_EQ(c.ops.gemm.size(), 3u);  // the measured matmuls become the GEMM table (schema v2)
  EXPECT_DOUBLE_EQ(c.ops.gemm[0].m, 16);
  EXPECT_DOUBLE_EQ(c.ops.gemm[2].k, 64);
  EXPECT_EQ(c.ops.dtype, trainplan::Dtype::fp32);
  EXPECT_EQ(c.ops.attention.size(), 1u);
  EXPECT_GT(c.gpu.hbm_bandwidth, 0);
  EXPECT_GT(c.node.bandwidth, 0);
  EXPECT_TRUE(c.network.empty());
  EXPECT_NE(c.calibration.find("trainplan calibrate --cpu"), std::string::npos) << c.calibration;
  // The Gloo all-reduce between two local processes either ran or says why not.
  EXPECT_TRUE(c.node.name == "loopback-gloo" || c.source.find("NOT measured") != std::string::npos) << r.err;
}

TEST_F(CalibrateCli, WithoutLinkTestSaysSo) {
  Result r = run("calibrate --cpu" + kTiny + " --link-ranks 0 --ranks-per-node 2 --name my-box");
  ASSERT_EQ(r.code, 0) << r.err;
  const trainplan::Cluster c = trainplan::parse_cluster(nlohmann::json::parse(r.out), "stdout");
  EXPECT_EQ(c.name, "my-box");
  EXPECT_EQ(c.gpus_per_node, 2);
  EXPECT_EQ(c.node.name, "loopback-estimate");
  EXPECT_NE(c.source.find("NOT measured"), std::string::npos);
}

TEST_F(CalibrateCli, BaseKeepsTheFieldsNotMeasured) {
  Result r = run("calibrate --cpu" + kTiny + " --link-ranks 0 --base dgx-a100-80g");
  ASSERT_EQ(r.code, 0) << r.err;
  const trainplan::Cluster c = trainplan::parse_cluster(nlohmann::json::parse(r.out), "stdout");
  EXPECT_EQ(c.node.name, "nvlink3-nvswitch");          // not measured: the base's
  EXPECT_EQ(c.network.size(), 2u);                     // the base's tiers
  EXPECT_DOUBLE_EQ(c.price_per_gpu_hour, 1.8);
}

TEST_F(CalibrateCli, BadFlagsExitTwo) {
  Result r = run("calibrate --device tpu");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
  r = run("calibrate --device cuda");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--base is required"), std::string::npos) << r.err;
  r = run("calibrate --cpu --sizes 16,x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--sizes"), std::string::npos) << r.err;
  r = run("calibrate --cpu --base no-such-cluster");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no-such-cluster"), std::string::npos) << r.err;
}

}  // namespace
