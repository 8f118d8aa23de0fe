#include "cli/dispatch.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
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

// What the terminate handler prefixes its line with ("trainplan predict"): set once, before the
// command runs, in the one process-wide place a terminate handler can read.
char g_prefix[96] = "trainplan";

// One line for an exception that nothing caught: one that left a worker thread or a destructor
// (std::terminate) or reached dispatch. Out of memory is said as such; the line is written with
// write(2) from a fixed buffer when even the message cannot be allocated.
int report_exception(std::exception_ptr e) {
  const char* kind = "internal error: ";
  std::string what = "unknown exception";
  int code = 1;
  try {
    if (e) std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    char line[256];
    const int n = std::snprintf(line, sizeof line,
                                "%s: out of memory (a memory limit below what these inputs need; trainplan's own "
                                "budget, see README, should have refused them first)\n",
                                g_prefix);
    if (n > 0) (void)!::write(STDERR_FILENO, line, std::min(sizeof line - 1, static_cast<std::size_t>(n)));
    return 1;
  } catch (const InputError& x) {
    kind = "";
    what = x.what();
    code = 2;
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {
  }
  std::cerr << g_prefix << ": " << kind << printable(what) << "\n" << std::flush;
  return code;
}

[[noreturn]] void on_terminate() {
  int code = 1;
  try {
    code = report_exception(std::current_exception());
  } catch (...) {
    static const char kLine[] = "trainplan: internal error: an exception escaped while another was reported\n";
    (void)!::write(STDERR_FILENO, kLine, sizeof kLine - 1);
  }
  std::_Exit(code);
}

}  // namespace

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
    std::cerr << fmt::format("trainplan: '{}' is not a command (see trainplan --help)\n", printable(args[0]));
    return 2;
  }
  const char* env_dir = std::getenv("TRAINPLAN_DATA_DIR");
  // A data folder that is not there is named as such, not as every built-in name being unknown.
  std::error_code ec;
  if (env_dir && !std::filesystem::is_directory(env_dir, ec)) {
    std::cerr << fmt::format("trainplan {}: environment TRAINPLAN_DATA_DIR={}: {}\n", printable(args[0]), printable(env_dir),
                             *env_dir ? "not a folder (it names where the built-in models/, topologies/ and software/ are)"
                                      : "empty (unset it, or name the folder of the built-in models/ and topologies/)");
    return 2;
  }
  Context ctx{env_dir ? env_dir : TRAINPLAN_DATA_DIR, std::cout, std::cerr, isatty(STDOUT_FILENO) == 1};
  std::snprintf(g_prefix, sizeof g_prefix, "trainplan %s", printable(args[0], 40).c_str());
  std::set_terminate(on_terminate);
  try {
    return it->second.run(Args(args.begin() + 1, args.end()), ctx);
  } catch (...) {
    return report_exception(std::current_exception());
  }
}

}  // namespace trainplan::cli
