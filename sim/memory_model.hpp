// memory_model: what one GPU holds during a training step, in bytes. The single home of every
// memory formula of the analytical model: predict() composes a stage's memory from it, and search's
// pruning bounds (search.cpp) call the same functions, so a bound can never drift from the figure it
// bounds. Pure functions of the model, strategy and (for the runtime reserve) the cluster.
//
// Per GPU and pipeline stage:
//   model states  = params x bytes per parameter (state_bytes), each kind sharded by ZeRO over the
//                   data-parallel group (model_state_bytes);
//   activations   = micro-batch chunks in flight (in_flight_chunks) x layers per chunk x stored bytes
//                   per layer (stored_layer_activation_bytes), plus the working layer of full
//                   recomputation and the extras of the first and last stage (stage_activation_bytes);
//   other         = the cluster's runtime reserve, plus ZeRO-3's gathered layer parameters.
#pragma once
#include "sim/cluster.hpp"
#include "sim/estimate.hpp"
#include "sim/layer_graph.hpp"
#include "sim/strategy.hpp"

namespace trainplan {

// Bytes per parameter of each model state. Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO,
// Sec. 3.1): 16-bit weights and gradients (fp32 gradients with fp32_grad_accum), K = 12 bytes of fp32
// master weights, momentum and variance. Pure fp32 training: 4-byte weights and gradients, K = 8
// (momentum, variance).
struct StateBytes {
  double weight = 0, grad = 0, optimizer = 0;  // bytes per parameter
};
StateBytes state_bytes(Dtype dtype, bool fp32_grad_accum);
inline StateBytes state_bytes(const Strategy& s) { return state_bytes(s.dtype, s.fp32_grad_accum); }

// Model-state bytes one rank holds for `params` parameters (already split by TP/PP), with ZeRO
// sharding over `shard` ranks (the dp x cp group that holds replicas of the same parameters):
// ZeRO 1 shards the optimizer states, 2 also the gradients, 3 also the weights
// (Rajbhandari et al. 2020, Sec. 5, Fig. 1).
struct ModelStateBytes {
  Bytes weights = 0, gradients = 0, optimizer = 0;
  Bytes total() const { return weights + gradients + optimizer; }
};
ModelStateBytes model_state_bytes(double params, const StateBytes& per_param, int zero, double shard);

// Peak number of micro-batch-chunks whose activations pipeline stage `stage` holds (closed form,
// equal to Schedule::peak_in_flight for the same sizes): GPipe all m; 1F1B min(p - i, m) (Narayanan
// et al. 2021, Sec. 2.2); interleaved 1F1B its warm-up forwards (p - i - 1) x 2 + (v - 1) x p, plus
// one, capped at m x v (Megatron-LM's schedule).
int in_flight_chunks(ScheduleKind kind, int pp, int stage, int micro_batches, int vp);

// Activation bytes one rank keeps for one transformer layer and one micro-batch between forward and
// backward, with the TP/SP/CP split and recomputation applied (Korthikanti et al. 2022, Table 2,
// generalised to GQA/SwiGLU by summing the saved tensors of the graph's ops). `keep_all` keeps what
// the recomputation policy would drop (the working set of a layer being recomputed).
Bytes layer_activation_bytes(const LayerGraph& graph, const Strategy& s, bool keep_all);
// As stored: with full recomputation only the layer input (tokens x hidden, sequence-split with SP).
Bytes stored_layer_activation_bytes(const LayerGraph& graph, const Strategy& s);

// Everything the per-stage memory figures need that does not depend on the stage; built once per
// strategy by memory_model().
struct MemoryModel {
  StateBytes per_param;
  int zero = 0;
  double shard = 1;           // ZeRO shard group: dp x cp ranks
  int pp = 1, vp = 1, micro_batches = 1;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  Bytes stored_layer = 0;     // stored_layer_activation_bytes
  Bytes working_layer = 0;    // full recomputation: one layer rebuilt at a time in the backward
  double tokens = 0;          // tokens per rank per micro-batch: b x seq / cp
  double hidden = 0, vocab = 0, tp = 1;
  double seq_share = 1;       // share of a sequence-split tensor a rank holds: 1/tp with SP
  double act_bytes = 2;       // bytes per activation element
  Bytes other = 0;            // runtime reserve (+ ZeRO-3 gathered parameters), every stage
};
MemoryModel memory_model(const LayerGraph& graph, const Cluster& cluster, const Strategy& s);

// Activation bytes pipeline stage `stage` holds at its peak, with `layers` transformer layers over
// its vp chunks: in flight x layers per chunk x stored bytes per layer, the working layer of full
// recomputation, on the first stage the embedding dropout mask of each chunk in flight (1 byte per
// element), on the last the fp32 logits of one micro-batch in the loss and the head's input.
Bytes stage_activation_bytes(const MemoryModel& mm, int stage, int layers);

// The memory of pipeline stage `stage` holding `params` parameters per rank and `layers` layers.
StageMemory stage_memory(const MemoryModel& mm, int stage, double params, int layers);

}  // namespace trainplan
