// Test-only fault injection for `trainplan exec` (--fault-* flags): lets the tests check how the
// job reports a rank that dies or hangs. Nothing here runs unless a fault flag is given.
#pragma once

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

// The factor `grad_bug` multiplies the loss (and so every gradient) by: dp, the micro-batches, or 1.
double grad_bug_factor(const FaultOptions& fault, int micro_batches, int dp);

// Called by the schedule runner after each forward; acts once, after the first forward of
// `fault.step` on the named rank. Kill and hang happen here; for an allocation failure it returns
// true and the runner makes the allocation (on its device, through the real allocator).
bool inject_after_forward(const FaultOptions& fault, int rank, int step, bool first_forward_of_step);
// True after the first backward of `fault.step` on `fault.nan_rank`: the runner then poisons a
// gradient (checks the fp16 loss scaler's skip).
bool poison_after_backward(const FaultOptions& fault, int rank, int step, bool first_backward_of_step);

}  // namespace trainplan::exec
