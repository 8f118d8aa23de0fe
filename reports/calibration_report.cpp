// `trainplan calibrate`'s topology file and console table (see calibration_report.hpp).
#include "reports/calibration_report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "sim/cluster.hpp"

namespace trainplan {

using nlohmann::json;

namespace {

std::string shape_text(const GemmPoint& p) {
  return p.m == p.n && p.n == p.k ? fmt::format("{}^3", p.m) : fmt::format("{}x{}x{}", p.m, p.n, p.k);
}

// Link efficiency in (0, 1]: achieved / datasheet bandwidth, clamped (above the datasheet counts as 1).
double efficiency(double achieved, double peak) { return std::clamp(achieved / peak, 1e-4, 1.0); }

// The forward matmul rates for the "calibration" text: of shapes with equal FLOPs the fastest,
// ascending FLOPs.
std::vector<GemmPoint> by_flops(std::vector<GemmPoint> gemm) {
  std::sort(gemm.begin(), gemm.end(), [](const GemmPoint& x, const GemmPoint& y) {
    return x.flops != y.flops ? x.flops < y.flops : x.rate > y.rate;
  });
  gemm.erase(std::unique(gemm.begin(), gemm.end(), [](const GemmPoint& x, const GemmPoint& y) { return x.flops == y.flops; }),
             gemm.end());
  return gemm;
}

// How every device figure was taken, for the "source" texts.
std::string method(const CalibrationResult& r) {
  return fmt::format("median of {} after {} warm-up(s), {}", r.repeats, r.warmup, r.timing);
}

// The measured op tables (trainplan/cluster/v2 "ops", sim/op_costs.hpp), every row measured here:
// GEMMs by shape with forward, dgrad and wgrad each timed, causal attention forward and forward +
// backward, memory-bound kernels by input bytes, the kernel floor. Nothing is taken from the base
// (FP8 GEMMs are costed from the 16-bit table and the datasheet peaks, op_time.cpp).
json op_tables(const CalibrationResult& r, const std::string& source) {
  json ops = json::object();
  ops["source"] = source;
  ops["dtype"] = r.dtype;
  ops["kernel_floor_us"] = r.kernel_floor / kMicro;
  ops["misaligned_gemm_slowdown"] = std::max(1.0, r.misaligned_gemm_slowdown);
  json gemm = json::array();
  for (const auto& p : r.gemm) {
    gemm.push_back({{"m", p.m},
                    {"n", p.n},
                    {"k", p.k},
                    {"fwd_us", p.median / kMicro},
                    {"dgrad_us", p.dgrad / kMicro},
                    {"wgrad_us", p.wgrad / kMicro}});
  }
  ops["gemm"] = gemm;
  json attention = json::array();
  for (const auto& a : r.attention) {
    attention.push_back({{"seq", a.seq},
                         {"head_dim", a.head_dim},
                         {"batch_heads", a.batch_heads},
                         {"fwd_us", a.fwd / kMicro},
                         {"fwd_bwd_us", std::max(a.fwd_bwd, a.fwd * (1 + 1e-6)) / kMicro}});
  }
  ops["attention"] = attention;
  json memory = json::object();
  for (const auto& m : r.memory) {
    const bool optimizer = m.kernel.rfind("adamw", 0) == 0;
    json row = {{"bytes", m.bytes}};
    if (optimizer) {
      row["step_us"] = m.fwd / kMicro;
    } else {
      row["fwd_us"] = m.fwd / kMicro;
      // The loader needs fwd_bwd > fwd; a backward lost in timing noise is kept 1 ppm above.
      row["fwd_bwd_us"] = std::max(m.fwd_bwd, m.fwd * (1 + 1e-6)) / kMicro;
    }
    memory[m.kernel].push_back(row);
  }
  ops["memory_bound"] = memory;
  return ops;
}

// The "ops.source" text: per table what was measured, how and on what device.
std::string tables_source(const CalibrationResult& r, const TopologyInputs& in) {
  std::vector<std::string> labels;
  for (const auto& p : r.gemm) {
    for (std::size_t pos = 0; pos < p.label.size();) {
      const std::size_t end = std::min(p.label.find(", ", pos), p.label.size());
      std::string l = p.label.substr(pos, end - pos);
      if (std::find(labels.begin(), labels.end(), l) == labels.end()) labels.push_back(l);
      pos = end + 2;
    }
  }
  std::vector<std::string> kernels;
  for (const auto& m : r.memory) {
    if (std::find(kernels.begin(), kernels.end(), m.kernel) == kernels.end()) kernels.push_back(m.kernel);
  }
  std::string s = fmt::format(
      "Measured by `{}` on {} ({}, LibTorch {}, {}), every figure the {}. gemm: {} shapes y = x W^T ({}), fwd x W^T, "
      "dgrad dy W and wgrad dy^T x each timed with mm_out. attention: causal SDPA "
      "(at::scaled_dot_product_attention, is_causal), {} points, forward and forward + backward of q, k, v. "
      "memory_bound: {} on the input sizes named by sim/op_costs.hpp, forward and forward + backward through "
      "autograd (AdamW: one step, fused = at::_fused_adamw_, foreach = PyTorch's _multi_tensor_adam sequence of "
      "_foreach ops). kernel_floor_us: {} back-to-back one-element in-place adds, time per kernel. "
      "misaligned_gemm_slowdown: fwd + dgrad + wgrad of {}x{}x{} over the same with N = {}.",
      in.command, r.device_name, r.dtype, r.torch_version, in.date, method(r), r.gemm.size(), fmt::join(labels, "; "),
      r.attention.size(), fmt::join(kernels, ", "), r.kernel_floor_launches, r.misaligned_m, r.misaligned_n - 1,
      r.misaligned_k, r.misaligned_n);
  for (const auto& n : r.notes) s += " " + n + ".";
  return s;
}

}  // namespace

namespace {

// What was measured, for the "calibration" text: the matmul rates, copy, SDPA, kernel floor,
// framework and host costs, and the link.
std::string measured_text(const CalibrationResult& r, const TopologyInputs& in) {
  std::vector<std::string> rates;
  for (const auto& p : by_flops(r.gemm)) rates.push_back(fmt::format("{} {:.3g} TFLOP/s", shape_text(p), p.rate / kTera));
  std::string measured = fmt::format(
      "Measured by `{}` on {} (LibTorch {}): {} forward matmul median rates (the fastest shape per FLOP count) {}; "
      "copy {:.1f} GB/s; causal SDPA {:.2f} TFLOP/s at {:.3g} FLOPs; kernel floor {:.2f} us; a {}x{}x{} matmul through autograd (fwd + bwd, 3 kernels) {:.1f} us vs {:.1f} us for one bare "
      "kernel; host time per kernel {:.1f} us (slope of a chain of linears through autograd, 3 kernels per layer; a software profile's host.per_kernel_us, not this schema's) and {:.1f} us fixed per forward + backward() call; ",
      in.command, in.date, r.torch_version, r.dtype, fmt::join(rates, ", "), r.copy_bandwidth / kGB,
      r.attention_rate / kTera, r.attention_flops, r.kernel_floor / kMicro, r.autograd_m, r.autograd_n, r.autograd_k,
      r.autograd_matmul / kMicro, r.bare_matmul / kMicro, r.host_per_kernel / kMicro, r.backward_call_overhead / kMicro);
  if (r.link.measured) {
    return measured + fmt::format("link: {}; fitted latency {:.1f} us, bus bandwidth {:.3f} GB/s.", r.link.note,
                                  r.link.latency / kMicro, r.link.bus_bandwidth / kGB);
  }
  return measured + fmt::format("link {}", r.link.note);
}

// A GPU: the base topology with the measured op tables and, when measured, the node link's
// efficiency and latency.
// The measured all-reduce points as the node's curve (bus bandwidth 2(n-1)/n M / t, at most the
// link's), where they cover the whole node and its all-reduces do not run in the switch (a curve
// stands for the ring: sim/cluster.hpp); else none.
json node_curve(const json& node, const LinkResult& link) {
  if (link.ranks != node.at("gpus").get<int>() || node.contains("in_switch_reduction") || link.points.size() < 2)
    return nullptr;
  const double factor = 2.0 * (link.ranks - 1) / link.ranks;
  const double cap = node.at("link").at("bandwidth_gbps").get<double>();
  json points = json::array();
  for (const LinkPoint& p : link.points)
    points.push_back({{"bytes", p.bytes}, {"busbw_gbps", std::clamp(factor * p.bytes / p.median / kGB, 1e-3, cap)}});
  return {{"gpus", link.ranks}, {"points", points}, {"source", "trainplan calibrate: " + link.note}};
}

json gpu_topology(json t, const CalibrationResult& r, const TopologyInputs& in, const std::string& measured) {
  bool curve = false;
  if (r.link.measured) {
    json& l = t["node"]["link"];
    l["efficiency"] = efficiency(r.link.bus_bandwidth, l["bandwidth_gbps"].get<double>() * kGB);
    l["latency_us"] = r.link.latency / kMicro;
    t["node"].erase("measured_all_reduce");  // the base's node curve, not this link's
    if (json c = node_curve(t["node"], r.link); !c.is_null()) {
      t["node"]["measured_all_reduce"] = std::move(c);
      curve = true;
    }
  }
  t["calibration"] = fmt::format(
      "Measured on one {}: the ops tables (ops.source){}{}; nothing is fitted on training runs, the other fields are "
      "the base's. {}",
      in.base_name, r.link.measured ? " and node.link efficiency and latency" : "",
      curve ? " and the node's all-reduce curve (node.measured_all_reduce)" : "", measured);
  return t;
}

// A CPU's node link: the measured loopback all-reduce, else the base's, else an estimate from the
// copy bandwidth; `note` says which when it was not measured.
json cpu_link(const json& t, const CalibrationResult& r, const TopologyInputs& in, std::string& note) {
  if (r.link.measured) {
    return {{"name", "loopback-gloo"},
            {"bandwidth_gbps", r.link.bus_bandwidth / kGB},
            {"latency_us", r.link.latency / kMicro},
            {"efficiency", 1.0}};
  }
  if (in.base) {
    note = " The link figures are the base's (not measured).";
    return t["node"]["link"];
  }
  // Simpler stand-in: a loopback transfer copies through the kernel twice, so half the copy
  // bandwidth, and a typical loopback TCP round of 50 us.
  note = " The link figures are NOT measured: half the copy bandwidth and 50 us latency stand in.";
  return {{"name", "loopback-estimate"}, {"bandwidth_gbps", r.copy_bandwidth / 2 / kGB}, {"latency_us", 50.0},
          {"efficiency", 1.0}};
}

// A CPU: one "device" is one rank's share of the host.
json cpu_topology(json t, const CalibrationResult& r, const TopologyInputs& in, const std::string& measured) {
  std::string link_note;
  const json link = cpu_link(t, r, in, link_note);
  std::string cost_note;
  if (in.price_usd || in.power_w) {
    cost_note = fmt::format(" Price {} USD and power {} W per rank are assumptions given on the command line{}.",
                            in.price_usd.value_or(0), in.power_w.value_or(0),
                            in.cost_source.empty() ? "" : " (" + in.cost_source + ")");
  } else if (!in.base) {
    cost_note = " Price and power 0 (not given).";
  }
  t["source"] = fmt::format(
      "{} ({}): this host as {} ranks on one node, each rank one \"device\" of {} CPU thread(s). Memory per rank "
      "= host RAM / ranks.{}{}",
      r.device_name, in.base ? "fields not measured from " + in.base_name : "measured, no datasheet", in.ranks_per_node,
      r.threads, cost_note, link_note);
  t["calibration"] = fmt::format(
      "Measured by trainplan calibrate on this host: the ops tables (ops.source){}, gpu.hbm_bandwidth_gbps (the copy "
      "bandwidth), gpu.hbm_gb (host RAM / ranks) and runtime_overhead_gb (the start-up resident set); "
      "gpu.peak_tflops.fp32 is {}; nothing is fitted on training runs. {}",
      r.link.measured ? ", the link" : "", in.peak_tflops ? "--peak-tflops" : "the best measured matmul rate", measured);
  json gpu = in.base ? t["gpu"] : json::object();
  gpu["name"] = fmt::format("{} x{} thread(s)", r.device_name, r.threads);
  // The fp32 peak: --peak-tflops, else the best measured matmul rate.
  const double peak = in.peak_tflops ? *in.peak_tflops * kTera : r.best_gemm_rate;
  gpu["peak_tflops"] = {{"bf16", 0.0}, {"fp16", 0.0}, {"fp8", 0.0}, {"fp32", peak / kTera}};
  gpu["hbm_gb"] = in.host_memory / in.ranks_per_node / kGB;
  gpu["hbm_bandwidth_gbps"] = r.copy_bandwidth / kGB;
  t["gpu"] = gpu;
  t["node"] = {{"gpus", in.ranks_per_node}, {"link", link}};
  if (!in.base) t["network"] = json::array();
  if (in.price_usd || !in.base) t["price_per_gpu_hour_usd"] = in.price_usd.value_or(0.0);
  if (in.power_w || !in.base) t["power_per_gpu_w"] = in.power_w.value_or(0.0);
  t["runtime_overhead_gb"] = r.baseline_rss / kGB;
  return t;
}

}  // namespace

// The topology file: the measured fields from `r`, the rest from the base (or, for a CPU
// without a base, from this machine and the command line: memory size, price and power).
json calibrated_topology(const CalibrationResult& r, const TopologyInputs& in) {
  json t = in.base ? *in.base : json::object();
  t["name"] = in.name;
  t["schema"] = kClusterSchema;
  t["ops"] = op_tables(r, tables_source(r, in));
  if (!t.contains("collectives")) {
    t["collectives"] = {{"call_overhead_us", 0.0},
                        {"overlap_slowdown", 0.0},
                        {"source", "not measured: the fitted link latency includes the per-call cost"}};
  }
  const std::string measured = measured_text(r, in);
  t = in.device == "cuda" ? gpu_topology(std::move(t), r, in, measured) : cpu_topology(std::move(t), r, in, measured);
  // The device the tables were measured on, with the datasheet figures this file gives it (the
  // loader refuses a file whose GPU figures later drift from them; sim/op_costs.hpp).
  const json& gpu = t.at("gpu");
  t["ops"]["measured_on"] = {{"gpu", r.device_name},
                             {"peak_tflops", gpu.at("peak_tflops").at(r.dtype)},
                             {"hbm_bandwidth_gbps", gpu.at("hbm_bandwidth_gbps")}};
  return t;
}

json calibrated_software(const json& base, const std::string& base_name, const CalibrationResult& r,
                         const TopologyInputs& in) {
  json sw = base;
  const double measured_us = std::round(r.host_per_kernel / kMicro * 10) / 10;
  const double before_us = base.at("host").at("per_kernel_us").get<double>();
  sw["host"]["per_kernel_us"] = measured_us;
  sw["name"] = base.at("name").get<std::string>() + "-calibrated";
  sw["assumptions"] = base.at("assumptions").get<std::string>() +
                      fmt::format(" host.per_kernel_us {:.1f} (was {:g} in {}): measured by `{}` on {} ({}), the slope of a "
                                  "chain of {}^2 linear layers through autograd between {} and {} layers, 3 kernels per "
                                  "layer; the fixed cost of one forward + backward() call, {:.1f} us, is not part of it.",
                                  measured_us, before_us, base_name, in.command, in.date, r.device_name,
                                  r.host_chain_dim, r.host_chain_layers[0], r.host_chain_layers[1],
                                  r.backward_call_overhead / kMicro);
  return sw;
}

void print_calibration(std::ostream& os, const CalibrationResult& r) {
  os << fmt::format("device: {} ({}, {} thread(s)), LibTorch {}\n", r.device_name, r.dtype, r.threads, r.torch_version);
  os << fmt::format("every figure the {}\n", method(r));
  os << fmt::format("kernel floor: {:.2f} us per kernel ({} back-to-back launches)\n", r.kernel_floor / kMicro,
                    r.kernel_floor_launches);
  os << fmt::format("misaligned GEMM: {}x{}x{} takes {:.2f}x the time of {}x{}x{} (fwd + dgrad + wgrad)\n",
                    r.misaligned_m, r.misaligned_n - 1, r.misaligned_k, r.misaligned_gemm_slowdown, r.misaligned_m,
                    r.misaligned_n, r.misaligned_k);
  os << fmt::format("{:>20} {:>12} {:>12} {:>12} {:>10}  {}\n", "matmul MxNxK", "fwd us", "dgrad us", "wgrad us",
                    "fwd TF/s", "from");
  for (const auto& p : r.gemm) {
    os << fmt::format("{:>20} {:>12.1f} {:>12.1f} {:>12.1f} {:>10.4f}  {}\n", shape_text(p), p.median / kMicro,
                      p.dgrad / kMicro, p.wgrad / kMicro, p.rate / kTera, p.label);
  }
  os << fmt::format("{:>8} {:>8} {:>11} {:>12} {:>12}\n", "seq", "head_dim", "batch_heads", "fwd us", "fwd+bwd us");
  for (const auto& a : r.attention) {
    os << fmt::format("{:>8} {:>8} {:>11} {:>12.1f} {:>12.1f}\n", a.seq, a.head_dim, a.batch_heads, a.fwd / kMicro,
                      a.fwd_bwd / kMicro);
  }
  os << fmt::format("{:>20} {:>14} {:>12} {:>12}\n", "memory-bound kernel", "input bytes", "fwd us", "fwd+bwd us");
  for (const auto& m : r.memory) {
    os << fmt::format("{:>20} {:>14.0f} {:>12.1f} {:>12}\n", m.kernel, m.bytes, m.fwd / kMicro,
                      m.fwd_bwd > 0 ? fmt::format("{:.1f}", m.fwd_bwd / kMicro) : "(step)");
  }
  for (const auto& n : r.notes) os << n << "\n";
  os << fmt::format("copy bandwidth: {:.2f} GB/s (read + write)\n", r.copy_bandwidth / kGB);
  os << fmt::format("causal SDPA: {:.4f} TFLOP/s at {:.3g} FLOPs (largest point)\n", r.attention_rate / kTera,
                    r.attention_flops);
  os << fmt::format("matmul {}x{}x{} through autograd (forward + backward, 3 kernels): {:.1f} us; one bare kernel: {:.1f} us\n",
                    r.autograd_m, r.autograd_n, r.autograd_k, r.autograd_matmul / kMicro, r.bare_matmul / kMicro);
  if (r.host_chain_dim > 0) {
    os << fmt::format("host time per kernel: {:.1f} us (a chain of {}^2 linears through autograd, {} vs {} layers, 3 "
                      "kernels per layer; a software profile's host.per_kernel_us); fixed cost per forward + "
                      "backward() call: {:.1f} us\n",
                      r.host_per_kernel / kMicro, r.host_chain_dim, r.host_chain_layers[1], r.host_chain_layers[0],
                      r.backward_call_overhead / kMicro);
  }
  if (r.baseline_rss > 0) os << fmt::format("resident set after start-up: {:.1f} MB\n", r.baseline_rss / 1e6);
  if (r.link.measured) {
    os << fmt::format("all-reduce over {} ranks:\n", r.link.ranks);
    for (const auto& p : r.link.points) os << fmt::format("  {:>12.0f} B  {:>10.1f} us\n", p.bytes, p.median / kMicro);
    os << fmt::format("  fitted: latency {:.1f} us per step, bus bandwidth {:.3f} GB/s\n", r.link.latency / kMicro,
                      r.link.bus_bandwidth / kGB);
  } else {
    os << "all-reduce: " << r.link.note << "\n";
  }
}

}  // namespace trainplan
