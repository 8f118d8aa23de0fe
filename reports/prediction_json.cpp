#include "reports/prediction_json.hpp"

#include "reports/infeasible.hpp"
#include "sim/search.hpp"

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

json cost_to_json(const Estimate& e, const Cluster& cluster) {
  if (cluster.price_per_gpu_hour <= 0 || !(e.time.step > 0)) return nullptr;
  return {{"usd_per_step", objective_value(Objective::cost, e, cluster)},
          {"price_per_gpu_hour_usd", cluster.price_per_gpu_hour},
          {"gpus", e.strategy.gpus()},
          {"price_source", "price_per_gpu_hour_usd of cluster file " + cluster.name}};
}

json layer_detail_to_json(const std::vector<StageDetail>& stages) {
  json out = json::array();
  for (const StageDetail& d : stages) {
    json rows = json::array();
    for (const LayerRow& r : d.rows) {
      const char* part = r.kind == LayerRow::Kind::embedding ? "embedding" : r.kind == LayerRow::Kind::head ? "head" : "layers";
      json row = {{"part", part},
                      {"chunk", r.chunk},
                      {"count", r.count},
                      {"forward_s", r.forward},
                      {"backward_s", r.backward},
                      {"recompute_s", r.recompute},
                      {"tp_comm_s", r.tp_comm},
                      {"cp_comm_s", r.cp_comm},
                      {"params", r.params},
                      {"weights", r.weights},
                      {"gradients", r.gradients},
                      {"optimizer", r.optimizer},
                      {"weight_copies", r.weight_copies},
                      {"activations", r.activations}};
      if (r.kind == LayerRow::Kind::layers) row["first_layer"] = r.first_layer;
      rows.push_back(std::move(row));
    }
    out.push_back({{"stage", d.stage},
                   {"chunks_in_flight", d.chunks_in_flight},
                   {"recompute_working_bytes", d.working_layer},
                   {"rows", rows},
                   {"total",
                    {{"forward_s", d.forward},
                     {"backward_s", d.backward},
                     {"recompute_s", d.recompute},
                     {"tp_comm_s", d.tp_comm},
                     {"cp_comm_s", d.cp_comm}}}});
  }
  return {{"note", "times per micro-batch on one rank; a 'layers' row gives the figures of each of its count "
                   "layers; bytes per rank, activations as held at the stage's peak"},
          {"stages", out}};
}

}  // namespace trainplan
