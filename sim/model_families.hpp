// The parts of model loading beyond a dense MHA/GQA transformer (internal to model_spec.cpp):
// mixture of experts, multi-head latent attention, per-layer attention windows and multi-token
// prediction, in the trainplan model format and in the Hugging Face families that have them
// (mixtral, qwen2_moe, qwen3_moe, deepseek_v3 and kimi_k2, gpt_oss, llama4).
#pragma once
#include <string>

#include "sim/json_reader.hpp"
#include "sim/model_spec.hpp"

namespace trainplan::model_detail {

// The optional trainplan model-file keys "moe", "mla", "layer_attention", "sliding_window",
// "attention_chunk", "attention_sinks" and "mtp_layers" into `m` (its layers and heads already
// read); checks them with check_extensions.
void read_model_extensions(const JsonObject& o, ModelSpec& m);
// Their JSON, added to a trainplan model object (only the keys a model sets).
void extensions_to_json(const ModelSpec& m, nlohmann::json& j);

// Checks that relate the extensions to the rest of the model: `o` names the fields (the keys of
// the file being read, given by `keys`).
struct ExtensionKeys {
  const char* experts = "moe.experts";  // nullptr: the experts are checked elsewhere (check_moe)
  const char* top_k = "moe.top_k";
  const char* layers = "layers";
  const char* kv_heads = "kv_heads";
};
void check_extensions(const ModelSpec& m, const JsonObject& o, const ExtensionKeys& keys = {});
// The router's groups divide the experts, top_k experts lie within the best topk_groups groups, and
// some layer is an MoE layer; `o` holds the two keys named.
void check_moe(const ModelSpec& m, const JsonObject& o, const char* experts_key, const char* top_k_key);

// The attention window `name` (a JSON value read under `key`) stands for among `names`; anything
// else is refused naming the choices ("must hold only full|sliding").
AttentionWindow window_named(const JsonObject& o, const std::string& key, const nlohmann::json& name,
                             std::initializer_list<std::pair<const char*, AttentionWindow>> names);

// A per-layer attention pattern as its shortest cycle ({sliding, full} x 18 -> {sliding, full}),
// and none where every layer is full: one spelling for one architecture.
void compact_attention_pattern(std::vector<AttentionWindow>& pattern);

// Whether parse_hf_config reads `type` here (the MoE and MLA families) rather than as a dense one.
bool is_extended_hf_type(const std::string& type);
// Reads a config of such a type into `m` (name and training length are left to the caller);
// returns the longest sequence its positions allow, and sets `limit_key` to the key it read that
// from. Llama 4's text_config is read in place of the top-level object.
int parse_extended_hf(const JsonObject& o, const std::string& type, ModelSpec& m, std::string& limit_key);
// A dense family's config (llama, mistral, qwen2, gpt2, gpt_neox) must carry no expert or latent-
// attention key: such a key is refused with the families that have it, never ignored (a Mixtral
// config relabelled "mistral" would otherwise load as a 7B dense model). So are the other families'
// layout keys (Llama 4's chunks, DeepSeek's head widths and groups, Qwen's dense-layer list) and a
// sliding_window under a family whose model has no window (llama, gpt2, gpt_neox).
void refuse_extended_keys(const JsonObject& o, const std::string& type);
// The dense linears' biases of a config of `type` (transformers' modeling_<type>.py):
//   llama (attention_bias: Q, K, V and O; mlp_bias), qwen3_moe, llama4 and gpt_oss (attention_bias;
//   GptOssConfig's default true); mistral and mixtral: none, no key; qwen2 and qwen2_moe: Q, K and V
//   always, O and the MLP never (Qwen2Attention), no key; deepseek_v3 / kimi_k2: attention_bias
//   (MLA's latent projections) true is refused, not modelled; gpt2, gpt_neox: every linear (the
//   LayerNorm default), no key. A key the family does not read is refused where its value says
//   otherwise.
void read_linear_biases(const JsonObject& o, const std::string& type, ModelSpec& m);
// "layer_types" in a config whose family's model does not read it (llama, mistral, mixtral,
// deepseek_v3, kimi_k2, gpt2, gpt_neox): transformers may save it as a record of each layer's
// window (and warns for a mistral config that carries it). It is read and checked against the
// windows the family's own keys give (`m.layer_attention`, sliding_window); a layer it names
// otherwise is refused, never passed over. A reader that took the windows from it asked for it.
void check_layer_types_record(const JsonObject& o, const std::string& type, const ModelSpec& m);
// The sliding window of a dense family's config: Mistral's "sliding_window" (every layer), Qwen2's
// when "use_sliding_window" (layers from "max_window_layers" on). Null or absent: none.
void read_dense_sliding_window(const JsonObject& o, const std::string& type, ModelSpec& m);

}  // namespace trainplan::model_detail
