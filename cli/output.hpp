// The files of one command: every input it names and every output it writes, checked together
// before any input is read or any work is done, and the outputs written all or none.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.hpp"
#include "cli/flags.hpp"
#include "sim/atomic_file.hpp"

namespace trainplan::cli {

// What one command may read in all (memory; each file is also at most kMaxInputFileBytes, 64 MiB):
// at most kMaxInputFiles files named on its command line, of kMaxInputBytesTotal together. A JSON
// document costs up to ~16 bytes of memory per byte of text (see json_reader.hpp), so four files
// at the per-file limit are what a command can hold at once within 2 GiB; trainplan's largest
// output, a search with every option, is 54 MB.
inline constexpr std::size_t kMaxInputFiles = 64;
inline constexpr std::uintmax_t kMaxInputBytesTotal = 256ull << 20;  // 256 MiB

// The folders of the data directory whose files are the built-in models, clusters, software
// profiles and reliability defaults: no output is ever written into them.
inline constexpr const char* kDataFolders[] = {"models", "topologies", "software", "reliability"};

class CommandFiles {
 public:
  // The one place where a command registers its files. Reads the output flags `outputs` (each
  // optional: given or not) and throws InputError, before anything is read or written, when
  //  - an output cannot be written (check_output_path: a folder, a missing or read-only folder);
  //  - two outputs are the same file, or an output is the same file as an input: any file another
  //    argument names (a flag's value, an item of a comma-separated value, a positional) -- every
  //    input a command reads is named so, whichever flag names it;
  //  - an output lies in one of the data directory's kDataFolders;
  //  - the arguments name more than kMaxInputFiles existing files, or more than
  //    kMaxInputBytesTotal bytes of them together.
  // `streamed`: input flags whose file is read in pieces, never held whole (exec's --data token
  // file, any size): kept apart from the outputs like every input, but outside that budget.
  CommandFiles(const Flags& f, const Context& ctx, const std::vector<std::string>& outputs,
               const std::vector<std::string>& streamed = {});

  bool wants(const std::string& flag) const { return paths_.count(flag) != 0; }
  const std::string& path(const std::string& flag) const { return paths_.at(flag); }

  // Writes an output given on the command line to its temporary (OutputSet::stage); nothing is
  // replaced until commit(). Commands stage every output before they print their results, so a
  // write that fails is their only line, and commit after.
  void stage(const std::string& flag, std::string_view content);
  void stage_json(const std::string& flag, const nlohmann::json& doc);
  void stage(const std::string& flag, const std::function<void(std::ostream&)>& write);
  // Renames every staged output into place (OutputSet::commit).
  void commit() { set_.commit(); }

 private:
  std::map<std::string, std::string> paths_;  // flag -> path, for the outputs given
  OutputSet set_;
};

// The pretty-printed text of a JSON output file (what JsonOutput writes).
std::string json_file_text(const nlohmann::json& doc);

}  // namespace trainplan::cli
