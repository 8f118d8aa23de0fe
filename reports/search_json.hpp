// trainplan/search/v1: what `trainplan search --json` writes and report and --plan read. One
// schema: SearchDoc, written by search_to_json and read back by search_from_json.
//
// {"schema", "model", "cluster", "objective", "objective_unit", "pareto_window",
//  "model_spec" (the searched model as a trainplan model file holds it; prediction_json.hpp: what
//               --plan runs the best entry with; absent in searches written before it),
//  "software" (the profile the candidates were costed with, which --plan costs the best entry
//              with; absent in searches written before it),
//  "space": {"gpus", "exact_gpus", "global_batch", "seq_len", "dtype", "attention", "max_tp",
//            "max_pp", "max_cp", "max_dp", "max_vp", "max_micro_batch",
//            "lists": {"zero", "recompute", "schedules", "sequence_parallel", and where the search
//                      opted in to other DP algorithms: "dp_algorithms", "grad_compressions",
//                      "ps_servers", "ps_placement"}},
//  "search": SEARCH_STATS,
//  "top": [prediction/v1 + "rank", "objective_value"], "pareto": [prediction/v1],
//  "infeasible": [prediction/v1],
//  "candidates" (with SearchResult::points): {"feasible" (count), "thinned", "step_s": [...],
//                 "peak_bytes": [...]} -- at most 2000 of the feasible candidates predicted, the
//                 step-time/memory front kept whole (svg::thin_points)}
// SEARCH_STATS = {"candidates", "evaluated", "feasible", "infeasible_by_reason": {reason_key: count},
//  "pruned_out_of_memory", "pruned_by_bound", "layouts", "max_gpus_considered", "elapsed_s",
//  "threads", "top_refined_with_simulation"} (also each capacity option's "search").
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reports/prediction_json.hpp"
#include "sim/json_reader.hpp"
#include "sim/search.hpp"

namespace trainplan {

inline constexpr const char* kSearchSchema = "trainplan/search/v1";

// What was searched, for titles and the JSON header.
struct SearchContext {
  std::string model, cluster;
  const SearchSpace* space = nullptr;
  Objective objective = Objective::throughput;
  double pareto_window = 1;
  const ModelSpec* model_spec = nullptr;  // written as "model_spec" when given
  std::string software;                   // written as "software" when not empty
  Bytes gpu_memory = 0;                   // the cluster's GPU memory, quoted when nothing fits (0: not given)
};

// The feasible candidates drawn in the report's scatter plot.
struct SearchCandidates {
  std::int64_t feasible = 0;  // feasible candidates predicted
  bool thinned = false;       // fewer drawn than predicted
  std::vector<std::pair<Seconds, Bytes>> points;  // (step time, peak memory) of those drawn
};

struct SearchDoc {
  std::string model, cluster;
  std::optional<ModelSpec> model_spec;  // the entries' model, where the document carries it
  std::string software;                 // the entries' software profile; "" where it names none
  Objective objective = Objective::throughput;
  SearchSpace space;
  SearchStats stats;
  double pareto_window = 1;
  std::vector<PredictionDoc> top;  // each with rank (1, 2, ...) and objective_value
  std::vector<PredictionDoc> pareto, infeasible;
  std::optional<SearchCandidates> candidates;
};

// The objective's unit as the file and the consoles name it: tokens/s, USD/step, s/step.
const char* objective_unit(Objective o);

SearchDoc search_doc(const SearchResult& r, const SearchContext& ctx);
nlohmann::json search_to_json(const SearchDoc& d);
nlohmann::json search_to_json(const SearchResult& r, const SearchContext& ctx);
// Throws InputError naming `file` and the field (an entry's as "<file>: top[2]: <field>").
SearchDoc search_from_json(const nlohmann::json& j, const std::string& file);

nlohmann::json search_stats_to_json(const SearchStats& st);
SearchStats search_stats_from_json(const JsonObject& o);

}  // namespace trainplan
