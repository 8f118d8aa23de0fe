// DP/ZeRO gradient reduction and the AdamW step over this rank's shard (see reducer.hpp).
#include "exec/reducer.hpp"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>

namespace trainplan::exec {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Elements per gradient bucket: 16 MiB in fp32.
constexpr int64_t kBucket = int64_t(1) << 22;

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
  int params = 0;              // parameters whose gradients lie in it
  int ready = 0;               // of those, accumulated in the chunk's last backward so far
};

// One model chunk's shard and optimizer state (ZeRO-sharded over DP when zero >= 1).
struct DpReducer::Chunk {
  ModelChunk* model = nullptr;
  bool tied_copy = false;
  int64_t shard = 0, shard_offset = 0;  // this DP rank's slice of the flat buffers
  at::Tensor master;      // parameters the optimizer updates (full, a slice view, or a ZeRO-3 copy)
  at::Tensor grad;        // gradients it reads (full, or the reduce-scattered slice)
  at::Tensor exp_avg, exp_avg_sq, decay;
  bool gathered = false;  // ZeRO-3: full parameters present for this step
  // Overlap (ZeRO 0, DP > 1): buckets in the order the backward produces them (last layers
  // first); during the chunk's last backward each bucket's all-reduce starts as soon as its
  // gradients are complete, in bucket order on every replica.
  std::vector<Bucket> buckets;
  bool armed = false;
  size_t next_bucket = 0;
};

struct DpReducer::Pending {
  c10::intrusive_ptr<c10d::Work> work;
  Clock::time_point launched;
  std::shared_ptr<std::atomic<double>> done_after;  // seconds from launch to completion
};

DpReducer::DpReducer(const Strategy& s, int dp_rank, Groups& groups, PhaseClock& clock, AdamWSettings adam)
    : s_(s), dp_rank_(dp_rank), g_(groups), clock_(clock), adam_(adam) {}

DpReducer::~DpReducer() = default;

void DpReducer::add_chunk(ModelChunk& model, bool tied_copy) {
  auto owned = std::make_unique<Chunk>();
  Chunk& cs = *owned;
  cs.model = &model;
  cs.tied_copy = tied_copy;
  at::Tensor& flat = model.flat();
  const int64_t n = flat.numel();
  if (s_.zero == 0) {
    cs.shard = n;
    cs.master = flat;
    cs.grad = model.flat_grad();
    cs.decay = model.decay_mask();
  } else {
    cs.shard = n / s_.dp;
    cs.shard_offset = cs.shard * dp_rank_;
    // ZeRO-3 keeps its own copy of the shard (the flat buffer is refilled by all-gathers);
    // ZeRO-1/2 update their slice of the flat buffer in place. With one replica: in place.
    cs.master = s_.zero == 3 && s_.dp > 1 ? flat.narrow(0, cs.shard_offset, cs.shard).clone()
                                          : flat.narrow(0, cs.shard_offset, cs.shard);
    cs.grad = at::zeros({cs.shard}, flat.options());
    cs.decay = model.decay_mask().narrow(0, cs.shard_offset, cs.shard);
  }
  cs.exp_avg = at::zeros({cs.shard}, flat.options());
  cs.exp_avg_sq = at::zeros({cs.shard}, flat.options());
  chunks_.push_back(std::move(owned));
  setup_buckets(cs);
}

void DpReducer::setup_buckets(Chunk& c) {
  // Not with ZeRO (one reduce-scatter per chunk), sequence parallelism (TP-replicated gradients
  // are summed over TP first) or a tied-embedding copy (summed with its twin first).
  if (s_.zero != 0 || s_.dp == 1 || (s_.sequence_parallel && s_.tp > 1) || c.tied_copy) return;
  auto& params = c.model->params();
  std::vector<int> bucket_of(params.size());
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const ParamInfo& p = params[i];
    if (c.buckets.empty() || c.buckets.back().end - c.buckets.back().begin >= kBucket) {
      Bucket b;
      b.end = p.offset + p.numel;
      c.buckets.push_back(b);
    }
    c.buckets.back().begin = p.offset;
    c.buckets.back().params += 1;
    bucket_of[i] = static_cast<int>(c.buckets.size()) - 1;
  }
  for (size_t i = 0; i < params.size(); ++i) {
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

void DpReducer::push_pending(c10::intrusive_ptr<c10d::Work> w) {
  Pending p;
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

void DpReducer::launch_ready_buckets(Chunk& c, bool all) {
  while (c.next_bucket < c.buckets.size()) {
    Bucket& b = c.buckets[c.next_bucket];
    if (!all && b.ready < b.params) return;
    at::Tensor slice = c.model->flat_grad().narrow(0, b.begin, b.end - b.begin);
    push_pending(g_.dp->all_reduce_async(slice));
    ++c.next_bucket;
  }
}

void DpReducer::begin_step() {
  for (auto& c : chunks_) {
    c->model->flat_grad().zero_();
    c->gathered = false;
    c->armed = false;
    c->next_bucket = 0;
    for (auto& b : c->buckets) b.ready = 0;
  }
}

void DpReducer::before_use(int chunk) { gather(*chunks_[chunk]); }

void DpReducer::set_last_backward(int chunk, bool last) {
  Chunk& c = *chunks_[chunk];
  c.armed = last && !c.buckets.empty();
}

void DpReducer::gather(Chunk& c) {
  // Parameters do not change within a step, so the chunk is gathered at its first slot and kept
  // until the optimizer (re-gathering would also bump the version of tensors autograd saved).
  if (s_.zero != 3 || s_.dp == 1 || c.gathered) return;
  c.gathered = true;
  const auto t0 = Clock::now();
  auto w = g_.dp->all_gather_flat_async(c.model->flat(), c.master);
  g_.dp->wait(w, Ph::dp_comm);
  clock_.dp_in_flight += seconds_since(t0);
}

void DpReducer::gather_all() {
  for (auto& c : chunks_) {
    c->gathered = false;
    gather(*c);
  }
}

void DpReducer::launch(Chunk& c) {
  if (s_.dp == 1) {
    if (s_.zero >= 1) c.grad.copy_(c.model->flat_grad());
    return;
  }
  PhaseScope sc(clock_, Ph::dp_comm);
  if (!c.buckets.empty()) {  // overlapped: start whatever the backward hooks have not started
    c.armed = false;
    launch_ready_buckets(c, true);
    return;
  }
  // ZeRO 0 without overlap: all-reduce in buckets; ZeRO >= 1: one reduce-scatter of the
  // chunk's flat gradient into this rank's shard.
  at::Tensor& full = c.model->flat_grad();
  const int64_t n = full.numel();
  if (s_.zero >= 1) {
    push_pending(g_.dp->reduce_scatter_flat_async(c.grad, full));
    return;
  }
  for (int64_t off = 0; off < n; off += kBucket) {
    at::Tensor bucket = full.narrow(0, off, std::min(kBucket, n - off));
    push_pending(g_.dp->all_reduce_async(bucket));
  }
}

void DpReducer::backward_done(int chunk) {
  Chunk& c = *chunks_[chunk];
  // Sequence parallelism: TP-replicated parameters saw only this rank's sequence slice.
  if (s_.sequence_parallel && s_.tp > 1) {
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
  torch::NoGradGuard ng;
  ++adam_step_;
  const double b1 = adam_.beta1, b2 = adam_.beta2, eps = adam_.eps, wd = adam_.weight_decay, lr = adam_.lr;
  const double bc1 = 1 - std::pow(b1, adam_step_), bc2 = 1 - std::pow(b2, adam_step_);
  for (auto& cp : chunks_) {
    Chunk& c = *cp;
    c.exp_avg.mul_(b1).add_(c.grad, 1 - b1);
    c.exp_avg_sq.mul_(b2).addcmul_(c.grad, c.grad, 1 - b2);
    c.master.sub_(c.master * c.decay * (lr * wd));
    auto denom = (c.exp_avg_sq / bc2).sqrt_().add_(eps);
    c.master.addcdiv_(c.exp_avg, denom, -lr / bc1);
  }
}

void DpReducer::finish_step() {
  for (auto& p : pending_) {
    g_.dp->wait(p.work, Ph::dp_comm);
    const double d = p.done_after->load();
    clock_.dp_in_flight += d >= 0 ? d : seconds_since(p.launched);
  }
  pending_.clear();
  optimizer_step();
  if ((s_.zero == 1 || s_.zero == 2) && s_.dp > 1) {
    for (auto& c : chunks_) {
      const auto tg = Clock::now();
      at::Tensor mine = c->master.clone();
      auto w = g_.dp->all_gather_flat_async(c->model->flat(), mine);
      g_.dp->wait(w, Ph::dp_comm);
      clock_.dp_in_flight += seconds_since(tg);
    }
  }
}

}  // namespace trainplan::exec
