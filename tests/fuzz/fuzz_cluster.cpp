// Fuzz target: cluster files (topologies/*.json schema).
#include "fuzz_target.hpp"
#include "sim/cluster.hpp"
#include "sim/json_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainplan;
  fuzz::expect_loaded_or_input_error([&] {
    const Cluster c = parse_cluster(parse_json_text(fuzz::text_of(data, size), "fuzz.json"), "fuzz.json");
    (void)c.max_gpus();
  });
  return 0;
}
