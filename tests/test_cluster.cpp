// Unit tests for sim/cluster: the shipped topologies, unit conversion at load, the matmul
// efficiency curve, and every bad cluster file the loader must reject with a one-line message.
#include "sim/cluster.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>

#include "sim/check.hpp"
#include "sim/json_reader.hpp"
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

TEST(Topologies, EveryShippedFileLoadsAndIsNamedLikeItsFile) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(kSource / "topologies")) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    const Cluster c = load_cluster(e.path().string(), kSource);
    EXPECT_EQ(c.name, e.path().stem().string());
    EXPECT_GT(c.source.size(), 40u);       // cites its datasheets
    EXPECT_GT(c.calibration.size(), 40u);  // says what the efficiencies were fitted on
    if (!c.network.empty()) {  // GPU clusters; cpu-local describes one CPU host for exec runs
      EXPECT_GT(c.gpu.peak_bf16, 100e12);
      EXPECT_GT(c.gpu.hbm, 16e9);
      EXPECT_GE(c.max_gpus(), 1024);       // room for the published multi-node runs
    }
    EXPECT_GT(c.price_per_gpu_hour, 0);
    EXPECT_GT(c.power_per_gpu, 0);
    for (const auto& t : c.network) EXPECT_EQ(t.span_gpus % c.gpus_per_node, 0);
    names.insert(c.name);
  }
  EXPECT_EQ(builtin_clusters(kSource), std::vector<std::string>(names.begin(), names.end()));
  for (const char* required : {"dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200"}) {
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
  // Only datasheet figures here; the efficiencies in this file are the lead's calibration.
  const Cluster c = load_cluster("dgx-a100-80g", kSource);
  EXPECT_EQ(c.gpu.name, "A100-SXM4-80GB");
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::bf16), 312e12);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp16), 312e12);
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp8), 0);  // A100 has no fp8 tensor cores
  EXPECT_DOUBLE_EQ(c.gpu.peak(Dtype::fp32), 19.5e12);
  EXPECT_DOUBLE_EQ(c.gpu.hbm, 80e9);
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
  EXPECT_DOUBLE_EQ(a.gpu.hbm, 40e9);
  EXPECT_DOUBLE_EQ(a.gpu.hbm_bandwidth, 1555e9);
  EXPECT_DOUBLE_EQ(a.gpu.peak_bf16, b.gpu.peak_bf16);
  EXPECT_DOUBLE_EQ(a.node.bandwidth, b.node.bandwidth);
  // dgx-a100-40g's calibration field says its efficiencies are copies of dgx-a100-80g's fit:
  // when the 80g file is recalibrated, copy the new figures into the 40g file.
  const char* why = "dgx-a100-40g must carry dgx-a100-80g's calibration (see its calibration field)";
  EXPECT_DOUBLE_EQ(a.gpu.memory_efficiency, b.gpu.memory_efficiency) << why;
  EXPECT_DOUBLE_EQ(a.gpu.attention_efficiency, b.gpu.attention_efficiency) << why;
  ASSERT_EQ(a.gpu.gemm_efficiency.size(), b.gpu.gemm_efficiency.size()) << why;
  for (std::size_t i = 0; i < a.gpu.gemm_efficiency.size(); ++i) {
    EXPECT_DOUBLE_EQ(a.gpu.gemm_efficiency[i].flops, b.gpu.gemm_efficiency[i].flops) << why;
    EXPECT_DOUBLE_EQ(a.gpu.gemm_efficiency[i].efficiency, b.gpu.gemm_efficiency[i].efficiency) << why;
  }
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
  EXPECT_DOUBLE_EQ(c.gpu.hbm, 80e9);
  EXPECT_DOUBLE_EQ(c.gpu.hbm_bandwidth, 3350e9);
  EXPECT_DOUBLE_EQ(c.gpu.memory_efficiency, 0.9);  // 3.0 TB/s measured copy / 3.35 TB/s
  // The end-to-end curve is dgx-a100-80g's at FLOPs scaled by the peak ratio, and stays below the
  // raw matmul measurement (798 TFLOP/s on a 2·8192³ FLOP matmul, 0.81 of 989.5).
  const Cluster a100 = load_cluster("dgx-a100-80g", kSource);
  EXPECT_NEAR(c.gpu.matmul_efficiency(3.2e12), a100.gpu.matmul_efficiency(1e12), 1e-12);
  EXPECT_LE(c.gpu.matmul_efficiency(2.0 * 8192.0 * 8192.0 * 8192.0), 798.0 / 989.5);
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
  EXPECT_DOUBLE_EQ(h200.gpu.hbm, 141e9);
  EXPECT_DOUBLE_EQ(h200.gpu.hbm_bandwidth, 4800e9);
  EXPECT_DOUBLE_EQ(h200.gpu.peak_bf16, h100.gpu.peak_bf16);
  EXPECT_DOUBLE_EQ(h200.gpu.peak_fp8, h100.gpu.peak_fp8);
  EXPECT_DOUBLE_EQ(h200.node.bandwidth, h100.node.bandwidth);
  EXPECT_EQ(h200.max_gpus(), h100.max_gpus());
}

// ---- units and the efficiency curve, on a cluster written here --------------------------------

json small_cluster() {
  return json::parse(R"({
    "schema": "trainplan/cluster/v2",
    "name": "toy", "source": "test", "calibration": "none",
    "gpu": {"name": "G", "peak_tflops": {"bf16": 100, "fp16": 50, "fp8": 0, "fp32": 10},
            "hbm_gb": 16, "hbm_bandwidth_gbps": 1000, "memory_efficiency": 0.5, "attention_efficiency": 0.9,
            "gemm_efficiency": [{"flops": 1e9, "efficiency": 0.3}, {"flops": 1e10, "efficiency": 0.5},
                                {"flops": 1e11, "efficiency": 0.7}]},
    "ops": {"source": "test", "dtype": "bf16", "kernel_floor_us": 5,
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
  EXPECT_DOUBLE_EQ(c.gpu.memory_efficiency, 0.5);
  EXPECT_DOUBLE_EQ(c.gpu.attention_efficiency, 0.9);
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
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: ops.gemm[0].m = 0, must be in (0, 1e+09]");
}

TEST(ParseCluster, NoNetworkMeansOneNode) {
  json j = small_cluster();
  j["network"] = json::array();
  EXPECT_EQ(parse_cluster(j, "toy.json").max_gpus(), 4);
}

TEST(MatmulEfficiency, FlatOutsideTheCurve) {
  const Cluster c = parse_cluster(small_cluster(), "toy.json");
  EXPECT_DOUBLE_EQ(c.gpu.matmul_efficiency(1e6), 0.3);
  EXPECT_DOUBLE_EQ(c.gpu.matmul_efficiency(1e9), 0.3);
  EXPECT_DOUBLE_EQ(c.gpu.matmul_efficiency(1e11), 0.7);
  EXPECT_DOUBLE_EQ(c.gpu.matmul_efficiency(1e15), 0.7);
}

TEST(MatmulEfficiency, ExactAtThePoints) {
  const Cluster c = parse_cluster(small_cluster(), "toy.json");
  EXPECT_NEAR(c.gpu.matmul_efficiency(1e10), 0.5, 1e-12);
}

TEST(MatmulEfficiency, LogLinearBetweenPoints) {
  const Cluster c = parse_cluster(small_cluster(), "toy.json");
  // 10^9.5 is half-way from 1e9 to 1e10 in log space: 0.3 + 0.5·(0.5 − 0.3) = 0.4.
  EXPECT_NEAR(c.gpu.matmul_efficiency(std::pow(10.0, 9.5)), 0.4, 1e-12);
  // 10^10.25 is a quarter of the way from 1e10 to 1e11: 0.5 + 0.25·0.2 = 0.55.
  EXPECT_NEAR(c.gpu.matmul_efficiency(std::pow(10.0, 10.25)), 0.55, 1e-12);
  // Linear in flops would give 0.3 + (2e9 − 1e9)/(9e9)·0.2 = 0.322; log-linear gives log10(2)·0.2.
  EXPECT_NEAR(c.gpu.matmul_efficiency(2e9), 0.3 + std::log10(2.0) * 0.2, 1e-12);
}

TEST(MatmulEfficiency, OnePointIsAConstant) {
  json j = small_cluster();
  j["gpu"]["gemm_efficiency"] = json::parse(R"([{"flops": 1e10, "efficiency": 0.6}])");
  const Cluster c = parse_cluster(j, "toy.json");
  EXPECT_DOUBLE_EQ(c.gpu.matmul_efficiency(1), 0.6);
  EXPECT_DOUBLE_EQ(c.gpu.matmul_efficiency(1e20), 0.6);
}

TEST(MatmulEfficiency, EmptyCurveIsAnInternalError) {
  GpuSpec g;  // built in code without points: a bug, not bad input
  EXPECT_THROW(g.matmul_efficiency(1e9), std::logic_error);
}

// ---- bad inputs, in code ---------------------------------------------------------------------

TEST(ParseCluster, EmptyEfficiencyCurveIsRejected) {
  json j = small_cluster();
  j["gpu"]["gemm_efficiency"] = json::array();
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: gpu.gemm_efficiency = [], must hold at least 1 entries");
}

TEST(ParseCluster, EfficiencyAboveOneIsRejected) {
  json j = small_cluster();
  j["gpu"]["gemm_efficiency"][1]["efficiency"] = 1.01;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: gpu.gemm_efficiency[1].efficiency = 1.01, must be in (0, 1]");
  j = small_cluster();
  j["node"]["link"]["efficiency"] = 0;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: node.link.efficiency = 0, must be in (0, 1]");
  j = small_cluster();
  j["gpu"]["memory_efficiency"] = 2;
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }),
            "toy.json: gpu.memory_efficiency = 2, must be in (0, 1]");
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
  EXPECT_EQ(input_error([&] { parse_cluster(j, "toy.json"); }), "toy.json: gpu.hbm_gb = 0, must be in (0, 1e+06]");
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
        BadFile{"cluster_link_efficiency.json", "network[1].efficiency = 1.3, must be in (0, 1]"},
        BadFile{"cluster_gemm_not_increasing.json",
                "gpu.gemm_efficiency[2].flops = 10000000000.0, must increase along gpu.gemm_efficiency"},
        BadFile{"cluster_unknown_key.json", "gpu.tdp_w is not a known key"},
        BadFile{"cluster_missing_key.json", "node.link.latency_us is missing (required key)"},
        BadFile{"cluster_wrong_type.json", "node.gpus = \"8\", must be an integer"},
        BadFile{"cluster_span_not_multiple.json", "network[0].span_gpus = 100, must be a multiple of node.gpus (8)"},
        BadFile{"cluster_span_decreasing.json",
                "network[1].span_gpus = 128, must be at least network[0].span_gpus (256)"},
        BadFile{"cluster_peak_fp32_zero.json", "gpu.peak_tflops.fp32 = 0, must be in (0, 1e+06]"},
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
  EXPECT_TRUE(Contains(msg, "dgx-a100-40g, dgx-a100-80g, dgx-h100, dgx-h200"));
  EXPECT_TRUE(Contains(msg, ") and not a file"));
}

}  // namespace
}  // namespace trainplan
