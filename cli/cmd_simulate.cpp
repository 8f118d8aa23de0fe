// trainplan simulate: one training step simulated event by event (sim/simulate.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "reports/chrome_trace.hpp"
#include "reports/console.hpp"
#include "reports/prediction_json.hpp"
#include "sim/check.hpp"
#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "sim/atomic_file.hpp"
#include "cli/plan_flags.hpp"
#include "sim/predict.hpp"
#include "sim/simulate.hpp"

namespace trainplan::cli {

namespace {

const char* kHelp = R"(usage: trainplan simulate --model M --cluster C --gpus N --global-batch B [layout flags]
                          [--trace FILE] [--json FILE]

Simulates one training step event by event: every pipeline stage of one data-parallel replica
runs its pipeline schedule (GPipe, 1F1B or interleaved 1F1B) on a compute stream, sends
activations and gradients to its neighbours on point-to-point streams, and reduces gradients
(in buckets, overlapped with the backward), gathers ZeRO-3 parameters (under the slot that
uses them) and gathers updated parameters on a data-parallel stream. Op costs are predict's. Prints
the simulated step time and its breakdown (read on the busiest stage), memory as predicted,
and how busy and idle each rank's compute stream is. All TP/CP ranks of a stage, and all
data-parallel replicas, run the same timeline.
Exit status: 0 feasible, 3 infeasible (reasons printed; the step is still simulated when it
can be), 2 bad input.

)";

const char* kOutputHelp = R"(output:
  --trace FILE              write the timeline as Chrome trace event JSON (open it in
                            https://ui.perfetto.dev or chrome://tracing): one process per rank,
                            one thread per stream (compute, pp send activations, pp send
                            gradients, dp collectives), times in microseconds, and flow
                            arrows from each send to the slot that waited for it
  --trace-ranks LIST        only these ranks in the trace, e.g. 0-7,64 (a trace of every
                            rank of a large job runs to hundreds of MB); the trace shows
                            data-parallel replica 0, so LIST must name some of its ranks
  --json FILE               write the trainplan/prediction/v1 JSON with the simulated time
                            ("engine": "des") and a "simulation" object: step_s and per stage
                            its ranks, busy/idle seconds and share, waits and stream loads,
                            and "timeline": every event (stream, kind, micro-batch, start, end)
                            per stage
  --html FILE               write an HTML report with the timeline as a Gantt chart (see
                            trainplan report)
)";

// The most (ranks shown x schedule slots of their stage) a --trace may hold: ~0.8 GB of trace.
constexpr long long kMaxTraceRankSlots = 1LL << 21;

// "0-7", "0,2,4" or "8-15,24-31": ascending ranks as ranges.
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

void print_usage_table(std::ostream& os, const Timeline& t, const std::vector<std::vector<int>>& ranks) {
  os << "\nper-rank compute stream (every rank of a stage alike):\n";
  os << fmt::format("  {:>5}  {:<16} {:>12} {:>12} {:>6} {:>6}   {:>12} {:>12} {:>12}\n", "stage", "ranks", "busy",
                    "idle", "busy", "idle", "wait bubble", "wait p2p", "wait dp");
  for (std::size_t i = 0; i < t.stages.size(); ++i) {
    const StageUsage& u = t.stages[i];
    const int s = static_cast<int>(i);
    os << fmt::format("  {:>5}  {:<16} {:>12} {:>12} {:>5.1f}% {:>5.1f}%   {:>12} {:>12} {:>12}\n", u.stage,
                      rank_ranges(ranks[i]), format_seconds(u.busy()), format_seconds(t.idle(s)),
                      100 * t.busy_share(s), 100 * t.idle_share(s), format_seconds(u.wait_bubble),
                      format_seconds(u.wait_pp), format_seconds(u.wait_dp));
  }
}

// --trace-ranks "0-7,64": `stage_ranks` with every rank not listed replaced by -1. InputError for a
// malformed list, a rank outside 0..gpus-1 or named twice, or a list naming none of `stage_ranks`.
std::vector<std::vector<int>> select_ranks(const std::string& list, int gpus,
                                           std::vector<std::vector<int>> stage_ranks) {
  std::vector<bool> keep(static_cast<std::size_t>(gpus), false);
  auto bad = [&](const std::string& why) { return InputError(fmt::format("--trace-ranks {}: {}", list, why)); };
  auto rank = [&](const std::string& t) {
    const auto parsed = parse_integer(t);
    if (!parsed || *parsed < 0) throw bad(fmt::format("'{}' is not a rank (a whole number)", t));
    const long long v = *parsed;
    if (v >= gpus) throw bad(fmt::format("rank {} is not among the plan's {} ranks (0..{})", v, gpus, gpus - 1));
    return static_cast<int>(v);
  };
  for (const std::string& item : split_list("trace-ranks", list)) {
    const auto dash = item.find('-', 1);
    const int lo = rank(item.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : rank(item.substr(dash + 1));
    if (hi < lo) throw bad(fmt::format("range {} must be lo-hi with lo <= hi", item));
    // A rank in two items (0-3,2) is named twice, as the same item twice is (split_list).
    for (int r = lo; r <= hi; ++r) {
      if (keep[static_cast<std::size_t>(r)]) throw repeated_item("trace-ranks", list, std::to_string(r));
      keep[static_cast<std::size_t>(r)] = true;
    }
  }
  std::vector<int> all;
  for (const auto& stage : stage_ranks) all.insert(all.end(), stage.begin(), stage.end());
  std::sort(all.begin(), all.end());
  bool shown = false;
  for (auto& stage : stage_ranks) {
    for (int& r : stage) {
      if (!keep[static_cast<std::size_t>(r)]) r = -1;
      shown |= r >= 0;
    }
  }
  if (!shown) {
    throw bad(fmt::format("names no rank of data-parallel replica 0, which the trace shows ({})", rank_ranges(all)));
  }
  return stage_ranks;
}

long long shown_ranks(const std::vector<std::vector<int>>& stage_ranks) {
  long long shown = 0;
  for (const auto& stage : stage_ranks) shown += std::count_if(stage.begin(), stage.end(), [](int r) { return r >= 0; });
  return shown;
}

// The trace holds every slot of a stage once per rank it shows (measured: ~400 bytes of trace per
// rank and slot, Llama-3-8B with tp 8, pp 4 and 32 to 256 micro-batches), so its size is bounded
// before the step is simulated: a legal layout of thousands of ranks made a trace of many GB.
void check_trace_size(const Strategy& s, const std::vector<std::vector<int>>& stage_ranks) {
  const long long rank_slots = shown_ranks(stage_ranks) * (simulated_slots(s) / s.pp);
  if (rank_slots <= kMaxTraceRankSlots) return;
  throw InputError(fmt::format("--trace: {} ranks x {} schedule slots each is {} rank-slots, more than the {} a trace "
                               "may hold (~400 bytes each); choose ranks with --trace-ranks or lower --global-batch",
                               shown_ranks(stage_ranks), simulated_slots(s) / s.pp, rank_slots, kMaxTraceRankSlots));
}

// With --trace: the ranks the trace shows per stage, data-parallel replica 0's (with --trace-ranks
// LIST only those listed, the others -1), checked to make a trace of bounded size. Without: none.
std::vector<std::vector<int>> traced_stage_ranks(const std::optional<std::string>& list, bool tracing,
                                                 const Strategy& s) {
  if (!tracing) return {};
  std::vector<std::vector<int>> traced = list ? select_ranks(*list, s.gpus(), replica_stage_ranks(s))
                                              : replica_stage_ranks(s);
  check_trace_size(s, traced);
  return traced;
}

// The prediction document simulate writes for `e`: the model, cluster and software it is for, and
// the discrete-event simulator as its engine.
PredictionDoc des_prediction(const Estimate& e, const PlanInputs& in) {
  PredictionDoc prediction = prediction_doc(e);
  prediction.model = in.model.name;
  prediction.model_spec = in.model;
  prediction.cluster = in.cluster.name;
  prediction.software = in.software.name;
  prediction.engine = "des";
  return prediction;
}

// The outputs of a plan that cannot be simulated still say so (as predict's do), rather than
// leave an earlier run's files looking current: the analytic prediction, and an empty trace.
void stage_not_simulated(CommandFiles& files, const Estimate& analytic, const PlanInputs& in, const std::string& title) {
  const auto doc = prediction_to_json(des_prediction(analytic, in));
  check_finite(doc);
  if (files.wants("json")) files.stage_json("json", doc);
  if (files.wants("html")) files.stage("html", html_page(doc, title + " -- not simulated"));
  if (files.wants("trace")) {
    files.stage("trace", [&](std::ostream& os) {
      write_chrome_trace(os, Timeline{}, {}, title + " -- not simulated: the plan is infeasible");
    });
  }
}

// One simulated step: its timeline, the estimate refined by it, and the ranks of each pipeline
// stage of data-parallel replica 0, which the timeline stands for.
struct SimulatedStep {
  Timeline timeline;
  Estimate estimate;
  std::vector<std::vector<int>> ranks;
};

SimulatedStep simulate_step(const StepCosts& costs, const Estimate& analytic, const Strategy& s) {
  SimulatedStep step;
  const Schedule schedule = schedule_for(s);
  step.timeline = simulate(costs, schedule);
  step.estimate = refine_with_simulation(analytic, step.timeline);
  step.ranks = replica_stage_ranks(s);
  return step;
}

// Stages the outputs of a simulated step, before anything is printed: the JSON and HTML reports
// (with the parameter counts and the simulation) and the trace of the `traced` ranks.
void stage_simulated(CommandFiles& files, const PlanInputs& in, const LayerGraph& graph, const SimulatedStep& step,
                     const std::vector<std::vector<int>>& traced, const std::string& title) {
  PredictionDoc prediction = des_prediction(step.estimate, in);
  prediction.parameters = parameter_counts(graph);
  // Every event only for the outputs that carry it: large.
  prediction.simulation = simulation_doc(step.timeline, step.ranks, files.wants("json") || files.wants("html"));
  const auto doc = prediction_to_json(prediction);
  check_finite(doc);
  if (files.wants("json")) files.stage_json("json", doc);
  if (files.wants("html")) files.stage("html", html_page(doc, title + " -- simulated step"));
  // Written to its file as it is formatted: a trace of many ranks is never held in memory.
  if (files.wants("trace")) {
    files.stage("trace", [&](std::ostream& os) { write_chrome_trace(os, step.timeline, traced, title); });
  }
}

// The simulated step on the console: the estimate it refines, its time against the analytic
// estimate's, and each stage's compute stream.
void print_simulated_step(std::ostream& os, const SimulatedStep& step, const Estimate& analytic, const Strategy& s,
                          const std::string& title) {
  const Timeline& timeline = step.timeline;
  print_prediction(os, step.estimate, title + " -- simulated step (discrete-event)");
  os << fmt::format("\nsimulated step time: {} ({} schedule, {} stage(s) x {} chunk(s), {} micro-batches); "
                    "analytic estimate {} (simulated {:+.1f}%)\n",
                    format_seconds(timeline.step), to_string(s.schedule), s.pp, s.vp, s.micro_batches(),
                    format_seconds(analytic.time.step),
                    100 * (timeline.step - analytic.time.step) / analytic.time.step);
  print_usage_table(os, timeline, step.ranks);
}

}  // namespace

int cmd_simulate(const Args& args, const Context& ctx) {
  Flags f(args, "simulate");
  if (f.help()) {
    ctx.out << kHelp << plan_flags_help() << kOutputHelp;
    return 0;
  }
  CommandFiles files(f, ctx, {"json", "trace", "html"});  // before any input is read
  const PlanInputs in = read_plan_flags(f, ctx.data_dir);
  const bool tracing = files.wants("trace");
  const auto trace_ranks = f.get("trace-ranks");
  if (trace_ranks && !tracing) throw InputError(fmt::format("--trace-ranks {}: needs --trace FILE", *trace_ranks));
  f.finish();
  // Notes only once nothing can be refused any more: a refusal is exactly one line.
  auto print_note = [&] { print_notes(ctx.err, "simulate", {in.seq_note, in.split_note, dropout_note(in.model, in.software), attention_kernel_note(in.cluster, in.software)}); };
  if (auto too_large = simulation_size_error(in.strategy)) throw InputError(*too_large);

  const Strategy& s = in.strategy;
  const std::vector<std::vector<int>> traced = traced_stage_ranks(trace_ranks, tracing, s);
  const LayerGraph graph(in.model, s.seq_len);
  // Step costs computed once: the closed form and the simulator both read them.
  std::optional<StepCosts> costs;
  if (!cannot_cost(graph, in.cluster, s)) costs = step_costs(graph, in.cluster, in.software, s);
  const Estimate analytic = costs ? compose(*costs, graph, in.cluster, s) : predict(graph, in.cluster, in.software, s);
  const std::string title = fmt::format("{} on {} x {} ({}), {}", in.model.name, s.gpus(), in.cluster.gpu.name,
                                        in.cluster.name, parameters_text(graph));
  if (!(analytic.time.step > 0)) {  // invalid plan: nothing to simulate
    stage_not_simulated(files, analytic, in, title);
    print_note();
    print_prediction(ctx.out, analytic, title);
    files.commit();
    return 3;
  }
  const SimulatedStep step = simulate_step(*costs, analytic, s);
  // Everything is computed and rendered before the first line is printed or file written.
  stage_simulated(files, in, graph, step, traced, title);
  print_note();
  print_simulated_step(ctx.out, step, analytic, s, title);
  if (tracing) {
    const long long shown = shown_ranks(traced);
    ctx.out << fmt::format("\ntrace: {} ({} rank{} x {} streams)\n", printable(files.path("trace")), shown,
                           shown == 1 ? "" : "s", step.timeline.rank_streams());
  }
  files.commit();
  return step.estimate.feasible ? 0 : 3;
}

}  // namespace trainplan::cli
