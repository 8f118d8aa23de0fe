// ModelSpec: a decoder-only transformer's architecture, and nothing about how it is parallelised.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace trainplan {

enum class Activation { gelu, swiglu };
enum class Norm { layernorm, rmsnorm };
enum class Position { learned, rope, alibi };

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

  int head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden / heads; }
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

// Maps a Hugging Face config.json (llama, mistral, qwen2, gpt2, gpt_neox families). Throws InputError.
ModelSpec parse_hf_config(const nlohmann::json& j, const std::string& file);

// The training sequence length trainplan assumes for a Hugging Face config of `model_type` with
// `vocab` tokens whose positions allow at most `position_limit` tokens (max_position_embeddings,
// n_positions). A config states no training length, and its position limit is usually far past
// it (Llama 3.1: 131072, pre-trained at 8192), so the limit is never taken as the length:
//   8192 for the Llama 3 family (model_type llama with the Llama 3 tokenizer's 128256 tokens),
//   4096 for every other config,
//   but never more than position_limit (GPT-2: 1024 learned positions; Pythia: 2048).
// Sets m.seq_len and m.seq_len_source.
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

}  // namespace trainplan
