// The routed experts of an MoE layer (see moe.hpp).
#include "exec/moe.hpp"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>
#include <numeric>

#include "exec/kernels/fused_ops.hpp"

namespace trainplan::exec {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

double bytes_of(const at::Tensor& t) { return static_cast<double>(t.numel()) * static_cast<double>(t.element_size()); }

struct ExpertAllToAll : torch::autograd::Function<ExpertAllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, std::vector<int64_t> out_splits,
                            std::vector<int64_t> in_splits, int64_t traffic) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["out"] = out_splits;
    ctx->saved_data["in"] = in_splits;
    ctx->saved_data["traffic"] = traffic;
    reinterpret_cast<ExpertTraffic*>(traffic)->token_bytes += bytes_of(x);
    return reinterpret_cast<Comm*>(comm)->all_to_all_dim0(x, out_splits, in_splits);
  }
  // The received rows' gradient goes back to the ranks they came from: the splits swapped.
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    Comm& comm = *reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt());
    reinterpret_cast<ExpertTraffic*>(ctx->saved_data["traffic"].toInt())->token_bytes += bytes_of(g[0]);
    at::Tensor grad = comm.all_to_all_dim0(g[0], ctx->saved_data["in"].toIntVector(), ctx->saved_data["out"].toIntVector());
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Where each dispatched row comes from and where its output goes.
struct Dispatch {
  at::Tensor rows;     // [N] int64: the token each dispatched row copies (T: a zero padding row)
  at::Tensor weights;  // [N] its routing weight (0 for padding)
  std::vector<int64_t> per_expert;  // rows sent to each expert, in expert order (contiguous blocks)
  bool padded = false;              // rows hold padding (index T)
};

// Dropless: every copy, ordered by expert (stably: by token within an expert).
Dispatch dropless(const Routing& r, int experts) {
  const int64_t T = r.experts.size(0), k = r.experts.size(1);
  const at::Tensor flat = r.experts.reshape({-1});
  const at::Tensor order = std::get<1>(at::sort(flat, /*stable=*/true, 0, false));
  const at::Tensor token = at::arange(T, flat.options()).repeat_interleave(k);
  Dispatch d;
  d.rows = token.index_select(0, order);
  d.weights = r.weights.reshape({-1}).index_select(0, order);
  const at::Tensor counts = at::bincount(flat, {}, experts).cpu();
  d.per_expert.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + experts);
  return d;
}

// Capacity `cap` per expert: of an expert's copies those with the largest weights, the others
// dropped, the rest of its `cap` rows padding.
Dispatch with_capacity(const Routing& r, int experts, int64_t cap) {
  const int64_t T = r.experts.size(0), k = r.experts.size(1);
  const at::Tensor flat = r.experts.reshape({-1}), w = r.weights.reshape({-1});
  const at::Tensor token = at::arange(T, flat.options()).repeat_interleave(k);
  // Copies grouped by expert, heaviest first within each: a stable sort by expert of the copies
  // sorted by weight.
  const at::Tensor by_weight = std::get<1>(at::sort(w.detach(), /*stable=*/true, 0, /*descending=*/true));
  const at::Tensor order = by_weight.index_select(0, std::get<1>(at::sort(flat.index_select(0, by_weight), true, 0, false)));
  const at::Tensor expert = flat.index_select(0, order);
  const at::Tensor counts = at::bincount(flat, {}, experts);
  const at::Tensor first = counts.cumsum(0) - counts;  // each expert's first position in `order`
  const at::Tensor pos = at::arange(order.numel(), flat.options()) - first.index_select(0, expert);
  const at::Tensor keep = pos < cap;
  const at::Tensor kept = order.masked_select(keep), slot = (expert * cap + pos).masked_select(keep);
  Dispatch d;
  d.rows = at::full({experts * cap}, T, flat.options()).index_copy(0, slot, token.index_select(0, kept));
  d.weights = at::zeros({experts * cap}, w.options()).index_copy(0, slot, w.index_select(0, kept));
  d.per_expert.assign(experts, cap);
  d.padded = true;
  return d;
}

// The splits of the two all-to-alls, from the rows each expert gets from each EP rank.
struct Exchange {
  std::vector<int64_t> in_splits, out_splits;  // rows sent to / received from each EP rank
  std::vector<int64_t> received;  // rows from EP rank i for local expert l at [i * local + l]
};

Exchange exchange_counts(const Dispatch& d, const MoeSettings& s, Comm& ep, ExpertTraffic& traffic,
                         const at::Device& device) {
  const int n = ep.size(), local = s.local_experts();
  Exchange e;
  for (int j = 0; j < n; ++j)
    e.in_splits.push_back(std::accumulate(d.per_expert.begin() + j * local, d.per_expert.begin() + (j + 1) * local,
                                          int64_t(0)));
  if (n == 1) {
    e.received = d.per_expert;
  } else if (d.padded) {  // every rank sends each expert exactly its capacity
    e.received.assign(static_cast<size_t>(n) * local, d.per_expert.front());
  } else {
    const at::Tensor counts = at::tensor(d.per_expert, at::TensorOptions().dtype(at::kLong)).to(device);
    traffic.count_bytes += bytes_of(counts);
    const std::vector<int64_t> equal(n, local);
    const at::Tensor got = ep.all_to_all_dim0(counts, equal, equal).cpu().contiguous();
    e.received.assign(got.data_ptr<int64_t>(), got.data_ptr<int64_t>() + got.numel());
  }
  for (int i = 0; i < n; ++i)
    e.out_splits.push_back(std::accumulate(e.received.begin() + i * local, e.received.begin() + (i + 1) * local,
                                           int64_t(0)));
  return e;
}

// One expert's MLP over its rows (none is fine: its weights then get a zero gradient).
at::Tensor expert_mlp(const at::Tensor& x, const ExpertWeights& w, const MoeSettings& s) {
  const at::Tensor h = at::linear(x, w.w_in, w.b_in);
  const bool rows = x.size(0) > 0;
  at::Tensor a;
  if (s.activation == Activation::gelu) {
    a = s.fuse_gelu && rows ? fused_gelu(h) : at::gelu(h, "tanh");
  } else if (s.fuse_swiglu && rows) {
    a = fused_swiglu(h);
  } else {
    const auto gate_up = h.chunk(2, -1);  // backward one cat (model.cpp rotate_half)
    a = at::silu(gate_up[0]) * gate_up[1];
  }
  return at::linear(a, w.w_out, w.b_out);
}

// The local experts over the received rows (ordered by source rank, then local expert): regrouped
// by expert, each expert's MLP as one GEMM per projection, outputs back in the received order.
at::Tensor run_local_experts(const at::Tensor& rows, const std::vector<int64_t>& received,
                             const std::vector<ExpertWeights>& local, const MoeSettings& s) {
  const int L = s.local_experts(), n = static_cast<int>(received.size()) / L;
  std::vector<int64_t> start(received.size(), 0);  // first row of block [i * L + l] in `rows`
  for (size_t b = 1; b < received.size(); ++b) start[b] = start[b - 1] + received[b - 1];
  std::vector<int64_t> perm, rows_of(L, 0);
  perm.reserve(static_cast<size_t>(rows.size(0)));
  for (int l = 0; l < L; ++l)
    for (int i = 0; i < n; ++i) {
      const int64_t b = start[i * L + l];
      for (int64_t r = b; r < b + received[i * L + l]; ++r) perm.push_back(r);
      rows_of[l] += received[i * L + l];
    }
  // One source rank, or one expert per rank: the rows are grouped by expert already.
  const bool grouped = n == 1 || L == 1;
  const at::Tensor idx = grouped ? at::Tensor() : at::tensor(perm, at::TensorOptions().dtype(at::kLong)).to(rows.device());
  const at::Tensor in = grouped ? rows : rows.index_select(0, idx);
  std::vector<at::Tensor> outs;
  int64_t off = 0;
  for (int l = 0; l < L; ++l) {
    outs.push_back(expert_mlp(in.narrow(0, off, rows_of[l]), local[l], s));
    off += rows_of[l];
  }
  const at::Tensor y = at::cat(outs);
  if (grouped) return y;
  // Row j of y belongs at perm[j]: gather with the inverse permutation.
  std::vector<int64_t> inverse(perm.size());
  for (size_t j = 0; j < perm.size(); ++j) inverse[static_cast<size_t>(perm[j])] = static_cast<int64_t>(j);
  return y.index_select(0, at::tensor(inverse, at::TensorOptions().dtype(at::kLong)).to(rows.device()));
}

}  // namespace

at::Tensor expert_all_to_all(const at::Tensor& x, Comm& ep, const std::vector<int64_t>& out_splits,
                             const std::vector<int64_t>& in_splits, ExpertTraffic& traffic) {
  if (ep.size() == 1) return x;
  return ExpertAllToAll::apply(x, reinterpret_cast<int64_t>(&ep), out_splits, in_splits,
                               reinterpret_cast<int64_t>(&traffic));
}

Routing route(const at::Tensor& x, const RouterWeights& router, const MoeSettings& s) {
  // In fp32 whatever autocast would pick (Megatron-core's router computes its scores in fp32).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor bias = router.b.defined() ? router.b.to(at::kFloat) : at::Tensor();
  const at::Tensor logits = at::linear(x.to(at::kFloat), router.w.to(at::kFloat), bias);
  const bool softmax = s.scoring == RouterScoring::softmax;
  const at::Tensor scores = softmax ? at::softmax(logits, -1) : at::sigmoid(logits);
  auto [w, idx] = at::topk(scores, s.top_k, -1);
  if (s.top_k > 1) w = softmax ? w / w.sum(-1, true) : w / (w.sum(-1, true) + 1e-20);
  return {w, idx};
}

int64_t expert_capacity(int64_t tokens, int top_k, int experts, double capacity_factor) {
  return static_cast<int64_t>(std::ceil(static_cast<double>(tokens) / experts * top_k * capacity_factor));
}

at::Tensor routed_experts(const at::Tensor& x, const RouterWeights& router, const std::vector<ExpertWeights>& local,
                          const MoeSettings& s, Comm& ep, ExpertTraffic& traffic) {
  TORCH_CHECK(ep.size() == s.ep && static_cast<int>(local.size()) == s.local_experts(),
              "routed_experts: the EP group and the local experts must match the settings");
  const int64_t T = x.size(0), h = x.size(1);
  const Routing r = route(x, router, s);
  const Dispatch d = s.capacity_factor > 0
                         ? with_capacity(r, s.experts, expert_capacity(T, s.top_k, s.experts, s.capacity_factor))
                         : dropless(r, s.experts);
  const at::Tensor source = d.padded ? at::cat({x, at::zeros({1, h}, x.options())}) : x;
  const Exchange e = exchange_counts(d, s, ep, traffic, x.device());
  // Under mixed precision the copies travel in the compute dtype, which the experts' GEMMs would
  // cast them to anyway (the residual stream and the norm's output are fp32).
  at::Tensor sent = source.index_select(0, d.rows);
  const at::DeviceType dev = x.device().type();
  if (at::autocast::is_autocast_enabled(dev)) sent = sent.to(at::autocast::get_autocast_dtype(dev));
  const at::Tensor received = expert_all_to_all(sent, ep, e.out_splits, e.in_splits, traffic);
  const at::Tensor outputs = run_local_experts(received, e.received, local, s);
  const at::Tensor back = expert_all_to_all(outputs, ep, e.in_splits, e.out_splits, traffic);
  // Combine: each copy's output times its weight, summed per token (padding into row T, dropped).
  const at::Tensor weighted = back.to(at::kFloat) * d.weights.unsqueeze(1);
  const at::Tensor out = at::zeros({T + (d.padded ? 1 : 0), h}, weighted.options()).index_add(0, d.rows, weighted);
  return d.padded ? out.narrow(0, 0, T) : out;
}

}  // namespace trainplan::exec
