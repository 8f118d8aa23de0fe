#include "reports/compare.hpp"
#include "reports/console.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "reports/prediction_json.hpp"
#include "sim/check.hpp"
#include "sim/json_reader.hpp"

namespace trainplan {

using nlohmann::json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The consoles' one rule for times and bytes (console.hpp).
std::string seconds_text(double s) { return format_seconds(s); }
std::string bytes_text(double b) { return format_bytes(b); }

std::string value_text(const std::optional<double>& v, const std::string& unit) {
  if (!v) return "-";
  if (unit == "s") return seconds_text(*v);
  if (unit == "B") return bytes_text(*v);
  if (unit == "TFLOP/s") return fmt::format("{:.4g}", *v);
  return fmt::format("{:.1f}", *v);
}

// n/a where a side is missing, where both are 0 (nothing to be wrong about; compare() gives 0 then)
// and where only the prediction is 0 (a figure the model does not predict, not a -100% error).
std::string error_text(const ComparedFigure& f) {
  if (f.predicted == 0.0 && f.measured == 0.0) return "n/a";
  return f.error_pct ? fmt::format("{:+.1f}%", *f.error_pct) : "n/a";
}

void print_section(std::ostream& os, const std::string& title, const std::vector<ComparedFigure>& rows) {
  os << fmt::format("\n{:<28} {:>14} {:>14} {:>9}\n", title, "predicted", "measured", "error");
  for (const ComparedFigure& f : rows) {
    os << fmt::format("  {:<26} {:>14} {:>14} {:>9}{}\n", f.label, value_text(f.predicted, f.unit),
                      value_text(f.measured, f.unit), error_text(f), f.not_predicted() ? "  not predicted" : "");
  }
}

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

}  // namespace

PredictionFile prediction_from_json(const json& j, const std::string& file) {
  JsonObject root(j, file);
  const std::string schema = root.string("schema");
  if (schema != kPredictionSchema) {
    throw root.error("schema", fmt::format("must be \"{}\" (the first file is the prediction)", kPredictionSchema));
  }
  PredictionFile p;
  Estimate& e = p.estimate;
  if (root.has("model")) p.model = root.string("model");
  if (root.has("cluster")) p.cluster = root.string("cluster");
  if (root.has("software")) p.software = root.string("software");
  e.feasible = root.boolean("feasible");
  const json& reasons = root.raw("infeasible_reasons");
  if (!reasons.is_array()) throw root.error("infeasible_reasons", "must be an array of strings");
  for (const json& r : reasons) {
    if (!r.is_string()) throw root.error("infeasible_reasons", "must be an array of strings");
    p.infeasible_reasons.push_back(r.get<std::string>());
  }
  e.strategy = strategy_from_json(root.raw("strategy"), file);

  const JsonObject mem = root.object("memory");
  e.peak_memory = mem.number("peak_bytes", 0, kInf);
  e.capacity = mem.number("capacity_bytes", 0, kInf);
  for (const JsonObject& s : mem.objects("per_stage")) {
    StageMemory m;
    m.stage = static_cast<int>(s.integer("stage", 0, 1 << 24));
    m.weights = s.number("weights", 0, kInf);
    m.gradients = s.number("gradients", 0, kInf);
    m.optimizer = s.number("optimizer", 0, kInf);
    m.activations = s.number("activations", 0, kInf);
    m.other = s.number("other", 0, kInf);
    // Written since the allocator-aware memory model; absent (0) in older predictions.
    auto optional = [&](const char* k) { return s.has(k) ? s.number(k, 0, kInf) : 0.0; };
    m.weight_copies = optional("weight_copies");
    m.temporaries = optional("temporaries");
    m.allocator = optional("allocator");
    m.runtime = optional("runtime");
    const double total = s.number("total", 0, kInf);
    if (std::fabs(total - m.total()) > 1e-9 * std::max(1.0, total)) {
      throw s.error("total", "must equal weights + gradients + optimizer + activations + other + weight_copies + "
                             "temporaries + allocator + runtime");
    }
    if (s.has("layers")) e.stage_layers.push_back(static_cast<int>(s.integer("layers", 0, 1 << 24)));
    e.per_stage.push_back(m);
  }

  const JsonObject t = root.object("time");
  // A phase that is zero up to floating-point rounding (e.g. -1e-19 s from a subtraction in the
  // step simulator) reads as 0; anything more negative is an error.
  auto sec = [&](const char* k) { return std::max(0.0, t.number(k, -1e-9, kInf)); };
  e.time.step = sec("step_s");
  e.time.compute = sec("compute_s");
  e.time.recompute = sec("recompute_s");
  e.time.tp_comm = sec("tp_comm_s");
  e.time.cp_comm = sec("cp_comm_s");
  e.time.pp_comm = sec("pp_comm_s");
  e.time.dp_comm = sec("dp_comm_s");
  e.time.dp_comm_exposed = sec("dp_comm_exposed_s");
  e.time.bubble = sec("bubble_s");
  e.time.optimizer = sec("optimizer_s");

  const JsonObject th = root.object("throughput");
  auto num = [&](const char* k) { return th.number(k, 0, kInf); };
  e.throughput.tokens_per_s = num("tokens_per_s");
  e.throughput.tokens_per_s_per_gpu = num("tokens_per_s_per_gpu");
  e.throughput.model_flops_per_step = num("model_flops_per_step");
  e.throughput.hardware_flops_per_step = num("hardware_flops_per_step");
  e.throughput.model_tflops_per_gpu = num("model_tflops_per_gpu");
  e.throughput.hardware_tflops_per_gpu = num("hardware_tflops_per_gpu");
  e.throughput.mfu = num("mfu");
  e.throughput.hfu = num("hfu");
  return p;
}

void print_comparison(std::ostream& os, const Comparison& c, const std::string& prediction_file,
                      const std::string& measurement_file) {
  os << fmt::format("predicted: {}\nmeasured:  {}\n", printable(prediction_file), printable(measurement_file));
  os << fmt::format("model {}, cluster {}, strategy {}\n", printable(c.measured_model), printable(c.measured_cluster),
                    describe(c.strategy));
  for (const std::string& w : c.warnings) os << "WARNING: " << printable(w) << "\n";
  const Spread& s = c.measured_step_time;
  os << fmt::format("measured step time over {} steps (after {} warm-up): median {}, mean {}, stdev {}, min {}, max {}\n",
                    s.count, c.warmup, seconds_text(s.median), seconds_text(s.mean), seconds_text(s.stdev),
                    seconds_text(s.min), seconds_text(s.max));
  os << "error = (predicted - measured) / measured\n";
  print_section(os, "time per step", c.time);
  print_section(os, "peak memory per GPU/rank", c.memory);
  print_section(os, "throughput", c.throughput);
}

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

}  // namespace trainplan
