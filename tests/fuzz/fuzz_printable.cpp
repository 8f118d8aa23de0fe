// Fuzz target: printable(), the one rule for every error line and for every string from a file
// or the command line that the console output shows (sim/check.hpp). For any bytes the result
// holds no control character and no invalid UTF-8, has at most kMaxShownLine characters (at most
// 4 bytes each), and showing it again changes nothing. A violation aborts (a crash to libFuzzer).
#include <cstdlib>
#include <string>

#include "fuzz_target.hpp"
#include "sim/check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainplan;
  const std::string shown = printable(fuzz::text_of(data, size));
  if (has_control_characters(shown) || shown.size() > 4 * kMaxShownLine || printable(shown) != shown) std::abort();
  return 0;
}
