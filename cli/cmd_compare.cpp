// trainplan compare: a prediction (trainplan/prediction/v1) and a measurement
// (trainplan/measurement/v1) side by side, with the % error of each figure.
#include <fmt/format.h>

#include <filesystem>

#include "reports/compare.hpp"
#include "reports/measurement_json.hpp"
#include "sim/check.hpp"
#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "cli/output.hpp"
#include "sim/compare.hpp"
#include "sim/json_reader.hpp"

namespace trainplan::cli {

namespace {

const char* kHelp = R"(usage: trainplan compare PREDICTION.json MEASUREMENT.json [--json FILE]

Prints predicted against measured figures side by side: step time (measured median, with its
spread), each phase of the step (compute, recompute, TP/CP/PP/DP communication, the experts'
all-to-all where either side has one, bubble, optimizer), peak memory per pipeline stage and per
rank, and throughput, each with its error
(predicted - measured) / measured. PREDICTION.json is what `trainplan predict --json` writes;
MEASUREMENT.json is what `trainplan exec --json` writes. A warning is printed when the two files
describe different strategies, models, clusters or software, and when the measurement came from
an executor other than the one the prediction's software profile describes (its
describes_executor against the measurement's executor).

output:
  --json FILE   also write the trainplan/comparison/v1 JSON (every printed figure) to FILE
  --html FILE   also write an HTML report (paired predicted/measured bars with the % error)
)";

}  // namespace

int cmd_compare(const Args& args, const Context& ctx) {
  Flags f(args, "compare");
  if (f.help()) {
    ctx.out << kHelp;
    return 0;
  }
  CommandFiles outputs(f, ctx, {"json", "html"});  // before any input is read
  const std::vector<std::string>& files = f.take_positionals();
  f.finish();
  if (files.size() != 2) {
    throw InputError(fmt::format("expects two files, PREDICTION.json MEASUREMENT.json (got {} argument{})",
                                 files.size(), files.size() == 1 ? "" : "s"));
  }
  const std::string& prediction_path = files[0];
  const std::string& measurement_path = files[1];
  const PredictionDoc predicted = prediction_from_json(read_json_file(prediction_path), prediction_path);
  // A relative error against a predicted step of 0 s (an infeasible or unsimulated plan) would read
  // as -100%: nothing to compare.
  if (!(predicted.estimate.time.step > 0)) {
    throw InputError(fmt::format("{}: time.step_s = {}, must be > 0 (a prediction without a step time cannot be "
                                 "compared with a measured step)",
                                 prediction_path, predicted.estimate.time.step));
  }
  const Measurement measured = measurement_from_json(read_json_file(measurement_path), measurement_path);

  Comparison c = compare(predicted.estimate, predicted.model, predicted.cluster, measured);
  // The measured stack has its own software profile: a prediction costed for another one is not
  // the prediction of this run.
  if (!predicted.software.empty() && !measured.software.empty() && predicted.software != measured.software) {
    c.warnings.push_back(fmt::format("the prediction costed software '{}', the measured run is described by '{}' "
                                     "(predict with --software {})",
                                     predicted.software, measured.software, measured.software));
  }
  if (const std::string w = executor_mismatch(predicted.software, predicted.software_executor, measured); !w.empty())
    c.warnings.push_back(w);
  // Everything is computed and rendered before the first line is printed or file written.
  const auto doc = comparison_to_json(c, prediction_path, measurement_path);
  check_finite(doc);
  if (outputs.wants("json")) outputs.stage_json("json", doc);
  if (outputs.wants("html")) outputs.stage("html", html_page(doc, "trainplan compare: predicted vs measured"));
  for (const std::string& w : c.warnings) ctx.err << "trainplan compare: warning: " << printable(w) << "\n";
  print_comparison(ctx.out, c, prediction_path, measurement_path);
  outputs.commit();
  return 0;
}

}  // namespace trainplan::cli
