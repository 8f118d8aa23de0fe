// trainplan cluster derive: a cluster file for a GPU nobody measured, whose op tables are derived
// at load from a measured cluster's by trainplan's one rule (sim/op_costs.hpp, derive_op_costs).
#include <fmt/format.h>

#include <filesystem>

#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "sim/check.hpp"
#include "sim/cluster.hpp"
#include "sim/json_reader.hpp"

namespace trainplan::cli {

namespace {

const char* kHelp = R"(usage: trainplan cluster derive --from CLUSTER --name NAME --gpu-name GPU --peak-bf16 T
           --peak-fp32 T --hbm-gb G --hbm-bandwidth-gbps B [options] --out FILE

Writes a cluster file for your GPU whose op cost tables are DERIVED, at every load, from the
measured tables of --from by trainplan's rule (sim/op_costs.hpp):
  GEMM and attention times      x  measured GPU's peak / your --peak-bf16 (the table dtype's peak)
  memory-bound kernel times     x  measured GPU's HBM bandwidth / your --hbm-bandwidth-gbps
  kernel floor (launch, host)   kept;  misaligned-GEMM slowdown kept (or --misaligned-gemm-slowdown)
  other formats (fp8, mxfp8, nvfp4) from your peaks' ratios to bf16, as on a measured GPU
  GEMM shapes (with --sm-count and --from's gpu.sm_count): each GEMM at the measured GPU's
    efficiency for the shape with as many tiles per SM and as long a k-loop per tile (m x their
    SMs / yours, k x their peak per SM / yours), so fewer or slower SMs fill at smaller shapes
With --achieved-bf16 (your GPU's best achieved matmul rate, e.g. from a maximum-achievable-matmul
search), GEMM times scale by the ratio of ACHIEVED rates instead: the measured table's best GEMM
rate / yours; --achieved-fp8 (or -mxfp8, -nvfp4) then gives that format's speed-up over bf16 as
the ratio of your two rates instead of the peaks'. Edit each figure's "source" to say where it
was measured. Attention keeps the peak ratio unless the file states attention figures (README).
Everything else (node, links, network tiers, collective costs, runtime overhead, price, power) is
copied from --from: edit those fields for your system (the file's "source" says so). A copy of a
cluster file with only the GPU's figures changed would keep the measured GPU's speeds; trainplan
refuses such a file when its peak or bandwidth differs by more than 10%. Measuring your GPU
(trainplan calibrate --device cuda --base FILE) replaces the derived tables with measured ones.

required:
  --from CLUSTER             measured GPU cluster (built-in name or file) whose tables are
                             scaled; not a derived one, nor a CPU host's (cpu-local)
  --name NAME                the new cluster's name
  --gpu-name GPU             the GPU's name (e.g. B200-SXM-180GB)
  --peak-bf16 T              dense (no sparsity) bf16 peak, TFLOP/s
  --peak-fp32 T              fp32 peak, TFLOP/s
  --hbm-gb G                 memory per GPU, GB (1e9 bytes, as the runtime reports it)
  --hbm-bandwidth-gbps B     HBM bandwidth, GB/s
  --out FILE                 the cluster file to write

options:
  --peak-fp16 T              dense fp16 peak (default: --peak-bf16)
  --peak-fp8 T               dense fp8 peak (default 0: none)
  --peak-mxfp8 T, --peak-nvfp4 T   block-scaled formats' dense peaks (default 0: none)
  --price-usd X              price per GPU-hour (default: --from's)
  --power-w W                power per GPU incl. its share of the node (default: --from's)
  --sm-count N               streaming multiprocessors (NVIDIA) or compute units (AMD) of your
                             GPU (default: not stated; every GEMM then keeps its own shape)
  --misaligned-gemm-slowdown X   replace the kept slowdown of misaligned GEMMs, in [1, 100]
  --achieved-bf16 T          best achieved bf16 matmul rate on your GPU, TFLOP/s (at most its peak)
  --achieved-fp8 T, --achieved-mxfp8 T, --achieved-nvfp4 T   the same in a quantized format
                             (each needs --achieved-bf16)

Exit status: 0 written, 2 bad input.
)";

// Peaks share the loader's bounds (cluster.cpp): 0 = none, else [0.001, 1e6] TFLOP/s.
double peak_flag(const Flags& f, const std::string& name, double fallback) {
  const double x = f.get_double(name, fallback, 0, 1e6);
  if (x != 0 && x < 1e-3) throw InputError(fmt::format("--{} {}: must be 0 (none) or in [0.001, 1e+06] TFLOP/s", name, x));
  return x;
}

// --from as the written file names it: a built-in name as is, a file relative to the output's
// folder (the loader resolves it from there).
std::string from_as_written(const std::string& from, const std::filesystem::path& data_dir, const std::string& out) {
  std::error_code ec;
  if (from.find('/') == std::string::npos && std::filesystem::path(from).extension() != ".json" &&
      std::filesystem::exists(data_dir / "topologies" / (from + ".json"), ec)) {
    return from;
  }
  const auto out_dir = std::filesystem::absolute(out).parent_path();
  return std::filesystem::relative(std::filesystem::absolute(from), out_dir, ec).generic_string();
}

// --achieved-<format> T: best-over-shapes matmul rates on the new GPU ("ops.derive.achieved"; the
// loader checks each against the GPU's peak in its format).
nlohmann::json achieved_figures(const Flags& f) {
  nlohmann::json figures = nlohmann::json::array();
  for (const char* format : {"bf16", "fp8", "mxfp8", "nvfp4"}) {
    const std::string flag = fmt::format("achieved-{}", format);
    if (!f.has(flag)) continue;
    if (figures.empty() && std::string(format) != "bf16") {
      throw InputError(fmt::format("--{}: needs --achieved-bf16 (the format's speed-up is its rate over bf16's)", flag));
    }
    figures.push_back({{"kernel", "gemm"},
                       {"dtype", format},
                       {"best", true},
                       {"tflops", f.get_double(flag, 0, 1e-3, 1e6)},
                       {"source", fmt::format("given to trainplan cluster derive --{}: state where it was measured", flag)}});
  }
  return figures;
}

nlohmann::json derived_file(const Flags& f, const Cluster& src, const nlohmann::json& src_json,
                            const std::string& from) {
  nlohmann::json j = src_json;
  const double bf16 = peak_flag(f, "peak-bf16", 0);
  if (bf16 == 0) throw InputError("--peak-bf16 0: must be in [0.001, 1e+06] TFLOP/s (the tables are scaled by it)");
  nlohmann::json peaks = {{"bf16", bf16},
                          {"fp16", peak_flag(f, "peak-fp16", bf16)},
                          {"fp8", peak_flag(f, "peak-fp8", 0)},
                          {"fp32", f.get_double("peak-fp32", 0, 1e-3, 1e6)},
                          {"mxfp8", peak_flag(f, "peak-mxfp8", 0)},
                          {"nvfp4", peak_flag(f, "peak-nvfp4", 0)}};
  const std::string gpu = f.get_text("gpu-name", "");
  j["name"] = f.get_text("name", "");
  j["gpu"] = {{"name", gpu},
              {"peak_tflops", peaks},
              {"hbm_gb", f.get_double("hbm-gb", 0, 1e-3, 1e6)},
              {"hbm_bandwidth_gbps", f.get_double("hbm-bandwidth-gbps", 0, 1e-3, 1e6)}};
  if (f.has("sm-count")) j["gpu"]["sm_count"] = f.get_int("sm-count", 0, 1, 100000);
  j["price_per_gpu_hour_usd"] = f.get_double("price-usd", src.price_per_gpu_hour, 0, 1e6);
  j["power_per_gpu_w"] = f.get_double("power-w", src.power_per_gpu, 0, 1e6);
  nlohmann::json derive = {{"from", from}};
  if (f.has("misaligned-gemm-slowdown")) derive["misaligned_gemm_slowdown"] = f.get_double("misaligned-gemm-slowdown", 1, 1, 100);
  const nlohmann::json achieved = achieved_figures(f);
  if (!achieved.empty()) derive["achieved"] = achieved;
  j["ops"] = {{"source", fmt::format("Derived, not measured on {}: {}'s measured tables scaled at load by trainplan's rule "
                                     "(sim/op_costs.hpp, derive_op_costs; written by trainplan cluster derive)",
                                     gpu, src.name)},
              {"derive", derive}};
  j["source"] = fmt::format("{}: GPU figures given to trainplan cluster derive; every other field (node, links, network, "
                            "collectives, runtime overhead{}{}) is {}'s, copied unchanged: edit them for this system. {}'s "
                            "source: {}",
                            gpu, f.has("price-usd") ? "" : ", price", f.has("power-w") ? "" : ", power", src.name,
                            src.name, src.source);
  j["calibration"] = fmt::format("Nothing measured on {}: the op tables are derived from {}'s (ops.source); the other "
                                 "fields are {}'s priors and assumptions.",
                                 gpu, src.name, src.name);
  return j;
}

int cluster_derive(const Args& args, const Context& ctx) {
  Flags f(args, "cluster derive");
  if (f.help()) {
    ctx.out << kHelp;
    return 0;
  }
  const std::string from = f.require("from");
  for (const char* required : {"name", "gpu-name", "peak-bf16", "peak-fp32", "hbm-gb", "hbm-bandwidth-gbps"}) {
    (void)f.require(required);
  }
  const std::string out = f.require("out");
  Cluster src;
  try {
    src = load_cluster(from, ctx.data_dir);
  } catch (const InputError& e) {
    throw InputError(fmt::format("--from: {}", e.what()));
  }
  if (const std::string why = not_a_derivation_source(src); !why.empty()) {
    throw InputError(fmt::format("--from {}: {}", from, why));
  }
  const std::filesystem::path src_path =
      from.find('/') == std::string::npos && std::filesystem::path(from).extension() != ".json"
          ? ctx.data_dir / "topologies" / (from + ".json")
          : std::filesystem::path(from);
  std::error_code ec;
  if (std::filesystem::equivalent(src_path, out, ec)) throw InputError(fmt::format("--out {}: is the --from file", out));
  auto out_file = open_json_output("out", out);
  const nlohmann::json j = derived_file(f, src, read_json_file(src_path), from_as_written(from, ctx.data_dir, out));
  f.finish();
  const Cluster derived = parse_cluster(j, out, ctx.data_dir);  // refuses what the loader would
  out_file->write(j);
  const OpDerivation& d = derived.ops.derivation;
  const std::string compute =
      d.gemm_achieved ? fmt::format("x {:.4g} (GEMM, by achieved rates), x {:.4g} (attention)", d.gemm_ratio,
                                    d.attention_fwd_ratio)
                      : fmt::format("x {:.4g} (GEMM, attention)", d.gemm_ratio);
  const std::string shapes =
      d.gemm_m_scale == 1 && d.gemm_k_scale == 1
          ? std::string()
          : fmt::format("; GEMMs at the measured efficiency of m x {:.4g}, k x {:.4g}", d.gemm_m_scale, d.gemm_k_scale);
  ctx.out << fmt::format("wrote {}: {} with {}'s tables {} and x {:.4g} (memory-bound){}\n", out, derived.gpu.name,
                         src.name, compute, d.memory_ratio, shapes);
  return 0;
}

}  // namespace

int cmd_cluster(const Args& args, const Context& ctx) {
  if (!args.empty() && args[0] == "derive") return cluster_derive(Args(args.begin() + 1, args.end()), ctx);
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    ctx.out << "usage: trainplan cluster derive [flags]   (trainplan cluster derive --help)\n";
    return 0;
  }
  throw InputError(fmt::format("{}: the action must be derive (trainplan cluster derive --help)",
                               args.empty() ? std::string("no action") : args[0]));
}

}  // namespace trainplan::cli
