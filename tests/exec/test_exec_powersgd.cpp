// exec/compression's PowerSGD on one rank (the all-reduces are the identity), checked against
// the algorithm's properties worked out by hand (Vogels et al. 2019, Algorithm 1):
//  - a gradient matrix of rank <= r is sent exactly: P = M Q spans M's column space (Q random, so
//    M Q has rank rank(M)), P Pᵀ M = M, and the error feedback stays zero;
//  - for a full-rank matrix the applied gradient is the projection P Pᵀ M (orthonormal P) and the
//    error is M - P Pᵀ M, orthogonal to it; the next step sends (next gradient + that error);
//  - parameters that are not matrices (here a bias) pass unchanged.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "exec/compression.hpp"
#include "exec/parallel.hpp"

namespace trainplan::exec {
namespace {

struct OneRank {
  PhaseClock clock{false};
  Comm dp{{}, {0}, 0, &clock, Ph::dp_comm, "dp"};
};

// A flat gradient holding a 12 x 8 matrix (offset 0) and a 5-element bias (offset 96).
struct Flat {
  at::Tensor grad = at::zeros({101});
  std::vector<ParamInfo> params;
  Flat() {
    ParamInfo w;
    w.name = "w";
    w.full_shape = {12, 8};
    w.offset = 0;
    w.numel = 96;
    w.param = grad.narrow(0, 0, 96).view({12, 8});
    ParamInfo b;
    b.name = "b";
    b.full_shape = {5};
    b.offset = 96;
    b.numel = 5;
    b.param = grad.narrow(0, 96, 5);
    params = {w, b};
  }
  at::Tensor matrix() { return grad.narrow(0, 0, 96).view({12, 8}); }
};

TEST(PowerSgd, LowRankGradientIsSentExactly) {
  torch::manual_seed(3);
  OneRank one;
  Flat f;
  GradCompressor c(GradCompression{CompressionKind::powersgd, 2}, 7);  // (12 + 8) * 2 = 40 < 96
  const int chunk = c.add_chunk(f.grad, f.params);
  const at::Tensor m = at::matmul(at::randn({12, 2}), at::randn({2, 8}));  // rank 2
  const at::Tensor bias = at::randn({5});
  f.matrix().copy_(m);
  f.grad.narrow(0, 96, 5).copy_(bias);
  c.reduce(chunk, one.dp);
  EXPECT_LT((f.matrix() - m).abs().max().item<double>(), 1e-4 * m.abs().max().item<double>());
  EXPECT_TRUE(f.grad.narrow(0, 96, 5).equal(bias));
  // Bytes handed to the all-reduces: the bias (5), P (12 x 2) and Q (8 x 2), in fp32 -- none on
  // one rank, where a Comm sends nothing.
  EXPECT_EQ(one.dp.bytes_sent(), 0);
  // Zero error feedback: a zero gradient next step sends (almost) nothing.
  f.grad.zero_();
  c.reduce(chunk, one.dp);
  EXPECT_LT(f.matrix().abs().max().item<double>(), 1e-4 * m.abs().max().item<double>());
}

TEST(PowerSgd, ErrorFeedbackSendsWhatTheProjectionDropped) {
  torch::manual_seed(4);
  OneRank one;
  Flat f;
  GradCompressor c(GradCompression{CompressionKind::powersgd, 1}, 7);
  const int chunk = c.add_chunk(f.grad, f.params);
  const at::Tensor m = at::randn({12, 8});  // full rank 8
  f.matrix().copy_(m);
  c.reduce(chunk, one.dp);
  const at::Tensor sent1 = f.matrix().clone();
  // A rank-1 projection: applied gradient = p pᵀ M with |p| = 1, so it is rank 1 and M - sent1
  // is orthogonal to it (Frobenius inner product zero).
  EXPECT_LT(at::linalg_matrix_rank(sent1).item<int64_t>(), 2);
  const double inner = (sent1 * (m - sent1)).sum().item<double>();
  EXPECT_LT(std::fabs(inner), 1e-4 * (m * m).sum().item<double>());
  EXPECT_GT((m - sent1).norm().item<double>(), 0.1 * m.norm().item<double>());
  // Next step, zero new gradient: what is sent comes from the error M - sent1 alone, so the two
  // steps together send more of M than the first did.
  f.grad.zero_();
  c.reduce(chunk, one.dp);
  const at::Tensor sent2 = f.matrix().clone();
  EXPECT_GT(sent2.norm().item<double>(), 0);
  EXPECT_LT((m - sent1 - sent2).norm().item<double>(), (m - sent1).norm().item<double>());
}

}  // namespace
}  // namespace trainplan::exec
