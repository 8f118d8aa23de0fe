// The Hugging Face families with experts or latent attention (model_families.hpp), read with their
// exact public field names (transformers' configuration_<type>.py of each family):
//   mixtral     num_local_experts, num_experts_per_tok, intermediate_size (per expert), sliding_window
//   qwen2_moe   num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size
//               (one gated shared expert), decoder_sparse_step, mlp_only_layers, intermediate_size
//               (dense layers), use_sliding_window / sliding_window / max_window_layers
//   qwen3_moe   as qwen2_moe without the shared expert, with head_dim
//   deepseek_v3 n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
//   (kimi_k2)   first_k_dense_replace, moe_layer_freq, scoring_func, n_group, topk_group,
//               q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
//               num_nextn_predict_layers, intermediate_size (dense layers)
//   gpt_oss     num_local_experts, num_experts_per_tok (= experts_per_token), intermediate_size
//               (per expert), head_dim, sliding_window, layer_types; biased experts and router,
//               attention sinks
//   llama4      its text_config: num_local_experts, num_experts_per_tok, intermediate_size (per
//               expert and the one shared expert), intermediate_size_mlp (dense layers),
//               interleave_moe_layer_step or moe_layers, attention_chunk_size, no_rope_layers
//               (chunked attention on RoPE layers, full on the NoPE ones) or layer_types
#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "sim/model_families.hpp"

namespace trainplan::model_detail {

using nlohmann::json;

namespace {

// The bounds of a trainplan model file's keys (parse_model).
enum Bound : long long {
  kLayers = 100000, kHidden = 1 << 20, kHeads = 1 << 16, kFfn = 1 << 22, kVocab = 1 << 24, kSeq = 1 << 24,
  kExperts = 1 << 16
};

int int_of(const JsonObject& o, const char* key, long long hi, long long lo = 1) {
  return static_cast<int>(o.integer(key, lo, hi));
}
int optional_int(const JsonObject& o, const char* key, long long hi, int fallback, long long lo = 1) {
  return o.has_value(key) ? int_of(o, key, hi, lo) : fallback;
}

// The llama-style body every family here shares: RMSNorm, SwiGLU, RoPE, an optional head_dim.
// Returns the position limit (max_position_embeddings).
int read_llama_body(const JsonObject& o, ModelSpec& m) {
  m.layers = int_of(o, "num_hidden_layers", kLayers);
  m.hidden = int_of(o, "hidden_size", kHidden);
  m.heads = int_of(o, "num_attention_heads", kHeads);
  m.kv_heads = o.has_value("num_key_value_heads") ? int_of(o, "num_key_value_heads", kHeads) : m.heads;
  m.vocab = int_of(o, "vocab_size", kVocab);
  m.activation = Activation::swiglu;
  m.norm = Norm::rmsnorm;
  m.position = Position::rope;
  m.tied_embeddings = o.has_value("tie_word_embeddings") ? o.boolean("tie_word_embeddings") : false;
  return int_of(o, "max_position_embeddings", kSeq);
}

std::vector<int> int_list(const JsonObject& o, const char* key, int lo, int hi) {
  const json& v = o.raw(key);
  if (!v.is_array()) throw o.error(key, "must be an array of integers");
  std::vector<int> out;
  for (const json& x : v) {
    if (!x.is_number_integer() || x.get<long long>() < lo || x.get<long long>() > hi)
      throw o.error(key, fmt::format("must hold integers in [{}, {}]", lo, hi));
    out.push_back(x.get<int>());
  }
  return out;
}

// transformers' "layer_types": one attention type per layer, each one of `names` (in that order in
// the message).
std::vector<AttentionWindow> layer_types(const JsonObject& o, const char* key, int layers,
                                         std::initializer_list<std::pair<const char*, AttentionWindow>> names) {
  const json& v = o.raw(key);
  if (!v.is_array() || static_cast<int>(v.size()) != layers)
    throw o.error(key, fmt::format("must list one type per layer ({})", layers));
  std::vector<AttentionWindow> out;
  for (const json& t : v) out.push_back(window_named(o, key, t, names));
  return out;
}

// Layer indices as a sorted list without repeats.
std::vector<int> layer_indices(const JsonObject& o, const char* key, int layers) {
  std::vector<int> v = int_list(o, key, 0, layers - 1);
  std::sort(v.begin(), v.end());
  if (std::adjacent_find(v.begin(), v.end()) != v.end()) throw o.error(key, "must not repeat a layer");
  return v;
}

// The layers of 0..layers-1 not in `moe` (ascending).
std::vector<int> complement(const std::vector<int>& moe, int layers) {
  std::vector<int> out;
  for (int l = 0; l < layers; ++l)
    if (!std::binary_search(moe.begin(), moe.end(), l)) out.push_back(l);
  return out;
}

void read_router(const JsonObject& o, MoeSpec& e, const char* experts_key, const char* top_k_key) {
  e.experts = int_of(o, experts_key, kExperts);
  e.top_k = int_of(o, top_k_key, e.experts);
}

int parse_mixtral(const JsonObject& o, ModelSpec& m) {
  const int limit = read_llama_body(o, m);
  m.ffn_hidden = int_of(o, "intermediate_size", kFfn);
  read_router(o, m.moe, "num_local_experts", "num_experts_per_tok");
  m.moe.expert_ffn = m.ffn_hidden;
  if (o.has_value("sliding_window")) {
    m.sliding_window = int_of(o, "sliding_window", kSeq);
    m.layer_attention = {AttentionWindow::sliding};
  }
  return limit;
}

// Qwen2's sliding window (Qwen2Config): where use_sliding_window, the layers that layer_types names
// sliding_attention, or without layer_types those from max_window_layers on. Without
// use_sliding_window transformers sets the window to None and every layer is full, whatever
// layer_types says (which is still checked: it is read, never passed over).
void read_qwen_window(const JsonObject& o, ModelSpec& m) {
  std::vector<AttentionWindow> types;
  if (o.has_value("layer_types")) {
    types = layer_types(o, "layer_types", m.layers,
                        {{"sliding_attention", AttentionWindow::sliding}, {"full_attention", AttentionWindow::full}});
  }
  if (!o.has_value("use_sliding_window") || !o.boolean("use_sliding_window")) return;
  m.sliding_window = int_of(o, "sliding_window", kSeq);
  if (!types.empty()) {
    m.layer_attention = types;
    return;
  }
  const int first = o.has_value("max_window_layers") ? int_of(o, "max_window_layers", m.layers, 0) : 0;
  if (first >= m.layers) return;
  m.layer_attention.assign(static_cast<std::size_t>(m.layers), AttentionWindow::sliding);
  std::fill(m.layer_attention.begin(), m.layer_attention.begin() + first, AttentionWindow::full);
}

int parse_qwen_moe(const JsonObject& o, const std::string& type, ModelSpec& m) {
  const int limit = read_llama_body(o, m);
  m.ffn_hidden = int_of(o, "intermediate_size", kFfn);
  MoeSpec& e = m.moe;
  // transformers 5 keeps Qwen's num_experts as num_local_experts (attribute_map) and may save that
  // name: either is read, and both must agree.
  const bool local_name = !o.has_value("num_experts") && o.has_value("num_local_experts");
  read_router(o, e, local_name ? "num_local_experts" : "num_experts", "num_experts_per_tok");
  if (!local_name && o.has_value("num_local_experts") && o.integer("num_local_experts", 1, kExperts) != e.experts)
    throw o.error("num_local_experts", fmt::format("must equal num_experts ({}) where both are given", e.experts));
  e.expert_ffn = int_of(o, "moe_intermediate_size", kFfn);
  e.every = optional_int(o, "decoder_sparse_step", m.layers, 1);
  if (o.has_value("mlp_only_layers")) e.dense_layers = layer_indices(o, "mlp_only_layers", m.layers);
  if (type == "qwen2_moe" && o.has_value("shared_expert_intermediate_size")) {
    e.shared_ffn = int_of(o, "shared_expert_intermediate_size", kFfn, 0);
    e.shared_experts = e.shared_ffn > 0 ? 1 : 0;
    e.shared_gate = e.shared_experts > 0;  // Qwen2MoeSparseMoeBlock.shared_expert_gate
  }
  read_qwen_window(o, m);
  return limit;
}

int parse_deepseek(const JsonObject& o, ModelSpec& m) {
  const int limit = read_llama_body(o, m);
  m.ffn_hidden = int_of(o, "intermediate_size", kFfn);
  MlaSpec& a = m.mla;
  a.q_lora_rank = optional_int(o, "q_lora_rank", kFfn, 0, 0);  // null: queries straight from h
  a.kv_lora_rank = int_of(o, "kv_lora_rank", kFfn);
  a.qk_nope_head_dim = int_of(o, "qk_nope_head_dim", kHeads, 0);
  a.qk_rope_head_dim = int_of(o, "qk_rope_head_dim", kHeads);
  a.v_head_dim = int_of(o, "v_head_dim", kHeads);
  // transformers' DeepseekV3Config stores qk_rope_head_dim as head_dim; any other value is not ours.
  if (o.has_value("head_dim") && o.integer("head_dim", 1, kHeads) != a.qk_rope_head_dim)
    throw o.error("head_dim", fmt::format("must be absent or qk_rope_head_dim ({}) in a DeepSeek config", a.qk_rope_head_dim));
  m.explicit_head_dim = a.qk_head_dim();
  MoeSpec& e = m.moe;
  read_router(o, e, "n_routed_experts", "num_experts_per_tok");
  e.expert_ffn = int_of(o, "moe_intermediate_size", kFfn);
  e.shared_experts = optional_int(o, "n_shared_experts", kExperts, 0, 0);
  e.shared_ffn = e.shared_experts > 0 ? e.expert_ffn : 0;
  e.first_dense = optional_int(o, "first_k_dense_replace", m.layers, 0, 0);
  // MoE where l >= first_k_dense_replace and l % moe_layer_freq == 0 (modeling_deepseek.py).
  const int freq = optional_int(o, "moe_layer_freq", m.layers, 1);
  for (int l = e.first_dense; l < m.layers && freq > 1; ++l)
    if (l % freq != 0) e.dense_layers.push_back(l);
  if (o.has_value("scoring_func")) {
    e.scoring = o.choice("scoring_func", {"softmax", "sigmoid"}) == "softmax" ? RouterScoring::softmax : RouterScoring::sigmoid;
  }
  e.groups = optional_int(o, "n_group", e.experts, 1);
  e.topk_groups = optional_int(o, "topk_group", e.groups, 1);
  m.mtp_layers = optional_int(o, "num_nextn_predict_layers", 16, 0, 0);
  return limit;
}

int parse_gpt_oss(const JsonObject& o, ModelSpec& m) {
  const int limit = read_llama_body(o, m);
  m.ffn_hidden = int_of(o, "intermediate_size", kFfn);
  read_router(o, m.moe, "num_local_experts", "num_experts_per_tok");
  if (o.has_value("experts_per_token") && o.integer("experts_per_token", 1, kExperts) != m.moe.top_k)
    throw o.error("experts_per_token", fmt::format("must equal num_experts_per_tok ({})", m.moe.top_k));
  m.moe.expert_ffn = m.ffn_hidden;
  m.moe.expert_bias = m.moe.router_bias = true;  // GptOssExperts' biases, GptOssTopKRouter's bias
  m.attention_sinks = true;                      // GptOssAttention.sinks
  // GptOssExperts clamps gate and up to swiglu_limit (GptOssConfig's default 7.0).
  m.activation_clamp = o.has_value("swiglu_limit") ? o.number("swiglu_limit", 0, 1e6, true) : 7.0;
  m.sliding_window = int_of(o, "sliding_window", kSeq);
  if (o.has_value("layer_types")) {
    m.layer_attention = layer_types(o, "layer_types", m.layers,
                                    {{"sliding_attention", AttentionWindow::sliding}, {"full_attention", AttentionWindow::full}});
  } else {
    m.layer_attention = {AttentionWindow::sliding, AttentionWindow::full};  // GptOssConfig's default
  }
  return limit;
}

// Llama 4's attention windows: chunked on RoPE layers, full on NoPE ones (Llama4TextConfig:
// no_rope_layers, 1 = RoPE; default a NoPE layer every fourth), or the config's layer_types.
void read_llama4_windows(const JsonObject& o, ModelSpec& m) {
  m.attention_chunk = optional_int(o, "attention_chunk_size", kSeq, 8192);
  m.layer_attention.assign(static_cast<std::size_t>(m.layers), AttentionWindow::chunked);
  // transformers derives layer_types from no_rope_layers (itself from no_rope_layer_interval) and
  // saves all three: each given is checked, and the most explicit decides.
  const int interval = optional_int(o, "no_rope_layer_interval", m.layers, 4);
  std::vector<int> rope;
  if (o.has_value("no_rope_layers") && !o.raw("no_rope_layers").empty()) {  // [] means the default (transformers)
    rope = int_list(o, "no_rope_layers", 0, 1);
    if (static_cast<int>(rope.size()) != m.layers)
      throw o.error("no_rope_layers", fmt::format("must list one flag per layer ({})", m.layers));
  }
  if (o.has_value("layer_types")) {
    m.layer_attention = layer_types(o, "layer_types", m.layers,
                                    {{"chunked_attention", AttentionWindow::chunked}, {"full_attention", AttentionWindow::full}});
    return;
  }
  if (!rope.empty()) {
    for (int l = 0; l < m.layers; ++l)
      if (rope[l] == 0) m.layer_attention[l] = AttentionWindow::full;
    return;
  }
  for (int l = 0; l < m.layers; ++l)
    if ((l + 1) % interval == 0) m.layer_attention[l] = AttentionWindow::full;
}

int parse_llama4_text(const JsonObject& o, ModelSpec& m) {
  const int limit = read_llama_body(o, m);
  m.ffn_hidden = int_of(o, "intermediate_size_mlp", kFfn);
  MoeSpec& e = m.moe;
  read_router(o, e, "num_local_experts", "num_experts_per_tok");
  e.expert_ffn = int_of(o, "intermediate_size", kFfn);
  e.shared_experts = 1;  // Llama4TextMoe.shared_expert, of the experts' width
  e.shared_ffn = e.expert_ffn;
  e.scoring = RouterScoring::sigmoid;  // Llama4Router: sigmoid of the top-k logits
  // transformers derives moe_layers from interleave_moe_layer_step and saves both; moe_layers decides.
  const int step = optional_int(o, "interleave_moe_layer_step", m.layers, 1);
  if (o.has_value("moe_layers")) {
    e.dense_layers = complement(layer_indices(o, "moe_layers", m.layers), m.layers);
  } else {
    e.every = step;
  }
  read_llama4_windows(o, m);
  return limit;
}

// Keys of a feature a dense family does not have (expert routing, latent attention, MTP).
constexpr const char* kExtendedKeys[] = {
    "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "experts_per_token",
    "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace",
    "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", "moe_layers", "kv_lora_rank",
    "q_lora_rank", "num_nextn_predict_layers"};

// A key whose value says the feature is absent: null, 0, false or an empty list.
bool absent_value(const json& v) {
  return v.is_null() || (v.is_number() && v.get<double>() == 0) || (v.is_boolean() && !v.get<bool>()) ||
         (v.is_array() && v.empty());
}

// Keys that set a part of the architecture in one of the families above: each family's reader asks
// for its own, and one it never asked for is another family's (a Qwen2-MoE shared expert in a
// qwen3_moe config, DeepSeek's dense first layers in a mixtral one) and is refused, not ignored.
constexpr const char* kLayoutKeys[] = {
    "mlp_only_layers", "n_group", "topk_group", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "no_rope_layers", "attention_chunk_size", "intermediate_size_mlp", "swiglu_limit"};

// A value that sets nothing: absent_value, or 1 for a key whose 1 is "every layer" or "one group".
bool neutral_value(const std::string& key, const json& v) {
  if (absent_value(v)) return true;
  const bool one_is_default = key == "decoder_sparse_step" || key == "moe_layer_freq" ||
                              key == "interleave_moe_layer_step" || key == "n_group" || key == "topk_group";
  return one_is_default && v.is_number_integer() && v.get<long long>() == 1;
}

// `what` names the object read ("a mixtral config").
void refuse_unread_layout_keys(const JsonObject& o, const std::string& what) {
  auto check = [&](const char* key) {
    if (o.asked(key) || !o.has_value(key) || neutral_value(key, o.raw(key))) return;
    throw o.error(key, fmt::format("is not a key of {} (another family's expert, latent-attention, "
                                   "attention-window or activation setting), and trainplan will not ignore it",
                                   what));
  };
  for (const char* key : kExtendedKeys) check(key);
  for (const char* key : kLayoutKeys) check(key);
}

}  // namespace

bool is_extended_hf_type(const std::string& type) {
  for (const char* t : {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss", "llama4", "llama4_text"})
    if (type == t) return true;
  return false;
}

int parse_extended_hf(const JsonObject& o, const std::string& type, ModelSpec& m, std::string& limit_key) {
  limit_key = "max_position_embeddings";
  int limit = 0;
  if (type == "mixtral") limit = parse_mixtral(o, m);
  else if (type == "qwen2_moe" || type == "qwen3_moe") limit = parse_qwen_moe(o, type, m);
  else if (type == "deepseek_v3" || type == "kimi_k2") limit = parse_deepseek(o, m);
  else if (type == "gpt_oss") limit = parse_gpt_oss(o, m);
  else if (type == "llama4_text") limit = parse_llama4_text(o, m);
  else if (type != "llama4") throw o.error("model_type", "is not a family with experts or latent attention");
  if (type == "llama4") {
    const JsonObject t = o.object("text_config");
    limit = parse_llama4_text(t, m);
    limit_key = "text_config.max_position_embeddings";
    if (t.has_value("head_dim")) m.explicit_head_dim = int_of(t, "head_dim", kHeads);
    read_linear_biases(t, type, m);
    refuse_unread_layout_keys(t, "a llama4 text_config");
    // The text model is read from text_config alone: the same key beside it would be ignored.
    for (const std::string& key : o.keys()) {
      if (key == "tie_word_embeddings" || !t.asked(key) || !o.has_value(key)) continue;
      throw o.error(key, fmt::format("belongs in text_config, which a llama4 config's text model is read from "
                                     "(text_config.{} is the one read)",
                                     key));
    }
  } else {
    if (type != "deepseek_v3" && type != "kimi_k2" && o.has_value("head_dim")) {
      m.explicit_head_dim = int_of(o, "head_dim", kHeads);
    }
    read_linear_biases(o, type, m);
    check_layer_types_record(o, type, m);
    refuse_unread_layout_keys(o, "a " + type + " config");
  }
  compact_attention_pattern(m.layer_attention);
  if (m.layer_attention.empty()) m.sliding_window = m.attention_chunk = 0;  // every layer full
  return limit;
}

void check_layer_types_record(const JsonObject& o, const std::string& type, const ModelSpec& m) {
  if (o.asked("layer_types") || !o.has_value("layer_types")) return;
  const std::vector<AttentionWindow> said =
      layer_types(o, "layer_types", m.layers,
                  {{"full_attention", AttentionWindow::full}, {"sliding_attention", AttentionWindow::sliding},
                   {"chunked_attention", AttentionWindow::chunked}});
  for (int l = 0; l < m.layers; ++l) {
    // The window the family's keys give layer l, however long the sequence.
    const AttentionWindow runs = m.layer_attention_at(l, std::numeric_limits<int>::max());
    if (said[static_cast<std::size_t>(l)] == runs) continue;
    const bool windowed = type == "mistral" || type == "mixtral";
    throw o.error("layer_types", fmt::format("names {} attention for layer {}, but a {} model runs {} attention there "
                                             "({}; transformers does not read layer_types for it)",
                                             to_string(said[static_cast<std::size_t>(l)]), l, type, to_string(runs),
                                             windowed ? "sliding_window gives every layer one window"
                                                      : "every layer attends over the whole sequence"));
  }
}

void refuse_extended_keys(const JsonObject& o, const std::string& type) {
  for (const char* key : kExtendedKeys) {
    if (!o.has_value(key) || absent_value(o.raw(key))) continue;
    throw o.error(key, fmt::format("is a mixture-of-experts or latent-attention key, which a {} config does not have; "
                                   "trainplan reads such models as model_type mixtral|qwen2_moe|qwen3_moe|deepseek_v3|"
                                   "kimi_k2|gpt_oss|llama4 and will not load this one as a dense model",
                                   type));
  }
  refuse_unread_layout_keys(o, "a " + type + " config");
  // A window where the family's model has none: transformers passes over the key for this type.
  const bool windowed = type == "mistral" || type == "qwen2";
  if (!windowed && o.has_value("sliding_window") && !absent_value(o.raw("sliding_window")))
    throw o.error("sliding_window", fmt::format("is not read by a {} model, which attends over the whole sequence on "
                                                "every layer; model_type mistral or qwen2 reads it",
                                                type));
}

void read_linear_biases(const JsonObject& o, const std::string& type, ModelSpec& m) {
  const bool qwen2 = type == "qwen2" || type == "qwen2_moe", gpt = m.norm == Norm::layernorm;
  const bool reads_attention = !qwen2 && !gpt && type != "mistral" && type != "mixtral";
  // The family's biases where its config says nothing.
  LinearBiases b{qwen2 || gpt || type == "gpt_oss", gpt || type == "gpt_oss", gpt};
  const char* fixed = qwen2 ? "Q, K and V projections always have biases and O and the MLP none"
                      : gpt ? "linears all have biases"
                            : "linears have no biases";
  auto refuse_unless = [&](const char* key, bool value) {
    if (o.has_value(key) && o.boolean(key) != value)
      throw o.error(key, fmt::format("is not a key of a {} config, whose {}", type, fixed));
  };
  if (reads_attention && o.has_value("attention_bias")) b.qkv = b.out = o.boolean("attention_bias");
  if (!reads_attention) refuse_unless("attention_bias", b.out);
  if (type == "llama" && o.has_value("mlp_bias")) b.mlp = o.boolean("mlp_bias");
  if (type != "llama") refuse_unless("mlp_bias", b.mlp);
  if ((type == "deepseek_v3" || type == "kimi_k2") && b.qkv)
    throw o.error("attention_bias", "biases on multi-head latent attention's projections are not modelled");
  if (b != m.linear_biases()) m.biases = b;
}

void read_dense_sliding_window(const JsonObject& o, const std::string& type, ModelSpec& m) {
  if (type == "mistral") {
    if (!o.has_value("sliding_window")) return;
    m.sliding_window = int_of(o, "sliding_window", kSeq);
    m.layer_attention = {AttentionWindow::sliding};
  } else if (type == "qwen2") {
    read_qwen_window(o, m);
    compact_attention_pattern(m.layer_attention);
  }
}

}  // namespace trainplan::model_detail
