// exec/kernels on CPU: the chunked vocabulary-parallel cross-entropy against the plain loss, and
// ring attention (context parallelism) against ordinary causal attention. Multi-rank cases run
// their ranks as threads of this process over Gloo (loopback, an in-memory store).
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "exec/kernels/cross_entropy.hpp"
#include "exec/kernels/ring_attention.hpp"
#include "exec/parallel.hpp"
#include "sim/model_spec.hpp"

namespace trainplan::exec {
namespace {

// Largest |a - b| over the largest |b|: the relative error of a tensor.
double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const double scale = std::max(b.abs().max().item<double>(), 1e-30);
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() / scale;
}

// One group of `n` ranks as threads; body(comm) runs on each with its own Comm.
void run_ranks(int n, const std::function<void(Comm&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        PhaseClock clock(false);
        c10::intrusive_ptr<c10d::Backend> pg;
        if (n > 1) {
          auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(60000));
          opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
          pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, n, opts);
        }
        std::vector<int> ranks(n);
        for (int i = 0; i < n; ++i) ranks[i] = i;
        Comm comm(pg, ranks, r, &clock, Ph::tp_comm, "test");
        body(comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(ExecKernels, PaddedVocabIsAMultipleOf128TimesTp) {
  EXPECT_EQ(padded_vocab(50257, 1), 50304);  // GPT-2, as Megatron pads it
  EXPECT_EQ(padded_vocab(50257, 2), 50432);
  EXPECT_EQ(padded_vocab(256, 2), 256);
  EXPECT_EQ(padded_vocab(251, 2), 256);
  EXPECT_EQ(padded_vocab(10, 4), 512);
  const VocabShard a = vocab_shard(251, 128, 1);
  EXPECT_EQ(a.first, 128);
  EXPECT_EQ(a.valid, 123);
  EXPECT_EQ(vocab_shard(10, 128, 1).valid, 0);  // a rank with padding rows only
}

// The loss and gradients of x [T, h], w [rows, h] with targets [T], on one rank.
struct CeResult {
  at::Tensor loss, gx, gw;
};
CeResult ce(bool chunked, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& t, VocabShard s, Comm& tp,
            int64_t chunk) {
  at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  at::Tensor loss = chunked ? vocab_parallel_cross_entropy(x, w, t, s, tp, chunk)
                            : vocab_parallel_cross_entropy_reference(x, w, t, s, tp);
  (loss * 3.0).backward();  // a non-unit upstream gradient
  return {loss.detach(), x.grad(), w.grad()};
}

TEST(ExecKernels, ChunkedCrossEntropyEqualsPlainLossOnOneRank) {
  at::manual_seed(3);
  const int64_t T = 37, h = 16, vocab = 251, rows = padded_vocab(vocab, 1);
  at::Tensor x = at::randn({T, h}), w = at::randn({rows, h}) * 0.5;
  w.narrow(0, vocab, rows - vocab).zero_();
  at::Tensor t = at::randint(0, vocab, {T}, at::kLong);
  // Independent check: ATen's cross_entropy on the real rows' logits.
  at::Tensor want = at::cross_entropy_loss(at::matmul(x, w.narrow(0, 0, vocab).t()), t);
  run_ranks(1, [&](Comm& tp) {
    const VocabShard s = vocab_shard(vocab, rows, 0);
    const CeResult ref = ce(false, x, w, t, s, tp, 0);
    EXPECT_LT(rel_err(ref.loss, want), 1e-6);
    for (int64_t chunk : {int64_t(1), int64_t(5), int64_t(16), T, int64_t(1000)}) {
      const CeResult got = ce(true, x, w, t, s, tp, chunk);
      EXPECT_LT(rel_err(got.loss, ref.loss), 1e-5) << "chunk " << chunk;
      EXPECT_LT(rel_err(got.gx, ref.gx), 1e-5) << "chunk " << chunk;
      EXPECT_LT(rel_err(got.gw, ref.gw), 1e-5) << "chunk " << chunk;
      // Padding rows: no logit, so no gradient.
      EXPECT_EQ(got.gw.narrow(0, vocab, rows - vocab).abs().max().item<double>(), 0.0);
    }
  });
}

TEST(ExecKernels, ChunkedCrossEntropyVocabParallelEqualsOneRank) {
  at::manual_seed(4);
  const int64_t T = 29, h = 8, vocab = 131, tp = 2, rows = padded_vocab(vocab, tp) / tp;  // rank 1: 3 real rows
  at::Tensor x = at::randn({T, h}), w = at::randn({rows * tp, h});
  at::Tensor t = at::randint(0, vocab, {T}, at::kLong);
  t[0] = vocab - 1;  // a target on the last real row
  CeResult whole;
  run_ranks(1, [&](Comm& one) { whole = ce(false, x, w, t, vocab_shard(vocab, rows * tp, 0), one, 0); });
  std::vector<CeResult> part(tp);
  run_ranks(tp, [&](Comm& g) {
    const int r = g.index();
    part[r] = ce(true, x, w.narrow(0, rows * r, rows), t, vocab_shard(vocab, rows, r), g, 7);
  });
  for (int r = 0; r < tp; ++r) {
    EXPECT_LT(rel_err(part[r].loss, whole.loss), 1e-5) << "rank " << r;
    const VocabShard s = vocab_shard(vocab, rows, r);
    EXPECT_LT(rel_err(part[r].gw.narrow(0, 0, s.valid), whole.gw.narrow(0, rows * r, s.valid)), 1e-5);
  }
  // dL/dx is each rank's partial sum (the model's copy_to_tp sums it over TP).
  EXPECT_LT(rel_err(part[0].gx + part[1].gx, whole.gx), 1e-5);
}

TEST(ExecKernels, ZigzagPositionsBalanceTheCausalWork) {
  EXPECT_TRUE(at::equal(zigzag_positions(8, 2, 0), at::tensor({0, 1, 6, 7}, at::kLong)));
  EXPECT_TRUE(at::equal(zigzag_positions(8, 2, 1), at::tensor({2, 3, 4, 5}, at::kLong)));
  EXPECT_TRUE(at::equal(zigzag_positions(6, 1, 0), at::arange(6, at::kLong)));
  // Without CP an odd length is whole too (exec --seq 1 failed with exit 1 on this check).
  EXPECT_TRUE(at::equal(zigzag_positions(1, 1, 0), at::arange(1, at::kLong)));
  EXPECT_TRUE(at::equal(zigzag_positions(63, 1, 0), at::arange(63, at::kLong)));
}

// Causal attention of the full sequence, GQA heads repeated: the reference.
at::Tensor full_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t rep = q.size(1) / k.size(1);
  return at::scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), {}, 0.0, true);
}

void expect_ring_equals_full(int cp) {
  at::manual_seed(5 + cp);
  const int64_t b = 2, hq = 4, hkv = 2, seq = 8 * cp, d = 8;
  at::Tensor q = at::randn({b, hq, seq, d}), k = at::randn({b, hkv, seq, d}), v = at::randn({b, hkv, seq, d});
  at::Tensor dout = at::randn({b, hq, seq, d});
  at::Tensor qf = q.clone().requires_grad_(true), kf = k.clone().requires_grad_(true), vf = v.clone().requires_grad_(true);
  at::Tensor of = full_attention(qf, kf, vf);
  of.backward(dout);
  std::vector<at::Tensor> out(cp), dq(cp), dk(cp), dv(cp);
  run_ranks(cp, [&](Comm& g) {
    const int r = g.index();
    const at::Tensor pos = zigzag_positions(seq, cp, r);
    at::Tensor ql = q.index_select(2, pos).requires_grad_(true), kl = k.index_select(2, pos).requires_grad_(true),
               vl = v.index_select(2, pos).requires_grad_(true);
    at::Tensor o = ring_attention(ql, kl, vl, g);
    o.backward(dout.index_select(2, pos));
    out[r] = o.detach();
    dq[r] = ql.grad();
    dk[r] = kl.grad();
    dv[r] = vl.grad();
  });
  for (int r = 0; r < cp; ++r) {
    const at::Tensor pos = zigzag_positions(seq, cp, r);
    ASSERT_TRUE(out[r].defined()) << "rank " << r;
    EXPECT_LT(rel_err(out[r], of.detach().index_select(2, pos)), 1e-5) << "cp " << cp << " rank " << r;
    EXPECT_LT(rel_err(dq[r], qf.grad().index_select(2, pos)), 1e-5) << "cp " << cp << " rank " << r;
    EXPECT_LT(rel_err(dk[r], kf.grad().index_select(2, pos)), 1e-5) << "cp " << cp << " rank " << r;
    EXPECT_LT(rel_err(dv[r], vf.grad().index_select(2, pos)), 1e-5) << "cp " << cp << " rank " << r;
  }
}

TEST(ExecKernels, RingAttentionOneRankIsCausalAttention) { expect_ring_equals_full(1); }
TEST(ExecKernels, RingAttentionTwoRanksEqualsFullAttention) { expect_ring_equals_full(2); }
TEST(ExecKernels, RingAttentionThreeRanksEqualsFullAttention) { expect_ring_equals_full(3); }

}  // namespace
}  // namespace trainplan::exec
