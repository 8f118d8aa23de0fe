// JSON output files of the CLI commands (see commands.hpp).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "sim/check.hpp"
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

namespace {

// Same file: equal text, the same place once resolved (the file need not exist yet), or the
// same inode (hard links, ./x vs x).
bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  std::error_code ec1, ec2, ec3;
  // absolute() first: weakly_canonical leaves a relative path whose file does not exist yet
  // relative ("x.json"), but resolves "./x.json" through the existing "." (an absolute path).
  const auto ca = std::filesystem::weakly_canonical(std::filesystem::absolute(a, ec1), ec1),
             cb = std::filesystem::weakly_canonical(std::filesystem::absolute(b, ec2), ec2);
  if (!ec1 && !ec2 && ca == cb) return true;
  return std::filesystem::equivalent(a, b, ec3) && !ec3;
}

}  // namespace

void check_outputs_apart(const Flags& f, const std::vector<std::string>& output_flags) {
  std::vector<std::pair<std::string, std::string>> outputs;  // (flag, path)
  for (const auto& flag : output_flags)
    if (auto v = f.peek(flag)) outputs.emplace_back(flag, *v);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (same_file(outputs[i].second, outputs[j].second)) {
        throw InputError(fmt::format("--{} {}: the same file as --{}; give them different names", outputs[i].first,
                                     outputs[i].second, outputs[j].first));
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> inputs;  // only existing files can be destroyed
  for (const char* flag : {"model", "cluster", "software", "plan", "data", "base"})
    if (auto v = f.peek(flag)) inputs.emplace_back(std::string("--") + flag, *v);
  for (const auto& p : f.positionals()) inputs.emplace_back("an input", p);
  for (const auto& [oflag, out] : outputs) {
    for (const auto& [iflag, in] : inputs) {
      std::error_code ec;
      if (std::filesystem::is_regular_file(in, ec) && same_file(out, in)) {
        throw InputError(fmt::format("--{} {}: is also {} file; write it elsewhere", oflag, out,
                                     iflag == "an input" ? iflag : "the " + iflag));
      }
    }
  }
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

std::string html_page(const nlohmann::json& doc, const std::string& title) {
  return html_report({ReportDocument{"", doc}}, title);
}

namespace {

void check_finite_at(const nlohmann::json& j, const std::string& path) {
  if (j.is_number_float() && !std::isfinite(j.get<double>())) {
    throw InputError(fmt::format("result {} = {}: a figure overflowed; the model, cluster or flag values are "
                                 "outside what can be computed",
                                 path, j.get<double>()));
  }
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) check_finite_at(*it, path.empty() ? it.key() : path + "." + it.key());
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i) check_finite_at(j[i], fmt::format("{}[{}]", path, i));
  }
}

}  // namespace

void check_finite(const nlohmann::json& doc) { check_finite_at(doc, ""); }

}  // namespace trainplan::cli
