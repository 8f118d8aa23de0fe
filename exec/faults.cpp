// Test-only fault injection (see faults.hpp).
#include "exec/faults.hpp"

#include <csignal>
#include <unistd.h>

namespace trainplan::exec {

bool inject_after_forward(const FaultOptions& fault, int rank, int step, bool first_forward_of_step) {
  if (!first_forward_of_step || step != fault.step) return false;
  if (rank == fault.kill_rank) ::kill(::getpid(), SIGKILL);
  if (rank == fault.hang_rank)
    for (;;) ::pause();
  return rank == fault.alloc_rank;
}

}  // namespace trainplan::exec

namespace trainplan::exec {

double grad_bug_factor(const FaultOptions& fault, int micro_batches, int dp) {
  switch (fault.grad_bug) {
    case FaultOptions::GradBug::sum_dp: return dp;
    case FaultOptions::GradBug::sum_micro_batches: return micro_batches;
    case FaultOptions::GradBug::none: break;
  }
  return 1;
}

bool poison_after_backward(const FaultOptions& fault, int rank, int step, bool first_backward_of_step) {
  return first_backward_of_step && step == fault.step && rank == fault.nan_rank;
}

}  // namespace trainplan::exec
