#include "sim/memory_model.hpp"

#include <algorithm>
#include <cmath>

namespace trainplan {

ModelStateBytes model_state_bytes(double params, const StateBytes& b, const ZeroPolicy& zero, double shard) {
  ModelStateBytes m;
  // (Not divided by 1 where unsharded: the same figure without a division, predict's hot path.)
  m.weights = zero.shards_params ? params * b.weight / shard : params * b.weight;
  m.gradients = zero.shards_grads ? params * b.grad / shard : params * b.grad;
  m.optimizer = zero.shards_optimizer ? params * b.optimizer / shard : params * b.optimizer;
  return m;
}

int in_flight_chunks(ScheduleKind kind, int pp, int stage, int micro_batches, int vp) {
  switch (kind) {
    case ScheduleKind::gpipe: return micro_batches;
    case ScheduleKind::one_f_one_b: return std::min(pp - stage, micro_batches);
    case ScheduleKind::interleaved: {
      // In 64 bits: 2^30 micro-batches x vp 2 wrapped an int, and the stage's activations read 0.
      const long long total = static_cast<long long>(micro_batches) * vp;
      const long long warmup = std::min((pp - stage - 1) * 2LL + (vp - 1LL) * pp, total);
      return static_cast<int>(std::min(warmup + 1, total));  // <= 2 pp + vp pp: fits
    }
  }
  return micro_batches;
}

namespace {

// 16-bit copies of a GEMM's sequence-split input that the layer saves: autocast casts the fp32
// stream once per GEMM call, so unfused Q, K, V keep three copies and unfused gate and up two.
double gemm_input_copies(const Software& sw, const ModelSpec& m, OpKind kind) {
  if (!sw.autocast_casts_inputs) return 1;
  if (kind == OpKind::qkv) return sw.qkv_fused ? 1 : 3;
  if (kind == OpKind::mlp_up) return sw.gate_up_fused || m.activation != Activation::swiglu ? 1 : 2;
  return 1;
}

// Activation inputs an MLP's activation keeps for its backward: 1, or 2 where a clamped gated
// activation is clamped in kernels of the stack's own (glu_clamp), each keeping its input (the
// activation's input before the clamp) beside the clamped copy the activation keeps.
double activation_input_copies(const Software& sw, const ModelSpec& m) {
  const MemOpImpl& clamp = sw.mem.glu_clamp;
  return m.activation_clamp > 0 && clamp.kernels_fwd > 0 ? 2 : 1;
}

// The routed experts' saved tensors on the busiest EP rank (memory_model.hpp), and the router's
// fp32 scores.
Bytes routed_expert_bytes(const Software& sw, const ModelSpec& m, const Strategy& s, const MoeShape& x,
                          const ElementBytes& w, bool keep_all) {
  const double h = m.hidden, f = m.moe.expert_ffn, etp = s.etp;
  const double g = m.activation == Activation::swiglu ? 2 : 1;
  const bool act_recomputed = !keep_all && (s.recompute_modules & kRecomputeMoeAct);
  // Recomputing the activation (moe_act) keeps only the activation's input: no clamped copy.
  const double act_inputs = act_recomputed ? 1 : activation_input_copies(sw, m);
  Bytes b = x.received * (h * w.saved_gemm_input + act_inputs * g * f / etp * w.activation);
  if (!act_recomputed) b += x.received * f / etp * w.saved_gemm_input;
  b += x.routed * h * w.activation + x.tokens * m.moe.experts * 4.0;
  return b;
}

// Whether the op's saved input is the output of a norm that is a module of its own (what the
// layernorm module recomputation drops): an MoE layer's pre-MLP norm, read by the router (the
// shared experts read the same tensor and save nothing of it), and MLA's input norm, read by the
// query down projection (or, without a query latent, the up projection; the key-value down
// projection reads the same tensor). Fused norms (LayerNormLinear) have no output of their own.
bool reads_own_norm(OpKind kind, const ModelSpec& m) {
  if (kind == OpKind::router) return true;
  if (kind == OpKind::q_down) return true;
  return kind == OpKind::q_up && m.mla.q_lora_rank == 0;
}

// The ops of a dense MLP after its norm: what the mlp module recomputation re-runs.
bool is_dense_mlp_op(OpKind kind) {
  return kind == OpKind::mlp_up || kind == OpKind::activation || kind == OpKind::mlp_down;
}

// layer_activation_bytes from the strategy's tokens and element widths (PlanShape's), for layers of
// kind `kind`.
Bytes layer_activation_bytes(const LayerGraph& graph, const Software& sw, const Strategy& s, const TokenShape& t,
                             const ElementBytes& w, const MoeShape& moe, int kind, bool keep_all) {
  const ModelSpec& m = graph.model();
  const MemoryProfile& p = sw.memory;
  const double tokens = t.per_rank, share = t.seq_share, act = w.activation;
  const double stream = w.stream, tensor = t.tensor_share;
  // Attention widths (layer_graph.cpp): q = heads x head_dim, kv = kv_heads x head_dim.
  const double q = static_cast<double>(m.q_width()), kv = static_cast<double>(m.kv_width()), f = m.ffn_hidden;
  const bool keep_scores = s.attention == Attention::standard && (keep_all || s.recompute == Recompute::none);
  const bool mla_up_recomputed = !keep_all && (s.recompute_modules & kRecomputeMlaUpProj);
  const bool norms_recomputed = !keep_all && (s.recompute_modules & kRecomputeLayernorm);
  // The mlp module keeps only the MLP's input: the pre-MLP norm's saved stream tensor (the norm is
  // fused into the up projection, inside the recomputed module).
  const bool mlp_recomputed = !keep_all && (s.recompute_modules & kRecomputeMlp) && !graph.kind(kind).moe;
  Bytes total = 0;
  for (const auto& op : graph.kind_ops(kind)) {
    if (op.split == Split::expert) continue;  // routed_expert_bytes
    if (norms_recomputed && reads_own_norm(op.kind, m)) continue;  // the norm's output is rebuilt
    if (mlp_recomputed && is_dense_mlp_op(op.kind)) continue;      // rebuilt from the MLP's input
    // Tensor-split saved tensors divide by tp; sequence-split ones (and their 1-byte dropout
    // masks) by tp only with SP; standard attention's score matrix is split by heads (tp).
    // A norm saves its input from the residual stream (composite RMSNorm also x * rsqrt(...));
    // a GEMM saves its 16-bit input, once per cast.
    // Under a quantized format the stack may keep the quantized inputs of its linear layers
    // (ElementBytes::saved_gemm_input); the attention core runs and saves in 16 bits (its q, k, v
    // and output), as the stacks' fused attention does under FP8, MXFP8 and NVFP4 recipes.
    const bool quantized_input = op.matmul && op.kind != OpKind::attention;
    const double width = quantized_input ? w.saved_gemm_input : act;
    double seq_bytes = op.saved_seq_elems_per_token * width;
    if (op.kind == OpKind::norm) {
      const int copies = m.norm == Norm::rmsnorm ? p.rms_norm_saved_stream_tensors : 1;
      seq_bytes = op.saved_seq_elems_per_token * stream * copies;
    } else if (op.matmul) {
      seq_bytes *= gemm_input_copies(sw, m, op.kind);
    }
    double tensor_elems = op.saved_tensor_elems_per_token;
    if (op.kind == OpKind::attention && mla_up_recomputed) tensor_elems = 0;  // Q, K, V rebuilt from the latents
    if (op.kind == OpKind::attention && !mla_up_recomputed) {
      if (p.kv_expanded_saved) tensor_elems += 2 * (q - kv);          // K, V repeated to the query heads
      if (m.position == Position::rope && p.rope_saved_copies) tensor_elems += q + kv;  // roped q, k
      tensor_elems += p.attention_output_copies * q;
    }
    if (op.kind == OpKind::activation && p.activation_output_saved && m.activation == Activation::swiglu) {
      tensor_elems += f;  // silu(gate)
    }
    if (op.kind == OpKind::activation || op.kind == OpKind::shared_activation)
      tensor_elems += (activation_input_copies(sw, m) - 1) * op.saved_tensor_elems_per_token;
    Bytes b = tensor_elems * tensor * width + seq_bytes * share;
    if (p.dropout_masks) b += op.saved_mask_bytes_per_token * share;
    if (keep_scores) {
      b += (op.score_elems_per_token * act + (p.dropout_masks ? op.score_mask_bytes_per_token : 0.0)) * tensor;
    }
    total += b * tokens;
  }
  if (graph.kind(kind).moe) total += routed_expert_bytes(sw, m, s, moe, w, keep_all);
  return total;
}

Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Software& sw, const Strategy& s, const TokenShape& t,
                                    const ElementBytes& w, const MoeShape& moe, int kind) {
  if (s.recompute == Recompute::full) return t.per_rank * graph.model().hidden * w.stream * t.seq_share;
  return layer_activation_bytes(graph, sw, s, t, w, moe, kind, false);
}

// The stage ends' parameters per rank, as exec/model.cpp cuts its units: the embedding
// (vocabulary-parallel table, learned positions whole); the head (final norm and LM head; a tied
// head on the last of several stages holds its own copy of the table, as step_costs counts it).
// ZeRO-3 gathers each unit (zero3_gathered_bytes) at `gathered` bytes per parameter (the compute
// dtype's: ElementBytes::gathered_param), a layer too.
void set_end_units(MemoryModel& mm, const LayerGraph& graph, const Strategy& s, const ZeroPolicy& zero,
                   double gathered) {
  const ModelSpec& m = graph.model();
  double embedding = 0, head = 0;
  for (const OpSpec& op : graph.pre_ops()) embedding += rank_params(op, s.tp);
  for (const OpSpec& op : graph.post_ops()) head += rank_params(op, s.tp);
  if (m.tied_embeddings && s.pp > 1) head += m.vocab * static_cast<double>(m.hidden) / s.tp;
  mm.embedding_params = embedding;
  mm.head_params = head;
  mm.lm_head_params = mm.vocab / s.tp * m.hidden;
  const double bytes = zero.shards_params ? gathered : 0.0;
  double layer = 0;  // the largest layer's
  for (int k = 0; k < graph.kind_count(); ++k)
    layer = std::max(layer, graph.kind_params_per_rank(k, s.tp, s.ep * s.etp));
  mm.gathered_layer = layer * bytes;
  mm.gathered_embedding = embedding * bytes;
  mm.gathered_head = head * bytes;
  mm.head_reads_embedding = zero.shards_params && m.tied_embeddings && s.pp == 1;
}

// The tokens of one loss chunk: those whose fp32 logits over the rank's vocabulary rows fit in
// `chunk_bytes` (at least one); 0 (the whole micro-batch) without chunking.
double loss_chunk_tokens(double vocab_per_rank, double chunk_bytes) {
  if (chunk_bytes <= 0 || vocab_per_rank <= 0) return 0;
  return std::max(1.0, std::floor(chunk_bytes / (4.0 * vocab_per_rank)));
}

}  // namespace

Bytes layer_activation_bytes(const LayerGraph& graph, const Software& sw, const PlanShape& shape, bool keep_all) {
  return layer_activation_bytes(graph, sw, shape, 0, keep_all);
}

Bytes layer_activation_bytes(const LayerGraph& graph, const Software& sw, const PlanShape& shape, int kind, bool keep_all) {
  return layer_activation_bytes(graph, sw, shape.strategy, shape.tokens, shape.bytes, shape.moe, kind, keep_all);
}

Bytes layer_activation_bytes(const LayerGraph& graph, const Strategy& s, bool keep_all) {
  return layer_activation_bytes(graph, Software{}, s, keep_all);
}

Bytes layer_activation_bytes(const LayerGraph& graph, const Software& sw, const Strategy& s, bool keep_all) {
  const TokenShape t = token_shape(s);
  return layer_activation_bytes(graph, sw, s, t, element_bytes(sw, s), moe_shape(graph.model(), s, t), 0, keep_all);
}

Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Software& sw, const PlanShape& shape) {
  return stored_layer_activation_bytes(graph, sw, shape, 0);
}

Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Software& sw, const PlanShape& shape, int kind) {
  return stored_layer_activation_bytes(graph, sw, shape.strategy, shape.tokens, shape.bytes, shape.moe, kind);
}

Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Strategy& s) {
  return stored_layer_activation_bytes(graph, Software{}, s);
}

Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Strategy& s, int kind) {
  const Software sw;
  const TokenShape t = token_shape(s);
  return stored_layer_activation_bytes(graph, sw, s, t, element_bytes(sw, s), moe_shape(graph.model(), s, t), kind);
}

Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Software& sw, const Strategy& s) {
  const TokenShape t = token_shape(s);
  return stored_layer_activation_bytes(graph, sw, s, t, element_bytes(sw, s), moe_shape(graph.model(), s, t), 0);
}

MemoryModel memory_model(const LayerGraph& graph, const Cluster& cluster, const Strategy& s) {
  return memory_model(graph, cluster, Software{}, s);
}

MemoryModel memory_model(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const Strategy& s) {
  const PlanShape shape(graph.model(), cluster, sw, s);
  std::array<Bytes, LayerGraph::kMaxKinds> stored{};
  Bytes working = 0;
  for (int k = 0; k < graph.kind_count(); ++k) {
    stored[k] = stored_layer_activation_bytes(graph, sw, shape, k);
    if (s.recompute == Recompute::full) working = std::max(working, layer_activation_bytes(graph, sw, shape, k, true));
  }
  return memory_model(graph, cluster, sw, shape, stored, working);
}

MemoryModel memory_model(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape,
                         const std::array<Bytes, LayerGraph::kMaxKinds>& stored_layer, Bytes working_layer) {
  MemoryModel mm;
  memory_model(graph, cluster, sw, shape, stored_layer, working_layer, mm);
  return mm;
}

void memory_model(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape,
                  const std::array<Bytes, LayerGraph::kMaxKinds>& stored_layer, Bytes working_layer, MemoryModel& mm) {
  // Every field is written here (or by set_zero3_units).
  const Strategy& s = shape.strategy;
  mm.zero = shape.zero;
  mm.shard = static_cast<double>(shape.groups.dp.size);
  mm.expert_shard = static_cast<double>(shape.groups.edp.size);
  mm.mtp_layers = graph.model().mtp_layers;
  mm.mtp_layer = graph.mtp_kind() >= 0 ? stored_layer[static_cast<std::size_t>(graph.mtp_kind())] : 0.0;
  mm.pp = s.pp;
  mm.vp = s.vp;
  mm.micro_batches = shape.micro_batches;
  mm.schedule = s.schedule;
  mm.stored_layer = stored_layer;
  mm.working_layer = working_layer;
  mm.tokens = shape.tokens.per_rank;
  mm.hidden = graph.model().hidden;
  mm.vocab = shape.vocab_rows;
  mm.tp = s.tp;
  mm.loss_on_gathered_logits = sw.parallel.loss_on_gathered_logits;
  mm.seq_share = shape.tokens.seq_share;
  mm.bytes = shape.bytes;
  mm.dropout_masks = runs_dropout(sw, graph.model().dropout);
  mm.reserved_over_allocated = sw.allocator.reserved_over_allocated;
  mm.workspace = sw.allocator.workspace;
  mm.safety_margin = sw.allocator.safety_margin;
  mm.runtime = cluster.runtime_overhead;
  set_end_units(mm, graph, s, shape.zero, shape.bytes.gathered_param);
  mm.copies_layers_only = sw.memory.weight_copies_layers_only;
  mm.loss_chunk_tokens = loss_chunk_tokens(mm.vocab / mm.tp, sw.memory.loss_chunk_bytes);
  mm.loss_head_bytes = shape.bytes.loss_head;
  mm.final_norm_tensors = graph.model().norm == Norm::rmsnorm ? sw.memory.rms_norm_saved_stream_tensors : 1;
}

StageActivations stage_activation_parts(const MemoryModel& mm, int stage, int layers) {
  LayerGraph::KindCounts kinds{};
  kinds[0] = layers;
  return stage_activation_parts(mm, stage, kinds);
}

StageActivations stage_activation_parts(const MemoryModel& mm, int stage, const LayerGraph::KindCounts& kinds) {
  StageActivations a;
  a.chunks_in_flight = in_flight_chunks(mm.schedule, mm.pp, stage, mm.micro_batches, mm.vp);
  for (std::size_t k = 0; k < kinds.size(); ++k) {
    if (kinds[k] == 0) continue;
    const double layers_per_chunk = static_cast<double>(kinds[k]) / mm.vp;
    a.layers += a.chunks_in_flight * layers_per_chunk * mm.stored_layer[k];
  }
  a.working_layer = mm.working_layer;
  // Embedding dropout mask (1 byte per element) of each chunk in flight, where the stack saves masks.
  if (stage == 0 && mm.dropout_masks) a.embedding = a.chunks_in_flight * mm.tokens * mm.hidden * mm.seq_share * 1.0;
  if (stage == mm.pp - 1) {
    // The loss's logits of one micro-batch (or loss chunk) at their peak (logit_bytes per element:
    // 4 for fp32 logits, Korthikanti et al. 2022 Sec. 4.3 4sbv/t; more where the loss keeps fp32
    // copies and their gradients), vocab / tp rows of them or all where the stack gathers them,
    // what it holds per LM-head weight, plus what the final norm saves (stream tensors, as every
    // norm of the model) and the loss's input (the head GEMM's saved input, or what the profile's
    // loss_input_bytes says).
    const double logit_tokens = mm.loss_chunk_tokens > 0 ? std::min(mm.tokens, mm.loss_chunk_tokens) : mm.tokens;
    const double logit_rows = mm.loss_on_gathered_logits ? mm.vocab : mm.vocab / mm.tp;
    a.head = logit_tokens * logit_rows * mm.bytes.logit + mm.lm_head_params * mm.loss_head_bytes +
             mm.tokens * mm.hidden * mm.seq_share * (mm.bytes.stream * mm.final_norm_tensors + mm.bytes.loss_input);
    // MTP modules: each module's layer for every micro-batch the last chunk holds, its projection's
    // input (2h) and its own logits and head input at the loss's peak.
    if (mm.mtp_layers > 0) {
      const double in_last = std::max(1.0, std::ceil(static_cast<double>(a.chunks_in_flight) / mm.vp));
      a.head += mm.mtp_layers * (in_last * (mm.mtp_layer + 2 * mm.tokens * mm.hidden * mm.seq_share * mm.bytes.activation) +
                                 a.head);
    }
  }
  return a;
}

Bytes stage_activation_bytes(const MemoryModel& mm, int stage, int layers) {
  return stage_activation_parts(mm, stage, layers).total();
}

Bytes stage_activation_bytes(const MemoryModel& mm, int stage, const LayerGraph::KindCounts& kinds) {
  return stage_activation_parts(mm, stage, kinds).total();
}

Bytes zero3_gathered_bytes(const MemoryModel& mm, int stage, int layers) {
  if (mm.gathered_layer <= 0) return 0;
  // The pairs of units in flight together (memory_model.hpp). A stage whose chunks hold one layer
  // each (layers <= vp) never holds two layers at once.
  const Bytes layer = layers > 0 ? mm.gathered_layer : 0.0;
  Bytes peak = layers > mm.vp ? 2 * layer : layer;
  if (stage == 0) peak = std::max(peak, mm.gathered_embedding + layer);
  if (stage == mm.pp - 1)
    peak = std::max(peak, mm.gathered_head + layer + (mm.head_reads_embedding ? mm.gathered_embedding : 0.0));
  return peak;
}

Bytes weight_copy_bytes(const MemoryModel& mm, double params, double ends) {
  const double copied = mm.copies_layers_only ? params - ends : params;
  const double copy = mm.bytes.weight_copy;
  return mm.zero.shards_params ? copied * copy / mm.shard : copied * copy;
}

StageMemory stage_memory(const MemoryModel& mm, int stage, double params, int layers) {
  StageLoad load{.params = params, .expert_params = 0, .kinds = {}, .layers = layers};
  load.kinds[0] = layers;
  return stage_memory(mm, stage, load);
}

StageMemory stage_memory(const MemoryModel& mm, int stage, const StageLoad& load) {
  StageMemory mem;
  mem.stage = stage;
  const double params = load.params - load.expert_params, experts = load.expert_params;
  const int layers = load.layers;
  ModelStateBytes states = model_state_bytes(params, mm.bytes.state, mm.zero, mm.shard);
  const double copy = mm.bytes.weight_copy, temp = mm.bytes.optimizer_temp;
  Bytes temporaries = mm.zero.shards_optimizer ? params * temp / mm.shard : params * temp;
  if (experts > 0) {  // the routed experts' states, sharded over the EDP group
    const ModelStateBytes e = model_state_bytes(experts, mm.bytes.state, mm.zero, mm.expert_shard);
    states.weights += e.weights;
    states.gradients += e.gradients;
    states.optimizer += e.optimizer;
    temporaries += mm.zero.shards_optimizer ? experts * temp / mm.expert_shard : experts * temp;
  }
  mem.weights = states.weights;
  mem.gradients = states.gradients;
  mem.optimizer = states.optimizer;
  const double ends = (stage == 0 ? mm.embedding_params : 0.0) + (stage == mm.pp - 1 ? mm.head_params : 0.0);
  mem.weight_copies = weight_copy_bytes(mm, params, std::min(ends, params));  // (routed experts': sharded over EDP)
  if (experts > 0) mem.weight_copies += mm.zero.shards_params ? experts * copy / mm.expert_shard : experts * copy;
  const Bytes error_feedback = load.params * mm.bytes.error_feedback;
  mem.other = zero3_gathered_bytes(mm, stage, layers) + mm.workspace + error_feedback;
  mem.runtime = mm.runtime;
  // The larger of the backward peak (activations) and the optimizer peak (its temporaries over
  // the parameters this rank updates).
  const Bytes activations = stage_activation_bytes(mm, stage, load.kinds);
  if (temporaries > activations) {
    mem.temporaries = temporaries;
  } else {
    mem.activations = activations;
  }
  // The caching allocator reserves reserved_over_allocated x the tensor bytes (its workspace and
  // the runtime reserve are not scaled).
  const Bytes tensors =
      mem.weights + mem.gradients + mem.optimizer + mem.weight_copies + mem.activations + mem.temporaries + error_feedback;
  mem.allocator = (mm.reserved_over_allocated - 1) * tensors;
  return mem;
}

}  // namespace trainplan
