#include "sim/memory_model.hpp"

#include <algorithm>

namespace trainplan {

StateBytes state_bytes(Dtype dtype, bool fp32_grad_accum) {
  if (dtype == Dtype::fp32) return {4, 4, 8};
  return {2, fp32_grad_accum ? 4.0 : 2.0, 12};
}

ModelStateBytes model_state_bytes(double params, const StateBytes& b, int zero, double shard) {
  ModelStateBytes m;
  m.weights = params * b.weight / (zero == 3 ? shard : 1.0);
  m.gradients = params * b.grad / (zero >= 2 ? shard : 1.0);
  m.optimizer = params * b.optimizer / (zero >= 1 ? shard : 1.0);
  return m;
}

int in_flight_chunks(ScheduleKind kind, int pp, int stage, int micro_batches, int vp) {
  switch (kind) {
    case ScheduleKind::gpipe: return micro_batches;
    case ScheduleKind::one_f_one_b: return std::min(pp - stage, micro_batches);
    case ScheduleKind::interleaved: {
      const int total = micro_batches * vp;
      const int warmup = std::min((pp - stage - 1) * 2 + (vp - 1) * pp, total);
      return std::min(warmup + 1, total);
    }
  }
  return micro_batches;
}

namespace {

double tokens_per_rank(const Strategy& s) { return static_cast<double>(s.micro_batch) * s.seq_len / s.cp; }
double seq_share(const Strategy& s) { return s.sequence_parallel ? 1.0 / s.tp : 1.0; }

}  // namespace

Bytes layer_activation_bytes(const LayerGraph& graph, const Strategy& s, bool keep_all) {
  const double tokens = tokens_per_rank(s), share = seq_share(s), act = activation_bytes(s.dtype);
  const double tensor = 1.0 / s.tp;
  const bool keep_scores = s.attention == Attention::standard && (keep_all || s.recompute == Recompute::none);
  Bytes total = 0;
  for (const auto& op : graph.layer_ops()) {
    // Tensor-split saved tensors divide by tp; sequence-split ones (and their 1-byte dropout
    // masks) by tp only with SP; standard attention's score matrix is split by heads (tp).
    Bytes b = (op.saved_tensor_elems_per_token * tensor + op.saved_seq_elems_per_token * share) * act +
              op.saved_mask_bytes_per_token * share;
    if (keep_scores) b += (op.score_elems_per_token * act + op.score_mask_bytes_per_token) * tensor;
    total += b * tokens;
  }
  return total;
}

Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Strategy& s) {
  if (s.recompute == Recompute::full) {
    return tokens_per_rank(s) * graph.model().hidden * activation_bytes(s.dtype) * seq_share(s);
  }
  return layer_activation_bytes(graph, s, false);
}

MemoryModel memory_model(const LayerGraph& graph, const Cluster& cluster, const Strategy& s) {
  MemoryModel mm;
  mm.per_param = state_bytes(s);
  mm.zero = s.zero;
  mm.shard = static_cast<double>(s.dp * s.cp);
  mm.pp = s.pp;
  mm.vp = s.vp;
  mm.micro_batches = s.micro_batches();
  mm.schedule = s.schedule;
  mm.stored_layer = stored_layer_activation_bytes(graph, s);
  mm.working_layer = s.recompute == Recompute::full ? layer_activation_bytes(graph, s, true) : 0;
  mm.tokens = tokens_per_rank(s);
  mm.hidden = graph.model().hidden;
  mm.vocab = graph.model().vocab;
  mm.tp = s.tp;
  mm.seq_share = seq_share(s);
  mm.act_bytes = activation_bytes(s.dtype);
  // ZeRO-3 also holds the gathered parameters of the current and the prefetched layer.
  const double max_layer_params = graph.params_per_layer() / s.tp;
  mm.other = cluster.runtime_overhead + (s.zero == 3 ? 2 * max_layer_params * mm.per_param.weight : 0.0);
  return mm;
}

Bytes stage_activation_bytes(const MemoryModel& mm, int stage, int layers) {
  const int chunks_live = in_flight_chunks(mm.schedule, mm.pp, stage, mm.micro_batches, mm.vp);
  const double layers_per_chunk = static_cast<double>(layers) / mm.vp;
  Bytes act = chunks_live * layers_per_chunk * mm.stored_layer + mm.working_layer;
  if (stage == 0) act += chunks_live * mm.tokens * mm.hidden * mm.seq_share * 1.0;  // embedding dropout mask
  if (stage == mm.pp - 1) {
    // Logits of the micro-batch in the loss, fp32 (4 bytes), plus the head's input.
    act += mm.tokens * mm.vocab / mm.tp * 4.0 + mm.tokens * mm.hidden * mm.seq_share * mm.act_bytes;
  }
  return act;
}

StageMemory stage_memory(const MemoryModel& mm, int stage, double params, int layers) {
  StageMemory mem;
  mem.stage = stage;
  const ModelStateBytes states = model_state_bytes(params, mm.per_param, mm.zero, mm.shard);
  mem.weights = states.weights;
  mem.gradients = states.gradients;
  mem.optimizer = states.optimizer;
  mem.activations = stage_activation_bytes(mm, stage, layers);
  mem.other = mm.other;
  return mem;
}

}  // namespace trainplan
