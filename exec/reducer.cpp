// The DP side of a rank's step: the scheme's reduction, the AdamW step over this rank's shard (see
// reducer.hpp).
#include "exec/reducer.hpp"

#include <algorithm>

namespace trainplan::exec {

DpReducer::DpReducer(std::unique_ptr<GradSync> sync, Groups& groups, PhaseClock& clock, AdamWSettings adam,
                     LossScaling scaling, std::unique_ptr<GradSync> expert_sync)
    : sync_(std::move(sync)), expert_sync_(std::move(expert_sync)), g_(groups), clock_(clock), adam_(adam),
      scaling_(std::move(scaling)) {}

DpReducer::~DpReducer() = default;

DpReducer::Chunk DpReducer::make_chunk(GradSync& sync, ModelChunk& model, bool tied_copy) {
  Chunk c;
  c.model = &model;
  c.tied_copy = tied_copy;
  c.shard = sync.add_chunk(model, tied_copy);
  const int64_t state = c.shard.steps_here ? c.shard.master.numel() : 0;
  c.exp_avg = at::zeros({state}, c.shard.master.options());
  c.exp_avg_sq = at::zeros({state}, c.shard.master.options());
  if (c.shard.steps_here)
    adam_.add(model.params(), c.shard.offset, c.shard.master, c.shard.grad, c.exp_avg, c.exp_avg_sq);
  return c;
}

void DpReducer::add_chunk(ModelChunk& model, bool tied_copy, ModelChunk* experts) {
  TORCH_CHECK((experts != nullptr) == (expert_sync_ != nullptr), "add_chunk: expert chunks exactly with an expert scheme");
  chunks_.push_back(make_chunk(*sync_, model, tied_copy));
  if (experts) expert_chunks_.push_back(make_chunk(*expert_sync_, *experts, false));
}

void DpReducer::begin_step() {
  sync_->begin_step();
  if (expert_sync_) expert_sync_->begin_step();
}

void DpReducer::begin_backward(int chunk, bool last) {
  sync_->begin_backward(chunk, last);
  if (expert_sync_) expert_sync_->begin_backward(chunk, last);
}

void DpReducer::after_backward(int chunk) {
  sync_->end_backward(chunk);
  if (expert_sync_) expert_sync_->end_backward(chunk);
}

void DpReducer::backward_done(int chunk) {
  if (!chunks_[chunk].tied_copy) sync_->reduce(chunk);  // tied copies are summed with their twin first
  if (expert_sync_) expert_sync_->reduce(chunk);
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

void DpReducer::finish_reduction(bool keep_grads) {
  sync_->finish(keep_grads);
  if (expert_sync_) expert_sync_->finish(keep_grads);
}

// A shard that is the whole chunk is returned as is; else the replicas' shards (one length, in
// replica order) are all-gathered over their group.
at::Tensor DpReducer::whole(const Chunk& c, Comm& group, const at::Tensor& shard) {
  const int64_t n = c.model->numel();
  if (shard.numel() == n) return shard;
  at::Tensor full = at::empty({n}, shard.options());
  at::Tensor mine = shard;
  auto w = group.all_gather_flat_async(full, mine);
  group.wait(w, Ph::other);
  return full;
}

at::Tensor DpReducer::reduced_grad(int chunk, bool experts) {
  const Chunk& c = (experts ? expert_chunks_ : chunks_).at(chunk);
  // Unscaled, as update() hands it to AdamW.
  return whole(c, experts ? *g_.edp : *g_.dp, c.shard.grad) / loss_scale();
}

at::Tensor DpReducer::parameters(int chunk, bool experts) {
  const Chunk& c = (experts ? expert_chunks_ : chunks_).at(chunk);
  // ZeRO 3 keeps no flat buffer: the fp32 master shards (the units may hold 16-bit copies).
  return c.model->flat().defined() ? c.model->flat() : whole(c, experts ? *g_.edp : *g_.dp, c.shard.master);
}

bool DpReducer::unscale_or_skip(int step) {
  PhaseScope sc(clock_, Ph::optimizer);
  torch::NoGradGuard ng;
  // Any inf/NaN on any rank skips the step everywhere (TP and PP ranks hold different parts).
  const at::Tensor& first = chunks_.front().shard.grad;
  at::Tensor bad = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(first.device()));
  each_chunk([&bad](const Chunk& c) { bad.add_(c.shard.grad.isfinite().logical_not().any().to(at::kFloat)); });
  g_.world->all_reduce(bad, c10d::ReduceOp::MAX);
  const double scale = scaling_.scale;
  if (!scaling_.record(step, bad.item<float>() == 0)) return false;
  each_chunk([scale](const Chunk& c) { c.shard.grad.mul_(1.0 / scale); });
  return true;
}

void DpReducer::update(int step) {
  if (scaling_.enabled && !unscale_or_skip(step)) return;  // skipped: parameters unchanged, nothing to gather
  {
    PhaseScope sc(clock_, Ph::optimizer);
    adam_.step();
  }
  sync_->after_update();
  if (expert_sync_) expert_sync_->after_update();
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
  each_chunk([&](const Chunk& c) {
    add(h.weights, c.shard.master);
    add(h.gradients, c.model->flat_grad());
    add(h.gradients, c.shard.grad);
    add(h.optimizer, c.exp_avg);
    add(h.optimizer, c.exp_avg_sq);
  });
  const SyncPeaks p = sync_->peaks();
  h.buffers_peak = p.buffers;
  h.gathered = p.gathered;
  if (expert_sync_) {  // the two schemes' buffers may be in flight at once
    h.buffers_peak += expert_sync_->peaks().buffers;
    h.gathered += expert_sync_->peaks().gathered;
  }
  return h;
}

}  // namespace trainplan::exec
