#include "sim/compression.hpp"

#include <algorithm>

#include "sim/model_spec.hpp"
#include "sim/op_time.hpp"

namespace trainplan {

double GradientShapes::params() const {
  double p = other;
  for (const auto& mat : matrices) p += mat.m * mat.n;
  return p;
}

CompressionCost& CompressionCost::operator+=(const CompressionCost& o) {
  wire += o.wire;
  compute += o.compute;
  rounds = std::max(rounds, o.rounds);
  error_feedback += o.error_feedback;
  return *this;
}

CompressionCost operator*(double k, const CompressionCost& c) {
  return {k * c.wire, k * c.compute, c.rounds, k * c.error_feedback};
}

namespace {

// Adds op's parameters (as split by TP on this rank) to `out`: its weight matrix, if it has one,
// and the rest (biases, learned positions) as non-matrix parameters.
void add_op(GradientShapes& out, const OpSpec& op, const ModelSpec& m, int tp) {
  const double h = m.hidden, f = m.ffn_hidden, q = static_cast<double>(m.q_width()),
               kv = static_cast<double>(m.kv_width());
  const double up = m.activation == Activation::swiglu ? 2.0 : 1.0;
  MatrixShape w;
  switch (op.kind) {
    case OpKind::qkv: w = {h, (q + 2 * kv) / tp}; break;      // column-parallel
    case OpKind::out_proj: w = {q / tp, h}; break;            // row-parallel
    case OpKind::mlp_up: w = {h, up * f / tp}; break;         // column-parallel (gate and up fused)
    case OpKind::mlp_down: w = {f / tp, h}; break;            // row-parallel
    case OpKind::embedding: w = {static_cast<double>(m.vocab) / tp, h}; break;  // vocab-parallel
    case OpKind::lm_head: w = op.params > 0 ? MatrixShape{static_cast<double>(m.vocab) / tp, h} : MatrixShape{}; break;
    default: break;
  }
  if (w.m * w.n > 0) out.matrices.push_back(w);
  out.other += std::max(0.0, rank_params(op, tp) - w.m * w.n);
}

}  // namespace

GradientShapes layer_gradients(const LayerGraph& g, const Strategy& s) {
  GradientShapes out;
  for (const auto& op : g.layer_ops()) add_op(out, op, g.model(), s.tp);
  return out;
}

GradientShapes pre_gradients(const LayerGraph& g, const Strategy& s) {
  GradientShapes out;
  for (const auto& op : g.pre_ops()) add_op(out, op, g.model(), s.tp);
  return out;
}

GradientShapes post_gradients(const LayerGraph& g, const Strategy& s) {
  GradientShapes out;
  for (const auto& op : g.post_ops()) add_op(out, op, g.model(), s.tp);
  const ModelSpec& m = g.model();
  if (m.tied_embeddings && s.pp > 1) out.matrices.push_back({static_cast<double>(m.vocab) / s.tp, static_cast<double>(m.hidden)});
  return out;
}

double powersgd_elements(double m, double n, int r) { return (m + n) * r; }

CompressionCost compression_cost(const GradientShapes& grads, const Cluster& c, const Strategy& s, double grad_bytes) {
  const GradCompression& g = s.grad_compression;
  const double params = grads.params();
  CompressionCost out;
  switch (g.kind) {
    case CompressionKind::none:
      out.wire = params * grad_bytes;
      return out;
    case CompressionKind::bf16:
      out.wire = params * 2.0;
      out.compute = c.ops.stream(params * (grad_bytes + 2.0)) + c.ops.stream(params * (2.0 + grad_bytes));
      return out;
    case CompressionKind::powersgd: break;
  }
  const double r = g.rank;
  const Seconds floor = c.ops.kernel_floor;
  double elements = grads.other;
  for (const auto& w : grads.matrices) {
    const double compressed = powersgd_elements(w.m, w.n, g.rank);
    if (compressed >= w.m * w.n) {  // no gain: sent as it is (PyTorch's min_compression_rate check)
      elements += w.m * w.n;
      continue;
    }
    elements += compressed;
    out.compute += gemm_time(c, s.dtype, w.m, r, w.n, GemmPass::fwd)    // P = M Q
                   + gemm_time(c, s.dtype, w.n, r, w.m, GemmPass::fwd)  // Q = M^T P
                   + gemm_time(c, s.dtype, w.m, w.n, r, GemmPass::fwd)  // M' = P Q^T
                   + std::max(c.ops.stream(2.0 * w.m * r * r * grad_bytes), 3 * r * floor)  // Gram-Schmidt
                   + c.ops.stream(6.0 * w.m * w.n * grad_bytes);  // error feedback: M += e; e = M - M'
    out.error_feedback += w.m * w.n * error_feedback_bytes_per_param(g);
  }
  out.wire = elements * grad_bytes;
  out.rounds = 2;
  return out;
}

double error_feedback_bytes_per_param(const GradCompression& g) { return g.kind == CompressionKind::powersgd ? 4.0 : 0.0; }

}  // namespace trainplan
