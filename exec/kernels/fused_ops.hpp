// Fused normalisation, RoPE and activation ops for the model (`trainplan exec --fused-kernels on`).
// Each is one forward and one backward kernel instead of the several LibTorch ops (and their
// saved intermediates) of the composite form; the math is exec/kernels/fused_math.hpp.
//
// The functions here are autograd functions: they run the CUDA kernels (fused_ops.cu, built only
// with TRAINPLAN_EXEC_CUDA) for CUDA tensors and the same math in CPU loops (fused_ops.cpp) for
// CPU tensors, which is how the tests check them. Tensors: fp32, bf16, fp16 or double; the output
// (and the input's gradient) has the input's dtype, parameters' gradients their parameter's dtype;
// every sum is taken in fp32 (double for double inputs). Inputs need not be contiguous (a
// contiguous copy is made where needed); outputs are contiguous.
#pragma once
#include <torch/torch.h>

namespace trainplan::exec {

// RMSNorm over the last dimension: y = x / sqrt(mean(x^2) + eps) * w. x [..., H], w [H].
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);

// LayerNorm over the last dimension (biased variance): y = (x - mean) / sqrt(var + eps) * w + b.
// x [..., H], w and b [H].
at::Tensor fused_layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps);

// Rotary embedding, rotate-half form: y = x * cos + rotate_half(x) * sin. x [S, B, N, D] (query or
// key heads: positions along dim 0; dims 0-2 may be strided, dim 3 must have stride 1), cos and
// sin [S, D] (the tables at each of the S positions). D even.
at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// SwiGLU on the fused gate/up GEMM's output: gu [..., 2F], gate the first F of the last
// dimension and up the second; returns silu(gate) * up [..., F].
at::Tensor fused_swiglu(const at::Tensor& gu);

// GELU, tanh approximation (as at::gelu(x, "tanh")), elementwise.
at::Tensor fused_gelu(const at::Tensor& x);

}  // namespace trainplan::exec
