// Errors. InputError: the user's input is wrong (the CLI turns it into exit code 2 and one line).
// TRAINPLAN_CHECK: an internal invariant; stays on in release builds and throws std::logic_error.
#pragma once
#include <stdexcept>
#include <string>

namespace trainplan {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace trainplan

#define TRAINPLAN_CHECK(cond, msg)                                           \
  do {                                                                       \
    if (!(cond)) ::trainplan::check_failed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
