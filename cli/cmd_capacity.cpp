// trainplan capacity: time, GPU-hours, cost and energy to train a token budget, per cluster kind
// and size, with the cheapest option meeting a deadline and the fastest within a budget.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "reports/csv.hpp"
#include "reports/search_report.hpp"
#include "sim/capacity.hpp"
#include "sim/check.hpp"
#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "cli/output.hpp"
#include "cli/plan_flags.hpp"
#include "sim/model_spec.hpp"

namespace trainplan::cli {

namespace {

const char* kHelp = R"(usage: trainplan capacity --model M --tokens T [flags] [--json FILE]

For each cluster kind and GPU count (whole nodes: 1, 2, 4, 8, ... nodes), searches the fastest
layout using exactly that many GPUs (as trainplan search --objective time --exact-gpus), and
reports the time to train T tokens, GPU-hours, cost (GPU-hours x the cluster's price per
GPU-hour) and energy (power per GPU x GPUs x hours). Then the cheapest option that meets
--deadline-days, the fastest that fits --budget-usd, and the cost/time Pareto front.

required:
  --model NAME|FILE         built-in model (models/NAME.json), model file or HF config.json
  --tokens T                tokens to train on: a number, optionally with K, M, B or T
                            (e.g. 15T = 15e12)

options:
  --software NAME|FILE      training stack costed (software/NAME.json; default megatron-core)
  --clusters a,b,c          cluster kinds (built-in names or files; default: every
                            built-in cluster with a scale-out network)
  --price CLUSTER=USD[,..]  price per GPU-hour of a cluster (by name) instead of its file's
                            assumed price, e.g. --price dgx-b200=4.2,mi300x=2.1
  --gpus-range lo..hi       GPU counts to consider (default: one node .. each cluster's size)
  --deadline-days D         find the cheapest option finishing within D days
  --budget-usd X            find the fastest option costing at most X USD
  --global-batch B          sequences per step (default: about 4M tokens per step, a power of two)
  --seq S                   tokens per sequence (default: the model's seq_len)
  --dtype bf16|fp16|fp8|fp32|mxfp8|nvfp4   training precision (default bf16; mxfp8 and nvfp4
                            need Blackwell; clusters without it are listed
                            as infeasible)
  --cuda-graphs none|full   kernels launched by the host (default) or replayed from one CUDA
                            graph per step (see trainplan predict --help)
  --cuda-graph-modules LIST per-layer CUDA graphs of every candidate, from attn, mlp, moe,
                            moe_router, moe_preprocess (default none; see trainplan predict --help)
  --threads N               worker threads per search (default: all hardware threads)

failures (goodput; defaults from reliability/default.json, which cites them):
  --mtbf-hours H            mean time between job-stopping failures of ONE GPU, hours (default
                            50677: Llama 3's 419 interruptions in 54 days on 16,384 H100s); the
                            job's MTBF is H / GPUs
  --checkpoint-gbps B       checkpoint write (and read) bandwidth per GPU, GB/s (default 0.122:
                            Llama 3's 2 TB/s storage over 16,384 GPUs)
  --restart-minutes R       detection, rescheduling and re-initialisation per failure, before the
                            checkpoint is read back (default 10, an assumption)
  --reliability NAME|FILE   defaults file (reliability/NAME.json; default "default")
  --elastic                 also search each option without one node, and the time to resume
  Each option gets its checkpoint size (model states), write time, Young/Daly interval
  sqrt(2 C MTBF_job), failures, lost work and restarts per day, goodput, and days/cost/energy
  with failures; the deadline, budget and Pareto front use the failure-aware figures.

%DP%

output:
  --json FILE               also write trainplan/capacity/v1 JSON with every printed figure
  --html FILE               also write an HTML report (days vs cost chart, picks; see trainplan
                            report)
  --csv FILE                also write one row per (cluster, GPU count) option as CSV (units in
                            the header row)

Exit status: 0 when some option is feasible, 3 when none is, 2 on bad input.
)";

// "15T", "1.5e12", "300B" -> tokens.
double parse_tokens(const std::string& v) {
  if (v.empty()) throw InputError("--tokens: must not be empty");
  double scale = 1;
  std::string number = v;
  switch (v.back()) {
    case 'K': case 'k': scale = 1e3; break;
    case 'M': case 'm': scale = 1e6; break;
    case 'B': case 'b': case 'G': case 'g': scale = 1e9; break;
    case 'T': case 't': scale = 1e12; break;
    default: break;
  }
  if (scale != 1) number.pop_back();
  const auto x = parse_decimal(number);
  if (!x || *x <= 0) {
    throw InputError(fmt::format("--tokens {}: must be a positive decimal number, optionally with K, M, B or T", v));
  }
  // A bound that keeps every derived figure (steps, days, cost) finite: a million times the
  // largest published pre-training run (about 1.5e13 tokens) is still far below it.
  // At least one token: a fraction of a token is no training run.
  constexpr double kMaxTokens = 1e19;
  if (*x * scale < 1) throw InputError(fmt::format("--tokens {}: must be at least 1 token", v));
  if (*x * scale > kMaxTokens) throw InputError(fmt::format("--tokens {}: must be at most 1e19 tokens", v));
  return *x * scale;
}

std::pair<int, int> parse_range(const std::string& v) {
  const auto dots = v.find("..");
  auto bad = [&] { return InputError(fmt::format("--gpus-range {}: must be lo..hi with 1 <= lo <= hi", v)); };
  if (dots == std::string::npos) throw bad();
  const auto lo = parse_integer(v.substr(0, dots)), hi = parse_integer(v.substr(dots + 2));
  if (!lo || !hi || *lo < 1 || *hi < *lo || *hi > (1 << 24)) throw bad();
  return {static_cast<int>(*lo), static_cast<int>(*hi)};
}

// --clusters a,b,c (default: every built-in cluster with a scale-out network), each loaded once.
std::vector<Cluster> read_clusters(const Flags& f, const std::filesystem::path& data_dir) {
  std::vector<std::string> names;
  if (auto list = f.get("clusters")) {
    names = split_list("clusters", *list);  // each named once (split_list refuses a repeat)
  } else {
    names = builtin_clusters(data_dir);
  }
  const bool every_builtin = !f.has("clusters");
  std::vector<Cluster> clusters;
  std::vector<std::string> loaded_from;  // the --clusters item of each of clusters
  for (const auto& n : names) {
    Cluster c;
    try {
      c = load_cluster(n, data_dir);
    } catch (const InputError& e) {
      throw InputError(fmt::format("--clusters: {}", e.what()));
    }
    // By default only GPU clusters that scale out: single hosts (cpu-local) are for exec runs.
    if (every_builtin && c.network.empty()) continue;
    // Options, picks and the report's series are keyed by cluster name: the same cluster given
    // twice (a name and its file) or two files of one name would be listed as one.
    for (std::size_t k = 0; k < clusters.size(); ++k) {
      if (clusters[k].name == c.name) {
        const std::string given = every_builtin ? std::string("(every built-in cluster)") : *f.get("clusters");
        throw InputError(fmt::format("--clusters {}: {} and {} are both cluster '{}'", given, loaded_from[k], n, c.name));
      }
    }
    clusters.push_back(std::move(c));
    loaded_from.push_back(n);
  }
  return clusters;
}

// --price NAME=USD,...: prices per GPU-hour by cluster name, each a named cluster's, once.
std::map<std::string, double> read_prices(const Flags& f, const std::vector<Cluster>& clusters) {
  std::map<std::string, double> prices;
  const auto list = f.get("price");
  if (!list) return prices;
  std::vector<std::string> names;
  for (const Cluster& c : clusters) names.push_back(c.name);
  for (const std::string& item : split_list("price", *list)) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw InputError(fmt::format("--price {}: each item must be CLUSTER=USD (USD per GPU-hour)", item));
    }
    const std::string name = item.substr(0, eq);
    const auto usd = parse_decimal(item.substr(eq + 1));
    if (!usd || *usd <= 0 || *usd > 1e6) {
      throw InputError(fmt::format("--price {}: the price must be a decimal number of USD per GPU-hour in (0, 1e6]", item));
    }
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      throw InputError(fmt::format("--price {}: {} is not one of the clusters compared ({})", item, name,
                                   fmt::join(names, ", ")));
    }
    if (!prices.emplace(name, *usd).second) throw InputError(fmt::format("--price {}: prices {} twice", *list, name));
  }
  return prices;
}

// --reliability NAME|FILE with --mtbf-hours, --checkpoint-gbps and --restart-minutes over it.
Reliability read_reliability_flags(const Flags& f, const std::filesystem::path& data_dir) {
  Reliability rel = load_reliability(f.get_or("reliability", "default"), data_dir);
  rel.mtbf_gpu_hours = f.get_double("mtbf-hours", rel.mtbf_gpu_hours, kMtbfHoursMin, kMtbfHoursMax);
  rel.checkpoint_per_gpu =
      f.get_double("checkpoint-gbps", rel.checkpoint_per_gpu / kGB, kCheckpointGbpsMin, kCheckpointGbpsMax) * kGB;
  rel.restart = f.get_double("restart-minutes", rel.restart / 60, 0, kRestartMinutesMax) * 60;
  return rel;
}

// The data-parallel part of every search space (read_dp_space_flags).
void read_dp_flags(const Flags& f, CapacityRequest& req) {
  SearchSpace dp_space;
  read_dp_space_flags(f, dp_space);
  req.dp_algorithms = dp_space.dp_algorithms;
  req.grad_compressions = dp_space.grad_compressions;
  req.ps_servers = dp_space.ps_servers;
  req.ps_placement = dp_space.ps_placement;
  req.fp32_grad_accum = dp_space.fp32_grad_accum;
}

}  // namespace

int cmd_capacity(const Args& args, const Context& ctx) {
  Flags f(args, "capacity", {"elastic"});
  if (f.help()) {
    std::string help = kHelp;
    help.replace(help.find("%DP%\n"), 5, dp_space_flags_help() + "\n" + expert_space_flags_help());
    ctx.out << help;
    return 0;
  }
  CommandFiles files(f, ctx, {"json", "html", "csv"});  // before any input is read
  const ModelSpec model = load_model(f.require("model"), ctx.data_dir);
  const double tokens = parse_tokens(f.require("tokens"));
  CapacityRequest req;
  req.tokens = tokens;
  req.software = read_software_flag(f, ctx.data_dir);
  req.attention = req.software.default_attention;
  req.clusters = read_clusters(f, ctx.data_dir);
  req.prices = read_prices(f, req.clusters);
  if (auto range = f.get("gpus-range")) std::tie(req.gpus_lo, req.gpus_hi) = parse_range(*range);
  const int seq = static_cast<int>(f.get_int("seq", model.seq_len, 1, 1 << 24));
  // Default batch: about 4M tokens per step, rounded to a power of two of sequences.
  const int default_batch = std::max(1, static_cast<int>(std::exp2(std::round(std::log2(4194304.0 / seq)))));
  req.global_batch = static_cast<int>(f.get_int("global-batch", default_batch, 1, 1 << 30));
  if (static_cast<long long>(req.global_batch) * seq > kMaxTokensPerStep) {
    throw InputError(fmt::format("--global-batch {}: global batch x sequence length ({} x {}) must be at most 2^40 tokens "
                                 "per step",
                                 req.global_batch, req.global_batch, seq));
  }
  if (f.has("deadline-days")) req.deadline_days = f.get_double("deadline-days", 0, 1e-6, 1e6);
  if (f.has("budget-usd")) req.budget_usd = f.get_double("budget-usd", 0, 1e-6, 1e15);
  req.dtype = *parse_dtype(f.get_choice("dtype", "bf16", {"bf16", "fp16", "fp8", "fp32", "mxfp8", "nvfp4"}));
  req.cuda_graphs = read_cuda_graphs(f, req.cuda_graphs);
  req.cuda_graph_modules = read_cuda_graph_modules(f, req.cuda_graph_modules);
  req.threads = static_cast<int>(f.get_int("threads", 0, 1, 1024));
  req.reliability = read_reliability_flags(f, ctx.data_dir);
  req.elastic = f.has("elastic");
  read_dp_flags(f, req);
  read_expert_space_flags(f, model, req.software, req.experts);
  f.finish();
  bool any_count = false;
  for (const Cluster& c : req.clusters) any_count |= !capacity_gpu_counts(c, req.gpus_lo, req.gpus_hi).empty();
  if (!any_count) {
    throw InputError(fmt::format("--gpus-range {}..{}: holds no whole-node power-of-two GPU count of the clusters",
                                 req.gpus_lo, req.gpus_hi));
  }

  const LayerGraph graph(model, seq);
  const CapacityResult r = plan_capacity(graph, req);
  const CapacityContext cc{model.name, tokens, req.global_batch, seq, req.deadline_days, req.budget_usd};
  // Everything is computed and rendered before the first line is printed or file written.
  const auto doc = capacity_to_json(r, cc);
  check_finite(doc);
  if (files.wants("json")) files.stage_json("json", doc);
  if (files.wants("html")) files.stage("html", html_page(doc, fmt::format("trainplan capacity: {}", model.name)));
  if (files.wants("csv")) files.stage("csv", capacity_to_csv(r, cc));
  // Notes only once nothing can be refused any more: a refusal is exactly one line.
  print_notes(ctx.err, "capacity", {f.has("seq") ? std::string() : sequence_note(model), dropout_note(model, req.software)});
  for (const Cluster& c : req.clusters) print_notes(ctx.err, "capacity", {attention_kernel_note(c, req.software)});
  print_capacity(ctx.out, r, cc);
  files.commit();
  return r.pareto.empty() ? 3 : 0;
}

}  // namespace trainplan::cli
