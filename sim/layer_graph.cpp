#include "sim/layer_graph.hpp"

#include <fmt/format.h>

#include <algorithm>
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
    case OpKind::q_down: return "q_down";
    case OpKind::q_up: return "q_up";
    case OpKind::kv_down: return "kv_down";
    case OpKind::kv_up: return "kv_up";
    case OpKind::router: return "router";
    case OpKind::expert_up: return "expert_up";
    case OpKind::expert_activation: return "expert_activation";
    case OpKind::expert_down: return "expert_down";
    case OpKind::shared_up: return "shared_up";
    case OpKind::shared_activation: return "shared_activation";
    case OpKind::shared_down: return "shared_down";
    case OpKind::mtp_proj: return "mtp_proj";
  }
  return "?";
}

const char* to_string(const LayerKind& k) {
  static constexpr const char* kNames[2][3] = {{"dense", "dense sliding", "dense chunked"},
                                               {"moe", "moe sliding", "moe chunked"}};
  return kNames[k.moe ? 1 : 0][static_cast<int>(k.window)];
}

namespace {

// One layer's ops and, for each op, the ops it reads (indices into ops; -1: the layer's input).
struct LayerTemplate {
  std::vector<OpSpec> ops;
  std::vector<std::array<int, 3>> inputs;  // unused entries -2
  int add(OpSpec op, std::initializer_list<int> from) {
    std::array<int, 3> in{-2, -2, -2};
    std::copy(from.begin(), from.end(), in.begin());
    ops.push_back(std::move(op));
    inputs.push_back(in);
    return static_cast<int>(ops.size()) - 1;
  }
};

// Share of the full causal attention's work a window leaves (attention FLOPs are counted as over
// the unmasked sequence, Narayanan et al. 2021; the kernels run the causal part of them):
//   sliding W < s: each query sees min(i + 1, W) keys, s W - W^2/2 in all against s^2/2: 2W/s - (W/s)^2;
//   chunked C < s: each query sees its chunk's earlier keys, s C/2 in all: C/s.
double window_share(const ModelSpec& m, AttentionWindow w, double s) {
  if (w == AttentionWindow::sliding) return 2 * m.sliding_window / s - (m.sliding_window / s) * (m.sliding_window / s);
  if (w == AttentionWindow::chunked) return m.attention_chunk / s;
  return 1;
}

OpSpec norm_op(const ModelSpec& m, const std::string& name, double width) {
  OpSpec n{.name = name, .kind = OpKind::norm, .split = Split::sequence};
  n.traffic_elems_per_token = 2 * width;
  n.params = m.norm == Norm::layernorm ? 2 * width : width;
  n.saved_seq_elems_per_token = width;  // its input
  n.out_width = width;
  return n;
}

// Per-token figures of one transformer layer's attention half (Korthikanti et al. 2022, Sec. 4;
// Narayanan et al. 2021, Eq. 2-3), with h hidden, a heads, g kv heads of size d, s sequence, and
// the attention widths q = a d (queries, attention output) and kv = g d (keys, values each). The
// papers take d = h/a, so q = h; a model file's head_dim may set d otherwise (Mistral-NeMo).
//   FLOPs (forward, per token): QKV 2h(q + 2kv), scores+context 4sq (times the window's share),
//     output 2qh. For GPT (g=a, q=h): 8h^2 + 4sh.
//   Saved activations (16-bit elements, per token), MHA: outside the TP region LN input h and QKV
//     input h, the branch's dropout mask h bytes; inside it Q,K,V q + 2kv (3h), attention output q;
//     standard attention adds softmax output + dropout output (2as elements) and the dropout mask
//     (as bytes).
// Biases as the model has them (ModelSpec::linear_biases: by default the GPT-2/Megatron convention,
// LayerNorm models biased, RMSNorm models not).
int add_mha(const ModelSpec& m, double s, AttentionWindow window, const std::string& p, LayerTemplate& t, int norm1) {
  const double h = m.hidden, a = m.heads;
  const double q = static_cast<double>(m.q_width()), kv = static_cast<double>(m.kv_width());
  const bool bias = m.linear_biases().qkv, dropout = m.dropout > 0;
  OpSpec qkv{.name = p + "qkv", .kind = OpKind::qkv, .split = Split::tensor, .matmul = true};
  qkv.flops_per_token = 2 * h * (q + 2 * kv);
  qkv.traffic_elems_per_token = h + (q + 2 * kv);
  qkv.params = h * (q + 2 * kv) + (bias ? q + 2 * kv : 0);
  qkv.saved_seq_elems_per_token = h;  // its input (the norm output), gathered again under SP
  qkv.out_width = q + 2 * kv;
  const int qkv_i = t.add(qkv, {norm1});
  OpSpec attn{.name = p + "attention", .kind = OpKind::attention, .split = Split::tensor, .matmul = true};
  attn.flops_per_token = 4 * s * q * window_share(m, window, s);  // QK^T and softmax*V, unmasked
  attn.traffic_elems_per_token = 2 * q + 2 * kv;   // reads Q, K, V, writes the output
  attn.saved_tensor_elems_per_token = q + 2 * kv;  // Q, K, V
  attn.params = m.attention_sinks ? a : 0;         // one sink logit per head
  // Materialised scores keep the softmax output, and with dropout its dropped-out copy and mask.
  attn.score_elems_per_token = (dropout ? 2 : 1) * a * s;
  attn.score_mask_bytes_per_token = dropout ? a * s : 0;
  attn.out_width = q;
  return t.add(attn, {qkv_i});
}

// Multi-head latent attention (DeepSeek-V2 Sec. 2.1, Eq. 9-19), with a heads, q_lora rank r_q,
// kv_lora rank r_kv, head parts d_n (no RoPE), d_r (RoPE, the key's shared by all heads), d_v:
//   q_down h -> r_q, its norm, q_up r_q -> a(d_n + d_r) (or h -> a(d_n + d_r) without r_q);
//   kv_down h -> r_kv + d_r, its norm on r_kv, kv_up r_kv -> a(d_n + d_v);
//   attention over keys a(d_n + d_r) and values a d_v: 2s a(d_n + d_r + d_v) unmasked FLOPs;
//   output a d_v -> h.
// The down projections and their norms run on the sequence-split stream with replicated weights,
// the up projections are column-parallel (megatron/core/transformer/multi_latent_attention.py), so
// the TP region is entered on the latents, not on h.
int add_mla(const ModelSpec& m, double s, AttentionWindow window, const std::string& p, LayerTemplate& t, int norm1) {
  const MlaSpec& x = m.mla;
  const double h = m.hidden, a = m.heads, qk = a * x.qk_head_dim(), v = a * x.v_head_dim;
  const double rq = x.q_lora_rank, rkv = x.kv_lora_rank, dr = x.qk_rope_head_dim;
  auto linear = [&](const char* name, OpKind kind, Split split, double in, double out, double saved_in) {
    OpSpec op{.name = p + name, .kind = kind, .split = split, .matmul = true};
    op.flops_per_token = 2 * in * out;
    op.traffic_elems_per_token = in + out;
    op.params = in * out;
    op.saved_seq_elems_per_token = saved_in;  // the input, sequence-split (gathered again under SP)
    op.out_width = out;
    return op;
  };
  int q_in = norm1;
  if (rq > 0) {
    const int down = t.add(linear("q_down", OpKind::q_down, Split::sequence, h, rq, h), {norm1});
    q_in = t.add(norm_op(m, p + "q_norm", rq), {down});
  }
  const int q_up = t.add(linear("q_up", OpKind::q_up, Split::tensor, rq > 0 ? rq : h, qk, rq > 0 ? rq : h), {q_in});
  // kv_down reads the norm output q_down (or q_up) saves already (one tensor): counted once.
  const int kv_down = t.add(linear("kv_down", OpKind::kv_down, Split::sequence, h, rkv + dr, 0), {norm1});
  OpSpec kv_norm = norm_op(m, p + "kv_norm", rkv);
  kv_norm.out_width = rkv + dr;  // the rotary key part passes alongside the normed latent
  const int kv_norm_i = t.add(kv_norm, {kv_down});
  const int kv_up = t.add(linear("kv_up", OpKind::kv_up, Split::tensor, rkv, a * x.qk_nope_head_dim + v, rkv), {kv_norm_i});
  OpSpec attn{.name = p + "attention", .kind = OpKind::attention, .split = Split::tensor, .matmul = true};
  attn.flops_per_token = 2 * s * (qk + v) * window_share(m, window, s);
  attn.traffic_elems_per_token = 2 * qk + v + v;  // reads Q, K, V, writes the output
  attn.saved_tensor_elems_per_token = 2 * qk + v;  // Q, K (RoPE part broadcast to the heads), V
  attn.score_elems_per_token = (m.dropout > 0 ? 2 : 1) * a * s;
  attn.score_mask_bytes_per_token = m.dropout > 0 ? a * s : 0;
  attn.out_width = v;
  return t.add(attn, {q_up, kv_up});
}

void add_attention_half(const ModelSpec& m, double s, AttentionWindow window, const std::string& p, LayerTemplate& t) {
  const double h = m.hidden;
  const bool bias = m.linear_biases().out;
  const int norm1 = t.add(norm_op(m, p + "norm1", h), {-1});
  const int attn = m.mla.on() ? add_mla(m, s, window, p, t, norm1) : add_mha(m, s, window, p, t, norm1);
  const double o = t.ops[attn].out_width;  // q, or a d_v with MLA
  OpSpec out{.name = p + "out_proj", .kind = OpKind::out_proj, .split = Split::tensor, .matmul = true};
  out.flops_per_token = 2 * o * h;
  out.traffic_elems_per_token = o + h;
  out.params = o * h + (bias ? h : 0);
  out.replicated_params = bias ? h : 0;  // row-parallel: the bias is added after the all-reduce
  out.saved_tensor_elems_per_token = o;  // attention output, its input
  out.out_width = h;
  const int out_i = t.add(out, {attn});
  OpSpec res{.name = p + "residual1", .kind = OpKind::residual, .split = Split::sequence};
  res.traffic_elems_per_token = 3 * h;
  res.saved_mask_bytes_per_token = m.dropout > 0 ? h : 0;  // the branch's dropout mask
  res.out_width = h;
  t.add(res, {out_i, -1});
}

// An MLP of width f per token (a dense MLP, or the shared experts side by side): up h -> f (2f
// gate and up for SwiGLU), the activation, down f -> h, FLOPs 2hf (4hf SwiGLU) + 2fh.
//   Saved: the up input h (sequence-split), the activation's input f (2f SwiGLU), the down input f.
int add_mlp(const ModelSpec& m, double f, bool shared, const std::string& p, LayerTemplate& t, int norm2) {
  const double h = m.hidden;
  const bool bias = m.linear_biases().mlp, swiglu = m.activation == Activation::swiglu;
  OpSpec up{.name = p + (shared ? "shared_up" : "mlp_up"), .kind = shared ? OpKind::shared_up : OpKind::mlp_up,
            .split = Split::tensor, .matmul = true};
  up.flops_per_token = 2 * h * f * (swiglu ? 2 : 1);
  up.traffic_elems_per_token = h + f * (swiglu ? 2 : 1);
  up.params = (h + (bias ? 1 : 0)) * f * (swiglu ? 2 : 1);  // SwiGLU: gate and up, each with its bias
  // Its input, the norm's output; the shared experts read the one the router saves already.
  up.saved_seq_elems_per_token = shared ? 0 : h;
  up.out_width = f * (swiglu ? 2 : 1);
  const int up_i = t.add(up, {norm2});
  OpSpec act{.name = p + (shared ? "shared_activation" : "activation"),
             .kind = shared ? OpKind::shared_activation : OpKind::activation, .split = Split::tensor};
  act.traffic_elems_per_token = swiglu ? 3 * f : 2 * f;
  act.saved_tensor_elems_per_token = swiglu ? 2 * f : f;  // GeLU input, or SwiGLU gate and up
  act.out_width = f;
  const int act_i = t.add(act, {up_i});
  OpSpec down{.name = p + (shared ? "shared_down" : "mlp_down"), .kind = shared ? OpKind::shared_down : OpKind::mlp_down,
              .split = Split::tensor, .matmul = true};
  down.flops_per_token = 2 * f * h;
  down.traffic_elems_per_token = f + h;
  down.params = f * h + (bias ? h : 0);
  down.replicated_params = bias ? h : 0;  // row-parallel, as the output projection
  down.saved_tensor_elems_per_token = f;  // its input, the activation output
  down.out_width = h;
  return t.add(down, {act_i});
}

// The routed experts (Shazeer et al. 2017; Megatron-core moe/experts.py GroupedMLP): the router
// h -> E logits (with Qwen2-MoE's shared-expert gate h -> 1 beside it), then for each of the top_k
// experts a token goes to an MLP of width f_e. Per token of the layer, FLOPs are top_k MLPs'
// (2h f_e (4h f_e SwiGLU) + 2 f_e h) plus 2hE for the router; parameters are all E experts'. The
// saved tensors are the top_k routed copies' (an input h, the activation's input, the down input),
// per token of the layer; memory_model counts them from the tokens the rank's experts receive.
int add_routed_experts(const ModelSpec& m, const std::string& p, LayerTemplate& t, int norm2) {
  const MoeSpec& e = m.moe;
  const double h = m.hidden, E = e.experts, k = e.top_k, f = e.expert_ffn;
  const bool swiglu = m.activation == Activation::swiglu;
  const double g = swiglu ? 2 : 1;
  OpSpec router{.name = p + "router", .kind = OpKind::router, .split = Split::sequence, .matmul = true};
  router.flops_per_token = 2 * h * E;
  router.traffic_elems_per_token = h + E;
  router.params = h * E + (e.router_bias ? E : 0) + (e.shared_gate ? h : 0);
  router.saved_seq_elems_per_token = h;  // its input
  router.out_width = E;
  const int router_i = t.add(router, {norm2});
  OpSpec up{.name = p + "expert_up", .kind = OpKind::expert_up, .split = Split::expert, .matmul = true};
  up.flops_per_token = k * 2 * h * f * g;
  up.traffic_elems_per_token = k * (h + f * g);
  up.params = E * (h * f * g + (e.expert_bias ? f * g : 0));
  up.saved_tensor_elems_per_token = k * h;
  up.out_width = k * f * g;
  const int up_i = t.add(up, {router_i});
  OpSpec act{.name = p + "expert_activation", .kind = OpKind::expert_activation, .split = Split::expert};
  act.traffic_elems_per_token = k * (g + 1) * f;
  act.saved_tensor_elems_per_token = k * g * f;
  act.out_width = k * f;
  const int act_i = t.add(act, {up_i});
  OpSpec down{.name = p + "expert_down", .kind = OpKind::expert_down, .split = Split::expert, .matmul = true};
  down.flops_per_token = k * 2 * f * h;
  down.traffic_elems_per_token = k * (f + h);
  down.params = E * (f * h + (e.expert_bias ? h : 0));
  down.saved_tensor_elems_per_token = k * f;
  down.out_width = h;
  return t.add(down, {act_i});
}

void add_mlp_half(const ModelSpec& m, bool moe, const std::string& p, LayerTemplate& t) {
  const double h = m.hidden;
  const int res1 = static_cast<int>(t.ops.size()) - 1;
  const int norm2 = t.add(norm_op(m, p + "norm2", h), {res1});
  OpSpec res{.name = p + "residual2", .kind = OpKind::residual, .split = Split::sequence};
  res.traffic_elems_per_token = 3 * h;
  res.saved_mask_bytes_per_token = m.dropout > 0 ? h : 0;
  res.out_width = h;
  if (!moe) {
    const int down = add_mlp(m, m.ffn_hidden, false, p, t, norm2);
    t.add(res, {down, res1});
    return;
  }
  const int routed = add_routed_experts(m, p, t, norm2);
  if (m.moe.shared_experts == 0) {
    t.add(res, {routed, res1});
    return;
  }
  const int shared = add_mlp(m, static_cast<double>(m.moe.shared_experts) * m.moe.shared_ffn, true, p, t, norm2);
  t.add(res, {routed, shared, res1});
}

LayerTemplate transformer_layer(const ModelSpec& m, int seq, const LayerKind& kind, const std::string& prefix) {
  LayerTemplate t;
  add_attention_half(m, seq, kind.window, prefix, t);
  add_mlp_half(m, kind.moe, prefix, t);
  return t;
}

std::string layer_prefix(int layer) { return fmt::format("layer{}.", layer); }

}  // namespace

int LayerGraph::kind_of(const LayerKind& k) {
  for (std::size_t i = 0; i < kinds_.size(); ++i)
    if (kinds_[i].kind == k) return static_cast<int>(i);
  TRAINPLAN_CHECK(static_cast<int>(kinds_.size()) < kMaxKinds, "more layer kinds than kMaxKinds");
  kinds_.push_back({k, {}, {}, 0});
  return static_cast<int>(kinds_.size()) - 1;
}

LayerGraph::LayerGraph(const ModelSpec& model, int seq_len) : model_(model), seq_len_(seq_len) {
  TRAINPLAN_CHECK(model.layers >= 1 && seq_len >= 1, "a layer graph needs layers and a sequence length");
  const double h = model.hidden, V = model.vocab, s = seq_len;
  OpSpec emb{.name = "embedding", .kind = OpKind::embedding, .split = Split::sequence};
  emb.traffic_elems_per_token = 2 * h;
  emb.params = V * h + (model.position == Position::learned ? s * h : 0);
  emb.replicated_params = model.position == Position::learned ? s * h : 0;  // not vocabulary-split
  emb.saved_mask_bytes_per_token = model.dropout > 0 ? h : 0;  // embedding dropout mask
  emb.out_width = h;
  pre_ops_.push_back(emb);

  OpSpec fnorm = norm_op(model, "final_norm", h);
  fnorm.layer = model.layers;
  post_ops_.push_back(fnorm);
  OpSpec head{.name = "lm_head", .kind = OpKind::lm_head, .layer = model.layers, .split = Split::tensor, .matmul = true};
  head.flops_per_token = 2 * h * V;
  head.traffic_elems_per_token = h + V;
  head.params = model.tied_embeddings ? 0 : V * h;  // tied: the embedding matrix is reused
  head.saved_seq_elems_per_token = h;
  head.out_width = V;
  post_ops_.push_back(head);
  OpSpec loss{.name = "loss", .kind = OpKind::loss, .layer = model.layers, .split = Split::tensor};
  loss.traffic_elems_per_token = 3 * V;
  loss.saved_fp32_tensor_elems_per_token = V;  // logits/softmax kept in fp32 (Korthikanti: 4sbv/t)
  post_ops_.push_back(loss);
  add_layers();
  add_mtp();
}

// The full DAG: embedding -> each layer's ops (each op fed by those its template names: the
// previous op, and for a residual add also the stream it adds to) -> head ops. Each kind's ops and
// boundaries are those of its first layer.
void LayerGraph::add_layers() {
  const ModelSpec& m = model_;
  auto prev = boost::add_vertex(pre_ops_.front(), graph_);
  layer_kind_.resize(static_cast<std::size_t>(m.layers));
  kind_prefix_.assign(static_cast<std::size_t>(m.layers) + 1, KindCounts{});
  std::vector<Graph::vertex_descriptor> v;
  for (int l = 0; l < m.layers; ++l) {
    const LayerKind kind{m.is_moe_layer(l), m.layer_attention_at(l, seq_len_)};
    const int k = kind_of(kind);
    const bool first = kinds_[k].ops.empty();
    LayerTemplate t = transformer_layer(m, seq_len_, kind, layer_prefix(l));
    v.clear();
    for (std::size_t i = 0; i < t.ops.size(); ++i) {
      t.ops[i].layer = l;
      v.push_back(boost::add_vertex(t.ops[i], graph_));
      for (int in : t.inputs[i])
        if (in >= -1) boost::add_edge(in < 0 ? prev : v[static_cast<std::size_t>(in)], v.back(), graph_);
      if (first) count_boundaries(v.back(), kinds_[k].boundaries);
    }
    prev = v.back();
    if (first) {
      for (const OpSpec& op : t.ops) kinds_[k].params += op.params;
      kinds_[k].ops = std::move(t.ops);
    }
    layer_kind_[l] = static_cast<std::uint8_t>(k);
    kind_prefix_[l + 1] = kind_prefix_[l];
    ++kind_prefix_[l + 1][k];
  }
  for (const auto& op : post_ops_) {
    auto w = boost::add_vertex(op, graph_);
    boost::add_edge(prev, w, graph_);
    prev = w;
  }
}

// DeepSeek-V3's MTP modules (report Sec. 2.2, Fig. 3): each normalises the main model's last hidden
// state and the embedding of the next token (RMSNorm each, h parameters), projects their
// concatenation 2h -> h, runs one transformer layer (an MoE layer where the model has experts,
// full attention), then the shared LM head after its own final norm, and a loss. Only the norms,
// the projection and the layer are the module's own parameters.
void LayerGraph::add_mtp() {
  const ModelSpec& m = model_;
  if (m.mtp_layers == 0) return;
  const double h = m.hidden;
  mtp_kind_ = kind_of(LayerKind{m.moe.on(), AttentionWindow::full});
  if (kinds_[mtp_kind_].ops.empty()) {  // a kind no main layer has
    LayerTemplate t = transformer_layer(m, seq_len_, kinds_[mtp_kind_].kind, "mtp.");
    for (const OpSpec& op : t.ops) kinds_[mtp_kind_].params += op.params;
    kinds_[mtp_kind_].ops = std::move(t.ops);
  }
  for (const char* n : {"mtp.enorm", "mtp.hnorm"}) mtp_ops_.push_back(norm_op(m, n, h));
  OpSpec proj{.name = "mtp.eh_proj", .kind = OpKind::mtp_proj, .split = Split::sequence, .matmul = true};
  proj.flops_per_token = 2 * (2 * h) * h;
  proj.traffic_elems_per_token = 3 * h;
  proj.params = 2 * h * h;
  proj.saved_seq_elems_per_token = 2 * h;
  proj.out_width = h;
  mtp_ops_.push_back(proj);
  for (const OpSpec& op : post_ops_) {
    OpSpec o = op;
    o.name = "mtp." + op.name;
    if (o.kind == OpKind::lm_head) o.params = 0;  // the main model's head
    mtp_head_ops_.push_back(o);
  }
  // The graph: each module reads the last layer's output (the first module) or the previous
  // module's layer, and the embedding.
  const auto vertices = static_cast<Graph::vertex_descriptor>(boost::num_vertices(graph_));
  Graph::vertex_descriptor hidden = vertices - 1 - post_ops_.size(), last = hidden;
  for (int i = 0; i < m.mtp_layers; ++i) {
    auto e = boost::add_vertex(mtp_ops_[0], graph_), n = boost::add_vertex(mtp_ops_[1], graph_);
    boost::add_edge(0, e, graph_);
    boost::add_edge(hidden, n, graph_);
    auto p = boost::add_vertex(mtp_ops_[2], graph_);
    boost::add_edge(e, p, graph_);
    boost::add_edge(n, p, graph_);
    last = p;
    for (const OpSpec& op : kinds_[mtp_kind_].ops) {
      auto w = boost::add_vertex(op, graph_);
      boost::add_edge(last, w, graph_);
      last = w;
    }
    hidden = last;
    for (const OpSpec& op : mtp_head_ops_) {
      auto w = boost::add_vertex(op, graph_);
      boost::add_edge(last, w, graph_);
      last = w;
    }
  }
}

// A boundary sits on an edge between the TP region (tensor-split ops) and outside it (sequence-
// split and routed-expert ops): what crosses is the producer's output.
void LayerGraph::count_boundaries(Graph::vertex_descriptor v, LayerBoundaries& b) const {
  const OpSpec& to = graph_[v];
  if (to.kind == OpKind::attention) ++b.attention;
  for (auto [e, end] = boost::in_edges(v, graph_); e != end; ++e) {
    const OpSpec& from = graph_[boost::source(*e, graph_)];
    const bool from_tensor = from.split == Split::tensor, to_tensor = to.split == Split::tensor;
    if (from_tensor == to_tensor) continue;
    const bool enter = to_tensor;
    int& n = enter ? b.enter : b.exit;
    TRAINPLAN_CHECK(n < LayerBoundaries::kMax, "more TP boundaries in a layer than LayerBoundaries::kMax");
    (enter ? b.enter_width : b.exit_width)[static_cast<std::size_t>(n)] = from.out_width;
    ++n;
  }
}

std::vector<const OpSpec*> LayerGraph::topological_order() const {
  std::vector<Graph::vertex_descriptor> order;
  boost::topological_sort(graph_, std::back_inserter(order));
  std::vector<const OpSpec*> out;
  for (auto it = order.rbegin(); it != order.rend(); ++it) out.push_back(&graph_[*it]);
  return out;
}

double rank_params(const OpSpec& op, int tp, int expert_shards) {
  if (op.split == Split::expert) return op.params * (1.0 / expert_shards);
  const bool split = op.split == Split::tensor || op.kind == OpKind::embedding || op.kind == OpKind::lm_head;
  if (!split) return op.params;
  return (op.params - op.replicated_params) * (1.0 / tp) + op.replicated_params;
}

LayerGraph::KindCounts LayerGraph::kind_counts(int first, int n) const {
  KindCounts out{};
  const KindCounts& a = kind_prefix_[static_cast<std::size_t>(first)];
  const KindCounts& b = kind_prefix_[static_cast<std::size_t>(first + n)];
  for (int k = 0; k < kMaxKinds; ++k) out[k] = b[k] - a[k];
  return out;
}

double LayerGraph::params_per_layer_per_rank(int tp) const { return kind_params_per_rank(0, tp, 1); }

double LayerGraph::kind_params_per_rank(int k, int tp, int expert_shards) const {
  double p = 0;
  for (const auto& op : kinds_[k].ops) p += rank_params(op, tp, expert_shards);
  return p;
}

double LayerGraph::embedding_params() const { return pre_ops_.front().params; }

double LayerGraph::head_params() const {
  double p = 0;
  for (const auto& op : post_ops_) p += op.params;
  return p;
}

double LayerGraph::total_params() const { return counts().total; }

ParamCounts LayerGraph::counts() const {
  ParamCounts c;
  const double routed = model_.moe.on() ? static_cast<double>(model_.moe.top_k) / model_.moe.experts : 0;
  double layers_total = 0, layers_active = 0;
  for (const KindInfo& k : kinds_) {
    const double n = kind_prefix_.back()[static_cast<std::size_t>(&k - kinds_.data())];
    double expert = 0;
    for (const OpSpec& op : k.ops)
      if (op.split == Split::expert) expert += op.params;
    layers_total += n * k.params;
    layers_active += n * (k.params - expert + routed * expert);
    c.expert += n * expert;
  }
  c.embedding = embedding_params();
  c.total = c.embedding + layers_total + head_params();
  c.active = c.embedding + layers_active + head_params();
  if (mtp_kind_ >= 0) {
    double own = kinds_[mtp_kind_].params;
    for (const OpSpec& op : mtp_ops_) own += op.params;
    for (const OpSpec& op : mtp_head_ops_) own += op.params;
    c.mtp = model_.mtp_layers * own;
  }
  return c;
}

Flops LayerGraph::forward_flops(Flops (*flops)(const OpSpec&)) const {
  Flops f = 0;
  for (std::size_t k = 0; k < kinds_.size(); ++k) {
    Flops layer = 0;
    for (const auto& op : kinds_[k].ops) layer += flops(op);
    f += kind_prefix_.back()[k] * layer;
  }
  for (const auto& op : pre_ops_) f += flops(op);
  for (const auto& op : post_ops_) f += flops(op);
  if (mtp_kind_ >= 0) {
    Flops module = 0;
    for (const auto& op : kinds_[mtp_kind_].ops) module += flops(op);
    for (const auto& op : mtp_ops_) module += flops(op);
    for (const auto& op : mtp_head_ops_) module += flops(op);
    f += model_.mtp_layers * module;
  }
  return f;
}

Flops LayerGraph::forward_flops_per_token() const { return forward_flops(causal_flops_per_token); }

Flops LayerGraph::forward_flops_per_token_full_attention() const {
  return forward_flops([](const OpSpec& op) { return op.flops_per_token; });
}

}  // namespace trainplan
