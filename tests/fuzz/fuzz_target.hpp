// Fuzz targets of trainplan's loaders. Each target file defines LLVMFuzzerTestOneInput; it is built
// two ways: with libFuzzer (clang, `make fuzz`, tests/fuzz/CMakeLists.txt) to search for inputs
// that crash, hang or trip a sanitizer, and with replay_main.cpp (any compiler, `make test`) to run
// the committed corpus and every crash reproducer as a regression test.
//
// The contract under test: any byte string either loads or throws InputError (the CLI's exit 2
// with one line). Any other exception, a crash or a sanitizer report is a bug.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "sim/check.hpp"

namespace trainplan::fuzz {

inline std::string text_of(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

// Runs `f`, accepting InputError; anything else escapes and is reported as a crash.
template <class F>
void expect_loaded_or_input_error(F&& f) {
  try {
    f();
  } catch (const InputError&) {
  }
}

}  // namespace trainplan::fuzz
