// ZeRO 3: units gathered from their owners' shards before they run, freed after (see unit_gather.hpp).
#include "exec/unit_gather.hpp"

#include <algorithm>
#include <chrono>

namespace trainplan::exec {

namespace {
using Clock = std::chrono::steady_clock;
}

struct UnitGathers::Chunk {
  ModelChunk* model = nullptr;
  at::Tensor master;  // this rank's fp32 shard
  int64_t offset = 0, length = 0;
  // Per unit: the owners' broadcasts in flight that bring its parameters.
  struct Gather {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    Clock::time_point launched;
  };
  std::vector<Gather> gathers;
};

UnitGathers::UnitGathers(Comm& dp, PhaseClock& clock) : dp_(dp), clock_(clock) {}
UnitGathers::~UnitGathers() = default;

at::Tensor UnitGathers::add_chunk(ModelChunk& model, int64_t offset, int64_t length) {
  TORCH_CHECK(!model.flat().defined(), "ZeRO-3: the model must keep its parameters in unit buffers");
  auto c = std::make_unique<Chunk>();
  c->model = &model;
  c->offset = offset;
  c->length = length;
  torch::NoGradGuard ng;
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(model.params().front().param.device());
  c->master = at::zeros({length}, opts);  // the padding past the last unit stays zero
  for (ParamUnit& u : model.units()) {
    const int64_t b = std::max(u.begin, offset), e = std::min(u.end, offset + length);
    const at::Tensor& values = u.initial.defined() ? u.initial : u.buffer;
    if (b < e) c->master.narrow(0, b - offset, e - b).copy_(values.narrow(0, b - u.begin, e - b));
    u.initial = at::Tensor();
    free_unit_memory(u);
  }
  c->gathers.resize(model.units().size());
  model.set_gatherer(this);
  chunks_.push_back(std::move(c));
  return chunks_.back()->master;
}

UnitGathers::Chunk& UnitGathers::chunk_of(const ModelChunk& m) {
  for (auto& c : chunks_)
    if (c->model == &m) return *c;
  TORCH_CHECK(false, "UnitGathers: a model chunk that was never added");
}

void UnitGathers::start(Chunk& c, int unit) {
  ParamUnit& u = c.model->units()[unit];
  Chunk::Gather& g = c.gathers[unit];
  if (unit_present(u) || !g.works.empty()) return;  // present, or on its way
  torch::NoGradGuard ng;
  at::Tensor dst = alloc_unit_memory(u);
  gathered_bytes_ += static_cast<double>(u.buffer.storage().nbytes());
  gathered_peak_ = std::max(gathered_peak_, gathered_bytes_);
  // The unit's elements [begin, end) of the flat layout lie in the shards of one or more
  // replicas: each owner broadcasts its part (an all-gather over uneven ranges), in the unit's
  // dtype (the copy into `dst` casts the owner's fp32 part).
  g.launched = Clock::now();
  const int64_t len = c.length;
  const int first = static_cast<int>(u.begin / len), last = static_cast<int>((u.end - 1) / len);
  for (int r = first; r <= last && r < dp_.size(); ++r) {
    const int64_t b = std::max(u.begin, len * r), e = std::min(u.end, len * (r + 1));
    at::Tensor piece = dst.narrow(0, b - u.begin, e - b);
    if (r == dp_.index()) piece.copy_(c.master.narrow(0, b - c.offset, e - b));
    g.works.push_back(dp_.broadcast_async(piece, r));
  }
}

void UnitGathers::finish(Chunk& c, int unit) {
  Chunk::Gather& g = c.gathers[unit];
  if (g.works.empty()) return;
  for (auto& w : g.works) dp_.wait(w, Ph::dp_comm);
  g.works.clear();
  clock_.dp_in_flight += std::chrono::duration<double>(Clock::now() - g.launched).count();
}

void UnitGathers::need(ModelChunk& chunk, int unit, int prefetch) {
  Chunk& c = chunk_of(chunk);
  start(c, unit);
  if (prefetch >= 0) start(c, prefetch);  // overlaps this unit's compute
  finish(c, unit);
}

void UnitGathers::release(ModelChunk& chunk, int unit) {
  Chunk& c = chunk_of(chunk);
  ParamUnit& u = c.model->units()[unit];
  finish(c, unit);  // never free memory a broadcast still writes
  if (!unit_present(u) || u.end == u.begin) return;
  gathered_bytes_ -= static_cast<double>(u.buffer.storage().nbytes());
  free_unit_memory(u);
}

void UnitGathers::release_all(ModelChunk& chunk) {
  const int units = static_cast<int>(chunk.units().size());
  for (int u = 0; u < units; ++u) release(chunk, u);
}

}  // namespace trainplan::exec
