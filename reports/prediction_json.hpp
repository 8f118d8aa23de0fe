// trainplan/prediction/v1: the JSON contract other tools read. Bytes and seconds throughout.
#pragma once
#include <nlohmann/json.hpp>

#include <vector>

#include "sim/cluster.hpp"
#include "sim/estimate.hpp"
#include "sim/layer_detail.hpp"

namespace trainplan {

inline constexpr const char* kPredictionSchema = "trainplan/prediction/v1";

// The full prediction object:
// {"schema", "feasible", "infeasible_reasons", "strategy", "memory": {"peak_bytes",
//  "capacity_bytes", "per_stage": [...]}, "time": {"step_s", ...}, "throughput": {...}}
// `extra` entries (e.g. "model", "cluster", "engine") are added at the top level.
nlohmann::json prediction_to_json(const Estimate& e, const nlohmann::json& extra = nlohmann::json::object());

}  // namespace trainplan

namespace trainplan {

// The "layers" value of predict --detail layers: {"note", "stages": [{"stage", "chunks_in_flight",
// "recompute_working_bytes", "rows": [{"part": "embedding"|"layers"|"head", "chunk", "count",
// "first_layer" (layers rows), "forward_s", "backward_s", "recompute_s", "tp_comm_s", "cp_comm_s", "params", "weights",
// "gradients", "optimizer", "weight_copies", "activations"}], "total": {"forward_s", ...}}]}.
// The "cost" value: {"usd_per_step", "price_per_gpu_hour_usd", "gpus", "price_source"}, USD per step
// from search's cost objective (objective_value); null where the cluster file gives no price.
nlohmann::json cost_to_json(const Estimate& e, const Cluster& cluster);

nlohmann::json layer_detail_to_json(const std::vector<StageDetail>& stages);

}  // namespace trainplan
