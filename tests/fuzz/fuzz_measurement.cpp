// Fuzz target: measurement files (trainplan/measurement/v1), as compare reads them.
#include "fuzz_target.hpp"
#include "reports/measurement_json.hpp"
#include "sim/json_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainplan;
  fuzz::expect_loaded_or_input_error([&] {
    (void)measurement_from_json(parse_json_text(fuzz::text_of(data, size), "m.json"), "m.json");
  });
  return 0;
}
