// Fuzz target: prediction files (trainplan/prediction/v1), as compare and --plan read them.
#include "fuzz_target.hpp"
#include "reports/compare.hpp"
#include "sim/json_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainplan;
  fuzz::expect_loaded_or_input_error([&] {
    (void)prediction_from_json(parse_json_text(fuzz::text_of(data, size), "p.json"), "p.json");
  });
  return 0;
}
