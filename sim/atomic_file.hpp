// Output files that are either complete or absent: content goes to a temporary file in the same
// folder, is flushed, then renamed over the target (rename(2) is atomic within one file system).
// A failure leaves no temporary behind and the previous file, if any, untouched. OutputSet does
// the same for all the outputs of one command together.
#pragma once
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace trainplan {

// Throws InputError naming `what` (e.g. "--json out.json") when `path` cannot be an output file:
// it names a folder (a directory, or a path ending in "/", "." or ".."), or its folder is missing
// or not writable, or its name (or its temporary's, see below) is too long. Creates and changes nothing, so a
// command can check every output before it starts work.
void check_output_path(const std::filesystem::path& path, std::string_view what);

// Writes `content` to `path` atomically (see above). Throws InputError naming `what` on failure.
void write_file_atomically(const std::filesystem::path& path, std::string_view content, std::string_view what);

// The outputs of one command, written all or none: stage() writes each in full (flushed to disk)
// to a hidden temporary beside its target (.NAME.tmp-XXXXXX) and replaces nothing; commit() then
// renames every temporary over its target, in the order staged. So a write that fails (a full
// disk, a file-size limit) leaves every target as it was, and a command that stages its outputs
// before it prints its results reports such a failure as its only line. A set destroyed before
// commit() (an exception) removes its temporaries. What remains possible: rename(2) failing for
// one target after others were renamed (only a change to the folder between the two, e.g. a
// target turned into a directory); commit() then names the outputs already replaced.
class OutputSet {
 public:
  OutputSet() = default;
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;
  ~OutputSet();

  // Throws InputError naming `what` when the temporary cannot be created or written.
  void stage(const std::filesystem::path& path, std::string_view content, std::string what);
  // The same, the content written by `write` to a stream on the temporary (a large trace is then
  // never held in memory).
  void stage(const std::filesystem::path& path, std::string what, const std::function<void(std::ostream&)>& write);
  // The same for a writer that can only write to a file it names itself (a profiler's save()):
  // `write` is given the temporary's path, writes it whole or throws; the file is then flushed.
  void stage_by_path(const std::filesystem::path& path, std::string what,
                     const std::function<void(const std::filesystem::path&)>& write);
  // Renames every staged temporary into place; throws InputError naming the output that failed.
  void commit();

 private:
  struct Staged {
    std::filesystem::path target, temporary;
    std::string what;
  };
  int create_temporary(const std::filesystem::path& path, const std::string& what);
  static void finish_temporary(int fd, const std::string& what, const char* step, int err);
  std::vector<Staged> staged_;
};

}  // namespace trainplan
