// Internal to exec/kernels/fused_ops.*: the forward and backward kernels of each fused op, once
// for the CPU (fused_ops.cpp) and once for CUDA (fused_ops.cu, built only with
// TRAINPLAN_EXEC_CUDA), with the same signatures. fused_ops.cpp's autograd functions pick one by
// the input's device. ATen only (no torch/torch.h), so that nvcc compiles it cheaply.
//
// Preconditions the callers (fused_ops.cpp) establish: row-major inputs contiguous (except RoPE's
// x, see rope), parameters and tables contiguous in the accumulation dtype (float, or double for
// double inputs), all on the input's device.
#pragma once
#include <ATen/core/Tensor.h>

namespace trainplan::exec::fused {

struct NormForward {
  at::Tensor y;     // like x
  at::Tensor mean;  // [rows], accumulation dtype (LayerNorm only; undefined for RMSNorm)
  at::Tensor rstd;  // [rows], accumulation dtype
};
struct NormBackward {
  at::Tensor dx;  // like x
  at::Tensor dw;  // [H], accumulation dtype
  at::Tensor db;  // [H], accumulation dtype (LayerNorm only)
};

namespace cpu {
// x [rows, H]; b undefined for RMSNorm (layernorm false).
NormForward norm_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, bool layernorm);
NormBackward norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const NormForward& saved,
                           bool layernorm);
// x [S, B, N, D] with stride 1 on D; cos, sin [S, D]. backward: x is dy, and the transposed map runs.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward);
at::Tensor swiglu_forward(const at::Tensor& gu);                         // gu [rows, 2F] -> [rows, F]
at::Tensor swiglu_backward(const at::Tensor& gu, const at::Tensor& dy);  // -> dgu [rows, 2F]
at::Tensor gelu_forward(const at::Tensor& x);
at::Tensor gelu_backward(const at::Tensor& x, const at::Tensor& dy);
}  // namespace cpu

#ifdef TRAINPLAN_EXEC_CUDA
namespace cuda {  // the same, for CUDA tensors
// x [rows, H]; b undefined for RMSNorm (layernorm false).
NormForward norm_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, bool layernorm);
NormBackward norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const NormForward& saved,
                           bool layernorm);
// x [S, B, N, D] with stride 1 on D; cos, sin [S, D]. backward: x is dy, and the transposed map runs.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward);
at::Tensor swiglu_forward(const at::Tensor& gu);                         // gu [rows, 2F] -> [rows, F]
at::Tensor swiglu_backward(const at::Tensor& gu, const at::Tensor& dy);  // -> dgu [rows, 2F]
at::Tensor gelu_forward(const at::Tensor& x);
at::Tensor gelu_backward(const at::Tensor& x, const at::Tensor& dy);
}  // namespace cuda
#endif

}  // namespace trainplan::exec::fused
