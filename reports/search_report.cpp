#include "reports/search_report.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "reports/console.hpp"
#include "reports/infeasible.hpp"
#include "sim/check.hpp"

namespace trainplan {

namespace {

void print_counts(std::ostream& os, const SearchStats& st) {
  os << fmt::format("searched {} candidate layouts ({} dp x tp x pp x cp factorizations, up to {} GPUs) in {} on {} threads:\n",
                    st.candidates, st.layouts, st.max_gpus_considered, format_seconds(st.elapsed_s), st.threads);
  os << fmt::format("  {} predicted ({} feasible), {} proven out of memory by the model-state bound, "
                    "{} proven by the step-time bound to miss both the top list and the Pareto window\n",
                    st.evaluated, st.feasible, st.pruned_out_of_memory, st.pruned_by_bound);
  if (st.refined > 0) {
    os << fmt::format("  the analytic top {} re-ranked by the step simulator, best first (their step times are simulated; "
                      "--refine off for analytic)\n",
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

// The layout column: kLayoutColumn characters, or the longest layout printed (expert, module and
// pipeline-split settings make long ones), so that the columns after it stay aligned.
constexpr std::size_t kLayoutColumn = 52;

std::size_t layout_width(const SearchResult& r) {
  std::size_t w = kLayoutColumn;
  for (const auto* list : {&r.top, &r.infeasible, &r.pareto})
    for (const Estimate& e : *list) w = std::max(w, describe(e.strategy).size());
  return w;
}

// The same for the capacity tables: the best layout of every option and of its elastic restart.
std::size_t layout_width(const CapacityResult& r) {
  std::size_t w = kLayoutColumn;
  for (const CapacityOption& o : r.options) {
    if (o.feasible) w = std::max(w, describe(o.best.strategy).size());
    if (o.elastic && o.elastic->feasible) w = std::max(w, describe(o.elastic->best.strategy).size());
  }
  return w;
}

// The ranked top list, with the cost per step when the objective is cost.
void print_top(std::ostream& os, const SearchResult& r, const SearchContext& ctx, std::size_t w) {
  // One engine per column: the refined top list shows simulated step times (labelled), the lists
  // below analytic ones, so the same layout can show two figures.
  os << fmt::format("{:>4}  {:<{}} {:>5} {:>19} {:>10} {:>11} {:>6}", "rank", "layout", w, "GPUs", "peak memory",
                    r.stats.refined > 0 ? "sim step" : "step", "tokens/s", "MFU %");
  if (ctx.objective == Objective::cost) os << fmt::format(" {:>10}", "USD/step");
  os << "\n";
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const Estimate& e = r.top[i];
    os << fmt::format("{:>4}  {:<{}} {:>5} {:>19} {:>10} {:>11.0f} {:>6.1f}", i + 1, describe(e.strategy), w,
                      e.strategy.gpus(), format_bytes(e.peak_memory) + " / " + format_bytes(e.capacity),
                      format_seconds(e.time.step), e.throughput.tokens_per_s, 100 * e.throughput.mfu);
    if (ctx.objective == Objective::cost) os << fmt::format(" {:>10}", format_usd(r.top_value[i]));
    os << "\n";
  }
}

// Why the top list is empty: no valid layout in the space, or none that fits (with the least
// memory the layouts proven out of memory need, where the bound gave one).
void print_no_layout(std::ostream& os, const SearchResult& r, const SearchContext& ctx) {
  if (r.stats.candidates == 0) {
    os << "no valid layout in this space: dp x micro-batch must divide the global batch, tp the heads, kv_heads\n"
          "and ffn_hidden, and the GPU count must fit --gpus (or equal it with --exact-gpus) and the --max-* limits.\n";
    return;
  }
  os << "no feasible layout.\n";
  if (r.stats.least_memory_floor > 0) {
    os << fmt::format("the {} layouts proven out of memory without a prediction need at least {} per GPU (model "
                      "states as sharded as the space allows, the fewest activations){}: more GPUs (--gpus) or a "
                      "GPU with more memory\n",
                      r.stats.pruned_out_of_memory, format_bytes(r.stats.least_memory_floor),
                      ctx.gpu_memory > 0 ? fmt::format(", where {} has {}", printable(ctx.cluster),
                                                       format_bytes(ctx.gpu_memory))
                                         : "");
  }
}

// The fastest infeasible candidates, each with its first reason.
void print_infeasible_candidates(std::ostream& os, const SearchResult& r, std::size_t w) {
  if (r.infeasible.empty()) return;
  os << "\nfastest infeasible candidates (among those predicted; analytic step time):\n";
  for (const Estimate& e : r.infeasible) {
    os << fmt::format("  {:<{}} {:>10}  {}\n", describe(e.strategy), w, format_seconds(e.time.step),
                      e.infeasible.empty() ? "" : describe(e.infeasible.front(), e.strategy));
  }
}

// The Pareto front of step time against peak memory, where it holds more than one layout.
void print_pareto_front(std::ostream& os, const SearchResult& r, const SearchContext& ctx, std::size_t w) {
  if (r.pareto.size() <= 1) return;
  os << fmt::format("\nPareto front, analytic step time vs peak memory (exact within {:g}x the best step time):\n",
                    ctx.pareto_window);
  for (const Estimate& e : r.pareto) {
    os << fmt::format("  {:<{}} {:>10} {:>10}\n", describe(e.strategy), w, format_seconds(e.time.step),
                      format_bytes(e.peak_memory));
  }
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
  const std::size_t w = layout_width(r);
  if (!r.top.empty()) {
    print_top(os, r, ctx, w);
  } else {
    print_no_layout(os, r, ctx);
  }
  print_infeasible_candidates(os, r, w);
  print_pareto_front(os, r, ctx, w);
  os << "\n";
  print_counts(os, r.stats);
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
  const std::size_t w = layout_width(r);
  os << fmt::format("{:<14} {:>6} {:>6} {:>6}  {:<{}} {:>12} {:>10}\n", "cluster", "GPUs", "left", "used", "best layout", w,
                    "throughput", "resume s");
  for (const CapacityOption& o : r.options) {
    if (!o.elastic) continue;
    const ElasticOption& e = *o.elastic;
    if (!e.feasible) {
      os << fmt::format("{:<14} {:>6} {:>6} {:>6}  {:<52}\n", printable(o.cluster), o.gpus, e.gpus, "-", printable("infeasible: " + e.why));
      continue;
    }
    os << fmt::format("{:<14} {:>6} {:>6} {:>6}  {:<{}} {:>11.1f}% {:>10.0f}\n", printable(o.cluster), o.gpus, e.gpus,
                      e.best.strategy.gpus(), describe(e.best.strategy), w, 100 * e.throughput_share, e.resume);
  }
}

// Where each cluster's price per GPU-hour came from: its file (an assumed price) or --price.
void print_prices(std::ostream& os, const CapacityResult& r) {
  std::vector<std::string> seen, items;
  for (const CapacityOption& o : r.options) {
    if (std::find(seen.begin(), seen.end(), o.cluster) != seen.end()) continue;
    seen.push_back(o.cluster);
    items.push_back(fmt::format("{} ${:.2f} ({})", o.cluster, o.price_per_gpu_hour,
                                o.price_given ? "--price" : "cluster file, assumed"));
  }
  os << fmt::format("price per GPU-hour: {}\n", fmt::join(items, "; "));
}

// The buyer's comparison: each cluster's pick by the ranking rule, best first.
void print_ranking(std::ostream& os, const CapacityResult& r, const CapacityContext& ctx) {
  std::string rule = describe(r.ranking_rule);
  if (ctx.deadline_days) rule = fmt::format("cheapest option within {:g} days{}, by cost", *ctx.deadline_days,
                                            ctx.budget_usd ? fmt::format(" and ${:.0f}", *ctx.budget_usd) : "");
  else if (ctx.budget_usd) rule = fmt::format("fastest option within ${:.0f}, by time", *ctx.budget_usd);
  os << fmt::format("\nbuyer's comparison: each cluster's {}{}:\n", rule,
                    r.reliability ? " (days, cost and energy with failures)" : "");
  const std::size_t w = layout_width(r);
  os << fmt::format("{:>4} {:<14} {:>6}  {:<{}} {:>7} {:>10} {:>7} {:>9} {:>8} {:>6}\n", "rank", "cluster", "GPUs",
                    "best layout", w, "days", "cost $M", "$/GPU-h", "MWh", "goodput", "MFU %");
  std::vector<std::string> ranked;
  for (std::size_t k = 0; k < r.ranking.size(); ++k) {
    const CapacityOption& o = r.options[r.ranking[k]];
    ranked.push_back(o.cluster);
    const bool f = o.with_failures;
    os << fmt::format("{:>4} {:<14} {:>6}  {:<{}} {:>7.1f} {:>10.2f} {:>7.2f} {:>9.0f} {:>8} {:>6.1f}\n", k + 1,
                      o.cluster, o.gpus, describe(o.best.strategy), w, f ? o.days_with_failures : o.days,
                      (f ? o.cost_usd_with_failures : o.cost_usd) / 1e6, o.price_per_gpu_hour,
                      (f ? o.energy_kwh_with_failures : o.energy_kwh) / 1e3,
                      f ? fmt::format("{:.1f}%", 100 * o.goodput.goodput) : std::string("-"), 100 * o.best.throughput.mfu);
  }
  std::vector<std::string> left_out;
  for (const CapacityOption& o : r.options) {
    if (std::find(ranked.begin(), ranked.end(), o.cluster) == ranked.end() &&
        std::find(left_out.begin(), left_out.end(), o.cluster) == left_out.end()) {
      left_out.push_back(o.cluster);
    }
  }
  if (!left_out.empty()) os << fmt::format("     no such option: {}\n", fmt::join(left_out, ", "));
  print_prices(os, r);
}

}  // namespace

void print_capacity(std::ostream& os, const CapacityResult& r, const CapacityContext& ctx) {
  os << fmt::format("{}: {} tokens, global batch {} x {} tokens; fastest layout per cluster and size\n\n", printable(ctx.model),
                    tokens_text(ctx.tokens), ctx.global_batch, ctx.seq_len);
  const std::size_t w = layout_width(r);
  os << fmt::format("{:<14} {:>6}  {:<{}} {:>6} {:>9} {:>12} {:>14} {:>12}\n", "cluster", "GPUs", "best layout", w,
                    "MFU %", "days", "GPU-hours", "cost USD", "energy kWh");
  for (const CapacityOption& o : r.options) {
    if (!o.feasible) {
      os << fmt::format("{:<14} {:>6}  {:<52}\n", printable(o.cluster), o.gpus, printable("infeasible: " + o.why));
      continue;
    }
    os << fmt::format("{:<14} {:>6}  {:<{}} {:>6.1f} {:>9.1f} {:>12.0f} {:>14.0f} {:>12.0f}\n", printable(o.cluster), o.gpus,
                      describe(o.best.strategy), w, 100 * o.best.throughput.mfu, o.days, o.gpu_hours, o.cost_usd,
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
  print_ranking(os, r, ctx);
  os << fmt::format("({} search{} in {})\n", r.options.size(), r.options.size() == 1 ? "" : "es", format_seconds(r.elapsed_s));
}

}  // namespace trainplan
