// Fuzz target: Hugging Face config.json files (llama, mistral, qwen2, gpt2, gpt_neox).
#include "fuzz_target.hpp"
#include "sim/json_reader.hpp"
#include "sim/model_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainplan;
  fuzz::expect_loaded_or_input_error([&] {
    (void)parse_hf_config(parse_json_text(fuzz::text_of(data, size), "config.json"), "config.json");
  });
  return 0;
}
