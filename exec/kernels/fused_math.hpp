// The per-element math of exec's fused kernels, one definition for the CPU loops
// (fused_ops.cpp) and the CUDA kernels (fused_ops.cu). No LibTorch here: plain arithmetic in the
// accumulation type T (float for fp32/bf16/fp16 tensors, double for double), templated so that a
// double check runs the same lines.
//
// Row statistics (sums over the hidden dimension) are reduced by the caller: a loop on the CPU, a
// block reduction on the GPU. Everything below takes them as arguments.
#pragma once
#include <cmath>

#ifdef __CUDACC__
#define TP_HD __host__ __device__ __forceinline__
#else
#define TP_HD inline
#endif

namespace trainplan::exec::fused_math {

// Norms. H elements per row, eps added to the mean square (RMSNorm) or variance (LayerNorm);
// the model uses eps = 1e-5 for both (exec/model.cpp).
//
// RMSNorm (Zhang & Sennrich 2019, eq. 4): y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// LayerNorm (Ba et al. 2016): y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps), the
// variance biased (divided by H), as torch.nn.LayerNorm.
template <class T>
TP_HD T norm_rstd(T mean_square_or_var, T eps) {
  return T(1) / std::sqrt(mean_square_or_var + eps);
}

// xhat: the normalised input, x * rstd (RMSNorm) or (x - mean) * rstd (LayerNorm).
template <class T>
TP_HD T norm_out(T xhat, T w, T b) {
  return xhat * w + b;
}

// Backward of both norms per element, from g = dy * w and two row means:
//   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
// (differentiate y_j = w_j xhat_j through rstd, and for LayerNorm through the mean; RMSNorm is
// LayerNorm with mean(g) taken as 0). The weight's gradient is sum over rows of dy * xhat, the
// bias's sum of dy.
template <class T>
TP_HD T norm_dx(T g, T xhat, T rstd, T mean_g, T mean_gxhat) {
  return rstd * (g - mean_g - xhat * mean_gxhat);
}

// RoPE (Su et al. 2021), the rotate-half form exec/model.cpp used before the fused path:
//   y = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[h:], x[:h]),  h = head_dim / 2.
// Elements i and i + h form a pair; with c1, s1 the tables at i and c2, s2 at i + h:
//   y1 = x1 c1 - x2 s1,   y2 = x2 c2 + x1 s2.
// The backward is the transpose of that 2x2 map:
//   dx1 = dy1 c1 + dy2 s2,   dx2 = dy2 c2 - dy1 s1.
// (The model's tables repeat the frequencies, cos = cat(f, f), so c1 = c2 and s1 = s2; the
// general form costs nothing and keeps the tables' meaning the caller's.)
template <class T>
TP_HD void rope_pair(T x1, T x2, T c1, T s1, T c2, T s2, T& y1, T& y2) {
  y1 = x1 * c1 - x2 * s1;
  y2 = x2 * c2 + x1 * s2;
}
template <class T>
TP_HD void rope_pair_backward(T dy1, T dy2, T c1, T s1, T c2, T s2, T& dx1, T& dx2) {
  dx1 = dy1 * c1 + dy2 * s2;
  dx2 = dy2 * c2 - dy1 * s1;
}
// Pair i < h of one row: reads xr[i], xr[i + h] (stored type S), the row's tables c, s (the
// position's cos and sin, accumulation type T), writes yr[i], yr[i + h]; the forward map or, with
// `backward`, its transpose. The CPU loop and the CUDA kernel both run exactly this.
template <class S, class T>
TP_HD void rope_apply(const S* xr, const T* c, const T* s, S* yr, long long i, long long h, bool backward) {
  const T x1 = static_cast<T>(xr[i]), x2 = static_cast<T>(xr[i + h]);
  T y1, y2;
  if (backward)
    rope_pair_backward(x1, x2, c[i], s[i], c[i + h], s[i + h], y1, y2);
  else
    rope_pair(x1, x2, c[i], s[i], c[i + h], s[i + h], y1, y2);
  yr[i] = static_cast<S>(y1);
  yr[i + h] = static_cast<S>(y2);
}

// SwiGLU (Shazeer 2020): a = silu(g) * u, silu(g) = g * sigmoid(g).
//   da/dg = u * sigmoid(g) * (1 + g * (1 - sigmoid(g))),   da/du = silu(g).
template <class T>
TP_HD T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
template <class T>
TP_HD T swiglu(T g, T u) {
  return g * sigmoid(g) * u;
}
template <class T>
TP_HD void swiglu_backward(T g, T u, T dy, T& dg, T& du) {
  const T sg = sigmoid(g);
  du = dy * g * sg;
  dg = dy * u * sg * (T(1) + g * (T(1) - sg));
}

// GELU, tanh approximation (Hendrycks & Gimpel 2016, sec. 2; at::gelu(x, "tanh"), which the
// GPT-2-style model uses):
//   gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))),  k = sqrt(2 / pi).
//   gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 * 0.044715 x^2),  t = tanh(k (x + 0.044715 x^3)).
template <class T>
TP_HD T gelu_tanh(T x) {
  const T k = T(0.7978845608028654);  // sqrt(2 / pi)
  const T t = std::tanh(k * (x + T(0.044715) * x * x * x));
  return T(0.5) * x * (T(1) + t);
}
template <class T>
TP_HD T gelu_tanh_backward(T x, T dy) {
  const T k = T(0.7978845608028654);
  const T x2 = x * x;
  const T t = std::tanh(k * (x + T(0.044715) * x2 * x));
  return dy * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3 * 0.044715) * x2));
}

}  // namespace trainplan::exec::fused_math
