#include "reports/comparison_json.hpp"

#include <fmt/format.h>

#include <cmath>

#include "reports/schema_fields.hpp"
#include "sim/check.hpp"

namespace trainplan {

using nlohmann::json;
using schema::kInf;

namespace {

json optional_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json figures_json(const std::vector<ComparedFigure>& rows) {
  json out = json::array();
  for (const ComparedFigure& f : rows) {
    out.push_back({{"key", f.key},
                   {"label", f.label},
                   {"unit", f.unit},
                   {"predicted", optional_json(f.predicted)},
                   {"measured", optional_json(f.measured)},
                   {"error_pct", optional_json(f.error_pct)},
                   {"not_predicted", f.not_predicted()}});
  }
  return out;
}

// error_pct: null, or the finite percent_error of the row's figures (to rounding in the file).
std::optional<double> read_error(const JsonObject& f, const ComparedFigure& row) {
  const json& v = f.raw("error_pct");
  const std::optional<double> expected = percent_error(row.predicted, row.measured);
  if (v.is_null()) {
    if (expected) throw f.error("error_pct", fmt::format("must be {} = 100 x (predicted / measured - 1)", *expected));
    return std::nullopt;
  }
  if (!v.is_number() || !std::isfinite(v.get<double>())) throw f.error("error_pct", "must be a number or null");
  if (!expected) throw f.error("error_pct", "must be null: the predicted or measured figure is absent or 0");
  schema::check_consistent(f, "error_pct", v.get<double>(), *expected, "must equal 100 x (predicted / measured - 1)");
  return v.get<double>();
}

ComparedFigure read_figure(const JsonObject& f) {
  ComparedFigure row;
  row.key = f.string("key");
  row.label = f.string("label");
  row.unit = f.choice("unit", {"s", "B", "tokens/s", "TFLOP/s"});
  // Predicted and measured figures (times, bytes, rates) are never negative; errors may be.
  row.predicted = schema::nullable_number(f, "predicted", 0, kInf);
  row.measured = schema::nullable_number(f, "measured", 0, kInf);
  row.error_pct = read_error(f, row);
  if (f.boolean("not_predicted") != row.not_predicted()) {
    throw f.error("not_predicted", "must be true exactly where the predicted figure is 0 and the measured one is not");
  }
  f.finish();
  return row;
}

std::vector<ComparedFigure> read_figures(const JsonObject& root, const char* key) {
  std::vector<ComparedFigure> out;
  for (const JsonObject& f : root.objects(key)) out.push_back(read_figure(f));
  return out;
}

// {"predicted", "measured"} names: the predicted one "" where the prediction names none.
std::pair<std::string, std::string> read_names(const JsonObject& root, const char* key) {
  const JsonObject o = root.object(key);
  std::pair<std::string, std::string> out{schema::text(o, "predicted"), o.string("measured")};
  o.finish();
  return out;
}

void read_step_time(const JsonObject& st, Comparison& c) {
  Spread& s = c.measured_step_time;
  s.median = st.number("median_s", 0, kInf);
  s.mean = st.number("mean_s", 0, kInf);
  s.stdev = st.number("stdev_s", 0, kInf);
  s.min = st.number("min_s", 0, kInf);
  s.max = st.number("max_s", 0, kInf);
  s.count = static_cast<int>(st.integer("count", 1, 1 << 30));
  c.warmup = static_cast<int>(st.integer("warmup_steps", 0, 1 << 24));
  st.finish();
}

// A file name as the command line gave it: any text (the page escapes it).
std::string file_name(const JsonObject& root, const char* key) {
  const json& v = root.raw(key);
  if (!v.is_string()) throw root.error(key, "must be a string");
  return v.get<std::string>();
}

}  // namespace

json comparison_to_json(const Comparison& c, const std::string& prediction_file, const std::string& measurement_file) {
  const Spread& s = c.measured_step_time;
  return {{"schema", kComparisonSchema},
          {"prediction_file", prediction_file},
          {"measurement_file", measurement_file},
          {"model", {{"predicted", c.predicted_model}, {"measured", c.measured_model}}},
          {"cluster", {{"predicted", c.predicted_cluster}, {"measured", c.measured_cluster}}},
          {"predicted_feasible", c.predicted_feasible},
          {"strategy", to_json(c.strategy)},
          {"strategies_match", c.strategies_match},
          {"strategy_differences", c.strategy_differences},
          {"warnings", c.warnings},
          {"measured_step_time",
           {{"median_s", s.median}, {"mean_s", s.mean}, {"stdev_s", s.stdev}, {"min_s", s.min}, {"max_s", s.max},
            {"count", s.count}, {"warmup_steps", c.warmup}}},
          {"time", figures_json(c.time)},
          {"memory", figures_json(c.memory)},
          {"throughput", figures_json(c.throughput)}};
}

ComparisonDoc comparison_from_json(const json& j, const std::string& file) {
  const JsonObject root(j, file);
  schema::check_schema(root, kComparisonSchema, "is this a comparison file?");
  ComparisonDoc d;
  Comparison& c = d.comparison;
  d.prediction_file = file_name(root, "prediction_file");
  d.measurement_file = file_name(root, "measurement_file");
  std::tie(c.predicted_model, c.measured_model) = read_names(root, "model");
  std::tie(c.predicted_cluster, c.measured_cluster) = read_names(root, "cluster");
  c.predicted_feasible = root.boolean("predicted_feasible");
  c.strategy = strategy_from_json(root.raw("strategy"), file);
  c.strategies_match = root.boolean("strategies_match");
  c.strategy_differences = schema::texts(root, "strategy_differences");
  if (c.strategies_match != c.strategy_differences.empty()) {
    throw root.error("strategies_match", "must be true exactly when strategy_differences is empty");
  }
  c.warnings = schema::texts(root, "warnings");
  read_step_time(root.object("measured_step_time"), c);
  c.time = read_figures(root, "time");
  c.memory = read_figures(root, "memory");
  c.throughput = read_figures(root, "throughput");
  root.finish();
  return d;
}

}  // namespace trainplan
