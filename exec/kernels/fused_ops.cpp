// The fused ops' autograd functions, and their CPU kernels: the loops of fused_math.hpp over
// at::Tensor data, rows in parallel (at::parallel_for). The CUDA kernels are fused_ops.cu.
#include "exec/kernels/fused_ops.hpp"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>

#include "exec/kernels/fused_impl.hpp"
#include "exec/kernels/fused_math.hpp"

namespace trainplan::exec {

namespace fused::cpu {

namespace fm = fused_math;

namespace {

// Rows per at::parallel_for task: about 32k elements of work each.
int64_t row_grain(int64_t h) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, h)); }

// The accumulation dtype of a tensor's dtype: fp32, or double for double.
at::ScalarType acc_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

}  // namespace

NormForward norm_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, bool layernorm) {
  const int64_t rows = x.size(0), h = x.size(1);
  NormForward out;
  out.y = at::empty_like(x);
  out.rstd = at::empty({rows}, x.options().dtype(acc_type(x)));
  if (layernorm) out.mean = at::empty({rows}, out.rstd.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_norm_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const acc_t* wp = w.const_data_ptr<acc_t>();
    const acc_t* bp = layernorm ? b.const_data_ptr<acc_t>() : nullptr;
    scalar_t* yp = out.y.mutable_data_ptr<scalar_t>();
    acc_t* rp = out.rstd.mutable_data_ptr<acc_t>();
    acc_t* mp = layernorm ? out.mean.mutable_data_ptr<acc_t>() : nullptr;
    at::parallel_for(0, rows, row_grain(h), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* xr = xp + r * h;
        acc_t mean = 0;
        if (layernorm) {
          for (int64_t j = 0; j < h; ++j) mean += static_cast<acc_t>(xr[j]);
          mean /= static_cast<acc_t>(h);
          mp[r] = mean;
        }
        acc_t sq = 0;  // sum of squares about the mean (LayerNorm) or about 0 (RMSNorm)
        for (int64_t j = 0; j < h; ++j) {
          const acc_t d = static_cast<acc_t>(xr[j]) - mean;
          sq += d * d;
        }
        const acc_t rstd = fm::norm_rstd(sq / static_cast<acc_t>(h), static_cast<acc_t>(eps));
        rp[r] = rstd;
        for (int64_t j = 0; j < h; ++j)
          yp[r * h + j] =
              static_cast<scalar_t>(fm::norm_out((static_cast<acc_t>(xr[j]) - mean) * rstd, wp[j], bp ? bp[j] : acc_t(0)));
      }
    });
  });
  return out;
}

NormBackward norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const NormForward& saved,
                           bool layernorm) {
  const int64_t rows = x.size(0), h = x.size(1);
  // The weight's (and bias's) gradient is a sum over rows: each block of kBlock rows writes its
  // partial sums to a row of `part`, summed after. Fixed blocks, so the result does not depend on
  // the thread count.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = std::max<int64_t>(1, (rows + kBlock - 1) / kBlock);
  NormBackward out;
  out.dx = at::empty_like(x);
  at::Tensor part_w = at::zeros({blocks, h}, x.options().dtype(acc_type(x)));
  at::Tensor part_b = layernorm ? at::zeros({blocks, h}, part_w.options()) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_norm_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    const acc_t* wp = w.const_data_ptr<acc_t>();
    const acc_t* rp = saved.rstd.const_data_ptr<acc_t>();
    const acc_t* mp = layernorm ? saved.mean.const_data_ptr<acc_t>() : nullptr;
    scalar_t* dxp = out.dx.mutable_data_ptr<scalar_t>();
    acc_t* pw = part_w.mutable_data_ptr<acc_t>();
    acc_t* pb = layernorm ? part_b.mutable_data_ptr<acc_t>() : nullptr;
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        for (int64_t r = blk * kBlock; r < std::min(rows, (blk + 1) * kBlock); ++r) {
          const scalar_t* xr = xp + r * h;
          const scalar_t* dyr = dyp + r * h;
          const acc_t mean = mp ? mp[r] : acc_t(0), rstd = rp[r];
          acc_t sum_g = 0, sum_gxhat = 0;
          for (int64_t j = 0; j < h; ++j) {
            const acc_t g = static_cast<acc_t>(dyr[j]) * wp[j];
            const acc_t xhat = (static_cast<acc_t>(xr[j]) - mean) * rstd;
            sum_g += g;
            sum_gxhat += g * xhat;
          }
          const acc_t mean_g = layernorm ? sum_g / static_cast<acc_t>(h) : acc_t(0);
          const acc_t mean_gxhat = sum_gxhat / static_cast<acc_t>(h);
          for (int64_t j = 0; j < h; ++j) {
            const acc_t d = static_cast<acc_t>(dyr[j]);
            const acc_t xhat = (static_cast<acc_t>(xr[j]) - mean) * rstd;
            dxp[r * h + j] = static_cast<scalar_t>(fm::norm_dx(d * wp[j], xhat, rstd, mean_g, mean_gxhat));
            pw[blk * h + j] += d * xhat;
            if (pb) pb[blk * h + j] += d;
          }
        }
      }
    });
  });
  out.dw = part_w.sum(0);
  if (layernorm) out.db = part_b.sum(0);
  return out;
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const int64_t S = x.size(0), B = x.size(1), N = x.size(2), D = x.size(3), half = D / 2;
  const int64_t s0 = x.stride(0), s1 = x.stride(1), s2 = x.stride(2);
  at::Tensor y = at::empty({S, B, N, D}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_rope_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const acc_t* cp = cos.const_data_ptr<acc_t>();
    const acc_t* sp = sin.const_data_ptr<acc_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, S * B * N, row_grain(D), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {  // r = (s * B + b) * N + n, the row of y
        const int64_t s = r / (B * N), b = (r / N) % B, n = r % N;
        const scalar_t* xr = xp + s * s0 + b * s1 + n * s2;
        const acc_t* c = cp + s * D;
        const acc_t* sn = sp + s * D;
        for (int64_t i = 0; i < half; ++i) fm::rope_apply(xr, c, sn, yp + r * D, i, half, backward);
      }
    });
  });
  return y;
}

at::Tensor swiglu_forward(const at::Tensor& gu) {
  const int64_t rows = gu.size(0), f = gu.size(1) / 2;
  at::Tensor y = at::empty({rows, f}, gu.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gu.scalar_type(), "fused_swiglu_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gp = gu.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, row_grain(f), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t j = 0; j < f; ++j)
          yp[r * f + j] = static_cast<scalar_t>(
              fm::swiglu(static_cast<acc_t>(gp[r * 2 * f + j]), static_cast<acc_t>(gp[r * 2 * f + f + j])));
    });
  });
  return y;
}

at::Tensor swiglu_backward(const at::Tensor& gu, const at::Tensor& dy) {
  const int64_t rows = gu.size(0), f = gu.size(1) / 2;
  at::Tensor dgu = at::empty_like(gu);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gu.scalar_type(), "fused_swiglu_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gp = gu.const_data_ptr<scalar_t>();
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    scalar_t* dp = dgu.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows, row_grain(f), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t j = 0; j < f; ++j) {
          acc_t dg, du;
          fm::swiglu_backward(static_cast<acc_t>(gp[r * 2 * f + j]), static_cast<acc_t>(gp[r * 2 * f + f + j]),
                              static_cast<acc_t>(dyp[r * f + j]), dg, du);
          dp[r * 2 * f + j] = static_cast<scalar_t>(dg);
          dp[r * 2 * f + f + j] = static_cast<scalar_t>(du);
        }
    });
  });
  return dgu;
}

at::Tensor gelu_forward(const at::Tensor& x) {
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_gelu_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), 32768, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) yp[i] = static_cast<scalar_t>(fm::gelu_tanh(static_cast<acc_t>(xp[i])));
    });
  });
  return y;
}

at::Tensor gelu_backward(const at::Tensor& x, const at::Tensor& dy) {
  at::Tensor dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_gelu_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* dyp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, x.numel(), 32768, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        dxp[i] = static_cast<scalar_t>(fm::gelu_tanh_backward(static_cast<acc_t>(xp[i]), static_cast<acc_t>(dyp[i])));
    });
  });
  return dx;
}

}  // namespace fused::cpu

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The kernels for a tensor's device.
struct Kernels {
  decltype(&fused::cpu::norm_forward) norm_forward;
  decltype(&fused::cpu::norm_backward) norm_backward;
  decltype(&fused::cpu::rope) rope;
  decltype(&fused::cpu::swiglu_forward) swiglu_forward;
  decltype(&fused::cpu::swiglu_backward) swiglu_backward;
  decltype(&fused::cpu::gelu_forward) gelu_forward;
  decltype(&fused::cpu::gelu_backward) gelu_backward;
};

const Kernels& kernels_for(const at::Tensor& t) {
  static constexpr Kernels cpu{fused::cpu::norm_forward,    fused::cpu::norm_backward,   fused::cpu::rope,
                               fused::cpu::swiglu_forward,  fused::cpu::swiglu_backward, fused::cpu::gelu_forward,
                               fused::cpu::gelu_backward};
#ifdef TRAINPLAN_EXEC_CUDA
  static constexpr Kernels cuda{fused::cuda::norm_forward,   fused::cuda::norm_backward,   fused::cuda::rope,
                                fused::cuda::swiglu_forward, fused::cuda::swiglu_backward, fused::cuda::gelu_forward,
                                fused::cuda::gelu_backward};
  if (t.is_cuda()) return cuda;
#endif
  TORCH_CHECK(t.is_cpu(), "fused kernels: tensors on ", t.device(), " are not supported by this build");
  return cpu;
}

at::ScalarType acc_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// A parameter or table as the kernels read it: contiguous, in x's accumulation dtype, on x's device.
at::Tensor as_acc(const at::Tensor& p, const at::Tensor& x, const char* what) {
  TORCH_CHECK(p.device() == x.device(), "fused kernels: ", what, " is on ", p.device(), ", the input on ", x.device());
  return p.to(acc_type(x)).contiguous();
}

void check_floating(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf ||
                  x.scalar_type() == at::kDouble,
              op, ": dtype ", x.scalar_type(), " is not fp32, bf16, fp16 or double");
}

// RMSNorm and LayerNorm share one function: `b` undefined selects RMSNorm.
tensor_list norm_forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                         double eps) {
  const bool layernorm = b.defined();
  const int64_t h = x.size(-1);
  TORCH_CHECK(w.numel() == h && (!layernorm || b.numel() == h), "fused norm: weight and bias must have ", h,
              " elements (the input's last dimension)");
  const at::Tensor x2 = x.reshape({-1, h}).contiguous();
  fused::NormForward f =
      kernels_for(x).norm_forward(x2, as_acc(w, x, "the weight"), layernorm ? as_acc(b, x, "the bias") : at::Tensor(),
                                  eps, layernorm);
  ctx->save_for_backward({x2, w, f.rstd, f.mean});
  ctx->saved_data["layernorm"] = layernorm;
  return {f.y.view(x.sizes())};
}

tensor_list norm_backward(AutogradContext* ctx, const tensor_list& grad) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& x2 = saved[0];
  const at::Tensor& w = saved[1];
  const bool layernorm = ctx->saved_data["layernorm"].toBool();
  fused::NormForward f;
  f.rstd = saved[2];
  f.mean = saved[3];
  const at::Tensor dy = grad[0].reshape(x2.sizes()).to(x2.scalar_type()).contiguous();
  fused::NormBackward g = kernels_for(x2).norm_backward(dy, x2, as_acc(w, x2, "the weight"), f, layernorm);
  at::Tensor dx = g.dx.view(grad[0].sizes());
  at::Tensor dw = g.dw.to(w.scalar_type()).view(w.sizes());
  return {dx, dw, g.db};  // db: accumulation dtype, undefined for RMSNorm
}

struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, double eps) {
    return norm_forward(ctx, x, w, at::Tensor(), eps)[0];
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    tensor_list g = norm_backward(ctx, grad);
    return {g[0], g[1], at::Tensor()};
  }
};

struct LayerNormFn : torch::autograd::Function<LayerNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            double eps) {
    ctx->saved_data["bias_dtype"] = b.scalar_type();
    return norm_forward(ctx, x, w, b, eps)[0];
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    tensor_list g = norm_backward(ctx, grad);
    return {g[0], g[1], g[2].to(ctx->saved_data["bias_dtype"].toScalarType()), at::Tensor()};
  }
};

struct RopeFn : torch::autograd::Function<RopeFn> {
  // cos and sin are constants (no gradient flows to them).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "fused_rope: x must be [S, B, N, D] with D even, got ",
                x.sizes());
    const at::Tensor c = as_acc(cos, x, "cos"), s = as_acc(sin, x, "sin");
    TORCH_CHECK(c.dim() == 2 && c.size(0) == x.size(0) && c.size(1) == x.size(3) && s.sizes() == c.sizes(),
                "fused_rope: cos and sin must be [S, D] = [", x.size(0), ", ", x.size(3), "], got ", c.sizes(), " and ",
                s.sizes());
    ctx->save_for_backward({c, s});
    const at::Tensor xs = x.stride(3) == 1 ? x : x.contiguous();
    return kernels_for(x).rope(xs, c, s, false);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor dy = grad[0].contiguous();
    return {kernels_for(dy).rope(dy, saved[0], saved[1], true), at::Tensor(), at::Tensor()};
  }
};

struct SwigluFn : torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gu) {
    const int64_t two_f = gu.size(-1);
    TORCH_CHECK(two_f % 2 == 0, "fused_swiglu: the last dimension (", two_f, ") must be even: gate then up");
    const at::Tensor g2 = gu.reshape({-1, two_f}).contiguous();
    ctx->save_for_backward({g2});
    auto shape = gu.sizes().vec();
    shape.back() = two_f / 2;
    return kernels_for(gu).swiglu_forward(g2).view(shape);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    const at::Tensor g2 = ctx->get_saved_variables()[0];
    const at::Tensor dy = grad[0].reshape({g2.size(0), g2.size(1) / 2}).to(g2.scalar_type()).contiguous();
    auto shape = grad[0].sizes().vec();
    shape.back() = g2.size(1);
    return {kernels_for(g2).swiglu_backward(g2, dy).view(shape)};
  }
};

struct GeluFn : torch::autograd::Function<GeluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    const at::Tensor xc = x.contiguous();
    ctx->save_for_backward({xc});
    return kernels_for(x).gelu_forward(xc);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad) {
    const at::Tensor xc = ctx->get_saved_variables()[0];
    return {kernels_for(xc).gelu_backward(xc, grad[0].to(xc.scalar_type()).contiguous())};
  }
};

}  // namespace

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_floating(x, "fused_rms_norm");
  return RmsNormFn::apply(x, w, eps);
}

at::Tensor fused_layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) {
  check_floating(x, "fused_layer_norm");
  TORCH_CHECK(b.defined(), "fused_layer_norm: the bias is required");
  return LayerNormFn::apply(x, w, b, eps);
}

at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_floating(x, "fused_rope");
  return RopeFn::apply(x, cos, sin);
}

at::Tensor fused_swiglu(const at::Tensor& gu) {
  check_floating(gu, "fused_swiglu");
  return SwigluFn::apply(gu);
}

at::Tensor fused_gelu(const at::Tensor& x) {
  check_floating(x, "fused_gelu");
  return GeluFn::apply(x);
}

}  // namespace trainplan::exec
