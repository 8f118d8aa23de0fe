// Unit tests for sim/cluster: the shipped topologies, unit conversion at load, the removed
// efficiency keys, and every bad cluster file the loader must reject with a one-line message.
#include "sim/cluster.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <unistd.h>

#include "reports/calibration_report.hpp"
#include "sim/check.hpp"
#include "sim/json_reader.hpp"
#include "sim/op_time.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

using testing::Contains;
using testing::input_error;
using testing::StartsWith;

using nlohmann::json;
namespace fs = std::filesystem;

const fs::path kSource = TRAINPLAN_SOURCE_DIR;
const std::string kBad = std::string(TRAINPLAN_TEST_DATA_DIR) + "/bad/";

// ---- the shipped topologies -------------------------------------------------------------------

// cpu-local (trainplan calibrate --cpu: fp32 tables, no 16-bit peak) is the one CPU host shipped;
// every GPU cluster, measured or derived, states a bf16 peak and is none.
TEST(Topologies, OnlyCpuLocalIsACpuHost) {
  for (const std::string& name : builtin_clusters(kSource)) {
    EXPECT_EQ(is_cpu_host(load_cluster(name, kSource)), name == "cpu-local") << name;
  }
}

TEST(Topologies, EveryShippedFileLoadsAndIsNamedLikeItsFile) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(kSource / "topologies")) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    const Cluster c = load_cluster(e.path().string(), kSource);
    EXPECT_EQ(c.name, e.path().stem().string());
    EXPECT_GT(c.source.size(), 40u);       // cites its datasheets
    EXPECT_GT(c.calibration.size(), 40u);  // says what was measured, fitted or assumed
    if (!c.network.empty()) {  // GPU clusters; cpu-local describes one CPU host for exec runs
      EXPECT_GT(c.gpu.peak_bf16, 100e12);
      EXPECT_GT(c.gpu.hbm, 16e9);
      EXPECT_GE(c.max_gpus(), 1024);       // room for the published multi-node runs
    }
    EXPECT_GT(c.price_per_gpu_hour, 0);
    EXPECT_GT(c.power_per_gpu, 0);
    // Tables are measured on this very GPU, or derived by the rule (and say from what).
    EXPECT_TRUE(c.ops.measured_on.gpu == c.gpu.name || !c.ops.derivation.from.empty()) << c.name;
    for (const auto& t : c.network) EXPECT_EQ(t.span_gpus % c.gpus_per_node, 0);
    names.insert(c.name);
  }
  EXPECT_EQ(builtin_clusters(kSource), std::vector<std::string>(names.begin(), names.end()));
  for (const char* required : {"dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200", "dgx-b300",
                               "gb200-nvl72", "gb300-nvl72", "hgx-h800", "mi300x", "mi325x", "mi350x", "mi355x"}) {
    EXPECT_TRUE(names.count(required)) << "topologies/" << required << ".json is missing";
  }
}

TEST(Topologies, APcieBoxWithoutNvlinkShips) {
  bool found = false;
  for (const auto& name : builtin_clusters(kSource)) {
    const Cluster c = load_cluster(name, kSource);
    if (c.node.name.find("pcie") == std::string::npos) continue;
    found = true;
    EXPECT_EQ(c.node.name.find("nvlink"), std::string::npos);
    EXPECT_LT(c.node.bandwidth, 64e9) << name;  // PCIe Gen4/Gen5 x16, far below NVLink's 300-450 GB/s
  }
  EXPECT_TRUE(found);
}

TEST(Topologies, DgxA100_80gDatasheetFiguresConvertToSiUnits) {
  // Only datasheet figures here.
  const Cluster c = load_cluster("dgx-a100-80g", kSource);
  EXPECT_EQ(c.gpu.name, "A100-SXM4-80GB");
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::bf16), 312e12);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp16), 312e12);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp8), 0);  // A100 has no fp8 tensor cores
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp32), 19.5e12);
  EXPECT_DOUBLE_EQ(c.gpu.hbm, 84.99e9);  // 79.15 GiB, as CUDA reports the "80GB" part
  EXPECT_DOUBLE_EQ(c.gpu.hbm_bandwidth, 2039e9);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_EQ(c.node.span_gpus, 8);
  EXPECT_DOUBLE_EQ(c.node.bandwidth, 300e9);
  ASSERT_FALSE(c.network.empty());
  EXPECT_DOUBLE_EQ(c.network.front().bandwidth, 25e9);  // one HDR 200 Gb/s HCA per GPU
}

TEST(Topologies, DgxA100_40gDiffersFrom80gOnlyInMemory) {
  const Cluster a = load_cluster("dgx-a100-40g", kSource);
  const Cluster b = load_cluster("dgx-a100-80g", kSource);
  EXPECT_DOUBLE_EQ(a.gpu.hbm, 42.51e9);  // 39.59 GiB, as CUDA reports the "40GB" part
  EXPECT_DOUBLE_EQ(a.gpu.hbm_bandwidth, 1555e9);
  EXPECT_DOUBLE_EQ(a.gpu.peak_bf16, b.gpu.peak_bf16);
  EXPECT_DOUBLE_EQ(a.node.bandwidth, b.node.bandwidth);
  // dgx-a100-40g's calibration field says its link efficiencies, collective costs and runtime
  // overhead are dgx-a100-80g's: when the 80g file changes them, copy the new figures.
  const char* why = "dgx-a100-40g must carry dgx-a100-80g's priors (see its calibration field)";
  EXPECT_DOUBLE_EQ(a.collectives.call_overhead, b.collectives.call_overhead) << why;
  EXPECT_DOUBLE_EQ(a.collectives.overlap_slowdown, b.collectives.overlap_slowdown) << why;
  EXPECT_DOUBLE_EQ(a.node.efficiency, b.node.efficiency) << why;
  ASSERT_EQ(a.network.size(), b.network.size()) << why;
  for (std::size_t i = 0; i < a.network.size(); ++i) {
    EXPECT_DOUBLE_EQ(a.network[i].efficiency, b.network[i].efficiency) << why;
    EXPECT_DOUBLE_EQ(a.network[i].latency, b.network[i].latency) << why;
  }
  EXPECT_DOUBLE_EQ(a.runtime_overhead, b.runtime_overhead) << why;
}

TEST(Topologies, DgxH100EveryFieldInSiUnits) {
  const Cluster c = load_cluster("dgx-h100", kSource);
  EXPECT_EQ(c.gpu.name, "H100-SXM5-80GB");
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::bf16), 989.5e12);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp16), 989.5e12);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp8), 1979e12);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp32), 67e12);
  EXPECT_DOUBLE_EQ(c.gpu.hbm, 84.94e9);  // 79.11 GiB, as CUDA reports the "80GB" part
  EXPECT_DOUBLE_EQ(c.gpu.hbm_bandwidth, 3350e9);
  EXPECT_EQ(c.gpus_per_node, 8);
  EXPECT_DOUBLE_EQ(c.node.bandwidth, 450e9);  // 900 GB/s NVLink 4 is both directions together
  EXPECT_DOUBLE_EQ(c.node.latency, 3e-6);
  ASSERT_EQ(c.network.size(), 3u);
  for (const auto& t : c.network) EXPECT_DOUBLE_EQ(t.bandwidth, 50e9);  // one NDR 400 Gb/s HCA per GPU
  EXPECT_EQ(c.network[0].span_gpus, 256);
  EXPECT_EQ(c.max_gpus(), 16384);
  EXPECT_DOUBLE_EQ(c.runtime_overhead, 3e9);
  EXPECT_DOUBLE_EQ(c.power_per_gpu, 1275);
}

TEST(Topologies, DgxH200IsAnH100WithMoreAndFasterMemory) {
  const Cluster h100 = load_cluster("dgx-h100", kSource);
  const Cluster h200 = load_cluster("dgx-h200", kSource);
  EXPECT_DOUBLE_EQ(h200.gpu.hbm, 150.11e9);  // 139.80 GiB, as CUDA reports the "141GB" part
  EXPECT_DOUBLE_EQ(h200.gpu.hbm_bandwidth, 4800e9);
  EXPECT_DOUBLE_EQ(h200.gpu.peak_bf16, h100.gpu.peak_bf16);
  EXPECT_DOUBLE_EQ(h200.gpu.peak_fp8, h100.gpu.peak_fp8);
  EXPECT_DOUBLE_EQ(h200.node.bandwidth, h100.node.bandwidth);
  EXPECT_EQ(h200.max_gpus(), h100.max_gpus());
}

// ---- units and the removed keys, on a cluster written here -------------------------------------

json small_cluster() {
  return json::parse(R"({
    "schema": "trainplan/cluster/v2",
    "name": "toy", "source": "test", "calibration": "none",
    "gpu": {"name": "G", "peak_tflops": {"bf16": 100, "fp16": 50, "fp8": 0, "fp32": 10},
            "hbm_gb": 16, "hbm_bandwidth_gbps": 1000},
    "ops": {"source": "test", "dtype": "bf16", "kernel_floor_us": 5,
            "measured_on": {"gpu": "G", "peak_tflops": 100, "hbm_bandwidth_gbps": 1000},
            "gemm": [{"m": 1024, "n": 1024, "k": 1024, "fwd_us": 100, "dgrad_us": 100, "wgrad_us": 100}],
            "attention": [{"seq": 1024, "head_dim": 64, "batch_heads": 16, "fwd_us": 100, "fwd_bwd_us": 350}],
            "memory_bound": {"add": [{"bytes": 1000000, "fwd_us": 10, "fwd_bwd_us": 20}]}},
    "collectives": {"call_overhead_us": 12, "overlap_slowdown": 0.25, "source": "test"},
    "node": {"gpus": 4, "link": {"name": "pcie", "bandwidth_gbps": 20, "latency_us": 10, "efficiency": 0.5}},
    "network": [{"name": "eth", "span_gpus": 64, "bandwidth_gbps": 12.5, "latency_us": 20, "efficiency": 0.75}],
    "runtime_overhead_gb": 1.5, "price_per_gpu_hour_usd": 0.5, "power_per_gpu_w": 300})");
}

TEST(ParseCluster, ConvertsFileUnitsOnce) {
  const Cluster c = parse_cluster(small_cluster(), "toy.json");
  EXPECT_EQ(c.name, "toy");
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::bf16), 100e12);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp16), 50e12);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp8), 0);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp32), 10e12);
  EXPECT_DOUBLE_EQ(c.gpu.hbm, 16e9);
  EXPECT_DOUBLE_EQ(c.gpu.hbm_bandwidth, 1e12);
  EXPECT_EQ(c.gpus_per_node, 4);
  EXPECT_EQ(c.node.name, "pcie");
  EXPECT_EQ(c.node.span_gpus, 4);
  EXPECT_DOUBLE_EQ(c.node.bandwidth, 20e9);
  EXPECT_DOUBLE_EQ(c.node.latency, 10e-6);
  EXPECT_DOUBLE_EQ(c.node.efficiency, 0.5);
  ASSERT_EQ(c.network.size(), 1u);
  EXPECT_EQ(c.network[0].span_gpus, 64);
  EXPECT_DOUBLE_EQ(c.network[0].bandwidth, 12.5e9);
  EXPECT_DOUBLE_EQ(c.network[0].latency, 20e-6);
  EXPECT_DOUBLE_EQ(c.runtime_overhead, 1.5e9);
  EXPECT_DOUBLE_EQ(c.price_per_gpu_hour, 0.5);
  EXPECT_DOUBLE_EQ(c.power_per_gpu, 300);
  EXPECT_EQ(c.max_gpus(), 64);
  EXPECT_DOUBLE_EQ(c.ops.kernel_floor, 5e-6);
  EXPECT_DOUBLE_EQ(c.ops.gemm.at(0).fwd, 100e-6);
  EXPECT_DOUBLE_EQ(c.collectives.call_overhead, 12e-6);
  EXPECT_DOUBLE_EQ(c.collectives.overlap_slowdown, 0.25);
}

// The node's measured all-reduce curve: converted once, points ascending, none above the link,
// over the whole node, and only on nodes without in-switch reduction.
TEST(ParseCluster, MeasuredNodeAllReduceIsStrict) {
  json j = small_cluster();
  j["node"]["measured_all_reduce"] = {
      {"gpus", 4},
      {"points", {{{"bytes", 1000000}, {"busbw_gbps", 2}}, {{"bytes", 100000000}, {"busbw_gbps", 8}}}},
      {"source", "test"}};
  const Cluster c = parse_cluster(j, "toy.json");
  ASSERT_EQ(c.node_all_reduce.bytes.size(), 2u);
  EXPECT_DOUBLE_EQ(c.node_all_reduce.bus_bandwidth[1], 8e9);
  // Log-log between the points: at 1e7 B, halfway in log size, sqrt(2 x 8) = 4 GB/s; below the
  // first point the first point's time (bus bandwidth in proportion to size); above, the last.
  EXPECT_NEAR(c.node_all_reduce.at(1e7), 4e9, 1e-3);
  EXPECT_DOUBLE_EQ(c.node_all_reduce.at(5e5), 1e9);
  EXPECT_DOUBLE_EQ(c.node_all_reduce.at(1e10), 8e9);
  auto bad = [&](auto edit) {
    json b = j;
    edit(b["node"]["measured_all_reduce"]);
    return input_error([&] { parse_cluster(b, "toy.json"); });
  };
  EXPECT_EQ(bad([](json& m) { m["gpus"] = 8; }),
            "toy.json: node.measured_all_reduce.gpus = 8, must be node.gpus (4): the curve is an all-reduce over the whole node");
  EXPECT_EQ(bad([](json& m) { m["points"][1]["bytes"] = 1000000; }),
            "toy.json: node.measured_all_reduce.points[1].bytes = 1000000, must be larger than the point before");
  EXPECT_EQ(bad([](json& m) { m["points"][1]["busbw_gbps"] = 25; }),
            "toy.json: node.measured_all_reduce.points[1].busbw_gbps = 25, must be at most node.link.bandwidth_gbps (20)");
  EXPECT_TRUE(bad([](json& m) { m["points"].erase(1); }).ends_with("must hold at least 2 entries"));
  EXPECT_EQ(bad([](json& m) { m["points"][0]["time_us"] = 3; }),
            "toy.json: node.measured_all_reduce.points[0].time_us is not a known key");
  json nvls = j;
  nvls["node"]["in_switch_reduction"] = {{"efficiency", 0.6}, {"source", "test"}};
  EXPECT_TRUE(input_error([&] { parse_cluster(nvls, "toy.json"); }).ends_with("is for nodes without in_switch_reduction"));
}

TEST(ParseCluster, SchemaVersionIsChecked) {
  json j = small_cluster();
  j["schema"] = "trainplan/cluster/v1";
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: schema = \"trainplan/cluster/v1\", must be \"trainplan/cluster/v2\" (op cost tables per GPU; see "
            "topologies/*.json)");
  j.erase("schema");
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: schema is missing (required key)");
}

TEST(ParseCluster, OpTablesAreCheckedKeyByKey) {
  json j = small_cluster();
  j["ops"]["gemm"][0]["extra"] = 1;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: ops.gemm[0].extra is not a known key");
  j = small_cluster();
  j["ops"]["attention"][0]["fwd_bwd_us"] = 50;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: ops.attention[0].fwd_bwd_us = 50, must exceed fwd_us (it includes the forward)");
  j = small_cluster();
  j["ops"]["memory_bound"].erase("add");
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: ops.memory_bound.add is missing (required key)");
  j = small_cluster();
  j["ops"]["memory_bound"]["softmax"] = json::array();
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: ops.memory_bound.softmax is not a known key");
  j = small_cluster();
  j["ops"]["gemm"][0]["m"] = 0;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: ops.gemm[0].m = 0, must be in [1, 1e+09]");
}

TEST(ParseCluster, NoNetworkMeansOneNode) {
  json j = small_cluster();
  j["network"] = json::array();
  EXPECT_EQ(parse_cluster(j, "toy.json").max_gpus(), 4);
}

// gemm_efficiency, attention_efficiency and memory_efficiency were read by an earlier cost model;
// step times now come from the measured ops tables. A file that still sets one expects it to
// matter, so it is refused (exit 2 in the CLI), naming the field, rather than ignored.
TEST(ParseCluster, RemovedEfficiencyKeysAreRejected) {
  const std::pair<const char*, json> removed[] = {
      {"gemm_efficiency", json::parse(R"([{"flops": 1e9, "efficiency": 0.3}, {"flops": 1e11, "efficiency": 0.7}])")},
      {"attention_efficiency", 0.9},
      {"memory_efficiency", 0.5}};
  for (const auto& [key, value] : removed) {
    json j = small_cluster();
    j["gpu"][key] = value;
    EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
              std::string("toy.json: gpu.") + key +
                  " was removed: step times come from the measured ops tables; delete the key");
  }
  // Only under "gpu": elsewhere such a key is an unknown key like any other.
  json j = small_cluster();
  j["memory_efficiency"] = 0.5;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: memory_efficiency is not a known key");
}

TEST(Topologies, NoShippedFileCarriesARemovedKey) {
  for (const auto& e : fs::directory_iterator(kSource / "topologies")) {
    if (e.path().extension() != ".json") continue;
    const json j = read_json_file(e.path());
    for (const char* key : {"gemm_efficiency", "attention_efficiency", "memory_efficiency"}) {
      EXPECT_FALSE(j.at("gpu").contains(key)) << e.path() << ": gpu." << key;
    }
    EXPECT_NO_THROW(load_cluster(e.path().string(), kSource)) << e.path();
  }
}

// ---- derived op tables and the measured-GPU check ----------------------------------------------

// dgx-h100.json as a user would copy it, with `edit` applied.
json h100_copy() { return read_json_file(kSource / "topologies" / "dgx-h100.json"); }

// The trap: a copy of dgx-h100.json given a B200's peak would keep H100's step time (its tables are
// H100's) under twice the peak, halving MFU without a word. It is refused, naming the rule.
TEST(MeasuredGpu, ACopyWithAnotherGpusPeakOrBandwidthIsRefused) {
  json j = h100_copy();
  j["gpu"]["peak_tflops"]["bf16"] = 2250;
  const std::string msg = input_error([&] { parse_cluster(j, "my-b200.json", kSource); });
  EXPECT_TRUE(StartsWith(msg, "my-b200.json: gpu.peak_tflops.bf16 = 2250 differs from the 989.5 TFLOP/s of "
                              "H100-SXM5-80GB, the GPU its ops tables were measured on, by more than 10%: derive the "
                              "tables for this GPU"))
      << msg;
  EXPECT_TRUE(Contains(msg, "trainplan cluster derive")) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  j = h100_copy();
  j["gpu"]["hbm_bandwidth_gbps"] = 8000;
  EXPECT_TRUE(StartsWith(input_error([&] { parse_cluster(j, "x.json", kSource); }),
                         "x.json: gpu.hbm_bandwidth_gbps = 8000 differs from the 3350 GB/s of H100-SXM5-80GB"));
  // Within 10% (a clock or SKU variant) the measured tables stand.
  j = h100_copy();
  j["gpu"]["peak_tflops"]["bf16"] = 989.5 * 1.09;
  j["gpu"]["hbm_bandwidth_gbps"] = 3350 * 0.91;
  EXPECT_NO_THROW(parse_cluster(j, "x.json", kSource));
}

// The same copy, its tables derived instead: GEMM and attention at the B200/H100 peak ratio,
// memory-bound kernels at the bandwidth ratio, the kernel floor kept.
TEST(DerivedOps, FromABuiltinClusterByThePeakAndBandwidthRatios) {
  json j = h100_copy();
  j["gpu"].erase("sm_count");  // no SM count: every GEMM keeps its own shape
  j["gpu"]["peak_tflops"]["bf16"] = 2250;
  j["gpu"]["hbm_bandwidth_gbps"] = 8000;
  j["ops"] = {{"source", "derived for a test"}, {"derive", {{"from", "dgx-h100"}}}};
  const Cluster b = parse_cluster(j, "my-b200.json", kSource);
  const Cluster h = load_cluster("dgx-h100", kSource);
  EXPECT_EQ(b.ops.derivation.from, "dgx-h100");
  EXPECT_DOUBLE_EQ(b.ops.derivation.gemm_ratio, 2250 / 989.5);
  EXPECT_DOUBLE_EQ(b.ops.derivation.attention_bwd_ratio, 2250 / 989.5);
  EXPECT_DOUBLE_EQ(b.ops.derivation.memory_ratio, 8000.0 / 3350);
  EXPECT_NEAR(b.ops.gemm_time(8192, 4096, 4096, GemmPass::fwd),
              h.ops.gemm_time(8192, 4096, 4096, GemmPass::fwd) * 989.5 / 2250, 1e-12);
  EXPECT_NEAR(b.ops.attention_bwd(4096, 128, 64), h.ops.attention_bwd(4096, 128, 64) * 989.5 / 2250, 1e-12);
  EXPECT_NEAR(b.ops.memory_fwd(MemKernel::rms_norm, 1e8), h.ops.memory_fwd(MemKernel::rms_norm, 1e8) * 3350 / 8000,
              1e-12);
  EXPECT_DOUBLE_EQ(b.ops.kernel_floor, h.ops.kernel_floor);
  EXPECT_DOUBLE_EQ(b.ops.misaligned_gemm_slowdown, h.ops.misaligned_gemm_slowdown);
  EXPECT_TRUE(b.ops.attention_kernels.empty());  // H100's flash2 table is not a B200 fact
  // A file may restate the one kept fitted figure for its GPU (A100 and L40S assume none).
  j["ops"]["derive"]["misaligned_gemm_slowdown"] = 1;
  EXPECT_DOUBLE_EQ(parse_cluster(j, "my-b200.json", kSource).ops.misaligned_gemm_slowdown, 1);
  EXPECT_DOUBLE_EQ(load_cluster("dgx-a100-80g", kSource).ops.misaligned_gemm_slowdown, 1);
  j["ops"]["derive"]["misaligned_gemm_slowdown"] = 0.5;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "my-b200.json", kSource); }),
            "my-b200.json: ops.derive.misaligned_gemm_slowdown = 0.5, must be in [1, 100]");
}

// A B200-like copy (2250 TFLOP/s bf16, 4500 fp8) derived from dgx-h100 under both rules, by hand.
// dgx-h100 measured the 8192^3 bf16 GEMM forward in 1433.0 us (767.3 TFLOP/s):
//   peak rule (no figure): 1433.0 x 989.5 / 2250 = 630.2 us;
//   a published 1420 TFLOP/s at 8192^3 on this GPU: that GEMM takes 2 x 8192^3 / 1420e12 = 774.3 us,
//   every other GEMM the H100 time / (1420 / 767.3) = / 1.851, attention the peak rule still;
//   an fp8 figure of 2556 TFLOP/s at 8192^3 beside it: fp8 GEMMs 2556 / 1420 = 1.8x the bf16 rate
//   (the reduction dimension shortened by 1.8 instead of the peaks' 2).
TEST(DerivedOps, AGemmOnB200FromItsH100FigureUnderBothRules) {
  const Cluster h = load_cluster("dgx-h100", kSource);
  json j = h100_copy();
  j["gpu"].erase("sm_count");  // no SM count: every GEMM keeps its own shape
  j["gpu"]["peak_tflops"]["bf16"] = 2250;
  j["gpu"]["peak_tflops"]["fp8"] = 4500;
  j["gpu"]["hbm_bandwidth_gbps"] = 7680;
  j["ops"] = {{"source", "derived for a test"}, {"derive", {{"from", "dgx-h100"}}}};
  const Cluster peak = parse_cluster(j, "b.json", kSource);
  EXPECT_NEAR(peak.ops.gemm_time(8192, 8192, 8192, GemmPass::fwd), 1433.0e-6 * 989.5 / 2250, 1e-10);
  EXPECT_FALSE(peak.ops.derivation.gemm_achieved);

  auto figure = [](const char* dtype, double tflops) {
    return json{{"kernel", "gemm"}, {"dtype", dtype}, {"m", 8192}, {"n", 8192}, {"k", 8192}, {"tflops", tflops},
                {"source", "a test"}};
  };
  j["ops"]["derive"]["achieved"] = json::array({figure("bf16", 1420), figure("fp8", 2556)});
  const Cluster b = parse_cluster(j, "b.json", kSource);
  EXPECT_TRUE(b.ops.derivation.gemm_achieved);
  EXPECT_NEAR(b.ops.derivation.gemm_ratio, 1420 / 767.3, 1e-3);
  EXPECT_NEAR(b.ops.gemm_time(8192, 8192, 8192, GemmPass::fwd), 774.3e-6, 0.05e-6);
  EXPECT_NEAR(b.ops.gemm_time(4096, 4096, 4096, GemmPass::wgrad) * b.ops.derivation.gemm_ratio,
              h.ops.gemm_time(4096, 4096, 4096, GemmPass::wgrad), 1e-12);
  EXPECT_DOUBLE_EQ(b.ops.derivation.attention_fwd_ratio, 2250 / 989.5);
  EXPECT_FALSE(b.ops.derivation.attention_fwd_achieved);
  EXPECT_NEAR(b.ops.derivation.fp8_speedup, 1.8, 1e-12);
  // The fp8 GEMM: the bf16 table at K / 1.8 (op_time.cpp), under the peaks K / 2.
  EXPECT_NEAR(gemm_time(b, Dtype::fp8, 8192, 8192, 8192, GemmPass::fwd),
              b.ops.gemm_time(8192, 8192, 8192 / 1.8, GemmPass::fwd), 1e-12);
  EXPECT_NEAR(gemm_time(peak, Dtype::fp8, 8192, 8192, 8192, GemmPass::fwd),
              peak.ops.gemm_time(8192, 8192, 4096, GemmPass::fwd), 1e-12);
}

// With both SM counts a GEMM runs at the measured efficiency of the shape that gives the measured
// GPU as many output tiles per SM and as long a k-loop per tile, by hand:
//   half the SMs at the same peak per SM (b/2 SMs, peak / 2): m x 2, k x 1; the GEMM (2048, 4096,
//     4096) then takes H100's efficiency at (4096, 4096, 4096) at half H100's rate;
//   B200 (148 SMs, 2250 TFLOP/s bf16): m x 132 / 148 = 0.892, k x (989.5 / 132) / (2250 / 148)
//     = 7.496 / 15.20 = 0.4931: its faster SMs finish a k-loop in half an H100's time;
//   A100 (108 SMs, 312): m x 1.222, k x 7.496 / 2.889 = 2.595.
TEST(DerivedOps, AGemmTakesTheMeasuredEfficiencyOfTheShapeWithTheSameTilesPerSmAndKLoop) {
  const Cluster h = load_cluster("dgx-h100", kSource);
  auto derive = [](double peak, int sms) {
    json j = h100_copy();
    j["gpu"]["peak_tflops"]["bf16"] = peak;
    j["gpu"]["sm_count"] = sms;
    j["ops"] = {{"source", "derived for a test"}, {"derive", {{"from", "dgx-h100"}}}};
    return parse_cluster(j, "d.json", kSource);
  };
  auto rate = [](const Cluster& c, double m, double n, double k) {
    return 2 * m * n * k / c.ops.gemm_time(m, n, k, GemmPass::fwd);
  };
  const Cluster half = derive(989.5 / 2, 66);
  EXPECT_DOUBLE_EQ(half.ops.derivation.gemm_m_scale, 2);
  EXPECT_DOUBLE_EQ(half.ops.derivation.gemm_k_scale, 1);
  EXPECT_NEAR(rate(half, 2048, 4096, 4096), rate(h, 4096, 4096, 4096) / 2, 1e-6 * rate(h, 4096, 4096, 4096));

  const Cluster b = derive(2250, 148);
  EXPECT_NEAR(b.ops.derivation.gemm_m_scale, 0.8919, 1e-4);
  EXPECT_NEAR(b.ops.derivation.gemm_k_scale, 0.4931, 1e-4);
  const double m = 8192, n = 8192, k = 8192;
  EXPECT_NEAR(rate(b, m, n, k), rate(h, m * 0.89189, n, k * 0.49313) * 2250 / 989.5, 1e-3 * rate(b, m, n, k));
  const Cluster a = derive(312, 108);
  EXPECT_NEAR(a.ops.derivation.gemm_m_scale, 1.2222, 1e-4);
  EXPECT_NEAR(a.ops.derivation.gemm_k_scale, 2.5948, 1e-4);
  // A 2048-token GEMM of a 13B model at tp 2 (hidden 5120) loses less of the best rate on the
  // A100 than on the H100: the A100's slower SMs keep busy on shorter shapes.
  auto efficiency = [&](const Cluster& c, double peak) { return rate(c, 2048, 7680, 5120) / peak; };
  EXPECT_GT(efficiency(a, 312e12), efficiency(h, 989.5e12));
  EXPECT_LT(efficiency(b, 2250e12), efficiency(h, 989.5e12));
}

// The shipped Blackwell and AMD files scale GEMMs by their published best matmul rates over
// dgx-h100's best measured GEMM rate, and fp8 by its best rate over bf16's; attention keeps the peak
// ratio; GB300 states no figure and keeps the peak ratio. dgx-h100 and dgx-h200 are unchanged.
// The Blackwell files give MXFP8 the FP8 speed-up x 0.953 (ops.derive.format_ratios: NVIDIA's
// MXFP8/FP8 GEMM rate on B300), by hand 3432.5 / 1745 x 0.953 = 1.8746 on B200; AMD has no MXFP8.
TEST(DerivedOps, ShippedFilesScaleGemmsByPublishedAchievedRates) {
  const Cluster h = load_cluster("dgx-h100", kSource);
  EXPECT_NEAR(h.ops.best_gemm_rate(), 788.9e12, 0.05e12);
  const std::vector<std::tuple<const char*, double, double>> files = {
      {"dgx-b200", 1745.0, 3432.5}, {"gb200-nvl72", 1822.0, 3615.6}, {"dgx-b300", 1769.0, 3353.3},
      {"mi300x", 668.4, 0}, {"mi325x", 784.9, 0}, {"mi350x", 1434.6, 0}, {"mi355x", 1565.0, 0}};
  for (const auto& [name, bf16, fp8] : files) {
    const Cluster c = load_cluster(name, kSource);
    const OpDerivation& d = c.ops.derivation;
    EXPECT_TRUE(d.gemm_achieved) << name;
    EXPECT_NEAR(d.gemm_ratio, bf16 * 1e12 / h.ops.best_gemm_rate(), 1e-9) << name;
    EXPECT_LT(d.gemm_ratio, c.gpu.peak_bf16 / h.gpu.peak_bf16) << name;  // every one below its peak ratio
    EXPECT_DOUBLE_EQ(d.attention_fwd_ratio, c.gpu.peak_bf16 / h.gpu.peak_bf16) << name;
    EXPECT_NEAR(d.fp8_speedup, fp8 / bf16, 1e-12) << name;
    EXPECT_NEAR(d.mxfp8_speedup, fp8 > 0 ? fp8 / bf16 * 0.953 : 0, 1e-12) << name;
  }
  EXPECT_NEAR(load_cluster("dgx-b200", kSource).ops.derivation.mxfp8_speedup, 1.8746, 1e-4);
  const Cluster gb300 = load_cluster("gb300-nvl72", kSource);
  EXPECT_FALSE(gb300.ops.derivation.gemm_achieved);
  EXPECT_DOUBLE_EQ(gb300.ops.derivation.gemm_ratio, 2500 / 989.5);
  EXPECT_TRUE(h.ops.derivation.from.empty());
  EXPECT_FALSE(load_cluster("dgx-h200", kSource).ops.derivation.gemm_achieved);
}

// Each malformed figure is refused with one line naming the field and the rule.
TEST(DerivedOps, BadAchievedFiguresAreRefusedByName) {
  json j = h100_copy();
  j["gpu"]["peak_tflops"]["bf16"] = 2250;
  j["gpu"]["peak_tflops"]["fp8"] = 4500;
  const json good = {{"kernel", "gemm"}, {"dtype", "bf16"}, {"best", true}, {"tflops", 1745}, {"source", "s"}};
  auto refused = [&](const json& figure) {
    j["ops"] = {{"source", "s"}, {"derive", {{"from", "dgx-h100"}, {"achieved", json::array({figure})}}}};
    const std::string msg = input_error([&] { parse_cluster(j, "x.json", kSource); });
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  };
  json f = good;
  f["kernel"] = "softmax";
  EXPECT_TRUE(StartsWith(refused(f), "x.json: ops.derive.achieved[0].kernel = \"softmax\", must be one of"));
  f = good;
  f["tflops"] = 2300;
  EXPECT_EQ(refused(f), "x.json: ops.derive.achieved[0].tflops = 2300, exceeds gpu.peak_tflops.bf16 (2250): an achieved "
                        "rate is at most the datasheet peak");
  f = good;
  f["tflops"] = 0;
  EXPECT_TRUE(StartsWith(refused(f), "x.json: ops.derive.achieved[0].tflops = 0, must be in"));
  f = good;
  f["m"] = 8192;
  EXPECT_EQ(refused(f), "x.json: ops.derive.achieved[0].best = true, and a shape m, n, k: a figure is the best over "
                        "shapes or at one shape");
  f = good;
  f.erase("best");
  EXPECT_EQ(refused(f), "x.json: ops.derive.achieved[0].m is missing: give the shape m, n, k or \"best\": true");
  f = good;
  f["dtype"] = "fp8";  // an fp8 figure alone: no bf16 figure of the same reference to be a speed-up over
  EXPECT_EQ(refused(f), "x.json: ops.derive.achieved[0].dtype = \"fp8\", needs a bf16 figure of the same reference "
                        "(the same shape, or both best) to give the format's speed-up");
  f["dtype"] = "mxfp8";  // this GPU has no mxfp8 peak
  EXPECT_EQ(refused(f), "x.json: ops.derive.achieved[0].tflops = 1745, gpu.peak_tflops.mxfp8 is 0: a mxfp8 rate needs "
                        "the GPU's mxfp8 peak");
  f = good;
  f["source"] = "";
  EXPECT_EQ(refused(f), "x.json: ops.derive.achieved[0].source = \"\", must not be empty");
  f = good;
  f["clock"] = 1.9;
  EXPECT_EQ(refused(f), "x.json: ops.derive.achieved[0].clock is not a known key");
  f = {{"kernel", "attention_fwd"}, {"seq", 8192}, {"head_dim", 128}, {"dtype", "bf16"}, {"tflops", 1000}, {"source", "s"}};
  EXPECT_EQ(refused(f), "x.json: ops.derive.achieved[0].dtype is not a known key");
  j["ops"]["derive"]["achieved"] = json::array();
  EXPECT_TRUE(StartsWith(input_error([&] { parse_cluster(j, "x.json", kSource); }), "x.json: ops.derive.achieved"));
}

// A format ratio: scales the other format's achieved figure where the file has one, else its
// datasheet peak ratio; bad ones are refused by name; a format with its own figure keeps it (the
// ratio fills only a format without one).
TEST(DerivedOps, FormatRatiosScaleAnotherFormatsSpeedUp) {
  json j = h100_copy();
  j["gpu"]["peak_tflops"]["bf16"] = 2250;
  j["gpu"]["peak_tflops"]["fp8"] = 4500;
  j["gpu"]["peak_tflops"]["mxfp8"] = 4500;
  const json bf16 = {{"kernel", "gemm"}, {"dtype", "bf16"}, {"best", true}, {"tflops", 1800}, {"source", "s"}};
  json fp8 = bf16;
  fp8["dtype"] = "fp8";
  fp8["tflops"] = 3600;
  const json ratio = {{"format", "mxfp8"}, {"over", "fp8"}, {"ratio", 0.9}, {"source", "s"}};
  auto with = [&](const json& achieved, const json& r) {
    j["ops"] = {{"source", "s"}, {"derive", {{"from", "dgx-h100"}, {"achieved", achieved}, {"format_ratios", json::array({r})}}}};
  };
  with(json::array({bf16, fp8}), ratio);
  EXPECT_NEAR(parse_cluster(j, "x.json", kSource).ops.derivation.mxfp8_speedup, 2.0 * 0.9, 1e-12);
  json mx = bf16;
  mx["dtype"] = "mxfp8";
  mx["tflops"] = 3000;
  with(json::array({bf16, fp8, mx}), ratio);
  EXPECT_NEAR(parse_cluster(j, "x.json", kSource).ops.derivation.mxfp8_speedup, 3000.0 / 1800, 1e-12);
  auto refused = [&](const json& achieved, const json& r) {
    with(achieved, r);
    return input_error([&] { parse_cluster(j, "x.json", kSource); });
  };
  // Without an fp8 figure the ratio scales fp8's datasheet peak ratio (4500 / 2250).
  with(json::array({bf16}), ratio);
  EXPECT_NEAR(parse_cluster(j, "x.json", kSource).ops.derivation.mxfp8_speedup, 2.0 * 0.9, 1e-12);
  // nvfp4 over mxfp8: mxfp8's own ratio must come first (else refused by name).
  j["gpu"]["peak_tflops"]["nvfp4"] = 9000;
  json fp4 = {{"format", "nvfp4"}, {"over", "mxfp8"}, {"ratio", 1.9}, {"source", "s"}};
  j["ops"] = {{"source", "s"},
              {"derive", {{"from", "dgx-h100"}, {"achieved", json::array({bf16, fp8})}, {"format_ratios", {ratio, fp4}}}}};
  EXPECT_NEAR(parse_cluster(j, "x.json", kSource).ops.derivation.nvfp4_speedup, 2.0 * 0.9 * 1.9, 1e-12);
  EXPECT_EQ(refused(json::array({bf16, fp8}), fp4),
            "x.json: ops.derive.format_ratios[0].over = \"mxfp8\", needs an ops.derive.achieved mxfp8 GEMM figure or "
            "mxfp8's own ratio listed before this one");
  j["gpu"]["peak_tflops"].erase("nvfp4");
  json r = ratio;
  r["ratio"] = 0;
  EXPECT_TRUE(StartsWith(refused(json::array({bf16, fp8}), r), "x.json: ops.derive.format_ratios[0].ratio = 0, must be in"));
  r = ratio;
  r["over"] = "mxfp8";
  EXPECT_EQ(refused(json::array({bf16, fp8}), r),
            "x.json: ops.derive.format_ratios[0].over = \"mxfp8\", must name another format than \"format\"");
  r = ratio;
  r["format"] = "nvfp4";  // no nvfp4 peak on this GPU
  EXPECT_EQ(refused(json::array({bf16, fp8}), r),
            "x.json: ops.derive.format_ratios[0].format = \"nvfp4\", gpu.peak_tflops.nvfp4 is 0: the GPU has no such "
            "arithmetic");
  r = ratio;
  r["source"] = "";
  EXPECT_EQ(refused(json::array({bf16, fp8}), r), "x.json: ops.derive.format_ratios[0].source = \"\", must not be empty");
}

// dgx-h200 is derived by the same rule: H100's compute (unchanged times), H200's bandwidth.
TEST(DerivedOps, DgxH200IsDgxH100ByTheRule) {
  const Cluster h = load_cluster("dgx-h100", kSource);
  const Cluster h200 = load_cluster("dgx-h200", kSource);
  EXPECT_EQ(h200.ops.derivation.from, "dgx-h100");
  EXPECT_DOUBLE_EQ(h200.ops.derivation.gemm_ratio, 1);
  EXPECT_DOUBLE_EQ(h200.ops.gemm_time(8192, 8192, 8192, GemmPass::wgrad), h.ops.gemm_time(8192, 8192, 8192, GemmPass::wgrad));
  EXPECT_NEAR(h200.ops.memory_bwd(MemKernel::add, 1e8), h.ops.memory_bwd(MemKernel::add, 1e8) * 3350 / 4800, 1e-12);
  EXPECT_EQ(h200.ops.attention_kernels.size(), h.ops.attention_kernels.size());  // same SM: kept
}

TEST(DerivedOps, BadDerivationsAreRefusedByName) {
  json j = h100_copy();
  j["ops"] = {{"source", "s"}, {"derive", {{"from", "dgx-z9000"}}}};
  EXPECT_TRUE(StartsWith(input_error([&] { parse_cluster(j, "x.json", kSource); }),
                         "x.json: ops.derive.from = \"dgx-z9000\", must be a built-in cluster (one of: "));
  j["ops"]["derive"]["from"] = "dgx-h200";  // itself derived: one level only, so no chains or cycles
  EXPECT_EQ(input_error([&] { parse_cluster(j, "x.json", kSource); }),
            "x.json: ops.derive.from = dgx-h200: " + (kSource / "topologies" / "dgx-h200.json").string() +
                ": ops.derive: the tables a cluster derives from must be measured ones, not derived themselves; "
                "derive from the measured cluster");
  j["ops"]["derive"]["from"] = "dgx-h100";
  j["ops"]["derive"]["scale"] = 2;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "x.json", kSource); }), "x.json: ops.derive.scale is not a known key");
  j["ops"]["derive"].erase("scale");
  j["ops"]["gemm"] = json::array();
  EXPECT_EQ(input_error([&] { parse_cluster(j, "x.json", kSource); }), "x.json: ops.gemm is not a known key");
  j = h100_copy();
  j["ops"] = {{"source", "s"}, {"derive", {{"from", "dgx-h100"}}}};
  j["gpu"]["peak_tflops"]["bf16"] = 0;
  EXPECT_TRUE(StartsWith(input_error([&] { parse_cluster(j, "x.json", kSource); }),
                         "x.json: gpu.peak_tflops.bf16 = 0: the tables of dgx-h100 were measured in bf16"));
}

// A derived file may name a cluster file; a relative path is taken from the deriving file's folder.
TEST(DerivedOps, FromAFileBesideTheDerivingOne) {
  const fs::path dir = fs::temp_directory_path() / ("trainplan_derive_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kSource / "topologies" / "dgx-h100.json", dir / "measured.json", fs::copy_options::overwrite_existing);
  json j = h100_copy();
  j["gpu"]["hbm_bandwidth_gbps"] = 6700;
  j["ops"] = {{"source", "s"}, {"derive", {{"from", "measured.json"}}}};
  const Cluster c = parse_cluster(j, (dir / "derived.json").string(), kSource);
  EXPECT_DOUBLE_EQ(c.ops.derivation.memory_ratio, 2);
  fs::remove_all(dir);
}

// ---- scale-up domains, in-switch reduction, full-mesh nodes -------------------------------------

TEST(Topologies, Nvl72RacksAreOneNvlinkDomainOfFourGpuTrays) {
  for (const char* name : {"gb200-nvl72", "gb300-nvl72"}) {
    const Cluster c = load_cluster(name, kSource);
    EXPECT_EQ(c.gpus_per_node, 4) << name;
    EXPECT_EQ(c.scale_up_gpus, 72) << name;
    EXPECT_DOUBLE_EQ(c.node.bandwidth, 900e9) << name;  // NVLink 5: 1.8 TB/s both directions together
    EXPECT_DOUBLE_EQ(c.in_switch_reduction.efficiency, 0.6) << name;
    for (const auto& t : c.network) EXPECT_EQ(t.span_gpus % 72, 0) << name;
  }
  const Cluster b = load_cluster("dgx-b200", kSource);
  EXPECT_EQ(b.scale_up_gpus, b.gpus_per_node);  // the NVLink domain ends at the node
  EXPECT_DOUBLE_EQ(b.gpu.peak_nvfp4, 9000e12);
  EXPECT_DOUBLE_EQ(b.gpu.peak_mxfp8, b.gpu.peak_fp8);
  const Cluster h = load_cluster("dgx-h100", kSource);
  EXPECT_EQ(h.gpu.peak_mxfp8, 0);  // Hopper has no block-scaled tensor-core formats
  EXPECT_EQ(h.gpu.peak_nvfp4, 0);
  const Cluster amd = load_cluster("mi300x", kSource);
  EXPECT_DOUBLE_EQ(amd.peer_link_bandwidth, 64e9);
  EXPECT_DOUBLE_EQ(amd.node.bandwidth, 7 * 64e9);
}

TEST(ParseCluster, ScaleUpDomainIsWholeNodesAndTiersSpanWholeDomains) {
  json j = small_cluster();  // 4 GPUs per node, one 64-GPU tier
  j["node"]["scale_up_gpus"] = 32;
  const Cluster c = parse_cluster(j, "toy.json");
  EXPECT_EQ(c.scale_up_gpus, 32);
  EXPECT_EQ(c.max_gpus(), 64);
  j["node"]["scale_up_gpus"] = 6;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: node.scale_up_gpus = 6, must be a multiple of node.gpus (4): a domain of whole nodes");
  j["node"]["scale_up_gpus"] = 2;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: node.scale_up_gpus = 2, must be in [4, 65536]");
  j["node"]["scale_up_gpus"] = 24;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: network[0].span_gpus = 64, must be a multiple of node.scale_up_gpus (24)");
  j["node"]["scale_up_gpus"] = 128;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: network[0].span_gpus = 64, must be at least node.scale_up_gpus (128)");
  j.erase("network");
  j["network"] = json::array();
  EXPECT_EQ(parse_cluster(j, "toy.json").max_gpus(), 128);  // one domain, no scale-out
}

TEST(ParseCluster, InSwitchReductionAndPeerLinksAreChecked) {
  json j = small_cluster();
  j["node"]["in_switch_reduction"] = {{"efficiency", 0.6}, {"source", "test"}};
  j["node"]["peer_link_gbps"] = 5;
  const Cluster c = parse_cluster(j, "toy.json");
  EXPECT_DOUBLE_EQ(c.in_switch_reduction.efficiency, 0.6);
  EXPECT_DOUBLE_EQ(c.peer_link_bandwidth, 5e9);
  j["node"]["in_switch_reduction"]["efficiency"] = 1.5;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: node.in_switch_reduction.efficiency = 1.5, must be in [0.001, 1]");
  j["node"]["in_switch_reduction"] = {{"efficiency", 0.6}};
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: node.in_switch_reduction.source is missing (required key)");
  j["node"].erase("in_switch_reduction");
  j["node"]["peer_link_gbps"] = 25;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: node.peer_link_gbps = 25, must be at most node.link.bandwidth_gbps (20): one peer's link is a "
            "part of the GPU's node bandwidth");
  j["node"].erase("peer_link_gbps");
  j["gpu"]["peak_tflops"]["nvfp4"] = 1e-9;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: gpu.peak_tflops.nvfp4 = 1e-09, must be 0 (not supported) or in [0.001, 1e+06]");
}

// ---- `trainplan calibrate`'s topology file (reports/calibration_report.cpp) -------------------

// One point per table, as a device would have measured it.
CalibrationResult measured_device(const std::string& dtype) {
  CalibrationResult r;
  r.device_name = "Test device";
  r.dtype = dtype;
  r.threads = 1;
  GemmPoint g;
  g.m = g.n = g.k = 1024;
  g.flops = 2.0 * 1024 * 1024 * 1024;
  g.median = g.dgrad = g.wgrad = 100e-6;
  g.rate = g.flops / g.median;
  g.label = "square";
  r.gemm = {g};
  r.best_gemm_rate = g.rate;
  r.copy_bandwidth = 1e12;
  r.attention = {{1024, 64, 16, 100e-6, 350e-6}};
  r.attention_flops = 1e9;
  r.attention_rate = 1e13;
  r.memory = {{"add", 1e6, 10e-6, 20e-6}};
  r.kernel_floor = 5e-6;
  r.kernel_floor_launches = 2000;
  r.misaligned_gemm_slowdown = 1.5;
  r.misaligned_m = r.misaligned_n = r.misaligned_k = 256;
  r.timing = "test";
  r.warmup = 1;
  r.repeats = 3;
  r.torch_version = "test";
  r.link.note = "not measured (test)";
  return r;
}

TEST(CalibratedTopology, WritesNoRemovedKeyAndLoads) {
  for (const bool cuda : {true, false}) {
    SCOPED_TRACE(cuda ? "cuda" : "cpu");
    TopologyInputs in;
    in.name = "calibrated";
    in.command = "trainplan calibrate (test)";
    in.device = cuda ? "cuda" : "cpu";
    in.date = "today";
    in.host_memory = 16e9;
    if (cuda) {
      in.base = read_json_file(kSource / "topologies" / "dgx-h100.json");
      in.base_name = "dgx-h100";
    }
    const json t = calibrated_topology(measured_device(cuda ? "bf16" : "fp32"), in);
    for (const char* key : {"gemm_efficiency", "attention_efficiency", "memory_efficiency"}) {
      EXPECT_FALSE(t.at("gpu").contains(key)) << key;
      EXPECT_EQ(t.at("calibration").get<std::string>().find(key), std::string::npos) << key;
    }
    if (cuda) {
      EXPECT_EQ(t.at("gpu"), in.base->at("gpu"));  // the datasheet figures, untouched
    }
    const Cluster c = parse_cluster(t, "calibrated.json");
    EXPECT_TRUE(Contains(c.calibration, "the ops tables (ops.source)")) << c.calibration;
    EXPECT_TRUE(Contains(c.calibration, "nothing is fitted on training runs")) << c.calibration;
    EXPECT_TRUE(Contains(c.calibration, "1024^3 21.5 TFLOP/s")) << c.calibration;  // the measured rate
  }
}

// A GPU calibration whose link test covered the whole node of a base without in-switch reduction
// writes the measured points as the node's all-reduce curve (bus bandwidth 2(n-1)/n M / t, at most
// the link's); over part of the node, or on an NVLS node (dgx-b200), it writes none.
TEST(CalibratedTopology, AWholeNodeLinkTestBecomesTheNodeCurve) {
  TopologyInputs in;
  in.name = "calibrated";
  in.command = "trainplan calibrate (test)";
  in.device = "cuda";
  in.date = "today";
  in.host_memory = 16e9;
  in.base = read_json_file(kSource / "topologies" / "dgx-a100-80g.json");
  in.base_name = "dgx-a100-80g";
  CalibrationResult r = measured_device("bf16");
  r.link.measured = true;
  r.link.ranks = 8;
  r.link.note = "test link";
  r.link.points = {{1048576, 101.9e-6}, {33554432, 424e-6}, {1073741824, 0.5}};  // the last: 3.76 GB/s
  r.link.latency = 3e-6;
  r.link.bus_bandwidth = 230e9;
  const Cluster c = parse_cluster(calibrated_topology(r, in), "calibrated.json");
  ASSERT_EQ(c.node_all_reduce.bytes.size(), 3u);
  EXPECT_NEAR(c.node_all_reduce.bus_bandwidth[1], 1.75 * 33554432 / 424e-6, 1e3);  // 138.5 GB/s
  EXPECT_NEAR(c.node_all_reduce.bus_bandwidth[2], 1.75 * 1073741824 / 0.5, 1e3);
  EXPECT_TRUE(Contains(c.calibration, "node.measured_all_reduce")) << c.calibration;
  r.link.ranks = 4;
  EXPECT_TRUE(parse_cluster(calibrated_topology(r, in), "calibrated.json").node_all_reduce.empty());
  r.link.ranks = 8;
  in.base = read_json_file(kSource / "topologies" / "dgx-b200.json");
  in.base_name = "dgx-b200";
  EXPECT_TRUE(parse_cluster(calibrated_topology(r, in), "calibrated.json", kSource).node_all_reduce.empty());
}

// ---- bad inputs, in code ---------------------------------------------------------------------

TEST(ParseCluster, LinkEfficiencyOutsideZeroOneIsRejected) {
  json j = small_cluster();
  j["node"]["link"]["efficiency"] = 0;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: node.link.efficiency = 0, must be in [0.001, 1]");
  j = small_cluster();
  j["network"][0]["efficiency"] = 1.01;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: network[0].efficiency = 1.01, must be in [0.001, 1]");
}

// Positive yet absurdly small rates, sizes and times passed "> 0" and overflowed capacity's days,
// cost and energy to inf (printed with exit 0) or a prediction's step to null.
TEST(ParseCluster, TinyPositiveRatesSizesAndTimesAreRejected) {
  const std::pair<const char*, std::string> cases[] = {
      {"/node/link/bandwidth_gbps", "node.link.bandwidth_gbps = 1e-300, must be in [0.001, 1e+06]"},
      {"/network/0/efficiency", "network[0].efficiency = 1e-300, must be in [0.001, 1]"},
      {"/gpu/hbm_bandwidth_gbps", "gpu.hbm_bandwidth_gbps = 1e-300, must be in [0.001, 1e+06]"},
      {"/gpu/peak_tflops/fp8", "gpu.peak_tflops.fp8 = 1e-300, must be 0 (not supported) or in [0.001, 1e+06]"},
      {"/ops/attention/0/seq", "ops.attention[0].seq = 1e-300, must be in [1, 1e+09]"},
      {"/ops/gemm/0/wgrad_us", "ops.gemm[0].wgrad_us = 1e-300, must be in [0.001, 1e+12]"},
  };
  for (const auto& [pointer, message] : cases) {
    json j = small_cluster();
    j[json::json_pointer(pointer)] = 1e-300;
    EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: " + message);
  }
  json j = small_cluster();
  j["gpu"]["peak_tflops"]["fp8"] = 0;  // 0: no fp8 arithmetic, still fine
  EXPECT_NO_THROW(parse_cluster(j, "toy.json"));
}

// A network tier may declare in-switch reduction (SHARP); the key is optional and must be a
// boolean; the node link has no switches to reduce in and refuses it.
TEST(ParseCluster, InNetworkReductionIsAnOptionalTierFlag) {
  json j = small_cluster();
  EXPECT_FALSE(parse_cluster(j, "toy.json").network[0].in_network_reduction);
  j["network"][0]["in_network_reduction"] = true;
  EXPECT_TRUE(parse_cluster(j, "toy.json").network[0].in_network_reduction);
  j["network"][0]["in_network_reduction"] = 1;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: network[0].in_network_reduction = 1, must be true or false");
  j = small_cluster();
  j["node"]["link"]["in_network_reduction"] = true;
  EXPECT_TRUE(Contains(input_error([&] { parse_cluster(j, "toy.json"); }), "in_network_reduction")) ;
}

TEST(ParseCluster, FirstTierMustSpanAtLeastANode) {
  json j = small_cluster();
  j["network"][0]["span_gpus"] = 2;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: network[0].span_gpus = 2, must be at least node.gpus (4)");
}

TEST(ParseCluster, NegativeOrZeroSizesAreRejected) {
  json j = small_cluster();
  j["gpu"]["hbm_gb"] = 0;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: gpu.hbm_gb = 0, must be in [0.001, 1e+06]");
  j = small_cluster();
  j["node"]["gpus"] = 0;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: node.gpus = 0, must be in [1, 65536]");
  j = small_cluster();
  j["price_per_gpu_hour_usd"] = -1;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: price_per_gpu_hour_usd = -1, must be in [0, 1e+06]");
}

TEST(ParseCluster, EveryTopLevelKeyIsRequired) {
  const json all = small_cluster();  // named: items() of a temporary would dangle
  for (const auto& [key, value] : all.items()) {
    json j = small_cluster();
    j.erase(key);
    EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: " + key + " is missing (required key)");
  }
}

// ---- bad cluster files: each names the file, the field and the rule ---------------------------

struct BadFile {
  const char* file;
  const char* message;  // after "<path>: "
};

class BadClusterFile : public ::testing::TestWithParam<BadFile> {};

TEST_P(BadClusterFile, NamesFileFieldAndRule) {
  const std::string path = kBad + GetParam().file;
  EXPECT_EQ(input_error([&] { load_cluster(path, kSource); }), path + ": " + GetParam().message);
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadClusterFile,
    ::testing::Values(
        BadFile{"cluster_link_efficiency.json", "network[1].efficiency = 1.3, must be in [0.001, 1]"},
        BadFile{"cluster_removed_gemm_efficiency.json",
                "gpu.gemm_efficiency was removed: step times come from the measured ops tables; delete the key"},
        BadFile{"cluster_unknown_key.json", "gpu.tdp_w is not a known key"},
        BadFile{"cluster_missing_key.json", "node.link.latency_us is missing (required key)"},
        BadFile{"cluster_wrong_type.json", "node.gpus = \"8\", must be an integer"},
        BadFile{"cluster_span_not_multiple.json", "network[0].span_gpus = 100, must be a multiple of node.gpus (8)"},
        BadFile{"cluster_span_decreasing.json",
                "network[1].span_gpus = 128, must be at least network[0].span_gpus (256)"},
        BadFile{"cluster_peak_fp32_zero.json", "gpu.peak_tflops.fp32 = 0, must be in [0.001, 1e+06]"},
        BadFile{"cluster_network_not_array.json", "network = {\"name\":\"ib\"}, must be an array of objects"},
        BadFile{"not_object.json", "top level must be a JSON object"},
        BadFile{"no-such-cluster.json", "cannot open file (No such file or directory)"}),
    [](const auto& info) {
      std::string n = info.param.file;
      n = n.substr(0, n.find('.'));
      for (char& c : n)
        if (c == '-') c = '_';
      return n;
    });

TEST(BadClusterFileJson, MalformedAndTruncated) {
  for (const char* f : {"malformed.json", "truncated.json"}) {
    const std::string path = kBad + f;
    const std::string msg = input_error([&] { load_cluster(path, kSource); });
    EXPECT_EQ(msg.rfind(path + ": malformed JSON: ", 0), 0u) << msg;
  }
}

TEST(BadClusterName, UnknownBuiltinNameListsTheBuiltins) {
  const std::string msg = input_error([] { load_cluster("dgx-z9000", kSource); });
  EXPECT_EQ(msg.rfind("--cluster dgx-z9000: not a built-in cluster (one of: ", 0), 0u) << msg;
  EXPECT_TRUE(Contains(msg, "dgx-a100-40g, dgx-a100-80g, dgx-b200, dgx-b300, dgx-h100, dgx-h200, gb200-nvl72"));
  EXPECT_TRUE(Contains(msg, ") and not a file"));
}

}  // namespace
}  // namespace trainplan
