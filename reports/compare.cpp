#include "reports/compare.hpp"
#include "reports/console.hpp"

#include <fmt/format.h>

#include <cmath>


namespace trainplan {

namespace {

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
  return f.error_pct ? format_error_pct(*f.error_pct) : "n/a";
}

void print_section(std::ostream& os, const std::string& title, const std::vector<ComparedFigure>& rows) {
  os << fmt::format("\n{:<28} {:>14} {:>14} {:>9}\n", title, "predicted", "measured", "error");
  for (const ComparedFigure& f : rows) {
    os << fmt::format("  {:<26} {:>14} {:>14} {:>9}{}\n", f.label, value_text(f.predicted, f.unit),
                      value_text(f.measured, f.unit), error_text(f), f.not_predicted() ? "  not predicted" : "");
  }
}

}  // namespace

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

std::string format_error_pct(double pct) {
  return std::fabs(pct) < 1e6 ? fmt::format("{:+.1f}%", pct) : fmt::format("{:+.1e}%", pct);
}

}  // namespace trainplan
