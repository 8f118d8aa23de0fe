// The DP side of a rank's step: the scheme's reduction, the AdamW step over this rank's shard (see
// reducer.hpp).
#include "exec/reducer.hpp"

#include <algorithm>

namespace trainplan::exec {

DpReducer::DpReducer(std::unique_ptr<GradSync> sync, Groups& groups, PhaseClock& clock, AdamWSettings adam,
                     LossScaling scaling)
    : sync_(std::move(sync)), g_(groups), clock_(clock), adam_(adam), scaling_(std::move(scaling)) {}

DpReducer::~DpReducer() = default;

void DpReducer::add_chunk(ModelChunk& model, bool tied_copy) {
  Chunk c;
  c.model = &model;
  c.tied_copy = tied_copy;
  c.shard = sync_->add_chunk(model, tied_copy);
  const int64_t state = c.shard.steps_here ? c.shard.master.numel() : 0;
  c.exp_avg = at::zeros({state}, c.shard.master.options());
  c.exp_avg_sq = at::zeros({state}, c.shard.master.options());
  if (c.shard.steps_here)
    adam_.add(model.params(), c.shard.offset, c.shard.master, c.shard.grad, c.exp_avg, c.exp_avg_sq);
  chunks_.push_back(std::move(c));
}

void DpReducer::begin_step() { sync_->begin_step(); }
void DpReducer::begin_backward(int chunk, bool last) { sync_->begin_backward(chunk, last); }
void DpReducer::after_backward(int chunk) { sync_->end_backward(chunk); }

void DpReducer::backward_done(int chunk) {
  if (!chunks_[chunk].tied_copy) sync_->reduce(chunk);  // tied copies are summed with their twin first
}

void DpReducer::reduce_tied() {
  // Tied word embedding: sum the gradients of the first and last stages' copies.
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (!chunks_[i].tied_copy) continue;
    at::Tensor g = chunks_[i].model->tied_embedding_grad();
    g_.embed->all_reduce(g);
    sync_->reduce(static_cast<int>(i));
  }
}

void DpReducer::finish_reduction(bool keep_grads) { sync_->finish(keep_grads); }

// A shard that is the whole chunk is returned as is; else the replicas' shards (one length, in
// replica order) are all-gathered over the DP group.
at::Tensor DpReducer::whole(int chunk, const at::Tensor& shard) {
  const int64_t n = chunks_[chunk].model->numel();
  if (shard.numel() == n) return shard;
  at::Tensor full = at::empty({n}, shard.options());
  at::Tensor mine = shard;
  auto w = g_.dp->all_gather_flat_async(full, mine);
  g_.dp->wait(w, Ph::other);
  return full;
}

at::Tensor DpReducer::reduced_grad(int chunk) {
  return whole(chunk, chunks_[chunk].shard.grad) / loss_scale();  // unscaled, as update() hands it to AdamW
}

at::Tensor DpReducer::parameters(int chunk) {
  ModelChunk& m = *chunks_[chunk].model;
  // ZeRO 3 keeps no flat buffer: the fp32 master shards (the units may hold 16-bit copies).
  return m.flat().defined() ? m.flat() : whole(chunk, chunks_[chunk].shard.master);
}

bool DpReducer::unscale_or_skip(int step) {
  PhaseScope sc(clock_, Ph::optimizer);
  torch::NoGradGuard ng;
  // Any inf/NaN on any rank skips the step everywhere (TP and PP ranks hold different parts).
  const at::Tensor& first = chunks_.front().shard.grad;
  at::Tensor bad = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(first.device()));
  for (auto& c : chunks_) bad.add_(c.shard.grad.isfinite().logical_not().any().to(at::kFloat));
  g_.world->all_reduce(bad, c10d::ReduceOp::MAX);
  const double scale = scaling_.scale;
  if (!scaling_.record(step, bad.item<float>() == 0)) return false;
  for (auto& c : chunks_) c.shard.grad.mul_(1.0 / scale);
  return true;
}

void DpReducer::update(int step) {
  if (scaling_.enabled && !unscale_or_skip(step)) return;  // skipped: parameters unchanged, nothing to gather
  {
    PhaseScope sc(clock_, Ph::optimizer);
    adam_.step();
  }
  sync_->after_update();
}

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
    add(h.weights, c.shard.master);
    add(h.gradients, c.model->flat_grad());
    add(h.gradients, c.shard.grad);
    add(h.optimizer, c.exp_avg);
    add(h.optimizer, c.exp_avg_sq);
  }
  const SyncPeaks p = sync_->peaks();
  h.buffers_peak = p.buffers;
  h.gathered = p.gathered;
  return h;
}

}  // namespace trainplan::exec
