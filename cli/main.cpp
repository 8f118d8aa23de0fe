// `trainplan`: the planner. It links no LibTorch, so it starts in milliseconds; `exec` and
// `calibrate` run the sibling binary `trainplan-exec` (built next to it when LibTorch is found)
// with the same arguments.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#include "cli/dispatch.hpp"

namespace {

namespace fs = std::filesystem;
using trainplan::cli::Args;
using trainplan::cli::Context;

// Replaces this process with `trainplan-exec <command> <args...>`; returns 2 with one line when
// there is no such binary (a build without LibTorch) or it cannot be started.
int run_exec_binary(const std::string& command, const Args& args, const Context& ctx) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path exe = (ec ? fs::path(".") : self.parent_path()) / "trainplan-exec";
  if (!fs::exists(exe, ec)) {
    ctx.err << fmt::format("trainplan {}: this trainplan was built without LibTorch ({} is missing); install torch "
                           "and rebuild (see cmake/install-deps.sh)\n",
                           command, exe.string());
    return 2;
  }
  std::vector<std::string> owned{exe.string(), command};
  owned.insert(owned.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  ::execv(argv[0], argv.data());
  ctx.err << fmt::format("trainplan {}: cannot start {}: {}\n", command, exe.string(), std::strerror(errno));
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace trainplan::cli;
  const CommandTable commands = {
      {"predict", {cmd_predict, "predict memory and step time of one layout"}},
      {"simulate", {cmd_simulate, "simulate one step event by event; per-rank busy/idle, Chrome trace"}},
      {"compare", {cmd_compare, "predicted vs measured figures of one run, with % error"}},
      {"search", {cmd_search, "rank every valid layout of a model on a cluster (best first)"}},
      {"capacity", {cmd_capacity, "time, GPU-hours, cost and energy to train T tokens per cluster kind and size"}},
      {"report", {cmd_report, "one self-contained HTML page (charts) from trainplan JSON files"}},
      {"cluster", {cmd_cluster, "derive: a cluster file for an unmeasured GPU from its datasheet figures"}},
      {"exec", {[](const Args& a, const Context& c) { return run_exec_binary("exec", a, c); },
                "run a plan for real with LibTorch (NCCL/Gloo) and measure it"}},
      {"calibrate", {[](const Args& a, const Context& c) { return run_exec_binary("calibrate", a, c); },
                     "measure this machine's matmul, memory and link speed; write a topology"}},
  };
  return dispatch(argc, argv, commands, "trainplan: plan, predict and check the parallel layout of a training run");
}
