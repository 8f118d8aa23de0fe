// Console tables and JSON of `trainplan search` (trainplan/search/v1) and `trainplan capacity`
// (trainplan/capacity/v1). Formatting only: every figure comes from SearchResult / CapacityResult.
#pragma once
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "sim/capacity.hpp"
#include "sim/search.hpp"

namespace trainplan {

inline constexpr const char* kSearchSchema = "trainplan/search/v1";
inline constexpr const char* kCapacitySchema = "trainplan/capacity/v1";

// What was searched, for titles and the JSON header.
struct SearchContext {
  std::string model, cluster;
  const SearchSpace* space = nullptr;
  Objective objective = Objective::throughput;
  double pareto_window = 1;
};

// Ranked table (layout, GPUs, memory peak/capacity, step time, tokens/s, MFU), the best
// infeasible candidates with their reasons, the counts, and the Pareto front.
void print_search(std::ostream& os, const SearchResult& r, const SearchContext& ctx);

// {"schema", "model", "cluster", "objective", "space": {...}, "search": {"evaluated", "feasible",
//  "infeasible_by_reason", "elapsed_s", "threads", ...}, "top": [prediction/v1 + "rank",
//  "objective_value"], "pareto": [prediction/v1], "infeasible": [prediction/v1]}, and with
// SearchResult::points "candidates": {"feasible" (count), "thinned", "step_s": [...],
// "peak_bytes": [...]} -- at most 2000 of the feasible candidates predicted, the step-time/memory
// front kept whole (svg::thin_points)
nlohmann::json search_to_json(const SearchResult& r, const SearchContext& ctx);

struct CapacityContext {
  std::string model;
  double tokens = 0;
  int global_batch = 0, seq_len = 0;
  std::optional<double> deadline_days, budget_usd;
};

// One row per (cluster, GPU count): best layout, days, GPU-hours, cost, energy; then the
// cheapest option meeting the deadline, the fastest within the budget, and the cost/time front.
void print_capacity(std::ostream& os, const CapacityResult& r, const CapacityContext& ctx);
nlohmann::json capacity_to_json(const CapacityResult& r, const CapacityContext& ctx);

}  // namespace trainplan
