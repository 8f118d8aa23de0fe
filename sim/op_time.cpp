#include "sim/op_time.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "sim/model_spec.hpp"
#include "sim/plan_shape.hpp"

namespace trainplan {

Seconds PassCost::time(const HostLaunch& h) const {
  return h.graphed ? gpu : std::max(gpu, kernels * h.per_kernel + host);
}
Seconds PassCost::time_with_wait_before(const PassCost& tail, const HostLaunch& h) const {
  return PassCost{gpu - tail.gpu, kernels - tail.kernels, host - tail.host}.time(h) + tail.time(h);
}

PassCost operator*(double n, const PassCost& p) { return {n * p.gpu, n * p.kernels, n * p.host}; }

namespace {

// Tensor-core rate in `dtype` over the table dtype's: a quantized format's achieved speed-up where
// the derived tables carry one from published rates (OpDerivation::format_speedup), else the ratio
// of the cluster's datasheet peaks (gpu.peak_tflops): fp16 = bf16 (1), fp8 = 2 on Hopper and Ada,
// fp32 the fraction of its peak.
double dtype_speedup(const Cluster& c, Dtype dtype) {
  if (dtype == c.ops.dtype) return 1;
  if (const double achieved = c.ops.derivation.format_speedup(dtype); achieved > 0) return achieved;
  const double table_peak = c.gpu.peak(c.ops.dtype), peak = c.gpu.peak(dtype);
  return table_peak > 0 && peak > 0 ? peak / table_peak : 1;
}

}  // namespace

FlopsPerSecond matmul_rate_bound(const Cluster& c, Dtype dtype) {
  return std::max(c.ops.best_gemm_rate() * dtype_speedup(c, dtype), 2 * c.ops.best_attention_rate());
}

// FP8 GEMMs (Transformer Engine runs the forward and both backward products in FP8) are not in the
// measured 16-bit table. One FP8 tensor-core instruction does the work of a 16-bit one over r times
// the reduction length (r = fp8 peak / table peak, or the achieved speed-up, dtype_speedup), and r 1-byte operand elements move the bytes
// of one 16-bit element, so an FP8 GEMM is costed as the measured 16-bit GEMM whose reduction
// dimension is r times shorter: large GEMMs come out close to r x faster, small and short-reduction
// ones (bound by latency, tile quantisation and the 16-bit output) much less, as measured FP8
// GEMMs on Hopper are (e.g. about 1.5x at K = 1024 and 2x at K = 8192 for M = N = 8192; see the
// ops.source of topologies/dgx-h100.json). The reduction dimension is K for the forward, N for the
// input gradient (dY W) and M, the tokens, for the weight gradient (dY^T X).
//
// The block-scaled formats (mxfp8, nvfp4) follow the same rule at their own ratio (by the peaks,
// r = 2 for MXFP8 and 4 for NVFP4 on B200): their scales are applied inside the tensor-core
// instruction.
Seconds gemm_time(const Cluster& c, Dtype dtype, double m, double n, double k, GemmPass pass) {
  const OpCostTables& t = c.ops;
  const bool narrow = quantized_gemms(dtype) && !quantized_gemms(t.dtype);
  Seconds time;
  if (narrow) {
    const double r = dtype_speedup(c, dtype);
    time = pass == GemmPass::fwd     ? t.gemm_time(m, n, k / r, pass)
           : pass == GemmPass::dgrad ? t.gemm_time(m, n / r, k, pass)
                                     : t.gemm_time(m / r, n, k, pass);
  } else {
    time = t.gemm_time(m, n, k, pass) / dtype_speedup(c, dtype);
  }
  // Misaligned operands: every pass reads or writes a matrix whose rows are N or K elements long
  // (X, W and Y are M x K, N x K and M x N, row-major), so either one off a 16-byte multiple puts
  // the whole GEMM on the unaligned kernels (the tables measure aligned shapes only).
  const long long per_16_bytes = dtype == Dtype::nvfp4 ? 32 : narrow ? 16 : dtype == Dtype::fp32 ? 4 : 8;  // elements
  const auto aligned = [per_16_bytes](double x) {
    const auto whole = static_cast<long long>(x);
    return static_cast<double>(whole) == x && (whole & (per_16_bytes - 1)) == 0;
  };
  if (!aligned(n) || !aligned(k)) time *= t.misaligned_gemm_slowdown;
  // Roofline floor: both inputs read and the result written once at the measured streaming
  // bandwidth; inputs at the format's width with its scales (gemm_input_bytes), the result in
  // 16 bits. The result is M x N forward, M x K for the input gradient and N x K for the weight
  // gradient.
  const double out = pass == GemmPass::fwd ? m * n : pass == GemmPass::dgrad ? m * k : n * k;
  const double in = m * k + k * n + m * n - out;
  const Bytes bytes = (narrow ? gemm_input_bytes(dtype) : 2.0) * in + 2.0 * out;
  return std::max(time, t.stream(bytes));
}

namespace {

// The inputs every op cost below reads, by reference. Nothing is derived here: the tokens, shares
// and element widths are the plan's shape's (plan_shape.hpp).
struct Ctx {
  const ModelSpec& m;
  const Cluster& c;
  const Software& sw;
  const Strategy& s;        // the shape's strategy
  const TokenShape& t;      // tokens per rank (t.per_rank inside the TP region, t.seq_split of a
                            // sequence-split tensor)
  const ElementBytes& b;    // bytes per element: b.activation, b.stream (the residual stream)
  const MoeShape& moe;      // an MoE layer's routed tokens on this rank
};

Ctx make_ctx(const LayerGraph& g, const Cluster& c, const Software& sw, const PlanShape& p) {
  return {g.model(), c, sw, p.strategy, p.tokens, p.bytes, p.moe};
}

// A memory-bound op: `impl`'s passes of its measured kernel on a tensor of `bytes`; every kernel
// takes at least the cluster's kernel floor.
PassCost mem_fwd(const Ctx& x, const MemOpImpl& impl, Bytes bytes) {
  if (impl.kernels_fwd == 0 && impl.passes_fwd == 0) return {};
  const Seconds t = impl.passes_fwd * x.c.ops.memory_fwd(impl.kernel, bytes);
  return {std::max(t, impl.kernels_fwd * x.c.ops.kernel_floor), static_cast<double>(impl.kernels_fwd)};
}
PassCost mem_bwd(const Ctx& x, const MemOpImpl& impl, Bytes bytes) {
  if (impl.kernels_bwd == 0 && impl.passes_bwd == 0) return {};
  const Seconds t = impl.passes_bwd * x.c.ops.memory_bwd(impl.kernel, bytes);
  return {std::max(t, impl.kernels_bwd * x.c.ops.kernel_floor), static_cast<double>(impl.kernels_bwd)};
}

// One linear layer's GEMM(s) in `dtype`: forward x W^T, backward dgrad + wgrad, on M tokens, N
// outputs, K inputs, split into `parts` equal GEMMs along N where the stack does not fuse them. A
// quantized format adds the quantization of each GEMM input (forward: the activation; backward:
// the output gradient), a memory-bound pass over it: fp8 the profile's fp8_quantize_passes; a
// block-scaled format the bytes ElementBytes::quantize_moved says, in passes of the add kernel
// (which moves 3 x its 16-bit input). Weights are quantized once a step, cached across micro-
// batches, and not counted. This is Transformer Engine's MXFP8 recipe: each Linear quantizes its
// input rowwise and columnwise in one kernel (input_quantizer.set_usage(rowwise=True,
// columnwise=backward_needs_input), module/linear.py and layernorm_linear.py), its output gradient
// likewise, and its weight through get_weight_workspace, cached after the first micro-batch; the
// norm before QKV and FC1 is not fused with the MXFP8 cast unless NVTE_NORM_FWD_USE_CUDNN is set
// (csrc/extensions/normalization.cpp, force_unfused_kernel), so every input pays its own pass.
struct LinearCost {
  PassCost fwd, bwd;
};
// Kernels per quantized GEMM input (Software::fp8_quantize_kernels for one scale per tensor).
double quantize_kernels(const Ctx& x, Dtype dtype) { return dtype == Dtype::fp8 ? x.sw.fp8_quantize_kernels : 1.0; }

// Add-kernel passes over each GEMM input that quantize it to `dtype` (0 for 16/32-bit GEMMs).
double quantize_passes(const Ctx& x, Dtype dtype) {
  return !quantized_gemms(dtype) ? 0.0
         : block_scaled(dtype)   ? x.b.quantize_moved / (3 * x.b.activation)
                                 : x.sw.fp8_quantize_passes;
}

LinearCost linear_in(const Ctx& x, Dtype dtype, double m, double n, double k, int parts = 1) {
  LinearCost out;
  const double np = n / parts;
  const double kernels = static_cast<double>(parts) * x.sw.gemm_kernels;
  const Seconds floor = x.c.ops.kernel_floor;
  out.fwd = {parts * std::max(floor, gemm_time(x.c, dtype, m, np, k, GemmPass::fwd)), kernels};
  // The FP8 rule above matches GEMMs with fast accumulation; a stack that accumulates the backward
  // products in higher precision (Transformer Engine's split accumulator for dgrad and wgrad)
  // runs those slower by the profile's factor. Block-scaled GEMMs have no such mode: the scales
  // are applied per block inside the instruction and products accumulate in fp32.
  const double bwd_slowdown = dtype == Dtype::fp8 ? x.sw.fp8_bwd_gemm_slowdown : 1.0;
  out.bwd = {parts * bwd_slowdown *
                 (std::max(floor, gemm_time(x.c, dtype, m, np, k, GemmPass::dgrad)) +
                  std::max(floor, gemm_time(x.c, dtype, m, np, k, GemmPass::wgrad))),
             2 * kernels};
  const double passes = quantize_passes(x, dtype);
  if (passes > 0) {
    const double q = quantize_kernels(x, dtype);
    out.fwd += {passes * x.c.ops.memory_fwd(MemKernel::add, m * k * x.b.activation), q};
    out.bwd += {passes * x.c.ops.memory_fwd(MemKernel::add, m * n * x.b.activation), q};
  }
  return out;
}
// A linear layer of the transformer, in the training dtype.
LinearCost linear(const Ctx& x, double m, double n, double k, int parts = 1) {
  return linear_in(x, x.s.dtype, m, n, k, parts);
}

// The attention core for one micro-batch on one rank: causal flash attention from the table of the
// stack's kernel (heads split over TP, queries over CP), or standard attention as two batched GEMMs over
// the materialised scores plus the memory-bound softmax and dropout on them.
// Multi-head latent attention's heads have query/key dims d_qk and value dims d_v: the flash kernel
// is timed at their mean, which gives its FLOPs (QK^T over d_qk, PV over d_v).
double attention_head_dim(const ModelSpec& m) {
  return m.mla.on() ? 0.5 * (m.mla.qk_head_dim() + m.mla.v_head_dim) : m.head_dim();
}

// A windowed layer's flash attention: queries attending a window of W (sliding) or a chunk of C
// tokens run as s / L attentions of length L over the same heads, L = C for chunks and 2W for a
// sliding window (the same work, s W keys in all, and the kernel's rate at that length). Under
// context parallelism (ring attention over windows is not modelled) the full attention's time is
// scaled by the window's share of its work (LayerGraph).
LinearCost windowed_flash(const Ctx& x, AttentionWindow w, const LinearCost& full, double batch_heads) {
  const double s = x.s.seq_len;
  const double len = w == AttentionWindow::chunked ? x.m.attention_chunk : std::min(s, 2.0 * x.m.sliding_window);
  LinearCost out;
  if (x.s.cp > 1) {
    const double share = w == AttentionWindow::chunked ? len / s : (2 * x.m.sliding_window / s) -
                                                                       (x.m.sliding_window / s) * (x.m.sliding_window / s);
    out.fwd = {share * full.fwd.gpu, full.fwd.kernels};
    out.bwd = {share * full.bwd.gpu, full.bwd.kernels};
    return out;
  }
  const int kernel = x.c.ops.attention_kernel(x.sw.attention_kernel);
  const double d = attention_head_dim(x.m), blocks = s / len;
  out.fwd = {x.c.ops.attention_fwd(len, d, batch_heads * blocks, kernel), full.fwd.kernels};
  out.bwd = {x.c.ops.attention_bwd(len, d, batch_heads * blocks, kernel), full.bwd.kernels};
  return out;
}

LinearCost attention_core(const Ctx& x, AttentionWindow window) {
  const double d = attention_head_dim(x.m), s = x.s.seq_len;
  const double batch_heads = static_cast<double>(x.s.micro_batch) * x.m.heads / x.s.tp;
  LinearCost out;
  if (x.s.attention == Attention::flash) {
    // Context parallelism (ring attention, load-balanced causal split): each rank does 1/cp of the
    // work as kernels over blocks of s/cp queries and keys, at the table's rate for that length:
    // cp x the time of one s/cp attention (FLOPs scale with the length squared), 2cp - 1 launches.
    // The stack's kernel where this GPU has a table for it, else the calibrated one (the CLI notes it).
    const double cp = x.s.cp, launches = 2 * cp - 1;
    const int kernel = x.c.ops.attention_kernel(x.sw.attention_kernel);
    out.fwd = {cp * x.c.ops.attention_fwd(s / cp, d, batch_heads, kernel), launches * x.sw.attention_kernels_fwd};
    out.bwd = {cp * x.c.ops.attention_bwd(s / cp, d, batch_heads, kernel), launches * x.sw.attention_kernels_bwd};
    if (window != AttentionWindow::full) out = windowed_flash(x, window, out, batch_heads);
    if (x.s.cp > 1) {
      // Each of the cp ring steps merges its partial output into the running one by the log-sum-exp
      // rescaling (forward, over the q-sized output) and adds its partial dQ, dK, dV into the
      // accumulators (backward): memory-bound passes the flash kernels themselves do not make.
      const double q = static_cast<double>(x.m.q_width()) / x.s.tp, kv = static_cast<double>(x.m.kv_width()) / x.s.tp;
      out.fwd += cp * mem_fwd(x, x.sw.mem.cp_merge, x.t.per_rank * q * x.b.activation);
      out.bwd += cp * mem_bwd(x, x.sw.mem.cp_merge, x.t.per_rank * (q + 2 * kv) * x.b.activation);
    }
    return out;
  }
  // Standard (Megatron 2021): scores = Q K^T over the full s x s (masked, not skipped), then
  // context = P V; as GEMMs of M = batch_heads * s / cp rows. Softmax (scale, mask, softmax fused:
  // read 2 B, write 2 B per score) moves 4 B per score element forward, 0.67x the add kernel's 6,
  // and 6 B backward (read output and gradient, write the gradient: 1x). Where the model trains with
  // dropout and the stack runs it (it keeps the masks), a separate dropout kernel on the scores
  // adds 5 B each way (read 2, write 2 and a 1-byte mask; backward read gradient and mask, write).
  // Its GEMMs run in 16 bits under every quantized format too: the stacks quantize only their
  // linear layers (Transformer Engine's fp8_autocast leaves DotProductAttention in BF16 by default).
  const double rows = batch_heads * s / x.s.cp;
  const Dtype attention_dtype = quantized_gemms(x.s.dtype) ? Dtype::bf16 : x.s.dtype;
  const LinearCost qk = linear_in(x, attention_dtype, rows, s, d);
  const LinearCost pv = linear_in(x, attention_dtype, rows, d, s);
  const Bytes scores = rows * s * x.b.activation;
  const bool dropout = runs_dropout(x.sw, x.m.dropout);
  const double fwd_passes = (4.0 + (dropout ? 5 : 0)) / 6, bwd_passes = (6.0 + (dropout ? 5 : 0)) / 6;
  out.fwd = qk.fwd;
  out.fwd += pv.fwd;
  out.fwd += {fwd_passes * x.c.ops.memory_fwd(MemKernel::add, scores), dropout ? 2.0 : 1.0};
  out.bwd = qk.bwd;
  out.bwd += pv.bwd;
  out.bwd += {bwd_passes * x.c.ops.memory_fwd(MemKernel::add, scores), dropout ? 2.0 : 1.0};
  return out;
}

const MemOpImpl& norm_impl(const Ctx& x) {
  return x.m.norm == Norm::layernorm ? x.sw.mem.layer_norm : x.sw.mem.rms_norm;
}

// Parameter-owning ops of a layer (two norms, QKV, output, MLP up, MLP down): the unit the
// gradient-accumulation kernels are counted in.
constexpr double kParamOpsPerLayer = 6;

// Attention widths (layer_graph.cpp): q = heads x head_dim (queries, attention output),
// kv = kv_heads x head_dim (keys, values each); q = h unless the model sets head_dim.
double q_width(const Ctx& x) { return static_cast<double>(x.m.q_width()); }
double kv_width(const Ctx& x) { return static_cast<double>(x.m.kv_width()); }

// One sequence-split tensor of the residual stream.
Bytes stream_tensor(const Ctx& x) { return x.t.seq_split * x.m.hidden * x.b.stream; }

// The per-layer CUDA graph regions (GraphModule bits) an op of a layer falls in: any of them captured
// captures it. The MLP side of a layer: its pre-MLP norm is captured with a dense MLP, with an MoE
// block whole, or with the part up to its router; its residual add with the dense MLP or the whole
// MoE block.
constexpr unsigned kAttnRegion = kGraphAttn;
constexpr unsigned kRouterRegion = kGraphMoe | kGraphMoeRouter;
constexpr unsigned kPreprocessRegion = kGraphMoe | kGraphMoePreprocess;
unsigned pre_mlp_region(bool moe) { return moe ? kRouterRegion : kGraphMlp; }
unsigned post_mlp_region(bool moe) { return moe ? kGraphMoe : kGraphMlp; }

// `p` as the host issues it in `region`: where a per-layer CUDA graph captures the region
// (Strategy::cuda_graph_modules), its kernels and host work replay with the graph, which
// layer_op_costs charges one launch per region and pass.
PassCost in_region(const Ctx& x, unsigned region, PassCost p) {
  if (x.s.cuda_graph_modules & region) p.kernels = p.host = 0;
  return p;
}
LinearCost in_region(const Ctx& x, unsigned region, LinearCost l) {
  return {in_region(x, region, l.fwd), in_region(x, region, l.bwd)};
}

// The residual stream's ops of one layer: two norms, two residual adds, dropout on the two
// branches, and the casts of the stream for the GEMMs that read it; one of each on the attention
// side, one on the MLP side (`moe`: an MoE block's).
void add_stream_ops(const Ctx& x, bool moe, LayerOpCosts& L) {
  const Software& sw = x.sw;
  const Bytes stream_t = stream_tensor(x);
  const auto add = [&](unsigned region, const MemOpImpl& impl, Bytes bytes, double n = 1) {
    L.fwd += in_region(x, region, n * mem_fwd(x, impl, bytes));
    L.bwd += in_region(x, region, n * mem_bwd(x, impl, bytes));
  };
  for (unsigned side : {kAttnRegion, pre_mlp_region(moe)}) add(side, norm_impl(x), stream_t);
  for (unsigned side : {kAttnRegion, post_mlp_region(moe)}) {
    add(side, sw.mem.residual, stream_t);
    // Dropout on the attention and MLP branches before they join the stream (a 1-byte mask
    // written forward and read backward, as the stack runs it: software memory_bound.dropout).
    if (runs_dropout(sw, x.m.dropout)) add(side, sw.mem.dropout, stream_t);
  }
  if (x.s.dtype != Dtype::fp32 && sw.autocast_casts_inputs) {
    // Autocast casts the stream once per GEMM that reads it: QKV (or Q, K, V) and MLP up (or gate
    // and up); backward casts each input gradient back and sums those of one tensor.
    const bool swiglu = x.m.activation == Activation::swiglu;
    const double attn_casts = sw.qkv_fused ? 1 : 3, mlp_casts = swiglu && !sw.gate_up_fused ? 2 : 1;
    const Bytes cast_t = x.t.per_rank * x.m.hidden * x.b.stream;
    add(kAttnRegion, sw.mem.autocast_cast, cast_t, attn_casts);
    add(pre_mlp_region(moe), sw.mem.autocast_cast, cast_t, mlp_casts);
    L.bwd += in_region(x, kAttnRegion, (attn_casts - 1) * mem_fwd(x, sw.mem.residual, cast_t));
    L.bwd += in_region(x, pre_mlp_region(moe), (mlp_casts - 1) * mem_fwd(x, sw.mem.residual, cast_t));
  }
}

// Multi-head latent attention's projections (layer_graph.cpp add_mla; Megatron-core
// multi_latent_attention.py): the down projections h -> r_q and h -> r_kv + d_r with replicated
// weights on the sequence-split tokens, their latents' norms, the column-parallel up projections
// r_q -> a(d_n + d_r)/tp and r_kv -> a(d_n + d_v)/tp (without r_q: h -> a(d_n + d_r)/tp), and the
// output a d_v/tp -> h. Returns the up projections' forward (what mla_up_proj recomputes).
PassCost add_mla_linears(const Ctx& x, LinearCost& proj, LinearCost& outp) {
  const MlaSpec& a = x.m.mla;
  const double h = x.m.hidden, tp = x.s.tp, heads = x.m.heads, M = x.t.per_rank, Ms = x.t.seq_split;
  const double rq = a.q_lora_rank, rkv = a.kv_lora_rank, qk = heads * a.qk_head_dim(), v = heads * a.v_head_dim;
  const LinearCost q_up = linear(x, M, qk / tp, rq > 0 ? rq : h);
  const LinearCost kv_up = linear(x, M, heads * a.qk_nope_head_dim / tp + v / tp, rkv);
  proj = linear(x, Ms, rkv + a.qk_rope_head_dim, h);  // kv_down
  if (rq > 0) {
    const LinearCost q_down = linear(x, Ms, rq, h);
    proj.fwd += q_down.fwd;
    proj.bwd += q_down.bwd;
    const Bytes latent = Ms * rq * x.b.activation;
    proj.fwd += mem_fwd(x, norm_impl(x), latent);
    proj.bwd += mem_bwd(x, norm_impl(x), latent);
  }
  const Bytes kv_latent = Ms * rkv * x.b.activation;
  proj.fwd += mem_fwd(x, norm_impl(x), kv_latent);
  proj.bwd += mem_bwd(x, norm_impl(x), kv_latent);
  for (const LinearCost* l : {&q_up, &kv_up}) {
    proj.fwd += l->fwd;
    proj.bwd += l->bwd;
  }
  outp = linear(x, M, h, v / tp);
  PassCost up = q_up.fwd;
  up += kv_up.fwd;
  return up;
}

// The layer's GEMMs (Megatron column/row-parallel splits): QKV [h -> (q + 2kv)/tp] (or MLA's
// projections), output [q/tp -> h], and in a dense layer MLP up [h -> f/tp, or 2f/tp for SwiGLU],
// MLP down [f/tp -> h].
void add_linears(const Ctx& x, bool moe, LayerOpCosts& L) {
  const double h = x.m.hidden, f = x.m.ffn_hidden, tp = x.s.tp, q = q_width(x), kv = kv_width(x), M = x.t.per_rank;
  const bool swiglu = x.m.activation == Activation::swiglu;
  LinearCost qkv, outp;
  if (x.m.mla.on()) {
    const PassCost up = add_mla_linears(x, qkv, outp);
    if (x.s.recompute_modules & kRecomputeMlaUpProj) L.module_recompute += in_region(x, kAttnRegion, up);
  } else {
    if (x.sw.qkv_fused) {
      qkv = linear(x, M, (q + 2 * kv) / tp, h);
    } else {  // Q, then K and V as two equal GEMMs
      qkv = linear(x, M, q / tp, h);
      const LinearCost k = linear(x, M, kv / tp, h, 2);
      qkv.fwd += k.fwd;
      qkv.bwd += k.bwd;
    }
    outp = linear(x, M, h, q / tp);
  }
  qkv = in_region(x, kAttnRegion, qkv);
  outp = in_region(x, kAttnRegion, outp);
  if (moe) {
    for (const LinearCost* l : {&std::as_const(qkv), &std::as_const(outp)}) {
      L.fwd += l->fwd;
      L.bwd += l->bwd;
    }
    return;
  }
  const int up_parts = swiglu && !x.sw.gate_up_fused ? 2 : 1;
  const LinearCost up = in_region(x, kGraphMlp, linear(x, M, (swiglu ? 2 : 1) * f / tp, h, up_parts));
  const LinearCost down = in_region(x, kGraphMlp, linear(x, M, h, f / tp));
  if (x.s.recompute_modules & kRecomputeMlp) {
    L.module_recompute += up.fwd;
    L.module_recompute += down.fwd;
  }
  for (const LinearCost* l : {&std::as_const(qkv), &std::as_const(outp), &up, &down}) {
    L.fwd += l->fwd;
    L.bwd += l->bwd;
  }
  // The fused outputs are split into their parts by views (free forward); backward, each part's
  // gradient is assembled into the fused one as the stack does it (software memory_bound.fused_split).
  const double act = x.b.activation;
  if (x.sw.qkv_fused)
    L.bwd += in_region(x, kAttnRegion, 3 * mem_bwd(x, x.sw.mem.fused_split, M * (q + 2 * kv) / tp * act));
  if (swiglu && x.sw.gate_up_fused)
    L.bwd += in_region(x, kGraphMlp, 2 * mem_bwd(x, x.sw.mem.fused_split, M * 2 * f / tp * act));
}

// The attention core and what surrounds it: RoPE on q and k (MLA: the heads' RoPE query parts and
// the one shared RoPE key part; the stack's rope_scaled where the model scales its cos and sin and
// has no MLA, whose own fused RoPE kernels take scaled tables), layout copies, GQA expansion.
void add_attention_ops(const Ctx& x, AttentionWindow window, LayerOpCosts& L) {
  const Software& sw = x.sw;
  const double tp = x.s.tp, q = q_width(x), kv = kv_width(x);
  const LinearCost core = attention_core(x, window);
  L.attention_fwd = core.fwd;
  L.fwd += core.fwd;
  L.bwd += core.bwd;
  const Bytes heads_t = x.t.per_rank * q / tp * x.b.activation;  // one tensor over all query heads
  if (x.m.position == Position::rope) {
    const double roped = x.m.mla.on() ? x.m.heads * x.m.mla.qk_rope_head_dim / tp + x.m.mla.qk_rope_head_dim
                                      : (q + kv) / tp;
    const Bytes qk = x.t.per_rank * roped * x.b.activation;
    const bool scaled = x.m.rope_attention_factor != 1 && !x.m.mla.on() && sw.mem.rope_scaled;
    const MemOpImpl& rope = scaled ? *sw.mem.rope_scaled : sw.mem.rope;
    L.fwd += mem_fwd(x, rope, qk);
    L.bwd += mem_bwd(x, rope, qk);
    if (x.s.recompute_modules & kRecomputeMlaUpProj) L.module_recompute += mem_fwd(x, rope, qk);
  }
  L.fwd += mem_fwd(x, sw.mem.attention_copies, heads_t);
  L.bwd += mem_bwd(x, sw.mem.attention_copies, heads_t);
  if (x.m.kv_heads != x.m.heads) {
    L.fwd += mem_fwd(x, sw.mem.gqa_expand, heads_t);
    L.bwd += mem_bwd(x, sw.mem.gqa_expand, heads_t);
  }
}

// The attention side's ops (add_attention_ops) in the attention's graph region.
void add_attention(const Ctx& x, AttentionWindow window, LayerOpCosts& L) {
  LayerOpCosts A;  // this side's ops, placed in the attention's graph region at the end
  add_attention_ops(x, window, A);
  L.attention_fwd = in_region(x, kAttnRegion, A.attention_fwd);
  L.fwd += in_region(x, kAttnRegion, A.fwd);
  L.bwd += in_region(x, kAttnRegion, A.bwd);
  L.module_recompute += in_region(x, kAttnRegion, A.module_recompute);
}

// An MLP's activation (the stack's SwiGLU or GeLU) on `in` bytes of its input, after the clamps
// of a clamped gated activation (ModelSpec::activation_clamp) as the stack runs them (glu_clamp).
PassCost activation_fwd(const Ctx& x, Bytes in) {
  const MemOps& mem = x.sw.mem;
  PassCost p = mem_fwd(x, x.m.activation == Activation::swiglu ? mem.swiglu : mem.gelu, in);
  if (x.m.activation_clamp > 0) p += mem_fwd(x, mem.glu_clamp, in);
  return p;
}
PassCost activation_bwd(const Ctx& x, Bytes in) {
  const MemOps& mem = x.sw.mem;
  PassCost p = mem_bwd(x, x.m.activation == Activation::swiglu ? mem.swiglu : mem.gelu, in);
  if (x.m.activation_clamp > 0) p += mem_bwd(x, mem.glu_clamp, in);
  return p;
}

// The dense MLP's activation.
void add_mlp_activation(const Ctx& x, LayerOpCosts& L) {
  const double f = x.m.ffn_hidden, tp = x.s.tp;
  const bool swiglu = x.m.activation == Activation::swiglu;
  const Bytes in = x.t.per_rank * (swiglu ? 2 * f : f) / tp * x.b.activation;
  L.fwd += in_region(x, kGraphMlp, activation_fwd(x, in));
  L.bwd += in_region(x, kGraphMlp, activation_bwd(x, in));
  // The mlp module re-runs the MLP from its input: its fused norm, GEMMs (add_linears) and this.
  if (x.s.recompute_modules & kRecomputeMlp) {
    L.module_recompute += in_region(x, kGraphMlp, mem_fwd(x, norm_impl(x), stream_tensor(x)));
    L.module_recompute += in_region(x, kGraphMlp, activation_fwd(x, in));
  }
}

// One grouped GEMM over `groups` experts of m rows each (Megatron-core GroupedMLP, Transformer
// Engine GroupedLinear): each expert's product timed from the table at its own shape (small m
// pays the table's low-occupancy rate and tile quantisation), launched as one kernel or, where
// the stack issues one per expert (MoeOps::gemm_per_expert), `groups` of them, forward and each
// backward product. FP8 quantizes every expert's input as linear_in does.
LinearCost grouped_linear(const Ctx& x, double groups, double m, double n, double k) {
  const Dtype dtype = x.s.dtype;
  const double launches = x.sw.moe.gemm_per_expert ? groups : 1.0;
  const Seconds floor = launches * x.c.ops.kernel_floor;  // each launch at least the floor
  const double kernels = x.sw.gemm_kernels * launches;
  const Seconds host = x.sw.moe.gemm_per_expert ? launches * x.sw.moe.host_per_expert_gemm : 0.0;
  LinearCost out;
  out.fwd = {std::max(floor, groups * gemm_time(x.c, dtype, m, n, k, GemmPass::fwd)), kernels, host};
  const double bwd_slowdown = dtype == Dtype::fp8 ? x.sw.fp8_bwd_gemm_slowdown : 1.0;
  out.bwd = {bwd_slowdown * (std::max(floor, groups * gemm_time(x.c, dtype, m, n, k, GemmPass::dgrad)) +
                             std::max(floor, groups * gemm_time(x.c, dtype, m, n, k, GemmPass::wgrad))),
             2 * kernels, 2 * host};
  const double passes = quantize_passes(x, dtype);
  if (passes > 0) {
    const double q = launches * quantize_kernels(x, dtype);
    out.fwd += {passes * x.c.ops.memory_fwd(MemKernel::add, groups * m * k * x.b.activation), q};
    out.bwd += {passes * x.c.ops.memory_fwd(MemKernel::add, groups * m * n * x.b.activation), q};
  }
  return out;
}

// The router (Megatron-core moe/router.py TopKRouter: a plain 16-bit GEMM h -> experts, never in a
// quantized format,
// then scoring and top-k over the fp32 logits) and the permutations around the dispatch: the
// routed copies gathered into expert order and, after the combine, weighted and summed back per
// token (moe/moe_utils.py permute / unpermute), each over the rows this rank's experts take.
// Returns the forward's part after the dispatch (the unpermute).
PassCost add_router_and_permutes(const Ctx& x, LayerOpCosts& L) {
  const MoeShape& ms = x.moe;
  const double h = x.m.hidden, experts = x.m.moe.experts;
  const Dtype router_dtype = quantized_gemms(x.s.dtype) ? Dtype::bf16 : x.s.dtype;
  const LinearCost router = in_region(x, kRouterRegion, linear_in(x, router_dtype, ms.tokens, experts, h));
  const Bytes logits = ms.tokens * experts * 4.0, routed = ms.routed * h * x.b.activation;
  L.fwd += router.fwd;
  L.bwd += router.bwd;
  L.fwd += in_region(x, kRouterRegion, mem_fwd(x, x.sw.moe.router, logits));
  L.bwd += in_region(x, kRouterRegion, mem_bwd(x, x.sw.moe.router, logits));
  const PassCost unpermute_fwd = in_region(x, kGraphMoe, mem_fwd(x, x.sw.moe.unpermute, routed));
  L.fwd += in_region(x, kPreprocessRegion, mem_fwd(x, x.sw.moe.permute, routed));
  L.fwd += unpermute_fwd;
  L.bwd += in_region(x, kPreprocessRegion, mem_bwd(x, x.sw.moe.permute, routed));
  L.bwd += in_region(x, kGraphMoe, mem_bwd(x, x.sw.moe.unpermute, routed));
  return unpermute_fwd;
}

// An MoE layer's MLP (layer_graph.cpp add_routed_experts): the router and permutations, the
// experts as two grouped GEMMs over this rank's experts / ep local experts of expert_tokens rows
// each (up [h -> g f/etp], down [f/etp -> h], g = 2 for SwiGLU) with the activation between them,
// and the shared experts, tensor-parallel like a dense MLP of their summed width.
void add_moe_mlp(const Ctx& x, LayerOpCosts& L) {
  const MoeSpec& e = x.m.moe;
  const MoeShape& ms = x.moe;
  const double h = x.m.hidden, f = e.expert_ffn, etp = x.s.etp, tp = x.s.tp, M = x.t.per_rank;
  const bool swiglu = x.m.activation == Activation::swiglu;
  const double g = swiglu ? 2 : 1;
  L.after_dispatch_fwd = add_router_and_permutes(x, L);
  const LinearCost up = in_region(x, kGraphMoe, grouped_linear(x, ms.local_experts, ms.expert_tokens, g * f / etp, h));
  const LinearCost down = in_region(x, kGraphMoe, grouped_linear(x, ms.local_experts, ms.expert_tokens, h, f / etp));
  const Bytes act_in = ms.received * g * f / etp * x.b.activation;
  for (const LinearCost* l : {&up, &down}) {
    L.expert_fwd += l->fwd;
    L.expert_bwd += l->bwd;
  }
  L.expert_fwd += in_region(x, kGraphMoe, activation_fwd(x, act_in));
  L.expert_bwd += in_region(x, kGraphMoe, activation_bwd(x, act_in));
  if (e.expert_bias) {
    // The down projections' biases, each expert's on its own rows (kernels per local expert).
    const Bytes rows = ms.received * h * x.b.activation, per_expert = rows / ms.local_experts;
    L.expert_fwd += in_region(x, kGraphMoe, ms.local_experts * mem_fwd(x, x.sw.moe.expert_bias, per_expert));
    L.expert_bwd += in_region(x, kGraphMoe, ms.local_experts * mem_bwd(x, x.sw.moe.expert_bias, per_expert));
  }
  L.fwd += L.expert_fwd;
  L.bwd += L.expert_bwd;
  L.after_dispatch_fwd += L.expert_fwd;
  if (x.s.recompute_modules & kRecomputeMoeAct) L.module_recompute += in_region(x, kGraphMoe, activation_fwd(x, act_in));
  if (e.shared_experts == 0) return;
  const double fs = static_cast<double>(e.shared_experts) * e.shared_ffn;
  // Captured with the router where the stack runs them before the dispatch (not overlapped).
  const unsigned region = x.sw.moe.shared_expert_overlap ? kGraphMoe : kRouterRegion;
  const LinearCost s_up = in_region(x, region, linear(x, M, g * fs / tp, h, swiglu && !x.sw.gate_up_fused ? 2 : 1));
  const LinearCost s_down = in_region(x, region, linear(x, M, h, fs / tp));
  L.shared_fwd = s_up.fwd;
  L.shared_fwd += s_down.fwd;
  L.shared_fwd += in_region(x, region, activation_fwd(x, M * g * fs / tp * x.b.activation));
  L.shared_bwd = s_up.bwd;
  L.shared_bwd += s_down.bwd;
  L.shared_bwd += in_region(x, region, activation_bwd(x, M * g * fs / tp * x.b.activation));
  L.fwd += L.shared_fwd;
  L.bwd += L.shared_bwd;
}

// The bias adds of the row-parallel linears (output and MLP down) where not fused, and the weight
// gradients accumulated outside the GEMMs: per micro-batch over the layer's fp32 parameters on
// this rank (routed experts split over ep x etp).
void add_biases_and_gradients(const Ctx& x, const LayerGraph& g, int kind, LayerOpCosts& L) {
  const Software& sw = x.sw;
  const LinearBiases biases = x.m.linear_biases();  // the output and MLP down projections' (layer_graph.cpp)
  const Bytes t = x.t.seq_split * x.m.hidden * x.b.activation;
  const unsigned mlp_region = post_mlp_region(g.kind(kind).moe);
  for (const auto& [on, region] : {std::pair{biases.out, kAttnRegion}, std::pair{biases.mlp, mlp_region}}) {
    if (!on) continue;
    L.fwd += in_region(x, region, mem_fwd(x, sw.mem.bias_add, t));
    L.bwd += in_region(x, region, mem_bwd(x, sw.mem.bias_add, t));
  }
  if (!sw.wgrad_accumulate_fused) {
    const double params = g.kind_params_per_rank(kind, x.s.tp, x.moe.expert_shards);
    const PassCost acc = mem_bwd(x, sw.mem.grad_accumulation, params * 4.0);
    L.bwd += {acc.gpu, kParamOpsPerLayer * sw.mem.grad_accumulation.kernels_bwd};
  }
}

// One launch per captured region of the layer and pass (Strategy::cuda_graph_modules): the
// attention side, and the MLP side's dense MLP, whole MoE block, or part up to the router (with
// the preprocessing, in the same graph).
void add_graph_launches(const Ctx& x, bool moe, LayerOpCosts& L) {
  const unsigned g = x.s.cuda_graph_modules;
  const double launches = ((g & kAttnRegion) ? 1.0 : 0.0) + ((g & (moe ? kRouterRegion : kGraphMlp)) ? 1.0 : 0.0);
  L.fwd.kernels += launches;
  L.bwd.kernels += launches;
}

// One layer of kind `k`: the residual stream's ops, the projections, the attention core, the MLP
// (dense or routed experts), biases and gradient accumulation.
LayerOpCosts layer_op_costs(const Ctx& x, const LayerGraph& g, int k) {
  const LayerKind& kind = g.kind(k);
  LayerOpCosts L;
  add_stream_ops(x, kind.moe, L);
  add_linears(x, kind.moe, L);
  add_attention(x, kind.window, L);
  if (kind.moe) {
    add_moe_mlp(x, L);
  } else {
    add_mlp_activation(x, L);
  }
  add_biases_and_gradients(x, g, k, L);
  // The layernorm module rebuilds, before the backward, the outputs of the norms that are modules
  // of their own: an MoE layer's pre-MLP norm and MLA's input norm (Strategy RecomputeModule).
  if (x.s.recompute_modules & kRecomputeLayernorm) {
    const PassCost norm = mem_fwd(x, norm_impl(x), stream_tensor(x));
    if (kind.moe) L.module_recompute += in_region(x, kRouterRegion, norm);
    if (x.m.mla.on()) L.module_recompute += in_region(x, kAttnRegion, norm);
  }
  add_graph_launches(x, kind.moe, L);
  return L;
}

// The embedding's fp32 table gradient on this rank: V/tp x h elements.
double table_elements(const Ctx& x, double vocab_rows) { return vocab_rows / x.s.tp * x.m.hidden; }

// Embedding: lookup on the sequence-split stream; backward writes the dense table gradient (and
// accumulates it where the head shares it).
EndOpCosts embedding_costs(const Ctx& x, double vocab_rows) {
  const Software& sw = x.sw;
  const double table = table_elements(x, vocab_rows);
  EndOpCosts out;
  out.fwd = mem_fwd(x, sw.mem.embedding, stream_tensor(x));
  out.bwd = mem_bwd(x, sw.mem.embedding, stream_tensor(x));
  out.bwd += mem_bwd(x, sw.mem.embedding_grad, table * 4.0);
  if (!sw.wgrad_accumulate_fused && x.m.tied_embeddings) out.bwd += mem_bwd(x, sw.mem.grad_accumulation, table * 4.0);
  return out;
}

// Head: final norm, LM head GEMM [h -> V/tp], loss on the 16-bit logits.
EndOpCosts head_costs(const Ctx& x, double vocab_rows) {
  const Software& sw = x.sw;
  const double V = vocab_rows, tp = x.s.tp, table = table_elements(x, vocab_rows);
  EndOpCosts out;
  out.fwd = mem_fwd(x, norm_impl(x), stream_tensor(x));
  out.bwd = mem_bwd(x, norm_impl(x), stream_tensor(x));
  // Under a quantized format the head stays in 16 bits unless the stack quantizes it too (Megatron-
  // core's output layer is not a Transformer Engine module; software precision.fp8_lm_head; the
  // published FP8, MXFP8 and NVFP4 recipes keep it in BF16).
  const Dtype head_dtype = quantized_gemms(x.s.dtype) && !sw.fp8_lm_head ? Dtype::bf16 : x.s.dtype;
  const LinearCost head = linear_in(x, head_dtype, x.t.per_rank, V / tp, x.m.hidden);
  out.fwd += head.fwd;
  out.bwd += head.bwd;
  // A stack that gathers the logits over TP (Software::parallel.loss_on_gathered_logits) runs the
  // loss over the whole vocabulary on every TP rank, after copying the gathered logits twice: out
  // of the list all-gather's flat buffer and again into one tensor (torch.cat), each a read and a
  // write of the 16-bit logits (2/3 of an add pass, which reads two inputs and writes one).
  const bool gathered = sw.parallel.loss_on_gathered_logits && x.s.tp > 1;
  const Bytes logits = x.t.per_rank * (gathered ? V : V / tp) * x.b.activation;
  if (gathered) out.fwd += {2 * (2.0 / 3) * x.c.ops.memory_fwd(MemKernel::add, logits), 2};
  out.fwd += mem_fwd(x, sw.mem.cross_entropy, logits);
  out.bwd += mem_bwd(x, sw.mem.cross_entropy, logits);
  if (!sw.wgrad_accumulate_fused && !x.m.tied_embeddings) {
    const PassCost acc = mem_bwd(x, sw.mem.grad_accumulation, table * 4.0);
    out.bwd += {acc.gpu, static_cast<double>(sw.mem.grad_accumulation.kernels_bwd)};
  }
  return out;
}

// One MTP module's own ops besides its layer (layer_graph.cpp add_mtp): the norms of the hidden
// state and of the next token's embedding, the 2h -> h projection on the sequence-split tokens,
// then the shared head as head_costs has it (final norm, LM head GEMM, loss).
EndOpCosts mtp_costs(const Ctx& x, double vocab_rows) {
  EndOpCosts out = head_costs(x, vocab_rows);
  const double h = x.m.hidden;
  out.fwd += 2 * mem_fwd(x, norm_impl(x), stream_tensor(x));
  out.bwd += 2 * mem_bwd(x, norm_impl(x), stream_tensor(x));
  const LinearCost proj = linear(x, x.t.seq_split, h, 2 * h);
  out.fwd += proj.fwd;
  out.bwd += proj.bwd;
  return out;
}

}  // namespace

OpCosts op_costs(const LayerGraph& g, const Cluster& c, const Software& sw, const PlanShape& shape) {
  const Ctx x = make_ctx(g, c, sw, shape);
  OpCosts out;
  for (int k = 0; k < g.kind_count(); ++k) out.kinds[k] = layer_op_costs(x, g, k);
  out.pre = embedding_costs(x, shape.vocab_rows);
  out.post = head_costs(x, shape.vocab_rows);
  if (g.model().mtp_layers > 0) out.mtp = mtp_costs(x, shape.vocab_rows);
  return out;
}

OpCosts op_costs(const LayerGraph& g, const Cluster& c, const Software& sw, const Strategy& s) {
  return op_costs(g, c, sw, PlanShape(g.model(), c, sw, s));
}

PassCost optimizer_cost(const Cluster& c, const Software& sw, double params_updated) {
  const MemOpImpl& o = sw.mem.optimizer;
  if (params_updated <= 0) return {};
  return {o.passes_fwd * c.ops.memory_fwd(o.kernel, params_updated * 4.0), static_cast<double>(o.kernels_fwd)};
}

PassCost weight_cast_cost(const Cluster& c, const Software& sw, double params_held) {
  const MemOpImpl& w = sw.mem.weight_cast;
  if (params_held <= 0 || (w.passes_fwd == 0 && w.kernels_fwd == 0)) return {};
  return {w.passes_fwd * c.ops.memory_fwd(w.kernel, params_held * 4.0), static_cast<double>(w.kernels_fwd)};
}

}  // namespace trainplan
