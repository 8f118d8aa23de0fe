// The data-parallel side of one rank's step: reduces gradients over the DP group, gathers ZeRO-3
// parameters, and steps AdamW over the shard this rank owns.
//   ZeRO 0: bucketed all-reduce of the flat gradient, overlapped with the chunk's last backward.
//   ZeRO 1: the flat gradient accumulates over the micro-batches; at the chunk's last backward each
//           bucket is reduced in place into the replica that owns it (its shard of the flat buffer).
//   ZeRO 2/3 (several replicas): no full-size gradient buffer. After every micro-batch's backward
//           each bucket's fresh gradients are copied into a bucket buffer and released, reduced to
//           their owners, and the owner adds its part to its fp32 shard gradient; at most
//           kMaxBucketsInFlight bucket buffers exist at a time.
//   ZeRO 3 (several replicas): the model keeps each unit's parameters (embedding, layer, head) in
//           a buffer of its own and asks the reducer (a UnitGatherer) for them just before the
//           unit runs, forward and backward; the owners broadcast their parts of it, the unit the
//           model runs next is brought meanwhile (prefetch), and a unit's memory is freed as soon
//           as it has run. Between steps a rank holds only its fp32 shard. Under mixed precision
//           the units are gathered in the 16-bit compute dtype (each owner casts its fp32 part
//           once per gather); their gradients come back 16-bit and are reduced in fp32 buckets
//           into the fp32 shard gradient.
// The schedule runner tells it when a chunk's backward is done; it never walks the schedule.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "exec/model.hpp"
#include "exec/parallel.hpp"
#include "sim/strategy.hpp"

namespace trainplan::exec {

// AdamW (Loshchilov & Hutter 2019) with decoupled weight decay on matrices only; constant rate.
struct AdamWSettings {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// AdamW over shards of flat parameter buffers, by LibTorch's fused multi-tensor kernel: the DP
// reducer's optimizer (its ZeRO shard, or the whole chunk) and the parameter servers' (their
// shard). Weight decay on matrices only (ParamInfo::decay).
class ShardAdamW {
 public:
  explicit ShardAdamW(AdamWSettings a);
  ~ShardAdamW();
  // Adds the elements [lo, lo + master.numel()) of a flat buffer laid out as `params`: `master`
  // (the weights it updates), `grad`, `exp_avg` and `exp_avg_sq` are buffers of that length.
  // Elements of no parameter (the buffer's padding) are left alone.
  void add(const std::vector<ParamInfo>& params, int64_t lo, const at::Tensor& master, const at::Tensor& grad,
           const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);
  void step();  // one AdamW step over everything added

 private:
  struct Group;
  AdamWSettings adam_;
  std::vector<Group> groups_;  // with weight decay, without
  at::Tensor step_;            // optimizer steps taken (fp32 scalar on the device)
};

// Dynamic loss scaling for fp16 (Micikevicius et al. 2018, "Mixed Precision Training", sec. 3.2;
// the schedule of PyTorch's torch.amp.GradScaler): the loss is multiplied by `scale` before the
// backward; a step whose gradients hold an inf or NaN on any rank is skipped and the scale
// multiplied by `backoff`; after `growth_interval` good steps in a row it is multiplied by
// `growth`. Defaults are GradScaler's (init 2^16, growth 2, backoff 0.5, interval 2000).
struct LossScaling {
  bool enabled = false;
  double scale = 65536.0;
  double growth = 2.0, backoff = 0.5;
  int growth_interval = 2000;
  int good_steps = 0;               // good steps since the last change
  std::vector<int> skipped;         // step indices skipped (inf/NaN gradients)
};

class GradCompressor;

class DpReducer : public UnitGatherer {
 public:
  // `bucket_bytes`: fp32 bytes per gradient bucket (Megatron's and DDP's default is about 25 MB).
  DpReducer(const Strategy& s, int dp_rank, Groups& groups, PhaseClock& clock, AdamWSettings adam,
            LossScaling scaling = {}, double bucket_bytes = 16.0 * (1 << 20));
  ~DpReducer() override;
  DpReducer(const DpReducer&) = delete;
  DpReducer& operator=(const DpReducer&) = delete;

  // Registers the next model chunk (in chunk order): this rank's shard of its flat buffers, the
  // optimizer state for it, and (ZeRO 0, DP > 1) its gradient buckets and post-accumulate hooks.
  // `tied_copy`: the chunk holds a tied-embedding copy whose twin is on another rank; its
  // gradient is summed with the twin's (reduce_tied) before the DP reduction.
  void add_chunk(ModelChunk& model, bool tied_copy);
  // Gradient compression (compression.hpp): the ZeRO-0 DP reduction goes through `c` instead of
  // the bucketed fp32 all-reduce (and is then not overlapped with the backward). Call before
  // the first add_chunk.
  void compress_with(std::unique_ptr<GradCompressor> c);

  void begin_step();                // zero gradients; reset buckets; free ZeRO-3's gathered units
  // ZeRO-3 (UnitGatherer): the model chunk's unit, gathered from its owners' shards.
  void need(ModelChunk& chunk, int unit, int prefetch) override;
  void release(ModelChunk& chunk, int unit) override;
  // Marks the chunk's next backward as its last of the step: the hooks then start each bucket's
  // all-reduce as soon as its gradients are complete.
  void set_last_backward(int chunk, bool last);
  // One micro-batch's backward of the chunk has run: ZeRO-2/3 reduce whatever buckets the hooks
  // have not (the gradients are released either way).
  void after_backward(int chunk);
  void backward_done(int chunk);    // every micro-batch's backward of the chunk has run
  void reduce_tied();               // after the schedule: tied copies, then their DP reduction
  void finish_reduction();          // wait for the DP work: the step's gradients are final
  // AdamW on the shard, then (ZeRO-1/2) all-gather the parameters. With loss scaling: unscale the
  // gradients first, or skip the step (every rank alike) when any holds an inf or NaN.
  void update(int step);
  const LossScaling& loss_scaling() const { return scaling_; }
  double loss_scale() const { return scaling_.enabled ? scaling_.scale : 1.0; }
  // Debug: the chunk's whole reduced gradient as the optimizer sees it (mean over the global
  // batch), as a flat buffer laid out like the parameters. Call between finish_reduction and
  // update; with ZeRO >= 1 and DP > 1 it all-gathers the shards (every DP rank must call it).
  at::Tensor reduced_grad(int chunk);
  // Debug: the chunk's whole parameters in fp32, as a flat buffer (for dumps): the model's flat
  // buffer, or (ZeRO-3) the master shards all-gathered (every DP rank must call it).
  at::Tensor parameters(int chunk);
  // Test fault: a NaN in the chunk's gradient as the optimizer will read it (written in update()).
  void poison_gradient(int chunk);

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
  struct Bucket;
  struct Chunk;
  struct Pending;
  void setup_buckets(Chunk& c);
  void launch_ready_buckets(Chunk& c, bool all);
  void launch_bucket(Chunk& c, size_t b);
  void launch(Chunk& c);
  void reduce_to_owners(Chunk& c, int64_t begin, const at::Tensor& data, bool temporary);
  void sum_tp_partial_shard(Chunk& c);
  void push_pending(c10::intrusive_ptr<c10d::Work> w, at::Tensor buffer = {}, std::function<void()> then = {});
  void complete_oldest();
  bool sharded_grads() const { return s_.zero >= 2 && replicas_ > 1; }
  bool unit_gathers() const { return s_.zero == 3 && replicas_ > 1; }
  Chunk& chunk_of(const ModelChunk& m);
  void start_gather(Chunk& c, int unit);   // allocate the unit's memory, post the owners' broadcasts
  void finish_gather(Chunk& c, int unit);  // wait for them
  void free_units(Chunk& c);
  void add_to_adam_groups(Chunk& c);
  void optimizer_step();

  const Strategy& s_;
  int dp_rank_;    // index in the DP group, which spans dp x cp (replicas of the same parameters)
  int replicas_;   // its size: gradients are summed and ZeRO shards over these ranks
  Groups& g_;
  PhaseClock& clock_;
  ShardAdamW adam_;
  LossScaling scaling_;
  std::unique_ptr<GradCompressor> compressor_;  // null: uncompressed
  std::vector<std::unique_ptr<Chunk>> chunks_;  // stable addresses: the hooks point at them
  std::deque<Pending> pending_;         // in launch order; completed oldest first
  int64_t bucket_elems_;
  int buffers_in_flight_ = 0;
  int poisoned_chunk_ = -1;
  double buffer_bytes_ = 0, buffer_bytes_peak_ = 0;
  double gathered_bytes_ = 0, gathered_peak_ = 0;  // ZeRO-3: unit memory allocated now, and its peak
};

}  // namespace trainplan::exec
