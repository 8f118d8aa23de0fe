#include "exec/model.hpp"

#include <fmt/format.h>

#include <cmath>

#include "exec/kernels/cross_entropy.hpp"
#include "exec/kernels/fused_ops.hpp"
#include "exec/kernels/ring_attention.hpp"

namespace trainplan::exec {

struct ModelChunk::Layer {
  int ln1_w = -1, ln1_b = -1, ln2_w = -1, ln2_b = -1;
  int wqkv = -1, bq = -1, bv = -1, wo = -1, bo = -1;  // wqkv: wq, wk, wv fused (ParamInfo::parts)
  int w1 = -1, b1 = -1, w2 = -1, b2 = -1, wgu = -1;   // gelu: w1,b1,w2,b2; swiglu: wgu (gate and up fused), w2 (down)
  // An MoE layer: the MLP fields above hold its shared experts (none: -1), these the rest.
  bool moe = false;
  int local = 0;  // its index among the chunk's layers (the expert chunk's layer of the same index)
  int router = -1, router_b = -1, shared_gate = -1;
  struct Expert {  // an expert chunk's layer: one routed expert
    int w_in = -1, bg = -1, b1 = -1, w2 = -1, b2 = -1;  // w_in: wgu (SwiGLU) or w1; bg, b1: its biases
  };
  std::vector<Expert> experts;
  CheckpointFn whole;      // full recomputation: the layer
  CheckpointFn attention;  // selective recomputation: the attention core
};

namespace {

// Standard deviation of the normal initialisation of weight matrices and embeddings: GPT-2's
// (Radford et al. 2019, as in its released code and Megatron's --init-method-std default).
constexpr double kInitStd = 0.02;

// FNV-1a of the parameter name mixed with the seed: each parameter's own random stream, the same
// whatever the layout.
uint64_t param_seed(long long seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(seed);
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h & ((1ull << 62) - 1);
}


// Halves by chunk rather than narrow: backward, a split's parts join in one cat, where each
// narrow would fill a zero tensor of the whole, copy its part in, and the parts be summed.
at::Tensor rotate_half(const at::Tensor& x) {
  const auto halves = x.chunk(2, -1);
  return at::cat({-halves[1], halves[0]}, -1);
}

}  // namespace

void free_unit_memory(ParamUnit& u) {
  c10::StorageImpl* s = u.buffer.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(s->allocator()->allocate(0));
  s->set_nbytes(0);
}

at::Tensor alloc_unit_memory(ParamUnit& u) {
  const int64_t n = u.end - u.begin;
  const size_t bytes = static_cast<size_t>(n) * u.buffer.element_size();
  c10::StorageImpl* s = u.buffer.storage().unsafeGetStorageImpl();
  if (s->nbytes() != bytes) {
    s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
    s->set_nbytes(bytes);
  }
  torch::NoGradGuard ng;
  return at::empty({0}, u.buffer.options()).set_(u.buffer.storage(), 0, {n}, {1});
}

bool unit_present(const ParamUnit& u) { return u.buffer.storage().nbytes() > 0 || u.end == u.begin; }

int64_t local_seq_len(const ModelSettings& s) {
  return s.seq_len / s.cp / (s.sequence_parallel && s.tp > 1 ? s.tp : 1);
}

ModelChunk::ModelChunk(const ModelSettings& s, const ChunkPlacement& place, Comm& tp, Comm& cp, PhaseClock& clock)
    : s_(s), place_(place), tp_(tp), cp_(cp), clock_(clock) {
  const ModelSpec& m = s_.spec;
  const bool layernorm = m.norm == Norm::layernorm;
  head_dim_ = m.head_dim();
  heads_local_ = m.heads / s_.tp;
  kv_local_ = m.kv_heads / s_.tp;
  const int64_t h = m.hidden;
  const int64_t vocab_rows = padded_vocab(m.vocab, s_.tp);
  positions_ = zigzag_positions(s_.seq_len, s_.cp, s_.cp_rank).to(s_.device);
  if (m.moe.on()) {
    moe_ = {m.moe.experts, m.moe.top_k, m.moe.scoring, m.activation, s_.ep, s_.ep_rank, s_.capacity_factor,
            s_.fuse_composites, s_.fuse_library_ops};
  }
  if (place_.experts) {  // the routed experts of the chunk's layers, one unit per layer
    TORCH_CHECK(!place_.has_embedding && !place_.has_head, "an expert chunk holds only routed experts");
    for (int i = 0; i < place_.layers; ++i) {
      begin_unit(true);
      layers_.push_back(declare_experts(place_.first_layer + i));
    }
    materialize();
    return;
  }

  if (place_.has_embedding) {
    // The embedding's backward reads only the token indices, never the weights' values.
    begin_unit(false);
    embed_unit_ = 0;
    wte_ = declare("embed.wte", {vocab_rows, h}, 0, kInitStd, 0, m.vocab);
    if (m.position == Position::learned) wpe_ = declare("embed.wpe", {s_.seq_len, h}, -1, kInitStd);
  }
  for (int i = 0; i < place_.layers; ++i) {
    begin_unit(true);
    if (i == 0) first_layer_unit_ = static_cast<int>(units_.size()) - 1;
    layers_.push_back(declare_layer(place_.first_layer + i));
    layers_.back()->local = i;
  }
  if (place_.has_head) {
    begin_unit(true);
    head_unit_ = static_cast<int>(units_.size()) - 1;
    norm_w_ = declare("head.norm.w", {h}, -1, 0, 1);
    if (layernorm) norm_b_ = declare("head.norm.b", {h}, -1, 0, 0);
    // A tied head is a copy of the word embedding (same name, same initial values); when it sits
    // on another rank than the embedding, the two copies' gradients are summed every step.
    if (m.tied_embeddings)
      head_ = place_.has_embedding ? wte_ : declare("embed.wte", {vocab_rows, h}, 0, kInitStd, 0, m.vocab);
    else
      head_ = declare("head.lm", {vocab_rows, h}, 0, kInitStd, 0, m.vocab);
  }
  materialize();
  if (m.position == Position::rope) make_rope_tables();
}

// One transformer layer's parameters (pass 1), in the unit begun for it.
std::unique_ptr<ModelChunk::Layer> ModelChunk::declare_layer(int layer) {
  const ModelSpec& m = s_.spec;
  const bool layernorm = m.norm == Norm::layernorm;
  const bool biases = m.activation == Activation::gelu;  // GPT-2 linears have biases, Llama's do not
  const int64_t h = m.hidden, f = m.ffn_hidden, q_out = m.q_width(), kv_out = m.kv_width();
  // Output projections scaled down by sqrt(2 * layers), GPT-2's residual-path initialisation.
  const double std_in = kInitStd, std_out = kInitStd / std::sqrt(2.0 * m.layers);
  auto l = std::make_unique<Layer>();
  const std::string p = fmt::format("layers.{}.", layer);
  l->ln1_w = declare(p + "norm1.w", {h}, -1, 0, 1);
  if (layernorm) l->ln1_b = declare(p + "norm1.b", {h}, -1, 0, 0);
  l->wqkv = declare_fused(p + "attn.wqkv", {{p + "attn.wq", q_out}, {p + "attn.wk", kv_out}, {p + "attn.wv", kv_out}},
                          h, std_in);
  if (biases) {
    l->bq = declare(p + "attn.bq", {q_out}, 0, 0, 0);
    // No key bias: softmax is invariant to it, so its exact gradient is zero and it would only
    // be driven by rounding noise (which Adam normalises into full-size updates).
    l->bv = declare(p + "attn.bv", {kv_out}, 0, 0, 0);
  }
  l->wo = declare(p + "attn.wo", {h, q_out}, 1, std_out);
  if (biases) l->bo = declare(p + "attn.bo", {h}, -1, 0, 0);
  l->ln2_w = declare(p + "norm2.w", {h}, -1, 0, 1);
  if (layernorm) l->ln2_b = declare(p + "norm2.b", {h}, -1, 0, 0);
  if (!m.is_moe_layer(layer)) {
    declare_mlp(*l, p + "mlp.", f);
  } else {
    l->moe = true;
    l->router = declare(p + "moe.router", {m.moe.experts, h}, -1, kInitStd);
    if (m.moe.router_bias) l->router_b = declare(p + "moe.router_b", {m.moe.experts}, -1, 0, 0);
    if (m.moe.shared_gate) l->shared_gate = declare(p + "moe.shared_gate", {1, h}, -1, kInitStd);
    const int64_t shared = static_cast<int64_t>(m.moe.shared_experts) * m.moe.shared_ffn;
    if (shared > 0) declare_mlp(*l, p + "moe.shared.", shared);
  }
  const Layer* lp = l.get();
  l->whole = [this, lp](const std::vector<at::Tensor>& in) { return layer_forward(*lp, in[0]); };
  l->attention = [this, lp](const std::vector<at::Tensor>& in) { return attention_core(*lp, in[0], in[1], in[2]); };
  return l;
}

void ModelChunk::declare_mlp(Layer& l, const std::string& p, int64_t f) {
  const ModelSpec& m = s_.spec;
  const bool gpt = m.activation == Activation::gelu;  // GELU and biases (GPT-2), else SwiGLU without
  const int64_t h = m.hidden;
  const double std_in = kInitStd, std_out = kInitStd / std::sqrt(2.0 * m.layers);
  if (gpt)
    l.w1 = declare(p + "w1", {f, h}, 0, std_in);
  else  // SwiGLU's gate and up projections: one GEMM
    l.wgu = declare_fused(p + "wgu", {{p + "wg", f}, {p + "w1", f}}, h, std_in);
  if (gpt) l.b1 = declare(p + "b1", {f}, 0, 0, 0);
  l.w2 = declare(p + "w2", {h, f}, 1, std_out);
  if (gpt) l.b2 = declare(p + "b2", {h}, -1, 0, 0);
}

// The routed experts this EP rank holds of layer `layer` (none for a dense layer), initialised as
// the dense MLP is; biases (zero) where the model's experts have them.
std::unique_ptr<ModelChunk::Layer> ModelChunk::declare_experts(int layer) {
  const ModelSpec& m = s_.spec;
  auto l = std::make_unique<Layer>();
  if (!m.is_moe_layer(layer)) return l;
  l->moe = true;
  const bool swiglu = m.activation == Activation::swiglu, bias = m.moe.expert_bias;
  const int64_t h = m.hidden, f = m.moe.expert_ffn;
  const double std_in = kInitStd, std_out = kInitStd / std::sqrt(2.0 * m.layers);
  const int local = m.moe.experts / s_.ep;
  for (int k = 0; k < local; ++k) {
    const std::string p = fmt::format("layers.{}.moe.experts.{}.", layer, s_.ep_rank * local + k);
    Layer::Expert e;
    e.w_in = swiglu ? declare_fused(p + "wgu", {{p + "wg", f}, {p + "w1", f}}, h, std_in)
                    : declare(p + "w1", {f, h}, 0, std_in);
    if (bias && swiglu) e.bg = declare(p + "bg", {f}, 0, 0, 0);
    if (bias) e.b1 = declare(p + "b1", {f}, 0, 0, 0);
    e.w2 = declare(p + "w2", {h, f}, 1, std_out);
    if (bias) e.b2 = declare(p + "b2", {h}, -1, 0, 0);
    l->experts.push_back(e);
  }
  return l;
}

// RoPE (Su et al. 2021), rotate-half form, base 10000, at this rank's sequence positions.
void ModelChunk::make_rope_tables() {
  auto inv = at::pow(10000.0, -at::arange(0, head_dim_, 2, at::kDouble) / head_dim_);
  auto freqs = at::outer(positions_.cpu().to(at::kDouble), inv);
  auto emb = at::cat({freqs, freqs}, -1).to(at::kFloat).to(s_.device);
  const int64_t L = positions_.size(0);
  rope_cos_ = emb.cos().view({L, 1, 1, head_dim_});
  rope_sin_ = emb.sin().view({L, 1, 1, head_dim_});
}

ModelChunk::~ModelChunk() = default;

void ModelChunk::begin_unit(bool backward_values) {
  ParamUnit u;
  u.begin = u.end = params_.empty() ? 0 : params_.back().offset + params_.back().numel;
  u.backward_values = backward_values;
  units_.push_back(u);
}

int ModelChunk::declare(const std::string& name, std::vector<int64_t> full_shape, int shard_dim, double init_std,
                        double fill, int64_t init_rows) {
  ParamInfo p;
  p.name = name;
  p.full_shape = full_shape;
  p.shard_dim = s_.tp > 1 ? shard_dim : -1;
  p.decay = full_shape.size() >= 2;
  int64_t n = 1;
  for (size_t d = 0; d < full_shape.size(); ++d) {
    int64_t e = full_shape[d];
    if (static_cast<int>(d) == p.shard_dim) {
      TORCH_CHECK(e % s_.tp == 0, name, ": dimension ", e, " is not divisible by tp ", s_.tp);
      e /= s_.tp;
    }
    n *= e;
  }
  p.numel = n;
  p.offset = params_.empty() ? 0 : params_.back().offset + params_.back().numel;
  units_.back().end = p.offset + p.numel;
  params_.push_back(std::move(p));
  init_.push_back({{name, full_shape, init_std, fill, init_rows < 0 ? full_shape[0] : init_rows}});
  return static_cast<int>(params_.size()) - 1;
}

int ModelChunk::declare_fused(const std::string& name, const std::vector<std::pair<std::string, int64_t>>& part_rows,
                              int64_t cols, double init_std) {
  ParamInfo p;
  p.name = name;
  p.shard_dim = s_.tp > 1 ? 0 : -1;
  p.decay = true;
  std::vector<Init> inits;
  int64_t rows = 0;
  for (const auto& [part, r] : part_rows) {
    TORCH_CHECK(r % s_.tp == 0, part, ": dimension ", r, " is not divisible by tp ", s_.tp);
    p.parts.push_back({part, {r, cols}, r / s_.tp});
    inits.push_back({part, {r, cols}, init_std, 0, r});
    rows += r;
  }
  p.full_shape = {rows, cols};
  p.numel = rows / s_.tp * cols;
  p.offset = params_.empty() ? 0 : params_.back().offset + params_.back().numel;
  units_.back().end = p.offset + p.numel;
  params_.push_back(std::move(p));
  init_.push_back(std::move(inits));
  return static_cast<int>(params_.size()) - 1;
}

std::vector<ParamInfo> ModelChunk::tensors() const {
  std::vector<ParamInfo> out;
  for (const ParamInfo& p : params_) {
    if (p.parts.empty()) {
      out.push_back(p);
      continue;
    }
    const int64_t cols = p.full_shape[1];
    int64_t row = 0;
    for (const ParamInfo::Part& part : p.parts) {
      ParamInfo t;
      t.name = part.name;
      t.full_shape = part.full_shape;
      t.shard_dim = p.shard_dim;
      t.offset = p.offset + row * cols;
      t.numel = part.rows * cols;
      t.decay = p.decay;
      // A view only while the parameter's memory is present (a released ZeRO-3 unit has none).
      if (p.param.defined() && p.param.storage().nbytes() > 0) t.param = p.param.detach().narrow(0, row, part.rows);
      row += part.rows;
      out.push_back(std::move(t));
    }
  }
  return out;
}

at::Tensor ModelChunk::values(int64_t offset, int64_t numel) const {
  if (flat_.defined()) return flat_.narrow(0, offset, numel);
  for (const ParamUnit& u : units_)
    if (offset >= u.begin && offset + numel <= u.end) return u.buffer.narrow(0, offset - u.begin, numel);
  TORCH_CHECK(false, "values: elements [", offset, ", ", offset + numel, ") lie in no unit");
}

void ModelChunk::materialize() {
  int64_t total = params_.empty() ? 0 : params_.back().offset + params_.back().numel;
  total = std::max<int64_t>(1, (total + s_.pad_to - 1) / s_.pad_to) * s_.pad_to;
  numel_ = total;
  auto opts = at::TensorOptions().dtype(at::kFloat).device(s_.device);
  if (s_.unit_buffers)
    for (ParamUnit& u : units_) {
      u.buffer = at::zeros({u.end - u.begin}, opts.dtype(s_.unit_dtype));
      if (s_.unit_dtype != at::kFloat) u.initial = at::zeros({u.end - u.begin}, opts);  // for the fp32 master
    }
  else
    flat_ = at::zeros({total}, opts);
  if (s_.grad_buffer) flat_grad_ = at::zeros({total}, opts);
  torch::NoGradGuard no_grad;
  size_t unit = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamInfo& p = params_[i];
    std::vector<at::Tensor> local;  // this rank's rows of each part
    for (const auto& [name, full_shape, std_dev, fill, rows] : init_[i]) {
      at::Tensor full;
      if (std_dev > 0) {
        // The real rows are drawn as one [rows, ...] tensor whatever the padding, so that every TP
        // size starts from the same values.
        auto gen = at::make_generator<at::CPUGeneratorImpl>(param_seed(s_.seed, name));
        auto shape = full_shape;
        shape[0] = rows;
        full = at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)) * std_dev;
        if (rows < full_shape[0]) {
          shape[0] = full_shape[0] - rows;
          full = at::cat({full, at::zeros(shape, full.options())});
        }
      } else {
        full = at::full(full_shape, fill, at::TensorOptions().dtype(at::kFloat));
      }
      if (p.shard_dim >= 0) {
        const int64_t part = full_shape[p.shard_dim] / s_.tp;
        full = full.narrow(p.shard_dim, part * s_.tp_rank, part);
      }
      local.push_back(full);
    }
    at::Tensor full = local.size() == 1 ? local[0] : at::cat(local, 0);
    auto shape = full.sizes().vec();
    while (p.offset >= units_[unit].end) ++unit;
    at::Tensor base = s_.unit_buffers ? units_[unit].buffer.narrow(0, p.offset - units_[unit].begin, p.numel)
                                      : flat_.narrow(0, p.offset, p.numel);
    at::Tensor view = base.view(shape);
    view.copy_(full);
    if (s_.unit_buffers && units_[unit].initial.defined())
      units_[unit].initial.narrow(0, p.offset - units_[unit].begin, p.numel).view(shape).copy_(full);
    p.param = view.detach().requires_grad_(true);
    if (s_.grad_buffer) p.param.mutable_grad() = flat_grad_.narrow(0, p.offset, p.numel).view(shape);
  }
}

at::Tensor ModelChunk::norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const {
  const int64_t h = s_.spec.hidden;
  const bool layernorm = s_.spec.norm == Norm::layernorm;
  if (layernorm && s_.fuse_library_ops) return fused_layer_norm(x, w, b, 1e-5);
  if (!layernorm && s_.fuse_composites) return fused_rms_norm(x, w, 1e-5);
  // 16-bit ZeRO-3 parameters (ModelSettings::unit_dtype) normalise in the stream's dtype, as
  // autocast runs layer_norm in fp32 on CUDA (no cast for fp32 parameters).
  if (layernorm)
    return at::layer_norm(x, {h}, w.to(x.scalar_type()), b.defined() ? b.to(x.scalar_type()) : b, 1e-5);
  auto rms = at::rsqrt(x.pow(2).mean(-1, true) + 1e-5);
  return x * rms * w;
}

at::Tensor ModelChunk::to_tp(const at::Tensor& x) const {
  return s_.sequence_parallel ? gather_from_sp(x, tp_) : copy_to_tp(x, tp_);
}

at::Tensor ModelChunk::from_tp(const at::Tensor& x) const {
  return s_.sequence_parallel ? scatter_to_sp(x, tp_) : reduce_from_tp(x, tp_);
}

at::Tensor ModelChunk::attention_core(const Layer&, const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v) const {
  // q [s, b, hl, d], k/v [s, b, kvl, d] -> context [s, b, hl*d]
  auto qq = q.permute({1, 2, 0, 3});
  auto kk = k.permute({1, 2, 0, 3});
  auto vv = v.permute({1, 2, 0, 3});
  if (s_.cp > 1) {
    auto ctx = ring_attention(qq, kk, vv, cp_);
    return ctx.permute({2, 0, 1, 3}).reshape({q.size(0), q.size(1), int64_t(heads_local_) * head_dim_});
  }
  // Grouped-query attention: SDPA broadcasts each K/V head over its group of query heads
  // (enable_gqa) instead of materialising repeated K/V.
  auto ctx = at::scaled_dot_product_attention(qq, kk, vv, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                              /*enable_gqa=*/kv_local_ != heads_local_);
  return ctx.permute({2, 0, 1, 3}).reshape({q.size(0), q.size(1), int64_t(heads_local_) * head_dim_});
}

at::Tensor ModelChunk::layer_forward(const Layer& l, const at::Tensor& x) const {
  auto P = [this](int i) { return i >= 0 ? params_[i].param : at::Tensor(); };
  // Attention block.
  auto hn = to_tp(norm(x, P(l.ln1_w), P(l.ln1_b)));  // [s, b, h]
  const int64_t s = hn.size(0), b = hn.size(1);
  // One GEMM for q, k and v (this rank's heads), bias folded in (GPT-2: q and v biases, none on k).
  const int64_t qw = int64_t(heads_local_) * head_dim_, kvw = int64_t(kv_local_) * head_dim_;
  at::Tensor bias;
  if (l.bq >= 0) bias = at::cat({P(l.bq), at::zeros({kvw}, P(l.bq).options()), P(l.bv)});
  auto qkv = at::linear(hn, P(l.wqkv), bias);  // [s, b, qw + 2 kvw]
  // Split, not narrowed: backward the three gradients are one cat (rotate_half says why).
  const auto parts = qkv.split_with_sizes({qw, kvw, kvw}, -1);
  auto q = parts[0].view({s, b, heads_local_, head_dim_});
  auto k = parts[1].view({s, b, kv_local_, head_dim_});
  auto v = parts[2].view({s, b, kv_local_, head_dim_});
  if (rope_cos_.defined() && s_.fuse_composites) {
    const at::Tensor cos = rope_cos_.view({rope_cos_.size(0), head_dim_}), sin = rope_sin_.view(cos.sizes());
    q = fused_rope(q, cos, sin);
    k = fused_rope(k, cos, sin);
  } else if (rope_cos_.defined()) {
    q = q * rope_cos_ + rotate_half(q) * rope_sin_;
    k = k * rope_cos_ + rotate_half(k) * rope_sin_;
  }
  at::Tensor ctx = s_.recompute == Recompute::selective ? checkpoint(&l.attention, {q, k, v}, clock_)
                                                         : attention_core(l, q, k, v);
  // Row-parallel output: with TP the bias is added once, after the sum over ranks; without, in the GEMM.
  auto o = s_.tp > 1 ? from_tp(at::linear(ctx, P(l.wo))) : at::linear(ctx, P(l.wo), P(l.bo));
  if (s_.tp > 1 && l.bo >= 0) o = o + P(l.bo);
  auto x1 = x + o;
  // MLP block, or the MoE block over this rank's own tokens.
  const at::Tensor h2 = norm(x1, P(l.ln2_w), P(l.ln2_b));
  return x1 + (l.moe ? moe_block(l, h2) : mlp(l, to_tp(h2)));
}

at::Tensor ModelChunk::mlp(const Layer& l, const at::Tensor& h2) const {
  auto P = [this](int i) { return i >= 0 ? params_[i].param : at::Tensor(); };
  at::Tensor a;
  if (l.w1 >= 0) {  // GELU
    auto h1 = at::linear(h2, P(l.w1), P(l.b1));
    a = s_.fuse_library_ops ? fused_gelu(h1) : at::gelu(h1, "tanh");
  } else if (s_.fuse_composites) {  // SwiGLU: gate and up from one GEMM
    a = fused_swiglu(at::linear(h2, P(l.wgu)));
  } else {
    const auto gate_up = at::linear(h2, P(l.wgu)).chunk(2, -1);
    a = at::silu(gate_up[0]) * gate_up[1];
  }
  // Row-parallel output: with TP the bias is added once, after the sum over ranks.
  auto o2 = s_.tp > 1 ? from_tp(at::linear(a, P(l.w2))) : at::linear(a, P(l.w2), P(l.b2));
  if (s_.tp > 1 && l.b2 >= 0) o2 = o2 + P(l.b2);
  return o2;
}

// hn [s, b, h]: this rank's tokens after the norm (with SP its slice of the sequence), which the
// router sends to their experts as they are; the shared experts see the whole sequence as the
// dense MLP does.
at::Tensor ModelChunk::moe_block(const Layer& l, const at::Tensor& hn) const {
  TORCH_CHECK(experts_ && ep_ && traffic_, "an MoE layer needs its chunk's routed experts (set_experts)");
  auto P = [this](int i) { return i >= 0 ? params_[i].param : at::Tensor(); };
  auto E = [this](int i) { return i >= 0 ? experts_->params_[i].param : at::Tensor(); };
  std::vector<ExpertWeights> local;
  for (const Layer::Expert& e : experts_->layers_.at(l.local)->experts) {
    const at::Tensor b_in = e.bg >= 0 ? at::cat({E(e.bg), E(e.b1)}) : E(e.b1);
    local.push_back({E(e.w_in), b_in, E(e.w2), E(e.b2)});
  }
  const at::Tensor tokens = hn.reshape({-1, hn.size(-1)});
  at::Tensor out = routed_experts(tokens, {P(l.router), P(l.router_b)}, local, moe_, *ep_, *traffic_).view(hn.sizes());
  if (l.w2 >= 0) {  // shared experts
    at::Tensor shared = mlp(l, to_tp(hn));
    if (l.shared_gate >= 0) shared = shared * at::sigmoid(at::linear(hn, P(l.shared_gate)));
    out = out + shared;
  }
  return out;
}

void ModelChunk::set_experts(ModelChunk& experts, Comm& ep, ExpertTraffic& traffic) {
  TORCH_CHECK(experts.place_.experts && experts.layers_.size() == layers_.size(),
              "set_experts: an expert chunk of the same layers");
  experts_ = &experts;
  ep_ = &ep;
  traffic_ = &traffic;
}

at::Tensor ModelChunk::embed(const at::Tensor& tokens) {
  // Vocabulary-parallel lookup: this rank holds rows [lo, lo + rows); other tokens give zeros and
  // the partial embeddings are summed over the TP group.
  const at::Tensor& wte = params_[wte_].param;
  const int64_t rows = wte.size(0), lo = rows * s_.tp_rank;
  auto outside = (tokens < lo).logical_or(tokens >= lo + rows);
  auto local = (tokens - lo).masked_fill(outside, 0);
  // The residual stream is fp32 (a 16-bit ZeRO-3 table's lookup too).
  auto e = at::embedding(wte, local).to(at::kFloat).masked_fill(outside.unsqueeze(-1), 0.0);  // [b, s, h]
  e = e.transpose(0, 1).contiguous();                                           // [s, b, h]
  e = from_tp(e);
  if (wpe_ >= 0) {
    at::Tensor pos = s_.cp > 1 ? params_[wpe_].param.index_select(0, positions_) : params_[wpe_].param;
    if (s_.sequence_parallel && s_.tp > 1) {
      const int64_t part = pos.size(0) / s_.tp;
      pos = pos.narrow(0, part * s_.tp_rank, part);
    }
    e = e + pos.unsqueeze(1);
  }
  return e;
}

at::Tensor ModelChunk::head_loss(const at::Tensor& x, const at::Tensor& targets) {
  auto hn = to_tp(norm(x, params_[norm_w_].param, norm_b_ >= 0 ? params_[norm_b_].param : at::Tensor()));
  const at::Tensor& w = params_[head_].param;
  const VocabShard shard = vocab_shard(s_.spec.vocab, w.size(0), s_.tp_rank);
  const int64_t chunk = std::max<int64_t>(1, s_.loss_chunk_bytes / (4 * std::max<int64_t>(1, shard.valid)));
  auto t = targets.transpose(0, 1).reshape({-1});  // [s * b], the order of hn's rows
  at::Tensor loss = vocab_parallel_cross_entropy(hn.reshape({-1, hn.size(-1)}), w, t, shard, tp_, chunk);
  // Context parallelism: every CP rank holds seq/cp of each sequence, so the micro-batch's mean
  // is the mean of the CP ranks' means (summed forward; each rank's backward carries 1/cp).
  if (s_.cp > 1) loss = reduce_from_tp(loss, cp_) / static_cast<double>(s_.cp);
  return loss;
}

void ModelChunk::need(int unit, int prefetch) {
  if (gatherer_ && unit >= 0) gatherer_->need(*this, unit, prefetch);
}

void ModelChunk::release(int unit) {
  if (gatherer_ && unit >= 0) gatherer_->release(*this, unit);
}

void ModelChunk::hook_boundary(at::Tensor& t, int before, int also) {
  if (!gatherer_ || !t.requires_grad()) return;
  const int done = before + 1 < static_cast<int>(units_.size()) ? before + 1 : -1;
  // The tied head's unit also reads the embedding's unit (wte): released with it.
  const int done_also = done >= 0 && done == head_unit_ && head_ == wte_ ? embed_unit_ : -1;
  const int next = before >= 1 && units_[before - 1].backward_values ? before - 1 : -1;
  t.register_hook([this, done, done_also, before, also, next](const at::Tensor&) {
    release(done);
    release(done_also);
    if (before >= 0 && units_[before].backward_values) {
      need(also);
      need(before, next);
    }
  });
}

at::Tensor ModelChunk::forward(const at::Tensor& input, const at::Tensor& targets) {
  // This CP rank's tokens of each sequence (all of them without CP).
  auto mine = [this](const at::Tensor& t) { return s_.cp > 1 ? t.index_select(1, positions_) : t; };
  // ZeRO-3 (a gatherer is set): each unit's parameters are brought just before it runs, the next
  // unit's meanwhile, and freed after; in the backward likewise in reverse, from hooks on the
  // tensors between units (the gradient reaching a unit's output starts its backward, the one
  // reaching its input ends it).
  const int units = static_cast<int>(units_.size());
  at::Tensor x = input;
  if (place_.has_embedding) {
    need(embed_unit_, embed_unit_ + 1 < units ? embed_unit_ + 1 : -1);
    x = embed(mine(input));
    release(embed_unit_);
  }
  const at::Tensor my_targets = place_.has_head ? mine(targets) : at::Tensor();
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int unit = first_layer_unit_ + static_cast<int>(i);
    hook_boundary(x, unit - 1);
    need(unit, unit + 1 < units ? unit + 1 : -1);
    if (s_.recompute == Recompute::full)
      x = checkpoint(&layers_[i]->whole, {x}, clock_);
    else
      x = layer_forward(*layers_[i], x);
    release(unit);
  }
  if (!place_.has_head) {
    hook_boundary(x, units - 1);
    return x;
  }
  const int tied = head_ == wte_ ? embed_unit_ : -1;  // the head reads the embedding's unit too
  hook_boundary(x, head_unit_ - 1);
  need(tied);
  need(head_unit_);
  at::Tensor loss = head_loss(x, my_targets);
  release(head_unit_);
  release(tied);
  hook_boundary(loss, head_unit_, tied);
  return loss;
}

std::vector<at::Tensor> ModelChunk::tp_partial_grads() {
  std::vector<at::Tensor> out;
  for (auto& p : params_)
    if (p.shard_dim < 0 && s_.tp > 1) out.push_back(p.param.grad());
  return out;
}

at::Tensor ModelChunk::tied_embedding_grad() {
  if (!s_.spec.tied_embeddings) return {};
  if (place_.has_embedding) return params_[wte_].param.grad();
  if (place_.has_head) return params_[head_].param.grad();
  return {};
}

}  // namespace trainplan::exec
