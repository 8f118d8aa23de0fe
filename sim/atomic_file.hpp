// Output files that are either complete or absent: content goes to a temporary file in the same
// folder, is flushed, then renamed over the target (rename(2) is atomic within one file system).
// A failure leaves no temporary behind and the previous file, if any, untouched.
#pragma once
#include <filesystem>
#include <string_view>

namespace trainplan {

// Throws InputError naming `what` (e.g. "--json out.json") when `path` cannot be an output file:
// it names a folder (a directory, or a path ending in "/", "." or ".."), or its folder is missing
// or not writable, or its name (or its temporary's, see below) is too long. Creates and changes nothing, so a
// command can check every output before it starts work.
void check_output_path(const std::filesystem::path& path, std::string_view what);

// Writes `content` to `path` atomically (see above). Throws InputError naming `what` on failure.
void write_file_atomically(const std::filesystem::path& path, std::string_view content, std::string_view what);

}  // namespace trainplan
