// Output files of the CLI commands, and the files of a command checked together (see commands.hpp
// and output.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>

#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "cli/flags.hpp"
#include "sim/check.hpp"
#include "reports/html_report.hpp"
#include "sim/atomic_file.hpp"

namespace trainplan::cli {

JsonOutput::JsonOutput(const std::string& flag, const std::string& path) : flag_(flag), path_(path) {
  check_output_path(path_, fmt::format("--{} {}", flag_, path_));
}

void JsonOutput::write(const nlohmann::json& j) const {
  write_file_atomically(path_, json_file_text(j), fmt::format("--{} {}", flag_, path_));
}

void write_json_file(const std::string& flag, const std::string& path, const nlohmann::json& j) {
  JsonOutput(flag, path).write(j);
}

namespace {

namespace fs = std::filesystem;

// Same file: equal text, the same place once resolved (the file need not exist yet), or the
// same inode (hard links, ./x vs x).
bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  std::error_code ec1, ec2, ec3;
  // absolute() first: weakly_canonical leaves a relative path whose file does not exist yet
  // relative ("x.json"), but resolves "./x.json" through the existing "." (an absolute path).
  const auto ca = fs::weakly_canonical(fs::absolute(a, ec1), ec1), cb = fs::weakly_canonical(fs::absolute(b, ec2), ec2);
  if (!ec1 && !ec2 && ca == cb) return true;
  return fs::equivalent(a, b, ec3) && !ec3;
}

struct Named {
  std::string label;  // how a message names it: "--clusters" or "a positional argument"
  std::string path;
};

bool is_regular_file(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_regular_file(path, ec);
}

// The existing files the arguments name, other than the outputs: each flag's value, each item of
// a comma-separated value (--clusters a.json,b.json) and each positional. Every input of every
// command is among them, whichever flag names it; a value that names no file (a number, a
// built-in name) is not.
std::vector<Named> named_files(const Flags& f, const std::vector<std::string>& output_flags) {
  std::vector<Named> out;
  auto add = [&](const std::string& label, const std::string& value) {
    if (is_regular_file(value)) out.push_back({label, value});
    if (value.find(',') == std::string::npos) return;
    for (std::size_t from = 0; from <= value.size();) {
      const std::size_t comma = std::min(value.find(',', from), value.size());
      if (const std::string item = value.substr(from, comma - from); is_regular_file(item)) out.push_back({label, item});
      from = comma + 1;
    }
  };
  for (const auto& [name, value] : f.given()) {
    if (std::find(output_flags.begin(), output_flags.end(), name) == output_flags.end()) add("--" + name, value);
  }
  for (const std::string& p : f.positionals()) add("a positional argument", p);
  return out;
}

// Outputs (flag, path) apart from each other and from every named input file.
void check_apart(const std::vector<std::pair<std::string, std::string>>& outputs, const std::vector<Named>& inputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (same_file(outputs[i].second, outputs[j].second)) {
        throw InputError(fmt::format("--{} {}: the same file as --{}; give them different names", outputs[i].first,
                                     outputs[i].second, outputs[j].first));
      }
    }
    for (const Named& in : inputs) {
      if (same_file(outputs[i].second, in.path)) {
        throw InputError(fmt::format("--{} {}: is also an input file ({} {}); write it elsewhere", outputs[i].first,
                                     outputs[i].second, in.label, in.path));
      }
    }
  }
}

// An output in data_dir/models/ (or another of kDataFolders, or below one) would add to or replace
// the built-in data every later run reads.
void check_outside_data(const std::string& flag, const std::string& path, const fs::path& data_dir) {
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(fs::absolute(fs::path(path), ec).parent_path(), ec);
  if (ec) return;
  for (const char* sub : kDataFolders) {
    std::error_code ec2;
    const fs::path data = fs::weakly_canonical(fs::absolute(data_dir / sub, ec2), ec2);
    if (ec2) continue;
    const auto rel = folder.lexically_relative(data);
    if (!rel.empty() && *rel.begin() != "..") {
      throw InputError(fmt::format("--{} {}: is in the built-in data folder {}, which every run reads; write it "
                                   "elsewhere",
                                   flag, path, (data_dir / sub).string()));
    }
  }
}

// At most kMaxInputFiles named files of kMaxInputBytesTotal together (each mention counts: a file
// named twice is read twice).
void check_input_budget(const std::vector<Named>& inputs) {
  std::uintmax_t total = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (i == kMaxInputFiles) {
      throw InputError(fmt::format("{} {}: more than {} input files (the most one command reads; memory)",
                                   inputs[i].label, inputs[i].path, kMaxInputFiles));
    }
    std::error_code ec;
    const std::uintmax_t size = fs::file_size(inputs[i].path, ec);
    if (ec) continue;
    total += size;
    if (total > kMaxInputBytesTotal) {
      throw InputError(fmt::format("{} {}: brings the input files to {} MiB, more than the {} MiB one command reads "
                                   "(memory; each file may have 64 MiB)",
                                   inputs[i].label, inputs[i].path, (total + (1 << 20) - 1) >> 20,
                                   kMaxInputBytesTotal >> 20));
    }
  }
}

}  // namespace

CommandFiles::CommandFiles(const Flags& f, const Context& ctx, const std::vector<std::string>& outputs,
                           const std::vector<std::string>& streamed) {
  std::vector<std::pair<std::string, std::string>> given;  // (flag, path)
  for (const std::string& flag : outputs) {
    if (auto v = f.get(flag)) {
      check_output_path(*v, fmt::format("--{} {}", flag, *v));
      check_outside_data(flag, *v, ctx.data_dir);
      given.emplace_back(flag, *v);
      paths_[flag] = *v;
    }
  }
  const std::vector<Named> inputs = named_files(f, outputs);
  check_apart(given, inputs);
  std::vector<Named> held;  // the inputs read whole
  for (const Named& in : inputs) {
    const bool piecewise = std::any_of(streamed.begin(), streamed.end(), [&](const std::string& s) { return in.label == "--" + s; });
    if (!piecewise) held.push_back(in);
  }
  check_input_budget(held);
}

void CommandFiles::stage(const std::string& flag, std::string_view content) {
  set_.stage(path(flag), content, fmt::format("--{} {}", flag, path(flag)));
}

void CommandFiles::stage_json(const std::string& flag, const nlohmann::json& doc) {
  // Streamed as json_file_text() formats it (indent 2), without a copy of a large document's text.
  stage(flag, [&](std::ostream& os) { os << std::setw(2) << doc << '\n'; });
}

void CommandFiles::stage(const std::string& flag, const std::function<void(std::ostream&)>& write) {
  set_.stage(path(flag), fmt::format("--{} {}", flag, path(flag)), write);
}

std::string json_file_text(const nlohmann::json& doc) { return doc.dump(2) + "\n"; }

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
