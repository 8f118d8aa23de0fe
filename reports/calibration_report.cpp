// `trainplan calibrate`'s topology file and console table (see calibration_report.hpp).
#include "reports/calibration_report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "sim/cluster.hpp"

namespace trainplan {

using nlohmann::json;

namespace {

std::string shape_text(const GemmPoint& p) {
  return p.m == p.n && p.n == p.k ? fmt::format("{}^3", p.m) : fmt::format("{}x{}x{}", p.m, p.n, p.k);
}

// Efficiency in (0, 1]: achieved / peak, clamped (a figure above the stated peak counts as 1).
double efficiency(double achieved, double peak) { return std::clamp(achieved / peak, 1e-4, 1.0); }

// Matmul efficiency at `flops` on the measured curve (the loader's interpolation).
double curve_at(const std::vector<GemmPoint>& gemm, double peak, double flops) {
  GpuSpec g;
  for (const auto& p : gemm) g.gemm_efficiency.push_back({p.flops, efficiency(p.rate, peak)});
  return g.matmul_efficiency(flops);
}


// The measured op tables (trainplan/cluster/v2 "ops"): each matmul as a GEMM point (only a @ b
// was timed: its dgrad and wgrad are taken to cost the same), the SDPA figure as one attention
// point (not causal: the causal table entry is half its FLOPs at the same rate; backward assumed
// 2.5x the forward FLOPs at that rate), and the copy bandwidth as the add kernel (3 bytes moved per
// input byte forward, 2 backward). Kernel floor and fp8 speedup are the base's (0 without one).
json op_tables(const CalibrationResult& r, const std::optional<json>& base, const std::string& source) {
  json ops = base && base->contains("ops") ? (*base)["ops"] : json::object();
  ops["source"] = source;
  ops["dtype"] = r.dtype;
  if (!ops.contains("kernel_floor_us")) ops["kernel_floor_us"] = 0.0;
  if (!ops.contains("fp8_gemm_speedup")) ops["fp8_gemm_speedup"] = 0.0;
  json gemm = json::array();
  for (const auto& p : r.gemm) {
    const double us = p.median / kMicro;
    gemm.push_back({{"m", p.m}, {"n", p.n}, {"k", p.k}, {"fwd_us", us}, {"dgrad_us", us}, {"wgrad_us", us}});
  }
  ops["gemm"] = gemm;
  if (r.attention_rate > 0 && r.attention_seq > 0) {
    const double fwd_us = r.attention_flops / 2 / r.attention_rate / kMicro;
    ops["attention"] = json::array({json{{"seq", r.attention_seq},
                                         {"head_dim", r.attention_head_dim},
                                         {"batch_heads", r.attention_batch_heads},
                                         {"fwd_us", fwd_us},
                                         {"fwd_bwd_us", 3.5 * fwd_us}}});
  }
  json add = json::array();
  for (double bytes : {1048576.0, 67108864.0}) {
    add.push_back({{"bytes", bytes},
                   {"fwd_us", 3 * bytes / r.copy_bandwidth / kMicro},
                   {"fwd_bwd_us", 5 * bytes / r.copy_bandwidth / kMicro}});
  }
  if (!ops.contains("memory_bound")) ops["memory_bound"] = json::object();
  ops["memory_bound"]["add"] = add;
  return ops;
}

}  // namespace

// The topology file: the measured fields from `r`, the rest from the base (or, for a CPU
// without a base, from this machine and the command line: memory size, price and power).
nlohmann::json calibrated_topology(const CalibrationResult& r, const TopologyInputs& in) {
  const bool cuda = in.device == "cuda";
  json t = in.base ? *in.base : json::object();
  t["name"] = in.name;
  double peak = 0;
  if (in.peak_tflops) {
    peak = *in.peak_tflops * kTera;
  } else if (cuda) {
    peak = t["gpu"]["peak_tflops"]["bf16"].get<double>() * kTera;
  } else {
    peak = r.best_gemm_rate;
  }
  json curve = json::array();
  for (const auto& p : r.gemm) curve.push_back({{"flops", p.flops}, {"efficiency", efficiency(p.rate, peak)}});
  const double attention_eff = efficiency(r.attention_rate, peak * curve_at(r.gemm, peak, r.attention_flops));

  std::string measured = fmt::format(
      "Measured by `{}` on {} (LibTorch {}): {} matmul median rates {}; {}; copy {:.1f} GB/s; SDPA {:.2f} TFLOP/s "
      "at {:.3g} FLOPs; a {}x{}x{} matmul through autograd (fwd + bwd, 3 kernels) {:.1f} us vs {:.1f} us for one bare "
      "kernel (framework cost per op, not modelled by this schema); ",
      in.command, in.date, r.torch_version, r.dtype,
      fmt::join([&] {
        std::vector<std::string> v;
        for (const auto& p : r.gemm) v.push_back(fmt::format("{} {:.3g} TFLOP/s", shape_text(p), p.rate / kTera));
        return v;
      }(),
                ", "),
      cuda ? fmt::format("efficiency relative to {:.4g} TFLOP/s", peak / kTera)
           : fmt::format("efficiency relative to {} ({:.4g} TFLOP/s)",
                         in.peak_tflops ? "--peak-tflops" : "the best measured rate", peak / kTera),
      r.copy_bandwidth / kGB, r.attention_rate / kTera, r.attention_flops, r.autograd_m, r.autograd_n, r.autograd_k,
      r.autograd_matmul / kMicro, r.bare_matmul / kMicro);
  if (r.link.measured) {
    measured += fmt::format("link: {}; fitted latency {:.1f} us, bus bandwidth {:.3f} GB/s.", r.link.note,
                            r.link.latency / kMicro, r.link.bus_bandwidth / kGB);
  } else {
    measured += fmt::format("link {}", r.link.note);
  }

  t["schema"] = kClusterSchema;
  const std::string tables_note =
      "trainplan calibrate: GEMM points are its matmuls (dgrad and wgrad assumed equal to the timed forward), one "
      "SDPA point (backward assumed 2.5x the forward FLOPs at the same rate), the add kernel from the copy "
      "bandwidth; other memory-bound kernels " +
      std::string(in.base ? "are the base's" : "stream their traffic at that bandwidth") + ". " + measured;
  t["ops"] = op_tables(r, in.base, tables_note);
  if (!t.contains("collectives")) {
    t["collectives"] = {{"call_overhead_us", 0.0},
                        {"overlap_slowdown", 0.0},
                        {"source", "not measured: the fitted link latency includes the per-call cost"}};
  }
  if (cuda) {
    json& g = t["gpu"];
    g["gemm_efficiency"] = curve;
    g["attention_efficiency"] = attention_eff;
    g["memory_efficiency"] = efficiency(r.copy_bandwidth, g["hbm_bandwidth_gbps"].get<double>() * kGB);
    if (r.link.measured) {
      json& l = t["node"]["link"];
      l["efficiency"] = efficiency(r.link.bus_bandwidth, l["bandwidth_gbps"].get<double>() * kGB);
      l["latency_us"] = r.link.latency / kMicro;
    }
    t["calibration"] = fmt::format("gemm_efficiency, attention_efficiency, memory_efficiency{} calibrated on one {}. {}",
                                   r.link.measured ? " and node.link efficiency/latency" : "", in.base_name, measured);
    return t;
  }

  // CPU: one "device" is one rank's share of the host.
  json link;
  std::string link_note;
  if (r.link.measured) {
    link = {{"name", "loopback-gloo"},
            {"bandwidth_gbps", r.link.bus_bandwidth / kGB},
            {"latency_us", r.link.latency / kMicro},
            {"efficiency", 1.0}};
  } else if (in.base) {
    link = t["node"]["link"];
    link_note = " The link figures are the base's (not measured).";
  } else {
    // Simpler stand-in: a loopback transfer copies through the kernel twice, so half the copy
    // bandwidth, and a typical loopback TCP round of 50 us.
    link = {{"name", "loopback-estimate"},
            {"bandwidth_gbps", r.copy_bandwidth / 2 / kGB},
            {"latency_us", 50.0},
            {"efficiency", 1.0}};
    link_note = " The link figures are NOT measured: half the copy bandwidth and 50 us latency stand in.";
  }
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
  t["calibration"] = "Every figure from trainplan calibrate on this host. " + measured;
  json gpu = in.base ? t["gpu"] : json::object();
  gpu["name"] = fmt::format("{} x{} thread(s)", r.device_name, r.threads);
  gpu["peak_tflops"] = {{"bf16", 0.0}, {"fp16", 0.0}, {"fp8", 0.0}, {"fp32", peak / kTera}};
  gpu["hbm_gb"] = in.host_memory / in.ranks_per_node / kGB;
  gpu["hbm_bandwidth_gbps"] = r.copy_bandwidth / kGB;
  gpu["memory_efficiency"] = 1.0;  // the bandwidth above is already the achieved one
  gpu["attention_efficiency"] = attention_eff;
  gpu["gemm_efficiency"] = curve;
  t["gpu"] = gpu;
  t["node"] = {{"gpus", in.ranks_per_node}, {"link", link}};
  if (!in.base) t["network"] = json::array();
  if (in.price_usd || !in.base) t["price_per_gpu_hour_usd"] = in.price_usd.value_or(0.0);
  if (in.power_w || !in.base) t["power_per_gpu_w"] = in.power_w.value_or(0.0);
  t["runtime_overhead_gb"] = r.baseline_rss / kGB;
  return t;
}

void print_calibration(std::ostream& os, const CalibrationResult& r) {
  os << fmt::format("device: {} ({}, {} thread(s)), LibTorch {}\n", r.device_name, r.dtype, r.threads, r.torch_version);
  os << fmt::format("{:>16} {:>14} {:>12} {:>12}\n", "matmul", "FLOPs", "median", "TFLOP/s");
  for (const auto& p : r.gemm) {
    os << fmt::format("{:>16} {:>14.4g} {:>9.3f} ms {:>12.4f}\n", shape_text(p), p.flops, p.median * 1e3,
                      p.rate / kTera);
  }
  os << fmt::format("copy bandwidth: {:.2f} GB/s (read + write)\n", r.copy_bandwidth / kGB);
  os << fmt::format("SDPA attention: {:.4f} TFLOP/s at {:.3g} FLOPs\n", r.attention_rate / kTera, r.attention_flops);
  os << fmt::format("matmul {}x{}x{} through autograd (forward + backward, 3 kernels): {:.1f} us; one bare kernel: {:.1f} us\n",
                    r.autograd_m, r.autograd_n, r.autograd_k, r.autograd_matmul / kMicro, r.bare_matmul / kMicro);
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
