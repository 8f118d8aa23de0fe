#include "reports/search_report.hpp"

#include <fmt/format.h>

#include "reports/console.hpp"
#include "reports/infeasible.hpp"
#include "reports/prediction_json.hpp"
#include "reports/svg.hpp"
#include "sim/check.hpp"

namespace trainplan {

using nlohmann::json;

namespace {


const char* value_unit(Objective o) {
  switch (o) {
    case Objective::throughput: return "tokens/s";
    case Objective::cost: return "USD/step";
    case Objective::time: return "s/step";
  }
  return "";
}

// The objective value as the user reads it (throughput is ranked as minus tokens/s).
double shown_value(Objective o, double v) { return o == Objective::throughput ? -v : v; }

void print_counts(std::ostream& os, const SearchStats& st) {
  os << fmt::format("searched {} candidate layouts ({} dp x tp x pp x cp factorizations, up to {} GPUs) in {} on {} threads:\n",
                    st.candidates, st.layouts, st.max_gpus_considered, format_seconds(st.elapsed_s), st.threads);
  os << fmt::format("  {} predicted ({} feasible), {} proven out of memory by the model-state bound, "
                    "{} proven by the step-time bound to miss both the top list and the Pareto window\n",
                    st.evaluated, st.feasible, st.pruned_out_of_memory, st.pruned_by_bound);
  if (st.refined > 0) {
    os << fmt::format("  the top {} re-ranked by the step simulator (their step times are simulated; --refine off for analytic)\n",
                      st.refined);
  }
  if (!st.infeasible_by_reason.empty()) {
    os << "  infeasible among those predicted:";
    bool first = true;
    for (const auto& [reason, n] : counts_by_key(st.infeasible_by_reason)) {
      os << fmt::format("{} {} {}", first ? "" : ",", reason, n);
      first = false;
    }
    os << "\n";
  }
}

json stats_json(const SearchStats& st) {
  return {{"candidates", st.candidates},
          {"evaluated", st.evaluated},
          {"feasible", st.feasible},
          {"infeasible_by_reason", counts_by_key(st.infeasible_by_reason)},
          {"pruned_out_of_memory", st.pruned_out_of_memory},
          {"pruned_by_bound", st.pruned_by_bound},
          {"layouts", st.layouts},
          {"max_gpus_considered", st.max_gpus_considered},
          {"elapsed_s", st.elapsed_s},
          {"threads", st.threads},
          {"top_refined_with_simulation", st.refined}};
}

json extra(const std::string& model, const std::string& cluster, const char* engine = "analytic") {
  return {{"model", model}, {"cluster", cluster}, {"engine", engine}};
}

// The feasible candidates' (step, peak memory) for the report's scatter plot, thinned to at most
// kMaxCandidatePoints (svg::thin_points: the front kept whole, dominated points one per grid cell).
constexpr std::size_t kMaxCandidatePoints = 2000;
json candidates_json(const std::vector<std::pair<Seconds, Bytes>>& points) {
  const std::vector<std::size_t> kept = svg::thin_points(points, kMaxCandidatePoints);
  json step = json::array(), bytes = json::array();
  for (std::size_t i : kept) {
    step.push_back(points[i].first);
    bytes.push_back(points[i].second);
  }
  return {{"feasible", points.size()}, {"thinned", kept.size() < points.size()}, {"step_s", step}, {"peak_bytes", bytes}};
}

}  // namespace

void print_search(std::ostream& os, const SearchResult& r, const SearchContext& ctx) {
  const SearchSpace& sp = *ctx.space;
  os << fmt::format("{} on up to {} x {}, global batch {} x {} tokens, objective {}\n\n", printable(ctx.model), sp.gpus,
                    printable(ctx.cluster), sp.global_batch, sp.seq_len, to_string(ctx.objective));
  if (!sp.exact_gpus && sp.gpus > r.stats.max_gpus_considered) {
    os << fmt::format("(--gpus {} is more than {} has; layouts use at most {})\n\n", sp.gpus, printable(ctx.cluster),
                      r.stats.max_gpus_considered);
  }
  if (!r.top.empty()) {
    // One engine per column: the refined top list shows simulated step times (labelled), the lists
    // below analytic ones, so the same layout can show two figures.
    os << fmt::format("{:>4}  {:<52} {:>5} {:>19} {:>10} {:>11} {:>6}", "rank", "layout", "GPUs", "peak memory",
                      r.stats.refined > 0 ? "sim step" : "step", "tokens/s", "MFU %");
    if (ctx.objective == Objective::cost) os << fmt::format(" {:>10}", "USD/step");
    os << "\n";
    for (std::size_t i = 0; i < r.top.size(); ++i) {
      const Estimate& e = r.top[i];
      os << fmt::format("{:>4}  {:<52} {:>5} {:>19} {:>10} {:>11.0f} {:>6.1f}", i + 1, describe(e.strategy),
                        e.strategy.gpus(), format_bytes(e.peak_memory) + " / " + format_bytes(e.capacity),
                        format_seconds(e.time.step), e.throughput.tokens_per_s, 100 * e.throughput.mfu);
      if (ctx.objective == Objective::cost) os << fmt::format(" {:>10}", format_usd(r.top_value[i]));
      os << "\n";
    }
  } else if (r.stats.candidates == 0) {
    os << "no valid layout in this space: dp x micro-batch must divide the global batch, tp the heads, kv_heads\n"
          "and ffn_hidden, and the GPU count must fit --gpus (or equal it with --exact-gpus) and the --max-* limits.\n";
  } else {
    os << "no feasible layout.\n";
  }
  if (!r.infeasible.empty()) {
    os << "\nfastest infeasible candidates (among those predicted; analytic step time):\n";
    for (const Estimate& e : r.infeasible) {
      os << fmt::format("  {:<52} {:>10}  {}\n", describe(e.strategy), format_seconds(e.time.step),
                        e.infeasible.empty() ? "" : describe(e.infeasible.front(), e.strategy));
    }
  }
  if (r.pareto.size() > 1) {
    os << fmt::format("\nPareto front, analytic step time vs peak memory (exact within {:g}x the best step time):\n",
                      ctx.pareto_window);
    for (const Estimate& e : r.pareto) {
      os << fmt::format("  {:<52} {:>10} {:>10}\n", describe(e.strategy), format_seconds(e.time.step),
                        format_bytes(e.peak_memory));
    }
  }
  os << "\n";
  print_counts(os, r.stats);
}

json search_to_json(const SearchResult& r, const SearchContext& ctx) {
  const SearchSpace& sp = *ctx.space;
  json top = json::array(), pareto = json::array(), infeasible = json::array();
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    json j = prediction_to_json(r.top[i], extra(ctx.model, ctx.cluster, r.stats.refined > 0 ? "des" : "analytic"));
    j["rank"] = i + 1;
    j["objective_value"] = shown_value(ctx.objective, r.top_value[i]);
    top.push_back(std::move(j));
  }
  for (const Estimate& e : r.pareto) pareto.push_back(prediction_to_json(e, extra(ctx.model, ctx.cluster)));
  for (const Estimate& e : r.infeasible) infeasible.push_back(prediction_to_json(e, extra(ctx.model, ctx.cluster)));
  json lists = {{"zero", sp.zero_stages}, {"recompute", json::array()}, {"schedules", json::array()},
                {"sequence_parallel", json::array()}};
  for (Recompute x : sp.recompute) lists["recompute"].push_back(to_string(x));
  for (ScheduleKind x : sp.schedules) lists["schedules"].push_back(to_string(x));
  for (bool x : sp.sequence_parallel) lists["sequence_parallel"].push_back(x);
  // The DP-algorithm and compression lists only where the search opted in (default outputs keep
  // their keys).
  const bool default_dp = sp.dp_algorithms == std::vector<DpAlgorithm>{DpAlgorithm::allreduce} &&
                          sp.grad_compressions == std::vector<GradCompression>{GradCompression{}};
  if (!default_dp) {
    lists["dp_algorithms"] = json::array();
    for (DpAlgorithm a : sp.dp_algorithms) lists["dp_algorithms"].push_back(to_string(a));
    lists["grad_compressions"] = json::array();
    for (const GradCompression& g : sp.grad_compressions) lists["grad_compressions"].push_back(to_string(g));
    lists["ps_servers"] = sp.ps_servers;
    lists["ps_placement"] = to_string(sp.ps_placement);
  }
  json j = {{"schema", kSearchSchema},
          {"model", ctx.model},
          {"cluster", ctx.cluster},
          {"objective", to_string(ctx.objective)},
          {"objective_unit", value_unit(ctx.objective)},
          {"space",
           {{"gpus", sp.gpus},
            {"exact_gpus", sp.exact_gpus},
            {"global_batch", sp.global_batch},
            {"seq_len", sp.seq_len},
            {"dtype", to_string(sp.dtype)},
            {"attention", to_string(sp.attention)},
            {"max_tp", sp.max_tp},
            {"max_pp", sp.max_pp},
            {"max_cp", sp.max_cp},
            {"max_dp", sp.max_dp},
            {"max_vp", sp.max_vp},
            {"max_micro_batch", sp.max_micro_batch},
            {"lists", lists}}},
          {"search", stats_json(r.stats)},
          {"pareto_window", ctx.pareto_window},
          {"top", top},
          {"pareto", pareto},
          {"infeasible", infeasible}};
  if (!r.points.empty()) j["candidates"] = candidates_json(r.points);
  return j;
}

namespace {

std::string tokens_text(double t) {
  if (t >= 1e12) return fmt::format("{:g}T", t / 1e12);
  if (t >= 1e9) return fmt::format("{:g}B", t / 1e9);
  return fmt::format("{:g}", t);
}

void print_option_line(std::ostream& os, const CapacityOption& o) {
  os << fmt::format("{} x {}: {} -- {:.1f} days, {:.0f} GPU-hours, ${:.0f}, {:.0f} kWh", o.gpus, printable(o.cluster),
                    describe(o.best.strategy), o.days, o.gpu_hours, o.cost_usd, o.energy_kwh);
  if (o.with_failures) {
    os << fmt::format("; with failures {:.1f} days, ${:.0f} (goodput {:.1f}%)", o.days_with_failures,
                      o.cost_usd_with_failures, 100 * o.goodput.goodput);
  }
  os << "\n";
}

void print_failures(std::ostream& os, const CapacityResult& r) {
  const Reliability& rel = *r.reliability;
  os << fmt::format(
      "\nwith failures (MTBF {:.0f} h per GPU, checkpoints at {:.1f} MB/s per GPU, restart {:.1f} min + reading "
      "the checkpoint; Young/Daly interval sqrt(2 C MTBF_job)):\n",
      rel.mtbf_gpu_hours, rel.checkpoint_per_gpu / 1e6, rel.restart / 60.0);
  os << fmt::format("{:<14} {:>6} {:>9} {:>9} {:>10} {:>9} {:>8} {:>9} {:>9} {:>8} {:>9} {:>14} {:>12}\n", "cluster",
                    "GPUs", "MTBF h", "ckpt GB", "write s", "every min", "steps", "fail/day", "lost h/d",
                    "goodput", "days", "cost USD", "energy kWh");
  for (const CapacityOption& o : r.options) {
    if (!o.feasible || !o.with_failures) continue;
    const Goodput& g = o.goodput;
    os << fmt::format("{:<14} {:>6} {:>9.2f} {:>9.0f} {:>10.1f} {:>9.1f} {:>8.0f} {:>9.2f} {:>9.2f} {:>7.1f}% ", printable(o.cluster),
                      o.gpus, g.job_mtbf / 3600, g.checkpoint / kGB, g.checkpoint_write, g.interval / 60,
                      g.interval_steps, g.failures_per_day, (g.lost_work_per_day + g.restart_per_day) / 3600,
                      100 * g.goodput);
    if (g.goodput > 0) {
      os << fmt::format("{:>9.1f} {:>14.0f} {:>12.0f}\n", o.days_with_failures, o.cost_usd_with_failures,
                        o.energy_kwh_with_failures);
    } else {
      os << "never finishes: restarts and lost work exceed the job's MTBF\n";
    }
  }
  bool any_elastic = false;
  for (const CapacityOption& o : r.options) any_elastic |= o.elastic.has_value();
  if (!any_elastic) return;
  os << "\nafter losing one node (elastic restart on the GPUs left):\n";
  os << fmt::format("{:<14} {:>6} {:>6} {:>6}  {:<52} {:>12} {:>10}\n", "cluster", "GPUs", "left", "used", "best layout",
                    "throughput", "resume s");
  for (const CapacityOption& o : r.options) {
    if (!o.elastic) continue;
    const ElasticOption& e = *o.elastic;
    if (!e.feasible) {
      os << fmt::format("{:<14} {:>6} {:>6} {:>6}  {:<52}\n", printable(o.cluster), o.gpus, e.gpus, "-", printable("infeasible: " + e.why));
      continue;
    }
    os << fmt::format("{:<14} {:>6} {:>6} {:>6}  {:<52} {:>11.1f}% {:>10.0f}\n", printable(o.cluster), o.gpus, e.gpus,
                      e.best.strategy.gpus(), describe(e.best.strategy), 100 * e.throughput_share, e.resume);
  }
}

}  // namespace

void print_capacity(std::ostream& os, const CapacityResult& r, const CapacityContext& ctx) {
  os << fmt::format("{}: {} tokens, global batch {} x {} tokens; fastest layout per cluster and size\n\n", printable(ctx.model),
                    tokens_text(ctx.tokens), ctx.global_batch, ctx.seq_len);
  os << fmt::format("{:<14} {:>6}  {:<52} {:>6} {:>9} {:>12} {:>14} {:>12}\n", "cluster", "GPUs", "best layout",
                    "MFU %", "days", "GPU-hours", "cost USD", "energy kWh");
  for (const CapacityOption& o : r.options) {
    if (!o.feasible) {
      os << fmt::format("{:<14} {:>6}  {:<52}\n", printable(o.cluster), o.gpus, printable("infeasible: " + o.why));
      continue;
    }
    os << fmt::format("{:<14} {:>6}  {:<52} {:>6.1f} {:>9.1f} {:>12.0f} {:>14.0f} {:>12.0f}\n", printable(o.cluster), o.gpus,
                      describe(o.best.strategy), 100 * o.best.throughput.mfu, o.days, o.gpu_hours, o.cost_usd,
                      o.energy_kwh);
  }
  os << "\n";
  if (ctx.deadline_days) {
    os << fmt::format("cheapest within {:g} days: ", *ctx.deadline_days);
    if (r.cheapest_in_deadline) print_option_line(os, r.options[*r.cheapest_in_deadline]);
    else os << "none meets the deadline\n";
  }
  if (ctx.budget_usd) {
    os << fmt::format("fastest within ${:.0f}: ", *ctx.budget_usd);
    if (r.fastest_in_budget) print_option_line(os, r.options[*r.fastest_in_budget]);
    else os << "none fits the budget\n";
  }
  if (!r.pareto.empty()) {
    os << "cost/time Pareto front (no other option is both faster and cheaper):\n";
    for (std::size_t i : r.pareto) {
      os << "  ";
      print_option_line(os, r.options[i]);
    }
  }
  if (r.reliability) print_failures(os, r);
  os << fmt::format("({} search{} in {})\n", r.options.size(), r.options.size() == 1 ? "" : "es", format_seconds(r.elapsed_s));
}

json capacity_to_json(const CapacityResult& r, const CapacityContext& ctx) {
  json options = json::array();
  for (const CapacityOption& o : r.options) {
    json j = {{"cluster", o.cluster},
              {"gpus", o.gpus},
              {"feasible", o.feasible},
              {"price_per_gpu_hour_usd", o.price_per_gpu_hour},
              {"power_per_gpu_w", o.power_per_gpu_w},
              {"search", stats_json(o.stats)}};
    if (o.feasible) {
      j["days"] = o.days;
      j["hours"] = o.hours;
      j["gpu_hours"] = o.gpu_hours;
      j["cost_usd"] = o.cost_usd;
      j["energy_kwh"] = o.energy_kwh;
      j["layout"] = describe(o.best.strategy);
      j["mfu"] = o.best.throughput.mfu;
      j["tokens_per_s"] = o.best.throughput.tokens_per_s;
      j["best"] = prediction_to_json(o.best, extra(ctx.model, o.cluster));
      if (o.with_failures) {
        const Goodput& g = o.goodput;
        j["failures"] = {{"job_mtbf_hours", g.job_mtbf / 3600},
                         {"checkpoint_bytes", g.checkpoint},
                         {"checkpoint_write_s", g.checkpoint_write},
                         {"checkpoint_interval_s", g.interval},
                         {"checkpoint_interval_steps", g.interval_steps},
                         {"restart_s", g.restart},
                         {"failures_per_day", g.failures_per_day},
                         {"lost_work_hours_per_day", g.lost_work_per_day / 3600},
                         {"restart_hours_per_day", g.restart_per_day / 3600},
                         {"checkpoint_hours_per_day", g.checkpoint_per_day / 3600},
                         {"goodput", g.goodput},
                         {"days", g.goodput > 0 ? json(o.days_with_failures) : json(nullptr)},
                         {"gpu_hours", g.goodput > 0 ? json(o.gpu_hours_with_failures) : json(nullptr)},
                         {"cost_usd", g.goodput > 0 ? json(o.cost_usd_with_failures) : json(nullptr)},
                         {"energy_kwh", g.goodput > 0 ? json(o.energy_kwh_with_failures) : json(nullptr)}};
      }
      if (o.elastic) {
        const ElasticOption& e = *o.elastic;
        json el = {{"gpus", e.gpus}, {"feasible", e.feasible}};
        if (e.feasible) {
          el["gpus_used"] = e.best.strategy.gpus();
          el["layout"] = describe(e.best.strategy);
          el["tokens_per_s"] = e.best.throughput.tokens_per_s;
          el["throughput_share"] = e.throughput_share;
          el["resume_s"] = e.resume;
          el["best"] = prediction_to_json(e.best, extra(ctx.model, o.cluster));
        } else {
          el["why"] = e.why;
        }
        j["elastic"] = std::move(el);
      }
    } else {
      j["why"] = o.why;
    }
    options.push_back(std::move(j));
  }
  auto index = [](const std::optional<std::size_t>& i) { return i ? json(*i) : json(nullptr); };
  json j = {{"schema", kCapacitySchema},
            {"model", ctx.model},
            {"tokens", ctx.tokens},
            {"global_batch", ctx.global_batch},
            {"seq_len", ctx.seq_len},
            {"deadline_days", ctx.deadline_days ? json(*ctx.deadline_days) : json(nullptr)},
            {"budget_usd", ctx.budget_usd ? json(*ctx.budget_usd) : json(nullptr)},
            {"options", options},
            {"cheapest_within_deadline", index(r.cheapest_in_deadline)},
            {"fastest_within_budget", index(r.fastest_in_budget)},
            {"pareto", r.pareto},
            {"elapsed_s", r.elapsed_s}};
  if (r.reliability) {
    j["reliability"] = {{"source", r.reliability->source},
                        {"mtbf_gpu_hours", r.reliability->mtbf_gpu_hours},
                        {"checkpoint_gbps_per_gpu", r.reliability->checkpoint_per_gpu / kGB},
                        {"restart_minutes", r.reliability->restart / 60}};
  }
  return j;
}

}  // namespace trainplan
