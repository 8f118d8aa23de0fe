// Words for infeasibility: turns the Infeasible values of an Estimate into the text that the
// console and the trainplan/prediction/v1 "infeasible_reasons" show, e.g.
//   "out of memory: stage 0 needs 93.4 GB, the GPU has 85.9 GB"
//   "invalid: --tp 3: must divide heads 32"
//   "unsupported dtype: A100-SXM4-80GB has no fp8 peak"
//   "cluster too small: 4096 GPUs requested, dgx-a100 has at most 1024"
// The text before the first ':' is reason_key(reason) (sim/estimate.hpp).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sim/estimate.hpp"

namespace trainplan {

// One reason as text; `s` is the strategy it belongs to (the dtype an unsupported-dtype reason names).
std::string describe(const Infeasible& why, const Strategy& s);

// Every reason of `e`, in order (empty for a feasible estimate).
std::vector<std::string> infeasible_reasons(const Estimate& e);

// Counts by reason, keyed by reason_key() (sorted by that name, as the reports list them).
std::map<std::string, std::int64_t> counts_by_key(const std::map<InfeasibleReason, std::int64_t>& counts);

// The reason whose reason_key() is `key` (as a result file spells it); nullopt for another text.
std::optional<InfeasibleReason> parse_reason_key(const std::string& key);

}  // namespace trainplan
