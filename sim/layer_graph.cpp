#include "sim/layer_graph.hpp"

#include <fmt/format.h>

#include <boost/graph/topological_sort.hpp>
#include <iterator>

#include "sim/check.hpp"

namespace trainplan {

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::embedding: return "embedding";
    case OpKind::norm: return "norm";
    case OpKind::qkv: return "qkv";
    case OpKind::attention: return "attention";
    case OpKind::out_proj: return "out_proj";
    case OpKind::mlp_up: return "mlp_up";
    case OpKind::activation: return "activation";
    case OpKind::mlp_down: return "mlp_down";
    case OpKind::residual: return "residual";
    case OpKind::lm_head: return "lm_head";
    case OpKind::loss: return "loss";
  }
  return "?";
}

namespace {

// Per-token figures of one transformer layer (Korthikanti et al. 2022, Sec. 4; Narayanan et al.
// 2021, Eq. 2-3), with h hidden, a heads, g kv heads of size d, f MLP size, s sequence, and the
// attention widths q = a d (queries, attention output) and kv = g d (keys, values each). The
// papers take d = h/a, so q = h; a model file's head_dim may set d otherwise (Mistral-NeMo).
//   FLOPs (forward, per token): QKV 2h(q + 2kv), scores+context 4sq, output 2qh,
//     MLP 2hf (GeLU) or 4hf (SwiGLU gate+up), down 2fh. For GPT (g=a, q=h, f=4h): 24h^2 + 4sh.
//   Saved activations (16-bit elements, per token), MHA/GeLU: outside the TP region LN inputs 2h,
//     QKV and MLP inputs 2h, dropout masks 2h bytes -> 10 bytes; inside it Q,K,V q + 2kv (3h),
//     attention output q (h), MLP up output f and GeLU output f -> 24 bytes for q = h, f = 4h;
//     standard attention adds softmax output + dropout output (2as elements) and the dropout mask
//     (as bytes) -> 5as bytes.
// Biases follow the GPT-2/Megatron convention (LayerNorm models have biases, RMSNorm models not).
std::vector<OpSpec> transformer_layer(const ModelSpec& m, int seq, int layer) {
  const double h = m.hidden, a = m.heads, f = m.ffn_hidden, s = seq;
  const double q = static_cast<double>(m.q_width()), kv = static_cast<double>(m.kv_width());
  const bool bias = m.norm == Norm::layernorm;
  const bool swiglu = m.activation == Activation::swiglu;
  const bool dropout = m.dropout > 0;
  const double norm_params = bias ? 2 * h : h;
  auto name = [&](const char* n) { return fmt::format("layer{}.{}", layer, n); };
  std::vector<OpSpec> ops;
  auto add = [&](OpSpec op) {
    op.layer = layer;
    ops.push_back(std::move(op));
  };
  OpSpec norm1{.name = name("norm1"), .kind = OpKind::norm, .split = Split::sequence};
  norm1.traffic_elems_per_token = 2 * h;
  norm1.params = norm_params;
  norm1.saved_seq_elems_per_token = h;  // its input
  add(norm1);

  OpSpec qkv{.name = name("qkv"), .kind = OpKind::qkv, .split = Split::tensor, .matmul = true};
  qkv.flops_per_token = 2 * h * (q + 2 * kv);
  qkv.traffic_elems_per_token = h + (q + 2 * kv);
  qkv.params = h * (q + 2 * kv) + (bias ? q + 2 * kv : 0);
  qkv.saved_seq_elems_per_token = h;  // its input (the norm output), gathered again under SP
  add(qkv);

  OpSpec attn{.name = name("attention"), .kind = OpKind::attention, .split = Split::tensor, .matmul = true};
  attn.flops_per_token = 4 * s * q;  // QK^T and softmax*V over the full (unmasked) sequence
  attn.traffic_elems_per_token = 2 * q + 2 * kv;   // reads Q, K, V, writes the output
  attn.saved_tensor_elems_per_token = q + 2 * kv;  // Q, K, V
  // Materialised scores keep the softmax output, and with dropout its dropped-out copy and mask.
  attn.score_elems_per_token = (dropout ? 2 : 1) * a * s;
  attn.score_mask_bytes_per_token = dropout ? a * s : 0;
  add(attn);

  OpSpec out{.name = name("out_proj"), .kind = OpKind::out_proj, .split = Split::tensor, .matmul = true};
  out.flops_per_token = 2 * q * h;
  out.traffic_elems_per_token = q + h;
  out.params = q * h + (bias ? h : 0);
  out.replicated_params = bias ? h : 0;  // row-parallel: the bias is added after the all-reduce
  out.saved_tensor_elems_per_token = q;  // attention output, its input
  add(out);

  OpSpec res1{.name = name("residual1"), .kind = OpKind::residual, .split = Split::sequence};
  res1.traffic_elems_per_token = 3 * h;
  res1.saved_mask_bytes_per_token = dropout ? h : 0;  // the branch's dropout mask
  add(res1);

  OpSpec norm2 = norm1;
  norm2.name = name("norm2");
  add(norm2);

  OpSpec up{.name = name("mlp_up"), .kind = OpKind::mlp_up, .split = Split::tensor, .matmul = true};
  up.flops_per_token = 2 * h * f * (swiglu ? 2 : 1);
  up.traffic_elems_per_token = h + f * (swiglu ? 2 : 1);
  up.params = h * f * (swiglu ? 2 : 1) + (bias ? f : 0);
  up.saved_seq_elems_per_token = h;  // its input
  add(up);

  OpSpec act{.name = name("activation"), .kind = OpKind::activation, .split = Split::tensor};
  act.traffic_elems_per_token = swiglu ? 3 * f : 2 * f;
  act.saved_tensor_elems_per_token = swiglu ? 2 * f : f;  // GeLU input, or SwiGLU gate and up
  add(act);

  OpSpec down{.name = name("mlp_down"), .kind = OpKind::mlp_down, .split = Split::tensor, .matmul = true};
  down.flops_per_token = 2 * f * h;
  down.traffic_elems_per_token = f + h;
  down.params = f * h + (bias ? h : 0);
  down.replicated_params = bias ? h : 0;  // row-parallel, as the output projection
  down.saved_tensor_elems_per_token = f;  // its input, the activation output
  add(down);

  OpSpec res2 = res1;
  res2.name = name("residual2");
  add(res2);
  return ops;
}

}  // namespace

LayerGraph::LayerGraph(const ModelSpec& model, int seq_len) : model_(model), seq_len_(seq_len) {
  TRAINPLAN_CHECK(model.layers >= 1 && seq_len >= 1, "a layer graph needs layers and a sequence length");
  const double h = model.hidden, V = model.vocab, s = seq_len;
  const bool bias = model.norm == Norm::layernorm;

  OpSpec emb{.name = "embedding", .kind = OpKind::embedding, .split = Split::sequence};
  emb.traffic_elems_per_token = 2 * h;
  emb.params = V * h + (model.position == Position::learned ? s * h : 0);
  emb.replicated_params = model.position == Position::learned ? s * h : 0;  // not vocabulary-split
  emb.saved_mask_bytes_per_token = model.dropout > 0 ? h : 0;  // embedding dropout mask
  pre_ops_.push_back(emb);

  layer_ops_ = transformer_layer(model, seq_len, 0);
  for (const auto& op : layer_ops_) params_per_layer_ += op.params;

  OpSpec fnorm{.name = "final_norm", .kind = OpKind::norm, .layer = model.layers, .split = Split::sequence};
  fnorm.traffic_elems_per_token = 2 * h;
  fnorm.params = bias ? 2 * h : h;
  fnorm.saved_seq_elems_per_token = h;
  post_ops_.push_back(fnorm);
  OpSpec head{.name = "lm_head", .kind = OpKind::lm_head, .layer = model.layers, .split = Split::tensor, .matmul = true};
  head.flops_per_token = 2 * h * V;
  head.traffic_elems_per_token = h + V;
  head.params = model.tied_embeddings ? 0 : V * h;  // tied: the embedding matrix is reused
  head.saved_seq_elems_per_token = h;
  post_ops_.push_back(head);
  OpSpec loss{.name = "loss", .kind = OpKind::loss, .layer = model.layers, .split = Split::tensor};
  loss.traffic_elems_per_token = 3 * V;
  loss.saved_fp32_tensor_elems_per_token = V;  // logits/softmax kept in fp32 (Korthikanti: 4sbv/t)
  post_ops_.push_back(loss);

  // The full DAG: embedding -> each layer's ops in order (residual2 also feeds from residual1's
  // stream through the skip connection) -> head ops.
  auto add_vertex = [&](const OpSpec& op) { return boost::add_vertex(op, graph_); };
  auto prev = add_vertex(emb);
  for (int l = 0; l < model.layers; ++l) {
    auto ops = l == 0 ? layer_ops_ : transformer_layer(model, seq_len, l);
    // Skip connections: residual1 adds the layer input, residual2 adds residual1's output.
    auto skip_from = prev;
    for (const auto& op : ops) {
      auto v = add_vertex(op);
      boost::add_edge(prev, v, graph_);
      if (op.kind == OpKind::residual) {
        boost::add_edge(skip_from, v, graph_);
        skip_from = v;
      }
      prev = v;
      if (l == 0) count_boundaries(v);
    }
  }
  for (const auto& op : post_ops_) {
    auto v = add_vertex(op);
    boost::add_edge(prev, v, graph_);
    prev = v;
  }
}

void LayerGraph::count_boundaries(Graph::vertex_descriptor v) {
  const OpSpec& to = graph_[v];
  if (to.kind == OpKind::attention) ++boundaries_.attention;
  for (auto [e, end] = boost::in_edges(v, graph_); e != end; ++e) {
    const OpSpec& from = graph_[boost::source(*e, graph_)];
    if (from.split == to.split) continue;
    if (to.split == Split::tensor) ++boundaries_.enter;
    else ++boundaries_.exit;
  }
}

std::vector<const OpSpec*> LayerGraph::topological_order() const {
  std::vector<Graph::vertex_descriptor> order;
  boost::topological_sort(graph_, std::back_inserter(order));
  std::vector<const OpSpec*> out;
  for (auto it = order.rbegin(); it != order.rend(); ++it) out.push_back(&graph_[*it]);
  return out;
}

double rank_params(const OpSpec& op, int tp) {
  const bool split = op.split == Split::tensor || op.kind == OpKind::embedding || op.kind == OpKind::lm_head;
  if (!split) return op.params;
  return (op.params - op.replicated_params) * (1.0 / tp) + op.replicated_params;
}

double LayerGraph::params_per_layer_per_rank(int tp) const {
  double p = 0;
  for (const auto& op : layer_ops_) p += rank_params(op, tp);
  return p;
}

double LayerGraph::embedding_params() const { return pre_ops_.front().params; }

double LayerGraph::head_params() const {
  double p = 0;
  for (const auto& op : post_ops_) p += op.params;
  return p;
}

double LayerGraph::total_params() const {
  return embedding_params() + model_.layers * params_per_layer_ + head_params();
}

Flops LayerGraph::forward_flops_per_token() const {
  Flops f = 0;
  for (const auto& op : layer_ops_) f += op.flops_per_token;
  f *= model_.layers;
  for (const auto& op : pre_ops_) f += op.flops_per_token;
  for (const auto& op : post_ops_) f += op.flops_per_token;
  return f;
}

}  // namespace trainplan
