#include "sim/cluster.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sim/check.hpp"
#include "sim/json_reader.hpp"

namespace trainplan {

using nlohmann::json;

const char* to_string(Dtype d) {
  switch (d) {
    case Dtype::bf16: return "bf16";
    case Dtype::fp16: return "fp16";
    case Dtype::fp8: return "fp8";
    case Dtype::fp32: return "fp32";
  }
  return "?";
}

double activation_bytes(Dtype d) { return d == Dtype::fp32 ? 4.0 : 2.0; }

FlopsPerSecond GpuSpec::peak(Dtype d) const {
  switch (d) {
    case Dtype::bf16: return peak_bf16;
    case Dtype::fp16: return peak_fp16;
    case Dtype::fp8: return peak_fp8;
    case Dtype::fp32: return peak_fp32;
  }
  return 0;
}

int Cluster::max_gpus() const { return network.empty() ? gpus_per_node : network.back().span_gpus; }

// Rates and sizes are bounded below as well as above: a positive 1e-300 GB/s is as much a mistake
// as 0, and dividing by it overflows every time, cost and energy figure to inf. The lower bounds
// (1 MB/s, 1 GFLOP/s, 1 MB of memory, 0.1% link efficiency) are far below any real device.
static LinkTier parse_tier(const JsonObject& o, bool with_span) {
  LinkTier t;
  t.name = o.string("name");
  if (with_span) t.span_gpus = static_cast<int>(o.integer("span_gpus", 1, 1 << 24));
  t.bandwidth = o.number("bandwidth_gbps", 1e-3, 1e6) * kGB;
  t.latency = o.number("latency_us", 0, 1e6) * kMicro;
  t.efficiency = o.number("efficiency", 1e-3, 1);
  if (with_span && o.has("in_network_reduction")) t.in_network_reduction = o.boolean("in_network_reduction");
  o.finish();
  return t;
}

Cluster parse_cluster(const json& j, const std::string& file) {
  JsonObject o(j, file);
  Cluster c;
  if (o.string("schema") != kClusterSchema) {
    throw o.error("schema", fmt::format("must be \"{}\" (op cost tables per GPU; see topologies/*.json)", kClusterSchema));
  }
  c.name = o.string("name");
  c.source = o.string("source");
  c.calibration = o.string("calibration");
  {
    JsonObject g = o.object("gpu");
    c.gpu.name = g.string("name");
    JsonObject peak = g.object("peak_tflops");
    // 0: the GPU has no such arithmetic (fp8 before Hopper); fp32 it always has.
    auto peak_or_zero = [&](const char* key) {
      const double x = peak.number(key, 0, 1e6);
      if (x != 0 && x < 1e-3) throw peak.error(key, "must be 0 (not supported) or in [0.001, 1e+06]");
      return x * kTera;
    };
    c.gpu.peak_bf16 = peak_or_zero("bf16");
    c.gpu.peak_fp16 = peak_or_zero("fp16");
    c.gpu.peak_fp8 = peak_or_zero("fp8");
    c.gpu.peak_fp32 = peak.number("fp32", 1e-3, 1e6) * kTera;
    peak.finish();
    c.gpu.hbm = g.number("hbm_gb", 1e-3, 1e6) * kGB;
    c.gpu.hbm_bandwidth = g.number("hbm_bandwidth_gbps", 1e-3, 1e6) * kGB;
    // Removed in favour of the measured "ops" tables; a file that still sets one would expect
    // it to change the prediction.
    for (const char* removed : {"gemm_efficiency", "attention_efficiency", "memory_efficiency"}) {
      if (g.has(removed)) {
        throw InputError(fmt::format("{}: {} was removed: step times come from the measured ops tables; delete the key",
                                     g.file(), g.field(removed)));
      }
    }
    g.finish();
  }
  c.ops = parse_op_costs(o.object("ops"));
  {
    JsonObject k = o.object("collectives");
    c.collectives.call_overhead = k.number("call_overhead_us", 0, 1e6) * kMicro;
    c.collectives.overlap_slowdown = k.number("overlap_slowdown", 0, 1);
    (void)k.string("source");
    k.finish();
  }
  {
    JsonObject n = o.object("node");
    c.gpus_per_node = static_cast<int>(n.integer("gpus", 1, 1 << 16));
    c.node = parse_tier(n.object("link"), false);
    n.finish();
    c.node.span_gpus = c.gpus_per_node;
  }
  // Tiers go innermost first: each spans at least as many GPUs as the one inside it (the node
  // for the first), in whole nodes.
  const auto tiers = o.objects("network");
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    const JsonObject& t = tiers[i];
    c.network.push_back(parse_tier(t, true));
    const int span = c.network.back().span_gpus;
    const int inner = i == 0 ? c.gpus_per_node : c.network[i - 1].span_gpus;
    if (span < inner) {
      throw t.error("span_gpus", i == 0 ? fmt::format("must be at least node.gpus ({})", inner)
                                        : fmt::format("must be at least network[{}].span_gpus ({})", i - 1, inner));
    }
    if (span % c.gpus_per_node != 0) {
      throw t.error("span_gpus", fmt::format("must be a multiple of node.gpus ({})", c.gpus_per_node));
    }
  }
  c.runtime_overhead = o.number("runtime_overhead_gb", 0, 1e6) * kGB;
  c.price_per_gpu_hour = o.number("price_per_gpu_hour_usd", 0, 1e6);
  c.power_per_gpu = o.number("power_per_gpu_w", 0, 1e6);
  o.finish();
  return c;
}

Cluster load_cluster(const std::string& name_or_path, const std::filesystem::path& data_dir) {
  std::filesystem::path path = name_or_path;
  const bool looks_like_path = name_or_path.find('/') != std::string::npos || path.extension() == ".json";
  if (!looks_like_path) {
    // A built-in name first; else an existing file of that name (without .json or a slash).
    // error_code overloads: a name too long for the file system is "not found", not a crash.
    std::error_code ec;
    const std::filesystem::path builtin = data_dir / "topologies" / (name_or_path + ".json");
    if (std::filesystem::exists(builtin, ec)) {
      path = builtin;
    } else if (!std::filesystem::exists(path, ec)) {  // a directory or FIFO: read_input_file names it
      throw InputError(fmt::format("--cluster {}: not a built-in cluster (one of: {}) and not a file",
                                   name_or_path, fmt::join(builtin_clusters(data_dir), ", ")));
    }
  }
  return parse_cluster(read_json_file(path), path.string());
}

std::vector<std::string> builtin_clusters(const std::filesystem::path& data_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data_dir / "topologies", ec)) {
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace trainplan
