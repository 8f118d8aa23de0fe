// trainplan search: every valid layout of a model on a cluster, predicted and ranked.
#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "reports/csv.hpp"
#include "reports/search_report.hpp"
#include "sim/check.hpp"
#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "cli/output.hpp"
#include "cli/plan_flags.hpp"
#include "sim/cluster.hpp"
#include "sim/layer_graph.hpp"
#include "sim/model_spec.hpp"
#include "sim/search.hpp"

namespace trainplan::cli {

namespace {

const char* kHelp = R"(usage: trainplan search --model M --cluster C --gpus N --global-batch B [flags] [--json FILE]

Enumerates every valid layout -- (dp, tp, pp, cp) factorizations using at most N GPUs in whole
nodes (or a divisor of one node), times micro-batch size, schedule (1f1b, interleaved with vp),
ZeRO stage, recomputation and sequence parallelism -- predicts each, and ranks the feasible ones.
Pruning skips only candidates proven out of memory or proven unable to reach the top K (or the
reported Pareto front), so the ranking equals a brute-force search.

required:
  --model NAME|FILE         built-in model (models/NAME.json), model file or HF config.json
  --cluster NAME|FILE       built-in cluster (topologies/NAME.json) or a topology file
  --software NAME|FILE      training stack costed (software/NAME.json; default megatron-core)
  --gpus N                  GPUs available (layouts may use fewer, see --exact-gpus); capped at
                            the cluster's size
  --global-batch B          sequences per optimizer step

search:
  --seq S                   tokens per sequence (default: the model's seq_len)
  --top K                   layouts to list (default 10)
  --refine on|off           simulate the analytic top max(K, %WINDOW%) with the discrete-event step
                            simulator and list the best K of them (default on): the best layout
                            is the same for any K up to %WINDOW%
  --objective throughput|cost|time
                            throughput: most tokens/s; time: shortest step (the same order for
                            a fixed global batch); cost: fewest USD per step (price per GPU-hour
                            x GPUs x step time). Default throughput
  --exact-gpus              only layouts using exactly N GPUs
  --dtype bf16|fp16|fp8|fp32|mxfp8|nvfp4   training precision (default bf16; mxfp8 and nvfp4, the
                                     block-scaled formats, need a GPU with their peak: Blackwell)
  --attention flash|standard         attention kernel (default: the software profile's:
                                     standard for megatron-lm-2021 and megatron-deepspeed,
                                     flash for the others)
  --cuda-graphs none|full            every candidate launches its kernels from the host
                                     (default) or replays its forward and backward from one
                                     CUDA graph per step (see trainplan predict --help)
  --cuda-graph-modules LIST          per-layer CUDA graphs of every candidate, from attn, mlp,
                                     moe, moe_router, moe_preprocess (default none; candidates
                                     with full recomputation are then left out; see trainplan
                                     predict --help)
  --zero LIST               ZeRO stages to try, e.g. 0,1 (default 0,1,2,3)
  --recompute LIST          from none,selective,full (default none,full with flash attention,
                            where selective keeps none's memory and adds the attention core's
                            recomputation, so it never wins; all three with standard)
  --schedules LIST          from gpipe,1f1b,interleaved (default 1f1b,interleaved; gpipe predicts
                            the 1f1b step time with at least its memory)
  --max-tp T                largest tensor-parallel size (default: GPUs per scale-up domain)
  --max-pp P                largest pipeline depth (default: the model's layers)
  --max-cp C                largest context-parallel size (default: GPUs per scale-up domain, and at least
                            1024 tokens per rank)
  --max-dp D                largest data-parallel size (default: no limit)
  --max-vp V                largest interleaving factor (default 8)
  --max-micro-batch b       largest micro-batch (default: no limit)
  --pareto-window X         report the step-time/memory Pareto front up to X times the best
                            step time (default 1.25; larger prunes less)
  --threads N               worker threads (default: all hardware threads)

%DP%
%EXPERTS%
output:
  --json FILE               also write trainplan/search/v1 JSON (top entries are
                            trainplan/prediction/v1 objects; usable as trainplan predict --plan),
                            with the feasible candidates' step time and peak memory (thinned
                            to 2000 points, the Pareto front kept whole) for trainplan report
  --html FILE               also write an HTML report (step time vs memory scatter, Pareto
                            front, top layouts; see trainplan report)
  --csv FILE                also write the top, Pareto and infeasible lists as CSV (units in
                            the header row)

Exit status: 0 with a feasible layout, 3 when none fits, 2 on bad input.
)";

std::optional<int> parse_zero(const std::string& s) {
  if (s.size() == 1 && s[0] >= '0' && s[0] <= '3') return s[0] - '0';
  return std::nullopt;
}

// Draws "[#####     ] 45%" on `err`, rewriting the line.
void draw_progress(std::ostream& err, std::int64_t done, std::int64_t total) {
  const int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
  err << "\r[" << std::string(filled, '#') << std::string(width - filled, ' ')
      << fmt::format("] {:3d}% of {} layouts", total > 0 ? static_cast<int>(100 * done / total) : 100, total)
      << (done >= total ? "\n" : "") << std::flush;
}

// The space to search: the cluster's defaults (default_space) narrowed by the flags.
SearchSpace read_space_flags(const Flags& f, const ModelSpec& model, const Cluster& cluster, const Software& software,
                             int gpus, int global_batch, int seq) {
  const Attention attention =
      *parse_attention(f.get_choice("attention", to_string(software.default_attention), {"flash", "standard"}));
  SearchSpace space = default_space(cluster, gpus, global_batch, seq, attention);
  space.exact_gpus = f.has("exact-gpus");
  if (space.exact_gpus && gpus > cluster.max_gpus()) {
    throw InputError(fmt::format("--gpus {}: --exact-gpus needs at most the cluster's {} GPUs", gpus, cluster.max_gpus()));
  }
  space.dtype = *parse_dtype(f.get_choice("dtype", "bf16", {"bf16", "fp16", "fp8", "fp32", "mxfp8", "nvfp4"}));
  space.cuda_graphs = read_cuda_graphs(f, space.cuda_graphs);
  space.cuda_graph_modules = read_cuda_graph_modules(f, space.cuda_graph_modules);
  space.zero_stages = list_flag<int>(f, "zero", "0,1,2,3", parse_zero, space.zero_stages);
  space.recompute = list_flag<Recompute>(f, "recompute", "none,selective,full", parse_recompute, space.recompute);
  space.schedules = list_flag<ScheduleKind>(f, "schedules", "gpipe,1f1b,interleaved", parse_schedule, space.schedules);
  read_dp_space_flags(f, space);
  read_expert_space_flags(f, model, software, space.experts);
  // Full recomputation recomputes every module: a space of it alone has no module sets to try.
  if (only_full_recompute(space) && !f.has("recompute-modules")) space.experts.recompute_modules = 0;
  space.max_tp = static_cast<int>(f.get_int("max-tp", space.max_tp, 1, 1 << 16));
  space.max_pp = static_cast<int>(f.get_int("max-pp", model.layers, 1, 1 << 16));
  space.max_cp = static_cast<int>(f.get_int("max-cp", space.max_cp, 1, 1 << 16));
  space.max_dp = static_cast<int>(f.get_int("max-dp", 0, 1, 1 << 24));
  space.max_vp = static_cast<int>(f.get_int("max-vp", space.max_vp, 1, 1 << 10));
  space.max_micro_batch = static_cast<int>(f.get_int("max-micro-batch", 0, 1, 1 << 24));
  // Flags that leave no schedule possible are bad input (as --dp-algorithms ps --zero 3), not a
  // search that found nothing: the interleaved schedule needs pp >= 2 and vp >= 2.
  const bool only_interleaved = std::all_of(space.schedules.begin(), space.schedules.end(),
                                            [](ScheduleKind k) { return k == ScheduleKind::interleaved; });
  for (const auto& [flag, limit] : {std::pair{"max-pp", space.max_pp}, std::pair{"max-vp", space.max_vp}}) {
    if (only_interleaved && limit < 2 && f.has(flag)) {
      throw InputError(fmt::format("--schedules {} and --{} {}: the interleaved schedule needs pp >= 2 and vp >= 2; "
                                   "allow more, or add 1f1b or gpipe to --schedules",
                                   *f.get("schedules"), flag, limit));
    }
  }
  return space;
}

}  // namespace

int cmd_search(const Args& args, const Context& ctx) {
  Flags f(args, "search", {"exact-gpus"});
  if (f.help()) {
    std::string help = kHelp;
    help.replace(help.find("%DP%\n"), 5, dp_space_flags_help() + "\n");
    help.replace(help.find("%EXPERTS%\n"), 10, expert_space_flags_help() + "\n");
    for (std::size_t at; (at = help.find("%WINDOW%")) != std::string::npos;) help.replace(at, 8, std::to_string(kRefineWindow));
    ctx.out << help;
    return 0;
  }
  CommandFiles files(f, ctx, {"json", "html", "csv"});  // before any input is read
  const ModelSpec model = load_model(f.require("model"), ctx.data_dir);
  const Cluster cluster = load_cluster(f.require("cluster"), ctx.data_dir);
  const Software software = read_software_flag(f, ctx.data_dir);
  const auto gpus_flag = f.get_optional_int("gpus", 1, 1 << 24);
  if (!gpus_flag) f.require("gpus");
  const auto batch_flag = f.get_optional_int("global-batch", 1, 1 << 30);
  if (!batch_flag) f.require("global-batch");
  const int gpus = static_cast<int>(*gpus_flag), global_batch = static_cast<int>(*batch_flag);
  const int seq = static_cast<int>(f.get_int("seq", model.seq_len, 1, 1 << 24));

  const SearchSpace space = read_space_flags(f, model, cluster, software, gpus, global_batch, seq);

  SearchOptions options;
  options.objective = *parse_objective(f.get_choice("objective", "throughput", {"throughput", "cost", "time"}));
  options.top_k = static_cast<int>(f.get_int("top", 10, 1, 10000));
  options.threads = static_cast<int>(f.get_int("threads", 0, 1, 1024));
  options.pareto_window = f.get_double("pareto-window", 1.25, 1.0, 1e6);
  options.refine = f.get_choice("refine", "on", {"on", "off"}) == "on";
  f.finish();
  options.keep_points = files.wants("json") || files.wants("html");
  if (ctx.out_is_terminal) {
    options.progress = [&ctx](std::int64_t done, std::int64_t total) { draw_progress(ctx.err, done, total); };
  }

  const LayerGraph graph(model, seq);
  SearchResult result = search(graph, cluster, software, space, options);
  const SearchContext sc{model.name,  cluster.name, &space, options.objective, options.pareto_window,
                         &model,      software.name, cluster.gpu.hbm};
  // Everything is computed and rendered before the first line is printed or file written.
  const auto doc = search_to_json(result, sc);
  check_finite(doc);
  if (files.wants("json")) files.stage_json("json", doc);
  if (files.wants("html")) {
    files.stage("html", html_page(doc, fmt::format("trainplan search: {} on up to {} x {}", model.name, gpus, cluster.name)));
  }
  if (files.wants("csv")) files.stage("csv", search_to_csv(result, sc));
  // Notes only once nothing can be refused any more: a refusal is exactly one line.
  print_notes(ctx.err, "search", {f.has("seq") ? std::string() : sequence_note(model), dropout_note(model, software), attention_kernel_note(cluster, software)});
  print_search(ctx.out, result, sc);
  files.commit();
  return result.top.empty() ? 3 : 0;
}

}  // namespace trainplan::cli
