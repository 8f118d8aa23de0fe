#include "reports/html_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "reports/capacity_json.hpp"
#include "reports/compare.hpp"
#include "reports/comparison_json.hpp"
#include "reports/console.hpp"
#include "reports/infeasible.hpp"
#include "reports/measurement_json.hpp"
#include "reports/prediction_json.hpp"
#include "reports/search_json.hpp"
#include "reports/svg.hpp"
#include "reports/thin.hpp"
#include "sim/check.hpp"
#include "sim/json_reader.hpp"
#include "sim/simulate.hpp"

namespace trainplan {

using nlohmann::json;
using svg::escape;

namespace {

// The Tableau 10 palette (colour-blind-safe order), one colour per series.
const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#d37295", "#8cd17d",
                                "#499894", "#86bcb6"};

// A time unit for values up to `max_s` seconds: name and seconds per unit.
struct TimeUnit {
  const char* name;
  double seconds;
};
TimeUnit time_unit(double max_s) {
  if (max_s >= 1) return {"s", 1};
  if (max_s >= 1e-3) return {"ms", 1e-3};
  return {"us", 1e-6};
}

std::string pct(double share) { return fmt::format("{:.1f}%", 100 * share); }

// --- page pieces ---

std::string legend(const std::vector<svg::Series>& series) {
  std::string out = "<ul class=\"legend\">";
  for (const auto& s : series) {
    out += fmt::format("<li><span class=\"swatch\" style=\"background:{}\"></span>{}</li>", escape(s.color),
                       escape(s.name));
  }
  return out + "</ul>\n";
}

std::string figure(const svg::Svg& chart, const std::string& caption, const std::vector<svg::Series>& series = {}) {
  std::string out = "<figure>\n" + chart.str() + "\n";
  if (!series.empty()) out += legend(series);
  return out + "<figcaption>" + escape(caption) + "</figcaption>\n</figure>\n";
}

// A table; cells are text (escaped here). `numeric[c]`: right-align column c.
std::string table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows,
                  const std::vector<bool>& numeric = {}) {
  auto cls = [&](std::size_t c) { return c < numeric.size() && numeric[c] ? " class=\"num\"" : ""; };
  std::string out = "<div class=\"table-wrap\"><table>\n<thead><tr>";
  for (std::size_t c = 0; c < head.size(); ++c) out += fmt::format("<th{}>{}</th>", cls(c), escape(head[c]));
  out += "</tr></thead>\n<tbody>\n";
  for (const auto& r : rows) {
    out += "<tr>";
    for (std::size_t c = 0; c < r.size(); ++c) out += fmt::format("<td{}>{}</td>", cls(c), escape(r[c]));
    out += "</tr>\n";
  }
  return out + "</tbody></table></div>\n";
}

// Key-value facts as a definition list.
std::string facts(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string out = "<dl class=\"facts\">\n";
  for (const auto& [k, v] : kv) out += fmt::format("<div><dt>{}</dt><dd>{}</dd></div>\n", escape(k), escape(v));
  return out + "</dl>\n";
}

std::string section(const std::string& id, const std::string& heading, const std::string& file,
                    const std::string& body) {
  std::string out = fmt::format("<section id=\"{}\">\n<h2>{}</h2>\n", escape(id), escape(heading));
  if (!file.empty()) out += fmt::format("<p class=\"source\">from {}</p>\n", escape(file));
  return out + body + "</section>\n";
}

std::string h3(const std::string& s) { return "<h3>" + escape(s) + "</h3>\n"; }

// --- charts shared by several documents ---

// Memory per pipeline stage as stacked bars; series that are zero on every stage are left out.
std::string memory_chart(const Estimate& e) {
  struct Part {
    const char* name;
    Bytes StageMemory::*field;
  };
  const Part parts[] = {{"weights", &StageMemory::weights},
                        {"gradients", &StageMemory::gradients},
                        {"optimizer states", &StageMemory::optimizer},
                        {"activations", &StageMemory::activations},
                        {"other", &StageMemory::other},
                        {"16-bit weight copies", &StageMemory::weight_copies},
                        {"optimizer temporaries", &StageMemory::temporaries},
                        {"allocator reserve", &StageMemory::allocator},
                        {"runtime (CUDA context, NCCL)", &StageMemory::runtime}};
  svg::StackedBars c;
  c.title = "memory per GPU by pipeline stage";
  c.y.label = "memory per GPU (GB)";
  std::vector<std::size_t> used;
  for (std::size_t p = 0; p < std::size(parts); ++p) {
    bool any = false;
    for (const StageMemory& m : e.per_stage) any |= m.*(parts[p].field) > 0;
    if (any) used.push_back(p);
  }
  for (std::size_t k = 0; k < used.size(); ++k) c.series.push_back({parts[used[k]].name, kPalette[used[k]]});
  for (std::size_t i = 0; i < e.per_stage.size(); ++i) {
    const StageMemory& m = e.per_stage[i];
    c.categories.push_back(fmt::format("stage {}", m.stage));
    std::vector<double> row;
    std::string tip = fmt::format("total {}", format_bytes(m.total()));
    for (std::size_t p : used) {
      row.push_back(m.*(parts[p].field) / kGB);
      tip += fmt::format("\n{}: {}", parts[p].name, format_bytes(m.*(parts[p].field)));
    }
    c.values.push_back(std::move(row));
    c.tooltips.push_back(std::move(tip));
  }
  if (e.capacity > 0) {
    c.reference = e.capacity / kGB;
    c.reference_label = fmt::format("GPU memory {}", format_bytes(e.capacity));
  }
  return figure(svg::stacked_bars(c),
                fmt::format("Peak memory per GPU of each pipeline stage: {} at the fullest stage, of {}.",
                            format_bytes(e.peak_memory), format_bytes(e.capacity)),
                c.series);
}

// One horizontal bar per (label, seconds) row, in a unit chosen for the largest.
std::string time_chart(const std::string& title, const std::vector<std::pair<std::string, double>>& rows,
                       double step, const std::string& caption, const char* color = kPalette[0]) {
  double top = 0;
  for (const auto& [k, v] : rows) top = std::max(top, v);
  const TimeUnit u = time_unit(top);
  svg::GroupedBars c;
  c.title = title;
  c.series = {{"time", color}};
  c.x.label = fmt::format("time per step ({})", u.name);
  for (const auto& [k, v] : rows) {
    c.rows.push_back(k);
    c.values.push_back({v / u.seconds});
    c.value_text.push_back({format_seconds(v)});
    c.row_note.push_back(step > 0 ? pct(v / step) + " of the step" : "");
  }
  return figure(svg::grouped_bars(c), caption);
}

std::string time_breakdown(const TimeBreakdown& t, const std::string& engine) {
  std::vector<std::pair<std::string, double>> rows = {
      {"step", t.step},
      {"compute (fwd + bwd)", t.compute},
      {"recompute", t.recompute},
      {"TP communication", t.tp_comm},
      {"CP communication", t.cp_comm}};
  if (t.ep_comm > 0) rows.emplace_back("EP all-to-all (exposed)", t.ep_comm);
  rows.insert(rows.end(), {{"PP communication", t.pp_comm},
                           {"DP comm., exposed", t.dp_comm_exposed},
                           {"DP comm., total", t.dp_comm},
                           {"pipeline bubble", t.bubble},
                           {"optimizer", t.optimizer}});
  return time_chart("step time breakdown", rows, t.step,
                    fmt::format("Where the step's time goes on the busiest pipeline stage ({} engine). "
                                "DP communication total includes the part overlapped with the backward; "
                                "only the exposed part adds to the step.",
                                engine));
}

// --- prediction (and simulate's timeline) ---

// Event kinds in chart order (each its palette colour), as to_string(EventKind) names them.
constexpr EventKind kChartKinds[] = {EventKind::forward,         EventKind::backward,     EventKind::backward_weight,
                                     EventKind::recompute,       EventKind::optimizer,    EventKind::send_activation,
                                     EventKind::send_gradient,   EventKind::grad_reduce,  EventKind::zero3_gather,
                                     EventKind::param_gather,    EventKind::ps_push_pull, EventKind::ps_update,
                                     EventKind::dispatch,        EventKind::combine};
static_assert(std::size(kChartKinds) == static_cast<std::size_t>(EventKind::combine) + 1,
              "one chart category per EventKind");
static_assert(std::size(kPalette) >= std::size(kChartKinds), "a colour per event kind");

int chart_category(EventKind k) {
  return static_cast<int>(std::find(std::begin(kChartKinds), std::end(kChartKinds), k) - std::begin(kChartKinds));
}

// Short row labels for the streams (sim/simulate.cpp to_string(Stream) spellings).
std::string stream_label(Stream s) {
  switch (s) {
    case Stream::pp_forward: return "p2p fwd";
    case Stream::pp_backward: return "p2p bwd";
    case Stream::dp: return "dp";
    case Stream::ep: return "ep";
    default: return to_string(s);
  }
}

// " (rank 3)" or " (4 ranks)" for a stage's hover texts.
std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.empty()) return "";
  return ranks.size() == 1 ? fmt::format(" (rank {})", ranks.front()) : fmt::format(" ({} ranks)", ranks.size());
}

// One stage's rows (one per stream, in order of first use) and bars; returns its events' end.
double add_stage_bars(svg::Gantt& g, const TimelineStage& st) {
  std::map<Stream, int> stream_row;
  double end = 0;
  for (const Event& e : st.events) {
    auto [it, added] = stream_row.emplace(e.stream, static_cast<int>(g.rows.size()));
    if (added) g.rows.push_back(fmt::format("stage {} {}", st.stage, stream_label(e.stream)));
    g.bars.push_back({it->second, chart_category(e.kind), e.start, e.end,
                      fmt::format("stage {}{}: {}{} {} .. {}", st.stage, ranks_text(st.ranks), to_string(e.kind),
                                  e.micro_batch >= 0 ? fmt::format(" micro-batch {}", e.micro_batch) : "",
                                  format_seconds(e.start), format_seconds(e.end))});
    end = std::max(end, e.end);
  }
  return end;
}

std::string timeline_chart(const std::vector<TimelineStage>& stages) {
  svg::Gantt g;
  g.title = "pipeline timeline";
  for (std::size_t k = 0; k < std::size(kChartKinds); ++k) g.categories.push_back({to_string(kChartKinds[k]), kPalette[k]});
  constexpr std::size_t kMaxStages = 32;
  double step = 0;
  std::size_t events = 0;
  for (std::size_t si = 0; si < stages.size() && si < kMaxStages; ++si) {
    step = std::max(step, add_stage_bars(g, stages[si]));
    events += stages[si].events.size();
  }
  const TimeUnit u = time_unit(step);
  for (auto& b : g.bars) b.start /= u.seconds, b.end /= u.seconds;
  g.x.label = fmt::format("time since the step started ({})", u.name);
  std::vector<svg::Series> used;
  std::vector<bool> seen(g.categories.size(), false);
  for (const auto& b : g.bars) seen[static_cast<std::size_t>(b.category)] = true;
  for (std::size_t k = 0; k < seen.size(); ++k)
    if (seen[k]) used.push_back(g.categories[k]);
  std::string caption = fmt::format(
      "The step simulator's timeline of one data-parallel replica ({} events): one row per pipeline stage and "
      "stream; all TP/CP ranks of a stage run the same events. Gaps on a compute row are idle time.",
      events);
  if (stages.size() > kMaxStages) caption += fmt::format(" The first {} of {} stages are shown.", kMaxStages, stages.size());
  return figure(svg::gantt(g), caption, used);
}

std::vector<std::pair<std::string, std::string>> plan_facts(const PredictionDoc& p, const std::string& engine) {
  const Estimate& e = p.estimate;
  const Strategy& s = e.strategy;
  auto named = [](const std::string& n) { return n.empty() ? std::string("(not named)") : n; };
  std::vector<std::pair<std::string, std::string>> kv = {
      {"model", named(p.model)},
      {"cluster", named(p.cluster)},
      {"software", named(p.software)},
      {"layout", describe(s)},
      {"GPUs", fmt::format("{} (dp {} x tp {} x pp {} x cp {})", s.gpus(), s.dp, s.tp, s.pp, s.cp)},
      {"batch", fmt::format("{} sequences of {} tokens, {} micro-batches of {} per replica", s.global_batch,
                            s.seq_len, s.micro_batches(), s.micro_batch)},
      {"precision", to_string(s.dtype)},
      {"engine", engine},
      {"feasible", e.feasible ? "yes" : "no"},
      {"step time", format_seconds(e.time.step)},
      {"tokens/s", fmt::format("{:.0f} ({:.0f} per GPU)", e.throughput.tokens_per_s,
                               e.throughput.tokens_per_s_per_gpu)},
      {"MFU / HFU", pct(e.throughput.mfu) + " / " + pct(e.throughput.hfu)},
      {"model TFLOP/s per GPU", fmt::format("{:.1f}", e.throughput.model_tflops_per_gpu)},
      {"peak memory", format_bytes(e.peak_memory) + " of " + format_bytes(e.capacity)}};
  if (p.cost && p.cost->priced) {
    kv.emplace_back("cost per step", fmt::format("{} ({} GPUs x ${:.2f} per GPU-hour; {})", format_usd(p.cost->usd_per_step),
                                                 s.gpus(), p.cost->price_per_gpu_hour_usd, p.cost->price_source));
  }
  return kv;
}

std::string warnings(const std::vector<std::string>& lines) {
  if (lines.empty()) return "";
  std::string out = "<ul class=\"warnings\">";
  for (const auto& l : lines) out += "<li>" + escape(l) + "</li>";
  return out + "</ul>\n";
}

std::string prediction_body(const PredictionDoc& p) {
  const Estimate& e = p.estimate;
  const std::string engine = p.engine.empty() ? "analytic" : p.engine;
  std::string body = facts(plan_facts(p, engine)) + warnings(p.infeasible_reasons);
  if (!e.per_stage.empty()) body += h3("Memory per pipeline stage") + memory_chart(e);
  if (e.time.step > 0) body += h3("Step time") + time_breakdown(e.time, engine);
  if (p.simulation && p.simulation->timeline) body += h3("Pipeline timeline") + timeline_chart(*p.simulation->timeline);
  return body;
}

// --- search ---

std::string search_summary(const SearchDoc& d) {
  const SearchStats& st = d.stats;
  std::string body = facts({{"model", d.model}, {"cluster", d.cluster}, {"objective", to_string(d.objective)}});
  body += fmt::format("<p>{} valid layouts: {} predicted ({} feasible), {} proven out of memory by the "
                      "model-state bound, {} proven by the step-time bound to miss the top list and the Pareto "
                      "window.</p>\n",
                      st.candidates, st.evaluated, st.feasible, st.pruned_out_of_memory, st.pruned_by_bound);
  if (d.top.empty()) return body;
  std::vector<std::vector<std::string>> rows;
  for (std::size_t i = 0; i < d.top.size(); ++i) {
    const Estimate& e = d.top[i].estimate;
    rows.push_back({std::to_string(i + 1), describe(e.strategy), std::to_string(e.strategy.gpus()),
                    format_bytes(e.peak_memory), format_seconds(e.time.step),
                    fmt::format("{:.0f}", e.throughput.tokens_per_s), pct(e.throughput.mfu)});
  }
  body += h3(fmt::format("Top {} layouts{}", d.top.size(), st.refined > 0 ? " (step times from the step simulator)" : ""));
  return body + table({"rank", "layout", "GPUs", "peak memory", "step time", "tokens/s", "MFU"}, rows,
                      {true, false, true, true, true, true, true});
}

// The scatter's series: the feasible candidates (analytic), the Pareto front, the top K.
std::vector<svg::ScatterSeries> search_series(const SearchDoc& d, const TimeUnit& u) {
  svg::ScatterSeries all{"feasible candidates (analytic)", "#9aa5b1", {}, false, 2, true};
  if (d.candidates) {
    for (const auto& [step, bytes] : d.candidates->points) {
      all.points.push_back({step / u.seconds, bytes / kGB, "", fmt::format("{} , {}", format_seconds(step), format_bytes(bytes))});
    }
  }
  svg::ScatterSeries front{"Pareto front (analytic)", kPalette[2], {}, true, 3.5, true};
  for (const PredictionDoc& p : d.pareto) {
    const Estimate& e = p.estimate;
    front.points.push_back({e.time.step / u.seconds, e.peak_memory / kGB, "",
                            fmt::format("{}: {}, {}", describe(e.strategy), format_seconds(e.time.step),
                                        format_bytes(e.peak_memory))});
  }
  const bool refined = d.stats.refined > 0;
  svg::ScatterSeries best{refined ? "top layouts (simulated step time)" : "top layouts", kPalette[0], {}, false, 4.5, true};
  for (std::size_t i = 0; i < d.top.size(); ++i) {
    const Estimate& e = d.top[i].estimate;
    best.points.push_back({e.time.step / u.seconds, e.peak_memory / kGB, i < 5 ? std::to_string(i + 1) : "",
                           fmt::format("#{} {}: {}, {}", i + 1, describe(e.strategy), format_seconds(e.time.step),
                                       format_bytes(e.peak_memory))});
  }
  return {all, front, best};
}

std::string search_scatter(const SearchDoc& d) {
  double max_step = 0;
  if (d.candidates)
    for (const auto& pt : d.candidates->points) max_step = std::max(max_step, pt.first);
  for (const auto& list : {&d.pareto, &d.top})
    for (const PredictionDoc& p : *list) max_step = std::max(max_step, p.estimate.time.step);
  const TimeUnit u = time_unit(max_step);
  svg::Scatter sc;
  sc.title = "step time vs peak memory of the feasible candidates";
  sc.x.label = fmt::format("step time ({})", u.name);
  sc.y.label = "peak memory per GPU (GB)";
  sc.series = search_series(d, u);
  if (sc.series[0].points.empty() && sc.series[1].points.empty() && sc.series[2].points.empty()) return "";
  std::string caption =
      "Each grey dot is a feasible layout the search predicted (analytic model; candidates pruned by the "
      "memory or step-time bounds are not drawn). The line is the step-time/peak-memory Pareto front within "
      "the search's window; numbers label the five best.";
  if (d.candidates) {
    caption += fmt::format(" {} of {} predicted feasible candidates drawn{}.", d.candidates->points.size(),
                           d.candidates->feasible,
                           d.candidates->thinned ? " (dominated points thinned to one per grid cell, the front kept whole)" : "");
  }
  if (d.stats.refined > 0) caption += " The top layouts are drawn at their simulated step times, which differ from the analytic ones.";
  std::vector<svg::Series> leg;
  for (const auto& s : sc.series) leg.push_back({s.name, s.color});
  return h3("Step time vs peak memory") + figure(svg::scatter(sc), caption, leg);
}

std::string search_reasons(const SearchStats& st) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& [reason, n] : counts_by_key(st.infeasible_by_reason)) rows.push_back({reason, std::to_string(n)});
  if (st.pruned_out_of_memory > 0) {
    rows.push_back({"out of memory (proven by the bound, not predicted)", std::to_string(st.pruned_out_of_memory)});
  }
  if (rows.empty()) return "";
  return h3("Infeasible candidates by reason") + table({"reason", "candidates"}, rows, {false, true});
}

std::string search_body(const SearchDoc& d) { return search_summary(d) + search_scatter(d) + search_reasons(d.stats); }

// --- capacity ---

// Dollars for people: "$10.3M", "$850K" (svg::compact_label).
std::string usd(double v) { return "$" + svg::compact_label(v); }

// The figures the picks read: with failures where they were costed (sim/capacity.cpp).
double option_days(const CapacityOption& o) { return o.with_failures ? o.days_with_failures : o.days; }
double option_cost(const CapacityOption& o) { return o.with_failures ? o.cost_usd_with_failures : o.cost_usd; }
double option_kwh(const CapacityOption& o) { return o.with_failures ? o.energy_kwh_with_failures : o.energy_kwh; }
bool finishes(const CapacityOption& o) { return o.feasible && (!o.with_failures || o.goodput.goodput > 0); }

// The table's row of option i.
std::vector<std::string> option_row(const CapacityResult& r, std::size_t i) {
  const CapacityOption& o = r.options[i];
  if (!o.feasible) return {o.cluster, std::to_string(o.gpus), "infeasible: " + o.why, "", "", "", "", "", "", "", "", ""};
  std::string marks;
  if (r.cheapest_in_deadline == i) marks += "cheapest within deadline ";
  if (r.fastest_in_budget == i) marks += "fastest within budget ";
  if (std::find(r.pareto.begin(), r.pareto.end(), i) != r.pareto.end()) marks += "Pareto";
  const bool done = finishes(o);
  return {o.cluster, std::to_string(o.gpus), describe(o.best.strategy), pct(o.best.throughput.mfu),
          fmt::format("{:.1f}", o.days), svg::compact_label(o.gpu_hours), usd(o.cost_usd),
          fmt::format("{:.0f}", o.energy_kwh / 1e3), o.with_failures ? pct(o.goodput.goodput) : "-", done ? fmt::format("{:.1f}", option_days(o)) : "never",
          done ? usd(option_cost(o)) : "never", marks};
}

std::string capacity_chart(const CapacityDoc& d) {
  const CapacityResult& r = d.result;
  const bool failures = r.reliability.has_value();
  svg::Scatter sc;
  sc.title = "days to train vs cost";
  sc.x = {failures ? "days to train, with failures" : "days to train", true, std::nullopt, std::nullopt, true};
  sc.y = {failures ? "cost, with failures (USD)" : "cost (USD)", true, std::nullopt, std::nullopt, true, "$"};
  std::map<std::string, std::size_t> series_of;
  for (const CapacityOption& o : r.options) {
    if (!finishes(o)) continue;
    auto [it, added] = series_of.emplace(o.cluster, sc.series.size());
    if (added) sc.series.push_back({o.cluster, kPalette[sc.series.size() % std::size(kPalette)], {}, true, 4, true});
    sc.series[it->second].points.push_back({option_days(o), option_cost(o), std::to_string(o.gpus),
                                            fmt::format("{} x {}: {:.1f} days, {}, {}", o.gpus, o.cluster,
                                                        option_days(o), usd(option_cost(o)), describe(o.best.strategy))});
  }
  if (sc.series.empty()) return "";
  auto mark = [&](const std::optional<std::size_t>& pick, const std::string& caption, const char* color) {
    if (pick && option_days(r.options[*pick]) > 0) {
      sc.markers.push_back({option_days(r.options[*pick]), option_cost(r.options[*pick]), caption, color});
    }
  };
  if (d.context.deadline_days) mark(r.cheapest_in_deadline, fmt::format("cheapest within {:g} days", *d.context.deadline_days), "#c00");
  if (d.context.budget_usd) mark(r.fastest_in_budget, "fastest within " + usd(*d.context.budget_usd), "#070");
  std::vector<svg::Series> leg;
  for (const auto& s : sc.series) leg.push_back({s.name, s.color});
  return h3("Days to train vs cost") +
         figure(svg::scatter(sc),
                fmt::format("One point per cluster kind and GPU count (labelled with the GPU count), with its fastest layout; "
                            "both axes logarithmic{}. Rings mark the deadline and budget picks.",
                            failures ? "; days and cost include failures (goodput)" : ""),
                leg);
}

// The buyer's comparison: each cluster's pick by the ranking rule, best first.
std::string ranking_table(const CapacityDoc& d) {
  const CapacityResult& r = d.result;
  const CapacityContext& c = d.context;
  std::string rule = describe(r.ranking_rule);
  if (c.deadline_days) rule = fmt::format("cheapest option within {:g} days, by cost", *c.deadline_days);
  else if (c.budget_usd) rule = "fastest option within " + usd(*c.budget_usd) + ", by time";
  std::vector<std::vector<std::string>> rows;
  for (std::size_t k = 0; k < r.ranking.size(); ++k) {
    const CapacityOption& o = r.options[r.ranking[k]];
    rows.push_back({std::to_string(k + 1), o.cluster, std::to_string(o.gpus), describe(o.best.strategy),
                    fmt::format("{:.1f}", option_days(o)), usd(option_cost(o)),
                    fmt::format("${:.2f}{}", o.price_per_gpu_hour, o.price_given ? " (given)" : " (assumed)"),
                    fmt::format("{:.0f}", option_kwh(o) / 1e3), o.with_failures ? pct(o.goodput.goodput) : "-",
                    pct(o.best.throughput.mfu)});
  }
  if (rows.empty()) return h3("Buyer's comparison") + "<p>No cluster has an option that meets the rule (" + escape(rule) + ").</p>\n";
  return h3("Buyer's comparison") +
         fmt::format("<p class=\"meta\">Each cluster's {}{}. Prices marked assumed are the cluster files' own "
                     "assumptions, not quotes; --price replaces them.</p>\n",
                     escape(rule), r.reliability ? "; days, cost and energy include failures" : "") +
         table({"rank", "cluster", "GPUs", "best layout", "days", "cost", "per GPU-hour", "energy MWh", "goodput", "MFU"},
               rows, {true, false, true, false, true, true, true, true, true, true});
}

// The page's facts: the job, the prices per GPU-hour and where they came from, the failure model.
std::vector<std::pair<std::string, std::string>> capacity_facts(const CapacityDoc& d) {
  const CapacityContext& c = d.context;
  std::vector<std::pair<std::string, std::string>> kv = {
      {"model", c.model},
      {"tokens", svg::compact_label(c.tokens)},
      {"global batch", fmt::format("{} x {} tokens", c.global_batch, c.seq_len)}};
  if (c.deadline_days) kv.push_back({"deadline", fmt::format("{:g} days", *c.deadline_days)});
  if (c.budget_usd) kv.push_back({"budget", usd(*c.budget_usd)});
  std::vector<std::string> seen, prices;
  for (const CapacityOption& o : d.result.options) {
    if (std::find(seen.begin(), seen.end(), o.cluster) != seen.end()) continue;
    seen.push_back(o.cluster);
    prices.push_back(fmt::format("{} ${:.2f} ({})", o.cluster, o.price_per_gpu_hour, o.price_given ? "--price" : "assumed"));
  }
  kv.push_back({"per GPU-hour", fmt::format("{}", fmt::join(prices, ", "))});
  if (const auto& rel = d.result.reliability) {
    kv.push_back({"failures", fmt::format("MTBF {:.0f} h per GPU, checkpoints at {:.0f} MB/s per GPU, restart {:.0f} min",
                                          rel->mtbf_gpu_hours, rel->checkpoint_per_gpu / 1e6, rel->restart / 60)});
  }
  return kv;
}

std::string capacity_body(const CapacityDoc& d) {
  std::string body = facts(capacity_facts(d));
  body += ranking_table(d);
  body += capacity_chart(d);
  std::vector<std::vector<std::string>> rows;
  for (std::size_t i = 0; i < d.result.options.size(); ++i) rows.push_back(option_row(d.result, i));
  return body + h3("Options") +
         table({"cluster", "GPUs", "best layout", "MFU", "days", "GPU-hours", "cost", "energy MWh", "goodput",
                "days with failures", "cost with failures", "pick"},
               rows, {false, true, false, true, true, true, true, true, true, true, true, false});
}

// --- measurement ---

std::string measurement_body(const Measurement& m) {
  const Spread& s = m.step_time;
  std::string body = facts({{"model", m.model},
                            {"cluster", m.cluster},
                            {"software", m.software.empty() ? "(not named)" : m.software},
                            {"layout", describe(m.strategy)},
                            {"device", fmt::format("{} ({}), {} ranks", m.device, m.backend, m.ranks.size())},
                            {"steps", fmt::format("{} measured after {} warm-up", m.steps, m.warmup)},
                            {"step time", fmt::format("median {}, stdev {}, min {}, max {}", format_seconds(s.median),
                                                      format_seconds(s.stdev), format_seconds(s.min),
                                                      format_seconds(s.max))},
                            {"tokens/s", fmt::format("{:.0f}", m.throughput.tokens_per_s)},
                            {"peak memory", format_bytes(m.peak_memory)}});
  const PhaseTimes& b = m.breakdown;
  std::vector<std::pair<std::string, double>> phases = {{"step (median)", s.median},
                                                        {"forward", b.forward},
                                                        {"backward", b.backward},
                                                        {"recompute", b.recompute},
                                                        {"TP communication", b.tp_comm},
                                                        {"CP communication", b.cp_comm},
                                                        {"PP communication", b.pp_comm}};
  if (b.ep_comm > 0) phases.emplace_back("EP all-to-all", b.ep_comm);
  phases.insert(phases.end(), {{"DP comm., exposed", b.dp_comm_exposed},
                               {"pipeline bubble", b.bubble},
                               {"optimizer", b.optimizer},
                               {"other", b.other}});
  body += h3("Measured step time") +
          time_chart("measured step time breakdown", phases, s.median,
                     "Median of each phase over the measured steps, on the busiest rank.", kPalette[1]);
  if (m.per_stage.empty()) return body;
  svg::StackedBars c;
  c.title = "measured peak memory per stage";
  c.y.label = "peak memory per GPU (GB)";
  c.series = {{"peak memory", kPalette[1]}};
  for (const StagePeak& p : m.per_stage) {
    c.categories.push_back(fmt::format("stage {}", p.stage));
    c.values.push_back({p.peak / kGB});
    c.tooltips.push_back(format_bytes(p.peak));
  }
  return body + h3("Measured memory") +
         figure(svg::stacked_bars(c), "Largest peak memory of the ranks of each pipeline stage (reserved by the "
                                      "CUDA caching allocator on GPUs, max RSS on CPU).");
}

// A run that failed: its description and where and why it stopped (no figures to chart).
std::string failed_run_body(const Measurement& m, const RunFailure& f) {
  auto known = [](double bytes) { return bytes >= 0 ? format_bytes(bytes) : std::string("not known"); };
  return facts({{"model", m.model},
                {"cluster", m.cluster},
                {"layout", describe(m.strategy)},
                {"device", fmt::format("{} ({})", m.device, m.backend)},
                {"status", "failed"},
                {"failed rank", f.rank >= 0 ? std::to_string(f.rank) : "not known"},
                {"step", f.step >= 0 ? std::to_string(f.step) : "before the first step"},
                {"phase", f.phase.empty() ? "not known" : f.phase},
                {"memory at the failure", fmt::format("allocated {}, reserved {}, capacity {}, RSS {}", known(f.allocated),
                                                      known(f.reserved), known(f.capacity), known(f.rss))}}) +
         warnings({f.error.empty() ? "no error recorded" : f.error});
}

// --- comparison ---

std::string error_text(const ComparedFigure& f) {
  if (f.predicted == 0.0 && f.measured == 0.0) return "n/a (both 0)";
  if (f.error_pct) return format_error_pct(*f.error_pct);
  return "n/a";
}

std::string value_text(std::optional<double> v, const std::string& unit) {
  if (!v) return "n/a";
  if (unit == "s") return format_seconds(*v);
  if (unit == "B") return format_bytes(*v);
  return fmt::format("{:.4g} {}", *v, unit);
}

std::string paired_chart(const std::string& title, const std::vector<ComparedFigure>& figs, const std::string& unit,
                         const std::string& caption) {
  double top = 0;
  for (const auto& f : figs) top = std::max({top, f.predicted.value_or(0), f.measured.value_or(0)});
  double scale = kGB;
  std::string axis = "peak memory (GB)";
  if (unit == "s") {
    const TimeUnit u = time_unit(top);
    scale = u.seconds;
    axis = fmt::format("time per step ({})", u.name);
  }
  svg::GroupedBars c;
  c.title = title;
  c.series = {{"predicted", kPalette[0]}, {"measured", kPalette[1]}};
  c.x.label = axis;
  for (const auto& f : figs) {
    c.rows.push_back(f.label);
    auto scaled = [&](std::optional<double> v) { return v ? std::optional<double>(*v / scale) : std::nullopt; };
    c.values.push_back({scaled(f.predicted), scaled(f.measured)});
    c.value_text.push_back({value_text(f.predicted, unit), value_text(f.measured, unit)});
    c.row_note.push_back("error " + error_text(f));
  }
  return figure(svg::grouped_bars(c), caption, c.series);
}

std::string comparison_body(const ComparisonDoc& d) {
  const Comparison& c = d.comparison;
  const Spread& st = c.measured_step_time;
  std::string body = facts({{"prediction", d.prediction_file},
                            {"measurement", d.measurement_file},
                            {"model", c.measured_model},
                            {"cluster", c.measured_cluster},
                            {"layout", describe(c.strategy)},
                            {"measured step", fmt::format("median {} over {} steps (stdev {})", format_seconds(st.median),
                                                          st.count, format_seconds(st.stdev))}});
  body += warnings(c.warnings);
  const std::string err = "Error = (predicted - measured) / measured; n/a where a side has no figure or the measured one is 0.";
  if (!c.time.empty()) body += h3("Time per step") + paired_chart("predicted vs measured time", c.time, "s", err);
  if (!c.memory.empty()) body += h3("Peak memory") + paired_chart("predicted vs measured memory", c.memory, "B", err);
  if (c.throughput.empty()) return body;
  std::vector<std::vector<std::string>> rows;
  for (const auto& f : c.throughput) {
    rows.push_back({f.label, value_text(f.predicted, f.unit), value_text(f.measured, f.unit), error_text(f)});
  }
  return body + h3("Throughput") + table({"figure", "predicted", "measured", "error"}, rows, {false, true, true, true});
}

const char* kStyle = R"(
:root { color-scheme: light; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d232a; margin: 0 auto;
       max-width: 1100px; padding: 16px; }
header { border-bottom: 2px solid #4e79a7; margin-bottom: 12px; }
h1 { font-size: 1.5em; margin: 0.2em 0; }
h2 { font-size: 1.25em; margin: 1.2em 0 0.2em; border-bottom: 1px solid #ccd; }
h3 { font-size: 1.05em; margin: 1em 0 0.3em; }
.meta, .source, figcaption { color: #555; font-size: 0.9em; }
section { margin-bottom: 24px; }
figure { margin: 8px 0 16px; overflow-x: auto; }
svg { display: block; width: 100%; height: auto; }
figure > svg { min-width: 600px; }  /* a phone scrolls a chart sideways rather than shrink its text below ~9 px */
svg text { font: 12px system-ui, sans-serif; fill: #222; }
svg .axis-label { font-size: 13px; }
svg .point-label { font-size: 11px; font-weight: 600; }
svg .note, svg .reference-label, svg .marker-label { font-size: 12px; fill: #333; }
svg .value { font-size: 10px; }
.legend { list-style: none; padding: 0; margin: 4px 0; display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 0.9em; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 5px; vertical-align: -1px; border-radius: 2px; }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: 4px 18px; margin: 8px 0; }
.facts div { display: flex; gap: 8px; border-bottom: 1px dotted #ccd; padding: 2px 0; }
.facts dt { color: #555; min-width: 8em; }
.facts dd { margin: 0; font-weight: 500; overflow-wrap: anywhere; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9em; margin: 6px 0; }
th, td { border-bottom: 1px solid #dde; padding: 3px 8px; text-align: left; white-space: nowrap; }
th { background: #f3f5f8; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.warnings { color: #a00; }
@media print { body { max-width: none; font-size: 11pt; } section, figure { break-inside: avoid; } }
)";

}  // namespace

std::string report_kind(const json& j, const std::string& file) {
  if (!j.is_object()) throw InputError(fmt::format("{}: must be a JSON object with a \"schema\"", file));
  auto it = j.find("schema");
  if (it == j.end()) {
    throw InputError(fmt::format("{}: schema is missing; trainplan report reads the JSON that trainplan predict, "
                                 "simulate, search, capacity, exec and compare write",
                                 file));
  }
  // Through JsonObject::error, which shows the value cut to 80 characters (a schema of megabytes
  // made an error line as long).
  const JsonObject root(j, file);
  if (!it->is_string()) throw root.error("schema", fmt::format("must be a string such as \"{}\"", kPredictionSchema));
  const std::string s = it->get<std::string>();
  if (s == kPredictionSchema) return "prediction";
  if (s == kSearchSchema) return "search";
  if (s == kCapacitySchema) return "capacity";
  if (s == kMeasurementSchema) return "measurement";
  if (s == kComparisonSchema) return "comparison";
  throw root.error("schema", fmt::format("must be one of {}, {}, {}, {}, {}", kPredictionSchema, kSearchSchema,
                                         kCapacitySchema, kMeasurementSchema, kComparisonSchema));
}

namespace {

// The section of one document, read through its kind's reader.
std::string document_section(const ReportDocument& d, const std::string& id, const std::string& kind,
                             const std::string& file) {
  if (kind == "prediction") {
    const PredictionDoc p = prediction_from_json(d.json, file);
    return section(id, fmt::format("{}{}", p.simulation ? "Simulated step" : "Prediction", p.model.empty() ? "" : ": " + p.model),
                   d.file, prediction_body(p));
  }
  if (kind == "search") {
    SearchDoc s = search_from_json(d.json, file);
    // A file may hold millions of candidates: the page draws a bounded number (reports/thin.hpp).
    if (s.candidates && thin_drawn_points(s.candidates->points)) s.candidates->thinned = true;
    return section(id, "Search: " + s.model + " on " + s.cluster, d.file, search_body(s));
  }
  if (kind == "capacity") {
    const CapacityDoc c = capacity_from_json(d.json, file);
    return section(id, "Capacity: " + c.context.model, d.file, capacity_body(c));
  }
  if (kind == "measurement") {
    const MeasurementDoc m = measurement_doc_from_json(d.json, file);
    if (m.failure) return section(id, "Measured run (failed)", d.file, failed_run_body(m.measurement, *m.failure));
    return section(id, "Measured run", d.file, measurement_body(m.measurement));
  }
  return section(id, "Predicted vs measured", d.file, comparison_body(comparison_from_json(d.json, file)));
}

}  // namespace

std::string html_report(const std::vector<ReportDocument>& docs, const std::string& title) {
  std::string body, files;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const ReportDocument& d = docs[i];
    const std::string file = d.file.empty() ? "(this run)" : d.file;
    const std::string kind = report_kind(d.json, file);
    files += (files.empty() ? "" : ", ") + file;
    body += document_section(d, fmt::format("{}-{}", kind, i + 1), kind, file);
  }
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n"
      "<link rel=\"icon\" href=\"data:,\"/>\n<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n"
      "<header><h1>{}</h1><p class=\"meta\">trainplan report of {}. Bytes in decimal units (1 GB = 10^9 B). "
      "Hover over a bar or point for its figures.</p></header>\n{}</body>\n</html>\n",
      escape(title), kStyle, escape(title), escape(files), body);
}

}  // namespace trainplan
