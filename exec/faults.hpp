// Test-only fault injection for `trainplan exec` (--fault-* flags): lets the tests check how the
// job reports a rank that dies or hangs. Nothing here runs unless a fault flag is given.
#pragma once

namespace trainplan::exec {

struct FaultOptions {
  int kill_rank = -1;  // this rank kills itself (SIGKILL)...
  int hang_rank = -1;  // ...or hangs forever...
  int step = -1;       // ...in this step, after its first forward
};

// Called by the schedule runner after each forward; acts once, after the first forward of
// `fault.step` on the named rank.
void inject_after_forward(const FaultOptions& fault, int rank, int step, bool first_forward_of_step);

}  // namespace trainplan::exec
