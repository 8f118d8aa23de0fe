#include "reports/prediction_json.hpp"

#include "reports/infeasible.hpp"

namespace trainplan {

using nlohmann::json;

json prediction_to_json(const Estimate& e, const json& extra) {
  json stages = json::array();
  for (std::size_t i = 0; i < e.per_stage.size(); ++i) {
    const StageMemory& m = e.per_stage[i];
    stages.push_back({{"stage", m.stage},
                      {"layers", i < e.stage_layers.size() ? e.stage_layers[i] : 0},
                      {"weights", m.weights},
                      {"gradients", m.gradients},
                      {"optimizer", m.optimizer},
                      {"activations", m.activations},
                      {"other", m.other},
                      {"weight_copies", m.weight_copies},
                      {"temporaries", m.temporaries},
                      {"allocator", m.allocator},
                      {"runtime", m.runtime},
                      {"total", m.total()}});
  }
  const TimeBreakdown& t = e.time;
  const Throughput& p = e.throughput;
  json j = {{"schema", kPredictionSchema},
            {"feasible", e.feasible},
            {"infeasible_reasons", infeasible_reasons(e)},
            {"strategy", to_json(e.strategy)},
            {"memory", {{"peak_bytes", e.peak_memory}, {"capacity_bytes", e.capacity}, {"per_stage", stages}}},
            {"time",
             {{"step_s", t.step},
              {"compute_s", t.compute},
              {"recompute_s", t.recompute},
              {"tp_comm_s", t.tp_comm},
              {"cp_comm_s", t.cp_comm},
              {"pp_comm_s", t.pp_comm},
              {"dp_comm_s", t.dp_comm},
              {"dp_comm_exposed_s", t.dp_comm_exposed},
              {"bubble_s", t.bubble},
              {"optimizer_s", t.optimizer}}},
            {"throughput",
             {{"tokens_per_s", p.tokens_per_s},
              {"tokens_per_s_per_gpu", p.tokens_per_s_per_gpu},
              {"model_flops_per_step", p.model_flops_per_step},
              {"hardware_flops_per_step", p.hardware_flops_per_step},
              {"model_tflops_per_gpu", p.model_tflops_per_gpu},
              {"hardware_tflops_per_gpu", p.hardware_tflops_per_gpu},
              {"mfu", p.mfu},
              {"hfu", p.hfu}}}};
  // Parameter-server figures only where servers are used (default outputs keep their keys).
  if (e.strategy.uses_ps()) {
    j["parameter_server"] = {{"workers", e.ps.workers},
                             {"staleness_updates", e.ps.staleness},
                             {"updates_per_s", e.ps.updates_per_s}};
  }
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

}  // namespace trainplan
