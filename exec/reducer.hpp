// The data-parallel side of one rank's step: reduces gradients over the DP group (ZeRO 0: bucketed
// all-reduce, overlapped with the backward where it can be; ZeRO 1-3: reduce-scatter into this
// rank's shard), gathers ZeRO-3 parameters, and steps AdamW over the shard this rank owns.
// The schedule runner tells it when a chunk's backward is done; it never walks the schedule.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <chrono>
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

class DpReducer {
 public:
  DpReducer(const Strategy& s, int dp_rank, Groups& groups, PhaseClock& clock, AdamWSettings adam);
  ~DpReducer();
  DpReducer(const DpReducer&) = delete;
  DpReducer& operator=(const DpReducer&) = delete;

  // Registers the next model chunk (in chunk order): this rank's shard of its flat buffers, the
  // optimizer state for it, and (ZeRO 0, DP > 1) its gradient buckets and post-accumulate hooks.
  // `tied_copy`: the chunk holds a tied-embedding copy whose twin is on another rank; its
  // gradient is summed with the twin's (reduce_tied) before the DP reduction.
  void add_chunk(ModelChunk& model, bool tied_copy);

  void begin_step();                // zero gradients; reset buckets and ZeRO-3 gathers
  void before_use(int chunk);       // ZeRO-3: the chunk's full parameters, gathered at its first slot
  // Marks the chunk's next backward as its last of the step: the hooks then start each bucket's
  // all-reduce as soon as its gradients are complete.
  void set_last_backward(int chunk, bool last);
  void backward_done(int chunk);    // every micro-batch's backward of the chunk has run
  void reduce_tied();               // after the schedule: tied copies, then their DP reduction
  void finish_step();               // wait for the DP work, AdamW on the shard, ZeRO-1/2 all-gather
  void gather_all();                // ZeRO-3: full parameters present on every chunk (for dumps)

 private:
  struct Bucket;
  struct Chunk;
  struct Pending;
  void setup_buckets(Chunk& c);
  void launch_ready_buckets(Chunk& c, bool all);
  void launch(Chunk& c);
  void push_pending(c10::intrusive_ptr<c10d::Work> w);
  void gather(Chunk& c);
  void optimizer_step();

  const Strategy& s_;
  int dp_rank_;
  Groups& g_;
  PhaseClock& clock_;
  AdamWSettings adam_;
  int adam_step_ = 0;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // stable addresses: the hooks point at them
  std::vector<Pending> pending_;
};

}  // namespace trainplan::exec
