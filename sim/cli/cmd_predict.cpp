// trainplan predict: the analytical estimate of one layout.
#include <fmt/format.h>

#include <fstream>

#include "reports/console.hpp"
#include "reports/prediction_json.hpp"
#include "sim/check.hpp"
#include "sim/cli/commands.hpp"
#include "sim/cli/plan_flags.hpp"
#include "sim/predict.hpp"

namespace trainplan::cli {

namespace {

const char* kHelp = R"(usage: trainplan predict --model M --cluster C --gpus N --global-batch B [layout flags] [--json FILE]

Predicts per-GPU memory (per pipeline stage) and step time of one training layout, with the
breakdown into compute, recomputation, communication, pipeline bubble and optimizer, and the
resulting tokens/s, TFLOP/s per GPU, MFU and HFU.

)";

}  // namespace

// Writes `j` to `path`, or throws InputError naming the flag.
void write_json_file(const std::string& flag, const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  if (!out) throw InputError(fmt::format("--{} {}: cannot write the file", flag, path));
  out << j.dump(2) << "\n";
}

int cmd_predict(const Args& args, const Context& ctx) {
  Flags f(args, "predict");
  if (f.help()) {
    ctx.out << kHelp << plan_flags_help()
            << "output:\n  --json FILE               also write the trainplan/prediction/v1 JSON to FILE\n";
    return 0;
  }
  const PlanInputs in = read_plan_flags(f, ctx.data_dir);
  const auto json_path = f.get("json");
  f.finish();
  const LayerGraph graph(in.model, in.strategy.seq_len);
  const Estimate e = predict(graph, in.cluster, in.strategy);
  print_prediction(ctx.out, e, fmt::format("{} on {} x {} ({}), {:.2f}B parameters", in.model.name,
                                           in.strategy.gpus(), in.cluster.gpu.name, in.cluster.name,
                                           graph.total_params() / 1e9));
  if (json_path) {
    write_json_file("json", *json_path,
                    prediction_to_json(e, {{"model", in.model.name}, {"cluster", in.cluster.name}, {"engine", "analytic"}}));
  }
  return e.feasible ? 0 : 3;
}

}  // namespace trainplan::cli
