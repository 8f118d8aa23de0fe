// One planner command run inside the calling process exactly as `trainplan <command> <args...>`
// runs it (the same flag parsing, command function, notes and error line), with its output
// captured instead of printed. The Python module (python/) is built on it.
#pragma once
#include <filesystem>
#include <string>

#include "cli/commands.hpp"

namespace trainplan::cli {

struct EmbeddedResult {
  int code = 0;      // the CLI's exit status: 0, 3 (infeasible or nothing found), 2 (bad input), 1 (a bug)
  std::string out;   // what the command printed on stdout (its report)
  std::string err;   // what it printed on stderr: notes, or the one error line, each ending in '\n'
  std::string json;  // the document its --json would hold; empty when the command wrote none
};

// Runs predict, simulate, search or capacity with `args` (the flags after the command name) and
// the built-in data in `data_dir`. The command's --json is pointed at a file in a private temporary
// folder, read back into `json`, and the folder removed; so `args` may not give --json itself (bad
// input, code 2, like an unknown command). Never throws for bad input.
EmbeddedResult run_embedded(const std::string& command, const Args& args, const std::filesystem::path& data_dir);

}  // namespace trainplan::cli
