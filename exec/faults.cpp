// Test-only fault injection (see faults.hpp).
#include "exec/faults.hpp"

#include <csignal>
#include <unistd.h>

namespace trainplan::exec {

void inject_after_forward(const FaultOptions& fault, int rank, int step, bool first_forward_of_step) {
  if (!first_forward_of_step || step != fault.step) return;
  if (rank == fault.kill_rank) ::kill(::getpid(), SIGKILL);
  if (rank == fault.hang_rank)
    for (;;) ::pause();
}

}  // namespace trainplan::exec
