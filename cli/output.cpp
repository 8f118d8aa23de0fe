// JSON output files of the CLI commands (see commands.hpp).
#include <fmt/format.h>

#include "cli/commands.hpp"
#include "reports/html_report.hpp"
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

TextOutput::TextOutput(const std::string& flag, const std::string& path) : flag_(flag), path_(path) {
  check_output_path(path_, fmt::format("--{} {}", flag_, path_));
}

void TextOutput::write(const std::string& content) const {
  write_file_atomically(path_, content, fmt::format("--{} {}", flag_, path_));
}

std::optional<TextOutput> open_text_output(const std::string& flag, const std::optional<std::string>& path) {
  if (!path) return std::nullopt;
  return std::optional<TextOutput>(std::in_place, flag, *path);
}

void write_html_report(const TextOutput& out, const nlohmann::json& doc, const std::string& title) {
  out.write(html_report({ReportDocument{"", doc}}, title));
}

}  // namespace trainplan::cli
