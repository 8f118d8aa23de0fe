// trainplan/prediction/v1: what predict and simulate write (and each entry of a search's and a
// capacity run's lists), what compare, report and --plan read. Bytes and seconds throughout. One
// schema: PredictionDoc, written by prediction_to_json and read back by prediction_from_json.
//
// {"schema", "feasible", "infeasible_reasons": [text], "strategy": {sim/strategy.hpp to_json},
//  "memory": {"peak_bytes", "capacity_bytes", "per_stage": [{"stage", "layers", "weights",
//             "gradients", "optimizer", "activations", "other", "weight_copies", "temporaries",
//             "allocator", "runtime", "total"}]},
//  "time": {"step_s", "compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s",
//           "dp_comm_exposed_s", "bubble_s", "optimizer_s"},
//  "throughput": {"tokens_per_s", "tokens_per_s_per_gpu", "model_flops_per_step",
//                 "model_flops_per_step_full_attention", "hardware_flops_per_step",
//                 "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "mfu_full_attention", "hfu"}
//                 (model FLOPs and MFU count causal attention as computed, half the score matrix;
//                 the _full_attention pair counts all of it, as Megatron-LM and NeMo publish MFU;
//                 predictions written before the pair existed lack it: read as 0),
//  "parameter_server": {"workers", "staleness_updates", "updates_per_s"}  exactly when the strategy
//                                                                          uses parameter servers,
//  "time" has "ep_comm_s" (exposed expert all-to-all) for plans whose step has any;
//  and, where the writer has them: "model", "cluster", "software", "software_executor" (the
//  profile's describes_executor, sim/software.hpp), "engine": "analytic"|"des",
//  "model_spec" (predict, simulate: the model itself as a trainplan model file holds it, exact
//  keys, sim/model_spec.hpp to_json; "model" is its name), so that --plan needs no model file,
//  "parameters": {"total", "active", "embedding", "expert", "mtp"} (models with experts or MTP),
//  "cost" (predict: object or null), "layers" (predict --detail layers), "simulation"
//  (simulate, reports/simulation_json.hpp), "rank" and "objective_value" (a search's top list)}
// Predictions written before the allocator-aware memory model lack per_stage's weight_copies,
// temporaries, allocator and runtime (read as 0) and "layers"; a stage's total is checked against
// the sum of its parts, per_stage has one entry per pipeline stage in order (none only in an
// infeasible plan whose memory was never costed, whose peak_bytes is 0) and peak_bytes is the
// largest total.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "reports/simulation_json.hpp"
#include "sim/cluster.hpp"
#include "sim/estimate.hpp"
#include "sim/json_reader.hpp"
#include "sim/layer_detail.hpp"
#include "sim/model_spec.hpp"

namespace trainplan {

inline constexpr const char* kPredictionSchema = "trainplan/prediction/v1";

// predict's cost per step: {"usd_per_step", "price_per_gpu_hour_usd", "gpus", "price_source"},
// USD per step from search's cost objective (objective_value); null (priced false) where the
// cluster file gives no price or the plan no step time.
struct PredictionCost {
  bool priced = false;
  double usd_per_step = 0, price_per_gpu_hour_usd = 0;
  int gpus = 0;
  std::string price_source;
};

struct PredictionDoc {
  Estimate estimate;                            // estimate.infeasible stays empty when read: the
  std::vector<std::string> infeasible_reasons;  // reasons are text (reports/infeasible.hpp)
  std::string model, cluster, software, engine;  // "" where the document names none
  std::optional<ModelSpec> model_spec;          // the model itself, where the document carries it
  std::string software_executor;                 // the profile's describes_executor ("" where none)
  std::optional<PredictionCost> cost;
  std::optional<std::vector<StageDetail>> layers;
  // The model's parameter counts (LayerGraph::counts): written for models with experts or MTP
  // modules, whose total and active counts differ.
  std::optional<ParamCounts> parameters;
  std::optional<SimulationDoc> simulation;
  std::optional<long long> rank;                // both set in a search's top list, neither elsewhere
  std::optional<double> objective_value;
};

// The document of `e` (its reasons worded by infeasible_reasons); the caller sets the rest.
PredictionDoc prediction_doc(const Estimate& e);
nlohmann::json prediction_to_json(const PredictionDoc& d);
// Throws InputError naming `file` and the field: an unknown key, a missing one, a wrong type, a
// figure out of range, a stage total that is not the sum of its parts.
PredictionDoc prediction_from_json(const nlohmann::json& j, const std::string& file);

// The optional "model_spec" of a prediction or search document `root` (nullopt when absent),
// read as a trainplan model file (parse_model: exact keys); `name`, the document's "model" ("" if
// it has none), must be the spec's name.
std::optional<ModelSpec> read_model_spec(const JsonObject& root, const std::string& name);

PredictionCost prediction_cost(const Estimate& e, const Cluster& cluster);

// The "cost" value alone (null when not priced).
nlohmann::json cost_to_json(const Estimate& e, const Cluster& cluster);

// The "layers" value of predict --detail layers: {"note", "stages": [{"stage", "chunks_in_flight",
// "recompute_working_bytes", "rows": [{"part": "embedding"|"layers"|"head", "chunk", "count",
// "first_layer" (layers rows), "kind" and "chunk_layers" (layers rows of a kind other than dense
// full attention / of a chunk mixing kinds: `count` of the chunk's `chunk_layers` from
// `first_layer` on), "forward_s", "backward_s", "recompute_s", "tp_comm_s", "cp_comm_s",
// "ep_comm_s" (where exposed), "mtp_layers" (a head row with MTP modules), "params", "weights",
// "gradients", "optimizer", "weight_copies", "activations"}], "total":
// {"forward_s", "backward_s", "recompute_s", "tp_comm_s", "cp_comm_s"}}]}.
nlohmann::json layer_detail_to_json(const std::vector<StageDetail>& stages);

}  // namespace trainplan
