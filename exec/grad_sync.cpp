// What the data-parallel schemes share (see grad_sync.hpp): the reductions in flight, gradient
// buckets and their hooks, and sequence parallelism's sum over TP.
#include "exec/grad_sync.hpp"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

namespace trainplan::exec {

namespace {

// Runs `fn` after autograd has accumulated a parameter's gradient into .grad.
struct AfterAccumulate : torch::autograd::PostAccumulateGradHook {
  explicit AfterAccumulate(std::function<void()> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
  std::function<void()> fn;
};

}  // namespace

void InFlight::push(c10::intrusive_ptr<c10d::Work> w, at::Tensor buffer, std::function<void()> then) {
  Pending p;
  p.buffer = std::move(buffer);
  p.then = std::move(then);
  if (p.buffer.defined()) {
    ++buffers_;
    buffer_bytes_ += static_cast<double>(p.buffer.nbytes());
    buffer_bytes_peak_ = std::max(buffer_bytes_peak_, buffer_bytes_);
  }
  p.launched = SyncClock::now();
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

void InFlight::complete_oldest() {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  dp_.wait(p.work, Ph::dp_comm);
  const double d = p.done_after->load();
  clock_.dp_in_flight += d >= 0 ? d : seconds_since(p.launched);
  if (p.then) p.then();
  if (p.buffer.defined()) {
    --buffers_;
    buffer_bytes_ -= static_cast<double>(p.buffer.nbytes());
  }
}

void InFlight::reserve_buffer() {
  while (buffers_ >= kMaxBuffers) complete_oldest();
}

void InFlight::drain() {
  while (!pending_.empty()) complete_oldest();
}

Buckets::Buckets(std::vector<ParamInfo>& params, int64_t elems, int skip, std::function<void(const Range&)> launch)
    : launch_(std::move(launch)) {
  std::vector<int> bucket_of(params.size(), -1);
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    if (i == skip) continue;
    const ParamInfo& p = params[i];
    const bool adjacent = !ranges_.empty() && ranges_.back().first == i + 1;
    if (!adjacent || ranges_.back().end - ranges_.back().begin >= elems) {
      Range r;
      r.end = p.offset + p.numel;
      ranges_.push_back(r);
    }
    ranges_.back().begin = p.offset;
    ranges_.back().first = i;
    ranges_.back().params += 1;
    bucket_of[i] = static_cast<int>(ranges_.size()) - 1;
  }
  ready_.assign(ranges_.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    if (bucket_of[i] < 0) continue;
    const int b = bucket_of[i];
    torch::autograd::impl::set_post_acc_grad_hooks(params[i].param,
                                                   std::make_unique<AfterAccumulate>([this, b] { accumulated(b); }));
  }
}

void Buckets::accumulated(int bucket) {
  if (!armed_) return;
  ready_[bucket] += 1;
  while (next_ < ranges_.size() && ready_[next_] >= ranges_[next_].params) launch_(ranges_[next_++]);
}

void Buckets::launch_rest() {
  armed_ = false;
  while (next_ < ranges_.size()) launch_(ranges_[next_++]);
}

void Buckets::reset() {
  armed_ = false;
  next_ = 0;
  std::fill(ready_.begin(), ready_.end(), 0);
}

void sum_over_tp(std::vector<at::Tensor> parts, Comm& tp) {
  if (parts.empty()) return;
  torch::NoGradGuard ng;
  std::vector<at::Tensor> flat;
  for (const auto& p : parts) flat.push_back(p.reshape({-1}));
  at::Tensor buf = at::cat(flat);
  tp.all_reduce(buf);
  int64_t off = 0;
  for (auto& p : parts) {
    p.copy_(buf.narrow(0, off, p.numel()).view(p.sizes()));
    off += p.numel();
  }
}

}  // namespace trainplan::exec
