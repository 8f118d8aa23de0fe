// layer_detail: memory and time per transformer layer on each pipeline stage (predict --detail
// layers). Pure: every figure is read from step_costs() (the per-layer op costs the closed form and
// the simulator sum) and the memory model's per-stage functions (memory_model.hpp); nothing is
// costed here a second time.
#pragma once
#include <vector>

#include "sim/predict.hpp"

namespace trainplan {

// One piece of a stage: the embedding, the transformer layers of one kind in one chunk, or the LM
// head (final norm, head, loss, MTP modules). Times are per micro-batch on one rank; layer rows give
// each layer's figures (the layers of one kind are identical, so each layer of the row has them).
struct LayerRow {
  enum class Kind { embedding, layers, head } kind = Kind::layers;
  int chunk = 0;        // virtual-stage chunk on the stage (0..vp-1)
  int first_layer = 0;  // layers: the first transformer layer of the chunk
  int count = 1;        // layers: how many of this kind; 1 for the embedding and head
  int chunk_layers = 1; // layers: the chunk's transformer layers of every kind (first_layer on)
  LayerKind layer_kind; // layers: which kind (dense or MoE, attention window)
  Seconds forward = 0, backward = 0, recompute = 0;
  Seconds tp_comm = 0;  // tensor-parallel collectives, forward + backward (not overlapped)
  Seconds cp_comm = 0;  // exposed context-parallel exchange, forward + backward
  Seconds ep_comm = 0;  // exposed expert all-to-all, forward + backward
  double params = 0;    // per rank
  // Model states of its parameters on one rank (ZeRO sharding applied), and the activations it
  // holds at the stage's peak: chunks in flight / vp x the stored bytes of one layer; for the
  // embedding its dropout masks, for the head the loss's logits and the head's input.
  Bytes weights = 0, gradients = 0, optimizer = 0, weight_copies = 0, activations = 0;
  int mtp_layers = 0;   // head: the multi-token-prediction modules it includes (each with a layer)
};

struct StageDetail {
  int stage = 0;
  int chunks_in_flight = 0;   // micro-batch chunks whose activations the stage holds at its peak
  Bytes working_layer = 0;    // full recomputation: one layer rebuilt at a time, once per stage
  std::vector<LayerRow> rows;
  // The stage's chunks summed, per micro-batch (includes per-micro-batch weight casts, which no
  // row carries).
  Seconds forward = 0, backward = 0, recompute = 0, tp_comm = 0, cp_comm = 0, ep_comm = 0;
};

// Per stage, in stage order; the rows of a stage in chunk order (embedding first, head last).
std::vector<StageDetail> layer_detail(const StepCosts& costs);

}  // namespace trainplan
