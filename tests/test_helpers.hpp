// Small builders shared by the unit tests.
#pragma once
#include "sim/cluster.hpp"
#include "sim/model_spec.hpp"
#include "sim/strategy.hpp"

namespace trainplan::testing {

// A GPT model as in Narayanan et al. 2021 (MHA, 4h MLP, GeLU, LayerNorm, learned positions,
// tied embeddings).
inline ModelSpec gpt(int layers, int hidden, int heads, int seq = 2048, int vocab = 51200) {
  ModelSpec m;
  m.name = "gpt-test";
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = heads;
  m.ffn_hidden = 4 * hidden;
  m.vocab = vocab;
  m.seq_len = seq;
  m.activation = Activation::gelu;
  m.norm = Norm::layernorm;
  m.tied_embeddings = true;
  m.position = Position::learned;
  return m;
}

inline Cluster builtin_cluster(const char* name) { return load_cluster(name, TRAINPLAN_SOURCE_DIR); }

}  // namespace trainplan::testing
