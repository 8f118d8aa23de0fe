// trainplan calibrate: measures a device and the local link (exec/calibrate.hpp) and writes a
// complete topology file that `parse_cluster` accepts.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <fstream>

#include "exec/calibrate.hpp"
#include "reports/calibration_report.hpp"
#include "sim/check.hpp"
#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "cli/output.hpp"
#include "sim/cluster.hpp"
#include "sim/json_reader.hpp"
#include "sim/layer_graph.hpp"
#include "sim/model_spec.hpp"
#include "sim/op_costs.hpp"
#include "sim/software.hpp"

namespace trainplan::cli {

namespace {

using nlohmann::json;

const char* kHelp = R"(usage: trainplan calibrate [--cpu | --device cpu|cuda] [--base CLUSTER] [--out FILE] [options]

Measures what one device delivers and writes a topology file (topologies/*.json schema):
  the "ops" tables predict reads, every row measured: GEMMs (forward, dgrad, wgrad) of the
  models' layers, causal SDPA forward and forward + backward by sequence and head dim, the
  memory-bound kernels (layer_norm, rms_norm, gelu, swiglu, add, cross_entropy_fp32,
  adamw_fused, adamw_foreach) by input bytes, kernel_floor_us from back-to-back tiny kernels,
  and misaligned_gemm_slowdown from one GEMM with an odd N against the aligned one (CUDA events
  on a GPU, wall clock on CPU);
  all-reduce between local processes       -> node.link bandwidth and latency
  (Gloo over 127.0.0.1 on CPU; NCCL with --gpus N >= 2 on CUDA), and on CUDA over all of the
  base's node GPUs (no in_switch_reduction) its points -> node.measured_all_reduce;
  on CPU also: the best matmul FLOP/s      -> gpu.peak_tflops.fp32 (unless --peak-tflops),
  copy bandwidth (one large tensor copy)   -> gpu.hbm_bandwidth_gbps,
  host RAM / --ranks-per-node              -> gpu.hbm_gb,
  resident set after start-up              -> runtime_overhead_gb.
The matmul rates (TFLOP/s), copy bandwidth and SDPA rate are printed and quoted in the file's
"calibration" text. On CUDA the fields not measured (all but "ops" and node.link) are the base's.
Each figure is the median of --repeats timed runs after --warmup untimed ones.
On CPU one "device" is what one rank gets: --threads cores' worth of intra-op threads.

options:
  --cpu                    same as --device cpu
  --device cpu|cuda        what to measure (default cpu)
  --base CLUSTER           take the fields not measured (and, on CUDA, the datasheet peak, HBM
                           size and bandwidth) from this built-in cluster or file; required on CUDA
  --name NAME              topology name (default: cpu-local on CPU, <base>-calibrated on CUDA)
  --out FILE               write the topology JSON to FILE (default: print it)
  --software-out FILE      also write a software profile: --software-base with host.per_kernel_us
                           replaced by the host time per kernel measured here (the slope of a
                           chain of linear layers through autograd, 3 kernels per layer)
  --software-base NAME|FILE  the profile --software-out starts from (default trainplan-exec, the
                           LibTorch stack this measurement runs on)
  --peak-tflops X          CPU: gpu.peak_tflops.fp32, the peak MFU is relative to (default: the
                           best measured matmul rate; on CUDA the peaks are the base's)
  --threads T              CPU threads per rank (default 1)
  --ranks-per-node N       CPU: ranks sharing this host, node.gpus (default 4)
  --price-usd X            CPU: assumed price per rank-hour (default 0, or the base's)
  --power-w X              CPU: assumed power per rank in W (default 0, or the base's)
  --cost-source TEXT       CPU: where those two assumptions come from (quoted in "source")
  --gpus N                 CUDA: local GPUs for the NCCL all-reduce test (default 1: no test)
  --link-ranks N           CPU: processes in the Gloo all-reduce test (default 2; 0 skips it)
  --model NAME|FILE,...    models whose GEMMs are timed: one transformer layer's QKV, attention
                           output, MLP up (and gate), MLP down and the LM head, shapes from the
                           layer graph (default: tiny-gpt,gpt2 on CPU, llama2-7b,gpt3-175b on
                           CUDA; none: no model shapes)
  --tokens A,B,...         GEMM token counts M per model shape (default 16,64,256 on CPU,
                           512,2048,8192 on CUDA)
  --tp-sizes A,B,...       tensor-parallel sizes the model shapes are split for (default 1)
  --sizes A,B,...          square matmul sizes (default: none, or 32..2048 on CPU and 256..16384 on
                           CUDA with --model none)
  --shapes MxNxK,...       further matmul shapes, e.g. 8192x4096x4096 (tokens x out x in)
  --attn-seqs A,B,...      causal attention sequence lengths in tokens (default 128,256,512 on
                           CPU, 1024..8192 on CUDA)
  --head-dims A,B,...      attention head dims (default: 64, 128 and the models' head dims)
  --mem-mb A,B,...         memory-bound kernels' input tensor sizes in MiB (default 1,8 on CPU,
                           32,128,512 on CUDA)
  --launches N             back-to-back tiny kernels per kernel-floor sample (default 2000)
  --copy-mb X              copied buffer in MiB (default 256 on CPU, 1024 on CUDA)
  --link-bytes A,B,...     all-reduce message sizes in bytes (default 4 KiB..64 MiB, x4 steps)
  --warmup W               untimed runs per figure (default 3)
  --repeats R              timed runs per figure (default 10)
)";

std::vector<double> number_list(const Flags& f, const std::string& flag, double lo, double hi) {
  std::vector<double> out;
  const auto v = f.get(flag);
  if (!v) return out;
  for (const std::string& item : split_list(flag, *v)) {
    const auto x = parse_decimal(item);
    if (!x || *x < lo || *x > hi) {
      throw InputError(fmt::format("--{} {}: each entry must be a decimal number in [{}, {}]", flag, *v, lo, hi));
    }
    // Two spellings of one number (1e3,1000) name it twice, as the same text does (split_list).
    if (std::find(out.begin(), out.end(), *x) != out.end()) throw repeated_item(flag, *v, item);
    out.push_back(*x);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// "MxNxK,MxNxK,...": matmul shapes c[M x N] = a[M x K] b[K x N].
std::vector<exec::CalibrateOptions::Shape> shape_list(const Flags& f, const std::string& flag) {
  std::vector<exec::CalibrateOptions::Shape> out;
  const auto v = f.get(flag);
  if (!v) return out;
  for (const std::string& item : split_list(flag, *v)) {
    // Three whole numbers in [1, 2^20] joined by 'x', nothing else.
    int dims[3] = {0, 0, 0};
    const char* p = item.data();
    const char* const end = item.data() + item.size();
    bool ok = true;
    for (int d = 0; d < 3 && ok; ++d) {
      const auto [next, ec] = std::from_chars(p, end, dims[d]);
      ok = ec == std::errc() && next != p && dims[d] >= 1 && dims[d] <= (1 << 20) &&
           (d == 2 ? next == end : next != end && *next == 'x');
      p = next + 1;
    }
    if (!ok) throw InputError(fmt::format("--{} {}: each entry must be MxNxK with sizes in [1, 1048576]", flag, *v));
    exec::CalibrateOptions::Shape s;
    s.m = dims[0];
    s.n = dims[1];
    s.k = dims[2];
    // Two spellings of one shape (8x8x8,08x8x8) name it twice, as the same text does (split_list).
    for (const auto& o : out) {
      if (o.m == s.m && o.n == s.n && o.k == s.k) throw repeated_item(flag, *v, item);
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

// --base: the cluster whose fields are not measured (on CUDA also the GPU's datasheet peak and
// memory): its raw JSON and name into `in`; returns its network tiers' GPU spans.
std::vector<int> read_base(const Flags& f, const Context& ctx, bool cuda, TopologyInputs& in, double& device_memory) {
  std::vector<int> spans;
  const auto base = f.get("base");
  if (!base) {
    if (cuda) throw InputError("--base is required with --device cuda (the GPU's datasheet peak, memory and links come from it)");
    return spans;
  }
  Cluster c;
  try {
    c = load_cluster(*base, ctx.data_dir);  // validates it
  } catch (const InputError& e) {
    // load_cluster names the flag --cluster; here it is --base.
    std::string what = e.what();
    if (what.rfind("--cluster ", 0) == 0) what = "--base " + what.substr(10);
    throw InputError(what);
  }
  const bool is_path = base->find('/') != std::string::npos || base->ends_with(".json");
  in.base = read_json_file(is_path ? std::filesystem::path(*base) : ctx.data_dir / "topologies" / (*base + ".json"));
  in.base_name = c.name;
  for (const LinkTier& t : c.network) spans.push_back(t.span_gpus);
  if (cuda) device_memory = c.gpu.hbm;
  return spans;
}

// The topology's own fields from the flags: peak, ranks per node, price and power; checked now,
// not when the measured topology is loaded back after minutes of measuring.
void read_topology_flags(const Flags& f, bool cuda, const std::vector<int>& base_spans, TopologyInputs& in,
                         exec::CalibrateOptions& o) {
  // From a slow CPU core (~0.01 TFLOP/s fp32) to ~10x the fp8 peak of today's largest GPUs: a
  // value outside is a unit mistake and would make the fp32 peak, and so MFU, absurd.
  if (f.has("peak-tflops")) in.peak_tflops = f.get_double("peak-tflops", 0, 0.01, 50000);
  if (cuda && in.peak_tflops) throw InputError("--peak-tflops: CUDA takes the datasheet peaks from --base");
  // CPU-only figures: a GPU has no intra-op threads to set, and its node is --base's.
  if (cuda && f.has("threads")) throw InputError("--threads: CPU only (the intra-op threads of one CPU rank)");
  if (cuda && f.has("ranks-per-node")) throw InputError("--ranks-per-node: CPU only; on CUDA the node is --base's");
  o.threads = static_cast<int>(f.get_int("threads", 1, 1, 1024));
  in.ranks_per_node = static_cast<int>(f.get_int("ranks-per-node", 4, 1, 1024));
  // On CPU the node becomes --ranks-per-node ranks under the base's network tiers, which must span
  // whole nodes of them.
  for (int span : cuda ? std::vector<int>{} : base_spans) {
    if (span < in.ranks_per_node || span % in.ranks_per_node != 0) {
      throw InputError(fmt::format("--ranks-per-node {}: the --base network tier spanning {} GPUs is not a whole number "
                                   "of such nodes",
                                   in.ranks_per_node, span));
    }
  }
  if (f.has("price-usd")) in.price_usd = f.get_double("price-usd", 0, 0, 1e6);
  if (f.has("power-w")) in.power_w = f.get_double("power-w", 0, 0, 1e6);
  in.cost_source = f.get_text("cost-source", "");
  if (cuda && (in.price_usd || in.power_w)) throw InputError("--price-usd/--power-w: CUDA takes price and power from --base");
  // The file quotes --cost-source beside the price and power it cites, and nowhere else.
  if (f.has("cost-source") && !in.price_usd && !in.power_w)
    throw InputError("--cost-source: cites --price-usd and --power-w; give one of them (or drop it)");
}

// The written topology's gemm table must load (op_costs.hpp kMaxOpTableWork): refused now, not
// after the minutes of measuring it.
void check_gemm_table_size(const exec::CalibrateOptions& o) {
  std::vector<std::array<double, 3>> shapes;
  for (const auto* list : {&o.gemm_shapes, &o.model_shapes})
    for (const auto& sh : *list) shapes.push_back({double(sh.m), double(sh.n), double(sh.k)});
  std::sort(shapes.begin(), shapes.end());
  shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
  const double work = op_table_work(shapes);
  if (work > kMaxOpTableWork) {
    throw InputError(fmt::format("--sizes/--shapes/--model/--tokens/--tp-sizes: {} matmul shapes whose distinct sizes "
                                 "make an interpolation grid of nodes x points = {:.3g}, more than the {:.3g} a "
                                 "topology's gemm table may have; measure fewer shapes",
                                 shapes.size(), work, kMaxOpTableWork));
  }
}

// The matmuls to time: --sizes, --shapes and the layers of the --model list (split for each of
// --tp-sizes, at each of --tokens); each model's head dim joins the attention head dims.
void read_gemm_flags(const Flags& f, const Context& ctx, bool cuda, exec::CalibrateOptions& o) {
  for (double s : number_list(f, "sizes", 1, 65536)) {
    if (s != std::floor(s)) throw InputError(fmt::format("--sizes {}: each entry must be a whole number in [1, 65536]", *f.get("sizes")));
    const int n = static_cast<int>(s);
    o.gemm_shapes.push_back({n, n, n, "--sizes"});
  }
  for (auto sh : shape_list(f, "shapes")) {
    sh.label = "--shapes";
    o.gemm_shapes.push_back(sh);
  }
  std::vector<std::string> models;
  for (const std::string& item : split_list("model", f.get_or("model", cuda ? "llama2-7b,gpt3-175b" : "tiny-gpt,gpt2")))
    if (item != "none") models.push_back(item);
  // --tokens and --tp-sizes shape the --model layers' GEMMs: without a model they shape nothing.
  for (const char* flag : {"tokens", "tp-sizes"}) {
    if (models.empty() && f.has(flag))
      throw InputError(fmt::format("--{} {}: shapes the --model layers' GEMMs, and --model is none", flag, *f.get(flag)));
  }
  std::vector<int> tokens, tp_sizes;
  for (double t : number_list(f, "tokens", 1, 1 << 20)) tokens.push_back(static_cast<int>(t));
  if (tokens.empty()) tokens = cuda ? std::vector<int>{512, 2048, 8192} : std::vector<int>{16, 64, 256};
  for (double t : number_list(f, "tp-sizes", 1, 1024)) tp_sizes.push_back(static_cast<int>(t));
  if (tp_sizes.empty()) tp_sizes = {1};
  o.attention_head_dims = {64, 128};  // the common head dims, and each model's below
  for (const auto& name : models) {
    const ModelSpec model = load_model(name, ctx.data_dir);
    const LayerGraph graph(model, model.seq_len);
    for (int tp : tp_sizes) {
      for (auto& sh : exec::layer_gemm_shapes(graph, tp, tokens)) o.model_shapes.push_back(sh);
    }
    if (std::find(o.attention_head_dims.begin(), o.attention_head_dims.end(), model.head_dim()) ==
        o.attention_head_dims.end()) {
      o.attention_head_dims.push_back(model.head_dim());
    }
  }
  check_gemm_table_size(o);
}

// Attention, memory-bound kernels, launches, copy, link sizes and repetitions.
void read_kernel_flags(const Flags& f, exec::CalibrateOptions& o) {
  for (double t : number_list(f, "attn-seqs", 1, 1 << 20)) o.attention_seqs.push_back(static_cast<int>(t));
  if (f.has("head-dims")) {
    o.attention_head_dims.clear();
    for (double t : number_list(f, "head-dims", 1, 1024)) o.attention_head_dims.push_back(static_cast<int>(t));
  }
  for (double mb : number_list(f, "mem-mb", 1.0 / 1024, 1 << 16)) o.mem_bytes.push_back(mb * 1024 * 1024);
  o.launches = static_cast<int>(f.get_int("launches", 2000, 1, 1000000));
  o.copy_bytes = f.get_double("copy-mb", 0, 0.001, 1 << 20) * 1024 * 1024;
  o.link_bytes = number_list(f, "link-bytes", 4, 1e10);
  for (double& b : o.link_bytes) b = std::max(4.0, std::floor(b / 4) * 4);  // whole fp32 elements
  o.link_bytes.erase(std::unique(o.link_bytes.begin(), o.link_bytes.end()), o.link_bytes.end());
  if (o.link_bytes.size() == 1) {
    // The link fit has two unknowns (latency and bandwidth): one size cannot separate them.
    throw InputError(fmt::format("--link-bytes {}: needs at least 2 different sizes (a multiple of 4 bytes each) to fit "
                                 "latency and bandwidth",
                                 *f.get("link-bytes")));
  }
  o.warmup = static_cast<int>(f.get_int("warmup", 3, 0, 1000));
  o.repeats = static_cast<int>(f.get_int("repeats", 10, 1, 10000));
}

// --software-out and the profile it starts from (--software-base), read and checked before any
// measuring.
struct SoftwareOut {
  std::optional<std::string> path;
  std::string base_name = "trainplan-exec";
  std::optional<json> base;
};

SoftwareOut read_software_out(const Flags& f, const Context& ctx) {
  SoftwareOut so;
  so.path = f.get("software-out");
  const auto software_base = f.get("software-base");
  if (software_base && !so.path) throw InputError("--software-base: needs --software-out (the file to write)");
  so.base_name = software_base.value_or("trainplan-exec");
  if (so.path) {
    const std::filesystem::path p = software_file(so.base_name, ctx.data_dir, "--software-base");
    try {
      so.base = read_json_file(p);
      (void)parse_software(*so.base, p.string());
    } catch (const InputError& e) {
      throw InputError(fmt::format("--software-base {}: {}", so.base_name, e.what()));
    }
  }
  return so;
}

// Memory bound, before any LibTorch call: each measurement must fit in half of the device's
// memory (CPU: this machine's MemTotal; CUDA: the base's HBM). Needs: a matmul holds A, B and C
// (M*K + K*N + M*N elements: fp32 on CPU, bf16 on CUDA); the copy a source and a destination;
// the CPU link test one buffer per rank and a reduction copy of the largest message.
void check_calibration_fits(const Flags& f, const exec::CalibrateOptions& o, bool cuda, double device_memory) {
  if (device_memory <= 0) device_memory = mem_total_bytes();
  if (device_memory <= 0) return;
  const double limit = device_memory / 2, elem = cuda ? 2 : 4;
  const std::string where = cuda ? fmt::format("the --base GPU's {:.1f} GB", device_memory / 1e9)
                                 : fmt::format("this machine's {:.1f} GB", device_memory / 1e9);
  for (const auto& sh : o.gemm_shapes) {
    const double need = (double(sh.m) * sh.k + double(sh.k) * sh.n + double(sh.m) * sh.n) * elem;
    if (need > limit) {
      throw InputError(fmt::format("--shapes/--sizes {}x{}x{}: a matmul of that shape needs {:.1f} GB, more than half of "
                                   "{}",
                                   sh.m, sh.n, sh.k, need / 1e9, where));
    }
  }
  if (2 * o.copy_bytes > limit) {
    throw InputError(fmt::format("--copy-mb {}: the copy needs {:.1f} GB (source and destination), more than half of {}",
                                 *f.get("copy-mb"), 2 * o.copy_bytes / 1e9, where));
  }
  if (!cuda && !o.link_bytes.empty() && 2.0 * o.link_ranks * o.link_bytes.back() > limit) {
    throw InputError(fmt::format("--link-bytes {}: {} ranks x 2 buffers of {:.0f} bytes need more than half of {}",
                                 *f.get("link-bytes"), o.link_ranks, o.link_bytes.back(), where));
  }
}

// Writes (or prints) the measured topology and, with --software-out, the profile; both must load,
// and both files are replaced together (CommandFiles) or neither.
void write_outputs(const Context& ctx, const exec::CalibrationResult& r, const TopologyInputs& in, CommandFiles& files,
                   const SoftwareOut& so) {
  const json topology = calibrated_topology(r, in);
  // What we write must load. It can fail only through a combination of flags (e.g. a base whose
  // network tiers are not whole multiples of --ranks-per-node), so it is reported as input.
  try {
    (void)parse_cluster(topology, files.wants("out") ? files.path("out") : "<calibrated topology>");
  } catch (const InputError& e) {
    throw InputError(fmt::format("the calibrated topology would not load (check --base and --ranks-per-node): {}",
                                 e.what()));
  }
  if (files.wants("software-out")) {
    const json software = calibrated_software(*so.base, so.base_name, r, in);
    (void)parse_software(software, files.path("software-out"));  // what we write must load
    files.stage_json("software-out", software);
  }
  if (files.wants("out")) {
    files.stage_json("out", topology);
  } else {
    ctx.out << topology.dump(2) << "\n";
  }
  files.commit();
  for (const char* flag : {"out", "software-out"})
    if (files.wants(flag)) ctx.err << "wrote " << files.path(flag) << "\n";
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
  // Before any input is read: the outputs writable, apart from each other and from every input
  // (--base, --model, --software-base), and outside the built-in data folders.
  CommandFiles files(f, ctx, {"out", "software-out"});
  exec::CalibrateOptions o;
  const bool cpu_flag = f.has("cpu");
  o.device = f.get_choice("device", "cpu", {"cpu", "cuda"});
  if (cpu_flag && o.device != "cpu") throw InputError("--cpu and --device cuda: choose one");
  const bool cuda = o.device == "cuda";
  TopologyInputs in;
  in.device = o.device;
  double device_memory = 0;  // bytes of memory the measurements may use (half of it, below)
  const std::vector<int> base_spans = read_base(f, ctx, cuda, in, device_memory);
  // Checked now, not when the measured topology is loaded back after minutes of measuring.
  in.name = f.get_text("name", cuda ? in.base_name + "-calibrated" : "cpu-local");
  read_topology_flags(f, cuda, base_spans, in, o);
  if (cuda && f.has("link-ranks")) throw InputError("--link-ranks: CPU only; on CUDA the NCCL all-reduce runs over --gpus");
  if (!cuda && f.has("gpus")) throw InputError("--gpus: CUDA only; on CPU the all-reduce test's processes are --link-ranks");
  const int gpus = static_cast<int>(f.get_int("gpus", 1, 1, 64));
  o.link_ranks = cuda ? (gpus >= 2 ? gpus : 0) : static_cast<int>(f.get_int("link-ranks", 2, 0, 64));
  if (o.link_ranks == 0 && f.has("link-bytes")) {
    throw InputError(fmt::format("--link-bytes {}: no all-reduce is measured ({}); its sizes would go unused",
                                 *f.get("link-bytes"), cuda ? "--gpus 1" : "--link-ranks 0"));
  }
  o.link_backend = cuda ? "nccl" : "gloo";
  read_gemm_flags(f, ctx, cuda, o);
  read_kernel_flags(f, o);
  const SoftwareOut software = read_software_out(f, ctx);
  f.finish();
  check_calibration_fits(f, o, cuda, device_memory);
  in.command = "trainplan calibrate";
  in.date = utc_date();
  in.host_memory = mem_total_bytes();
  for (const auto& a : args) in.command += a.find_first_of(" \"'") == std::string::npos ? " " + a : " '" + a + "'";

  const exec::CalibrationResult r = exec::calibrate(o);
  print_calibration(ctx.err, r);
  write_outputs(ctx, r, in, files, software);
  return 0;
}

}  // namespace trainplan::cli
