// ZeRO 1/2/3 over several replicas: the sharded optimizer (see grad_sync.hpp). Replica r owns the
// elements [r·L, (r+1)·L) of each chunk's flat layout (L = padded size / replicas): its optimizer
// steps only those, so each gradient element is summed into its owner alone, one reduce per owner
// rooted there (a reduce-scatter over ranges that need not split evenly).
//   ZeRO 1 (one reduction a step): the flat gradient accumulates over the micro-batches; during the
//          chunk's last backward each bucket is reduced in place as soon as it is complete.
//   ZeRO 2/3 (a reduction every micro-batch): no full-size gradient buffer. After each backward
//          of the chunk each bucket's fresh gradients are copied into a bucket buffer and released,
//          reduced to their owners, and the owner adds its part to its fp32 shard gradient; at
//          most InFlight::kMaxBuffers bucket buffers exist at a time. Under mixed precision ZeRO 3's
//          gradients come back 16-bit and are reduced in those fp32 buffers.
//   ZeRO 1/2 then all-gather the updated parameters; ZeRO 3 holds none between steps (UnitGathers).
#include <algorithm>

#include "exec/grad_sync.hpp"
#include "exec/unit_gather.hpp"

namespace trainplan::exec {

namespace {

class ShardedOptimizer final : public GradSync {
 public:
  ShardedOptimizer(Comm& dp, Comm& tp, PhaseClock& clock, ZeroPolicy zero, bool sequence_parallel, int64_t bucket_elems)
      : dp_(dp), tp_(tp), clock_(clock), zero_(zero), sp_(sequence_parallel), bucket_elems_(bucket_elems),
        in_flight_(dp, clock) {
    TORCH_CHECK(zero.shards_optimizer && dp.size() > 1,
                "sharded_optimizer: a ZeRO stage that shards, over several replicas");
    if (zero.shards_params) units_ = std::make_unique<UnitGathers>(dp, clock);
  }

  Shard add_chunk(ModelChunk& model, bool tied_copy) override;
  void begin_step() override;
  void begin_backward(int chunk, bool last) override {
    // ZeRO 2/3 reduce after every backward; ZeRO 1 once, during the last.
    if (chunks_[chunk].buckets) chunks_[chunk].buckets->arm(last || zero_.reduce_each_micro_batch);
  }
  void end_backward(int chunk) override;
  void reduce(int chunk) override;
  void finish(bool) override { in_flight_.drain(); }
  void after_update() override;
  SyncPeaks peaks() const override { return {units_ ? units_->gathered_peak() : 0.0, in_flight_.buffers_peak()}; }

 private:
  struct Chunk {
    ModelChunk* model = nullptr;
    int64_t offset = 0, length = 0;  // this rank's shard of the flat layout
    at::Tensor master, grad;
    std::unique_ptr<Buckets> buckets;  // null: reduced in one go in reduce()
    int tied_param = -1;  // ZeRO 2/3: a tied copy's parameter, reduced after its twin's sum (no bucket)
  };
  void add_buckets(Chunk& c, bool tied_copy);
  void launch_bucket(Chunk& c, const Buckets::Range& r);
  void reduce_to_owners(Chunk& c, int64_t begin, const at::Tensor& data, bool temporary);
  void reduce_tied_param(Chunk& c);
  void sum_tp_partial_shard(Chunk& c);

  Comm& dp_;
  Comm& tp_;
  PhaseClock& clock_;
  ZeroPolicy zero_;
  bool sp_;
  int64_t bucket_elems_;
  InFlight in_flight_;
  std::unique_ptr<UnitGathers> units_;  // ZeRO 3
  std::deque<Chunk> chunks_;  // stable addresses: the bucket callbacks point at them
};

Shard ShardedOptimizer::add_chunk(ModelChunk& model, bool tied_copy) {
  Chunk& c = chunks_.emplace_back();
  c.model = &model;
  c.length = model.numel() / dp_.size();
  c.offset = c.length * dp_.index();
  // ZeRO 3 keeps its own fp32 copy of the shard; ZeRO 1/2 update their slice of the flat buffer.
  c.master = units_ ? units_->add_chunk(model, c.offset, c.length) : model.flat().narrow(0, c.offset, c.length);
  // ZeRO 1: the owner's part of the flat gradient, reduced in place; ZeRO 2/3: the shard's own fp32
  // gradient (the model has no full-size gradient buffer).
  TORCH_CHECK(zero_.shards_grads != model.flat_grad().defined(),
              "sharded_optimizer: the model has a gradient buffer exactly when the gradients are not sharded");
  c.grad = zero_.shards_grads ? at::zeros({c.length}, c.master.options())
                              : model.flat_grad().narrow(0, c.offset, c.length);
  add_buckets(c, tied_copy);
  Shard s;
  s.offset = c.offset;
  s.master = c.master;
  s.grad = c.grad;
  return s;
}

void ShardedOptimizer::add_buckets(Chunk& c, bool tied_copy) {
  auto& params = c.model->params();
  if (zero_.reduce_each_micro_batch) {
    // Every parameter is bucketed, except a tied copy's, whose gradient is summed with its twin's
    // after the schedule before it is reduced to its owners.
    if (tied_copy)
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].name == "embed.wte") c.tied_param = static_cast<int>(i);
  } else if (sp_ || tied_copy) {
    // Once a step: not with sequence parallelism (the TP-replicated gradients are summed over TP
    // first) or for a tied copy (summed with its twin first): one reduction per chunk then.
    return;
  }
  Chunk* cp = &c;
  c.buckets = std::make_unique<Buckets>(params, bucket_elems_, c.tied_param,
                                        [this, cp](const Buckets::Range& r) { launch_bucket(*cp, r); });
}

void ShardedOptimizer::launch_bucket(Chunk& c, const Buckets::Range& r) {
  const int64_t len = r.end - r.begin;
  if (!zero_.reduce_each_micro_batch) {  // in place, in the flat gradient
    reduce_to_owners(c, r.begin, c.model->flat_grad().narrow(0, r.begin, len), false);
    return;
  }
  // Copy the bucket's fresh gradients into one buffer and release them.
  in_flight_.reserve_buffer();
  auto& params = c.model->params();
  at::Tensor buf = at::empty({len}, c.master.options());
  for (int i = r.first; i < r.first + r.params; ++i) {
    at::Tensor& g = params[i].param.mutable_grad();
    at::Tensor dst = buf.narrow(0, params[i].offset - r.begin, params[i].numel);
    if (g.defined())
      dst.copy_(g.reshape({-1}));
    else
      dst.zero_();  // no gradient reached it in this backward
    g = at::Tensor();
  }
  reduce_to_owners(c, r.begin, buf, true);
}

// Sums `data`, the gradients of flat elements [begin, begin + numel), over the replicas, each
// part into the replica whose shard holds it. `temporary`: data is a bucket buffer; the owner's
// part is then added to its shard gradient and the buffer released. Else data is the flat
// gradient itself, whose owner's part the shard gradient views (ZeRO 1).
void ShardedOptimizer::reduce_to_owners(Chunk& c, int64_t begin, const at::Tensor& data, bool temporary) {
  const int64_t end = begin + data.numel();
  const int first = static_cast<int>(begin / c.length), last = static_cast<int>((end - 1) / c.length);
  for (int r = first; r <= last && r < dp_.size(); ++r) {
    const int64_t b = std::max(begin, c.length * r), e = std::min(end, c.length * (r + 1));
    at::Tensor piece = data.narrow(0, b - begin, e - b);
    auto w = dp_.reduce_async(piece, r);
    std::function<void()> then;
    if (temporary && r == dp_.index()) {
      Chunk* cp = &c;
      then = [cp, piece, b] { cp->grad.narrow(0, b - cp->offset, piece.numel()).add_(piece); };
    }
    in_flight_.push(w, temporary && r == last ? data : at::Tensor(), std::move(then));
  }
}

void ShardedOptimizer::begin_step() {
  for (Chunk& c : chunks_) {
    if (zero_.shards_grads) {
      c.grad.zero_();
      for (auto& p : c.model->params()) p.param.mutable_grad() = at::Tensor();
    } else {
      c.model->flat_grad().zero_();
    }
    if (units_) units_->release_all(*c.model);  // parameters change in the update: gathered units are stale
    if (c.buckets) c.buckets->reset();
  }
}

void ShardedOptimizer::end_backward(int chunk) {
  if (!zero_.reduce_each_micro_batch) return;
  Chunk& c = chunks_[chunk];
  if (c.buckets) {
    PhaseScope sc(clock_, Ph::dp_comm);
    c.buckets->launch_rest();
    c.buckets->reset();
  }
  // ZeRO 3: the backward hooks have freed every unit; a unit whose hook did not run (no gradient
  // reached it) goes here.
  if (units_) units_->release_all(*c.model);
}

void ShardedOptimizer::reduce(int chunk) {
  Chunk& c = chunks_[chunk];
  if (sp_ && zero_.shards_grads)
    sum_tp_partial_shard(c);  // on the shard, after the DP reduction
  else if (sp_)
    sum_over_tp(c.model->tp_partial_grads(), tp_);  // on the whole gradient, before it
  PhaseScope sc(clock_, Ph::dp_comm);
  if (c.tied_param >= 0) reduce_tied_param(c);
  if (zero_.reduce_each_micro_batch) return;  // every bucket went after its backward
  if (c.buckets)  // overlapped: start whatever the backward hooks have not started
    c.buckets->launch_rest();
  else
    reduce_to_owners(c, 0, c.model->flat_grad(), false);
}

void ShardedOptimizer::reduce_tied_param(Chunk& c) {
  ParamInfo& p = c.model->params()[c.tied_param];
  at::Tensor& g = p.param.mutable_grad();
  at::Tensor flat = g.reshape({-1}).to(c.master.scalar_type()).contiguous();  // 16-bit units: reduced in fp32
  g = at::Tensor();
  in_flight_.reserve_buffer();
  reduce_to_owners(c, p.offset, flat, true);
}

// Sequence parallelism, ZeRO 2/3: the TP-replicated parameters' gradients (each TP rank saw only
// its sequence slice) summed over the TP group on the shard, after the DP reduction. Sums commute,
// and TP peers hold the same flat layout and the same DP index, so their shards line up.
void ShardedOptimizer::sum_tp_partial_shard(Chunk& c) {
  in_flight_.drain();
  const int64_t lo = c.offset, hi = c.offset + c.length;
  std::vector<at::Tensor> parts;
  for (const ParamInfo& p : c.model->params()) {
    if (p.shard_dim >= 0) continue;
    const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (b < e) parts.push_back(c.grad.narrow(0, b - lo, e - b));
  }
  sum_over_tp(std::move(parts), tp_);
}

void ShardedOptimizer::after_update() {
  if (!zero_.gather_params_after_step) return;
  for (Chunk& c : chunks_) {
    const auto t0 = SyncClock::now();
    at::Tensor mine = c.master.clone();
    auto w = dp_.all_gather_flat_async(c.model->flat(), mine);
    dp_.wait(w, Ph::dp_comm);
    clock_.dp_in_flight += seconds_since(t0);
  }
}

}  // namespace

std::unique_ptr<GradSync> sharded_optimizer(Comm& dp, Comm& tp, PhaseClock& clock, ZeroPolicy zero,
                                            bool sequence_parallel, int64_t bucket_elems) {
  return std::make_unique<ShardedOptimizer>(dp, tp, clock, zero, sequence_parallel, bucket_elems);
}

}  // namespace trainplan::exec
