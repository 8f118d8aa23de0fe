// ZeRO 0: replicated all-reduce (see grad_sync.hpp). Every replica holds the whole chunk and steps
// all of it; the flat gradient is summed over the replicas in buckets. With one replica (or DP 1)
// there is nothing to sum over DP and only sequence parallelism's TP sum remains.
#include "exec/grad_sync.hpp"

namespace trainplan::exec {

namespace {

class ReplicatedAllReduce final : public GradSync {
 public:
  ReplicatedAllReduce(Comm& dp, Comm& tp, PhaseClock& clock, bool sequence_parallel, int64_t bucket_elems)
      : dp_(dp), tp_(tp), clock_(clock), sp_(sequence_parallel), bucket_elems_(bucket_elems), in_flight_(dp, clock) {}

  Shard add_chunk(ModelChunk& model, bool tied_copy) override {
    Chunk& c = chunks_.emplace_back();
    c.model = &model;
    // Overlap: buckets all-reduced as the chunk's last backward completes them. Not with sequence
    // parallelism (the TP-replicated gradients are summed over TP first) nor for a tied copy
    // (summed with its twin first): their chunk is reduced in one go once that sum is done.
    if (dp_.size() > 1 && !sp_ && !tied_copy) {
      at::Tensor flat_grad = model.flat_grad();
      c.buckets = std::make_unique<Buckets>(model.params(), bucket_elems_, -1, [this, flat_grad](const Buckets::Range& r) {
        at::Tensor slice = flat_grad.narrow(0, r.begin, r.end - r.begin);
        in_flight_.push(dp_.all_reduce_async(slice));
      });
    }
    Shard s;
    s.master = model.flat();
    s.grad = model.flat_grad();
    return s;
  }

  void begin_step() override {
    for (Chunk& c : chunks_) {
      c.model->flat_grad().zero_();
      if (c.buckets) c.buckets->reset();
    }
  }

  void begin_backward(int chunk, bool last) override {
    Chunk& c = chunks_[chunk];
    if (c.buckets) c.buckets->arm(last);  // the gradients are complete only in the last backward
  }

  void reduce(int chunk) override {
    Chunk& c = chunks_[chunk];
    if (sp_) sum_over_tp(c.model->tp_partial_grads(), tp_);
    if (dp_.size() == 1) return;
    PhaseScope sc(clock_, Ph::dp_comm);
    if (c.buckets) {  // overlapped: start whatever the backward hooks have not started
      c.buckets->launch_rest();
      return;
    }
    at::Tensor& full = c.model->flat_grad();
    const int64_t n = full.numel();
    for (int64_t off = 0; off < n; off += bucket_elems_) {
      at::Tensor bucket = full.narrow(0, off, std::min(bucket_elems_, n - off));
      in_flight_.push(dp_.all_reduce_async(bucket));
    }
  }

  void finish(bool) override { in_flight_.drain(); }

 private:
  struct Chunk {
    ModelChunk* model = nullptr;
    std::unique_ptr<Buckets> buckets;  // null: reduced in one go in reduce()
  };
  Comm& dp_;
  Comm& tp_;
  PhaseClock& clock_;
  bool sp_;
  int64_t bucket_elems_;
  InFlight in_flight_;
  std::deque<Chunk> chunks_;  // stable addresses
};

}  // namespace

std::unique_ptr<GradSync> replicated_all_reduce(Comm& dp, Comm& tp, PhaseClock& clock, bool sequence_parallel,
                                                int64_t bucket_elems) {
  return std::make_unique<ReplicatedAllReduce>(dp, tp, clock, sequence_parallel, bucket_elems);
}

}  // namespace trainplan::exec
