// trainplan's entry point: picks the subcommand, turns InputError into exit code 2 with one line.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>

#include "sim/check.hpp"
#include "sim/cli/commands.hpp"

namespace {

using trainplan::cli::Args;
using trainplan::cli::Context;

struct Command {
  std::function<int(const Args&, const Context&)> run;
  const char* summary;
};

const std::map<std::string, Command>& commands() {
  using namespace trainplan::cli;
  static const std::map<std::string, Command> table = {
      {"predict", {cmd_predict, "predict memory and step time of one layout"}},
      {"simulate", {cmd_simulate, "simulate one step event by event; per-rank busy/idle, Chrome trace"}},
      {"compare", {cmd_compare, "predicted vs measured figures of one run, with % error"}},
      {"search", {cmd_search, "rank every valid layout of a model on a cluster (best first)"}},
      {"capacity", {cmd_capacity, "time, GPU-hours, cost and energy to train T tokens per cluster kind and size"}},
#ifdef TRAINPLAN_HAVE_EXEC
      {"exec", {cmd_exec, "run a plan for real with LibTorch (NCCL/Gloo) and measure it"}},
#else
      {"exec", {[](const Args&, const Context& ctx) {
                  ctx.err << "trainplan exec: this trainplan was built without LibTorch (install torch and rebuild; "
                             "see cmake/install-deps.sh)\n";
                  return 2;
                },
                "run a plan for real (needs a build with LibTorch)"}},
#endif
#ifdef TRAINPLAN_HAVE_EXEC
      {"calibrate", {cmd_calibrate, "measure this machine's matmul, memory and link speed; write a topology"}},
#endif
  };
  return table;
}

void usage(std::ostream& os) {
  os << "trainplan: plan, predict and check the parallel layout of a training run\n\n"
        "usage: trainplan <command> [flags]     (trainplan <command> --help for its flags)\n\ncommands:\n";
  for (const auto& [name, c] : commands()) os << fmt::format("  {:<10} {}\n", name, c.summary);
  os << "\nenvironment: TRAINPLAN_DATA_DIR overrides where built-in models/ and topologies/ are read.\n";
}

}  // namespace

int main(int argc, char** argv) {
  Args args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    usage(args.empty() ? std::cerr : std::cout);
    return args.empty() ? 2 : 0;
  }
  auto it = commands().find(args[0]);
  if (it == commands().end()) {
    std::cerr << fmt::format("trainplan: '{}' is not a command (see trainplan --help)\n", args[0]);
    return 2;
  }
  const char* env_dir = std::getenv("TRAINPLAN_DATA_DIR");
  Context ctx{env_dir ? env_dir : TRAINPLAN_DATA_DIR, std::cout, std::cerr, isatty(STDOUT_FILENO) == 1};
  try {
    return it->second.run(Args(args.begin() + 1, args.end()), ctx);
  } catch (const trainplan::InputError& e) {
    std::cerr << "trainplan " << args[0] << ": " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "trainplan " << args[0] << ": internal error: " << e.what() << "\n";
    return 1;
  }
}
