// `trainplan compare`: reading a trainplan/prediction/v1 file back, and formatting a Comparison
// (sim/compare.hpp) as a console table and as trainplan/comparison/v1 JSON. Formatting only: every
// figure printed comes from the two files or from compare().
//
// trainplan/comparison/v1:
// {"schema", "prediction_file", "measurement_file", "model": {"predicted", "measured"},
//  "cluster": {"predicted", "measured"}, "predicted_feasible", "strategy", "strategies_match",
//  "strategy_differences": [...], "warnings": [...],
//  "measured_step_time": {"median_s", "mean_s", "stdev_s", "min_s", "max_s", "count", "warmup_steps"},
//  "time" | "memory" | "throughput": [{"key", "label", "unit", "predicted", "measured", "error_pct",
//                                      "not_predicted"}]}
// (null where a side has no figure; error_pct null and not_predicted true where the prediction is
// 0 and the measurement is not).
#pragma once
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "sim/compare.hpp"
#include "sim/estimate.hpp"

namespace trainplan {

inline constexpr const char* kComparisonSchema = "trainplan/comparison/v1";

struct PredictionFile {
  Estimate estimate;
  std::string model;    // top-level "model" if present, else ""
  std::string cluster;  // top-level "cluster" if present, else ""
  std::string software; // top-level "software" (the profile predict costed) if present, else ""
  std::vector<std::string> infeasible_reasons;  // as the file words them (estimate.infeasible stays empty)
};

// Reads the trainplan/prediction/v1 keys that compare uses (schema, feasible, infeasible_reasons,
// strategy, memory, time, throughput; optional model, cluster), each required, typed and range
// checked. Other keys are allowed: engines and later versions add their own (e.g. "engine").
// Throws InputError naming `file` and the field.
PredictionFile prediction_from_json(const nlohmann::json& j, const std::string& file);

void print_comparison(std::ostream& os, const Comparison& c, const std::string& prediction_file,
                      const std::string& measurement_file);

nlohmann::json comparison_to_json(const Comparison& c, const std::string& prediction_file,
                                  const std::string& measurement_file);

}  // namespace trainplan
