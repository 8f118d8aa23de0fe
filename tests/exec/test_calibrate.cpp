// `trainplan calibrate --cpu` with tiny sizes: the topology it writes loads with parse_cluster,
// its op tables are the shapes asked for (the tiny-gpt layer's GEMMs, the attention points, the
// memory-bound kernels), and predict reads them. No figure's value is asserted (that would be a
// speed test); only how the written tables relate to what predict computes from them.
#include "cli_fixture.hpp"
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "sim/check.hpp"
#include "sim/cluster.hpp"
#include "sim/software.hpp"
#include "sim/json_reader.hpp"
#include "sim/op_costs.hpp"
#include "sim/op_time.hpp"

namespace {

namespace fs = std::filesystem;

using trainplan::testing::Result;

class CalibrateCli : public trainplan::testing::CliTest {};

// tiny-gpt: hidden 64, ffn 256, vocab 256, 4 heads of 16.
const std::string kTiny =
    " --model tiny-gpt --tokens 16,64 --sizes 16,32,64 --attn-seqs 32,64 --mem-mb 0.0625,0.25 --launches 200"
    " --copy-mb 1 --warmup 1 --repeats 3";

const trainplan::GemmMeasure* find_gemm(const trainplan::Cluster& c, double m, double n, double k) {
  for (const auto& g : c.ops.gemm) {
    if (g.m == m && g.n == n && g.k == k) return &g;
  }
  return nullptr;
}

TEST_F(CalibrateCli, CpuWritesALoadableTopology) {
  const fs::path file = dir_ / "cpu.json";
  Result r = run("calibrate --cpu" + kTiny + " --link-bytes 4096,65536 --out " + file.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const trainplan::Cluster c = trainplan::parse_cluster(trainplan::read_json_file(file), file.string());
  EXPECT_EQ(c.name, "cpu-local");
  EXPECT_EQ(c.gpus_per_node, 4);
  EXPECT_GT(c.gpu.peak_fp32, 0);
  EXPECT_EQ(c.gpu.peak_bf16, 0);
  // GEMM table: the tiny-gpt layer at tp 1 (QKV 64 -> 192, output 64 -> 64, MLP up 64 -> 256,
  // down 256 -> 64, LM head 64 -> 256) at 16 and 64 tokens, plus the squares 16^3, 32^3 (64^3 is
  // the output projection at 64 tokens).
  EXPECT_EQ(c.ops.dtype, trainplan::Dtype::fp32);
  for (double m : {16, 64}) {
    EXPECT_NE(find_gemm(c, m, 192, 64), nullptr) << "qkv at " << m;
    EXPECT_NE(find_gemm(c, m, 64, 64), nullptr) << "out_proj at " << m;
    EXPECT_NE(find_gemm(c, m, 256, 64), nullptr) << "mlp_up / lm_head at " << m;
    EXPECT_NE(find_gemm(c, m, 64, 256), nullptr) << "mlp_down at " << m;
  }
  EXPECT_NE(find_gemm(c, 16, 16, 16), nullptr);
  EXPECT_NE(find_gemm(c, 32, 32, 32), nullptr);
  EXPECT_EQ(c.ops.gemm.size(), 10u);
  // Attention: seq 32, 64 x head dims 64, 128 and the model's 16.
  ASSERT_EQ(c.ops.attention.size(), 6u);
  int model_dim = 0;
  for (const auto& a : c.ops.attention) {
    model_dim += a.head_dim == 16;
    EXPECT_TRUE(a.seq == 32 || a.seq == 64) << a.seq;
    EXPECT_GT(a.fwd_bwd, a.fwd);
  }
  EXPECT_EQ(model_dim, 2);
  // Every memory-bound family at both sizes (AdamW fused where this LibTorch has a CPU kernel).
  for (const char* k : {"layer_norm", "rms_norm", "gelu", "swiglu", "add", "cross_entropy_fp32", "adamw_foreach"}) {
    trainplan::MemKernel mk{};
    ASSERT_TRUE(trainplan::parse_mem_kernel(k, mk));
    EXPECT_EQ(c.ops.memory[static_cast<int>(mk)].size(), 2u) << k;
  }
  EXPECT_GT(c.ops.kernel_floor, 0);  // measured from back-to-back launches (wall clock on CPU)
  const std::string src = trainplan::read_json_file(file)["ops"]["source"].get<std::string>();
  EXPECT_NE(src.find("median of 3 after 1 warm-up(s), wall clock"), std::string::npos) << src;
  EXPECT_NE(src.find("tiny-gpt qkv tp1"), std::string::npos) << src;
  EXPECT_NE(src.find("200 back-to-back"), std::string::npos) << src;
  EXPECT_GT(c.gpu.hbm_bandwidth, 0);
  EXPECT_GT(c.node.bandwidth, 0);
  EXPECT_TRUE(c.network.empty());
  EXPECT_NE(c.calibration.find("trainplan calibrate --cpu"), std::string::npos) << c.calibration;
  // The host time per kernel (a software profile's host.per_kernel_us) is measured as a slope over
  // a chain of linears and reported with the fixed cost per backward() call, in the text and the file.
  EXPECT_NE(c.calibration.find("host time per kernel"), std::string::npos) << c.calibration;
  const auto at = r.err.find("host time per kernel: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const double per_kernel_us = std::stod(r.err.substr(at + std::string("host time per kernel: ").size()));
  EXPECT_GT(per_kernel_us, 0) << r.err;
  EXPECT_LT(per_kernel_us, 10000) << r.err;  // a CPU matmul of 32^2 with autograd: microseconds, not milliseconds
  EXPECT_NE(r.err.find("fixed cost per forward + backward() call: "), std::string::npos) << r.err;
  // The Gloo all-reduce between two local processes either ran or says why not.
  EXPECT_TRUE(c.node.name == "loopback-gloo" || c.source.find("NOT measured") != std::string::npos) << r.err;
}

// Predict reads the written tables: a measured GEMM's time is the table's lookup at that shape
// (op_costs' cleaning rule caps it by any measured shape at least as large in M, N and K), and
// `trainplan predict --cluster <file>` runs and slows down when the file's GEMMs are made slower.
TEST_F(CalibrateCli, PredictUsesTheMeasuredTables) {
  const fs::path file = dir_ / "cpu.json";
  Result r = run("calibrate --cpu" + kTiny + " --tp-sizes 1,2 --link-ranks 0 --out " + file.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const trainplan::Cluster c = trainplan::parse_cluster(trainplan::read_json_file(file), file.string());
  // tp 2 splits QKV's outputs (96) and MLP down's inputs (128).
  ASSERT_NE(find_gemm(c, 64, 96, 64), nullptr);
  ASSERT_NE(find_gemm(c, 64, 64, 128), nullptr);
  for (const auto& g : c.ops.gemm) {
    double expect = g.fwd;
    for (const auto& q : c.ops.gemm) {
      if (q.m >= g.m && q.n >= g.n && q.k >= g.k) expect = std::min(expect, q.fwd);
    }
    const double got = c.ops.gemm_time(g.m, g.n, g.k, trainplan::GemmPass::fwd);
    EXPECT_NEAR(got, expect, 1e-9 * expect) << g.m << "x" << g.n << "x" << g.k;
    // op_time's GEMM (what predict adds up) is that time, or the streaming floor of its operands.
    const double streamed = c.ops.stream(2.0 * (g.m * g.k + g.k * g.n + g.m * g.n));
    EXPECT_NEAR(trainplan::gemm_time(c, trainplan::Dtype::fp32, g.m, g.n, g.k, trainplan::GemmPass::fwd),
                std::max(got, streamed), 1e-9 * std::max(got, streamed));
  }
  const std::string plan = " --model tiny-gpt --dtype fp32 --gpus 1 --global-batch 4 --micro-batch 1 --seq 64";
  const fs::path pj = dir_ / "p.json", slow = dir_ / "slow.json", sj = dir_ / "ps.json";
  Result p = run("predict" + plan + " --cluster " + file.string() + " --json " + pj.string());
  ASSERT_EQ(p.code, 0) << p.err;
  nlohmann::json t = trainplan::read_json_file(file);
  for (auto& g : t["ops"]["gemm"]) {
    for (const char* key : {"fwd_us", "dgrad_us", "wgrad_us"}) g[key] = g[key].get<double>() * 10;
  }
  std::ofstream(slow) << t.dump(2);
  p = run("predict" + plan + " --cluster " + slow.string() + " --json " + sj.string());
  ASSERT_EQ(p.code, 0) << p.err;
  const double base = trainplan::read_json_file(pj)["time"]["compute_s"].get<double>();
  const double slower = trainplan::read_json_file(sj)["time"]["compute_s"].get<double>();
  EXPECT_GT(slower, base);
}

// --software-out writes the base software profile with host.per_kernel_us replaced by the measured
// host time per kernel; predict takes the file as --software.
TEST_F(CalibrateCli, SoftwareOutCarriesTheMeasuredHostTimePerKernel) {
  const fs::path topo = dir_ / "cpu.json", sw = dir_ / "sw.json";
  Result r = run("calibrate --cpu" + kTiny + " --link-ranks 0 --out " + topo.string() + " --software-base pytorch-eager" +
                 " --software-out " + sw.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto at = r.err.find("host time per kernel: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const double printed_us = std::stod(r.err.substr(at + std::string("host time per kernel: ").size()));
  const trainplan::Software s = trainplan::load_software(sw.string(), TRAINPLAN_SOURCE_DIR);
  EXPECT_NEAR(s.host_per_kernel, printed_us * 1e-6, 0.051e-6);
  EXPECT_EQ(s.name, "pytorch-eager-calibrated");
  // Everything but the host time, the name and the assumptions is the base's.
  nlohmann::json written = trainplan::read_json_file(sw), base = trainplan::read_json_file(
                                                                fs::path(TRAINPLAN_SOURCE_DIR) / "software/pytorch-eager.json");
  EXPECT_NE(written["assumptions"].get<std::string>().find("was 9.9 in pytorch-eager"), std::string::npos);
  for (auto* j : {&written, &base}) {
    j->erase("assumptions");
    j->erase("name");
    (*j)["host"].erase("per_kernel_us");
  }
  EXPECT_EQ(written, base);
  r = run("predict --model tiny-gpt --cluster " + topo.string() + " --gpus 1 --global-batch 8 --dtype fp32 --software " + sw.string());
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CalibrateCli, SoftwareBaseNeedsSoftwareOutAndAProfile) {
  Result r = run("calibrate --cpu --software-base megatron-core");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--software-base: needs --software-out"), std::string::npos) << r.err;
  r = run("calibrate --cpu --software-base no-such-stack --software-out " + (dir_ / "x.json").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--software-base no-such-stack: not a built-in software profile"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "x.json"));
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

// calibrate registers its files as every command does (cli/output.hpp CommandFiles): neither the
// topology nor the software profile is written into the built-in data folders that every later
// run reads, and no output is the same file as an input. Refused before anything is measured.
TEST_F(CalibrateCli, OutputsStayOutOfTheDataFoldersAndApartFromInputs) {
  const fs::path data = dir_ / "data";
  fs::create_directories(data / "topologies");
  fs::create_directories(data / "software");
  fs::copy_file(fs::path(TRAINPLAN_SOURCE_DIR) / "software/trainplan-exec.json", data / "software/trainplan-exec.json");
  const std::string calibrate = "TRAINPLAN_DATA_DIR='" + data.string() + "' '" + TRAINPLAN_BINARY +
                                "' calibrate --cpu --model none --sizes 16 --attn-seqs 32 --head-dims 16 --mem-mb 0.0625"
                                " --launches 10 --copy-mb 1 --warmup 0 --repeats 1 --link-ranks 0 ";
  for (const fs::path& out : {data / "topologies/mine.json", data / "software/mine.json"}) {
    const std::string flag = out.parent_path().filename() == "topologies" ? "--out " : "--software-out ";
    const auto r = trainplan::testing::run_shell(calibrate + flag + out.string() + " 2>&1");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(flag + out.string() + ": is in the built-in data folder"), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_FALSE(fs::exists(out));
  }
  EXPECT_TRUE(fs::is_empty(data / "topologies"));
  // An output that is an input (--base FILE --out FILE) would destroy it.
  const fs::path base = dir_ / "base.json";
  fs::copy_file(fs::path(TRAINPLAN_SOURCE_DIR) / "topologies/dgx-a100-80g.json", base);
  const auto r = trainplan::testing::run_shell(calibrate + "--base " + base.string() + " --out " + base.string() + " 2>&1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("is also an input file (--base"), std::string::npos) << r.output;
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
  r = run("calibrate --cpu --model no-such-model");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no-such-model"), std::string::npos) << r.err;
  r = run("calibrate --cpu --tp-sizes 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--tp-sizes"), std::string::npos) << r.err;
  r = run("calibrate --cpu --mem-mb -1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--mem-mb"), std::string::npos) << r.err;
  r = run("calibrate --cpu --base no-such-cluster");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no-such-cluster"), std::string::npos) << r.err;
}

}  // namespace
