#include "cli/dispatch.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "sim/check.hpp"

// The release, from cli/CMakeLists.txt.
#ifndef TRAINPLAN_VERSION
#define TRAINPLAN_VERSION "unknown"
#endif

namespace trainplan::cli {

namespace {

void usage(std::ostream& os, const CommandTable& commands, const char* title) {
  os << title << "\n\nusage: trainplan <command> [flags]     (trainplan <command> --help for its flags)\n\ncommands:\n";
  for (const auto& [name, c] : commands) os << fmt::format("  {:<10} {}\n", name, c.summary);
  os << "\n  --version  print trainplan's version\n";
  os << "\nenvironment: TRAINPLAN_DATA_DIR overrides where built-in models/ and topologies/ are read.\n";
}

}  // namespace

// The message as one printable line: a control character (a newline or terminal escape in a flag
// value or file name) is shown as \xNN, so the error is exactly one line and cannot drive the terminal.
std::string one_line(const std::string& message) {
  std::string out;
  for (unsigned char ch : message) {
    if (ch < 0x20 || ch == 0x7f) {
      out += fmt::format("\\x{:02x}", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

int dispatch(int argc, char** argv, const CommandTable& commands, const char* title) {
  Args args(argv + 1, argv + argc);
  // No command is bad input like any other: one line on stderr, exit 2 (the usage is --help's).
  if (args.empty()) {
    std::cerr << "trainplan: a command is required: trainplan <command> [flags] (see trainplan --help)\n";
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    usage(std::cout, commands, title);
    return 0;
  }
  if (args[0] == "--version" || args[0] == "version") {
    std::cout << "trainplan " << TRAINPLAN_VERSION << "\n";
    return 0;
  }
  auto it = commands.find(args[0]);
  if (it == commands.end()) {
    std::cerr << fmt::format("trainplan: '{}' is not a command (see trainplan --help)\n", one_line(args[0]));
    return 2;
  }
  const char* env_dir = std::getenv("TRAINPLAN_DATA_DIR");
  // A data folder that is not there is named as such, not as every built-in name being unknown.
  std::error_code ec;
  if (env_dir && !std::filesystem::is_directory(env_dir, ec)) {
    std::cerr << fmt::format("trainplan {}: environment TRAINPLAN_DATA_DIR={}: {}\n", one_line(args[0]), one_line(env_dir),
                             *env_dir ? "not a folder (it names where the built-in models/, topologies/ and software/ are)"
                                      : "empty (unset it, or name the folder of the built-in models/ and topologies/)");
    return 2;
  }
  Context ctx{env_dir ? env_dir : TRAINPLAN_DATA_DIR, std::cout, std::cerr, isatty(STDOUT_FILENO) == 1};
  try {
    return it->second.run(Args(args.begin() + 1, args.end()), ctx);
  } catch (const InputError& e) {
    std::cerr << "trainplan " << args[0] << ": " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "trainplan " << args[0] << ": internal error: " << one_line(e.what()) << "\n";
    return 1;
  }
}

}  // namespace trainplan::cli
