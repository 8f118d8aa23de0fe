// The entry point shared by the two binaries: `trainplan` (the planner, no LibTorch) and
// `trainplan-exec` (exec and calibrate, LibTorch). Picks the subcommand, runs it, and turns an
// InputError into exit code 2 with one line.
#pragma once
#include <functional>
#include <map>
#include <string>

#include "cli/commands.hpp"

namespace trainplan::cli {

struct Command {
  std::function<int(const Args&, const Context&)> run;
  const char* summary;
};
using CommandTable = std::map<std::string, Command>;

// The message as the one printable line the CLI prints (control characters shown as \xNN).
std::string one_line(const std::string& message);

// Runs argv[1] from `commands`; `title` heads the usage text.
int dispatch(int argc, char** argv, const CommandTable& commands, const char* title);

}  // namespace trainplan::cli
