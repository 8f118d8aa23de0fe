// trainplan calibrate: measures a device and the local link (exec/calibrate.hpp) and writes a
// complete topology file that `parse_cluster` accepts.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>

#include "exec/calibrate.hpp"
#include "sim/check.hpp"
#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "sim/cluster.hpp"
#include "sim/json_reader.hpp"

namespace trainplan::cli {

namespace {

using nlohmann::json;

const char* kHelp = R"(usage: trainplan calibrate [--cpu | --device cpu|cuda] [--base CLUSTER] [--out FILE] [options]

Measures what one device delivers and writes a topology file (topologies/*.json schema):
  matmul FLOP/s by size (fp32 on CPU, bf16 on CUDA) -> gpu.gemm_efficiency relative to the peak,
  copy bandwidth (one large tensor copy)          -> gpu.hbm_bandwidth_gbps (CPU) or
                                                     gpu.memory_efficiency (CUDA, vs the base's),
  fused attention (SDPA) FLOP/s                   -> gpu.attention_efficiency,
  all-reduce between local processes              -> node.link bandwidth and latency
  (Gloo over 127.0.0.1 on CPU; NCCL with --gpus N >= 2 on CUDA).
Each figure is the median of --repeats timed runs after --warmup untimed ones.
On CPU one "device" is what one rank gets: --threads cores' worth of intra-op threads.

options:
  --cpu                    same as --device cpu
  --device cpu|cuda        what to measure (default cpu)
  --base CLUSTER           take the fields not measured (and, on CUDA, the datasheet peak, HBM
                           size and bandwidth) from this built-in cluster or file; required on CUDA
  --name NAME              topology name (default: cpu-local on CPU, <base>-calibrated on CUDA)
  --out FILE               write the topology JSON to FILE (default: print it)
  --peak-tflops X          peak the GEMM efficiencies are relative to (default: the best measured
                           rate on CPU, the base's bf16 peak on CUDA)
  --threads T              CPU threads per rank (default 1)
  --ranks-per-node N       CPU: ranks sharing this host, node.gpus (default 4)
  --price-usd X            CPU: assumed price per rank-hour (default 0, or the base's)
  --power-w X              CPU: assumed power per rank in W (default 0, or the base's)
  --cost-source TEXT       CPU: where those two assumptions come from (quoted in "source")
  --gpus N                 CUDA: local GPUs for the NCCL all-reduce test (default 1: no test)
  --link-ranks N           CPU: processes in the Gloo all-reduce test (default 2; 0 skips it)
  --sizes A,B,...          square matmul sizes (default: 32..2048 on CPU, 256..16384 on CUDA)
  --shapes MxNxK,...       further matmul shapes, e.g. 8192x4096x4096 (tokens x out x in)
  --copy-mb X              copied buffer in MiB (default 256 on CPU, 1024 on CUDA)
  --link-bytes A,B,...     all-reduce message sizes in bytes (default 4 KiB..64 MiB, x4 steps)
  --warmup W               untimed runs per figure (default 3)
  --repeats R              timed runs per figure (default 10)
)";

std::vector<double> number_list(const Flags& f, const std::string& flag, double lo, double hi) {
  std::vector<double> out;
  const auto v = f.get(flag);
  if (!v) return out;
  std::stringstream in(*v);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    double x = 0;
    try {
      x = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !(x >= lo && x <= hi)) {
      throw InputError(fmt::format("--{} {}: each entry must be a number in [{}, {}]", flag, *v, lo, hi));
    }
    out.push_back(x);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.empty()) throw InputError(fmt::format("--{}: needs at least one number", flag));
  return out;
}

// "MxNxK,MxNxK,...": matmul shapes c[M x N] = a[M x K] b[K x N].
std::vector<exec::CalibrateOptions::Shape> shape_list(const Flags& f, const std::string& flag) {
  std::vector<exec::CalibrateOptions::Shape> out;
  const auto v = f.get(flag);
  if (!v) return out;
  std::stringstream in(*v);
  std::string item;
  while (std::getline(in, item, ',')) {
    exec::CalibrateOptions::Shape s;
    char x1 = 0, x2 = 0;
    std::istringstream one(item);
    if (!(one >> s.m >> x1 >> s.n >> x2 >> s.k) || x1 != 'x' || x2 != 'x' || !one.eof() || s.m < 1 || s.n < 1 ||
        s.k < 1 || s.m > 1 << 20 || s.n > 1 << 20 || s.k > 1 << 20) {
      throw InputError(fmt::format("--{} {}: each entry must be MxNxK with sizes in [1, 1048576]", flag, *v));
    }
    out.push_back(s);
  }
  return out;
}

double mem_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") return kb * 1024.0;
  }
  return 0;
}

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

std::string shape_text(const exec::GemmPoint& p) {
  return p.m == p.n && p.n == p.k ? fmt::format("{}^3", p.m) : fmt::format("{}x{}x{}", p.m, p.n, p.k);
}

// Efficiency in (0, 1]: achieved / peak, clamped (a figure above the stated peak counts as 1).
double efficiency(double achieved, double peak) { return std::clamp(achieved / peak, 1e-4, 1.0); }

// Matmul efficiency at `flops` on the measured curve (the loader's interpolation).
double curve_at(const std::vector<exec::GemmPoint>& gemm, double peak, double flops) {
  GpuSpec g;
  for (const auto& p : gemm) g.gemm_efficiency.push_back({p.flops, efficiency(p.rate, peak)});
  return g.matmul_efficiency(flops);
}

struct TopologyInputs {
  std::string name;
  std::string command;
  std::string device;
  int ranks_per_node = 4;
  std::optional<double> peak_tflops;
  std::optional<double> price_usd;  // CPU: per rank-hour, an assumption from the command line
  std::optional<double> power_w;    // CPU: per rank
  std::string cost_source;          // where those assumptions come from
  std::optional<json> base;        // raw base topology
  std::string base_name;
};

// The topology file: the measured fields from `r`, the rest from the base (or, for a CPU
// without a base, from this machine and the command line: memory size, price and power).
json calibrated_topology(const exec::CalibrationResult& r, const TopologyInputs& in) {
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
      in.command, utc_date(), r.torch_version, r.dtype,
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
  gpu["hbm_gb"] = mem_total_bytes() / in.ranks_per_node / kGB;
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

void print_result(std::ostream& os, const exec::CalibrationResult& r) {
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

}  // namespace

int cmd_calibrate(const Args& args, const Context& ctx) {
  Flags f(args, "calibrate", {"cpu"});
  if (f.help()) {
    ctx.out << kHelp;
    return 0;
  }
  if (!f.positionals().empty()) {
    throw InputError(fmt::format("'{}': calibrate takes no positional arguments", f.positionals()[0]));
  }
  exec::CalibrateOptions o;
  const bool cpu_flag = f.has("cpu");
  o.device = f.get_choice("device", "cpu", {"cpu", "cuda"});
  if (cpu_flag && o.device != "cpu") throw InputError("--cpu and --device cuda: choose one");
  const bool cuda = o.device == "cuda";
  TopologyInputs in;
  in.device = o.device;
  if (const auto base = f.get("base")) {
    const Cluster c = load_cluster(*base, ctx.data_dir);  // validates it
    const bool is_path = base->find('/') != std::string::npos || base->ends_with(".json");
    in.base = read_json_file(is_path ? std::filesystem::path(*base)
                                     : ctx.data_dir / "topologies" / (*base + ".json"));
    in.base_name = c.name;
  } else if (cuda) {
    throw InputError("--base is required with --device cuda (the GPU's datasheet peak, memory and links come from it)");
  }
  in.name = f.get_or("name", cuda ? in.base_name + "-calibrated" : "cpu-local");
  const auto out_path = f.get("out");
  if (f.has("peak-tflops")) in.peak_tflops = f.get_double("peak-tflops", 0, 1e-6, 1e6);
  o.threads = static_cast<int>(f.get_int("threads", 1, 1, 1024));
  in.ranks_per_node = static_cast<int>(f.get_int("ranks-per-node", 4, 1, 1024));
  if (f.has("price-usd")) in.price_usd = f.get_double("price-usd", 0, 0, 1e6);
  if (f.has("power-w")) in.power_w = f.get_double("power-w", 0, 0, 1e6);
  in.cost_source = f.get_or("cost-source", "");
  if (cuda && (in.price_usd || in.power_w)) throw InputError("--price-usd/--power-w: CUDA takes price and power from --base");
  const int gpus = static_cast<int>(f.get_int("gpus", 1, 1, 64));
  o.link_ranks = cuda ? (gpus >= 2 ? gpus : 0) : static_cast<int>(f.get_int("link-ranks", 2, 0, 64));
  o.link_backend = cuda ? "nccl" : "gloo";
  for (double s : number_list(f, "sizes", 1, 65536)) {
    const int n = static_cast<int>(s);
    o.gemm_shapes.push_back({n, n, n});
  }
  for (const auto& sh : shape_list(f, "shapes")) o.gemm_shapes.push_back(sh);
  o.copy_bytes = f.get_double("copy-mb", 0, 0.001, 1 << 20) * 1024 * 1024;
  o.link_bytes = number_list(f, "link-bytes", 4, 1e10);
  for (double& b : o.link_bytes) b = std::max(4.0, std::floor(b / 4) * 4);  // whole fp32 elements
  o.warmup = static_cast<int>(f.get_int("warmup", 3, 0, 1000));
  o.repeats = static_cast<int>(f.get_int("repeats", 10, 1, 10000));
  f.finish();
  in.command = "trainplan calibrate";
  for (const auto& a : args) in.command += a.find_first_of(" \"'") == std::string::npos ? " " + a : " '" + a + "'";

  const exec::CalibrationResult r = exec::calibrate(o);
  print_result(ctx.err, r);
  const json topology = calibrated_topology(r, in);
  // What we write must load. It can fail only through a combination of flags (e.g. a base whose
  // network tiers are not whole multiples of --ranks-per-node), so it is reported as input.
  try {
    (void)parse_cluster(topology, out_path.value_or("<calibrated topology>"));
  } catch (const InputError& e) {
    throw InputError(fmt::format("the calibrated topology would not load (check --base and --ranks-per-node): {}",
                                 e.what()));
  }
  if (out_path) {
    write_json_file("out", *out_path, topology);
    ctx.err << "wrote " << *out_path << "\n";
  } else {
    ctx.out << topology.dump(2) << "\n";
  }
  return 0;
}

}  // namespace trainplan::cli
