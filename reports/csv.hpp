// CSV output of the tabular results, for spreadsheet users (RFC 4180: comma-separated, a field
// with a comma, quote or line break is quoted with its quotes doubled, CRLF line ends). The header
// row names each column with its unit. Formatting only: every figure comes from the result.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "reports/search_report.hpp"

namespace trainplan {

// One CSV field, quoted when it needs to be.
std::string csv_field(std::string_view s);
// One record: the fields joined by commas, ended with CRLF.
std::string csv_row(const std::vector<std::string>& fields);

// `trainplan search --csv`: one row per layout of the top list, then the Pareto front, then the
// best infeasible candidates ("list" column: top, pareto, infeasible), with the layout's fields,
// GPUs, peak memory, step time, tokens/s, MFU and the objective value (top only).
std::string search_to_csv(const SearchResult& r, const SearchContext& ctx);

// `trainplan capacity --csv`: one row per (cluster, GPU count) option: its best layout, days,
// GPU-hours, cost, energy, and which pick it is (cheapest within the deadline, fastest within
// the budget, on the cost/time Pareto front); infeasible options with the reason.
std::string capacity_to_csv(const CapacityResult& r, const CapacityContext& ctx);

}  // namespace trainplan
