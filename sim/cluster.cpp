#include "sim/cluster.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

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
    case Dtype::mxfp8: return "mxfp8";
    case Dtype::nvfp4: return "nvfp4";
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
    case Dtype::mxfp8: return peak_mxfp8;
    case Dtype::nvfp4: return peak_nvfp4;
  }
  return 0;
}

BytesPerSecond BusBandwidthCurve::at(Bytes m) const {
  if (bytes.empty()) return 0;
  if (m <= bytes.front()) return bus_bandwidth.front() * m / bytes.front();
  if (m >= bytes.back()) return bus_bandwidth.back();
  const auto hi = static_cast<std::size_t>(std::upper_bound(bytes.begin(), bytes.end(), m) - bytes.begin());
  const std::size_t lo = hi - 1;
  const double t = std::log(m / bytes[lo]) / std::log(bytes[hi] / bytes[lo]);
  return std::exp(std::log(bus_bandwidth[lo]) + t * (std::log(bus_bandwidth[hi]) - std::log(bus_bandwidth[lo])));
}

int Cluster::max_gpus() const { return network.empty() ? scale_up_gpus : network.back().span_gpus; }

bool is_cpu_host(const Cluster& c) {
  return c.ops.dtype == Dtype::fp32 && c.gpu.peak_bf16 == 0 && c.gpu.peak_fp16 == 0;
}

std::string not_a_derivation_source(const Cluster& src) {
  if (!src.ops.derivation.from.empty()) {
    return fmt::format("its tables are derived (from {}); derive from the measured cluster", src.ops.derivation.from);
  }
  if (is_cpu_host(src)) {
    return fmt::format("is a CPU host ({}: fp32 tables, no bf16 or fp16 peak); derive from a measured GPU cluster file",
                       src.gpu.name);
  }
  return "";
}

namespace {

// Rates and sizes are bounded below as well as above: a positive 1e-300 GB/s is as much a mistake
// as 0, and dividing by it overflows every time, cost and energy figure to inf. The lower bounds
// (1 MB/s, 1 GFLOP/s, 1 MB of memory, 0.1% link efficiency) are far below any real device.
LinkTier parse_tier(const JsonObject& o, bool with_span) {
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

GpuSpec parse_gpu(const JsonObject& g) {
  GpuSpec gpu;
  gpu.name = g.string("name");
  JsonObject peak = g.object("peak_tflops");
  // 0: the GPU has no such arithmetic (fp8 before Hopper); fp32 it always has.
  auto peak_or_zero = [&](const char* key) {
    const double x = peak.number(key, 0, 1e6);
    if (x != 0 && x < 1e-3) throw peak.error(key, "must be 0 (not supported) or in [0.001, 1e+06]");
    return x * kTera;
  };
  gpu.peak_bf16 = peak_or_zero("bf16");
  gpu.peak_fp16 = peak_or_zero("fp16");
  gpu.peak_fp8 = peak_or_zero("fp8");
  gpu.peak_fp32 = peak.number("fp32", 1e-3, 1e6) * kTera;
  if (peak.has("mxfp8")) gpu.peak_mxfp8 = peak_or_zero("mxfp8");
  if (peak.has("nvfp4")) gpu.peak_nvfp4 = peak_or_zero("nvfp4");
  peak.finish();
  gpu.hbm = g.number("hbm_gb", 1e-3, 1e6) * kGB;
  gpu.hbm_bandwidth = g.number("hbm_bandwidth_gbps", 1e-3, 1e6) * kGB;
  if (g.has("sm_count")) gpu.sm_count = static_cast<int>(g.integer("sm_count", 1, 100000));
  // Removed in favour of the measured "ops" tables; a file that still sets one would expect
  // it to change the prediction.
  for (const char* removed : {"gemm_efficiency", "attention_efficiency", "memory_efficiency"}) {
    if (g.has(removed)) {
      throw InputError(fmt::format("{}: {} was removed: step times come from the measured ops tables; delete the key",
                                   g.file(), g.field(removed)));
    }
  }
  g.finish();
  return gpu;
}

// The cluster a derived file's "ops.derive.from" names: a built-in name, or a file (a relative
// path is taken from the deriving file's folder). Its tables must be measured ones, on a GPU.
Cluster parse_cluster_file(const json& j, const std::string& file, const std::filesystem::path& data_dir,
                           bool may_derive);

Cluster derivation_source(const JsonObject& d, const std::string& file, const std::filesystem::path& data_dir) {
  const std::string from = d.string("from");
  std::filesystem::path path = from;
  std::error_code ec;
  if (from.find('/') != std::string::npos || path.extension() == ".json") {
    if (path.is_relative()) path = std::filesystem::path(file).parent_path() / path;
  } else {
    path = data_dir / "topologies" / (from + ".json");
    if (data_dir.empty() || !std::filesystem::exists(path, ec)) {
      throw d.error("from", fmt::format("must be a built-in cluster (one of: {}) or a cluster file",
                                        fmt::join(builtin_clusters(data_dir), ", ")));
    }
  }
  Cluster src;
  try {
    src = parse_cluster_file(read_json_file(path), path.string(), data_dir, false);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {} = {}: {}", file, d.field("from"), from, e.what()));
  }
  if (const std::string why = not_a_derivation_source(src); !why.empty()) {
    throw InputError(fmt::format("{}: {} = {}: {}", file, d.field("from"), from, why));
  }
  return src;
}

// One entry of "ops.derive.achieved": {"kernel": "gemm", "dtype", "m", "n", "k" | "best": true,
// "tflops", "source"} or {"kernel": "attention_fwd" | "attention_bwd", "seq", "head_dim", "tflops",
// "source"}. A rate above the GPU's datasheet peak in its format is a typo, not a measurement.
AchievedRate parse_achieved_rate(const JsonObject& a, const GpuSpec& gpu, Dtype table_dtype) {
  AchievedRate r;
  const std::string kernel = a.choice("kernel", {"gemm", "attention_fwd", "attention_bwd"});
  r.kernel = kernel == "gemm" ? ReferenceKernel::gemm
             : kernel == "attention_fwd" ? ReferenceKernel::attention_fwd
                                         : ReferenceKernel::attention_bwd;
  r.dtype = table_dtype;
  if (r.kernel == ReferenceKernel::gemm) {
    const std::string dtype = a.choice("dtype", {to_string(table_dtype), "fp8", "mxfp8", "nvfp4"});
    r.dtype = dtype == "fp8" ? Dtype::fp8 : dtype == "mxfp8" ? Dtype::mxfp8 : dtype == "nvfp4" ? Dtype::nvfp4 : table_dtype;
    r.best = a.has("best") && a.boolean("best");
    const bool shape = a.has("m") || a.has("n") || a.has("k");
    if (r.best && shape) throw a.error("best", "and a shape m, n, k: a figure is the best over shapes or at one shape");
    if (!r.best && !shape) throw a.error("m", "is missing: give the shape m, n, k or \"best\": true");
    if (!r.best) {
      r.m = a.number("m", 1, 1e7);
      r.n = a.number("n", 1, 1e7);
      r.k = a.number("k", 1, 1e7);
    }
  } else {
    r.seq = a.number("seq", 1, 1e7);
    r.head_dim = a.number("head_dim", 1, 1e4);
  }
  const FlopsPerSecond peak = gpu.peak(r.dtype);
  if (peak <= 0) {
    throw a.error("tflops", fmt::format("gpu.peak_tflops.{} is 0: a {} rate needs the GPU's {} peak", to_string(r.dtype),
                                        to_string(r.dtype), to_string(r.dtype)));
  }
  r.rate = a.number("tflops", 1e-3, 1e6) * kTera;
  if (r.rate > peak) {
    throw a.error("tflops", fmt::format("exceeds gpu.peak_tflops.{} ({:g}): an achieved rate is at most the datasheet peak",
                                        to_string(r.dtype), peak / kTera));
  }
  (void)a.string("source");  // where the figure was published (not empty)
  a.finish();
  return r;
}

// "ops.derive.achieved": published rates on this GPU (derive_op_costs). A quantized format's GEMM
// figure is compared with the table-dtype figure of the same reference, which must be there too.
std::vector<AchievedRate> parse_achieved(const JsonObject& d, const GpuSpec& gpu, Dtype table_dtype) {
  std::vector<AchievedRate> rates;
  if (!d.has("achieved")) return rates;
  const std::vector<JsonObject> entries = d.objects("achieved", 1);
  for (const JsonObject& a : entries) rates.push_back(parse_achieved_rate(a, gpu, table_dtype));
  for (std::size_t i = 0; i < rates.size(); ++i) {
    if (rates[i].dtype == table_dtype) continue;
    const bool partner = std::any_of(rates.begin(), rates.end(), [&](const AchievedRate& b) {
      return b.dtype == table_dtype && b.same_reference(rates[i]);
    });
    if (!partner) {
      throw entries[i].error("dtype", fmt::format("needs a {} figure of the same reference (the same shape, or both "
                                                  "best) to give the format's speed-up",
                                                  to_string(table_dtype)));
    }
  }
  return rates;
}

// "ops.derive.format_ratios": [{"format": "mxfp8" | "nvfp4", "over": "fp8" | "mxfp8", "ratio",
// "source"}]: a block-scaled format's GEMM rate over another format's, published for the same
// tensor-core generation; `over` scales from its achieved figure in this file, else from its
// datasheet peak over `table_dtype`'s (derive_op_costs). A ratio over mxfp8 needs an achieved
// mxfp8 figure or mxfp8's own ratio listed before it.
std::vector<FormatRatio> parse_format_ratios(const JsonObject& d, const GpuSpec& gpu, Dtype table_dtype,
                                             const std::vector<AchievedRate>& achieved) {
  std::vector<FormatRatio> out;
  if (!d.has("format_ratios")) return out;
  for (const JsonObject& f : d.objects("format_ratios", 1)) {
    FormatRatio r;
    r.format = f.choice("format", {"mxfp8", "nvfp4"}) == "mxfp8" ? Dtype::mxfp8 : Dtype::nvfp4;
    const std::string over = f.choice("over", {"fp8", "mxfp8"});
    r.over = over == "fp8" ? Dtype::fp8 : Dtype::mxfp8;
    if (r.over == r.format) throw f.error("over", "must name another format than \"format\"");
    if (gpu.peak(r.format) <= 0) {
      throw f.error("format", fmt::format("gpu.peak_tflops.{} is 0: the GPU has no such arithmetic", to_string(r.format)));
    }
    if (gpu.peak(r.over) <= 0) {
      throw f.error("over", fmt::format("gpu.peak_tflops.{} is 0: the GPU has no such arithmetic", over));
    }
    const bool published = std::any_of(achieved.begin(), achieved.end(), [&](const AchievedRate& a) {
      return a.kernel == ReferenceKernel::gemm && a.dtype == r.over;
    });
    const bool listed_before = std::any_of(out.begin(), out.end(), [&](const FormatRatio& o) { return o.format == r.over; });
    if (r.over == Dtype::mxfp8 && !published && !listed_before) {
      throw f.error("over", "needs an ops.derive.achieved mxfp8 GEMM figure or mxfp8's own ratio listed before this one");
    }
    // (A table dtype without a peak is refused by parse_ops once the ratios are read.)
    r.over_peak_speedup = gpu.peak(table_dtype) > 0 ? gpu.peak(r.over) / gpu.peak(table_dtype) : 0;
    if (std::any_of(out.begin(), out.end(), [&](const FormatRatio& o) { return o.format == r.format; }))
      throw f.error("format", "is given twice");
    r.ratio = f.number("ratio", 0.01, 4);
    (void)f.string("source");
    f.finish();
    out.push_back(r);
  }
  return out;
}

// "ops": measured tables, or {"source", "derive": {"from", "keep_attention_kernels"?,
// "misaligned_gemm_slowdown"?, "achieved"?}}: the tables of the named cluster scaled to this GPU by
// derive_op_costs (op_costs.hpp), so the rule lives in one place and a derived file never goes
// stale. misaligned_gemm_slowdown, when given, replaces the kept one (a GPU whose kernels it was
// not fitted on may state its own assumption).
OpCostTables parse_ops(const JsonObject& ops, const GpuSpec& gpu, const std::string& file,
                       const std::filesystem::path& data_dir, bool may_derive) {
  if (!ops.has("derive")) return parse_op_costs(ops);
  if (!may_derive) {
    throw InputError(fmt::format("{}: ops.derive: the tables a cluster derives from must be measured ones, not derived "
                                 "themselves; derive from the measured cluster",
                                 file));
  }
  (void)ops.string("source");
  const JsonObject d = ops.object("derive");
  const Cluster src = derivation_source(d, file, data_dir);
  DerivationInputs in;
  in.from = src.name;
  in.keep_attention_kernels = d.has("keep_attention_kernels") && d.boolean("keep_attention_kernels");
  // The one kept figure a file may restate for its GPU (the slowdown is a fit on H100 kernels).
  const std::optional<double> misaligned = d.optional_number("misaligned_gemm_slowdown", 1, 100);
  in.achieved = parse_achieved(d, gpu, src.ops.dtype);
  in.format_ratios = parse_format_ratios(d, gpu, src.ops.dtype, in.achieved);
  d.finish();
  ops.finish();
  in.peak = gpu.peak(src.ops.dtype);
  if (in.peak <= 0) {
    throw InputError(fmt::format("{}: gpu.peak_tflops.{} = 0: the tables of {} were measured in {}; deriving them needs "
                                 "this GPU's {} peak",
                                 file, to_string(src.ops.dtype), src.name, to_string(src.ops.dtype),
                                 to_string(src.ops.dtype)));
  }
  in.hbm_bandwidth = gpu.hbm_bandwidth;
  in.sm_count = gpu.sm_count;
  in.measured_sm_count = src.gpu.sm_count;
  OpCostTables t = derive_op_costs(src.ops, in);
  if (misaligned) t.misaligned_gemm_slowdown = *misaligned;
  return t;
}

// Measured tables run at the speeds of the GPU they were measured on: a cluster whose GPU differs
// from it by more than kMeasuredGpuTolerance in peak or HBM bandwidth would keep that GPU's step
// time under its own peak (an MFU off by the ratio, silently), so it is refused.
void check_measured_gpu(const GpuSpec& gpu, const OpCostTables& ops, const std::string& file) {
  const MeasuredOn& m = ops.measured_on;
  auto off = [](double x, double ref) { return std::abs(x / ref - 1) > kMeasuredGpuTolerance; };
  auto refuse = [&](const std::string& field, double value, double measured, const char* unit) {
    return InputError(fmt::format(
        "{}: {} = {:g} differs from the {:g} {} of {}, the GPU its ops tables were measured on, by more than {:g}%: "
        "derive the tables for this GPU (\"ops\": {{\"source\": ..., \"derive\": {{\"from\": \"<the measured "
        "cluster>\"}}}}, as `trainplan cluster derive` writes) or measure it (trainplan calibrate)",
        file, field, value, measured, unit, m.gpu, 100 * kMeasuredGpuTolerance));
  };
  if (off(gpu.peak(ops.dtype), m.peak)) {
    throw refuse(fmt::format("gpu.peak_tflops.{}", to_string(ops.dtype)), gpu.peak(ops.dtype) / kTera, m.peak / kTera,
                 "TFLOP/s");
  }
  if (off(gpu.hbm_bandwidth, m.hbm_bandwidth)) {
    throw refuse("gpu.hbm_bandwidth_gbps", gpu.hbm_bandwidth / kGB, m.hbm_bandwidth / kGB, "GB/s");
  }
}

// "measured_all_reduce": {"gpus" (the node's), "points": [{"bytes", "busbw_gbps"}, ...] with the bytes
// strictly ascending and no bus bandwidth above the link's, "source"}.
void parse_node_all_reduce(const JsonObject& o, Cluster& c) {
  const long long gpus = o.integer("gpus", 1, 1 << 16);
  if (gpus != c.gpus_per_node) {
    throw o.error("gpus", fmt::format("must be node.gpus ({}): the curve is an all-reduce over the whole node", c.gpus_per_node));
  }
  BusBandwidthCurve& curve = c.node_all_reduce;
  for (const JsonObject& p : o.objects("points", 2)) {
    const Bytes bytes = p.number("bytes", 1, 1e15);
    const BytesPerSecond bw = p.number("busbw_gbps", 1e-3, 1e6) * kGB;
    if (!curve.bytes.empty() && bytes <= curve.bytes.back()) throw p.error("bytes", "must be larger than the point before");
    if (bw > c.node.bandwidth) {
      throw p.error("busbw_gbps", fmt::format("must be at most node.link.bandwidth_gbps ({:g})", c.node.bandwidth / kGB));
    }
    curve.bytes.push_back(bytes);
    curve.bus_bandwidth.push_back(bw);
    p.finish();
  }
  (void)o.string("source");
  o.finish();
}

// "node": {"gpus", "link", "scale_up_gpus"?, "peer_link_gbps"?, "measured_all_reduce"?,
// "in_switch_reduction"?: {"efficiency", "source"}}.
void parse_node(const JsonObject& n, Cluster& c) {
  c.gpus_per_node = static_cast<int>(n.integer("gpus", 1, 1 << 16));
  c.node = parse_tier(n.object("link"), false);
  c.node.span_gpus = c.gpus_per_node;
  c.scale_up_gpus = c.gpus_per_node;
  if (n.has("scale_up_gpus")) {
    c.scale_up_gpus = static_cast<int>(n.integer("scale_up_gpus", c.gpus_per_node, 1 << 16));
    if (c.scale_up_gpus % c.gpus_per_node != 0) {
      throw n.error("scale_up_gpus", fmt::format("must be a multiple of node.gpus ({}): a domain of whole nodes",
                                                 c.gpus_per_node));
    }
  }
  if (n.has("peer_link_gbps")) {
    c.peer_link_bandwidth = n.number("peer_link_gbps", 1e-3, 1e6) * kGB;
    if (c.peer_link_bandwidth > c.node.bandwidth) {
      throw n.error("peer_link_gbps", fmt::format("must be at most node.link.bandwidth_gbps ({:g}): one peer's link "
                                                  "is a part of the GPU's node bandwidth",
                                                  c.node.bandwidth / kGB));
    }
  }
  if (n.has("measured_all_reduce")) parse_node_all_reduce(n.object("measured_all_reduce"), c);
  if (n.has("in_switch_reduction")) {
    const JsonObject r = n.object("in_switch_reduction");
    c.in_switch_reduction.efficiency = r.number("efficiency", 1e-3, 1);
    (void)r.string("source");
    r.finish();
    // The curve stands for the ring (collectives.hpp); a node whose all-reduces run in its switch
    // would need one per algorithm.
    if (!c.node_all_reduce.empty()) throw n.error("measured_all_reduce", "is for nodes without in_switch_reduction");
  }
  n.finish();
}

// Tiers go innermost first: each spans at least as many GPUs as the one inside it (the scale-up
// domain for the first), in whole domains.
void parse_network(const std::vector<JsonObject>& tiers, Cluster& c) {
  const bool domain = c.scale_up_gpus != c.gpus_per_node;
  const std::string unit = domain ? "node.scale_up_gpus" : "node.gpus";
  for (std::size_t i = 0; i < tiers.size(); ++i) {
    const JsonObject& t = tiers[i];
    c.network.push_back(parse_tier(t, true));
    const int span = c.network.back().span_gpus;
    const int inner = i == 0 ? c.scale_up_gpus : c.network[i - 1].span_gpus;
    if (span < inner) {
      throw t.error("span_gpus", i == 0 ? fmt::format("must be at least {} ({})", unit, inner)
                                        : fmt::format("must be at least network[{}].span_gpus ({})", i - 1, inner));
    }
    if (span % c.scale_up_gpus != 0) {
      throw t.error("span_gpus", fmt::format("must be a multiple of {} ({})", unit, c.scale_up_gpus));
    }
  }
}

// parse_cluster; `may_derive` false for the source of a derivation (one level: no chains, no cycles).
Cluster parse_cluster_file(const json& j, const std::string& file, const std::filesystem::path& data_dir,
                           bool may_derive) {
  JsonObject o(j, file);
  Cluster c;
  if (o.string("schema") != kClusterSchema) {
    throw o.error("schema", fmt::format("must be \"{}\" (op cost tables per GPU; see topologies/*.json)", kClusterSchema));
  }
  c.name = o.string("name");
  c.source = o.string("source");
  c.calibration = o.string("calibration");
  c.gpu = parse_gpu(o.object("gpu"));
  c.ops = parse_ops(o.object("ops"), c.gpu, file, data_dir, may_derive);
  if (c.ops.derivation.from.empty()) check_measured_gpu(c.gpu, c.ops, file);
  {
    JsonObject k = o.object("collectives");
    c.collectives.call_overhead = k.number("call_overhead_us", 0, 1e6) * kMicro;
    c.collectives.overlap_slowdown = k.number("overlap_slowdown", 0, 1);
    (void)k.string("source");
    k.finish();
  }
  parse_node(o.object("node"), c);
  parse_network(o.objects("network"), c);
  c.runtime_overhead = o.number("runtime_overhead_gb", 0, 1e6) * kGB;
  c.price_per_gpu_hour = o.number("price_per_gpu_hour_usd", 0, 1e6);
  c.power_per_gpu = o.number("power_per_gpu_w", 0, 1e6);
  o.finish();
  return c;
}

}  // namespace

Cluster parse_cluster(const json& j, const std::string& file, const std::filesystem::path& data_dir) {
  return parse_cluster_file(j, file, data_dir, true);
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
  return parse_cluster(read_json_file(path), path.string(), data_dir);
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
