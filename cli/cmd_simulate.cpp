// trainplan simulate: one training step simulated event by event (sim/simulate.hpp).
#include <fmt/format.h>

#include <filesystem>
#include <sstream>
#include <optional>

#include "reports/chrome_trace.hpp"
#include "reports/console.hpp"
#include "reports/prediction_json.hpp"
#include "sim/check.hpp"
#include "cli/commands.hpp"
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
(in buckets, overlapped with the backward), gathers ZeRO-3 parameters (prefetched one slot
ahead) and gathers updated parameters on a data-parallel stream. Op costs are predict's. Prints
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
  --json FILE               write the trainplan/prediction/v1 JSON with the simulated time
                            ("engine": "des") and a "simulation" object: step_s and per stage
                            its ranks, busy/idle seconds and share, waits and stream loads
)";

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

}  // namespace

int cmd_simulate(const Args& args, const Context& ctx) {
  Flags f(args, "simulate");
  if (f.help()) {
    ctx.out << kHelp << plan_flags_help() << kOutputHelp;
    return 0;
  }
  const PlanInputs in = read_plan_flags(f, ctx.data_dir);
  auto json_out = open_json_output("json", f.get("json"));
  const auto trace_path = f.get("trace");
  if (trace_path) check_output_path(*trace_path, fmt::format("--trace {}", *trace_path));
  check_outputs_apart(f, {"json", "trace"});
  f.finish();
  if (!in.seq_note.empty()) ctx.err << "trainplan simulate: note: " << in.seq_note << "\n";
  if (auto too_large = simulation_size_error(in.strategy)) throw InputError(*too_large);

  const Strategy& s = in.strategy;
  const LayerGraph graph(in.model, s.seq_len);
  // Step costs computed once: the closed form and the simulator both read them.
  std::optional<StepCosts> costs;
  if (!cannot_cost(graph, in.cluster, s)) costs = step_costs(graph, in.cluster, in.software, s);
  const Estimate analytic = costs ? compose(*costs, graph, in.cluster, s) : predict(graph, in.cluster, in.software, s);
  const std::string title = fmt::format("{} on {} x {} ({}), {:.2f}B parameters", in.model.name, s.gpus(),
                                        in.cluster.gpu.name, in.cluster.name, graph.total_params() / 1e9);
  if (!(analytic.time.step > 0)) {  // invalid plan: nothing to simulate
    print_prediction(ctx.out, analytic, title);
    return 3;
  }
  const Schedule schedule = schedule_for(s);
  const Timeline timeline = simulate(*costs, schedule);
  const Estimate e = refine_with_simulation(analytic, timeline);
  const auto ranks = replica_stage_ranks(s);

  print_prediction(ctx.out, e, title + " -- simulated step (discrete-event)");
  ctx.out << fmt::format("\nsimulated step time: {} ({} schedule, {} stage(s) x {} chunk(s), {} micro-batches); "
                         "analytic estimate {} (simulated {:+.1f}%)\n",
                         format_seconds(timeline.step), to_string(s.schedule), s.pp, s.vp, s.micro_batches(),
                         format_seconds(analytic.time.step),
                         100 * (timeline.step - analytic.time.step) / analytic.time.step);
  print_usage_table(ctx.out, timeline, ranks);

  if (trace_path) {
    std::ostringstream trace;
    write_chrome_trace(trace, timeline, ranks, title);
    write_file_atomically(*trace_path, trace.str(), fmt::format("--trace {}", *trace_path));
    ctx.out << fmt::format("\ntrace: {} ({} ranks x {} streams)\n", *trace_path, s.pp * s.tp * s.cp, kStreams);
  }
  if (json_out) {
    json_out->write(prediction_to_json(e, {{"model", in.model.name},
                                           {"cluster", in.cluster.name},
                                           {"engine", "des"},
                                           {"simulation", timeline_summary_json(timeline, ranks)}}));
  }
  return e.feasible ? 0 : 3;
}

}  // namespace trainplan::cli
