// The data-parallel schemes a rank runs, as small policies behind one interface (GradSync): how
// its gradients are combined with those of its replicas (the DP group: the dp x cp ranks that hold
// the same parameters), which part of the parameters its optimizer steps, and how the updated
// parameters come back. One function builds each scheme; the plan picks one (ScheduleRunner):
//   replicated_all_reduce   ZeRO 0: every replica holds and steps everything. Gradient buckets
//                           are all-reduced as the chunk's last backward completes them
//                           (grad_sync_replicated.cpp).
//   compressed_all_reduce   ZeRO 0 with --grad-compression: bf16 or PowerSGD, after the chunk's
//                           backward, no overlap (compression.cpp).
//   sharded_optimizer       ZeRO 1/2/3: each bucket reduced into the replica whose shard holds it
//                           (a reduce-scatter over uneven ranges), the shard stepped; ZeRO 1/2
//                           all-gather the parameters after the step, ZeRO 3 keeps none between
//                           steps and gathers each unit before it runs (UnitGathers,
//                           unit_gather.hpp) (grad_sync_sharded.cpp).
//   parameter_server        the gradient pushed to the servers, which step their shards, the
//                           parameters pulled back (param_server.cpp).
// What a ZeRO stage does comes from its ZeroPolicy (sim/zero_policy.hpp), never from the number.
// The DpReducer (reducer.hpp) drives the policy through a step and owns the optimizer.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "exec/model.hpp"
#include "exec/optimizer.hpp"
#include "exec/parallel.hpp"
#include "sim/rank_layout.hpp"
#include "sim/strategy.hpp"
#include "sim/zero_policy.hpp"

namespace trainplan::exec {

// What this rank's optimizer steps of one model chunk: the elements [offset, offset +
// master.numel()) of the chunk's flat layout.
struct Shard {
  int64_t offset = 0;
  at::Tensor master;       // their fp32 weights: a view of the model's flat buffer, or (ZeRO 3) a copy
  at::Tensor grad;         // their reduced gradient, as the optimizer reads it
  bool steps_here = true;  // false: another rank (a parameter server) steps them; no AdamW state here
};

// Peaks of the memory a scheme holds besides the shards, in bytes.
struct SyncPeaks {
  double gathered = 0;  // ZeRO 3: gathered unit parameters held at once (in the units' dtype)
  double buffers = 0;   // ZeRO 2/3: bucket buffers in flight
};

// One data-parallel scheme. The DpReducer calls it, per step: begin_step; for each backward of a
// chunk begin_backward and end_backward; reduce once the chunk's gradients are complete; finish;
// then, after the optimizer has stepped the shards, after_update.
class GradSync {
 public:
  virtual ~GradSync() = default;
  // Set-up, in chunk order: the chunk's shard, and the hooks and buffers the scheme needs.
  // `tied_copy`: the chunk holds a tied-embedding copy whose gradient is summed with its twin's
  // (on another rank) first, so its reduce() comes only after that sum.
  virtual Shard add_chunk(ModelChunk& model, bool tied_copy) = 0;
  virtual void begin_step() = 0;  // zero the gradients, reset the hooks, drop stale gathered units
  // The chunk's next backward runs now; `last`: its last of the step.
  virtual void begin_backward(int chunk, bool last) { (void)chunk, (void)last; }
  virtual void end_backward(int chunk) { (void)chunk; }  // one micro-batch's backward of it has run
  // The chunk's gradients are complete: sum the sequence-parallel partial gradients over TP and
  // start reducing over the replicas whatever the backward's hooks have not started.
  virtual void reduce(int chunk) = 0;
  // Completes the step's reduction: each shard's `grad` holds its reduced gradient (`keep_grads`,
  // for debug dumps: also where the scheme would not otherwise bring it to this rank). Parameter
  // servers run their whole exchange here: push, the servers' update, pull.
  virtual void finish(bool keep_grads) = 0;
  virtual void after_update() {}  // the optimizer has stepped the shards
  virtual SyncPeaks peaks() const { return {}; }
};

// The schemes. `dp`: the replicas; `tp`: the tensor-parallel group, over which `sequence_parallel`
// (SP with tp > 1) sums the TP-replicated parameters' gradients (each TP rank saw only its slice of
// the sequence); `bucket_elems`: fp32 elements per gradient bucket.
std::unique_ptr<GradSync> replicated_all_reduce(Comm& dp, Comm& tp, PhaseClock& clock, bool sequence_parallel,
                                                int64_t bucket_elems);
std::unique_ptr<GradSync> compressed_all_reduce(Comm& dp, Comm& tp, PhaseClock& clock, bool sequence_parallel,
                                                const GradCompression& kind, long long seed);
// `zero`: shards_optimizer must hold (ZeRO >= 1 over several replicas).
std::unique_ptr<GradSync> sharded_optimizer(Comm& dp, Comm& tp, PhaseClock& clock, ZeroPolicy zero,
                                            bool sequence_parallel, int64_t bucket_elems);
// A worker of a job with parameter servers (roles from `layout`; `ps`: every rank of the job).
std::unique_ptr<GradSync> parameter_server(const RankLayout& layout, int rank, Comm& ps, PhaseClock& clock,
                                           AdamWSettings adam);

// ---- pieces the schemes share (grad_sync.cpp) ----

using SyncClock = std::chrono::steady_clock;
inline double seconds_since(SyncClock::time_point t) {
  return std::chrono::duration<double>(SyncClock::now() - t).count();
}

// The DP reductions in flight, completed oldest first: each completion adds its time from launch
// to completion to the clock's dp_in_flight and then runs its `then`. A bucket buffer handed with
// a reduction is counted (bytes now, peak) until that reduction completes.
class InFlight {
 public:
  // At most this many bucket buffers in flight (ZeRO 2/3): reserve_buffer() completes the oldest
  // reductions until one more fits, so the reduction never holds more buckets of gradients.
  static constexpr int kMaxBuffers = 2;

  InFlight(Comm& dp, PhaseClock& clock) : dp_(dp), clock_(clock) {}
  void push(c10::intrusive_ptr<c10d::Work> w, at::Tensor buffer = {}, std::function<void()> then = {});
  void reserve_buffer();
  void drain();  // completes everything
  double buffers_peak() const { return buffer_bytes_peak_; }

 private:
  struct Pending {
    c10::intrusive_ptr<c10d::Work> work;
    SyncClock::time_point launched;
    std::shared_ptr<std::atomic<double>> done_after;  // seconds from launch to completion
    at::Tensor buffer;            // a bucket buffer, released when the work completes
    std::function<void()> then;   // run once the work has completed
  };
  void complete_oldest();
  Comm& dp_;
  PhaseClock& clock_;
  std::deque<Pending> pending_;  // in launch order
  int buffers_ = 0;
  double buffer_bytes_ = 0, buffer_bytes_peak_ = 0;
};

// A chunk's gradient buckets: ranges of its flat layout in the order the backward produces the
// gradients (last parameters first), each of adjacent parameters and closed once it reaches
// `elems`, and a post-accumulate hook on each parameter that counts its gradient in. While armed,
// every bucket whose gradients are complete goes to `launch`, in bucket order (the same order on
// every replica). Its hooks point at it: keep it at a stable address.
class Buckets {
 public:
  struct Range {
    int64_t begin = 0, end = 0;  // element range in the flat layout
    int first = 0, params = 0;   // its parameters: indices [first, first + params)
  };
  // `skip`: a parameter left out of every bucket (-1: none).
  Buckets(std::vector<ParamInfo>& params, int64_t elems, int skip, std::function<void(const Range&)> launch);
  Buckets(const Buckets&) = delete;
  Buckets& operator=(const Buckets&) = delete;
  void arm(bool on) { armed_ = on && !ranges_.empty(); }
  void launch_rest();  // launches every bucket not launched yet, complete or not
  void reset();        // a new backward: none launched, no gradient counted

 private:
  void accumulated(int bucket);
  std::vector<Range> ranges_;
  std::vector<int> ready_;  // per bucket: its parameters accumulated in this backward so far
  std::function<void(const Range&)> launch_;
  bool armed_ = false;
  size_t next_ = 0;
};

// Sums `parts` (tensors of one device and dtype) over `tp`, in place, as one all-reduce.
void sum_over_tp(std::vector<at::Tensor> parts, Comm& tp);

}  // namespace trainplan::exec
