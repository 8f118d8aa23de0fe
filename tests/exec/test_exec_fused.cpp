// exec/kernels/fused_ops on the CPU: each fused op's forward and backward against the LibTorch
// composite the model runs without --fused-kernels (the reference), in fp32 to 1e-5 relative and
// in bf16 to bf16 rounding; and the backward against central finite differences of the fused
// forward itself, in double. Shapes include non-power-of-two hidden sizes and odd row counts.
// The CUDA kernels run the same fused_math.hpp; on a machine with a GPU (a CUDA build) the last
// test checks them against these CPU loops, elsewhere it is skipped.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "exec/exec.hpp"
#include "exec/kernels/fused_ops.hpp"

namespace trainplan::exec {
namespace {

// Largest |a - b| over the largest |b|: the relative error of a tensor.
double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

using Fn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// Output and gradients of every input of f(inputs) · dy (the upstream gradient dy, random).
struct Result {
  at::Tensor y;
  std::vector<at::Tensor> grads;
};
Result run(const Fn& f, const std::vector<at::Tensor>& inputs0, const at::Tensor& dy) {
  std::vector<at::Tensor> inputs;
  for (const at::Tensor& t : inputs0) inputs.push_back(t.detach().clone().requires_grad_(true));
  at::Tensor y = f(inputs);
  y.backward(dy);
  Result r{y.detach(), {}};
  for (const at::Tensor& t : inputs) r.grads.push_back(t.grad());
  return r;
}

// The fused op against the composite: forward and every gradient, inputs in `dtype` (the
// composite computes in fp32 from the same rounded inputs, then its result is compared).
void expect_matches(const Fn& fused, const Fn& composite, std::vector<at::Tensor> inputs, at::ScalarType dtype,
                    double tol, const std::string& what) {
  for (at::Tensor& t : inputs) t = t.to(dtype);
  at::Tensor y_shape = composite(inputs);  // for the upstream gradient's shape
  const at::Tensor dy = at::randn(y_shape.sizes(), at::TensorOptions().dtype(dtype));
  const Result got = run(fused, inputs, dy);
  std::vector<at::Tensor> in32;
  for (const at::Tensor& t : inputs) in32.push_back(t.to(at::kFloat));
  const Result want = run(composite, in32, dy.to(at::kFloat));
  EXPECT_EQ(got.y.scalar_type(), dtype) << what;
  EXPECT_EQ(got.y.sizes(), want.y.sizes()) << what;
  EXPECT_LE(rel_err(got.y, want.y), tol) << what << ": forward";
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(got.grads[i].defined()) << what << ": input " << i << " got no gradient";
    EXPECT_EQ(got.grads[i].scalar_type(), dtype) << what << ": input " << i;
    EXPECT_LE(rel_err(got.grads[i], want.grads[i]), tol) << what << ": gradient of input " << i;
  }
}

// Rows x hidden shapes: hidden not a power of two, odd row counts, one row, a long row.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 64}, {7, 96}, {13, 100}, {3, 1000}, {5, 2051}};

// fp32: a 1e-5 relative error is ~100 fp32 roundings on O(1) values; the fused and composite
// forms differ only in summation order and FMA contraction.
constexpr double kFp32Tol = 1e-5;
// bf16: inputs, outputs and gradients are rounded to 8 significant bits (relative rounding 2^-9 =
// 0.002); the composite rounds its own result from fp32, so the two differ by about one bf16 ulp
// of the largest element (2^-8 = 0.0039 relative). A norm's input gradient is a difference of
// O(1) terms and can carry twice that.
constexpr double kBf16Tol = 0.02;

at::Tensor rms_reference(const at::Tensor& x, const at::Tensor& w) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-5) * w;  // exec/model.cpp's composite
}

TEST(ExecFused, RmsNormMatchesComposite) {
  at::manual_seed(1);
  for (auto [rows, h] : kShapes) {
    const at::Tensor x = at::randn({rows, h}) * 3 + 0.5, w = at::randn({h});
    const Fn fused = [](const std::vector<at::Tensor>& in) { return fused_rms_norm(in[0], in[1], 1e-5); };
    const Fn comp = [](const std::vector<at::Tensor>& in) { return rms_reference(in[0], in[1]); };
    const std::string what = "rmsnorm " + std::to_string(rows) + "x" + std::to_string(h);
    expect_matches(fused, comp, {x, w}, at::kFloat, kFp32Tol, what + " fp32");
    expect_matches(fused, comp, {x, w}, at::kBFloat16, kBf16Tol, what + " bf16");
  }
}

TEST(ExecFused, LayerNormMatchesComposite) {
  at::manual_seed(2);
  for (auto [rows, h] : kShapes) {
    // A large common offset: the variance must be taken about the mean, not as E[x^2] - E[x]^2.
    const at::Tensor x = at::randn({rows, h}) * 2 + 30, w = at::randn({h}), b = at::randn({h});
    const Fn fused = [](const std::vector<at::Tensor>& in) { return fused_layer_norm(in[0], in[1], in[2], 1e-5); };
    const Fn comp = [h](const std::vector<at::Tensor>& in) { return at::layer_norm(in[0], {h}, in[1], in[2], 1e-5); };
    const std::string what = "layernorm " + std::to_string(rows) + "x" + std::to_string(h);
    expect_matches(fused, comp, {x, w, b}, at::kFloat, kFp32Tol, what + " fp32");
    expect_matches(fused, comp, {x, w, b}, at::kBFloat16, kBf16Tol, what + " bf16");
  }
}

TEST(ExecFused, NormsTakeLeadingDimensionsAndNonContiguousInput) {
  at::manual_seed(3);
  // [s, b, h] as the model passes it, here a transposed (non-contiguous) view.
  const at::Tensor x = at::randn({3, 5, 48}).transpose(0, 1), w = at::randn({48}), b = at::randn({48});
  EXPECT_LE(rel_err(fused_rms_norm(x, w, 1e-5), rms_reference(x, w)), kFp32Tol);
  EXPECT_LE(rel_err(fused_layer_norm(x, w, b, 1e-5), at::layer_norm(x, {48}, w, b, 1e-5)), kFp32Tol);
  EXPECT_EQ(fused_rms_norm(x, w, 1e-5).sizes(), x.sizes());
}

// exec/model.cpp's composite RoPE: x * cos + rotate_half(x) * sin, tables [S, 1, 1, D].
at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t d = x.size(-1) / 2;
  const at::Tensor rh = at::cat({-x.narrow(-1, d, d), x.narrow(-1, 0, d)}, -1);
  const int64_t S = x.size(0), D = x.size(-1);
  return x * cos.view({S, 1, 1, D}) + rh * sin.view({S, 1, 1, D});
}

// The model's tables: position p (here, arbitrary positions as context parallelism gives), base
// 10000, frequencies repeated (cat(f, f)).
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t S, int64_t D) {
  auto pos = at::randperm(4 * S, at::kLong).narrow(0, 0, S).to(at::kDouble);
  auto inv = at::pow(10000.0, -at::arange(0, D, 2, at::kDouble) / D);
  auto f = at::outer(pos, inv);
  auto emb = at::cat({f, f}, -1).to(at::kFloat);
  return {emb.cos(), emb.sin()};
}

// Tables of any values (cos[i] != cos[i + D/2]): the kernels take the rotate-half form in
// general, not only the model's repeated frequencies.
std::pair<at::Tensor, at::Tensor> random_tables(int64_t S, int64_t D) { return {at::randn({S, D}), at::randn({S, D})}; }

TEST(ExecFused, RopeMatchesComposite) {
  at::manual_seed(4);
  // [S, B, N, D]: odd S, B, N; head dims 64 and 6 (D/2 odd).
  for (auto [S, B, N, D] : std::vector<std::array<int64_t, 4>>{{5, 3, 7, 64}, {9, 1, 3, 6}, {1, 2, 1, 128}}) {
    for (bool model_tables : {true, false}) {
      const at::Tensor x = at::randn({S, B, N, D});
      auto [cos, sin] = model_tables ? rope_tables(S, D) : random_tables(S, D);
      const Fn fused = [cos = cos, sin = sin](const std::vector<at::Tensor>& in) { return fused_rope(in[0], cos, sin); };
      const Fn comp = [cos = cos, sin = sin](const std::vector<at::Tensor>& in) {
        return rope_reference(in[0], cos, sin);
      };
      const std::string what = "rope " + std::to_string(S) + "x" + std::to_string(B) + "x" + std::to_string(N) + "x" +
                               std::to_string(D) + (model_tables ? "" : " (random tables)");
      expect_matches(fused, comp, {x}, at::kFloat, kFp32Tol, what + " fp32");
      expect_matches(fused, comp, {x}, at::kBFloat16, kBf16Tol, what + " bf16");
    }
  }
}

TEST(ExecFused, RopeReadsStridedQueryAndKeyViews) {
  at::manual_seed(5);
  // As the model calls it: q and k are views into the fused q/k/v GEMM's output [S, B, (4 + 2 + 2) * D].
  const int64_t S = 7, B = 3, D = 16;
  const at::Tensor qkv = at::randn({S, B, 8 * D});
  const at::Tensor q = qkv.narrow(-1, 0, 4 * D).view({S, B, 4, D}), k = qkv.narrow(-1, 4 * D, 2 * D).view({S, B, 2, D});
  ASSERT_FALSE(q.is_contiguous());
  auto [cos, sin] = rope_tables(S, D);
  EXPECT_LE(rel_err(fused_rope(q, cos, sin), rope_reference(q, cos, sin)), kFp32Tol);
  EXPECT_LE(rel_err(fused_rope(k, cos, sin), rope_reference(k, cos, sin)), kFp32Tol);
  // The gradient reaches the GEMM output through the views.
  const at::Tensor g = qkv.clone().requires_grad_(true);
  fused_rope(g.narrow(-1, 0, 4 * D).view({S, B, 4, D}), cos, sin).sum().backward();
  EXPECT_TRUE(g.grad().narrow(-1, 4 * D, 4 * D).eq(0).all().item<bool>());
  EXPECT_GT(g.grad().narrow(-1, 0, 4 * D).abs().sum().item<double>(), 0);
}

at::Tensor swiglu_reference(const at::Tensor& gu) {
  const int64_t f = gu.size(-1) / 2;
  return at::silu(gu.narrow(-1, 0, f)) * gu.narrow(-1, f, f);  // exec/model.cpp's composite
}

TEST(ExecFused, SwigluMatchesComposite) {
  at::manual_seed(6);
  for (auto [rows, f] : kShapes) {
    const at::Tensor gu = at::randn({rows, 1, 2 * f}) * 3;
    const Fn fused = [](const std::vector<at::Tensor>& in) { return fused_swiglu(in[0]); };
    const Fn comp = [](const std::vector<at::Tensor>& in) { return swiglu_reference(in[0]); };
    const std::string what = "swiglu " + std::to_string(rows) + "x" + std::to_string(f);
    expect_matches(fused, comp, {gu}, at::kFloat, kFp32Tol, what + " fp32");
    expect_matches(fused, comp, {gu}, at::kBFloat16, kBf16Tol, what + " bf16");
  }
}

TEST(ExecFused, GeluMatchesTanhApproximation) {
  at::manual_seed(7);
  for (auto [rows, h] : kShapes) {
    const at::Tensor x = at::randn({rows, h}) * 4;  // well into both tails
    const Fn fused = [](const std::vector<at::Tensor>& in) { return fused_gelu(in[0]); };
    const Fn comp = [](const std::vector<at::Tensor>& in) { return at::gelu(in[0], "tanh"); };
    const std::string what = "gelu " + std::to_string(rows) + "x" + std::to_string(h);
    expect_matches(fused, comp, {x}, at::kFloat, kFp32Tol, what + " fp32");
    expect_matches(fused, comp, {x}, at::kBFloat16, kBf16Tol, what + " bf16");
  }
}

// Fused ops in double against central differences of their own forward: the hand-written
// backward is the derivative of the hand-written forward (torch::autograd's gradcheck is Python
// only). Step 1e-6, error O(h^2 f''') ~ 1e-12 plus rounding 1e-16 / 1e-6 = 1e-10 per entry.
void expect_gradcheck(const Fn& f, std::vector<at::Tensor> inputs, const std::string& what) {
  for (at::Tensor& t : inputs) t = t.to(at::kDouble);
  const at::Tensor y0 = f(inputs);
  const at::Tensor dy = at::randn(y0.sizes(), at::TensorOptions().dtype(at::kDouble));
  const Result analytic = run(f, inputs, dy);
  const double eps = 1e-6;
  for (size_t i = 0; i < inputs.size(); ++i) {
    at::Tensor numeric = at::zeros_like(inputs[i]);
    at::Tensor flat = inputs[i].view({-1});
    for (int64_t k = 0; k < flat.numel(); ++k) {
      const double v = flat[k].item<double>();
      flat[k] = v + eps;
      const double up = (f(inputs) * dy).sum().item<double>();
      flat[k] = v - eps;
      const double down = (f(inputs) * dy).sum().item<double>();
      flat[k] = v;
      numeric.view({-1})[k] = (up - down) / (2 * eps);
    }
    EXPECT_LE(rel_err(analytic.grads[i], numeric), 1e-7) << what << ": gradient of input " << i;
  }
}

TEST(ExecFused, BackwardsMatchFiniteDifferencesInDouble) {
  at::manual_seed(8);
  expect_gradcheck([](const std::vector<at::Tensor>& in) { return fused_rms_norm(in[0], in[1], 1e-5); },
                   {at::randn({3, 10}), at::randn({10})}, "rmsnorm");
  expect_gradcheck([](const std::vector<at::Tensor>& in) { return fused_layer_norm(in[0], in[1], in[2], 1e-5); },
                   {at::randn({3, 10}), at::randn({10}), at::randn({10})}, "layernorm");
  auto [cos, sin] = random_tables(3, 6);
  expect_gradcheck([cos = cos, sin = sin](const std::vector<at::Tensor>& in) { return fused_rope(in[0], cos, sin); },
                   {at::randn({3, 2, 2, 6})}, "rope");
  expect_gradcheck([](const std::vector<at::Tensor>& in) { return fused_swiglu(in[0]); }, {at::randn({3, 2, 10}) * 2},
                   "swiglu");
  expect_gradcheck([](const std::vector<at::Tensor>& in) { return fused_gelu(in[0]); }, {at::randn({4, 7}) * 3},
                   "gelu");
}

// CUDA build on a GPU machine: every op's forward and backward on the GPU equals the CPU loops'
// (the same math; reductions in another order), fp32 to 1e-5 and bf16 to 0.02 relative.
TEST(ExecFused, CudaKernelsMatchCpuKernels) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device in this build or machine";
  at::manual_seed(9);
  auto [cos, sin] = random_tables(7, 64);
  const std::vector<std::pair<std::string, Fn>> ops = {
      {"rmsnorm", [](const std::vector<at::Tensor>& in) { return fused_rms_norm(in[0], in[1], 1e-5); }},
      {"layernorm", [](const std::vector<at::Tensor>& in) { return fused_layer_norm(in[0], in[1], in[2], 1e-5); }},
      {"rope", [cos = cos, sin = sin](const std::vector<at::Tensor>& in) {
         return fused_rope(in[0], cos.to(in[0].device()), sin.to(in[0].device()));
       }},
      {"swiglu", [](const std::vector<at::Tensor>& in) { return fused_swiglu(in[0]); }},
      {"gelu", [](const std::vector<at::Tensor>& in) { return fused_gelu(in[0]); }}};
  const std::vector<std::vector<at::Tensor>> inputs = {
      {at::randn({4099, 2051}) + 1, at::randn({2051})},
      {at::randn({4099, 2051}) + 1, at::randn({2051}), at::randn({2051})},
      {at::randn({7, 3, 5, 64})},
      {at::randn({1001, 2 * 1376}) * 3},
      {at::randn({1001, 3072}) * 3}};
  for (size_t k = 0; k < ops.size(); ++k) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      std::vector<at::Tensor> cpu, gpu;
      for (const at::Tensor& t : inputs[k]) {
        cpu.push_back(t.to(dtype));
        gpu.push_back(t.to(dtype).to(at::kCUDA));
      }
      const at::Tensor y = ops[k].second(cpu);
      const at::Tensor dy = at::randn(y.sizes()).to(dtype);
      const Result want = run(ops[k].second, cpu, dy), got = run(ops[k].second, gpu, dy.to(at::kCUDA));
      const double tol = dtype == at::kFloat ? kFp32Tol : kBf16Tol;
      const std::string what = ops[k].first + (dtype == at::kFloat ? " fp32" : " bf16");
      EXPECT_LE(rel_err(got.y.cpu(), want.y), tol) << what << ": forward";
      for (size_t i = 0; i < cpu.size(); ++i)
        EXPECT_LE(rel_err(got.grads[i].cpu(), want.grads[i]), tol) << what << ": gradient of input " << i;
    }
  }
}

TEST(ExecFused, RejectsBadShapes) {
  EXPECT_THROW(fused_rms_norm(at::randn({2, 8}), at::randn({7}), 1e-5), c10::Error);
  EXPECT_THROW(fused_swiglu(at::randn({2, 7})), c10::Error);
  auto [cos, sin] = rope_tables(4, 8);
  EXPECT_THROW(fused_rope(at::randn({5, 1, 1, 8}), cos, sin), c10::Error);  // 5 positions, tables for 4
  EXPECT_THROW(fused_gelu(at::ones({3}, at::kLong)), c10::Error);
}

}  // namespace
}  // namespace trainplan::exec
