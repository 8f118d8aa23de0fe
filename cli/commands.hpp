// Subcommands of the trainplan CLI. Each takes its arguments (after the subcommand name) and a
// context, returns the process exit code, and throws InputError for bad input (main prints it as
// one line and exits 2).
#pragma once
#include <filesystem>
#include <optional>
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

int cmd_predict(const Args& args, const Context& ctx);   // one layout, analytically
int cmd_simulate(const Args& args, const Context& ctx);  // one step, event by event
int cmd_compare(const Args& args, const Context& ctx);   // a prediction against a measured run
int cmd_search(const Args& args, const Context& ctx);    // every layout, ranked
int cmd_capacity(const Args& args, const Context& ctx);  // cluster kind and size for a token budget
int cmd_report(const Args& args, const Context& ctx);    // an HTML page of result files
int cmd_cluster(const Args& args, const Context& ctx);   // cluster files: derive one for an unmeasured GPU
// In trainplan-exec only (they need LibTorch):
int cmd_exec(const Args& args, const Context& ctx);
int cmd_calibrate(const Args& args, const Context& ctx);

}  // namespace trainplan::cli

namespace trainplan::cli {
// A JSON output file checked before the work starts, so that an unwritable path is reported
// before any output (InputError naming --<flag>); nothing is created or truncated then.
// write() pretty-prints the document to a temporary file and renames it into place, so the
// file is either the complete new document or what was there before.
class JsonOutput {
 public:
  JsonOutput(const std::string& flag, const std::string& path);
  void write(const nlohmann::json& j) const;

 private:
  std::string flag_, path_;
};

// Writes `j` to `path` at once (prefer open_json_output, which reports a bad path before work).
void write_json_file(const std::string& flag, const std::string& path, const nlohmann::json& j);

// Opens `path` for --<flag> when given; nothing otherwise.
std::optional<JsonOutput> open_json_output(const std::string& flag, const std::optional<std::string>& path);

// A text output file (HTML report, CSV), checked before work and written atomically like JsonOutput.
class TextOutput {
 public:
  TextOutput(const std::string& flag, const std::string& path);
  void write(const std::string& content) const;
  const std::string& path() const { return path_; }

 private:
  std::string flag_, path_;
};
std::optional<TextOutput> open_text_output(const std::string& flag, const std::optional<std::string>& path);

// --html FILE of predict/simulate/search/capacity/compare: the trainplan report page of `doc`
// (the command's JSON document, built in memory) titled `title`. Commands render it before they
// print or write anything, so that a figure the page refuses leaves no --json file behind.
std::string html_page(const nlohmann::json& doc, const std::string& title);

// Throws InputError naming the first figure of a command's result document that is not finite
// (JSON would hold it as null): inputs near the edges of their ranges can still overflow a
// product. Commands call it before printing or writing their result.
void check_finite(const nlohmann::json& doc);
}  // namespace trainplan::cli
