// ModelSpec: a decoder-only transformer's architecture, and nothing about how it is parallelised.
#pragma once
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace trainplan {

enum class Activation { gelu, swiglu };
enum class Norm { layernorm, rmsnorm };
enum class Position { learned, rope, alibi };

// What a layer's attention looks at (per layer: gpt-oss alternates sliding and full layers, Llama 4
// has chunked layers with a full one every fourth):
//   full     every earlier token of the sequence (causal);
//   sliding  the last `sliding_window` tokens, the token itself included (Mistral, gpt-oss);
//   chunked  the earlier tokens of its own block of `attention_chunk` tokens (Llama 4).
// A window or chunk at least as long as the sequence is full attention (layer_attention()).
enum class AttentionWindow : std::uint8_t { full, sliding, chunked };

// How a router turns logits into expert weights: softmax over the experts (Mixtral, Qwen,
// gpt-oss) or an independent sigmoid per expert (DeepSeek-V3, Llama 4).
enum class RouterScoring { softmax, sigmoid };

// Multi-head latent attention (DeepSeek-V2, Liu et al. 2024, Sec. 2.1; DeepSeek-V3 report
// Sec. 2.1.1): queries from a low-rank latent of q_lora_rank (or straight from the hidden state
// when 0), keys and values from a shared kv_lora_rank latent, each head's query and key split
// into a qk_nope_head_dim part and a qk_rope_head_dim part (the rotary key part shared by all
// heads), values of v_head_dim.
struct MlaSpec {
  int q_lora_rank = 0;
  int kv_lora_rank = 0;  // > 0: the model uses MLA
  int qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool on() const { return kv_lora_rank > 0; }
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool operator==(const MlaSpec&) const = default;
};

// Mixture of experts (Shazeer et al. 2017; Fedus et al. 2022; DeepSeekMoE, Dai et al. 2024): an
// MoE layer replaces the dense MLP by `experts` routed experts of width expert_ffn, of which each
// token goes through top_k, plus `shared_experts` of width shared_ffn every token goes through.
// Which layers are MoE (is_moe_layer): every layer l >= first_dense with (l - first_dense + 1) a
// multiple of `every`, except the explicit dense_layers; the others keep the dense MLP (ffn_hidden).
//   DeepSeek-V3 first_dense 3; Qwen decoder_sparse_step n = every n with first_dense 0; Qwen's
//   mlp_only_layers and any other pattern = dense_layers.
struct MoeSpec {
  int experts = 0;         // routed experts; 0: a dense model
  int top_k = 0;           // experts each token is routed to
  int expert_ffn = 0;      // inner width of one expert (per projection for SwiGLU)
  int shared_experts = 0;  // experts every token goes through
  int shared_ffn = 0;      // inner width of one shared expert
  int first_dense = 0;
  int every = 1;
  std::vector<int> dense_layers;  // ascending, unique
  RouterScoring scoring = RouterScoring::softmax;
  // Group-limited routing (DeepSeek-V3 Sec. 2.1.2, node-limited): experts in `groups` groups, each
  // token routed within its best `topk_groups` of them. 1, 1: unrestricted.
  int groups = 1, topk_groups = 1;
  bool expert_bias = false;  // the experts' linears have biases (gpt-oss)
  bool router_bias = false;  // the router's linear has a bias (gpt-oss)
  bool shared_gate = false;  // a sigmoid gate h -> 1 scales the shared experts' output (Qwen2-MoE)
  bool on() const { return experts > 0; }
  bool operator==(const MoeSpec&) const = default;
};

// Which dense linears carry a bias vector: the attention's query/key/value projection, its output
// projection, and the MLP's (dense layers and shared experts; routed experts: MoeSpec::expert_bias).
struct LinearBiases {
  bool qkv = false, out = false, mlp = false;
  bool operator==(const LinearBiases&) const = default;
};

struct ModelSpec {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;      // == heads for multi-head attention, fewer for grouped-query attention
  int ffn_hidden = 0;    // MLP inner size (per projection for SwiGLU)
  int vocab = 0;
  int seq_len = 0;       // default training sequence length
  // Where seq_len came from when the file does not state a training length: empty for trainplan
  // model files (their "seq_len"); for a Hugging Face config, which gives only the longest sequence
  // its positions allow, the rule of set_hf_training_seq_len, as a phrase that commands print
  // after "sequence length N: ".
  std::string seq_len_source;
  Activation activation = Activation::gelu;
  Norm norm = Norm::layernorm;
  // Biases where the model states them ("biases" in a model file; a Hugging Face config's
  // attention_bias / mlp_bias, Qwen2's QKV biases); unset: as the norm implies (linear_biases()).
  std::optional<LinearBiases> biases;
  bool tied_embeddings = false;
  Position position = Position::learned;
  // Attention head size d as the file gives it ("head_dim"); 0 when it gives none, and then
  // d = hidden / heads. Queries and the attention output are heads x d wide, keys and values
  // kv_heads x d; with an explicit head_dim these need not match hidden (Mistral-NeMo-12B:
  // 32 heads x 128 = 4096 for hidden 5120).
  int explicit_head_dim = 0;
  // Dropout probability of the training recipe (hidden and attention dropout; "dropout" in a
  // trainplan file, optional, default 0 as in current LLM pre-training recipes such as Llama's).
  // With dropout the layers keep 1-byte masks for the backward and, with materialised attention
  // scores, the dropped-out copy of the scores as well (Korthikanti et al. 2022, Sec. 4.1); a
  // recipe without dropout keeps neither, whatever the software stack.
  double dropout = 0;
  MlaSpec mla;             // multi-head latent attention (mla.on()), else MHA/GQA
  MoeSpec moe;             // mixture of experts (moe.on()), else every layer dense
  // Attention window of each layer: `layer_attention` is a pattern repeated over the layers (one
  // entry per layer, or a shorter cycle: gpt-oss {sliding, full}); empty: every layer full.
  std::vector<AttentionWindow> layer_attention;
  int sliding_window = 0;  // tokens a sliding layer attends to (its own included); 0: none
  int attention_chunk = 0; // tokens per block of a chunked layer; 0: none
  // gpt-oss's attention sinks: one learned logit per head per layer joining the softmax's
  // denominator (heads parameters per layer; no measurable time).
  bool attention_sinks = false;
  // gpt-oss's clamped gated activation: the gate half clamped to at most L and the linear half to
  // [-L, L] before the activation (Hugging Face swiglu_limit; 0: no clamp). Same FLOPs; what the
  // clamp costs is the stack's (Software MemOps::glu_clamp).
  double activation_clamp = 0;
  // The factor a RoPE model's cos and sin tables are multiplied by: YaRN's attention factor
  // (0.1 ln s + 1 for a context stretched s times: gpt-oss's 1.35), read from a Hugging Face
  // config's rope_scaling; 1 for plain RoPE. Same FLOPs; a stack whose fused RoPE kernel takes no
  // such factor rotates q and k unfused (Software MemOps::rope_scaled).
  double rope_attention_factor = 1;
  // DeepSeek-V3's multi-token prediction (report Sec. 2.2): `mtp_layers` sequential modules after
  // the last layer, each a norm of the hidden state and of the next token's embedding, a linear
  // projection 2h -> h, one transformer layer (an MoE layer where the model has experts) and the
  // shared LM head and loss. Their parameters are outside the model's published total.
  int mtp_layers = 0;

  // Whether transformer layer l (0-based) uses the routed experts (see MoeSpec).
  bool is_moe_layer(int l) const;
  // The window layer l attends over a sequence of `seq` tokens: its pattern entry, or full where
  // the window or chunk covers the whole sequence.
  AttentionWindow layer_attention_at(int l, int seq) const;

  int head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden / heads; }
  // The GPT-2/Megatron convention where the model states nothing: LayerNorm models have every bias,
  // RMSNorm models none.
  LinearBiases linear_biases() const {
    const bool all = norm == Norm::layernorm;
    return biases.value_or(LinearBiases{all, all, all});
  }
  // Widths of the attention projections, in elements per token: Q (and the attention output that
  // the output projection reads) heads x d, K and V each kv_heads x d.
  long long q_width() const { return static_cast<long long>(heads) * head_dim(); }
  long long kv_width() const { return static_cast<long long>(kv_heads) * head_dim(); }
};

// Vocabulary rows the embedding and LM head hold when they are split over `tp` ranks: the
// vocabulary rounded up to a multiple of `multiple` * tp, as Megatron-LM pads it
// (--make-vocab-size-divisible-by 128, times the TP size; megatron/training/tokenizer; trainplan
// exec pads the same way). The padded rows are never looked up and their logits are masked out of
// the loss. Rows, not bytes. multiple = 1: no padding beyond divisibility by tp.
// In 64 bits: a software profile's multiple (up to 2^20) x tp wrapped an int to 0 (SIGFPE).
inline long long padded_vocab(long long vocab, long long tp, long long multiple = 128) {
  const long long m = multiple * tp;
  return (vocab + m - 1) / m * m;
}

// Parses a trainplan model object (exact key set, see models/README in README.md). `file` names the
// source in error messages. Throws InputError.
ModelSpec parse_model(const nlohmann::json& j, const std::string& file);

// Maps a Hugging Face config.json (hf_model_types()). Throws InputError. A key of a feature the
// family's type does not have (num_local_experts under "mistral") is refused, never ignored.
ModelSpec parse_hf_config(const nlohmann::json& j, const std::string& file);

// The training sequence length trainplan assumes for a Hugging Face config of `model_type` with
// `vocab` tokens whose positions allow at most `position_limit` tokens (max_position_embeddings,
// n_positions). A config states no training length, and its position limit is usually far past
// it (Llama 3.1: 131072, pre-trained at 8192), so the limit is never taken as the length:
//   8192 for the Llama 3 family (model_type llama with the Llama 3 tokenizer's 128256 tokens),
//   4096 for every other config,
//   but never more than position_limit (GPT-2: 1024 learned positions; Pythia: 2048).
// Sets m.seq_len and m.seq_len_source.
// The model_type values parse_hf_config reads, as "llama|mistral|...".
const char* hf_model_types();

void set_hf_training_seq_len(ModelSpec& m, const std::string& model_type, int position_limit, const char* limit_key);

// `name_or_path` is a built-in name (models/<name>.json under data_dir), a path to a trainplan
// model file or a Hugging Face config.json (recognised by its "model_type" key), or a folder
// holding a config.json (as Hugging Face lays a model out).
ModelSpec load_model(const std::string& name_or_path, const std::filesystem::path& data_dir);

// Serialises back to the trainplan model format (used in reports).
nlohmann::json to_json(const ModelSpec& m);

const char* to_string(Activation a);
const char* to_string(Norm n);
const char* to_string(Position p);
const char* to_string(AttentionWindow w);
const char* to_string(RouterScoring r);

}  // namespace trainplan
