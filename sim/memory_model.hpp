// memory_model: what one GPU holds during a training step, in bytes. The single home of every
// memory formula of the analytical model: predict() composes a stage's memory from it, and search's
// pruning bounds (search.cpp) call the same functions, so a bound can never drift from the figure it
// bounds. Pure functions of the model, the plan's shape (plan_shape.hpp: tokens, shares, element
// widths, the ZeroPolicy, the DP group) and (for the runtime reserve) the cluster.
//
// Per GPU and pipeline stage:
//   model states  = params x bytes per parameter (ElementBytes::state), each kind the ZeroPolicy
//                   shards divided over the data-parallel group (model_state_bytes); the routed
//                   experts' (already split over ep x etp) over the expert-data-parallel group;
//   activations   = micro-batch chunks in flight (in_flight_chunks) x layers per chunk x stored bytes
//                   per layer (stored_layer_activation_bytes), plus the working layer of full
//                   recomputation and the extras of the first and last stage (stage_activation_bytes);
//   other         = ZeRO-3's gathered units' parameters (zero3_gathered_bytes) and the allocator's
//                   workspace;
//   runtime       = the cluster's runtime reserve (outside the caching allocator).
// With parameter servers the optimizer states live on the servers (no optimizer bytes or
// temporaries on a worker); PowerSGD adds its fp32 error-feedback buffer to "other".
//
// Tensors by lifetime (the software profile's MemoryProfile says what the stack keeps): the peak
// of a stage is the larger of two moments of the step,
//   backward peak  = model states + 16-bit weight copies + activations in flight + the loss's logits
//   optimizer peak = model states + 16-bit weight copies + the optimizer's temporaries
// and what the caching allocator reserves for them is reserved_over_allocated x those tensor bytes
// plus its workspaces (the profile's Allocator); the cluster's runtime reserve (CUDA context,
// communication buffers) lies outside the allocator.
#pragma once
#include "sim/cluster.hpp"
#include "sim/software.hpp"
#include "sim/estimate.hpp"
#include "sim/layer_graph.hpp"
#include "sim/plan_shape.hpp"
#include "sim/strategy.hpp"

namespace trainplan {

// Model-state bytes one rank holds for `params` parameters (already split by TP/PP), with ZeRO
// sharding over `shard` ranks (the dp x cp group that holds replicas of the same parameters):
// each state the policy shards is divided by `shard` (ZeRO 1 the optimizer states, 2 also the
// gradients, 3 also the weights; Rajbhandari et al. 2020, Sec. 5, Fig. 1).
struct ModelStateBytes {
  Bytes weights = 0, gradients = 0, optimizer = 0;
  Bytes total() const { return weights + gradients + optimizer; }
};
ModelStateBytes model_state_bytes(double params, const StateBytes& per_param, const ZeroPolicy& zero, double shard);
// The same for a stage number (0..3; a file's, a flag's or search's).
inline ModelStateBytes model_state_bytes(double params, const StateBytes& per_param, int zero_stage, double shard) {
  return model_state_bytes(params, per_param, ZeroPolicy::of(zero_stage), shard);
}

// Peak number of micro-batch-chunks whose activations pipeline stage `stage` holds (closed form,
// equal to Schedule::peak_in_flight for the same sizes): GPipe all m; 1F1B min(p - i, m) (Narayanan
// et al. 2021, Sec. 2.2); interleaved 1F1B its warm-up forwards (p - i - 1) x 2 + (v - 1) x p, plus
// one, capped at m x v (Megatron-LM's schedule).
int in_flight_chunks(ScheduleKind kind, int pp, int stage, int micro_batches, int vp);

// Activation bytes one rank keeps for one transformer layer (of layer kind `kind`: the graph's
// kind_ops; layer 0's kind where none is given) and one micro-batch between forward and backward,
// with the TP/SP/CP split and recomputation applied (Korthikanti et al. 2022, Table 2, generalised
// to GQA/SwiGLU by summing the saved tensors of the graph's ops). `keep_all` keeps what the
// recomputation policy would drop (the working set of a layer being recomputed).
// Routed experts keep, on the busiest EP rank, for each of the `received` rows its experts take
// (MoeShape): the up projection's input h (1 byte under FP8 as every saved GEMM input), the
// activation's input g f / etp, the down projection's input f / etp (dropped by the moe_act
// module recomputation), and for the `routed` rows after the combine the expert output h the
// routing weights multiply (Megatron-core moe_utils.unpermute saves it for their gradient); the
// router keeps its fp32 scores, tokens x experts x 4 B. Multi-head latent attention under the
// mla_up_proj recomputation keeps its latents (the up projections' inputs) but not Q, K, V.
// With a MemoryProfile other than the default, the tensors the stack really saves: norm inputs at
// the residual stream's width, one 16-bit copy per GEMM that casts its input under autocast,
// expanded K/V, RoPE and attention-output copies, silu's output, no dropout masks (see
// MemoryProfile).
// Tokens, shares and element widths come from the plan's shape (plan_shape.hpp); the overloads
// for a strategy derive them as PlanShape does (token_shape, element_bytes).
Bytes layer_activation_bytes(const LayerGraph& graph, const Software& sw, const PlanShape& shape, bool keep_all);
Bytes layer_activation_bytes(const LayerGraph& graph, const Software& sw, const PlanShape& shape, int kind, bool keep_all);
Bytes layer_activation_bytes(const LayerGraph& graph, const Strategy& s, bool keep_all);
Bytes layer_activation_bytes(const LayerGraph& graph, const Software& sw, const Strategy& s, bool keep_all);
// As stored: with full recomputation only the layer input (tokens x hidden at the stream's width,
// sequence-split with SP).
Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Software& sw, const PlanShape& shape);
Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Software& sw, const PlanShape& shape, int kind);
Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Strategy& s);
Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Strategy& s, int kind);
Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Software& sw, const Strategy& s);

// Everything the per-stage memory figures need that does not depend on the stage, built once per
// plan by memory_model() from its PlanShape.
struct MemoryModel {
  ZeroPolicy zero;            // which model states are sharded over the DP group
  double shard = 1;           // ZeRO shard group: dp x cp ranks (PlanShape's groups.dp)
  double expert_shard = 1;    // the routed experts' ZeRO shard group: the EDP ranks (groups.edp)
  int pp = 1, vp = 1, micro_batches = 1;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  // stored_layer_activation_bytes of one layer of each kind (LayerGraph::kind)
  std::array<Bytes, LayerGraph::kMaxKinds> stored_layer{};
  Bytes working_layer = 0;    // full recomputation: one layer rebuilt at a time in the backward
  // The last stage's MTP modules (LayerGraph::add_mtp): their layers' stored activations and one
  // more set of logits and head inputs each, per micro-batch in flight of the last chunk.
  int mtp_layers = 0;
  Bytes mtp_layer = 0;
  double tokens = 0;          // tokens per rank per micro-batch: b x seq / cp
  double hidden = 0, vocab = 0, tp = 1;
  bool loss_on_gathered_logits = false;  // the loss holds all vocab rows on every TP rank, not vocab / tp
                                        // (Software::parallel.loss_on_gathered_logits)
  double seq_share = 1;       // share of a sequence-split tensor a rank holds: 1/tp with SP
  // Bytes per element of each tensor kind, as the plan's shape has them: the model states per
  // parameter (bytes.state), activations, the residual stream, logits, 16-bit weight copies,
  // optimizer temporaries and gradient compression's error feedback (in "other").
  ElementBytes bytes;
  bool dropout_masks = true;  // the stack saves 1-byte dropout masks
  double reserved_over_allocated = 1;
  Bytes workspace = 0;        // inside the allocator, not scaled
  double safety_margin = 0;   // share of capacity a plan must leave free (Allocator::safety_margin)
  // ZeRO-3: bytes one rank holds of each gathered unit, in the compute dtype
  // (zero3_gathered_bytes): a transformer layer, the embedding (first stage), the head (final norm
  // and LM head, last stage); `head_reads_embedding`: a tied head on the embedding's chunk (pp 1)
  // reads the embedding's unit too. All 0 without ZeRO-3.
  Bytes gathered_layer = 0, gathered_embedding = 0, gathered_head = 0;
  bool head_reads_embedding = false;
  // Parameters per rank of the stage ends (set_end_units): the embedding unit (first stage) and
  // the head unit (final norm and LM head, last stage; a tied head on pp > 1 its own copy of the
  // table), and the LM head's weight alone (vocabulary rows / tp x hidden, tied or not).
  double embedding_params = 0, head_params = 0, lm_head_params = 0;
  bool copies_layers_only = false;  // MemoryProfile::weight_copies_layers_only
  // The loss (last stage): the tokens of one chunk where it computes the logits chunk by chunk
  // (MemoryProfile::loss_chunk_bytes; 0: the whole micro-batch at once), and the bytes per LM-head
  // weight it holds besides the logits.
  double loss_chunk_tokens = 0;
  double loss_head_bytes = 0;
  double final_norm_tensors = 1;  // stream tensors the final norm saves (rms_norm_saved_stream_tensors)
  Bytes runtime = 0;          // the cluster's runtime reserve, outside the allocator
};
// The memory model of a plan, with the per-layer activation bytes already computed:
// stored_layer_activation_bytes() and, under full recomputation, layer_activation_bytes(keep_all)
// (else 0). Both depend only on the strategy's per-rank layer split (predict.hpp's LayerKey), so
// search computes them once per key (LayerCosts).
MemoryModel memory_model(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape,
                         const std::array<Bytes, LayerGraph::kMaxKinds>& stored_layer, Bytes working_layer);
// The same, written into `out` (step_costs: StepCosts::memory, without a copy).
void memory_model(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape,
                  const std::array<Bytes, LayerGraph::kMaxKinds>& stored_layer, Bytes working_layer, MemoryModel& out);
// The same for a strategy that passes cannot_shape(): its shape and layer bytes computed here; with
// the default MemoryProfile and Allocator (Megatron-style accounting, no allocator overhead) where
// no software is given.
MemoryModel memory_model(const LayerGraph& graph, const Cluster& cluster, const Strategy& s);
MemoryModel memory_model(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const Strategy& s);

// Activation bytes pipeline stage `stage` holds at its peak, with `layers` transformer layers over
// its vp chunks: in flight x layers per chunk x stored bytes per layer, the working layer of full
// recomputation, on the first stage the embedding dropout mask of each chunk in flight (1 byte per
// element), on the last the logits of one micro-batch (or loss chunk) in the loss, what the loss
// holds per LM-head weight, and the head's input.
Bytes stage_activation_bytes(const MemoryModel& mm, int stage, int layers);
// The same for a stage holding `kinds` layers of each kind.
Bytes stage_activation_bytes(const MemoryModel& mm, int stage, const LayerGraph::KindCounts& kinds);
// The same figure in its parts: the stored layers, the working layer of full recomputation, the
// first stage's embedding masks and the last stage's logits and head input.
struct StageActivations {
  Bytes layers = 0, working_layer = 0, embedding = 0, head = 0;
  int chunks_in_flight = 0;  // in_flight_chunks() of the stage
  Bytes total() const { return layers + working_layer + embedding + head; }
};
StageActivations stage_activation_parts(const MemoryModel& mm, int stage, int layers);
StageActivations stage_activation_parts(const MemoryModel& mm, int stage, const LayerGraph::KindCounts& kinds);

// ZeRO-3's gathered parameters pipeline stage `stage` holds at its peak, with `layers` transformer
// layers over its vp chunks: each unit (the embedding, one layer, the head) is all-gathered in the
// compute dtype just before it runs and freed after it, while the unit that runs next is
// prefetched (FSDP's forward/backward prefetch; exec/model.cpp's order: embedding, layers, head
// forward, the reverse backward, where the embedding's backward reads no weights). Peak = the
// largest pair of consecutive units of a chunk:
//   2 x layer        where a chunk holds two layers or more (layers > vp),
//   embedding + layer on the first stage (forward),
//   head + layer     on the last stage (+ the embedding where a tied head shares its chunk, pp 1),
// in bytes (units' parameters per rank x compute-dtype bytes, MemoryModel::gathered_*).
Bytes zero3_gathered_bytes(const MemoryModel& mm, int stage, int layers);

// 16-bit weight copies of `params` parameters per rank, `ends` of them the embedding's or the
// head's (not copied where the profile copies the layers only), ZeRO-3 sharding applied.
Bytes weight_copy_bytes(const MemoryModel& mm, double params, double ends);

// What a pipeline stage holds: its parameters per rank (of which routed experts'), and its layers.
struct StageLoad {
  double params = 0, expert_params = 0;
  LayerGraph::KindCounts kinds{};  // its transformer layers of each kind
  int layers = 0;                  // all of them
};
// The memory of pipeline stage `stage` holding `load`.
StageMemory stage_memory(const MemoryModel& mm, int stage, const StageLoad& load);
// The same for `params` parameters (no experts) and `layers` layers of layer 0's kind.
StageMemory stage_memory(const MemoryModel& mm, int stage, double params, int layers);

}  // namespace trainplan
