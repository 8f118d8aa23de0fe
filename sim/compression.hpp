// Gradient compression on the data-parallel wire: what one rank sends per reduction and the extra
// GPU work of compressing, for the Strategy's GradCompression (strategy.hpp).
//
//   none      the gradient buffer as it is: params x gradient bytes.
//   bf16      fp32 gradients cast to bf16 for the reduction and back (PyTorch's
//             bf16_compress_hook): 2 bytes per parameter; compute: the two casts (stream 4+2 and
//             2+4 bytes per parameter). No error feedback.
//   powersgd  rank r (Vogels et al. 2019, "PowerSGD", Algorithm 1; PyTorch powerSGD_hook): every
//             weight-matrix gradient M (m x n on this rank) is sent as P = M Q (m x r) and
//             Q = M^T P (n x r): (m + n) r elements instead of m n, in two all-reduce rounds (P, then
//             Q); a matrix with (m + n) r >= m n and every non-matrix parameter (norms, biases,
//             learned positions) are sent uncompressed in the first round. Elements at the
//             gradient's bytes. Compute per compressed matrix: three GEMMs (M Q: m x r x n,
//             M^T P: n x r x m, the decompression P Q^T: m x n x r) timed with the cluster's GEMM
//             tables, Gram-Schmidt orthogonalisation of P (r column passes over m x r, 3 kernels
//             per column), and error feedback (M += e before, e = M - P Q^T after: 6 element passes
//             over m x n). Memory: the error-feedback buffer, one fp32 copy of the compressed
//             gradients (memory_model.hpp); P and Q ((m + n) r elements) are left out.
#pragma once
#include <vector>

#include "sim/cluster.hpp"
#include "sim/layer_graph.hpp"
#include "sim/strategy.hpp"
#include "sim/units.hpp"

namespace trainplan {

struct MatrixShape {
  double m = 0, n = 0;
};

// One rank's gradients of a piece of the model, after the TP split.
struct GradientShapes {
  std::vector<MatrixShape> matrices;  // weight matrices
  double other = 0;                   // parameters outside them (norms, biases, positions)
  double params() const;
};

// The gradients one rank holds for one transformer layer, for the ops before the first layer
// (embedding), and after the last (final norm, LM head; with tied embeddings and pp > 1 the last
// stage's copy of the embedding matrix), split by `s.tp` as predict splits their parameters.
GradientShapes layer_gradients(const LayerGraph& g, const Strategy& s);
GradientShapes pre_gradients(const LayerGraph& g, const Strategy& s);
GradientShapes post_gradients(const LayerGraph& g, const Strategy& s);

// Elements PowerSGD of rank r sends for one m x n matrix: (m + n) r (Vogels et al. 2019, Alg. 1).
double powersgd_elements(double m, double n, int r);

struct CompressionCost {
  Bytes wire = 0;      // bytes this rank sends per reduction (the collective's message M)
  Seconds compute = 0; // extra GPU time per step for compressing and decompressing
  int rounds = 1;      // collectives per reduction (PowerSGD: 2)
  Bytes error_feedback = 0;  // bytes of the error-feedback buffer
  CompressionCost& operator+=(const CompressionCost& o);
};
CompressionCost operator*(double k, const CompressionCost& c);

// The cost of reducing `grads` under `s.grad_compression`, with `grad_bytes` bytes per gradient
// element on the wire (PlanShape's bytes.wire_grad, state_bytes(s).grad).
CompressionCost compression_cost(const GradientShapes& grads, const Cluster& c, const Strategy& s, double grad_bytes);

// Bytes of the error-feedback buffer per compressed parameter: 4 (fp32) for PowerSGD, else 0.
double error_feedback_bytes_per_param(const GradCompression& g);

}  // namespace trainplan
