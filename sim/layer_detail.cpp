#include "sim/layer_detail.hpp"

#include "sim/memory_model.hpp"

namespace trainplan {

namespace {

LayerRow make_row(LayerRow::Kind kind, const ChunkCost& piece, const MemoryModel& mm, int stage, Bytes activations) {
  LayerRow r;
  r.kind = kind;
  r.forward = piece.forward;
  r.backward = piece.backward;
  r.recompute = piece.recompute;
  r.tp_comm = piece.tp_forward + piece.tp_backward;
  r.cp_comm = piece.cp_forward + piece.cp_backward;
  r.ep_comm = piece.ep_forward + piece.ep_backward;
  r.params = piece.params;
  // The model states as stage_memory() accounts them, for this piece's parameters alone.
  const StageMemory states =
      stage_memory(mm, stage, StageLoad{.params = piece.params, .expert_params = piece.expert_params, .kinds = {}, .layers = 0});
  r.weights = states.weights;
  r.gradients = states.gradients;
  r.optimizer = states.optimizer;
  // stage_memory() takes a stage's ends out of its parameters; a row knows whether it is one.
  r.weight_copies = weight_copy_bytes(mm, piece.params, kind == LayerRow::Kind::layers ? 0.0 : piece.params);
  r.activations = activations;
  return r;
}

}  // namespace

std::vector<StageDetail> layer_detail(const StepCosts& costs) {
  const MemoryModel& mm = costs.memory;
  std::vector<StageDetail> out(static_cast<std::size_t>(mm.pp));
  for (int i = 0; i < mm.pp; ++i) {
    StageDetail& d = out[static_cast<std::size_t>(i)];
    d.stage = i;
    // One layer's share of the stage's stored activations, and the ends' extras.
    const StageActivations one = stage_activation_parts(mm, i, 1);
    d.chunks_in_flight = one.chunks_in_flight;
    d.working_layer = one.working_layer;
    for (const ChunkCost& c : costs.chunks) {
      if (c.stage != i) continue;
      d.forward += c.forward;
      d.backward += c.backward;
      d.recompute += c.recompute;
      d.tp_comm += c.tp_forward + c.tp_backward;
      d.cp_comm += c.cp_forward + c.cp_backward;
      d.ep_comm += c.ep_forward + c.ep_backward;
      if (c.has_embedding) d.rows.push_back(make_row(LayerRow::Kind::embedding, costs.embedding, mm, i, one.embedding));
      for (int k = 0; k < costs.kind_count; ++k) {
        if (c.kinds[k] == 0) continue;
        LayerGraph::KindCounts unit{};
        unit[k] = 1;
        LayerRow r = make_row(LayerRow::Kind::layers, costs.kinds[k], mm, i, stage_activation_parts(mm, i, unit).layers);
        r.chunk = c.chunk;
        r.first_layer = c.first_layer;
        r.count = c.kinds[k];
        r.chunk_layers = 0;
        for (int j = 0; j < costs.kind_count; ++j) r.chunk_layers += c.kinds[j];
        r.layer_kind = costs.layer_kinds[k];
        d.rows.push_back(r);
      }
      if (c.has_head) {
        d.rows.push_back(make_row(LayerRow::Kind::head, costs.head, mm, i, one.head));
        d.rows.back().chunk = c.chunk;
        d.rows.back().mtp_layers = costs.head_mtp_layers;
      }
    }
  }
  return out;
}

}  // namespace trainplan
