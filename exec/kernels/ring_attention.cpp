#include "exec/kernels/ring_attention.hpp"

#include <ATen/autocast_mode.h>

#include <cmath>
#include <limits>

namespace trainplan::exec {

at::Tensor zigzag_positions(int64_t seq, int cp, int rank) {
  // Without context parallelism any length is whole (exec --seq 1 or 63 failed here with exit 1);
  // the zigzag split needs 2 cp chunks, as validate() requires of --cp > 1.
  TORCH_CHECK(cp >= 1 && rank >= 0 && rank < cp && (cp == 1 || seq % (2 * cp) == 0),
              "zigzag_positions: 2*cp must divide seq");
  if (cp == 1) return at::arange(seq, at::kLong);
  const int64_t c = seq / (2 * cp);
  return at::cat({at::arange(rank * c, (rank + 1) * c, at::kLong),
                  at::arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c, at::kLong)});
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One ring step's share of the work: which of this rank's query rows attend to which key
// columns of the block it holds, and whether causally (see the header).
struct Part {
  int64_t row0, rows, col0, cols;
  bool causal;
};

Part part_of(int step, int src, int rank, int64_t L) {
  const int64_t c = L / 2;
  if (step == 0) return {0, L, 0, L, true};
  if (src < rank) return {0, L, 0, c, false};
  return {c, L - c, 0, L, false};
}

at::Tensor repeat_heads(const at::Tensor& t, int64_t rep) { return rep == 1 ? t : t.repeat_interleave(rep, 1); }

// Scaled scores of one block, fp32, with the causal mask (query i sees keys <= i) as -inf.
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, bool causal, double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)).to(at::kFloat).mul_(scale);
  if (causal) {
    auto mask = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).triu_(1);
    s.masked_fill_(mask, -std::numeric_limits<float>::infinity());
  }
  return s;
}

// Attention of q against one block: (output fp32, log-sum-exp of the scores fp32). Math form:
// o = softmax(q k^T * scale) v, lse = log sum exp(q k^T * scale) over the keys.
std::pair<at::Tensor, at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                bool causal, double scale) {
  at::Tensor s = scores(q, k, causal, scale);
  at::Tensor lse = s.logsumexp(-1);
  at::Tensor p = s.sub_(lse.unsqueeze(-1)).exp_();
  return {at::matmul(p.to(v.scalar_type()), v).to(at::kFloat), lse};
}

// Gradients of one block given the final output's log-sum-exp and D = rowsum(dO * O) (the
// softmax backward written with the global normaliser, as in FlashAttention-2, Dao 2023, Alg. 2):
// P = exp(S - lse), dV = P^T dO, dS = P * (dO V^T - D), dQ = dS K * scale, dK = dS^T Q * scale.
struct BlockGrads {
  at::Tensor dq, dk, dv;
};
BlockGrads block_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& dout,
                          const at::Tensor& lse, const at::Tensor& D, bool causal, double scale) {
  const auto dt = q.scalar_type();
  at::Tensor p = scores(q, k, causal, scale).sub_(lse.unsqueeze(-1)).exp_();
  at::Tensor dov = dout.to(dt);
  BlockGrads g;
  g.dv = at::matmul(p.to(dt).transpose(-2, -1), dov).to(at::kFloat);
  at::Tensor ds = at::matmul(dov, v.transpose(-2, -1)).to(at::kFloat).sub_(D.unsqueeze(-1)).mul_(p).to(dt);
  g.dq = at::matmul(ds, k).to(at::kFloat).mul_(scale);
  g.dk = at::matmul(ds.transpose(-2, -1), q).to(at::kFloat).mul_(scale);
  return g;
}

// Sum of a repeated-heads gradient [b, hkv*rep, L, d] back onto the hkv heads.
at::Tensor unrepeat(const at::Tensor& g, int64_t rep) {
  if (rep == 1) return g;
  return g.view({g.size(0), g.size(1) / rep, rep, g.size(2), g.size(3)}).sum(2);
}

constexpr int kTagKv = 1, kTagGrad = 2;

struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            int64_t comm) {
    // Autocast off: the dtypes here are chosen explicitly (matmuls in q's dtype, softmax in fp32).
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    Comm& cp = *reinterpret_cast<Comm*>(comm);
    const int C = cp.size(), r = cp.index();
    const int64_t L = q.size(2), rep = q.size(1) / k.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    at::Tensor out = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor lse = at::full({q.size(0), q.size(1), L}, -std::numeric_limits<float>::infinity(),
                              q.options().dtype(at::kFloat));
    at::Tensor kv = at::stack({k, v}).contiguous();  // [2, b, hkv, L, d]: one message per step
    for (int j = 0; j < C; ++j) {
      at::Tensor next;
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      if (j + 1 < C) {  // pass the block on while computing with it
        next = at::empty_like(kv);
        works = cp.exchange_async(kv, (r + 1) % C, next, (r - 1 + C) % C, kTagKv);
      }
      const Part pt = part_of(j, (r - j + C) % C, r, L);
      auto [o, l] = block_forward(q.narrow(2, pt.row0, pt.rows), repeat_heads(kv[0].narrow(2, pt.col0, pt.cols), rep),
                                  repeat_heads(kv[1].narrow(2, pt.col0, pt.cols), rep), pt.causal, scale);
      // Merge with what the rows have so far: lse' = log(e^lse + e^l), out' = out e^(lse-lse') + o e^(l-lse').
      at::Tensor out_rows = out.narrow(2, pt.row0, pt.rows), lse_rows = lse.narrow(2, pt.row0, pt.rows);
      at::Tensor merged = at::logaddexp(lse_rows, l);
      out_rows.mul_((lse_rows - merged).exp_().unsqueeze(-1)).add_(o.mul_((l - merged).exp_().unsqueeze(-1)));
      lse_rows.copy_(merged);
      for (auto& w : works) cp.wait(w, Ph::cp_comm);
      if (j + 1 < C) kv = next;
    }
    at::Tensor result = out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, result, lse});
    ctx->saved_data["comm"] = comm;
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    Comm& cp = *reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt());
    const int C = cp.size(), r = cp.index();
    const int64_t L = q.size(2), rep = q.size(1) / k.size(1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
    const at::Tensor dout = grads[0].to(at::kFloat);
    const at::Tensor D = (dout * out.to(at::kFloat)).sum(-1);  // [b, hq, L]
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor kv = at::stack({k, v}).contiguous();
    // The gradient of the block in hand travels with it and, after the last step, one more hop
    // brings it home: cp-1 transfers of K,V and cp of their gradients.
    at::Tensor dkv = at::zeros(kv.sizes(), kv.options().dtype(at::kFloat));
    for (int j = 0; j < C; ++j) {
      const Part pt = part_of(j, (r - j + C) % C, r, L);
      const BlockGrads g =
          block_backward(q.narrow(2, pt.row0, pt.rows), repeat_heads(kv[0].narrow(2, pt.col0, pt.cols), rep),
                         repeat_heads(kv[1].narrow(2, pt.col0, pt.cols), rep), dout.narrow(2, pt.row0, pt.rows),
                         lse.narrow(2, pt.row0, pt.rows), D.narrow(2, pt.row0, pt.rows), pt.causal, scale);
      dq.narrow(2, pt.row0, pt.rows).add_(g.dq);
      dkv[0].narrow(2, pt.col0, pt.cols).add_(unrepeat(g.dk, rep));
      dkv[1].narrow(2, pt.col0, pt.cols).add_(unrepeat(g.dv, rep));
      if (C == 1) break;
      std::vector<c10::intrusive_ptr<c10d::Work>> works;
      at::Tensor next_dkv = at::empty_like(dkv), next_kv;
      works = cp.exchange_async(dkv, (r + 1) % C, next_dkv, (r - 1 + C) % C, kTagGrad);
      if (j + 1 < C) {
        next_kv = at::empty_like(kv);
        auto w2 = cp.exchange_async(kv, (r + 1) % C, next_kv, (r - 1 + C) % C, kTagKv);
        works.insert(works.end(), w2.begin(), w2.end());
      }
      for (auto& w : works) cp.wait(w, Ph::cp_comm);
      dkv = next_dkv;
      if (j + 1 < C) kv = next_kv;
    }
    return {dq.to(q.scalar_type()), dkv[0].to(k.scalar_type()), dkv[1].to(v.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && q.size(1) % k.size(1) == 0 && q.size(2) == k.size(2) &&
                  (cp.size() == 1 || q.size(2) % 2 == 0),
              "ring_attention: q [b, hq, L, d], k and v [b, hkv, L, d], L even with cp > 1");
  // One compute dtype for q, k and v: autocast's where it is on (the function itself runs with
  // autocast off), else q's. K and V then travel in it.
  const auto dev = q.device().type();
  const at::ScalarType dt = at::autocast::is_autocast_enabled(dev) ? at::autocast::get_autocast_dtype(dev) : q.scalar_type();
  return RingAttention::apply(q.to(dt).contiguous(), k.to(dt).contiguous(), v.to(dt).contiguous(),
                              reinterpret_cast<int64_t>(&cp));
}

}  // namespace trainplan::exec
