// trainplan/prediction/v1: the JSON contract other tools read. Bytes and seconds throughout.
#pragma once
#include <nlohmann/json.hpp>

#include "sim/estimate.hpp"

namespace trainplan {

inline constexpr const char* kPredictionSchema = "trainplan/prediction/v1";

// The full prediction object:
// {"schema", "feasible", "infeasible_reasons", "strategy", "memory": {"peak_bytes",
//  "capacity_bytes", "per_stage": [...]}, "time": {"step_s", ...}, "throughput": {...}}
// `extra` entries (e.g. "model", "cluster", "engine") are added at the top level.
nlohmann::json prediction_to_json(const Estimate& e, const nlohmann::json& extra = nlohmann::json::object());

}  // namespace trainplan
