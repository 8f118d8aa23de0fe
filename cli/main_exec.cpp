// `trainplan-exec`: the commands that need LibTorch (exec, calibrate). `trainplan exec ...` and
// `trainplan calibrate ...` replace themselves with this binary, so the planner never loads
// LibTorch. Local ranks of `exec --nproc N` are started from this binary too.
#include "cli/dispatch.hpp"

int main(int argc, char** argv) {
  using namespace trainplan::cli;
  const CommandTable commands = {
      {"exec", {cmd_exec, "run a plan for real with LibTorch (NCCL/Gloo) and measure it"}},
      {"calibrate", {cmd_calibrate, "measure this machine's matmul, memory and link speed; write a topology"}},
  };
  return dispatch(argc, argv, commands, "trainplan-exec: the LibTorch commands of trainplan (run them as `trainplan exec|calibrate`)");
}
