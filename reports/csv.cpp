#include "reports/csv.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "reports/infeasible.hpp"

namespace trainplan {

std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';  // a quote is doubled
    out += c;
  }
  return out + "\"";
}

std::string csv_row(const std::vector<std::string>& fields) {
  std::string out;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ',';
    out += csv_field(fields[i]);
  }
  return out + "\r\n";
}

namespace {

// Shortest text that reads back as the same double.
std::string number(double v) { return fmt::format("{}", v); }

std::vector<std::string> layout_fields(const Strategy& s) {
  return {describe(s),         std::to_string(s.dp),         std::to_string(s.tp),
          std::to_string(s.pp), std::to_string(s.cp),         std::to_string(s.vp),
          std::to_string(s.zero), std::to_string(s.micro_batch), to_string(s.recompute),
          to_string(s.schedule), s.sequence_parallel ? "on" : "off", std::to_string(s.gpus())};
}

const std::vector<std::string> kLayoutHeader = {"layout", "dp", "tp", "pp", "cp", "vp", "zero", "micro_batch",
                                                "recompute", "schedule", "sequence_parallel", "gpus"};

}  // namespace

std::string search_to_csv(const SearchResult& r, const SearchContext& ctx) {
  std::vector<std::string> head = {"list", "rank"};
  head.insert(head.end(), kLayoutHeader.begin(), kLayoutHeader.end());
  const std::string objective = fmt::format("objective_{}", to_string(ctx.objective));
  for (const char* h : {"peak_memory_GB", "capacity_GB", "step_s", "tokens_per_s", "mfu_percent", "engine"}) head.push_back(h);
  head.push_back(objective + (ctx.objective == Objective::throughput ? "_tokens_per_s"
                              : ctx.objective == Objective::cost   ? "_USD_per_step"
                                                                   : "_s_per_step"));
  head.push_back("infeasible_reason");
  std::string out = csv_row(head);
  auto row = [&](const char* list, std::size_t rank, const Estimate& e, const std::string& engine,
                 const std::string& value) {
    std::vector<std::string> f = {list, rank ? std::to_string(rank) : ""};
    const auto l = layout_fields(e.strategy);
    f.insert(f.end(), l.begin(), l.end());
    for (const std::string& x : {number(e.peak_memory / kGB), number(e.capacity / kGB), number(e.time.step),
                                 number(e.throughput.tokens_per_s), number(100 * e.throughput.mfu), engine, value}) {
      f.push_back(x);
    }
    f.push_back(e.infeasible.empty() ? "" : describe(e.infeasible.front(), e.strategy));
    out += csv_row(f);
  };
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const double v = i < r.top_value.size() ? r.top_value[i] : 0;
    row("top", i + 1, r.top[i], r.stats.refined > 0 ? "des" : "analytic",
        number(ctx.objective == Objective::throughput ? -v : v));
  }
  for (const Estimate& e : r.pareto) row("pareto", 0, e, "analytic", "");
  for (const Estimate& e : r.infeasible) row("infeasible", 0, e, "analytic", "");
  return out;
}

std::string capacity_to_csv(const CapacityResult& r, const CapacityContext&) {
  std::vector<std::string> head = {"cluster", "feasible"};
  head.insert(head.end(), kLayoutHeader.begin(), kLayoutHeader.end());
  for (const char* h : {"mfu_percent", "tokens_per_s", "days", "gpu_hours", "cost_USD", "energy_kWh",
                        "price_USD_per_gpu_hour", "power_W_per_gpu", "pick", "why_infeasible"}) {
    head.push_back(h);
  }
  std::string out = csv_row(head);
  for (std::size_t i = 0; i < r.options.size(); ++i) {
    const CapacityOption& o = r.options[i];
    std::vector<std::string> f = {o.cluster, o.feasible ? "yes" : "no"};
    if (o.feasible) {
      const auto l = layout_fields(o.best.strategy);
      f.insert(f.end(), l.begin(), l.end());
    } else {
      std::vector<std::string> blank(kLayoutHeader.size());
      blank.back() = std::to_string(o.gpus);
      f.insert(f.end(), blank.begin(), blank.end());
    }
    std::string pick;
    auto add = [&](const char* what) {
      if (!pick.empty()) pick += "; ";
      pick += what;
    };
    if (r.cheapest_in_deadline == i) add("cheapest within deadline");
    if (r.fastest_in_budget == i) add("fastest within budget");
    if (std::find(r.pareto.begin(), r.pareto.end(), i) != r.pareto.end()) add("pareto");
    if (o.feasible) {
      for (const std::string& x : {number(100 * o.best.throughput.mfu), number(o.best.throughput.tokens_per_s),
                                   number(o.days), number(o.gpu_hours), number(o.cost_usd), number(o.energy_kwh)}) {
        f.push_back(x);
      }
    } else {
      f.insert(f.end(), 6, "");
    }
    f.push_back(number(o.price_per_gpu_hour));
    f.push_back(number(o.power_per_gpu_w));
    f.push_back(pick);
    f.push_back(o.feasible ? "" : o.why);
    out += csv_row(f);
  }
  return out;
}

}  // namespace trainplan
