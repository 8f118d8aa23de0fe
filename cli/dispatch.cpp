#include "cli/dispatch.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

// Writes "PREFIX: KIND TEXT" as one line without allocating (memory may be what ran out): bytes
// that printable() would escape become '?', and the text is cut to fit a fixed buffer.
void write_line_without_memory(const char* kind, const char* text) {
  char line[512];
  int n = std::snprintf(line, sizeof line, "%s: %s", g_prefix, kind);
  for (const char* p = text; *p && n >= 0 && n < static_cast<int>(sizeof line) - 1; ++p) {
    const auto b = static_cast<unsigned char>(*p);
    line[n++] = b < 0x20 || b >= 0x7f ? '?' : static_cast<char>(b);
  }
  n = std::max(0, std::min(n, static_cast<int>(sizeof line) - 1));
  line[n++] = '\n';
  (void)!::write(STDERR_FILENO, line, static_cast<std::size_t>(n));
}

// One line for an exception that nothing caught: one that left a worker thread or a destructor
// (std::terminate) or reached dispatch; returns the exit status. Out of memory is said as such.
int report_exception(std::exception_ptr e) noexcept {
  const char* kind = "internal error: ";
  // No exception to show: std::terminate from a destructor or a thread object still running while
  // an exception unwound the stack (e.g. a search whose calling thread ran out of memory).
  const char* what = std::uncaught_exceptions() > 0
                         ? "std::terminate while an exception unwound the stack (a worker thread was still running)"
                         : "std::terminate was called without an exception";
  int code = 1;
  try {
    if (e) std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    write_line_without_memory("out of memory (a memory limit below what these inputs need; trainplan's own budget, "
                              "see README, should have refused them first)", "");
    return 1;
  } catch (const InputError& x) {
    kind = "";
    what = x.what();
    code = 2;
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {
    what = "an exception of unknown type";
  }
  try {
    const std::string line = std::string(g_prefix) + ": " + kind + printable(what) + "\n";  // written at once
    std::cout.flush();
    (void)!::write(STDERR_FILENO, line.data(), line.size());
  } catch (...) {
    write_line_without_memory(kind, what);
  }
  return code;
}

// Threads that fail at once all call it; the first one's line is the process's last word.
[[noreturn]] void on_terminate() {
  static std::atomic<bool> reported{false};
  if (reported.exchange(true)) {
    for (;;) ::pause();  // the first one ends the process
  }
  std::_Exit(report_exception(std::current_exception()));
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
