// `trainplan exec --memory-accounting on`: what one rank's step allocates, by what it holds, for
// the tests that hold the executor to the trainplan-exec software profile (tests/exec/test_exec_memory.cpp).
//
// MemoryProbe counts the bytes LibTorch's allocator hands out on the rank's device: it is the
// allocator's memory reporter (c10::MemoryReportingInfoBase, the hook PyTorch's profiler uses),
// installed for the rank's thread and the threads LibTorch runs its work on (autograd's) by a
// c10::DebugInfoGuard that the runner holds for the run; nothing is process-wide. The CPU
// allocator and the CUDA caching allocator both report each allocation and free to it (the CUDA
// one in blocks as it counts them in allocated_bytes), so `live` is the bytes of the tensors alive
// now, and `peak` the most since the last reset.
//
// MemoryAccount turns the probe's readings at named points of a step into the figures the
// software profile predicts (sim/memory_model.hpp), per rank:
//   weight_copies  16-bit weight copies autocast keeps over the step (the bytes its cache frees);
//   saved          the most any one micro-batch's forward leaves for its backward (saved
//                  tensors, the loss's kept gradients), the copies the first forward caches not counted;
//   activations    the step's forward/backward peak above the bytes held when it started, less
//                  the weight copies (what predict counts as activations at the backward peak:
//                  saved tensors of the micro-batches in flight and the loss's working set);
//   optimizer_temporaries  the optimizer's peak above the bytes held when it starts.
// No LibTorch in this header's interface beyond c10's reporter.
#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>

namespace trainplan::exec {

class MemoryProbe : public c10::MemoryReportingInfoBase {
 public:
  explicit MemoryProbe(c10::DeviceType device) : device_(device) {}
  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override;
  bool memoryProfilingEnabled() const override { return true; }
  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

 private:
  c10::DeviceType device_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

// The step's figures (see above), in bytes; over the measured steps each is the largest seen.
struct MemoryAccountFigures {
  double weight_copies = 0, saved = 0, activations = 0, optimizer_temporaries = 0;
  double step_start = 0;  // bytes held when a step starts (model states, tables, buffers)
};

class MemoryAccount {
 public:
  explicit MemoryAccount(MemoryProbe& probe) : probe_(probe) {}
  void begin_step();
  void before_forward();
  void after_forward();
  void before_cache_clear();  // the schedule's last backward has run; autocast's cache is cleared next
  void after_cache_clear();
  void after_update();  // the optimizer has stepped
  void end_step(bool measured);  // keeps this step's figures if it is measured
  const MemoryAccountFigures& figures() const { return kept_; }

 private:
  MemoryProbe& probe_;
  MemoryAccountFigures step_, kept_;
  int64_t start_ = 0, forward_start_ = 0, compute_peak_ = 0, optimizer_start_ = 0;
  int64_t first_saved_ = -1, other_saved_ = 0;  // the step's first micro-batch, the most of the others
};

}  // namespace trainplan::exec
