#include "reports/html_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "reports/compare.hpp"
#include "reports/console.hpp"
#include "reports/measurement_json.hpp"
#include "reports/svg.hpp"
#include "reports/thin.hpp"
#include "sim/check.hpp"
#include "sim/json_reader.hpp"
#include "sim/simulate.hpp"

namespace trainplan {

using nlohmann::json;
using svg::escape;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The Tableau 10 palette (colour-blind-safe order), one colour per series.
const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#d37295", "#8cd17d"};

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
  const std::vector<std::pair<std::string, double>> rows = {
      {"step", t.step},
      {"compute (fwd + bwd)", t.compute},
      {"recompute", t.recompute},
      {"TP communication", t.tp_comm},
      {"CP communication", t.cp_comm},
      {"PP communication", t.pp_comm},
      {"DP comm., exposed", t.dp_comm_exposed},
      {"DP comm., total", t.dp_comm},
      {"pipeline bubble", t.bubble},
      {"optimizer", t.optimizer}};
  return time_chart("step time breakdown", rows, t.step,
                    fmt::format("Where the step's time goes on the busiest pipeline stage ({} engine). "
                                "DP communication total includes the part overlapped with the backward; "
                                "only the exposed part adds to the step.",
                                engine));
}

// --- prediction (and simulate's timeline) ---

// Event kinds of the timeline JSON, in chart order, with colours.
// (sim/simulate.cpp to_string(EventKind) spellings; every kind the simulator emits must be here,
// else the --html of its own timeline is refused: the parameter-server kinds were missing.)
const char* const kEventKinds[] = {"forward",         "backward",      "weight gradient", "recompute",
                                   "optimizer",       "send activation", "send gradient", "gradient reduce",
                                   "zero3 gather",    "parameter all-gather", "ps push/pull", "ps update"};
static_assert(std::size(kEventKinds) == static_cast<std::size_t>(EventKind::ps_update) + 1,
              "one chart category per EventKind");
static_assert(std::size(kPalette) >= std::size(kEventKinds), "a colour per event kind");

// Short row labels for the streams (sim/simulate.cpp to_string(Stream) spellings).
std::string stream_label(const std::string& s) {
  if (s == "pp send activations") return "p2p fwd";
  if (s == "pp send gradients") return "p2p bwd";
  if (s == "dp collectives") return "dp";
  return s;
}

std::string timeline_chart(const JsonObject& sim) {
  const json& stages = sim.raw("timeline");
  if (!stages.is_object()) throw sim.error("timeline", "must be an object");
  const JsonObject tl(stages, sim.file(), sim.field("timeline"));
  const std::vector<JsonObject> per_stage = tl.objects("stages");
  svg::Gantt g;
  g.title = "pipeline timeline";
  for (std::size_t k = 0; k < std::size(kEventKinds); ++k) g.categories.push_back({kEventKinds[k], kPalette[k]});
  constexpr std::size_t kMaxStages = 32;
  double step = 0;
  std::size_t events = 0;
  std::vector<std::vector<svg::GanttBar>> rows_bars;
  for (std::size_t si = 0; si < per_stage.size() && si < kMaxStages; ++si) {
    const JsonObject& st = per_stage[si];
    const long long stage = st.integer("stage", 0, 1 << 24);
    const json& ranks = st.raw("ranks");
    std::string rank_text;
    if (ranks.is_array() && !ranks.empty() && ranks.front().is_number_integer()) {
      rank_text = ranks.size() == 1 ? fmt::format(" (rank {})", ranks.front().get<long long>())
                                    : fmt::format(" ({} ranks)", ranks.size());
    }
    auto column = [&](const char* key) -> const json& {
      const json& c = st.raw(key);
      if (!c.is_array()) throw st.error(key, "must be an array");
      return c;
    };
    const json &stream = column("stream"), &kind = column("kind"), &start = column("start_s"), &end = column("end_s"),
               &mb = column("micro_batch");
    const std::size_t n = stream.size();
    if (kind.size() != n || start.size() != n || end.size() != n || mb.size() != n) {
      throw st.error("kind", "stream, kind, micro_batch, start_s and end_s must have the same length");
    }
    std::map<std::string, int> stream_row;
    for (std::size_t i = 0; i < n; ++i) {
      if (!stream[i].is_string() || !kind[i].is_string() || !start[i].is_number() || !end[i].is_number() ||
          !mb[i].is_number_integer()) {
        throw st.error("stream", fmt::format("event {} must have string stream/kind, numeric start_s/end_s, "
                                             "integer micro_batch", i));
      }
      const std::string s = stream[i].get<std::string>(), k = kind[i].get<std::string>();
      const auto cat = std::find(std::begin(kEventKinds), std::end(kEventKinds), k);
      if (cat == std::end(kEventKinds)) throw st.error("kind", fmt::format("event {}: '{}' is not an event kind", i, k));
      auto [it, added] = stream_row.emplace(s, static_cast<int>(g.rows.size()));
      if (added) g.rows.push_back(fmt::format("stage {} {}", stage, stream_label(s)));
      const double a = start[i].get<double>(), b = end[i].get<double>();
      if (!(a >= 0 && b >= a && b <= kMaxJsonMagnitude)) {
        throw InputError(fmt::format("{}: {}[{}] = {} and {}[{}] = {}, must satisfy 0 <= start_s <= end_s <= {:g}",
                                     st.file(), st.field("start_s"), i, a, st.field("end_s"), i, b, kMaxJsonMagnitude));
      }
      const long long m = mb[i].get<long long>();
      g.bars.push_back({it->second, static_cast<int>(cat - std::begin(kEventKinds)), a, b,
                        fmt::format("stage {}{}: {}{} {} .. {}", stage, rank_text, k,
                                    m >= 0 ? fmt::format(" micro-batch {}", m) : "", format_seconds(a),
                                    format_seconds(b))});
      step = std::max(step, b);
      ++events;
    }
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
  if (per_stage.size() > kMaxStages) caption += fmt::format(" The first {} of {} stages are shown.", kMaxStages, per_stage.size());
  return figure(svg::gantt(g), caption, used);
}

std::string prediction_body(const JsonObject& root, const json& j, const std::string& file) {
  const PredictionFile p = prediction_from_json(j, file);
  const Estimate& e = p.estimate;
  const Strategy& s = e.strategy;
  const std::string engine = root.has("engine") ? root.string("engine") : "analytic";
  std::vector<std::pair<std::string, std::string>> kv = {
      {"model", p.model.empty() ? "(not named)" : p.model},
      {"cluster", p.cluster.empty() ? "(not named)" : p.cluster},
      {"software", p.software.empty() ? "(not named)" : p.software},
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
  if (root.has("cost") && root.raw("cost").is_object()) {
    const JsonObject cost = root.object("cost");
    kv.emplace_back("cost per step", fmt::format("{} ({} GPUs x ${:.2f} per GPU-hour; {})",
                                                 format_usd(cost.number("usd_per_step", 0, kInf)), e.strategy.gpus(),
                                                 cost.number("price_per_gpu_hour_usd", 0, kInf),
                                                 cost.string("price_source")));
  }
  std::string body = facts(kv);
  if (!p.infeasible_reasons.empty()) {
    body += "<ul class=\"warnings\">";
    for (const auto& r : p.infeasible_reasons) body += "<li>" + escape(r) + "</li>";
    body += "</ul>\n";
  }
  if (!e.per_stage.empty()) body += h3("Memory per pipeline stage") + memory_chart(e);
  if (e.time.step > 0) body += h3("Step time") + time_breakdown(e.time, engine);
  if (root.has("simulation")) {
    const JsonObject sim = root.object("simulation");
    if (sim.has("timeline")) body += h3("Pipeline timeline") + timeline_chart(sim);
  }
  return body;
}

// --- search ---

std::string search_body(const JsonObject& root, const std::string& file) {
  const std::string model = root.string("model"), cluster = root.string("cluster");
  const JsonObject stats = root.object("search");
  const std::string objective = root.string("objective");
  std::vector<PredictionFile> top, pareto;
  const json& top_j = root.raw("top");
  const json& pareto_j = root.raw("pareto");
  if (!top_j.is_array()) throw root.error("top", "must be an array");
  if (!pareto_j.is_array()) throw root.error("pareto", "must be an array");
  for (std::size_t i = 0; i < top_j.size(); ++i) top.push_back(prediction_from_json(top_j[i], fmt::format("{}: top[{}]", file, i)));
  for (std::size_t i = 0; i < pareto_j.size(); ++i) pareto.push_back(prediction_from_json(pareto_j[i], fmt::format("{}: pareto[{}]", file, i)));
  // Read, and so checked, like top and pareto, though the page shows only counts by reason.
  if (root.has("infeasible")) {
    const json& infeasible_j = root.raw("infeasible");
    if (!infeasible_j.is_array()) throw root.error("infeasible", "must be an array");
    for (std::size_t i = 0; i < infeasible_j.size(); ++i) {
      (void)prediction_from_json(infeasible_j[i], fmt::format("{}: infeasible[{}]", file, i));
    }
  }
  const bool refined = stats.has("top_refined_with_simulation") && stats.integer("top_refined_with_simulation", 0, 1 << 30) > 0;

  const long long feasible = stats.integer("feasible", 0, 1LL << 62);
  std::string body = facts({{"model", model}, {"cluster", cluster}, {"objective", objective}});
  body += fmt::format("<p>{} valid layouts: {} predicted ({} feasible), {} proven out of memory by the "
                      "model-state bound, {} proven by the step-time bound to miss the top list and the Pareto "
                      "window.</p>\n",
                      stats.integer("candidates", 0, 1LL << 62), stats.integer("evaluated", 0, 1LL << 62), feasible,
                      stats.integer("pruned_out_of_memory", 0, 1LL << 62),
                      stats.integer("pruned_by_bound", 0, 1LL << 62));
  if (!top.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (std::size_t i = 0; i < top.size(); ++i) {
      const Estimate& e = top[i].estimate;
      rows.push_back({std::to_string(i + 1), describe(e.strategy), std::to_string(e.strategy.gpus()),
                      format_bytes(e.peak_memory), format_seconds(e.time.step),
                      fmt::format("{:.0f}", e.throughput.tokens_per_s), pct(e.throughput.mfu)});
    }
    body += h3(fmt::format("Top {} layouts{}", top.size(), refined ? " (step times from the step simulator)" : ""));
    body += table({"rank", "layout", "GPUs", "peak memory", "step time", "tokens/s", "MFU"}, rows,
                  {true, false, true, true, true, true, true});
  }

  // Scatter: the feasible candidates (analytic), the Pareto front, the top K.
  svg::Scatter sc;
  sc.title = "step time vs peak memory of the feasible candidates";
  std::vector<double> steps, bytes;
  std::size_t drawn = 0;
  long long predicted_feasible = 0;
  bool thinned = false;
  if (root.has("candidates")) {
    const JsonObject c = root.object("candidates");
    predicted_feasible = c.integer("feasible", 0, 1LL << 62);
    thinned = c.boolean("thinned");
    const json &xs = c.raw("step_s"), &ys = c.raw("peak_bytes");
    if (!xs.is_array() || !ys.is_array() || xs.size() != ys.size()) {
      throw c.error("step_s", "step_s and peak_bytes must be arrays of the same length");
    }
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (!xs[i].is_number() || !ys[i].is_number()) throw c.error("step_s", fmt::format("entry {} must be numbers", i));
      const double x = xs[i].get<double>(), y = ys[i].get<double>();
      if (!(x > 0 && x <= kMaxJsonMagnitude) || !(y >= 0 && y <= kMaxJsonMagnitude)) {
        throw InputError(fmt::format("{}: {}[{}] = {}, {}[{}] = {}: must be in (0, {:g}] and [0, {:g}]", c.file(),
                                     c.field("step_s"), i, x, c.field("peak_bytes"), i, y, kMaxJsonMagnitude,
                                     kMaxJsonMagnitude));
      }
      steps.push_back(x);
      bytes.push_back(y);
    }
    thinned = thin_drawn_points(steps, bytes) || thinned;  // memory and page size: see reports/thin.hpp
    drawn = steps.size();
  }
  double max_step = 0;
  for (double x : steps) max_step = std::max(max_step, x);
  for (const auto& p : pareto) max_step = std::max(max_step, p.estimate.time.step);
  for (const auto& p : top) max_step = std::max(max_step, p.estimate.time.step);
  const TimeUnit u = time_unit(max_step);
  sc.x.label = fmt::format("step time ({})", u.name);
  sc.y.label = "peak memory per GPU (GB)";
  svg::ScatterSeries all{"feasible candidates (analytic)", "#9aa5b1", {}, false, 2, true};
  for (std::size_t i = 0; i < steps.size(); ++i) {
    all.points.push_back({steps[i] / u.seconds, bytes[i] / kGB, "",
                          fmt::format("{} , {}", format_seconds(steps[i]), format_bytes(bytes[i]))});
  }
  svg::ScatterSeries front{"Pareto front (analytic)", kPalette[2], {}, true, 3.5, true};
  for (const auto& p : pareto) {
    const Estimate& e = p.estimate;
    front.points.push_back({e.time.step / u.seconds, e.peak_memory / kGB, "",
                            fmt::format("{}: {}, {}", describe(e.strategy), format_seconds(e.time.step),
                                        format_bytes(e.peak_memory))});
  }
  svg::ScatterSeries best{refined ? "top layouts (simulated step time)" : "top layouts", kPalette[0], {}, false, 4.5, true};
  for (std::size_t i = 0; i < top.size(); ++i) {
    const Estimate& e = top[i].estimate;
    best.points.push_back({e.time.step / u.seconds, e.peak_memory / kGB, i < 5 ? std::to_string(i + 1) : "",
                           fmt::format("#{} {}: {}, {}", i + 1, describe(e.strategy), format_seconds(e.time.step),
                                       format_bytes(e.peak_memory))});
  }
  if (!all.points.empty() || !front.points.empty() || !best.points.empty()) {
    sc.series = {all, front, best};
    std::string caption =
        "Each grey dot is a feasible layout the search predicted (analytic model; candidates pruned by the "
        "memory or step-time bounds are not drawn). The line is the step-time/peak-memory Pareto front within "
        "the search's window; numbers label the five best.";
    if (root.has("candidates")) {
      caption += fmt::format(" {} of {} predicted feasible candidates drawn{}.", drawn, predicted_feasible,
                             thinned ? " (dominated points thinned to one per grid cell, the front kept whole)" : "");
    }
    if (refined) caption += " The top layouts are drawn at their simulated step times, which differ from the analytic ones.";
    std::vector<svg::Series> leg;
    for (const auto& s : sc.series) leg.push_back({s.name, s.color});
    body += h3("Step time vs peak memory") + figure(svg::scatter(sc), caption, leg);
  }

  const JsonObject reasons = stats.object("infeasible_by_reason");
  const json& rj = stats.raw("infeasible_by_reason");
  std::vector<std::vector<std::string>> rows;
  for (auto it = rj.begin(); it != rj.end(); ++it) {
    rows.push_back({it.key(), std::to_string(reasons.integer(it.key(), 0, 1LL << 62))});
  }
  const long long pruned_oom = stats.integer("pruned_out_of_memory", 0, 1LL << 62);
  if (pruned_oom > 0) rows.push_back({"out of memory (proven by the bound, not predicted)", std::to_string(pruned_oom)});
  if (!rows.empty()) body += h3("Infeasible candidates by reason") + table({"reason", "candidates"}, rows, {false, true});
  return body;
}

// --- capacity ---

std::string capacity_body(const JsonObject& root) {
  const std::vector<JsonObject> options = root.objects("options");
  std::map<std::string, std::size_t> series_of;
  svg::Scatter sc;
  sc.title = "days to train vs cost";
  sc.x = {"days to train", true, std::nullopt, std::nullopt};
  sc.y = {"cost (USD)", true, std::nullopt, std::nullopt};
  std::vector<std::vector<std::string>> rows;
  auto pick = [&](const char* key) -> std::optional<std::size_t> {
    const json& v = root.raw(key);
    if (v.is_null()) return std::nullopt;
    const long long i = root.integer(key, 0, static_cast<long long>(options.size()) - 1);
    return static_cast<std::size_t>(i);
  };
  const auto deadline_pick = pick("cheapest_within_deadline"), budget_pick = pick("fastest_within_budget");
  std::vector<bool> on_front(options.size(), false);
  const json& pareto = root.raw("pareto");
  if (!pareto.is_array()) throw root.error("pareto", "must be an array of option indices");
  for (const json& i : pareto) {
    if (!i.is_number_unsigned() || i.get<std::size_t>() >= options.size()) {
      throw root.error("pareto", "must be an array of option indices");
    }
    on_front[i.get<std::size_t>()] = true;
  }
  std::vector<std::pair<double, double>> xy(options.size(), {0, 0});
  for (std::size_t i = 0; i < options.size(); ++i) {
    const JsonObject& o = options[i];
    const std::string cluster = o.string("cluster");
    const long long gpus = o.integer("gpus", 1, 1LL << 40);
    const bool feasible = o.boolean("feasible");
    if (!feasible) {
      rows.push_back({cluster, std::to_string(gpus), "infeasible: " + o.string("why"), "", "", "", "", ""});
      continue;
    }
    const double days = o.number("days", 0, kInf), cost = o.number("cost_usd", 0, kInf);
    xy[i] = {days, cost};
    // Figures the page does not show are still checked: the option's layout (a prediction) and
    // its non-negative figures, with the failure-aware ones (goodput a share in [0, 1]).
    (void)prediction_from_json(o.raw("best"), fmt::format("{}: {}", o.file(), o.field("best")));
    for (const char* k : {"hours", "tokens_per_s", "energy_kwh", "power_per_gpu_w", "price_per_gpu_hour_usd"}) {
      (void)o.number(k, 0, kInf);
    }
    if (o.has("failures")) {
      const JsonObject failures = o.object("failures");
      for (const auto& [k, v] : o.raw("failures").items()) (void)failures.number(k, 0, k == "goodput" ? 1 : kInf);
    }
    std::string marks;
    if (deadline_pick == i) marks += "cheapest within deadline ";
    if (budget_pick == i) marks += "fastest within budget ";
    if (on_front[i]) marks += "Pareto";
    rows.push_back({cluster, std::to_string(gpus), o.string("layout"), pct(o.number("mfu", 0, kInf)),
                    fmt::format("{:.1f}", days), fmt::format("{:.0f}", o.number("gpu_hours", 0, kInf)),
                    fmt::format("{:.0f}", cost), marks});
    auto [it, added] = series_of.emplace(cluster, sc.series.size());
    if (added) sc.series.push_back({cluster, kPalette[sc.series.size() % std::size(kPalette)], {}, true, 4, true});
    sc.series[it->second].points.push_back(
        {days, cost, std::to_string(gpus),
         fmt::format("{} x {}: {:.1f} days, ${:.0f}, {}", gpus, cluster, days, cost, o.string("layout"))});
  }
  std::string body;
  if (root.has("model")) {
    body += facts({{"model", root.string("model")},
                   {"tokens", fmt::format("{:g}", root.number("tokens", 0, kInf))},
                   {"global batch", fmt::format("{} x {} tokens", root.integer("global_batch", 0, 1LL << 40),
                                                root.integer("seq_len", 0, 1LL << 40))}});
  }
  if (deadline_pick && xy[*deadline_pick].first > 0) {
    sc.markers.push_back({xy[*deadline_pick].first, xy[*deadline_pick].second,
                          fmt::format("cheapest within {:g} days", root.number("deadline_days", 0, kInf)), "#c00"});
  }
  if (budget_pick && xy[*budget_pick].first > 0) {
    sc.markers.push_back({xy[*budget_pick].first, xy[*budget_pick].second,
                          fmt::format("fastest within ${:.0f}", root.number("budget_usd", 0, kInf)), "#070"});
  }
  if (!sc.series.empty()) {
    std::vector<svg::Series> leg;
    for (const auto& s : sc.series) leg.push_back({s.name, s.color});
    body += h3("Days to train vs cost") +
            figure(svg::scatter(sc),
                   "One point per cluster kind and GPU count (labelled with the GPU count), with its fastest layout; "
                   "both axes logarithmic. Rings mark the deadline and budget picks.",
                   leg);
  }
  body += h3("Options") + table({"cluster", "GPUs", "best layout", "MFU", "days", "GPU-hours", "cost USD", "pick"},
                                rows, {false, true, false, true, true, true, true, false});
  return body;
}

// --- measurement ---

std::string measurement_body(const json& j, const std::string& file) {
  const Measurement m = measurement_from_json(j, file);
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
  body += h3("Measured step time") +
          time_chart("measured step time breakdown",
                     {{"step (median)", s.median},
                      {"forward", b.forward},
                      {"backward", b.backward},
                      {"recompute", b.recompute},
                      {"TP communication", b.tp_comm},
                      {"CP communication", b.cp_comm},
                      {"PP communication", b.pp_comm},
                      {"DP comm., exposed", b.dp_comm_exposed},
                      {"pipeline bubble", b.bubble},
                      {"optimizer", b.optimizer},
                      {"other", b.other}},
                     s.median, "Median of each phase over the measured steps, on the busiest rank.", kPalette[1]);
  if (!m.per_stage.empty()) {
    svg::StackedBars c;
    c.title = "measured peak memory per stage";
    c.y.label = "peak memory per GPU (GB)";
    c.series = {{"peak memory", kPalette[1]}};
    for (const StagePeak& p : m.per_stage) {
      c.categories.push_back(fmt::format("stage {}", p.stage));
      c.values.push_back({p.peak / kGB});
      c.tooltips.push_back(format_bytes(p.peak));
    }
    body += h3("Measured memory") +
            figure(svg::stacked_bars(c), "Largest peak memory of the ranks of each pipeline stage (reserved by the "
                                         "CUDA caching allocator on GPUs, max RSS on CPU).");
  }
  return body;
}

// --- comparison ---

struct Figure {
  std::string label, unit;
  std::optional<double> predicted, measured, error_pct;
};

std::vector<Figure> figures(const JsonObject& root, const char* key) {
  std::vector<Figure> out;
  for (const JsonObject& f : root.objects(key)) {
    // Predicted and measured figures (times, bytes, rates) are never negative; errors may be.
    auto opt = [&](const char* k) -> std::optional<double> {
      if (f.raw(k).is_null()) return std::nullopt;
      return f.number(k, std::string(k) == "error_pct" ? -kInf : 0, kInf);
    };
    out.push_back({f.string("label"), f.string("unit"), opt("predicted"), opt("measured"), opt("error_pct")});
  }
  return out;
}

std::string error_text(const Figure& f) {
  if (f.predicted == 0.0 && f.measured == 0.0) return "n/a (both 0)";
  if (f.error_pct) return fmt::format("{:+.1f}%", *f.error_pct);
  return "n/a";
}

std::string value_text(std::optional<double> v, const std::string& unit) {
  if (!v) return "n/a";
  if (unit == "s") return format_seconds(*v);
  if (unit == "B") return format_bytes(*v);
  return fmt::format("{:.4g} {}", *v, unit);
}

std::string paired_chart(const std::string& title, const std::vector<Figure>& figs, const std::string& unit,
                         const std::string& caption) {
  double top = 0;
  for (const auto& f : figs) top = std::max({top, f.predicted.value_or(0), f.measured.value_or(0)});
  double scale = 1;
  std::string axis;
  if (unit == "s") {
    const TimeUnit u = time_unit(top);
    scale = u.seconds;
    axis = fmt::format("time per step ({})", u.name);
  } else {
    scale = kGB;
    axis = "peak memory (GB)";
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

std::string comparison_body(const JsonObject& root) {
  const JsonObject model = root.object("model"), cluster = root.object("cluster");
  const JsonObject st = root.object("measured_step_time");
  std::string body = facts({{"prediction", root.string("prediction_file")},
                            {"measurement", root.string("measurement_file")},
                            {"model", model.string("measured")},
                            {"cluster", cluster.string("measured")},
                            {"layout", describe(strategy_from_json(root.raw("strategy"), root.file()))},
                            {"measured step", fmt::format("median {} over {} steps (stdev {})",
                                                          format_seconds(st.number("median_s", 0, kInf)),
                                                          st.integer("count", 0, 1LL << 40),
                                                          format_seconds(st.number("stdev_s", 0, kInf)))}});
  const json& warnings = root.raw("warnings");
  if (warnings.is_array() && !warnings.empty()) {
    body += "<ul class=\"warnings\">";
    for (const json& w : warnings) body += "<li>" + escape(w.is_string() ? w.get<std::string>() : w.dump()) + "</li>";
    body += "</ul>\n";
  }
  const std::vector<Figure> time = figures(root, "time"), memory = figures(root, "memory"),
                            throughput = figures(root, "throughput");
  const std::string err = "Error = (predicted - measured) / measured; n/a where a side has no figure or the measured one is 0.";
  if (!time.empty()) body += h3("Time per step") + paired_chart("predicted vs measured time", time, "s", err);
  if (!memory.empty()) body += h3("Peak memory") + paired_chart("predicted vs measured memory", memory, "B", err);
  if (!throughput.empty()) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& f : throughput) {
      rows.push_back({f.label, value_text(f.predicted, f.unit), value_text(f.measured, f.unit), error_text(f)});
    }
    body += h3("Throughput") + table({"figure", "predicted", "measured", "error"}, rows, {false, true, true, true});
  }
  return body;
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
  if (!it->is_string()) throw root.error("schema", "must be a string such as \"trainplan/prediction/v1\"");
  const std::string s = it->get<std::string>();
  if (s == "trainplan/prediction/v1") return "prediction";
  if (s == "trainplan/search/v1") return "search";
  if (s == "trainplan/capacity/v1") return "capacity";
  if (s == "trainplan/measurement/v1") return "measurement";
  if (s == kComparisonSchema) return "comparison";
  throw root.error("schema", "must be one of trainplan/prediction/v1, search/v1, capacity/v1, measurement/v1, "
                             "comparison/v1");
}

std::string html_report(const std::vector<ReportDocument>& docs, const std::string& title) {
  std::string body, files;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const ReportDocument& d = docs[i];
    const std::string file = d.file.empty() ? "(this run)" : d.file;
    const std::string kind = report_kind(d.json, file);
    const JsonObject root(d.json, file);
    const std::string id = fmt::format("{}-{}", kind, i + 1);
    files += (files.empty() ? "" : ", ") + file;
    if (kind == "prediction") {
      const bool simulated = root.has("simulation");
      const std::string model = root.has("model") ? root.string("model") : "";
      body += section(id, fmt::format("{}{}", simulated ? "Simulated step" : "Prediction", model.empty() ? "" : ": " + model),
                      d.file, prediction_body(root, d.json, file));
    } else if (kind == "search") {
      body += section(id, "Search: " + root.string("model") + " on " + root.string("cluster"), d.file,
                      search_body(root, file));
    } else if (kind == "capacity") {
      body += section(id, "Capacity: " + root.string("model"), d.file, capacity_body(root));
    } else if (kind == "measurement") {
      body += section(id, "Measured run", d.file, measurement_body(d.json, file));
    } else {
      body += section(id, "Predicted vs measured", d.file, comparison_body(root));
    }
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
