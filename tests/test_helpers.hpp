// Small builders shared by the unit tests.
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "sim/check.hpp"
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
  m.dropout = 0.1;  // GPT-3-style recipes (Megatron-LM's default hidden and attention dropout)
  return m;
}

inline Cluster builtin_cluster(const char* name) { return load_cluster(name, TRAINPLAN_SOURCE_DIR); }

// Runs `f`, which must throw InputError, and returns the message (or says what happened instead).
template <class F>
std::string input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("WRONG EXCEPTION TYPE: ") + e.what();
  }
  return "NO EXCEPTION";
}

inline ::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

inline ::testing::AssertionResult StartsWith(const std::string& text, const std::string& prefix) {
  if (text.rfind(prefix, 0) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not start with \"" << prefix << "\"";
}

}  // namespace trainplan::testing
