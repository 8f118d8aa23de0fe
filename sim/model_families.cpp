#include "sim/model_families.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace trainplan {

// ---- ModelSpec's per-layer rules ---------------------------------------------------------------

bool ModelSpec::is_moe_layer(int l) const {
  if (!moe.on() || l < moe.first_dense) return false;
  if ((l - moe.first_dense + 1) % moe.every != 0) return false;
  return !std::binary_search(moe.dense_layers.begin(), moe.dense_layers.end(), l);
}

AttentionWindow ModelSpec::layer_attention_at(int l, int seq) const {
  if (layer_attention.empty()) return AttentionWindow::full;
  const AttentionWindow w = layer_attention[static_cast<std::size_t>(l) % layer_attention.size()];
  if (w == AttentionWindow::sliding && sliding_window >= seq) return AttentionWindow::full;
  if (w == AttentionWindow::chunked && attention_chunk >= seq) return AttentionWindow::full;
  return w;
}

const char* to_string(AttentionWindow w) {
  switch (w) {
    case AttentionWindow::full: return "full";
    case AttentionWindow::sliding: return "sliding";
    case AttentionWindow::chunked: return "chunked";
  }
  return "?";
}

const char* to_string(RouterScoring r) { return r == RouterScoring::softmax ? "softmax" : "sigmoid"; }

namespace model_detail {

using nlohmann::json;

namespace {

constexpr long long kMaxWidth = 1 << 22;   // as a model file's ffn_hidden
constexpr long long kMaxExperts = 1 << 16;

// An array of layer indices in [0, layers), strictly ascending after sorting, without repeats.
std::vector<int> layer_list(const JsonObject& o, const std::string& key, int layers) {
  const json& v = o.raw(key);
  if (!v.is_array()) throw o.error(key, "must be an array of layer indices");
  std::vector<int> out;
  for (const json& x : v) {
    if (!x.is_number_integer() || x.get<long long>() < 0 || x.get<long long>() >= layers)
      throw o.error(key, fmt::format("must hold layer indices in [0, {}]", layers - 1));
    out.push_back(x.get<int>());
  }
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) throw o.error(key, "must not repeat a layer");
  return out;
}

void read_moe_object(const JsonObject& o, ModelSpec& m) {
  MoeSpec& e = m.moe;
  e.experts = static_cast<int>(o.integer("experts", 1, kMaxExperts));
  e.top_k = static_cast<int>(o.integer("top_k", 1, e.experts));
  e.expert_ffn = static_cast<int>(o.integer("expert_ffn", 1, kMaxWidth));
  if (o.has("shared_experts")) e.shared_experts = static_cast<int>(o.integer("shared_experts", 0, kMaxExperts));
  if (e.shared_experts > 0) e.shared_ffn = static_cast<int>(o.integer("shared_ffn", 1, kMaxWidth));
  else if (o.has("shared_ffn")) throw o.error("shared_ffn", "needs shared_experts >= 1");
  if (o.has("first_dense")) e.first_dense = static_cast<int>(o.integer("first_dense", 0, m.layers));
  if (o.has("every")) e.every = static_cast<int>(o.integer("every", 1, m.layers));
  if (o.has("dense_layers")) e.dense_layers = layer_list(o, "dense_layers", m.layers);
  if (o.has("router")) {
    e.scoring = o.choice("router", {"softmax", "sigmoid"}) == "softmax" ? RouterScoring::softmax : RouterScoring::sigmoid;
  }
  if (o.has("groups")) e.groups = static_cast<int>(o.integer("groups", 1, e.experts));
  if (o.has("topk_groups")) e.topk_groups = static_cast<int>(o.integer("topk_groups", 1, e.groups));
  if (o.has("expert_bias")) e.expert_bias = o.boolean("expert_bias");
  if (o.has("router_bias")) e.router_bias = o.boolean("router_bias");
  if (o.has("shared_gate")) e.shared_gate = o.boolean("shared_gate");
  o.finish();
  check_moe(m, o, "experts", "top_k");
}

void read_mla_object(const JsonObject& o, ModelSpec& m) {
  MlaSpec& a = m.mla;
  if (o.has("q_lora_rank")) a.q_lora_rank = static_cast<int>(o.integer("q_lora_rank", 0, kMaxWidth));
  a.kv_lora_rank = static_cast<int>(o.integer("kv_lora_rank", 1, kMaxWidth));
  a.qk_nope_head_dim = static_cast<int>(o.integer("qk_nope_head_dim", 0, 1 << 16));
  a.qk_rope_head_dim = static_cast<int>(o.integer("qk_rope_head_dim", 1, 1 << 16));
  a.v_head_dim = static_cast<int>(o.integer("v_head_dim", 1, 1 << 16));
  if (a.qk_rope_head_dim % 2 != 0) throw o.error("qk_rope_head_dim", "must be even (RoPE rotates pairs of channels)");
  o.finish();
}

}  // namespace

AttentionWindow window_named(const JsonObject& o, const std::string& key, const json& name,
                             std::initializer_list<std::pair<const char*, AttentionWindow>> names) {
  for (const auto& [n, w] : names)
    if (name.is_string() && name == n) return w;
  std::string list;
  for (const auto& [n, w] : names) {
    if (!list.empty()) list += '|';
    list += n;
  }
  throw o.error(key, fmt::format("must hold only {}", list));
}

namespace {

std::vector<AttentionWindow> window_list(const JsonObject& o, const std::string& key,
                                         std::initializer_list<std::pair<const char*, AttentionWindow>> names) {
  const json& v = o.raw(key);
  if (!v.is_array() || v.empty()) throw o.error(key, "must be a non-empty array");
  std::vector<AttentionWindow> out;
  for (const json& x : v) {
    if (!x.is_string()) throw o.error(key, "must be an array of strings");
    out.push_back(window_named(o, key, x, names));
  }
  return out;
}

// The number of MoE layers of `m` (is_moe_layer).
int moe_layer_count(const ModelSpec& m) {
  int n = 0;
  for (int l = 0; l < m.layers; ++l) n += m.is_moe_layer(l) ? 1 : 0;
  return n;
}

bool uses(const ModelSpec& m, AttentionWindow w) {
  return std::find(m.layer_attention.begin(), m.layer_attention.end(), w) != m.layer_attention.end();
}

}  // namespace

void check_moe(const ModelSpec& m, const JsonObject& o, const char* experts_key, const char* top_k_key) {
  const MoeSpec& e = m.moe;
  if (!e.on()) return;
  if (e.experts % e.groups != 0) throw o.error(experts_key, fmt::format("must be divisible by the router's groups ({})", e.groups));
  const long long reachable = static_cast<long long>(e.topk_groups) * (e.experts / e.groups);
  if (e.top_k > reachable) {
    throw o.error(top_k_key, fmt::format("must be at most the experts of the best {} of {} groups ({})", e.topk_groups,
                                         e.groups, reachable));
  }
  if (moe_layer_count(m) == 0) throw o.error(experts_key, "no layer is an MoE layer (first_dense, every, dense_layers)");
}

void compact_attention_pattern(std::vector<AttentionWindow>& p) {
  if (std::all_of(p.begin(), p.end(), [](AttentionWindow w) { return w == AttentionWindow::full; })) {
    p.clear();
    return;
  }
  for (std::size_t period = 1; period < p.size(); ++period) {
    bool repeats = true;
    for (std::size_t i = period; i < p.size() && repeats; ++i) repeats = p[i] == p[i % period];
    if (repeats) {
      p.resize(period);
      return;
    }
  }
}

void check_extensions(const ModelSpec& m, const JsonObject& o, const ExtensionKeys& keys) {
  if (keys.experts) check_moe(m, o, keys.experts, keys.top_k);
  if (m.mla.on()) {
    if (m.kv_heads != m.heads) {
      throw o.error(keys.kv_heads, fmt::format("must equal the heads ({}) with multi-head latent attention (each head "
                                               "has its own key and value)", m.heads));
    }
    if (m.mla.qk_rope_head_dim % 2 != 0) throw o.error("qk_rope_head_dim", "must be even (RoPE rotates pairs of channels)");
  }
  if (static_cast<int>(m.layer_attention.size()) > m.layers)
    throw o.error("layer_attention", fmt::format("must have at most one entry per layer ({})", m.layers));
  if (uses(m, AttentionWindow::sliding) && m.sliding_window <= 0)
    throw o.error("sliding_window", "is required where a layer's attention is sliding");
  if (uses(m, AttentionWindow::chunked) && m.attention_chunk <= 0)
    throw o.error("attention_chunk", "is required where a layer's attention is chunked");
}

void read_model_extensions(const JsonObject& o, ModelSpec& m) {
  if (o.has("moe")) read_moe_object(o.object("moe"), m);
  if (o.has("mla")) {
    read_mla_object(o.object("mla"), m);
    if (m.explicit_head_dim > 0 && m.explicit_head_dim != m.mla.qk_head_dim()) {
      throw o.error("head_dim", fmt::format("must be absent or qk_nope_head_dim + qk_rope_head_dim ({}) with mla",
                                            m.mla.qk_head_dim()));
    }
    m.explicit_head_dim = m.mla.qk_head_dim();
  }
  if (o.has("sliding_window")) m.sliding_window = static_cast<int>(o.integer("sliding_window", 1, 1 << 24));
  if (o.has("attention_chunk")) m.attention_chunk = static_cast<int>(o.integer("attention_chunk", 1, 1 << 24));
  if (o.has("layer_attention")) {
    m.layer_attention = window_list(o, "layer_attention", {{"full", AttentionWindow::full},
                                                           {"sliding", AttentionWindow::sliding},
                                                           {"chunked", AttentionWindow::chunked}});
  } else if (m.sliding_window > 0 || m.attention_chunk > 0) {
    // A window without a pattern applies to every layer; both would leave the pattern unsaid.
    if (m.sliding_window > 0 && m.attention_chunk > 0)
      throw o.error("layer_attention", "is required with both sliding_window and attention_chunk");
    m.layer_attention = {m.sliding_window > 0 ? AttentionWindow::sliding : AttentionWindow::chunked};
  }
  if (m.sliding_window > 0 && !uses(m, AttentionWindow::sliding))
    throw o.error("sliding_window", "is given but no layer's attention is sliding (layer_attention)");
  compact_attention_pattern(m.layer_attention);
  if (m.attention_chunk > 0 && !uses(m, AttentionWindow::chunked))
    throw o.error("attention_chunk", "is given but no layer's attention is chunked (layer_attention)");
  if (o.has("attention_sinks")) m.attention_sinks = o.boolean("attention_sinks");
  if (o.has("activation_clamp")) {
    m.activation_clamp = o.number("activation_clamp", 0, 1e6, true);
    if (m.activation != Activation::swiglu)
      throw o.error("activation_clamp", "clamps a gated activation's two halves; activation must be swiglu");
  }
  if (o.has("rope_attention_factor")) {
    m.rope_attention_factor = o.number("rope_attention_factor", 0, 100, true);
    if (m.position != Position::rope)
      throw o.error("rope_attention_factor", "scales RoPE's cos and sin tables; position must be rope");
  }
  if (o.has("mtp_layers")) m.mtp_layers = static_cast<int>(o.integer("mtp_layers", 0, 16));
  check_extensions(m, o, ExtensionKeys{.experts = nullptr});  // the moe object's checked as it was read
}

void extensions_to_json(const ModelSpec& m, json& j) {
  if (m.moe.on()) {
    const MoeSpec& e = m.moe;
    json moe{{"experts", e.experts}, {"top_k", e.top_k}, {"expert_ffn", e.expert_ffn}};
    if (e.shared_experts > 0) moe["shared_experts"] = e.shared_experts, moe["shared_ffn"] = e.shared_ffn;
    if (e.first_dense > 0) moe["first_dense"] = e.first_dense;
    if (e.every > 1) moe["every"] = e.every;
    if (!e.dense_layers.empty()) moe["dense_layers"] = e.dense_layers;
    moe["router"] = to_string(e.scoring);
    if (e.groups > 1) moe["groups"] = e.groups, moe["topk_groups"] = e.topk_groups;
    if (e.expert_bias) moe["expert_bias"] = true;
    if (e.router_bias) moe["router_bias"] = true;
    if (e.shared_gate) moe["shared_gate"] = true;
    j["moe"] = moe;
  }
  if (m.mla.on()) {
    j["mla"] = {{"q_lora_rank", m.mla.q_lora_rank},           {"kv_lora_rank", m.mla.kv_lora_rank},
                {"qk_nope_head_dim", m.mla.qk_nope_head_dim}, {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                {"v_head_dim", m.mla.v_head_dim}};
    j.erase("head_dim");  // implied by the MLA head dims
  }
  if (!m.layer_attention.empty()) {
    json list = json::array();
    for (AttentionWindow w : m.layer_attention) list.push_back(to_string(w));
    j["layer_attention"] = list;
  }
  if (m.sliding_window > 0) j["sliding_window"] = m.sliding_window;
  if (m.attention_chunk > 0) j["attention_chunk"] = m.attention_chunk;
  if (m.attention_sinks) j["attention_sinks"] = true;
  if (m.activation_clamp > 0) j["activation_clamp"] = m.activation_clamp;
  if (m.rope_attention_factor != 1) j["rope_attention_factor"] = m.rope_attention_factor;
  if (m.mtp_layers > 0) j["mtp_layers"] = m.mtp_layers;
}

}  // namespace model_detail

}  // namespace trainplan
