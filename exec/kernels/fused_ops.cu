// CUDA kernels of the fused ops (built only with TRAINPLAN_EXEC_CUDA): the math of fused_math.hpp,
// the same as the CPU loops of fused_ops.cpp. Norms: one block per row, the row's sums by a warp-
// shuffle then shared-memory block reduction; their backward runs a fixed grid of blocks over the
// rows, each block summing its rows' weight (and bias) gradients into its own row of a partial
// buffer that at::sum then reduces (no atomics: deterministic). RoPE, SwiGLU and GELU: grid-stride
// elementwise kernels. All sums in fp32 (double for double inputs), on the current stream.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "exec/kernels/fused_impl.hpp"
#include "exec/kernels/fused_math.hpp"

namespace trainplan::exec::fused::cuda {

namespace fm = fused_math;

namespace {

constexpr int kWarp = 32;
constexpr int kElementwiseThreads = 256;

at::ScalarType acc_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// Threads per row of h elements: a multiple of the warp size, about 4 elements per thread, 32 to
// 1024.
int norm_threads(int64_t h) {
  const int64_t t = (h / 4 + kWarp - 1) / kWarp * kWarp;
  return static_cast<int>(std::clamp<int64_t>(t, kWarp, 1024));
}

// Blocks for an elementwise kernel over n items (grid-stride loops cover the rest).
unsigned elementwise_blocks(int64_t n) {
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t want = (n + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(want, 1, sms * 32));
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
// `scratch` holds 32 values of shared memory; it may be reused after the call.
template <class T>
__device__ T block_sum(T v, T* scratch) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : T(0);
    for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

// One block per row. b, mean_out null for RMSNorm.
template <class scalar_t, class acc_t>
__global__ void norm_forward_kernel(const scalar_t* __restrict__ x, const acc_t* __restrict__ w,
                                    const acc_t* __restrict__ b, scalar_t* __restrict__ y, acc_t* __restrict__ mean_out,
                                    acc_t* __restrict__ rstd_out, int64_t h, acc_t eps) {
  __shared__ acc_t scratch[kWarp];
  const int64_t r = blockIdx.x;
  const scalar_t* xr = x + r * h;
  acc_t mean = 0;
  if (mean_out) {
    acc_t s = 0;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) s += static_cast<acc_t>(xr[j]);
    mean = block_sum(s, scratch) / static_cast<acc_t>(h);
  }
  acc_t sq = 0;
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    const acc_t d = static_cast<acc_t>(xr[j]) - mean;
    sq += d * d;
  }
  const acc_t rstd = fm::norm_rstd(block_sum(sq, scratch) / static_cast<acc_t>(h), eps);
  if (threadIdx.x == 0) {
    rstd_out[r] = rstd;
    if (mean_out) mean_out[r] = mean;
  }
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x)
    y[r * h + j] = static_cast<scalar_t>(fm::norm_out((static_cast<acc_t>(xr[j]) - mean) * rstd, w[j], b ? b[j] : acc_t(0)));
}

// Blocks stride over the rows; block k adds its rows' dy * xhat (and dy) into row k of part_w
// (part_b), each column owned by one thread. mean, part_b null for RMSNorm.
template <class scalar_t, class acc_t>
__global__ void norm_backward_kernel(const scalar_t* __restrict__ dy, const scalar_t* __restrict__ x,
                                     const acc_t* __restrict__ w, const acc_t* __restrict__ mean,
                                     const acc_t* __restrict__ rstd, scalar_t* __restrict__ dx,
                                     acc_t* __restrict__ part_w, acc_t* __restrict__ part_b, int64_t rows, int64_t h) {
  __shared__ acc_t scratch[kWarp];
  acc_t* pw = part_w + blockIdx.x * h;
  acc_t* pb = part_b ? part_b + blockIdx.x * h : nullptr;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const scalar_t* xr = x + r * h;
    const scalar_t* dyr = dy + r * h;
    const acc_t mu = mean ? mean[r] : acc_t(0), rs = rstd[r];
    acc_t sum_g = 0, sum_gxhat = 0;
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      const acc_t g = static_cast<acc_t>(dyr[j]) * w[j];
      sum_g += g;
      sum_gxhat += g * (static_cast<acc_t>(xr[j]) - mu) * rs;
    }
    const acc_t mean_g = mean ? block_sum(sum_g, scratch) / static_cast<acc_t>(h) : acc_t(0);
    const acc_t mean_gxhat = block_sum(sum_gxhat, scratch) / static_cast<acc_t>(h);
    for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
      const acc_t d = static_cast<acc_t>(dyr[j]);
      const acc_t xhat = (static_cast<acc_t>(xr[j]) - mu) * rs;
      dx[r * h + j] = static_cast<scalar_t>(fm::norm_dx(d * w[j], xhat, rs, mean_g, mean_gxhat));
      pw[j] += d * xhat;
      if (pb) pb[j] += d;
    }
  }
}

// One item per (row, pair i < D/2); row = (s * B + b) * N + n of the contiguous output.
template <class scalar_t, class acc_t>
__global__ void rope_kernel(const scalar_t* __restrict__ x, const acc_t* __restrict__ cos,
                            const acc_t* __restrict__ sin, scalar_t* __restrict__ y, int64_t B, int64_t N, int64_t D,
                            int64_t s0, int64_t s1, int64_t s2, int64_t items, bool backward) {
  const int64_t half = D / 2;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < items; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, r = k / half;
    const int64_t s = r / (B * N), b = (r / N) % B, n = r % N;
    const scalar_t* xr = x + s * s0 + b * s1 + n * s2;
    const acc_t* c = cos + s * D;
    const acc_t* sn = sin + s * D;
    fm::rope_apply(xr, c, sn, y + r * D, i, half, backward);
  }
}

template <class scalar_t, class acc_t>
__global__ void swiglu_forward_kernel(const scalar_t* __restrict__ gu, scalar_t* __restrict__ y, int64_t f,
                                      int64_t items) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < items; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / f, j = k % f;
    y[k] = static_cast<scalar_t>(
        fm::swiglu(static_cast<acc_t>(gu[r * 2 * f + j]), static_cast<acc_t>(gu[r * 2 * f + f + j])));
  }
}

template <class scalar_t, class acc_t>
__global__ void swiglu_backward_kernel(const scalar_t* __restrict__ gu, const scalar_t* __restrict__ dy,
                                       scalar_t* __restrict__ dgu, int64_t f, int64_t items) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < items; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / f, j = k % f;
    acc_t dg, du;
    fm::swiglu_backward(static_cast<acc_t>(gu[r * 2 * f + j]), static_cast<acc_t>(gu[r * 2 * f + f + j]),
                        static_cast<acc_t>(dy[k]), dg, du);
    dgu[r * 2 * f + j] = static_cast<scalar_t>(dg);
    dgu[r * 2 * f + f + j] = static_cast<scalar_t>(du);
  }
}

template <class scalar_t, class acc_t>
__global__ void gelu_forward_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, int64_t n) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
    y[k] = static_cast<scalar_t>(fm::gelu_tanh(static_cast<acc_t>(x[k])));
}

template <class scalar_t, class acc_t>
__global__ void gelu_backward_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ dy,
                                     scalar_t* __restrict__ dx, int64_t n) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x)
    dx[k] = static_cast<scalar_t>(fm::gelu_tanh_backward(static_cast<acc_t>(x[k]), static_cast<acc_t>(dy[k])));
}

}  // namespace

NormForward norm_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps, bool layernorm) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), h = x.size(1);
  NormForward out;
  out.y = at::empty_like(x);
  out.rstd = at::empty({rows}, x.options().dtype(acc_type(x)));
  if (layernorm) out.mean = at::empty({rows}, out.rstd.options());
  if (rows == 0) return out;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_norm_forward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    norm_forward_kernel<scalar_t, acc_t><<<static_cast<unsigned>(rows), norm_threads(h), 0, stream>>>(
        x.const_data_ptr<scalar_t>(), w.const_data_ptr<acc_t>(), layernorm ? b.const_data_ptr<acc_t>() : nullptr,
        out.y.mutable_data_ptr<scalar_t>(), layernorm ? out.mean.mutable_data_ptr<acc_t>() : nullptr,
        out.rstd.mutable_data_ptr<acc_t>(), h, static_cast<acc_t>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

NormBackward norm_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const NormForward& saved,
                           bool layernorm) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = x.size(0), h = x.size(1);
  // Two blocks per SM (each holds one row's columns in its threads), at most one per row.
  const int64_t sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t blocks = std::clamp<int64_t>(rows, 1, 2 * sms);
  NormBackward out;
  out.dx = at::empty_like(x);
  at::Tensor part_w = at::zeros({blocks, h}, x.options().dtype(acc_type(x)));
  at::Tensor part_b = layernorm ? at::zeros({blocks, h}, part_w.options()) : at::Tensor();
  if (rows > 0) {
    auto stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_norm_backward_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      norm_backward_kernel<scalar_t, acc_t><<<static_cast<unsigned>(blocks), norm_threads(h), 0, stream>>>(
          dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), w.const_data_ptr<acc_t>(),
          layernorm ? saved.mean.const_data_ptr<acc_t>() : nullptr, saved.rstd.const_data_ptr<acc_t>(),
          out.dx.mutable_data_ptr<scalar_t>(), part_w.mutable_data_ptr<acc_t>(),
          layernorm ? part_b.mutable_data_ptr<acc_t>() : nullptr, rows, h);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  out.dw = part_w.sum(0);
  if (layernorm) out.db = part_b.sum(0);
  return out;
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t S = x.size(0), B = x.size(1), N = x.size(2), D = x.size(3);
  at::Tensor y = at::empty({S, B, N, D}, x.options());
  const int64_t items = S * B * N * (D / 2);
  if (items == 0) return y;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_rope_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    rope_kernel<scalar_t, acc_t><<<elementwise_blocks(items), kElementwiseThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), cos.const_data_ptr<acc_t>(), sin.const_data_ptr<acc_t>(),
        y.mutable_data_ptr<scalar_t>(), B, N, D, x.stride(0), x.stride(1), x.stride(2), items, backward);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

at::Tensor swiglu_forward(const at::Tensor& gu) {
  const c10::cuda::CUDAGuard guard(gu.device());
  const int64_t rows = gu.size(0), f = gu.size(1) / 2;
  at::Tensor y = at::empty({rows, f}, gu.options());
  const int64_t items = rows * f;
  if (items == 0) return y;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gu.scalar_type(), "fused_swiglu_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    swiglu_forward_kernel<scalar_t, acc_t><<<elementwise_blocks(items), kElementwiseThreads, 0, stream>>>(
        gu.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), f, items);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

at::Tensor swiglu_backward(const at::Tensor& gu, const at::Tensor& dy) {
  const c10::cuda::CUDAGuard guard(gu.device());
  const int64_t rows = gu.size(0), f = gu.size(1) / 2;
  at::Tensor dgu = at::empty_like(gu);
  const int64_t items = rows * f;
  if (items == 0) return dgu;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gu.scalar_type(), "fused_swiglu_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    swiglu_backward_kernel<scalar_t, acc_t><<<elementwise_blocks(items), kElementwiseThreads, 0, stream>>>(
        gu.const_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(), dgu.mutable_data_ptr<scalar_t>(), f, items);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return dgu;
}

at::Tensor gelu_forward(const at::Tensor& x) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) return y;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_gelu_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    gelu_forward_kernel<scalar_t, acc_t><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

at::Tensor gelu_backward(const at::Tensor& x, const at::Tensor& dy) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor dx = at::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) return dx;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fused_gelu_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    gelu_backward_kernel<scalar_t, acc_t><<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        x.const_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(), dx.mutable_data_ptr<scalar_t>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return dx;
}

}  // namespace trainplan::exec::fused::cuda
