// trainplan/comparison/v1: what `trainplan compare --json` writes and `trainplan report` reads. One
// schema: a Comparison (sim/compare.hpp) and the two files it came from, written by
// comparison_to_json and read back by comparison_from_json.
//
// {"schema", "prediction_file", "measurement_file", "model": {"predicted", "measured"},
//  "cluster": {"predicted", "measured"}, "predicted_feasible", "strategy", "strategies_match",
//  "strategy_differences": [...], "warnings": [...],
//  "measured_step_time": {"median_s", "mean_s", "stdev_s", "min_s", "max_s", "count", "warmup_steps"},
//  "time" | "memory" | "throughput": [{"key", "label", "unit", "predicted", "measured", "error_pct",
//                                      "not_predicted"}]}
// The predicted model and cluster are "" where the prediction names none. A figure's predicted or
// measured value is null where that side has none; error_pct is percent_error(predicted, measured)
// (sim/compare.hpp): null where it has no value, else any finite number (a ratio of two figures of
// the files, which can exceed the magnitude of the figures themselves), and not_predicted is
// ComparedFigure::not_predicted().
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "sim/compare.hpp"

namespace trainplan {

inline constexpr const char* kComparisonSchema = "trainplan/comparison/v1";

struct ComparisonDoc {
  Comparison comparison;
  std::string prediction_file, measurement_file;
};

nlohmann::json comparison_to_json(const Comparison& c, const std::string& prediction_file,
                                  const std::string& measurement_file);
// Throws InputError naming `file` and the field.
ComparisonDoc comparison_from_json(const nlohmann::json& j, const std::string& file);

}  // namespace trainplan
