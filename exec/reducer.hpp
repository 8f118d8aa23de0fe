// The data-parallel side of one rank's step: a GradSync scheme (grad_sync.hpp: replicated or
// compressed all-reduce, the ZeRO-sharded optimizer, parameter servers) combines the gradients over
// the replicas, and this steps AdamW over the shard the scheme gives this rank. It also holds
// what every scheme shares: the tied-embedding sum before the reduction, fp16's dynamic loss
// scaling, the debug views of the reduced gradients and parameters, and the bytes of the
// model states. The schedule runner tells it when a chunk's backward is done; it never walks the
// schedule. An MoE model's routed experts (each chunk's expert chunk, model.hpp) have a scheme of
// their own over the expert-data-parallel group, driven alongside; one AdamW steps both shards.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "exec/grad_sync.hpp"
#include "exec/model.hpp"
#include "exec/optimizer.hpp"
#include "exec/parallel.hpp"

namespace trainplan::exec {

class DpReducer {
 public:
  // `sync`: the scheme, built over `groups.dp` (or the parameter servers' group); `expert_sync`
  // (MoE models, else null): the routed experts' scheme, over `groups.edp`.
  DpReducer(std::unique_ptr<GradSync> sync, Groups& groups, PhaseClock& clock, AdamWSettings adam,
            LossScaling scaling = {}, std::unique_ptr<GradSync> expert_sync = nullptr);
  ~DpReducer();
  DpReducer(const DpReducer&) = delete;
  DpReducer& operator=(const DpReducer&) = delete;

  // Registers the next model chunk (in chunk order): its shard and the optimizer state for it.
  // `tied_copy`: the chunk holds a tied-embedding copy whose twin is on another rank; its
  // gradient is summed with the twin's (reduce_tied) before the DP reduction. `experts`: the
  // chunk's routed experts (with an expert scheme; null otherwise).
  void add_chunk(ModelChunk& model, bool tied_copy, ModelChunk* experts = nullptr);

  void begin_step();                          // zero gradients; reset the scheme's hooks
  void begin_backward(int chunk, bool last);  // the chunk's next backward runs now; `last`: its last of the step
  void after_backward(int chunk);             // one micro-batch's backward of the chunk has run
  void backward_done(int chunk);              // every micro-batch's backward of the chunk has run
  void reduce_tied();                         // after the schedule: tied copies, then their DP reduction
  // Waits for the DP work: the step's gradients are final. `keep_grads`: reduced_grad() is read next.
  void finish_reduction(bool keep_grads);
  // AdamW on the shard, then whatever the scheme does with the updated shard (ZeRO 1/2: all-gather
  // it). With loss scaling: unscale the gradients first, or skip the step (every rank alike)
  // when any holds an inf or NaN.
  void update(int step);
  const LossScaling& loss_scaling() const { return scaling_; }
  double loss_scale() const { return scaling_.enabled ? scaling_.scale : 1.0; }

  // Debug: the chunk's whole reduced gradient as the optimizer sees it (mean over the global
  // batch), as a flat buffer laid out like the parameters. Call between finish_reduction(true)
  // and update; where the shard is part of the chunk it all-gathers the shards (every DP rank
  // must call it).
  // `experts`: of the chunk's routed experts (all-gathered over the EDP group).
  at::Tensor reduced_grad(int chunk, bool experts = false);
  // Debug: the chunk's whole parameters in fp32, as a flat buffer (for dumps): the model's flat
  // buffer, or (ZeRO 3) the master shards all-gathered (every DP rank must call it).
  at::Tensor parameters(int chunk, bool experts = false);
  // The gradient of the chunk's shard as the optimizer reads it (test faults write into it).
  at::Tensor shard_grad(int chunk) { return chunks_.at(chunk).shard.grad; }

  // Bytes of the model-state tensors this rank holds, counted from the tensors themselves (each
  // storage once): what memory_model predicts as weights, gradients and optimizer states per rank.
  struct HeldBytes {
    double weights = 0;          // parameters between steps (ZeRO-3: the fp32 master shard)
    double gathered = 0;         // ZeRO-3: peak bytes of gathered unit parameters held at once in a step
                                 // (in the units' dtype: 2 B per parameter under mixed precision)
    double gradients = 0;        // the flat gradient buffer, or (ZeRO-2/3) the shard gradient
    double optimizer = 0;        // AdamW's two moments (the one-element step count not counted)
    double buffers_peak = 0;     // ZeRO-2/3: peak bytes of bucket buffers in flight
  };
  HeldBytes held_bytes() const;

 private:
  struct Chunk {
    ModelChunk* model = nullptr;
    bool tied_copy = false;
    Shard shard;
    at::Tensor exp_avg, exp_avg_sq;  // AdamW's moments over the shard (empty where it is stepped elsewhere)
  };
  bool unscale_or_skip(int step);  // loss scaling: false when the step is skipped
  // The replicas' shards of chunk c, all-gathered over `group`.
  at::Tensor whole(const Chunk& c, Comm& group, const at::Tensor& shard);
  Chunk make_chunk(GradSync& sync, ModelChunk& model, bool tied_copy);
  template <class F> void each_chunk(F f) const {  // dense chunks, then expert chunks
    for (const Chunk& c : chunks_) f(c);
    for (const Chunk& c : expert_chunks_) f(c);
  }

  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<GradSync> expert_sync_;  // null for a dense model
  Groups& g_;
  PhaseClock& clock_;
  ShardAdamW adam_;
  LossScaling scaling_;
  std::vector<Chunk> chunks_;
  std::vector<Chunk> expert_chunks_;  // one per chunk, with an expert scheme
};

}  // namespace trainplan::exec
