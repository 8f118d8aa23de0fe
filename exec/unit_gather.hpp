// ZeRO 3 over several replicas: parameters gathered unit by unit. Between steps a rank holds only
// its fp32 master shard; the model keeps each unit's parameters (the embedding, each layer, the
// head) in a buffer of its own and asks for them (UnitGatherer, model.hpp) just before the unit
// runs, forward and backward. The owners of the unit's range broadcast their parts of it
// asynchronously, the unit the model runs next is brought meanwhile (prefetch), and a unit's
// memory is freed as soon as it has run. Under mixed precision the units are gathered in the
// 16-bit compute dtype: each owner casts its fp32 part once per gather and sends that (FSDP's
// MixedPrecision(param_dtype)), so a gathered unit holds 2 B per parameter (memory_model's
// zero3_gathered_bytes).
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "exec/model.hpp"
#include "exec/parallel.hpp"

namespace trainplan::exec {

class UnitGathers final : public UnitGatherer {
 public:
  UnitGathers(Comm& dp, PhaseClock& clock);
  ~UnitGathers() override;
  // Becomes the gatherer of `model`, whose shard on this rank is [offset, offset + length) of its
  // flat layout: returns that shard's fp32 master weights, taken from the units (their fp32
  // initial values where the units are 16-bit), whose memory then goes until a unit is needed.
  at::Tensor add_chunk(ModelChunk& model, int64_t offset, int64_t length);
  void need(ModelChunk& chunk, int unit, int prefetch) override;
  void release(ModelChunk& chunk, int unit) override;
  void release_all(ModelChunk& chunk);  // units whose backward hook did not run; stale units after an update
  double gathered_peak() const { return gathered_peak_; }  // bytes of gathered units held at once

 private:
  struct Chunk;
  Chunk& chunk_of(const ModelChunk& m);
  void start(Chunk& c, int unit);   // allocate the unit's memory, post the owners' broadcasts
  void finish(Chunk& c, int unit);  // wait for them
  Comm& dp_;
  PhaseClock& clock_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  double gathered_bytes_ = 0, gathered_peak_ = 0;  // unit memory allocated now, and its peak
};

}  // namespace trainplan::exec
