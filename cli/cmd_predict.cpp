// trainplan predict: the analytical estimate of one layout.
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <optional>

#include "reports/console.hpp"
#include "reports/prediction_json.hpp"
#include "sim/check.hpp"
#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "cli/plan_flags.hpp"
#include "sim/layer_detail.hpp"
#include "sim/predict.hpp"
#include "sim/simulate.hpp"

namespace trainplan::cli {

namespace {

const char* kHelp = R"(usage: trainplan predict --model M --cluster C --gpus N --global-batch B [layout flags] [--json FILE]

Predicts per-GPU memory (per pipeline stage) and step time of one training layout, with the
breakdown into compute, recomputation, communication, pipeline bubble and optimizer, and the
resulting tokens/s, TFLOP/s per GPU, MFU and HFU.
Exit status: 0 feasible, 3 infeasible (reasons printed), 2 bad input.

)";

// The closed form charges the interleaved schedule's fill and drain as if every chunk did equal
// work; where chunks differ (an LM head or embedding chunk, layers that do not split evenly), the
// schedule stalls further, up to 40% more in tests/sim/test_engine_agreement.cpp's sample, while
// 1F1B stays within 3%. So an interleaved plan predicted analytically is simulated too, from the
// same step costs, and a note says so where the two steps differ by more than 5%.
std::string interleaved_check_note(const StepCosts& costs, const Strategy& s, const Estimate& analytic) {
  if (s.schedule != ScheduleKind::interleaved || s.pp < 2) return "";
  if (simulation_size_error(s) || !(analytic.time.step > 0)) return "";
  const Seconds simulated = simulate(costs, schedule_for(s)).step;
  const double apart = simulated / analytic.time.step - 1;
  if (std::abs(apart) <= 0.05) return "";
  return fmt::format("the step simulator gives {} for this interleaved layout ({:+.1f}% against the closed form's {}): "
                     "its chunks' unequal work changes the schedule's stalls beyond the closed form's fill and drain; "
                     "--engine des reports the simulated figures",
                     format_seconds(simulated), 100 * apart, format_seconds(analytic.time.step));
}

}  // namespace

int cmd_predict(const Args& args, const Context& ctx) {
  Flags f(args, "predict");
  if (f.help()) {
    ctx.out << kHelp << plan_flags_help()
            << "engine and output:\n"
               "  --engine analytic|des     time figures from the closed-form model (default) or from the\n"
               "                            discrete-event step simulator over the pipeline schedule\n"
               "  --detail layers           also print memory and time per layer on each pipeline stage: the\n"
               "                            embedding, each chunk's transformer layers and the LM head, with\n"
               "                            their forward/backward/recompute and TP/CP times per micro-batch\n"
               "                            and their weights/gradients/optimizer/activation bytes per GPU\n"
               "                            (also under \"layers\" in the --json output)\n"
               "  --json FILE               also write the trainplan/prediction/v1 JSON to FILE\n"
               "  --html FILE               also write an HTML report (memory per stage, step time; see trainplan report)\n";
    return 0;
  }
  CommandFiles files(f, ctx, {"json", "html"});  // before any input is read
  const PlanInputs in = read_plan_flags(f, ctx.data_dir);
  const std::string engine = f.get_choice("engine", "analytic", {"analytic", "des"});
  const bool layers = f.get_choice("detail", "none", {"none", "layers"}) == "layers";
  f.finish();
  const Strategy& s = in.strategy;
  const LayerGraph graph(in.model, s.seq_len);
  // The step costs, computed once where the plan can be costed and something here reads them: the
  // closed form, the layer detail and the interleaved cross-check (predict_with_simulation costs
  // the plan for itself and shares them between its closed form and its simulator).
  std::optional<StepCosts> costs;
  if ((engine == "analytic" || layers) && !cannot_cost(graph, in.cluster, s))
    costs = step_costs(graph, in.cluster, in.software, s);
  const Estimate e = engine == "des" ? predict_with_simulation(graph, in.cluster, in.software, s)
                     : costs         ? compose(*costs, graph, in.cluster, s)
                                     : predict(graph, in.cluster, in.software, s);
  const std::string title = fmt::format("{} on {} x {} ({}), {}, {} engine", in.model.name, s.gpus(),
                                        in.cluster.gpu.name, in.cluster.name, parameters_text(graph), engine);
  PredictionDoc prediction = prediction_doc(e);
  prediction.model = in.model.name;
  prediction.model_spec = in.model;  // --plan of this file runs the same model, whatever file it came from
  prediction.cluster = in.cluster.name;
  prediction.software = in.software.name;
  prediction.software_executor = in.software.describes_executor;
  prediction.engine = engine;
  prediction.cost = prediction_cost(e, in.cluster);
  prediction.parameters = parameter_counts(graph);
  std::vector<StageDetail> detail;
  if (layers && costs) {
    detail = layer_detail(*costs);
    prediction.layers = detail;
  }
  const auto doc = prediction_to_json(prediction);
  // Everything is computed and rendered before the first line is printed or file written.
  check_finite(doc);
  if (files.wants("json")) files.stage_json("json", doc);
  if (files.wants("html")) files.stage("html", html_page(doc, title));
  // Notes only once nothing can be refused any more: a refusal is exactly one line.
  const std::string engine_note = engine == "analytic" && costs ? interleaved_check_note(*costs, s, e) : "";
  print_notes(ctx.err, "predict", {in.seq_note, in.split_note, dropout_note(in.model, in.software),
                                   attention_kernel_note(in.cluster, in.software), engine_note});
  print_prediction(ctx.out, e, title);
  print_cost(ctx.out, e, in.cluster);
  if (!detail.empty()) print_layer_detail(ctx.out, detail);
  files.commit();
  return e.feasible ? 0 : 3;
}

}  // namespace trainplan::cli
