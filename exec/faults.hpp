// Test-only fault injection for `trainplan exec` (the --fault-* flags): lets the tests check how the
// job reports a rank that dies, hangs or fails to allocate, that fp16's loss scaling skips a step
// with a NaN gradient, and that the equivalence tests catch a gradient-scale bug. The training step
// reaches a fault only through a FaultInjector: the runner calls its hooks at named points of the
// step, and make_fault_injector gives a rank hooks that do nothing unless a --fault-* flag asks for
// a fault there. The step's own arithmetic never involves a fault.
// (No LibTorch in this header: the CLI includes it through exec.hpp.)
#pragma once
#include <memory>

namespace at {
class Tensor;
}

namespace trainplan::exec {

struct FaultOptions {
  int kill_rank = -1;  // this rank kills itself (SIGKILL)...
  int hang_rank = -1;  // ...or hangs forever...
  int alloc_rank = -1; // ...or asks its device for more memory than exists (an allocation failure)...
  int nan_rank = -1;   // ...or makes one of its gradients NaN after its first backward...
  int step = -1;       // ...in this step, after its first forward
  // A gradient-scale bug on purpose, every step: the loss is summed instead of averaged over the
  // data-parallel ranks (sum_dp) or the micro-batches (sum_micro_batches). The equivalence tests
  // check that the gradient comparison catches it (AdamW would hide it in the parameters).
  enum class GradBug { none, sum_dp, sum_micro_batches } grad_bug = GradBug::none;
};

class DpReducer;

// The points of a rank's training step where a test fault may act. These hooks do nothing.
class FaultInjector {
 public:
  virtual ~FaultInjector() = default;
  // After each forward of the step `step`; `output` is the chunk's activation or loss.
  virtual void after_forward(int step, const at::Tensor& output) { (void)step, (void)output; }
  // Before a last-stage backward: `objective` is what the backward starts from (the loss, scaled
  // to the mean over the global batch and by the fp16 loss scale); a fault may replace it.
  virtual void before_backward(int step, at::Tensor& objective) { (void)step, (void)objective; }
  // After each backward of the step; `chunk` is the model chunk it ran.
  virtual void after_backward(int step, int chunk) { (void)step, (void)chunk; }
  // The step's gradients are reduced and about to reach the optimizer (`dp`).
  virtual void before_update(int step, DpReducer& dp) { (void)step, (void)dp; }
};

// The hooks for rank `rank` of a run with `fault`: the faults it asks of this rank, or none.
// `micro_batches` and `dp`: the plan's, for the gradient-scale bug.
std::unique_ptr<FaultInjector> make_fault_injector(const FaultOptions& fault, int rank, int micro_batches, int dp);

}  // namespace trainplan::exec
