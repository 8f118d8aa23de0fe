// DP/ZeRO gradient reduction and the AdamW step over this rank's shard (see reducer.hpp).
#include "exec/reducer.hpp"

#include "exec/compression.hpp"

#include <ATen/ops/_fused_adamw.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace trainplan::exec {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// ZeRO-2/3: bucket buffers that may be in flight at once; launching one more first completes the
// oldest, so the reduction never holds more than this many buckets of gradients.
constexpr int kMaxBucketsInFlight = 2;

// Runs `fn` after autograd has accumulated a parameter's gradient into .grad.
struct AfterAccumulate : torch::autograd::PostAccumulateGradHook {
  explicit AfterAccumulate(std::function<void()> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
  std::function<void()> fn;
};

}  // namespace

// A contiguous range of a chunk's flat gradient, all-reduced over DP as one message.
struct DpReducer::Bucket {
  int64_t begin = 0, end = 0;  // element range in the flat gradient
  int first = 0, params = 0;   // its parameters: indices [first, first + params)
  int ready = 0;               // of those, accumulated in the current backward so far
};

// One model chunk's shard and optimizer state (ZeRO-sharded over DP when zero >= 1).
struct DpReducer::Chunk {
  ModelChunk* model = nullptr;
  bool tied_copy = false;
  int compressed = -1;    // the chunk's index in the compressor, -1 when uncompressed
  int64_t shard = 0, shard_offset = 0;  // this DP rank's slice of the flat buffers
  at::Tensor master;      // parameters the optimizer updates (full, a slice view, or a ZeRO-3 copy)
  at::Tensor grad;        // gradients it reads (full, or the reduce-scattered slice)
  at::Tensor exp_avg, exp_avg_sq;
  // ZeRO-3: per unit of the model, the owners' broadcasts in flight that bring its parameters.
  struct Gather {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    Clock::time_point launched;
  };
  std::vector<Gather> gathers;
  // Overlap (ZeRO 0, DP > 1): buckets in the order the backward produces them (last layers
  // first); during the chunk's last backward each bucket's all-reduce starts as soon as its
  // gradients are complete, in bucket order on every replica.
  std::vector<Bucket> buckets;
  bool armed = false;
  size_t next_bucket = 0;
  int tied_param = -1;  // ZeRO-2/3: the tied copy's parameter, reduced after its twin's sum (no bucket)
};

// The optimizer's view of the shards: per parameter (or the part of it in the shard), 1-D views
// of master weights, gradients and both moments, in two groups (with and without weight decay)
// that at::_fused_adamw_ updates in one multi-tensor launch each.
struct ShardAdamW::Group {
  double weight_decay = 0;
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
};

ShardAdamW::ShardAdamW(AdamWSettings a) : adam_(a) {}
ShardAdamW::~ShardAdamW() = default;

void ShardAdamW::add(const std::vector<ParamInfo>& params, int64_t lo, const at::Tensor& master,
                     const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  if (groups_.empty()) {
    groups_.resize(2);
    groups_[0].weight_decay = adam_.weight_decay;  // matrices
    groups_[1].weight_decay = 0;                   // vectors (norms, biases)
    // The step count the fused kernel reads (fp32, on the parameters' device), incremented on
    // the device before each update as torch.optim.AdamW(fused=True) does.
    step_ = at::zeros({}, master.options().dtype(at::kFloat));
  }
  // Intersect each parameter's element range with the shard; the padding at the end of the flat
  // buffer belongs to no parameter and stays zero.
  const int64_t hi = lo + master.numel();
  for (const ParamInfo& p : params) {
    const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (b >= e) continue;
    Group& g = groups_[p.decay ? 0 : 1];
    g.params.push_back(master.narrow(0, b - lo, e - b));
    g.grads.push_back(grad.narrow(0, b - lo, e - b));
    g.exp_avgs.push_back(exp_avg.narrow(0, b - lo, e - b));
    g.exp_avg_sqs.push_back(exp_avg_sq.narrow(0, b - lo, e - b));
    g.steps.push_back(step_);
  }
}

void ShardAdamW::step() {
  // AdamW (Loshchilov & Hutter 2019, Algorithm 2) by LibTorch's fused multi-tensor kernel, on
  // CUDA and CPU alike: p <- p (1 - lr wd); m <- b1 m + (1 - b1) g; v <- b2 v + (1 - b2) g^2;
  // p <- p - lr/(1 - b1^t) * m / (sqrt(v)/sqrt(1 - b2^t) + eps). No temporaries the size of the
  // parameters, no host synchronisation (the step count lives on the device).
  torch::NoGradGuard ng;
  if (groups_.empty()) return;
  step_.add_(1);
  for (Group& g : groups_) {
    if (g.params.empty()) continue;
    at::_fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, g.steps, adam_.lr,
                      adam_.beta1, adam_.beta2, g.weight_decay, adam_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

struct DpReducer::Pending {
  c10::intrusive_ptr<c10d::Work> work;
  Clock::time_point launched;
  std::shared_ptr<std::atomic<double>> done_after;  // seconds from launch to completion
  at::Tensor buffer;            // ZeRO-2/3: the bucket buffer, released when the work completes
  std::function<void()> then;   // run once the work has completed (adds this rank's part)
};

DpReducer::DpReducer(const Strategy& s, int dp_rank, Groups& groups, PhaseClock& clock, AdamWSettings adam,
                     LossScaling scaling, double bucket_bytes)
    : s_(s),
      dp_rank_(dp_rank),
      // With parameter servers each worker is its own replica here: its gradients go to the
      // servers (param_server.hpp), not over the DP group.
      replicas_(s.uses_ps() ? 1 : groups.dp->size()),
      g_(groups),
      clock_(clock),
      adam_(adam),
      scaling_(std::move(scaling)),
      bucket_elems_(std::max<int64_t>(1, static_cast<int64_t>(bucket_bytes / 4))) {}

DpReducer::~DpReducer() = default;

void DpReducer::compress_with(std::unique_ptr<GradCompressor> c) {
  TORCH_CHECK(chunks_.empty() && s_.zero == 0, "compress_with: before add_chunk, ZeRO 0 only");
  compressor_ = std::move(c);
}

void DpReducer::add_chunk(ModelChunk& model, bool tied_copy) {
  auto owned = std::make_unique<Chunk>();
  Chunk& cs = *owned;
  cs.model = &model;
  cs.tied_copy = tied_copy;
  const int64_t n = model.numel();
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(model.params().front().param.device());
  if (s_.zero == 0 || replicas_ == 1) {
    at::Tensor& flat = model.flat();
    cs.shard = n;
    cs.master = flat;
    cs.grad = model.flat_grad();
  } else {
    cs.shard = n / replicas_;
    cs.shard_offset = cs.shard * dp_rank_;
    // ZeRO-3 keeps its own fp32 copy of the shard, taken from the model's units (their fp32
    // initial values where the units are 16-bit), whose memory then goes until a unit is needed;
    // ZeRO-1/2 update their slice of the flat buffer in place.
    if (s_.zero == 3) {
      TORCH_CHECK(!model.flat().defined(), "ZeRO-3: the model must keep its parameters in unit buffers");
      torch::NoGradGuard ng;
      cs.master = at::zeros({cs.shard}, opts);  // the padding past the last unit stays zero
      for (ParamUnit& u : model.units()) {
        const int64_t b = std::max(u.begin, cs.shard_offset), e = std::min(u.end, cs.shard_offset + cs.shard);
        const at::Tensor& values = u.initial.defined() ? u.initial : u.buffer;
        if (b < e) cs.master.narrow(0, b - cs.shard_offset, e - b).copy_(values.narrow(0, b - u.begin, e - b));
        u.initial = at::Tensor();
        free_unit_memory(u);
      }
      cs.gathers.resize(model.units().size());
      model.set_gatherer(this);
    } else {
      cs.master = model.flat().narrow(0, cs.shard_offset, cs.shard);
    }
    // ZeRO-1: the owner's part of the flat gradient, reduced in place; ZeRO-2/3: the shard's own
    // fp32 gradient (the model has no full-size gradient buffer).
    TORCH_CHECK(s_.zero == 1 || !model.flat_grad().defined(), "ZeRO-2/3: the model must have no gradient buffer");
    cs.grad = s_.zero == 1 ? model.flat_grad().narrow(0, cs.shard_offset, cs.shard) : at::zeros({cs.shard}, opts);
  }
  // With parameter servers the servers hold the optimizer state; a worker has none.
  const int64_t state = s_.uses_ps() ? 0 : cs.shard;
  cs.exp_avg = at::zeros({state}, opts);
  cs.exp_avg_sq = at::zeros({state}, opts);
  // PowerSGD compresses per matrix of the unfused model (wq, wk, wv apart, as predict counts them).
  if (compressor_ && replicas_ > 1) cs.compressed = compressor_->add_chunk(model.flat_grad(), model.tensors());
  chunks_.push_back(std::move(owned));
  setup_buckets(cs);
  if (!s_.uses_ps()) add_to_adam_groups(cs);
}

void DpReducer::add_to_adam_groups(Chunk& c) {
  adam_.add(c.model->params(), c.shard_offset, c.master, c.grad, c.exp_avg, c.exp_avg_sq);
}

void DpReducer::setup_buckets(Chunk& c) {
  if (replicas_ == 1 || c.compressed >= 0) return;  // compressed: one synchronous reduction (launch)
  auto& params = c.model->params();
  if (sharded_grads()) {
    // ZeRO-2/3: every parameter is bucketed, except a tied copy's, whose gradient is summed with
    // its twin's after the schedule (reduce_tied) before it is reduced to its owners.
    if (c.tied_copy)
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].name == "embed.wte") c.tied_param = static_cast<int>(i);
  } else if ((s_.sequence_parallel && s_.tp > 1) || c.tied_copy) {
    // ZeRO 0/1: not with sequence parallelism (TP-replicated gradients are summed over TP first)
    // or a tied-embedding copy (summed with its twin first): one reduction per chunk then.
    return;
  }
  // Buckets in the order the backward produces gradients (last parameters first).
  std::vector<int> bucket_of(params.size(), -1);
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    if (i == c.tied_param) continue;
    const ParamInfo& p = params[i];
    const bool adjacent = !c.buckets.empty() && c.buckets.back().first == i + 1;
    if (!adjacent || c.buckets.back().end - c.buckets.back().begin >= bucket_elems_) {
      Bucket b;
      b.end = p.offset + p.numel;
      c.buckets.push_back(b);
    }
    c.buckets.back().begin = p.offset;
    c.buckets.back().first = i;
    c.buckets.back().params += 1;
    bucket_of[i] = static_cast<int>(c.buckets.size()) - 1;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (bucket_of[i] < 0) continue;
    Chunk* cp = &c;
    const int b = bucket_of[i];
    torch::autograd::impl::set_post_acc_grad_hooks(
        params[i].param, std::make_unique<AfterAccumulate>([this, cp, b] {
          if (!cp->armed) return;
          cp->buckets[b].ready += 1;
          launch_ready_buckets(*cp, false);
        }));
  }
}

void DpReducer::push_pending(c10::intrusive_ptr<c10d::Work> w, at::Tensor buffer, std::function<void()> then) {
  Pending p;
  p.buffer = std::move(buffer);
  p.then = std::move(then);
  if (p.buffer.defined()) ++buffers_in_flight_;
  p.launched = Clock::now();
  p.done_after = std::make_shared<std::atomic<double>>(-1.0);
  p.work = std::move(w);
  auto done = p.done_after;
  auto launched = p.launched;
  try {  // completion time, where the backend's work has a future (else measured at the wait)
    p.work->getFuture()->addCallback(
        [done, launched](c10::ivalue::Future&) { done->store(seconds_since(launched)); });
  } catch (const c10::Error&) {
  }
  pending_.push_back(std::move(p));
}

void DpReducer::complete_oldest() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  g_.dp->wait(p.work, Ph::dp_comm);
  const double d = p.done_after->load();
  clock_.dp_in_flight += d >= 0 ? d : seconds_since(p.launched);
  if (p.then) p.then();
  if (p.buffer.defined()) {
    --buffers_in_flight_;
    buffer_bytes_ -= static_cast<double>(p.buffer.nbytes());
  }
}

// Sums `data`, the gradients of flat elements [begin, begin + numel), over the DP replicas, each
// part into the replica whose shard holds it: one reduce per owner, rooted at the owner (what a
// reduce-scatter does, for a range that need not split evenly). `temporary`: data is a bucket
// buffer; the owner's part is then added to its shard gradient and the buffer released. Else data
// is the flat gradient itself, whose owner's part the shard gradient views (ZeRO-1).
void DpReducer::reduce_to_owners(Chunk& c, int64_t begin, const at::Tensor& data, bool temporary) {
  const int64_t end = begin + data.numel();
  const int first = static_cast<int>(begin / c.shard), last = static_cast<int>((end - 1) / c.shard);
  for (int r = first; r <= last && r < replicas_; ++r) {
    const int64_t b = std::max(begin, c.shard * r), e = std::min(end, c.shard * (r + 1));
    at::Tensor piece = data.narrow(0, b - begin, e - b);
    auto w = g_.dp->reduce_async(piece, r);
    std::function<void()> then;
    if (temporary && r == dp_rank_) {
      Chunk* cp = &c;
      then = [cp, piece, b] { cp->grad.narrow(0, b - cp->shard_offset, piece.numel()).add_(piece); };
    }
    push_pending(w, temporary && r == last ? data : at::Tensor(), std::move(then));
  }
}

void DpReducer::launch_ready_buckets(Chunk& c, bool all) {
  while (c.next_bucket < c.buckets.size()) {
    Bucket& b = c.buckets[c.next_bucket];
    if (!all && b.ready < b.params) return;
    launch_bucket(c, c.next_bucket);
    ++c.next_bucket;
  }
}

void DpReducer::launch_bucket(Chunk& c, size_t index) {
  const Bucket& b = c.buckets[index];
  const int64_t len = b.end - b.begin;
  if (!sharded_grads()) {
    at::Tensor slice = c.model->flat_grad().narrow(0, b.begin, len);
    if (s_.zero == 0)
      push_pending(g_.dp->all_reduce_async(slice));
    else
      reduce_to_owners(c, b.begin, slice, false);
    return;
  }
  // ZeRO-2/3: copy the bucket's fresh gradients into one buffer and release them.
  while (buffers_in_flight_ >= kMaxBucketsInFlight) complete_oldest();
  auto& params = c.model->params();
  at::Tensor buf = at::empty({len}, c.master.options());
  for (int i = b.first; i < b.first + b.params; ++i) {
    at::Tensor& g = params[i].param.mutable_grad();
    at::Tensor dst = buf.narrow(0, params[i].offset - b.begin, params[i].numel);
    if (g.defined())
      dst.copy_(g.reshape({-1}));
    else
      dst.zero_();  // no gradient reached it in this backward
    g = at::Tensor();
  }
  buffer_bytes_ += static_cast<double>(buf.nbytes());
  buffer_bytes_peak_ = std::max(buffer_bytes_peak_, buffer_bytes_);
  reduce_to_owners(c, b.begin, buf, true);
}

void DpReducer::begin_step() {
  for (auto& c : chunks_) {
    if (c->model->flat_grad().defined()) c->model->flat_grad().zero_();
    if (sharded_grads()) {
      c->grad.zero_();
      for (auto& p : c->model->params()) p.param.mutable_grad() = at::Tensor();
    }
    free_units(*c);  // parameters change in the update: gathered units are stale
    c->armed = false;
    c->next_bucket = 0;
    for (auto& b : c->buckets) b.ready = 0;
  }
}


void DpReducer::set_last_backward(int chunk, bool last) {
  Chunk& c = *chunks_[chunk];
  // ZeRO-2/3 reduce after every backward; ZeRO 0/1 once, after the last.
  c.armed = (last || sharded_grads()) && !c.buckets.empty();
}

void DpReducer::after_backward(int chunk) {
  if (!sharded_grads()) return;
  Chunk& c = *chunks_[chunk];
  {
    PhaseScope sc(clock_, Ph::dp_comm);
    launch_ready_buckets(c, true);
  }
  c.armed = false;
  c.next_bucket = 0;
  for (auto& b : c.buckets) b.ready = 0;
  // ZeRO-3: the backward hooks have freed every unit; a unit whose hook did not run (no gradient
  // reached it) goes here.
  free_units(c);
}

DpReducer::Chunk& DpReducer::chunk_of(const ModelChunk& m) {
  for (auto& c : chunks_)
    if (c->model == &m) return *c;
  TORCH_CHECK(false, "DpReducer: a model chunk that was never added");
}

void DpReducer::start_gather(Chunk& c, int unit) {
  ParamUnit& u = c.model->units()[unit];
  Chunk::Gather& g = c.gathers[unit];
  if (unit_present(u) || !g.works.empty()) return;  // present, or on its way
  torch::NoGradGuard ng;
  at::Tensor dst = alloc_unit_memory(u);
  const double bytes = static_cast<double>(u.buffer.storage().nbytes());
  gathered_bytes_ += bytes;
  gathered_peak_ = std::max(gathered_peak_, gathered_bytes_);
  // The unit's elements [begin, end) of the flat layout lie in the shards of one or more
  // replicas: each owner broadcasts its part (an all-gather over uneven ranges), in the unit's
  // dtype: under mixed precision each owner casts its fp32 part to the 16-bit compute dtype once
  // per gather and sends that (FSDP's MixedPrecision(param_dtype)), so the gathered unit holds
  // 2 B per parameter (memory_model's zero3_gathered_bytes).
  g.launched = Clock::now();
  const int first = static_cast<int>(u.begin / c.shard), last = static_cast<int>((u.end - 1) / c.shard);
  for (int r = first; r <= last && r < replicas_; ++r) {
    const int64_t b = std::max(u.begin, c.shard * r), e = std::min(u.end, c.shard * (r + 1));
    at::Tensor piece = dst.narrow(0, b - u.begin, e - b);
    if (r == dp_rank_) piece.copy_(c.master.narrow(0, b - c.shard_offset, e - b));
    g.works.push_back(g_.dp->broadcast_async(piece, r));
  }
}

void DpReducer::finish_gather(Chunk& c, int unit) {
  Chunk::Gather& g = c.gathers[unit];
  if (g.works.empty()) return;
  for (auto& w : g.works) g_.dp->wait(w, Ph::dp_comm);
  g.works.clear();
  clock_.dp_in_flight += seconds_since(g.launched);
}

void DpReducer::need(ModelChunk& chunk, int unit, int prefetch) {
  Chunk& c = chunk_of(chunk);
  start_gather(c, unit);
  if (prefetch >= 0) start_gather(c, prefetch);  // overlaps this unit's compute
  finish_gather(c, unit);
}

void DpReducer::release(ModelChunk& chunk, int unit) {
  Chunk& c = chunk_of(chunk);
  ParamUnit& u = c.model->units()[unit];
  finish_gather(c, unit);  // never free memory a broadcast still writes
  if (!unit_present(u) || u.end == u.begin) return;
  gathered_bytes_ -= static_cast<double>(u.buffer.storage().nbytes());
  free_unit_memory(u);
}

void DpReducer::free_units(Chunk& c) {
  for (size_t u = 0; u < c.gathers.size(); ++u) release(*c.model, static_cast<int>(u));
}

at::Tensor DpReducer::parameters(int chunk) {
  Chunk& c = *chunks_[chunk];
  if (!unit_gathers()) return c.model->flat();
  // ZeRO-3: the fp32 master shards, all-gathered (the units may hold 16-bit copies).
  at::Tensor full = at::empty({c.model->numel()}, c.master.options());
  auto w = g_.dp->all_gather_flat_async(full, c.master);
  g_.dp->wait(w, Ph::other);
  return full;
}

void DpReducer::launch(Chunk& c) {
  // The chunk's gradients are complete (its last backward has run, and a tied copy's sum is
  // done): reduce what the backward hooks have not.
  if (replicas_ == 1) return;  // the shard gradient is the flat gradient
  PhaseScope sc(clock_, Ph::dp_comm);
  if (sharded_grads()) {  // every bucket went after its backward; only the tied copy is left
    if (c.tied_param < 0) return;
    ParamInfo& p = c.model->params()[c.tied_param];
    at::Tensor& g = p.param.mutable_grad();
    at::Tensor flat = g.reshape({-1}).to(c.master.scalar_type()).contiguous();  // 16-bit units: reduced in fp32
    g = at::Tensor();
    while (buffers_in_flight_ >= kMaxBucketsInFlight) complete_oldest();
    buffer_bytes_ += static_cast<double>(flat.nbytes());
    buffer_bytes_peak_ = std::max(buffer_bytes_peak_, buffer_bytes_);
    reduce_to_owners(c, p.offset, flat, true);
    return;
  }
  if (c.compressed >= 0) {  // compressed: synchronous (the compression needs each sum in turn)
    const auto t0 = Clock::now();
    compressor_->reduce(c.compressed, *g_.dp);
    clock_.dp_in_flight += seconds_since(t0);
    return;
  }
  if (!c.buckets.empty()) {  // overlapped: start whatever the backward hooks have not started
    c.armed = false;
    launch_ready_buckets(c, true);
    return;
  }
  // Without overlap: ZeRO 0 all-reduces the flat gradient in buckets; ZeRO 1 reduces it into
  // the owners' shards.
  at::Tensor& full = c.model->flat_grad();
  const int64_t n = full.numel();
  if (s_.zero >= 1) {
    reduce_to_owners(c, 0, full, false);
    return;
  }
  for (int64_t off = 0; off < n; off += bucket_elems_) {
    at::Tensor bucket = full.narrow(0, off, std::min(bucket_elems_, n - off));
    push_pending(g_.dp->all_reduce_async(bucket));
  }
}

// Sequence parallelism, ZeRO-2/3: the TP-replicated parameters' gradients (each TP rank saw only
// its sequence slice) summed over the TP group on the shard, after the DP reduction. Sums commute,
// and TP peers hold the same flat layout and the same DP index, so their shards line up.
void DpReducer::sum_tp_partial_shard(Chunk& c) {
  while (!pending_.empty()) complete_oldest();
  const int64_t lo = c.shard_offset, hi = c.shard_offset + c.shard;
  std::vector<at::Tensor> parts;
  for (const ParamInfo& p : c.model->params()) {
    if (p.shard_dim >= 0) continue;
    const int64_t b = std::max(lo, p.offset), e = std::min(hi, p.offset + p.numel);
    if (b < e) parts.push_back(c.grad.narrow(0, b - lo, e - b));
  }
  if (parts.empty()) return;
  at::Tensor buf = at::cat(parts);
  g_.tp->all_reduce(buf);
  int64_t off = 0;
  for (auto& p : parts) {
    p.copy_(buf.narrow(0, off, p.numel()));
    off += p.numel();
  }
}

void DpReducer::backward_done(int chunk) {
  Chunk& c = *chunks_[chunk];
  // Sequence parallelism: TP-replicated parameters saw only this rank's sequence slice.
  if (s_.sequence_parallel && s_.tp > 1 && sharded_grads()) {
    sum_tp_partial_shard(c);
  } else if (s_.sequence_parallel && s_.tp > 1) {
    auto parts = c.model->tp_partial_grads();
    if (!parts.empty()) {
      std::vector<at::Tensor> flat_parts;
      for (auto& p : parts) flat_parts.push_back(p.reshape({-1}));
      at::Tensor buf = at::cat(flat_parts);
      g_.tp->all_reduce(buf);
      int64_t off = 0;
      torch::NoGradGuard ng;
      for (auto& p : parts) {
        p.copy_(buf.narrow(0, off, p.numel()).view(p.sizes()));
        off += p.numel();
      }
    }
  }
  if (!c.tied_copy) launch(c);  // tied copies are summed with their twin after the schedule
}

void DpReducer::reduce_tied() {
  // Tied word embedding: sum the gradients of the first and last stages' copies.
  for (auto& c : chunks_) {
    if (!c->tied_copy) continue;
    at::Tensor g = c->model->tied_embedding_grad();
    g_.embed->all_reduce(g);
    launch(*c);
  }
}

void DpReducer::optimizer_step() {
  PhaseScope sc(clock_, Ph::optimizer);
  adam_.step();
}

void DpReducer::finish_reduction() {
  while (!pending_.empty()) complete_oldest();
}

at::Tensor DpReducer::reduced_grad(int chunk) {
  Chunk& c = *chunks_[chunk];
  at::Tensor full;
  if (s_.zero == 0 || replicas_ == 1) {
    full = c.grad;
  } else {
    full = at::empty({c.model->numel()}, c.grad.options());
    auto w = g_.dp->all_gather_flat_async(full, c.grad);
    g_.dp->wait(w, Ph::other);
  }
  return full / loss_scale();  // unscaled, as update() hands it to AdamW
}

void DpReducer::update(int step) {
  if (poisoned_chunk_ >= 0) {  // test fault, written here: no reduction is in flight on the buffer
    torch::NoGradGuard ng;
    chunks_[poisoned_chunk_]->grad.narrow(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
    poisoned_chunk_ = -1;
  }
  if (scaling_.enabled) {
    PhaseScope sc(clock_, Ph::optimizer);
    torch::NoGradGuard ng;
    // Any inf/NaN on any rank skips the step everywhere (TP and PP ranks hold different parts).
    at::Tensor bad = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(chunks_.front()->grad.device()));
    for (auto& c : chunks_) bad.add_(c->grad.isfinite().logical_not().any().to(at::kFloat));
    g_.world->all_reduce(bad, c10d::ReduceOp::MAX);
    if (bad.item<float>() > 0) {
      scaling_.skipped.push_back(step);
      scaling_.scale *= scaling_.backoff;
      scaling_.good_steps = 0;
      return;  // parameters unchanged: nothing to all-gather either
    }
    for (auto& c : chunks_) c->grad.mul_(1.0 / scaling_.scale);
    if (++scaling_.good_steps == scaling_.growth_interval) {
      scaling_.scale *= scaling_.growth;
      scaling_.good_steps = 0;
    }
  }
  optimizer_step();
  if ((s_.zero == 1 || s_.zero == 2) && replicas_ > 1) {
    for (auto& c : chunks_) {
      const auto tg = Clock::now();
      at::Tensor mine = c->master.clone();
      auto w = g_.dp->all_gather_flat_async(c->model->flat(), mine);
      g_.dp->wait(w, Ph::dp_comm);
      clock_.dp_in_flight += seconds_since(tg);
    }
  }
}

void DpReducer::poison_gradient(int chunk) { poisoned_chunk_ = chunk; }

DpReducer::HeldBytes DpReducer::held_bytes() const {
  HeldBytes h;
  std::vector<const void*> seen;  // storages counted so far: views of one buffer count once
  auto add = [&seen](double& to, const at::Tensor& t) {
    if (!t.defined()) return;
    const void* key = t.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) return;
    seen.push_back(key);
    to += static_cast<double>(t.storage().nbytes());
  };
  for (const auto& c : chunks_) {
    add(h.weights, c->master);
    add(h.gradients, c->model->flat_grad());
    add(h.gradients, c->grad);
    add(h.optimizer, c->exp_avg);
    add(h.optimizer, c->exp_avg_sq);
  }
  h.buffers_peak = buffer_bytes_peak_;
  h.gathered = gathered_peak_;
  return h;
}

}  // namespace trainplan::exec
