// Console tables of `trainplan search` and `trainplan capacity`. Formatting only: every figure
// comes from SearchResult / CapacityResult. Their JSON documents are trainplan/search/v1
// (reports/search_json.hpp) and trainplan/capacity/v1 (reports/capacity_json.hpp).
#pragma once
#include <ostream>

#include "reports/capacity_json.hpp"
#include "reports/search_json.hpp"
#include "sim/capacity.hpp"
#include "sim/search.hpp"

namespace trainplan {

// Ranked table (layout, GPUs, memory peak/capacity, step time, tokens/s, MFU), the best
// infeasible candidates with their reasons, the counts, and the Pareto front.
void print_search(std::ostream& os, const SearchResult& r, const SearchContext& ctx);

// One row per (cluster, GPU count): best layout, days, GPU-hours, cost, energy; then the
// cheapest option meeting the deadline, the fastest within the budget, and the cost/time front.
void print_capacity(std::ostream& os, const CapacityResult& r, const CapacityContext& ctx);

}  // namespace trainplan
