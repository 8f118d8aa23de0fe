// Fuzz target: trainplan model files (models/*.json schema), then the layer graph built from them.
#include "fuzz_target.hpp"
#include "sim/json_reader.hpp"
#include "sim/layer_graph.hpp"
#include "sim/model_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainplan;
  fuzz::expect_loaded_or_input_error([&] {
    const ModelSpec m = parse_model(parse_json_text(fuzz::text_of(data, size), "fuzz.json"), "fuzz.json");
    const LayerGraph g(m, m.seq_len);
    (void)g.total_params();
  });
  return 0;
}
