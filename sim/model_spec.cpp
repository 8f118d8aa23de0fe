#include "sim/model_spec.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "sim/check.hpp"
#include "sim/json_reader.hpp"
#include "sim/model_families.hpp"

namespace trainplan {

using nlohmann::json;

const char* to_string(Activation a) { return a == Activation::gelu ? "gelu" : "swiglu"; }
const char* to_string(Norm n) { return n == Norm::layernorm ? "layernorm" : "rmsnorm"; }
const char* to_string(Position p) {
  switch (p) {
    case Position::learned: return "learned";
    case Position::rope: return "rope";
    case Position::alibi: return "alibi";
  }
  return "?";
}

// Checks that relate several fields; `file` and the field named make the message. The keys are
// those of the file being read (trainplan's "heads", or a Hugging Face config's "num_attention_heads").
// Without an explicit head_dim the head size is hidden / heads, so heads must divide hidden; with
// one, the attention width heads x head_dim is free. RoPE rotates pairs of a head's channels
// (Su et al. 2021, Sec. 3.4.2), so with RoPE the head size must be even; with latent attention only
// its RoPE part (qk_rope_head_dim) is rotated, and check_extensions names that one.
static void check_shape(const ModelSpec& m, const JsonObject& o, const char* heads_key = "heads",
                        const char* kv_heads_key = "kv_heads") {
  if (m.explicit_head_dim == 0 && m.hidden % m.heads != 0)
    throw o.error(heads_key, fmt::format("must divide hidden ({})", m.hidden));
  if (m.heads % m.kv_heads != 0) throw o.error(kv_heads_key, fmt::format("must divide heads ({})", m.heads));
  if (m.position == Position::rope && !m.mla.on() && m.head_dim() % 2 != 0) {
    if (m.explicit_head_dim > 0) throw o.error("head_dim", "must be even with RoPE (it rotates pairs of channels)");
    throw o.error(heads_key, fmt::format("gives an odd head size hidden / heads = {} / {} = {}, which RoPE cannot "
                                         "rotate (it rotates pairs of channels)",
                                         m.hidden, m.heads, m.head_dim()));
  }
}

// The optional "head_dim" key of both formats: absent means hidden / heads; so does null in a
// Hugging Face config (`null_is_absent`), where a trainplan model file refuses it.
static int read_head_dim(const JsonObject& o, bool null_is_absent = false) {
  const bool given = null_is_absent ? o.has_value("head_dim") : o.has("head_dim");
  return given ? static_cast<int>(o.integer("head_dim", 1, 1 << 16)) : 0;
}

ModelSpec parse_model(const json& j, const std::string& file) {
  JsonObject o(j, file);
  ModelSpec m;
  m.name = o.string("name");
  m.layers = static_cast<int>(o.integer("layers", 1, 100000));
  m.hidden = static_cast<int>(o.integer("hidden", 1, 1 << 20));
  m.heads = static_cast<int>(o.integer("heads", 1, 1 << 16));
  m.kv_heads = static_cast<int>(o.integer("kv_heads", 1, 1 << 16));
  m.ffn_hidden = static_cast<int>(o.integer("ffn_hidden", 1, 1 << 22));
  m.vocab = static_cast<int>(o.integer("vocab", 1, 1 << 24));
  m.seq_len = static_cast<int>(o.integer("seq_len", 1, 1 << 24));
  m.activation = o.choice("activation", {"gelu", "swiglu"}) == "gelu" ? Activation::gelu : Activation::swiglu;
  m.norm = o.choice("norm", {"layernorm", "rmsnorm"}) == "layernorm" ? Norm::layernorm : Norm::rmsnorm;
  m.tied_embeddings = o.boolean("tied_embeddings");
  auto pos = o.choice("position", {"learned", "rope", "alibi"});
  m.position = pos == "learned" ? Position::learned : pos == "rope" ? Position::rope : Position::alibi;
  m.explicit_head_dim = read_head_dim(o);
  if (o.has("biases")) {
    const JsonObject b = o.object("biases");
    const LinearBiases given{b.boolean("qkv"), b.boolean("out"), b.boolean("mlp")};
    b.finish();
    if (given != m.linear_biases()) m.biases = given;
  }
  m.dropout = o.optional_number("dropout", 0, 1).value_or(0.0);
  if (m.dropout >= 1) throw o.error("dropout", "must be below 1 (a probability of dropping an element)");
  o.optional_string("source");  // where the architecture figures come from; informational
  model_detail::read_model_extensions(o, m);
  o.finish();
  check_shape(m, o);
  return m;
}

// The name of `folder` as a person calls it: "." (--model . or ./config.json) or ".." is named by the
// folder it stands for; no folder (a bare "config.json") gives no name.
static std::string folder_name(const std::filesystem::path& folder) {
  const std::string name = folder.filename().string();
  if (name != "." && name != "..") return name;
  std::error_code ec;
  std::filesystem::path full = std::filesystem::absolute(folder, ec).lexically_normal();
  if (full.filename().empty()) full = full.parent_path();  // "/cwd/" after normalising "/cwd/."
  return full.filename().string();
}

// The Hugging Face keys check_extensions names for a config of `type`.
static model_detail::ExtensionKeys hf_extension_keys(const std::string& type) {
  model_detail::ExtensionKeys k;
  k.experts = type == "deepseek_v3" || type == "kimi_k2" ? "n_routed_experts"
              : type == "qwen2_moe" || type == "qwen3_moe" ? "num_experts"
                                                           : "num_local_experts";
  k.top_k = "num_experts_per_tok";
  k.layers = "num_hidden_layers";
  k.kv_heads = "num_key_value_heads";
  return k;
}

namespace {

// The bounds of a trainplan model file's keys (parse_model): 2^24 layers took minutes to lay out.
enum HfBound {
  kLayers = 100000, kHidden = 1 << 20, kHeads = 1 << 16, kFfn = 1 << 22, kVocab = 1 << 24, kSeq = 1 << 24
};

// What reading a family's keys tells the checks after it: the keys that gave the head count and
// the position limit (messages name them), and that limit (the longest sequence the positions
// allow, not the training length).
struct HfKeysRead {
  std::string heads_key;
  std::string limit_key;
  int position_limit = 0;
};

}  // namespace

// A config's whole-number `key`, in [1, hi].
static int hf_int(const JsonObject& o, const char* key, HfBound hi) { return static_cast<int>(o.integer(key, 1, hi)); }

// The sizes Llama-style and GPT-NeoX configs name alike (num_hidden_layers, hidden_size,
// num_attention_heads, intermediate_size, vocab_size), read in that order with the key and value
// heads after the query heads: num_key_value_heads where `grouped_kv` and given, else one per
// query head. Returns the position limit (max_position_embeddings).
static int read_hf_sizes(const JsonObject& o, ModelSpec& m, bool grouped_kv) {
  m.layers = hf_int(o, "num_hidden_layers", kLayers);
  m.hidden = hf_int(o, "hidden_size", kHidden);
  m.heads = hf_int(o, "num_attention_heads", kHeads);
  m.kv_heads = grouped_kv && o.has_value("num_key_value_heads") ? hf_int(o, "num_key_value_heads", kHeads) : m.heads;
  m.ffn_hidden = hf_int(o, "intermediate_size", kFfn);
  m.vocab = hf_int(o, "vocab_size", kVocab);
  return hf_int(o, "max_position_embeddings", kSeq);
}

// Llama, Mistral and Qwen2: SwiGLU, RMSNorm and RoPE; grouped-query attention where
// num_key_value_heads says so; embeddings untied unless tie_word_embeddings says otherwise.
// Returns the position limit.
static int read_llama_family(const JsonObject& o, ModelSpec& m) {
  const int position_limit = read_hf_sizes(o, m, true);
  m.activation = Activation::swiglu;
  m.norm = Norm::rmsnorm;
  m.position = Position::rope;
  m.tied_embeddings = o.has_value("tie_word_embeddings") ? o.boolean("tie_word_embeddings") : false;
  return position_limit;
}

// GPT2Config maps hidden_size, num_hidden_layers, num_attention_heads and max_position_embeddings
// onto n_embd, n_layer, n_head and n_positions (attribute_map; the mapped name wins where both
// are given): either name is read into `out`, and both given must agree. Returns the key read.
static const char* read_gpt2_int(const JsonObject& o, const char* key, const char* alias, HfBound hi, int& out) {
  if (!o.has_value(key) && o.has_value(alias)) {
    out = hf_int(o, alias, hi);
    return alias;
  }
  out = hf_int(o, key, hi);
  if (o.has_value(alias) && o.integer(alias, 1, hi) != out) {
    throw o.error(alias, fmt::format("must equal {} ({}) where both are given (GPT2Config reads {} as {})", key, out,
                                     alias, key));
  }
  return key;
}

// GPT-2: GELU, LayerNorm and learned positions, one key and value head per query head, a 4 x hidden
// MLP unless n_inner says otherwise. Sets the keys that gave the heads and the position limit.
static void read_gpt2(const JsonObject& o, ModelSpec& m, HfKeysRead& keys) {
  read_gpt2_int(o, "n_layer", "num_hidden_layers", kLayers, m.layers);
  read_gpt2_int(o, "n_embd", "hidden_size", kHidden, m.hidden);
  keys.heads_key = read_gpt2_int(o, "n_head", "num_attention_heads", kHeads, m.heads);
  m.kv_heads = m.heads;
  m.ffn_hidden = o.has_value("n_inner") ? hf_int(o, "n_inner", kFfn) : 4 * m.hidden;
  m.vocab = hf_int(o, "vocab_size", kVocab);
  keys.limit_key = read_gpt2_int(o, "n_positions", "max_position_embeddings", kSeq, keys.position_limit);
  m.activation = Activation::gelu;
  m.norm = Norm::layernorm;
  m.position = Position::learned;
  // GPT2LMHeadModel ties the LM head to the token embedding unless tie_word_embeddings is false
  // (PretrainedConfig's default is true).
  m.tied_embeddings = o.has_value("tie_word_embeddings") ? o.boolean("tie_word_embeddings") : true;
}

// GPT-NeoX (Pythia): GELU, LayerNorm and RoPE, one key and value head per query head, embeddings
// untied unless tie_word_embeddings says otherwise. Returns the position limit.
static int read_gpt_neox(const JsonObject& o, ModelSpec& m) {
  const int position_limit = read_hf_sizes(o, m, false);
  m.activation = Activation::gelu;
  m.norm = Norm::layernorm;
  m.position = Position::rope;
  m.tied_embeddings = o.has_value("tie_word_embeddings") ? o.boolean("tie_word_embeddings") : false;
  return position_limit;
}

// GPT-2's and GPT-NeoX's attention has one key and value head per query head, of hidden / heads
// channels, and their configs no head_dim or num_key_value_heads (transformers passes over both):
// one that says otherwise is refused rather than read or ignored.
static void check_gpt_head_keys(const JsonObject& o, const std::string& type, const ModelSpec& m) {
  if (o.has_value("num_key_value_heads") && o.integer("num_key_value_heads", 1, kHeads) != m.heads) {
    throw o.error("num_key_value_heads", fmt::format("is not a key of a {} config, whose attention has one key and "
                                                     "value head per query head ({})", type, m.heads));
  }
  if (o.has_value("head_dim") && m.hidden % m.heads == 0 && o.integer("head_dim", 1, kHeads) != m.hidden / m.heads) {
    throw o.error("head_dim", fmt::format("is not a key of a {} config, whose head size is hidden / heads", type));
  }
  // GPT2Block adds a cross-attention over an encoder's states where add_cross_attention is true:
  // the decoder of an encoder-decoder model, which trainplan does not model.
  if (type == "gpt2" && o.has_value("add_cross_attention") && o.boolean("add_cross_attention")) {
    throw o.error("add_cross_attention", "gives every layer a cross-attention over an encoder's output (an "
                                         "encoder-decoder's decoder), which trainplan does not model");
  }
}

// A dense family's config (llama, mistral, qwen2, gpt2, gpt_neox) into `m`: its own keys, then the
// checks and optional keys all dense families share. Any other model_type is refused here.
static void read_dense_hf(const JsonObject& o, const std::string& type, ModelSpec& m, HfKeysRead& keys) {
  if (type == "llama" || type == "mistral" || type == "qwen2") {
    keys.position_limit = read_llama_family(o, m);
  } else if (type == "gpt2") {
    read_gpt2(o, m, keys);
  } else if (type == "gpt_neox") {
    keys.position_limit = read_gpt_neox(o, m);
  } else {
    throw o.error("model_type", fmt::format("must be one of {}", hf_model_types()));
  }
  model_detail::refuse_extended_keys(o, type);
  model_detail::read_dense_sliding_window(o, type, m);
  model_detail::read_linear_biases(o, type, m);
  model_detail::check_layer_types_record(o, type, m);
  if (type == "gpt2" || type == "gpt_neox") {
    check_gpt_head_keys(o, type, m);
  } else {
    // head_dim (Mistral-NeMo, Gemma): the attention width heads x head_dim may differ from hidden.
    m.explicit_head_dim = read_head_dim(o, true);
  }
}

// Dropout: the largest of the config's dropout probabilities (absent or null: none) and `m`'s.
static void read_hf_dropout(const JsonObject& arch, ModelSpec& m) {
  for (const char* key : {"attention_dropout", "hidden_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop"}) {
    if (!arch.has_value(key)) continue;
    const double p = arch.number(key, 0, 1);
    // Named by its own key: the config has no "dropout" key to point at.
    if (p >= 1) throw arch.error(key, "must be below 1 (a probability of dropping an element)");
    m.dropout = std::max(m.dropout, p);
  }
}

// YaRN's attention factor for a context stretched `scale` times, with the config's mscale (1 where
// absent): 0.1 mscale ln(scale) + 1, and 1 where nothing is stretched (transformers' get_mscale in
// modeling_rope_utils.py; Megatron-core's _yarn_get_mscale).
static double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// A "yarn" scaling's factor on cos and sin: its attention_factor where given, else
// mscale(factor, mscale) / mscale(factor, mscale_all_dim) where both are given (and not 0), else
// mscale(factor) (transformers' _compute_yarn_parameters; Megatron-core's
// _yarn_get_concentration_factor from the same factor).
static double yarn_attention_factor(const JsonObject& r) {
  if (r.has_value("attention_factor")) return r.number("attention_factor", 0, 100, true);
  const double factor = r.number("factor", 1, 1e6);
  const double ms = r.has_value("mscale") ? r.number("mscale", 0, 100) : 0;
  const double all = r.has_value("mscale_all_dim") ? r.number("mscale_all_dim", 0, 100) : 0;
  return ms > 0 && all > 0 ? yarn_mscale(factor, ms) / yarn_mscale(factor, all) : yarn_mscale(factor, 1);
}

// The key holding a config's rotary scaling, rope_scaling (transformers 4) or rope_parameters (5),
// or nullptr where neither has a value; both at once are refused.
static const char* rope_scaling_key(const JsonObject& arch) {
  const bool v4 = arch.has_value("rope_scaling"), v5 = arch.has_value("rope_parameters");
  if (v4 && v5) throw arch.error("rope_parameters", "must not be given beside rope_scaling (the same settings twice)");
  return v4 ? "rope_scaling" : v5 ? "rope_parameters" : nullptr;
}

// The factor RoPE's cos and sin are scaled by (ModelSpec::rope_attention_factor), from the config's
// rope_scaling (transformers 4) or rope_parameters (5): its rope_type (or legacy type) "default",
// "linear", "dynamic" and "llama3" change the frequencies only (1); "yarn" scales them
// (yarn_attention_factor). Other types, and scalings set per layer type, are refused, not ignored.
static void read_rope_scaling(const JsonObject& arch, ModelSpec& m) {
  const char* key = rope_scaling_key(arch);
  if (!key) return;
  if (m.position != Position::rope) throw arch.error(key, "scales rotary embeddings, which this model does not use");
  const JsonObject r = arch.object(key);
  for (const char* per_type : {"full_attention", "sliding_attention"})
    if (r.has_value(per_type)) throw r.error(per_type, "sets the rotary scaling per layer type, which trainplan does not read");
  const char* type_key = r.has_value("rope_type") || !r.has_value("type") ? "rope_type" : "type";
  if (!r.has_value(type_key)) return;  // transformers 5: rope_theta alone, plain RoPE
  const std::string type = r.string(type_key);
  if (type == "yarn") {
    m.rope_attention_factor = yarn_attention_factor(r);
  } else if (type != "default" && type != "linear" && type != "dynamic" && type != "llama3") {
    throw r.error(type_key, "must be default, linear, dynamic, llama3 or yarn (the rotary scalings trainplan reads)");
  }
}

// The model's name: "_name_or_path" when the config carries a non-empty one; else the folder of a
// "config.json" (as Hugging Face downloads lay them out); else the file's stem; else the type.
static std::string hf_model_name(const JsonObject& o, const std::string& file, const std::string& type) {
  const std::filesystem::path p(file);
  std::string name;
  if (o.has_value("_name_or_path") && o.raw("_name_or_path") != "") {
    name = o.string("_name_or_path");
  } else {
    name = p.filename() == "config.json" ? folder_name(p.parent_path()) : p.stem().string();
  }
  // A file name may hold any byte but a slash; a name that would be printed must be printable.
  const bool printable =
      std::all_of(name.begin(), name.end(), [](unsigned char ch) { return ch >= 0x20 && ch != 0x7f; });
  return name.empty() || !printable ? type : name;
}

// Hugging Face configs carry many keys we do not need (dropout, init, token ids); only the
// architecture keys are read, but each one read is type- and range-checked. transformers writes
// an unset optional key as null ("head_dim": null, "num_key_value_heads": null), so here an
// optional key given as null reads as absent (has_value); a required one must still be given.
ModelSpec parse_hf_config(const json& j, const std::string& file) {
  JsonObject o(j, file);
  const std::string type = o.string("model_type");
  ModelSpec m;
  HfKeysRead keys{type == "gpt2" ? "n_head" : "num_attention_heads",
                  type == "gpt2" ? "n_positions" : "max_position_embeddings"};
  if (model_detail::is_extended_hf_type(type)) {
    keys.position_limit = model_detail::parse_extended_hf(o, type, m, keys.limit_key);
  } else {
    read_dense_hf(o, type, m, keys);
  }
  // The object holding the text model's keys, which the checks below name: Llama 4's text_config.
  const JsonObject arch = type == "llama4" ? o.object("text_config") : o;
  read_hf_dropout(arch, m);
  read_rope_scaling(arch, m);
  set_hf_training_seq_len(m, type, keys.position_limit, keys.limit_key.c_str());
  m.name = hf_model_name(o, file, type);
  check_shape(m, arch, keys.heads_key.c_str(), "num_key_value_heads");
  model_detail::check_extensions(m, arch, hf_extension_keys(type));
  return m;
}

const char* hf_model_types() {
  return "llama|mistral|qwen2|gpt2|gpt_neox|mixtral|qwen2_moe|qwen3_moe|deepseek_v3|kimi_k2|gpt_oss|llama4";
}

// Training lengths of published pre-training runs, for configs that state none:
//   Llama 3 family: 8192 (Dubey et al. 2024, "The Llama 3 Herd of Models", Sec. 3.4.1: pre-training
//   on sequences of 8,192 tokens, before the long-context stage); recognised by the Llama 3
//   tokenizer's vocabulary of 128,000 BPE tokens + 256 reserved (vocab_size 128256), which
//   Llama 3, 3.1, 3.2 and 3.3 share and earlier llama-type models do not (Llama 2: 32000).
//   Others: 4096, Llama 2's pre-training context (Touvron et al. 2023, "Llama 2", Table 1).
void set_hf_training_seq_len(ModelSpec& m, const std::string& model_type, int position_limit, const char* limit_key) {
  constexpr int kLlama3Vocab = 128256, kLlama3Seq = 8192, kDefaultSeq = 4096;
  const bool llama3 = model_type == "llama" && m.vocab == kLlama3Vocab;
  const int stated = llama3 ? kLlama3Seq : kDefaultSeq;
  if (position_limit > 0 && position_limit < stated) {
    m.seq_len = position_limit;
    m.seq_len_source = fmt::format("the config's {}, the longest sequence its positions allow (below the {} "
                                   "trainplan assumes for a config that states no training length)",
                                   limit_key, stated);
  } else {
    m.seq_len = stated;
    m.seq_len_source = llama3 ? "the Llama 3 family's pre-training length (the config states no training length, "
                                "and its " + std::string(limit_key) + " is the longest sequence, not the trained one)"
                              : "trainplan's default for a config that states no training length (its " +
                                    std::string(limit_key) + " is the longest sequence, not the trained one)";
  }
}

ModelSpec load_model(const std::string& name_or_path, const std::filesystem::path& data_dir) {
  std::filesystem::path path = name_or_path;
  const bool looks_like_path = name_or_path.find('/') != std::string::npos || path.extension() == ".json";
  if (!looks_like_path) {
    // A built-in name first; else an existing file of that name (without .json or a slash).
    // error_code overloads: a name too long for the file system is "not found", not a crash.
    std::error_code ec;
    const std::filesystem::path builtin = data_dir / "models" / (name_or_path + ".json");
    if (std::filesystem::exists(builtin, ec)) {
      path = builtin;
    } else if (!std::filesystem::exists(path, ec)) {  // a directory or FIFO: read_input_file names it
      throw InputError(fmt::format("--model {}: not a built-in model (see {}) and not a file", name_or_path,
                                   (data_dir / "models").string()));
    }
  }
  // A folder as Hugging Face lays a model out: its config.json.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (!std::filesystem::exists(path / "config.json", ec)) {
      throw InputError(fmt::format("--model {}: is a directory without a config.json (a Hugging Face model folder "
                                   "holds one; or name a model file)",
                                   name_or_path));
    }
    path /= "config.json";
  }
  json j = read_json_file(path);
  if (j.is_object() && j.contains("model_type")) return parse_hf_config(j, path.string());
  // A Hugging Face config without model_type would otherwise be reported as a trainplan model
  // file missing "name".
  if (j.is_object() && !j.contains("name")) {
    for (const char* hf_key : {"architectures", "hidden_size", "num_hidden_layers", "n_layer", "n_embd"}) {
      if (j.contains(hf_key)) {
        throw InputError(fmt::format("{}: model_type is missing (required in a Hugging Face config: one of {})",
                                     path.string(), hf_model_types()));
      }
    }
  }
  return parse_model(j, path.string());
}

json to_json(const ModelSpec& m) {
  json j{{"name", m.name},         {"layers", m.layers},
              {"hidden", m.hidden},     {"heads", m.heads},
              {"kv_heads", m.kv_heads}, {"ffn_hidden", m.ffn_hidden},
              {"vocab", m.vocab},       {"seq_len", m.seq_len},
              {"activation", to_string(m.activation)}, {"norm", to_string(m.norm)},
              {"tied_embeddings", m.tied_embeddings},  {"position", to_string(m.position)}};
  if (m.explicit_head_dim > 0) j["head_dim"] = m.explicit_head_dim;
  if (m.biases) j["biases"] = {{"qkv", m.biases->qkv}, {"out", m.biases->out}, {"mlp", m.biases->mlp}};
  if (m.dropout > 0) j["dropout"] = m.dropout;
  model_detail::extensions_to_json(m, j);
  return j;
}

}  // namespace trainplan
