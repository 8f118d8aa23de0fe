#include "exec/kernels/cross_entropy.hpp"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <limits>

namespace trainplan::exec {

VocabShard vocab_shard(int64_t vocab, int64_t rows_per_rank, int tp_rank) {
  VocabShard s;
  s.first = rows_per_rank * tp_rank;
  s.valid = std::clamp<int64_t>(vocab - s.first, 0, rows_per_rank);
  return s;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// For each token: the target's position among this rank's valid rows, and whether it is there.
std::pair<at::Tensor, at::Tensor> local_targets(const at::Tensor& t, VocabShard s) {
  auto inside = (t >= s.first).logical_and(t < s.first + s.valid);
  auto local = (t - s.first).masked_fill(inside.logical_not(), 0);
  return {local, inside};
}

struct ChunkedCrossEntropy : torch::autograd::Function<ChunkedCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets,
                            int64_t first, int64_t valid, int64_t comm, int64_t chunk) {
    Comm& tp = *reinterpret_cast<Comm*>(comm);
    const VocabShard s{first, valid};
    const int64_t T = x.size(0);
    const at::Tensor wv = w.narrow(0, 0, valid);
    at::Tensor grad_x = at::zeros_like(x);
    at::Tensor grad_w = at::zeros_like(w);
    at::Tensor loss = at::zeros({}, x.options().dtype(at::kFloat));
    const auto f32 = x.options().dtype(at::kFloat);
    // Without autocast (fp32, the CPU) the two gradient GEMMs write into grad_x and accumulate into
    // grad_w directly; under autocast they stay out-of-place (16-bit GEMMs; an in-place addmm_
    // would run in fp32) and are added.
    const bool autocast = at::autocast::is_autocast_enabled(x.device().type());
    // Under autocast the GEMMs take 16-bit copies of x and of the head, made once here: a cast
    // inside the loop would convert the whole head (vocabulary x hidden, fp32) for every chunk and
    // GEMM, and each chunk's fp32 gradient twice.
    const at::ScalarType gemm_dtype = autocast ? at::autocast::get_autocast_dtype(x.device().type()) : x.scalar_type();
    const at::Tensor xg = x.to(gemm_dtype);
    const at::Tensor wg = wv.to(gemm_dtype);
    at::Tensor grad_wv = grad_w.narrow(0, 0, valid);
    for (int64_t off = 0; off < T; off += chunk) {
      const int64_t n = std::min(chunk, T - off);
      const at::Tensor xc = xg.narrow(0, off, n);
      const auto [local, inside] = local_targets(targets.narrow(0, off, n), s);
      // Logits of this rank's real rows, fp32: [n, valid].
      at::Tensor logits = at::matmul(xc, wg.t()).to(at::kFloat);
      at::Tensor mx = valid > 0 ? logits.amax(-1) : at::full({n}, -std::numeric_limits<float>::infinity(), f32);
      tp.all_reduce(mx, c10d::ReduceOp::MAX);
      // log-sum-exp over the whole vocabulary = mx + log(sum over ranks of sum exp(logit - mx)).
      // One [n, valid] fp32 buffer throughout: logits, then exp(logit - mx) in place, then the
      // logits' gradient in place (no second exp, no temporary of the chunk's size).
      at::Tensor sums = at::zeros({2, n}, f32);  // row 0: sum exp(logit - mx), row 1: target logit - mx
      at::Tensor e;
      if (valid > 0) {
        at::Tensor z = logits.sub_(mx.unsqueeze(-1));  // logits - mx, in place
        sums[1] = z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(inside.logical_not(), 0.0);
        e = z.exp_();
        sums[0] = e.sum(-1);
      }
      tp.all_reduce(sums);
      loss += (sums[0].log() - sums[1]).sum();  // log(sum exp(logit - mx)) = lse - mx
      if (valid == 0) continue;
      // dL/dlogits of the mean loss: (softmax - one_hot(target)) / T, softmax = e / sum over ranks.
      at::Tensor g = e.div_(sums[0].unsqueeze(-1) * static_cast<double>(T));
      g.scatter_add_(-1, local.unsqueeze(-1), inside.to(at::kFloat).neg().unsqueeze(-1).div_(static_cast<double>(T)));
      const at::Tensor gc = g.to(gemm_dtype);
      // Under autocast gc is a 16-bit copy: the chunk's fp32 buffer is freed before the GEMMs, so
      // that the head's 16-bit copy and the weight gradient's 16-bit product never sit beside it.
      g.reset();
      e.reset();
      logits.reset();
      if (autocast) {
        grad_x.narrow(0, off, n).copy_(at::matmul(gc, wg));
        grad_wv.add_(at::matmul(gc.t(), xc));
      } else {
        at::Tensor gx = grad_x.narrow(0, off, n);
        at::mm_out(gx, gc, wg);
        grad_wv.addmm_(gc.t(), xc);
      }
    }
    ctx->saved_data["grad_x"] = grad_x;
    ctx->saved_data["grad_w"] = grad_w;
    return loss / static_cast<double>(T);
  }

  static variable_list backward(AutogradContext* ctx, variable_list g) {
    // Scaled in place: the saved gradients are this backward's alone (the graph is not retained),
    // so no second buffer of the head's size.
    at::Tensor gx = ctx->saved_data["grad_x"].toTensor();
    at::Tensor gw = ctx->saved_data["grad_w"].toTensor();
    ctx->saved_data.clear();
    gx.mul_(g[0].to(gx.scalar_type()));
    gw.mul_(g[0].to(gw.scalar_type()));
    return {gx, gw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets,
                                        VocabShard shard, Comm& tp, int64_t chunk_tokens) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && targets.dim() == 1 && targets.size(0) == x.size(0),
              "vocab_parallel_cross_entropy: x [T, h], w [rows, h], targets [T]");
  TORCH_CHECK(chunk_tokens > 0, "vocab_parallel_cross_entropy: chunk_tokens must be positive");
  return ChunkedCrossEntropy::apply(x, w, targets, shard.first, shard.valid, reinterpret_cast<int64_t>(&tp),
                                    chunk_tokens);
}

at::Tensor vocab_parallel_cross_entropy_reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets,
                                                  VocabShard shard, Comm& tp) {
  // Padding rows get no logit. The max is only for stability (no gradient).
  at::Tensor logits = at::matmul(x, w.narrow(0, 0, shard.valid).t()).to(at::kFloat);  // [T, valid]
  at::Tensor mx = shard.valid > 0 ? logits.detach().amax(-1, true)
                                  : at::full({x.size(0), 1}, -std::numeric_limits<float>::infinity(),
                                             x.options().dtype(at::kFloat));
  tp.all_reduce(mx, c10d::ReduceOp::MAX);
  auto z = logits - mx;
  auto sumexp = reduce_from_tp(z.exp().sum(-1), tp);
  const auto [local, inside] = local_targets(targets, shard);
  at::Tensor tz = shard.valid > 0 ? z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(inside.logical_not(), 0.0)
                                  : at::zeros({x.size(0)}, x.options().dtype(at::kFloat));
  tz = reduce_from_tp(tz, tp);
  return (sumexp.log() - tz).mean();
}

}  // namespace trainplan::exec
