// What a rank's step allocates, by what it holds (see memory_probe.hpp).
#include "exec/memory_probe.hpp"

#include <algorithm>

namespace trainplan::exec {

void MemoryProbe::reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device device) {
  // Only the rank's device (a GPU rank's pinned host buffers are not its device memory).
  if (device.type() != device_) return;
  const int64_t now = live_.fetch_add(alloc_size) + alloc_size;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void MemoryAccount::begin_step() {
  step_ = {};
  start_ = probe_.live();
  step_.step_start = static_cast<double>(start_);
  first_saved_ = -1;
  other_saved_ = 0;
  probe_.reset_peak();
}

void MemoryAccount::before_forward() { forward_start_ = probe_.live(); }

void MemoryAccount::after_forward() {
  const int64_t left = probe_.live() - forward_start_;
  if (first_saved_ < 0)
    first_saved_ = left;
  else
    other_saved_ = std::max(other_saved_, left);
}

void MemoryAccount::before_cache_clear() {
  compute_peak_ = probe_.peak() - start_;
  optimizer_start_ = probe_.live();
}

void MemoryAccount::after_cache_clear() {
  const int64_t copies = optimizer_start_ - probe_.live();
  step_.weight_copies = static_cast<double>(copies);
  // The first forward of the step also filled autocast's cache with the copies.
  step_.saved = static_cast<double>(std::max(first_saved_ - copies, other_saved_));
  step_.activations = static_cast<double>(compute_peak_ - copies);
  optimizer_start_ = probe_.live();
  probe_.reset_peak();
}

void MemoryAccount::after_update() {
  step_.optimizer_temporaries = static_cast<double>(probe_.peak() - optimizer_start_);
}

void MemoryAccount::end_step(bool measured) {
  if (!measured) return;
  kept_.weight_copies = std::max(kept_.weight_copies, step_.weight_copies);
  kept_.saved = std::max(kept_.saved, step_.saved);
  kept_.activations = std::max(kept_.activations, step_.activations);
  kept_.optimizer_temporaries = std::max(kept_.optimizer_temporaries, step_.optimizer_temporaries);
  kept_.step_start = std::max(kept_.step_start, step_.step_start);
}

}  // namespace trainplan::exec
