// JSON output files of the CLI commands (see commands.hpp).
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "sim/atomic_file.hpp"

namespace trainplan::cli {

JsonOutput::JsonOutput(const std::string& flag, const std::string& path) : flag_(flag), path_(path) {
  check_output_path(path_, fmt::format("--{} {}", flag_, path_));
}

void JsonOutput::write(const nlohmann::json& j) const {
  write_file_atomically(path_, j.dump(2) + "\n", fmt::format("--{} {}", flag_, path_));
}

void write_json_file(const std::string& flag, const std::string& path, const nlohmann::json& j) {
  JsonOutput(flag, path).write(j);
}

std::optional<JsonOutput> open_json_output(const std::string& flag, const std::optional<std::string>& path) {
  if (!path) return std::nullopt;
  return std::optional<JsonOutput>(std::in_place, flag, *path);
}

}  // namespace trainplan::cli
