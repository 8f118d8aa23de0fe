// Subcommands of the trainplan CLI. Each takes its arguments (after the subcommand name) and a
// context, returns the process exit code, and throws InputError for bad input (main prints it as
// one line and exits 2).
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <iostream>
#include <string>
#include <vector>

namespace trainplan::cli {

struct Context {
  std::filesystem::path data_dir;  // holds models/ and topologies/
  std::ostream& out;
  std::ostream& err;
  bool out_is_terminal = false;    // progress bars only on a terminal
};

using Args = std::vector<std::string>;

int cmd_predict(const Args& args, const Context& ctx);
int cmd_compare(const Args& args, const Context& ctx);  // issue 5

}  // namespace trainplan::cli

namespace trainplan::cli {
// Writes `j` (pretty-printed) to `path`; throws InputError naming --<flag> if it cannot.
void write_json_file(const std::string& flag, const std::string& path, const nlohmann::json& j);
}  // namespace trainplan::cli
