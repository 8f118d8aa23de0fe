#include "sim/predict.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <cmath>
#include <numeric>
#include <span>

#include "sim/check.hpp"
#include "sim/collectives.hpp"
#include "sim/compression.hpp"
#include "sim/memory_model.hpp"
#include "sim/model_spec.hpp"
#include "sim/op_time.hpp"
#include "sim/param_server.hpp"
#include "sim/rank_layout.hpp"

namespace trainplan {

namespace {

// Per-stage scratch of predict's hot path: up to N elements on the stack (pipelines of at most
// 64 stages, nearly all), more on the heap. Not copied: its span points into it.
template <class T, std::size_t N>
class StageScratch {
 public:
  explicit StageScratch(std::size_t n)
      : heap_(n > N ? n : 0), span_(n > N ? std::span<T>(heap_) : std::span<T>(inline_).first(n)) {}
  StageScratch(const StageScratch&) = delete;
  StageScratch& operator=(const StageScratch&) = delete;
  std::span<T> span() const { return span_; }

 private:
  std::array<T, N> inline_;  // not value-initialised: each use writes what it reads
  std::vector<T> heap_;
  std::span<T> span_;
};

// The TP collectives of one activation tensor (tokens x hidden) of the micro-batch, each one call
// on the TP group: an all-reduce, or with sequence parallelism a reduce-scatter and an all-gather
// (Korthikanti et al. 2022, Sec. 4.2.2). A TP "all-reduce point" is one of each direction's pair:
// the all-reduce, or reduce-scatter + all-gather. All 0 without TP.
struct TpCollectives {
  Seconds all_reduce = 0, reduce_scatter = 0, all_gather = 0, point = 0;
};

TpCollectives tp_collectives(const PlanShape& shape, Bytes message) {
  TpCollectives t;
  const GroupLink& tp = shape.groups.tp;
  if (tp.size == 1) return t;
  if (shape.strategy.sequence_parallel) {
    t.reduce_scatter = tp.reduce_scatter(message);
    t.all_gather = tp.all_gather(message);
    t.point = t.reduce_scatter + t.all_gather;
  } else {
    t.all_reduce = tp.all_reduce(message);
    t.point = t.all_reduce;
  }
  return t;
}

// One activation tensor of the micro-batch (tokens x hidden), as TP collectives and pipeline
// sends move it.
Bytes hidden_message(const LayerGraph& graph, const PlanShape& shape) {
  return shape.tokens.per_rank * graph.model().hidden * shape.bytes.activation;
}

// What one rank's per-micro-batch costs are computed from, by reference: the plan's shape (its
// tokens, shares, widths and groups), the op times of the software profile, and the TP
// collectives' costs.
// One MoE layer's expert collectives for one micro-batch, one pass (the backward sends the same
// bytes back the other way): dispatch and combine, each the calls the dispatcher makes.
struct EpCalls {
  Seconds dispatch = 0, combine = 0;
};

struct LayerInputs {
  const LayerGraph& graph;
  const Cluster& cluster;
  const Software& sw;
  const PlanShape& shape;
  const OpCosts& ops;
  TpCollectives tp;
  EpCalls ep;
};

// Expected nodes of an EP group of `nodes` nodes (E / nodes experts each) holding at least one of a
// token's top_k experts, for routing that picks k distinct experts alike (balanced):
// nodes x (1 - C(E - E/nodes, k) / C(E, k)); group-limited routing whose groups each lie on one node
// (groups a multiple of the nodes, experts laid out in order) reaches at most topk_groups of them.
double token_nodes(const MoeSpec& e, int nodes) {
  if (nodes <= 1) return 1;
  const double E = e.experts, off_node = E - E / nodes;
  double none_on_node = 1;
  for (int i = 0; i < e.top_k; ++i) none_on_node *= std::max(0.0, off_node - i) / (E - i);
  double d = nodes * (1 - none_on_node);
  if (e.groups > 1 && e.groups % nodes == 0) d = std::min(d, static_cast<double>(e.topk_groups));
  return d;
}

// The expert collectives of one MoE layer (Megatron-core moe/token_dispatcher.py), over the busiest
// EP rank's tokens (MoeShape) of h elements:
//   alltoall:  dispatch = an all-to-all of the routed copies over EP (routed x h), then with
//              etp > 1 an all-gather of them over ETP (etp x routed x h gathered); combine = the
//              reduce-scatter over ETP, then the all-to-all back.
//   allgather: dispatch = an all-gather over the ep x etp expert ranks of every rank's tokens and
//              of its routing (a token's boolean map and fp32 probabilities over all experts, 5 B
//              each: MoEAllGatherTokenDispatcher gathers routing_map and probs); combine = the
//              reduce-scatter of the outputs back.
//   flex:      DeepEP / HybridEP: a token crosses the network once to each remote node holding its
//              experts (token_nodes x (nodes - 1) / nodes of them) and is forwarded over the node
//              link there, where every routed copy but the receiver's own arrives (routed x (q-1)/q
//              over the node link, q members per node); combine the reverse. ETP as alltoall.
EpCalls ep_calls(const ModelSpec& m, const PlanShape& shape) {
  EpCalls e;
  if (!m.moe.on()) return e;
  const Strategy& s = shape.strategy;
  const MoeShape& ms = shape.moe;
  const GroupLink& ep = shape.groups.ep;
  const double h = m.hidden, act = shape.bytes.activation;
  const Bytes routed = expert_all_to_all_bytes(m, shape);
  if (s.dispatcher == Dispatcher::allgather) {
    const double ranks = static_cast<double>(s.ep) * s.etp;
    const Bytes gathered = ranks * ms.tokens * (h * act + 5.0 * m.moe.experts);
    e.dispatch = shape.groups.expert_mp.all_gather(gathered);
    e.combine = shape.groups.expert_mp.reduce_scatter(ranks * ms.tokens * h * act);
    return e;
  }
  Seconds a2a = ep.all_to_all(routed);
  if (s.dispatcher == Dispatcher::flex) {
    const int q = std::min(ep.a2a.per_node, ep.size), nodes = (ep.size + q - 1) / q;
    const double factor = ms.routed / (ms.tokens * m.moe.top_k);  // the imbalance or capacity factor
    const Bytes network = ms.tokens * factor * token_nodes(m.moe, nodes) * (nodes - 1.0) / nodes * h * act;
    a2a = ep.forwarded_all_to_all(network, routed * (q - 1.0) / q);
  }
  e.dispatch = a2a + shape.groups.etp.all_gather(routed * s.etp);
  e.combine = shape.groups.etp.reduce_scatter(routed * s.etp) + a2a;
  return e;
}

// Share of an op's per-token work one rank does: tensor-split ops 1/tp, sequence-split ones 1/tp
// with SP (routed experts too: the layer's tokens enter them sequence-split).
double share_of(const PlanShape& shape, const OpSpec& op) {
  return op.split == Split::tensor ? shape.tokens.tensor_share : shape.tokens.seq_share;
}

// TP communication of one layer, from the graph's split changes (LayerBoundaries): entering the
// tensor region is free forward and an all-reduce backward, leaving it an all-reduce forward and
// free backward; with SP every boundary is an all-gather one way and a reduce-scatter the other.
struct TpTime {
  Seconds forward = 0, backward = 0;
};
// Each boundary moves the tensor crossing it, of its width per token (LayerBoundaries): hidden
// for a GPT/Llama layer's four (x.tp), an MLA latent's for its entries.
TpTime layer_tp_time(const LayerInputs& x, const LayerBoundaries& b) {
  const double hidden = x.graph.model().hidden;
  auto at = [&](double width) {
    return width == hidden ? x.tp
                           : tp_collectives(x.shape, x.shape.tokens.per_rank * width * x.shape.bytes.activation);
  };
  TpTime enter, exit;  // forward, backward of the enter and the exit boundaries
  const bool sp = x.shape.strategy.sequence_parallel;
  for (int i = 0; i < b.enter; ++i) {
    const TpCollectives t = at(b.enter_width[static_cast<std::size_t>(i)]);
    enter.forward += sp ? t.all_gather : 0.0;
    enter.backward += sp ? t.reduce_scatter : t.all_reduce;
  }
  for (int i = 0; i < b.exit; ++i) {
    const TpCollectives t = at(b.exit_width[static_cast<std::size_t>(i)]);
    exit.forward += sp ? t.reduce_scatter : t.all_reduce;
    exit.backward += sp ? t.all_gather : 0.0;
  }
  if (!sp) return {exit.forward, enter.backward};
  return {enter.forward + exit.forward, enter.backward + exit.backward};
}

// The head's extra forward collective where the stack gathers the logits over TP
// (Software::parallel.loss_on_gathered_logits; op_time.cpp costs the loss over the whole
// vocabulary): one all-gather of the micro-batch's 16-bit logits.
Seconds gathered_logits_time(const LayerInputs& x) {
  if (!x.sw.parallel.loss_on_gathered_logits || x.shape.strategy.tp == 1) return 0;
  return x.shape.groups.tp.all_gather(x.shape.tokens.per_rank * x.shape.vocab_rows * x.shape.bytes.activation);
}

// Input-gradient all-reduces of a layer's backward beyond one per TP region entry, for a stack
// whose column-parallel linears each reduce their own (Software::parallel.tp_reduce_per_linear;
// without SP, where a region is entered by an all-reduce backward): K and V beside Q where they
// are separate linears, the up projection beside the SwiGLU gate where they are.
double extra_input_gradient_reduces(const LayerInputs& x) {
  const Strategy& s = x.shape.strategy;
  if (!x.sw.parallel.tp_reduce_per_linear || s.tp == 1 || s.sequence_parallel) return 0;
  const bool swiglu = x.graph.model().activation == Activation::swiglu;
  return (x.sw.qkv_fused ? 0.0 : 2.0) + (swiglu && !x.sw.gate_up_fused ? 1.0 : 0.0);
}

// The layer's parameters and FLOPs per rank (Korthikanti et al. 2022), and the attention core
// selective recomputation repeats before the backward (Megatron's core-attention checkpointing,
// with flash attention as with materialised scores).
// Routed experts' parameters are split over ep x etp ranks (rank_params), and their FLOPs per
// rank are the layer's tokens' share (the balanced share: FLOPs count the model's work, not the
// busiest rank's). Module recomputation (mla_up_proj) repeats the up projections' FLOPs.
void add_params_and_flops(const LayerInputs& x, int kind, Seconds attention_fwd, LayerCost& c) {
  const Strategy& s = x.shape.strategy;
  const double tokens = x.shape.tokens.per_rank;
  const bool mla_up = s.recompute_modules & kRecomputeMlaUpProj;
  for (const auto& op : x.graph.kind_ops(kind)) {
    const double p = rank_params(op, s.tp, x.shape.moe.expert_shards);
    c.params += p;
    if (op.split == Split::expert) c.expert_params += p;
    const Flops flops = causal_flops_per_token(op) * tokens * share_of(x.shape, op);
    c.flops += flops;
    if (op.kind == OpKind::attention && s.recompute == Recompute::selective) {
      c.recompute = attention_fwd;
      c.recompute_flops = flops;
    }
    if (mla_up && (op.kind == OpKind::q_up || op.kind == OpKind::kv_up)) c.recompute_flops += flops;
  }
}

// The expert all-to-all of one MoE layer (ep_calls) on the critical path. Forward: the dispatch,
// with the shared experts running meanwhile where the stack overlaps them (software
// moe.shared_expert_overlap: only the part of the dispatch beyond them shows), then the combine.
// With the strategy's all-to-all overlap (moe_a2a_overlap) the stack hides the share overlap.ep
// of what remains behind another micro-batch's compute (the rest shows, the hidden part slowing
// the layer's compute by the cluster's contention share: exposed_comm); without it all of it
// shows. Backward: the same calls on the gradients. Full recomputation repeats the forward's.
void add_ep_exchange(const LayerInputs& x, int kind, LayerCost& c) {
  const LayerOpCosts& ops = x.ops.kinds[kind];
  const double share = x.shape.strategy.moe_a2a_overlap ? x.sw.overlap.ep : 0.0;
  const double rate = overlap_cost_rate(share, x.cluster.collectives.overlap_slowdown);
  auto exposed_pass = [&](Seconds shared, Seconds window) {
    const Seconds dispatch = x.sw.moe.shared_expert_overlap ? std::max(0.0, x.ep.dispatch - shared) : x.ep.dispatch;
    return exposed_comm(dispatch + x.ep.combine, window, rate);
  };
  c.ep_forward = exposed_pass(ops.shared_fwd.gpu, c.forward);
  c.ep_backward = exposed_pass(ops.shared_bwd.gpu, c.backward);
  if (x.shape.strategy.recompute == Recompute::full) c.ep_backward += c.ep_forward;
}

// Ring attention's exchange (context parallelism): cp-1 steps, each passing the local K and V
// block to the next rank while attending to the current one; only the part of a transfer longer
// than a step's compute shows. Backward passes K, V and their gradients (twice the bytes, twice
// the compute). The causal work is balanced as in Megatron (and exec/kernels/ring_attention): the
// sequence is cut into 2*cp chunks, rank r holding chunks r and 2cp-1-r, so each step after the
// first is half a block and every step takes attention_fwd / cp. exec also sends the gradient of
// the last block home (one dK/dV hop more than counted here). Per attention core of the layer
// (bounds.attention; one in GPT/Llama).
void add_cp_exchange(const LayerInputs& x, const LayerBoundaries& bounds, Seconds attention_fwd, LayerCost& c) {
  const ModelSpec& m = x.graph.model();
  const Strategy& s = x.shape.strategy;
  const GroupLink& cp = x.shape.groups.cp;
  // MLA's keys are heads x (d_n + d_r) wide, its values heads x d_v.
  const double kv_elems = m.mla.on() ? static_cast<double>(m.heads) * (m.mla.qk_head_dim() + m.mla.v_head_dim)
                                     : 2.0 * m.kv_heads * m.head_dim();
  const Bytes kv = x.shape.tokens.per_rank * kv_elems / s.tp * x.shape.bytes.activation;
  const Seconds send = cp.send_recv(kv), send2 = cp.send_recv(2 * kv);
  const Seconds step_fwd = attention_fwd / s.cp;
  c.cp_forward = bounds.attention * ((s.cp - 1) * std::max(0.0, send - step_fwd));
  c.cp_backward = bounds.attention * ((s.cp - 1) * std::max(0.0, send2 - 2 * step_fwd));
}

LayerCost layer_cost(const LayerInputs& x, int kind) {
  const Strategy& s = x.shape.strategy;
  const LayerOpCosts& ops = x.ops.kinds[kind];
  LayerCost c;
  // Compute from the op time model (measured kernels, software profile); a dropless dispatch
  // that waits on the host splits the forward there (MoeOps::dropless_dispatch_syncs).
  const HostLaunch& host = x.shape.host;
  const bool waits = x.graph.kind(kind).moe && x.sw.moe.dropless_dispatch_syncs && s.capacity_factor == 0 &&
                     s.dispatcher != Dispatcher::allgather;
  c.forward = waits ? ops.fwd.time_with_wait_before(ops.after_dispatch_fwd, host) : ops.fwd.time(host);
  c.backward = ops.bwd.time(host);
  const Seconds attention_fwd = ops.attention_fwd.time(host);
  add_params_and_flops(x, kind, attention_fwd, c);
  if (s.recompute_modules != 0) c.recompute += ops.module_recompute.time(host);
  c.expert_forward = ops.expert_fwd.gpu;
  c.expert_backward = ops.expert_bwd.gpu;
  // TP collectives where the graph's edges change a tensor's split (for GPT/Llama two each way);
  // full recomputation repeats the forward's. A stack that overlaps them with the GEMMs around
  // them (Transformer Engine's --tp-comm-overlap: each all-gather / reduce-scatter pipelined with
  // the GEMM that consumes / produces it) hides the share overlap.tp behind the layer's compute in
  // the same direction; the hidden part still slows that compute by the cluster's contention
  // share. Share 0: all of it on the critical path.
  const LayerBoundaries& bounds = x.graph.boundaries(kind);
  TpTime tp = layer_tp_time(x, bounds);
  tp.backward += extra_input_gradient_reduces(x) * x.tp.all_reduce;
  // The mlp module re-runs a dense MLP's forward collectives with it (tensor_parallel.checkpoint):
  // with SP the all-gather into the up projection and the reduce-scatter after the down
  // projection, else the all-reduce after it.
  if ((s.recompute_modules & kRecomputeMlp) && !x.graph.kind(kind).moe && s.tp > 1)
    tp.backward += s.sequence_parallel ? x.tp.all_gather + x.tp.reduce_scatter : x.tp.all_reduce;
  const double slowdown = x.cluster.collectives.overlap_slowdown;
  c.tp_forward = exposed_comm(tp.forward, c.forward, overlap_cost_rate(x.sw.overlap.tp, slowdown));
  c.tp_backward = exposed_comm(tp.backward, c.backward, overlap_cost_rate(x.sw.overlap.backward_tp(), slowdown));
  if (s.recompute == Recompute::full) {
    c.recompute = c.forward;
    c.recompute_flops = c.flops;
    c.tp_backward += c.tp_forward;
  }
  if (s.cp > 1 && bounds.attention > 0) {
    add_cp_exchange(x, bounds, attention_fwd, c);
    if (s.recompute == Recompute::full) c.cp_backward += c.cp_forward;
  }
  if (x.graph.kind(kind).moe) add_ep_exchange(x, kind, c);
  return c;
}

EndCost end_cost(const LayerInputs& x, std::span<const OpSpec> ops, const EndOpCosts& t) {
  EndCost c;
  c.forward = t.fwd.time(x.shape.host);
  c.backward = t.bwd.time(x.shape.host);
  for (const auto& op : ops) {
    // The vocabulary-parallel embedding and LM head split the vocabulary over TP ranks; norms and
    // learned position embeddings are replicated (rank_params).
    c.params += rank_params(op, x.shape.strategy.tp, x.shape.moe.expert_shards);
    c.flops += causal_flops_per_token(op) * x.shape.tokens.per_rank * share_of(x.shape, op);
  }
  // Vocabulary-parallel embedding / cross-entropy: one all-reduce point each way. Not read off the
  // graph: its end ops carry no vocabulary split, and Megatron's operators would charge one
  // direction only (a model change for the fidelity work, which would move the golden outputs).
  c.tp_forward = x.tp.point;
  c.tp_backward = x.tp.point;
  return c;
}

}  // namespace

namespace {

// The layer split's balance under a time budget: layer cost c, the extra work of the first and
// last chunk, L layers over n chunks.
struct SplitLoad {
  int layers, chunks;
  double c, first_extra, last_extra;
  // Largest layer count a chunk with `extra` may hold under a time budget T, at least 1.
  double cap(double T, double extra) const {
    return std::clamp(std::floor((T - extra) / c + 1e-9), 1.0, static_cast<double>(layers));
  }
  bool fits(double T) const { return cap(T, first_extra) + cap(T, last_extra) + (chunks - 2) * cap(T, 0.0) >= layers; }
};

// The smallest budget T under which contiguous chunks hold every layer. It is a chunk's load
// k*c + e for some whole k and e in {0, first_extra, last_extra}, and lies in [lb, lb + c], with lb
// the larger of the average load and the lightest possible end chunks: at lb + c every chunk
// takes at least (lb - e)/c layers, (n*lb - E - H)/c >= L in all. So at most six candidates remain.
double smallest_budget(const SplitLoad& x) {
  const double c = x.c;
  double lb = (x.layers * c + x.first_extra + x.last_extra) / x.chunks;
  lb = std::max({lb, c + x.first_extra, c + x.last_extra});
  double hi = lb + c;
  for (double e : {0.0, x.first_extra, x.last_extra}) {
    const double k0 = std::max(1.0, std::ceil((lb - e) / c - 1e-9));
    for (int step = 0; step < 3; ++step) {  // k*c + e in [lb, lb + c] spans at most two whole k
      const double T = (k0 + step) * c + e;
      if (T <= lb + c && T < hi && x.fits(T)) hi = T;
    }
  }
  return hi;
}

// Water-fill under each chunk's cap (first, middle, last): every chunk gets min(cap, q) for the
// highest level q that fits, and the leftover layers go one each to chunks that can take more
// (later chunks first).
void water_fill(int layers, std::span<int> out, int cap_first, int cap_mid, int cap_last) {
  const int chunks = static_cast<int>(out.size());
  auto filled = [&](long q) {
    return std::min<long>(cap_first, q) + std::min<long>(cap_last, q) + (chunks - 2L) * std::min<long>(cap_mid, q);
  };
  // Highest level q with filled(q) <= layers (filled is non-decreasing in q).
  long lo_q = 1, hi_q = layers;
  while (lo_q < hi_q) {
    const long mid = (lo_q + hi_q + 1) / 2;
    if (filled(mid) <= layers) {
      lo_q = mid;
    } else {
      hi_q = mid - 1;
    }
  }
  const int q = static_cast<int>(lo_q);
  auto caps = [&](int i) { return i == 0 ? cap_first : i == chunks - 1 ? cap_last : cap_mid; };
  int rest = layers;
  for (int i = 0; i < chunks; ++i) rest -= (out[i] = std::min(caps(i), q));
  for (int i = chunks - 1; i >= 0 && rest > 0; --i) {
    if (out[i] < caps(i)) {
      ++out[i];
      --rest;
    }
  }
  TRAINPLAN_CHECK(rest == 0, "layer partition lost layers");
}

// partition_layers() into `out` (one entry per chunk), without allocating.
void partition_layers_into(int layers, std::span<int> out, double layer_cost, double first_extra, double last_extra) {
  const int chunks = static_cast<int>(out.size());
  TRAINPLAN_CHECK(chunks >= 1 && layers >= chunks, "need at least one layer per chunk");
  if (chunks == 1) {
    out[0] = layers;
    return;
  }
  if (!(std::isfinite(layer_cost) && std::isfinite(first_extra) && std::isfinite(last_extra)) || !(layer_cost > 0)) {
    // No usable costs (e.g. a dtype the GPU lacks): split evenly, later chunks take the remainder.
    std::fill(out.begin(), out.end(), layers / chunks);
    for (int i = chunks - layers % chunks; i < chunks; ++i) ++out[i];
    return;
  }
  const SplitLoad x{layers, chunks, layer_cost, first_extra, last_extra};
  const double budget = smallest_budget(x);
  water_fill(layers, out, static_cast<int>(x.cap(budget, first_extra)), static_cast<int>(x.cap(budget, 0.0)),
             static_cast<int>(x.cap(budget, last_extra)));
}

}  // namespace

namespace {

// uniform_module_split() into `out` (one entry per chunk); false where a chunk gets no layer.
bool uniform_module_split_into(int layers, std::span<int> out) {
  const int chunks = static_cast<int>(out.size());
  const int modules = layers + 3, base = modules / chunks, rest = modules % chunks;
  int start = 0;  // first module of the chunk; modules 1..layers are the transformer layers
  for (int i = 0; i < chunks; ++i) {
    const int end = start + base + (i < rest ? 1 : 0);
    out[i] = std::max(0, std::min(end, layers + 1) - std::max(start, 1));
    if (out[i] == 0) return false;
    start = end;
  }
  return true;
}

// The even split of Megatron-core (Strategy::pipeline_accounts, validated to divide): every chunk
// (layers + counted) / chunks layers, less one in the first for the embedding and in the last for
// the loss where its account flags count them (`layers`: neither counted).
void accounted_split_into(int layers, unsigned accounts, std::span<int> out) {
  const int chunks = static_cast<int>(out.size()), counted = counted_modules(accounts);
  TRAINPLAN_CHECK(chunks >= 2 && (layers + counted) % chunks == 0, "validate() checks the accounted split");
  std::fill(out.begin(), out.end(), (layers + counted) / chunks);
  if (accounts & kAccountEmbedding) --out.front();
  if (accounts & kAccountLoss) --out.back();
}

// The greedy fill of partition_layers (per-layer costs, `prefix` their prefix sums): chunk i takes
// the most layers that keep its load (extra + its layers) within T and leave one layer for each
// later chunk; the last takes the rest. Writes the counts into `out` when given. Whether every
// chunk stays within T.
bool fill_within(std::span<const double> prefix, int chunks, double first_extra, double last_extra, double T,
                 std::span<int> out) {
  const int layers = static_cast<int>(prefix.size()) - 1;
  int at = 0;
  for (int i = 0; i < chunks; ++i) {
    const double extra = (i == 0 ? first_extra : 0.0) + (i == chunks - 1 ? last_extra : 0.0);
    const int most = layers - (chunks - 1 - i);  // leave one layer for each later chunk
    int end = at + 1;
    if (i == chunks - 1) {
      end = layers;
    } else {
      // The last end in (at, most] with prefix[end] - prefix[at] + extra <= T.
      const double limit = T - extra + prefix[static_cast<std::size_t>(at)];
      const auto it = std::upper_bound(prefix.begin() + at + 1, prefix.begin() + most + 1, limit);
      end = std::max(at + 1, static_cast<int>(it - prefix.begin()) - 1);
    }
    if (prefix[static_cast<std::size_t>(end)] - prefix[static_cast<std::size_t>(at)] + extra > T) return false;
    if (!out.empty()) out[static_cast<std::size_t>(i)] = end - at;
    at = end;
  }
  return true;
}

// partition_layers of per-layer costs into `out`: bisection on the busiest chunk's load between
// the largest single-layer chunk and the whole model on one chunk, to a relative 1e-12.
void partition_costs_into(std::span<const double> costs, std::span<int> out, double first_extra, double last_extra) {
  const int chunks = static_cast<int>(out.size()), layers = static_cast<int>(costs.size());
  TRAINPLAN_CHECK(chunks >= 1 && layers >= chunks, "need at least one layer per chunk");
  if (chunks == 1) {
    out[0] = layers;
    return;
  }
  std::vector<double> prefix(costs.size() + 1, 0.0);
  for (std::size_t l = 0; l < costs.size(); ++l) prefix[l + 1] = prefix[l] + costs[l];
  // (Each chunk's load is summed as fill_within sums it, so that the whole model fits its bound
  // to the last bit.)
  double lo = 0, hi = prefix.back() + (first_extra + last_extra);
  if (!(std::isfinite(hi) && hi > 0)) {  // no usable costs: split evenly, later chunks take the rest
    std::fill(out.begin(), out.end(), layers / chunks);
    for (int i = chunks - layers % chunks; i < chunks; ++i) ++out[static_cast<std::size_t>(i)];
    return;
  }
  for (int step = 0; step < 200 && hi - lo > 1e-12 * hi; ++step) {
    const double mid = 0.5 * (lo + hi);
    (fill_within(prefix, chunks, first_extra, last_extra, mid, {}) ? hi : lo) = mid;
  }
  const bool ok = fill_within(prefix, chunks, first_extra, last_extra, hi, out);
  TRAINPLAN_CHECK(ok, "layer partition found no split within its bound");
}

}  // namespace

std::vector<int> uniform_module_split(int layers, int chunks) {
  TRAINPLAN_CHECK(chunks >= 1 && layers >= chunks, "need at least one layer per chunk");
  std::vector<int> out(chunks);
  if (!uniform_module_split_into(layers, out)) out.clear();
  return out;
}

std::vector<int> partition_layers(int layers, int chunks, double layer_cost, double first_extra,
                                  double last_extra) {
  TRAINPLAN_CHECK(chunks >= 1, "need at least one layer per chunk");
  std::vector<int> out(chunks);
  partition_layers_into(layers, out, layer_cost, first_extra, last_extra);
  return out;
}

std::vector<int> partition_layers(std::span<const double> layer_costs, int chunks, double first_extra,
                                  double last_extra) {
  TRAINPLAN_CHECK(chunks >= 1, "need at least one layer per chunk");
  std::vector<int> out(chunks);
  partition_costs_into(layer_costs, out, first_extra, last_extra);
  return out;
}

namespace {

LayerKey layer_key(const Strategy& s, int tp_stride, int cp_stride, int ep_stride, int etp_stride) {
  LayerKey k;
  k.ep = s.ep;
  k.etp = s.etp;
  k.ep_stride = ep_stride;
  k.etp_stride = etp_stride;
  k.moe_imbalance = s.moe_imbalance;
  k.capacity_factor = s.capacity_factor;
  k.dispatcher = s.dispatcher;
  k.recompute_modules = s.recompute_modules;
  k.moe_a2a_overlap = s.moe_a2a_overlap;
  k.tp = s.tp;
  k.cp = s.cp;
  k.micro_batch = s.micro_batch;
  k.seq_len = s.seq_len;
  k.sequence_parallel = s.sequence_parallel;
  k.recompute = s.recompute;
  k.dtype = s.dtype;
  k.attention = s.attention;
  k.tp_stride = tp_stride;
  k.cp_stride = cp_stride;
  return k;
}

}  // namespace

LayerKey layer_key(const PlanShape& shape) {
  const ParallelGroups& g = shape.groups;
  return layer_key(shape.strategy, g.tp.stride, g.cp.stride, g.ep.stride, g.etp.stride);
}

LayerKey layer_key(const Strategy& s) {
  const RankLayout layout(s);
  return layer_key(s, layout.stride(Dim::tp), layout.stride(Dim::cp), layout.stride(ExpertDim::ep),
                   layout.stride(ExpertDim::etp));
}

// DeepSeek-V3's MTP modules on the last stage (LayerGraph::add_mtp): each module's own ops (norms,
// projection, the shared head's GEMM and loss: ops.mtp) and its transformer layer (the layer cost
// of LayerGraph::mtp_kind()), folded into the post piece: its recomputation and CP, EP exchanges
// into the backward and forward they extend.
void add_mtp(const LayerInputs& x, const LayerCosts& lc, EndCost& post) {
  const int n = x.graph.model().mtp_layers;
  if (n == 0) return;
  EndCost module = end_cost(x, x.graph.mtp_ops(), x.ops.mtp);
  for (const OpSpec& op : x.graph.mtp_head_ops()) module.params += rank_params(op, x.shape.strategy.tp);
  const LayerCost& l = lc.kinds[static_cast<std::size_t>(x.graph.mtp_kind())];
  module.forward += l.forward + l.cp_forward + l.ep_forward;
  module.backward += l.backward + l.recompute + l.cp_backward + l.ep_backward;
  module.tp_forward += l.tp_forward;
  module.tp_backward += l.tp_backward;
  module.params += l.params;
  module.expert_params += l.expert_params;
  post.forward += n * module.forward;
  post.backward += n * module.backward;
  post.tp_forward += n * module.tp_forward;
  post.tp_backward += n * module.tp_backward;
  post.params += n * module.params;
  post.expert_params += n * module.expert_params;
}

LayerCosts layer_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software, const PlanShape& shape) {
  const Strategy& s = shape.strategy;
  LayerCosts out;
  out.key = layer_key(shape);
  out.hidden_message = hidden_message(graph, shape);
  const OpCosts ops = op_costs(graph, cluster, software, shape);
  const LayerInputs x{graph, cluster, software, shape, ops, tp_collectives(shape, out.hidden_message),
                      ep_calls(graph.model(), shape)};
  out.layers = graph.model().layers;
  out.kind_count = graph.kind_count();
  out.kind_layers = graph.kind_counts(0, out.layers);
  for (int k = 0; k < out.kind_count; ++k) {
    out.kinds[k] = layer_cost(x, k);
    out.stored_layer[k] = stored_layer_activation_bytes(graph, software, shape, k);
    if (s.recompute == Recompute::full)
      out.working_layer = std::max(out.working_layer, layer_activation_bytes(graph, software, shape, k, true));
  }
  out.pre = end_cost(x, graph.pre_ops(), ops.pre);
  out.post = end_cost(x, graph.post_ops(), ops.post);
  out.post.tp_forward += gathered_logits_time(x);
  add_mtp(x, out, out.post);
  // With TP the receiver of a pipeline send all-gathers the activations over the TP group
  // (Narayanan et al. 2021, Sec. 4.1 scatter/gather) unless SP already keeps them sharded: one
  // all-gather call of its own (Megatron's gather_split_1d_tensor), with its per-call overhead.
  // A stack whose TP ranks each send the whole tensor (Software::parallel.pipeline_send_scatter_gather
  // false) gathers nothing; with SP each rank holds, and sends, its sequence shard either way.
  const bool scatter = software.parallel.pipeline_send_scatter_gather;
  out.p2p_message = scatter || s.sequence_parallel ? out.hidden_message / s.tp : out.hidden_message;
  if (scatter && s.tp > 1 && !s.sequence_parallel) out.p2p_tp_gather = shape.groups.tp.all_gather(out.hidden_message);
  out.model_forward_flops_per_token = graph.forward_flops_per_token();
  out.model_forward_flops_per_token_full_attention = graph.forward_flops_per_token_full_attention();
  return out;
}

LayerCosts layer_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s) {
  return layer_costs(graph, cluster, software, PlanShape(graph.model(), cluster, software, s));
}

Seconds p2p_time(const GroupLink& pp, const LayerCosts& lc) {
  if (pp.size == 1) return 0;
  // Activations between stages: each TP rank's share (LayerCosts::p2p_message), then the
  // receiver's TP all-gather where the stack scatters (p2p_tp_gather, else 0).
  return pp.send_recv(lc.p2p_message) + lc.p2p_tp_gather;
}

Seconds p2p_time(const Cluster& cluster, const LayerCosts& lc, int pp, int pp_stride) {
  return p2p_time(pipeline_group(cluster, pp, pp_stride), lc);
}

Seconds step_time_floor(const LayerCosts& lc, Seconds p2p, int pp, int m, int vp) {
  // Sends per micro-batch (compose's StageSum::pp): 2 vp on a middle stage, one fewer on each end
  // stage, so 2 vp pp - 2 over the pipeline and at least 2 vp - 1 on any stage.
  const Seconds end_sends = pp > 1 ? (2.0 * vp - 1) * p2p : 0;
  const Seconds sum = lc.replica_work() + (pp > 1 ? (2.0 * vp * pp - 2) * p2p : 0);
  const int most_layers = (lc.layers + pp - 1) / pp;
  const Seconds max = std::max(sum / pp, most_layers * lc.min_layer_total() + end_sends);
  if (vp == 1) {
    const double k = std::min(pp - 1, m - 1);
    return std::max(sum, m * max + std::max(0.0, sum - max - k * max / 2));
  }
  return max * (m - 1.0 / vp) + sum / vp;
}

namespace {

// partition_layers of the graph's layers over `chunks` from `memo` when it holds these exact
// inputs (the split rule, each kind's layer cost, the end chunks' extras), else computed into its
// next entry (no allocation once that entry held as many chunks, for a model of one layer kind).
std::span<const int> memo_split(StepMemo& memo, const LayerGraph& graph, int chunks, bool uniform_modules,
                                unsigned accounts, const LayerCosts& lc, double first_extra, double last_extra) {
  std::array<double, LayerGraph::kMaxKinds> cost{};
  for (int k = 0; k < lc.kind_count; ++k) cost[static_cast<std::size_t>(k)] = lc.kinds[static_cast<std::size_t>(k)].total();
  const int layers = graph.model().layers;
  for (const StepMemo::Split& m : memo.splits) {
    if (m.layers == layers && m.chunks == chunks && m.uniform_modules == uniform_modules && m.accounts == accounts &&
        m.kind_cost == cost && m.first_extra == first_extra && m.last_extra == last_extra) {
      return m.split;
    }
  }
  StepMemo::Split& m = memo.splits[static_cast<std::size_t>(memo.next_split)];
  memo.next_split = (memo.next_split + 1) % static_cast<int>(memo.splits.size());
  m.layers = -1;  // invalid until the split is written
  m.split.resize(static_cast<std::size_t>(chunks));
  // An accounted split (the strategy's) is by count; a stack that cuts its list of modules into
  // equal counts splits by count where that gives every chunk a layer; otherwise by cost.
  bool by_count = accounts != 0;
  if (by_count) accounted_split_into(layers, accounts, m.split);
  else by_count = uniform_modules && chunks > 1 && uniform_module_split_into(layers, m.split);
  if (!by_count && lc.kind_count == 1) {
    partition_layers_into(layers, m.split, cost[0], first_extra, last_extra);
  } else if (!by_count) {
    std::vector<double> per_layer(static_cast<std::size_t>(layers));
    for (int l = 0; l < layers; ++l) per_layer[static_cast<std::size_t>(l)] = cost[static_cast<std::size_t>(graph.layer_kind(l))];
    partition_costs_into(per_layer, m.split, first_extra, last_extra);
  }
  m.layers = layers;
  m.chunks = chunks;
  m.uniform_modules = uniform_modules;
  m.accounts = accounts;
  m.kind_cost = cost;
  m.first_extra = first_extra;
  m.last_extra = last_extra;
  return m.split;
}

// The pieces a step is summed from, per micro-batch on one rank: one layer of each kind and the
// end ops, the last stage's copy of a tied embedding (pp > 1) counted with the head.
struct Pieces {
  const LayerCosts& lc;
  const EndCost& pre;
  EndCost post;
};

Pieces pieces(const LayerGraph& graph, const PlanShape& shape, const LayerCosts& lc) {
  Pieces p{lc, lc.pre, lc.post};
  const ModelSpec& m = graph.model();
  if (m.tied_embeddings && shape.strategy.pp > 1) p.post.params += m.vocab * double(m.hidden) / shape.strategy.tp;
  return p;
}

// What the DP reduction of one layer's and of the end ops' gradients sends and computes
// (compression.hpp). Uncompressed, the message is the gradient as reduced (ElementBytes::wire_grad):
// no per-matrix shapes are needed (search predicts millions of these). Compression (refused for MoE
// models) is costed on layer 0's gradients, every layer's where the kinds differ only in their
// attention window.
struct GradientWire {
  bool plain = true;  // no compression
  CompressionCost layer, pre, post;
  std::array<double, LayerGraph::kMaxKinds> kind_wire{};  // uncompressed: one layer of each kind
};

GradientWire gradient_wire(const LayerGraph& graph, const Cluster& cluster, const PlanShape& shape, const Pieces& p) {
  const Strategy& s = shape.strategy;
  const double grad = shape.bytes.wire_grad;
  GradientWire w;
  w.plain = s.grad_compression.kind == CompressionKind::none;
  if (w.plain) {
    for (int k = 0; k < p.lc.kind_count; ++k) w.kind_wire[k] = p.lc.kinds[k].params * grad;
    w.layer.wire = w.kind_wire[0];
    w.pre.wire = p.pre.params * grad;
    w.post.wire = p.post.params * grad;
  } else {
    w.layer = compression_cost(layer_gradients(graph, s), cluster, s, grad);
    w.pre = compression_cost(pre_gradients(graph, s), cluster, s, grad);
    w.post = compression_cost(post_gradients(graph, s), cluster, s, grad);
  }
  return w;
}

// The inputs, bit for bit, of the chunks' fields that depend on neither ZeRO nor the DP group
// (position, compute, TP/CP/EP, parameters, gradient bytes) of a model of one layer kind: every
// field of the pieces they are summed from, the gradient width, the layer count, the chunks and the
// stages and the split rule.
StepMemo::ChunkKey chunk_key(const LayerGraph& graph, const PlanShape& shape, const Pieces& p, bool uniform_modules) {
  StepMemo::ChunkKey key{};
  std::size_t k = 0;
  const LayerCost& l = p.lc.kinds[0];
  for (const double x : {l.forward, l.backward, l.recompute, l.tp_forward, l.tp_backward, l.cp_forward, l.cp_backward,
                         l.params, l.ep_forward, l.ep_backward, l.expert_forward, l.expert_backward,
                         l.expert_params, p.pre.forward, p.pre.backward,
                         p.pre.tp_forward, p.pre.tp_backward, p.pre.params, p.post.forward, p.post.backward,
                         p.post.tp_forward, p.post.tp_backward, p.post.params, p.post.expert_params,
                         shape.bytes.wire_grad})
    key[k++] = std::bit_cast<std::uint64_t>(x);
  for (const int x : {graph.model().layers, shape.chunks, shape.strategy.pp, p.lc.kind_count, uniform_modules ? 1 : 0,
                      static_cast<int>(shape.strategy.pipeline_accounts)})
    key[k++] = static_cast<std::uint64_t>(x);
  TRAINPLAN_CHECK(k == key.size(), "chunk memo inputs");
  return key;
}

// The parameters of the busiest stage (the most, counted in chunk order), and of them the routed
// experts'.
struct StageParams {
  double params = 0, expert = 0;
};

// One chunk's layers: each kind's layers x that kind's costs (kinds with no layer in the chunk add
// nothing, so a model of one kind gives n x its layer's figures).
void add_kind_layers(const Pieces& p, ChunkCost& c) {
  c.forward = c.backward = c.recompute = c.tp_forward = c.tp_backward = c.cp_forward = c.cp_backward = 0;
  c.ep_forward = c.ep_backward = c.expert_forward = c.expert_backward = c.params = c.expert_params = 0;
  for (int k = 0; k < p.lc.kind_count; ++k) {
    if (c.kinds[k] == 0) continue;
    const double n = c.kinds[k];
    const LayerCost& l = p.lc.kinds[k];
    c.forward += n * l.forward;
    c.backward += n * l.backward;
    c.recompute += n * l.recompute;
    c.tp_forward += n * l.tp_forward;
    c.tp_backward += n * l.tp_backward;
    c.cp_forward += n * l.cp_forward;
    c.cp_backward += n * l.cp_backward;
    c.ep_forward += n * l.ep_forward;
    c.ep_backward += n * l.ep_backward;
    c.expert_forward += n * l.expert_forward;
    c.expert_backward += n * l.expert_backward;
    c.params += n * l.params;
    c.expert_params += n * l.expert_params;
  }
}

// The chunks' layers and their costs (add_kind_layers), plus the end ops on the first and last
// chunk (chunk v sits on stage v % pp as its chunk v / pp there, counted rather than divided: this
// runs for every chunk of every strategy a search predicts). Returns the busiest stage's parameters.
StageParams place_chunks(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape,
                         const Pieces& p, std::span<const int> split, std::vector<ChunkCost>& chunks) {
  const int pp = shape.strategy.pp;
  int first_layer = 0;
  for (int v = 0, stage = 0, chunk = 0; v < shape.chunks; ++v) {
    ChunkCost& c = chunks[v];
    c.stage = stage;
    c.chunk = chunk;
    c.first_layer = first_layer;
    c.layers = split[v];
    c.kinds = graph.kind_counts(first_layer, c.layers);
    first_layer += split[v];
    c.has_embedding = v == 0;
    c.has_head = v == shape.chunks - 1;
    add_kind_layers(p, c);
    if (++stage == pp) {
      stage = 0;
      ++chunk;
    }
  }
  auto add_end = [](ChunkCost& c, const EndCost& e) {
    c.forward += e.forward;
    c.backward += e.backward;
    c.tp_forward += e.tp_forward;
    c.tp_backward += e.tp_backward;
    c.params += e.params;
    c.expert_params += e.expert_params;
  };
  add_end(chunks.front(), p.pre);
  add_end(chunks.back(), p.post);
  // Parameters per stage, summed in chunk order (stage i holds chunks i, i + pp, i + 2 pp, ...).
  const StageScratch<StageParams, 64> scratch(static_cast<std::size_t>(pp));
  const std::span<StageParams> stage_params = scratch.span();
  std::fill(stage_params.begin(), stage_params.end(), StageParams{});
  for (ChunkCost& c : chunks) {
    stage_params[c.stage].params += c.params;
    stage_params[c.stage].expert += c.expert_params;
    // Stacks that cast fp32 weights to 16 bits every micro-batch (autocast) do it in the forward.
    if (sw.weight_cast_per_micro_batch) c.forward += weight_cast_cost(cluster, sw, c.params).time(shape.host);
    c.grad_bytes = c.params * shape.bytes.wire_grad;
  }
  StageParams busiest;
  for (const StageParams& sp : stage_params)
    if (busiest.params < sp.params) busiest = sp;
  return busiest;
}

// The chunks' ZeRO- and DP-independent fields (place_chunks), left as `memo` says the last call
// wrote them into `out` when it had the same inputs (bit for bit; a model of one layer kind, not
// with per-micro-batch weight casts, which look up the cluster's tables, or with compression),
// else computed. Returns the busiest stage's parameters.
StageParams set_chunks(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape,
                       const Pieces& p, bool plain, StepMemo& memo, StepCosts& out) {
  const bool memoizable = plain && !sw.weight_cast_per_micro_batch && p.lc.kind_count == 1;
  const StepMemo::ChunkKey key = memoizable ? chunk_key(graph, shape, p, sw.parallel.pipeline_uniform_modules)
                                              : StepMemo::ChunkKey{};
  if (memoizable && memo.chunks_of == &out && memo.chunk_key == key &&
      out.chunks.size() == static_cast<std::size_t>(shape.chunks)) {
    return {memo.busiest_params, memo.busiest_expert_params};
  }
  out.chunks.resize(shape.chunks);
  const std::span<const int> split = memo_split(memo, graph, shape.chunks, sw.parallel.pipeline_uniform_modules,
                                                shape.strategy.pipeline_accounts, p.lc,
                                                p.pre.total(), p.post.total());
  const StageParams busiest = place_chunks(graph, cluster, sw, shape, p, split, out.chunks);
  memo.chunks_of = memoizable ? &out : nullptr;
  memo.chunk_key = key;
  memo.busiest_params = busiest.params;
  memo.busiest_expert_params = busiest.expert;
  return busiest;
}

// The chunk's compression cost: n x the layer's, plus its end ops'. Uncompressed only the wire
// bytes are used: each kind's layers x its layer's, summed in the same order.
CompressionCost chunk_wire(const GradientWire& w, const ChunkCost& c) {
  CompressionCost cc;
  const double n = c.layers;
  if (!w.plain) {
    cc = n * w.layer;
    if (c.has_embedding) cc += w.pre;
    if (c.has_head) cc += w.post;
    return cc;
  }
  for (std::size_t k = 0; k < w.kind_wire.size(); ++k)
    if (c.kinds[k] > 0) cc.wire += c.kinds[k] * w.kind_wire[k];
  if (c.has_embedding) cc.wire += w.pre.wire;
  if (c.has_head) cc.wire += w.post.wire;
  return cc;
}

// The ZeRO/DP collectives over `group` of `params` parameters sending `wire` bytes in `calls`
// calls, added to the chunk's: ZeRO-3 gathers each layer's parameters and ZeRO-2/3 reduce-scatter
// each layer's gradients with their own call (ring latency and the per-call overhead per layer),
// over `per_mb` (ZeRO-3: the stack's view of the group, its cap); ZeRO 0/1 reduce once per step
// (ZeRO 0 all-reduce; ZeRO 1 reduce-scatter, its parameter all-gather follows the optimizer).
// PowerSGD makes two rounds of each call (P, then Q).
void add_group_collectives(const PlanShape& shape, const GroupLink& group, const GroupLink& per_mb, double calls,
                           double params, double wire, double rounds, ChunkCost& c) {
  if (group.size == 1) return;
  const ZeroPolicy& zero = shape.zero;
  if (zero.shards_params) c.zero3_gather += calls * per_mb.all_gather(params * shape.bytes.gathered_param / calls);
  if (zero.reduce_each_micro_batch) {
    c.dp_reduce += calls * per_mb.reduce_scatter(wire / calls);
  } else {
    c.dp_reduce +=
        rounds * (zero.reduce_scatters ? group.reduce_scatter(wire / rounds) : group.all_reduce(wire / rounds));
  }
}

// The DP/ZeRO collectives of one chunk (c.zero3_gather, c.dp_reduce), sending `cc.wire`: the
// chunk's layers one call each (its end ops one more, where it has parameters beyond its layers'
// `layers_params`) over the DP group; routed experts' gradients (and ZeRO shards) over the EDP
// group instead, one call per MoE layer. Parameter servers: push the (compressed) gradients, pull
// the 16-bit parameters (param_server.hpp).
void set_chunk_collectives(const PlanShape& shape, double layers_params, int moe_layers, const CompressionCost& cc,
                           ChunkCost& c) {
  c.zero3_gather = 0;
  c.dp_reduce = 0;
  if (shape.strategy.uses_ps()) {
    c.dp_reduce = ps_push_pull_time(shape.ps, cc.rounds, cc.wire, c.params * shape.bytes.gathered_param);
    return;
  }
  const double n = c.layers;
  const double calls = std::max(1.0, n) + (c.params > layers_params ? 1 : 0);
  const bool zero3 = shape.zero.shards_params;
  if (c.expert_params <= 0) {
    add_group_collectives(shape, shape.groups.dp, zero3 ? shape.groups.zero3 : shape.groups.dp, calls, c.params,
                          cc.wire, cc.rounds, c);
    return;
  }
  const double expert_wire = c.expert_params * shape.bytes.wire_grad;
  add_group_collectives(shape, shape.groups.dp, zero3 ? shape.groups.zero3 : shape.groups.dp, calls,
                        c.params - c.expert_params, cc.wire - expert_wire, cc.rounds, c);
  add_group_collectives(shape, shape.groups.edp, zero3 ? shape.groups.edp_zero3 : shape.groups.edp,
                        std::max(1, moe_layers), c.expert_params, expert_wire, 1, c);
}

// Every chunk's DP/ZeRO collectives and, compressed, its compression kernels (`compress`, one
// entry per chunk, where gradients leave the GPU).
void set_collectives(const LayerGraph& graph, const PlanShape& shape, const Pieces& p, const GradientWire& w,
                     std::span<Seconds> compress, std::vector<ChunkCost>& chunks) {
  for (std::size_t v = 0; v < chunks.size(); ++v) {
    ChunkCost& c = chunks[v];
    const CompressionCost cc = chunk_wire(w, c);
    if (!w.plain && shape.reduces_gradients) compress[v] = cc.compute;
    if (v > 0 && c.params == chunks[v - 1].params && c.expert_params == chunks[v - 1].expert_params) {
      c.zero3_gather = chunks[v - 1].zero3_gather;  // same layers: same collectives
      c.dp_reduce = chunks[v - 1].dp_reduce;
      continue;
    }
    double layers_params = 0;
    int moe_layers = 0;
    for (int k = 0; k < p.lc.kind_count; ++k) {
      if (c.kinds[k] == 0) continue;
      layers_params += c.kinds[k] * p.lc.kinds[k].params;
      if (graph.kind(k).moe) moe_layers += c.kinds[k];
    }
    set_chunk_collectives(shape, layers_params, moe_layers, cc, c);
  }
}

// Compression kernels run on the compute stream once a step (the last micro-batch's backward):
// the stage with the most of them sets the figure.
Seconds busiest_compression(std::span<const Seconds> compress, int pp) {
  Seconds busiest = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(pp) && !compress.empty(); ++i) {
    Seconds sum = 0;
    for (std::size_t v = i; v < compress.size(); v += static_cast<std::size_t>(pp)) sum += compress[v];
    busiest = std::max(busiest, sum);
  }
  return busiest;
}

// Once a step: the optimizer as the software runs it over the parameters this rank updates
// (1/N of the busiest stage's under ZeRO, its routed experts' 1/N of the EDP group; with parameter
// servers the servers update their shards instead, each server GPU total / (S x GPUs per node)
// parameters, param_server.hpp, between the last push and the last pull), the compression kernels,
// weight casts and gradient-buffer upkeep (where not every micro-batch), and ZeRO 1/2's
// all-gather of the updated parameters (the experts' over the EDP group).
void set_step_work(const Cluster& cluster, const Software& sw, const PlanShape& shape, const StageParams& busiest,
                   Seconds compression, StepCosts& out) {
  const Strategy& s = shape.strategy;
  const GroupLink& dp = shape.groups.dp;
  const GroupLink& edp = shape.groups.edp;
  const HostLaunch eager = shape.host.eager();  // the optimizer step runs outside a CUDA graph
  const double dense = busiest.params - busiest.expert;
  out.ps_servers = 0;
  if (s.uses_ps()) {
    double total_params = 0;
    for (const auto& c : out.chunks) total_params += c.params * s.tp;
    out.optimizer = optimizer_cost(cluster, sw, ps_params_per_server_gpu(total_params, shape.ps)).time(eager);
    out.ps_servers = s.ps_servers;
  } else if (busiest.expert <= 0) {
    const double opt_share = shape.zero.shards_optimizer ? 1.0 / dp.size : 1.0;
    out.optimizer = optimizer_cost(cluster, sw, busiest.params * opt_share).time(eager);
  } else {
    const bool shard = shape.zero.shards_optimizer;
    const double updated = dense * (shard ? 1.0 / dp.size : 1.0) + busiest.expert * (shard ? 1.0 / edp.size : 1.0);
    out.optimizer = optimizer_cost(cluster, sw, updated).time(eager);
  }
  out.optimizer += compression;
  out.compression = compression;
  if (!sw.weight_cast_per_micro_batch) out.optimizer += weight_cast_cost(cluster, sw, busiest.params).time(eager);
  out.dp_param_gather = 0;
  if (!shape.zero.gather_params_after_step) return;
  if (busiest.expert <= 0) {
    if (dp.size > 1) out.dp_param_gather = dp.all_gather(busiest.params * shape.bytes.gathered_param);
    return;
  }
  out.dp_param_gather = dp.all_gather(dense * shape.bytes.gathered_param) +
                        edp.all_gather(busiest.expert * shape.bytes.gathered_param);
}

// What compose() and simulate() read besides the chunks: the overlap shares the stack hides
// DP/ZeRO and pipeline traffic behind, the ZeRO policy, the FLOPs, the memory model and the
// per-layer pieces (layer_detail.hpp).
void set_step_facts(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape,
                    const LayerCosts& lc, const Pieces& p, StepCosts& out) {
  const Strategy& s = shape.strategy;
  out.overlap = sw.overlap;
  out.zero3_backward_gathers = sw.zero3.regathers_for_recompute && s.recompute == Recompute::full ? 2 : 1;
  out.pp_overlap = shape.pp_overlap;
  out.overlap_slowdown = cluster.collectives.overlap_slowdown;
  out.zero = shape.zero;
  const Flops model_fwd = lc.model_forward_flops_per_token * shape.tokens.per_replica;
  out.model_flops_per_micro_batch_per_replica = 3 * model_fwd;
  out.model_flops_full_attention_per_micro_batch_per_replica =
      3 * lc.model_forward_flops_per_token_full_attention * shape.tokens.per_replica;
  // Recomputed forward FLOPs, whole replica: per-rank layer figures x layers x (tp * cp) ranks.
  Flops recomputed = 0;
  for (int k = 0; k < lc.kind_count; ++k) recomputed += lc.kinds[k].recompute_flops * lc.kind_layers[k];
  out.hardware_flops_per_micro_batch_per_replica = 3 * model_fwd + recomputed * s.tp * s.cp;
  memory_model(graph, cluster, sw, shape, lc.stored_layer, lc.working_layer, out.memory);
  out.kind_count = lc.kind_count;
  for (int k = 0; k < lc.kind_count; ++k) {
    out.layer_kinds[k] = graph.kind(k);
    const LayerCost& l = lc.kinds[k];
    out.kinds[k] = {.layers = 1, .forward = l.forward, .backward = l.backward, .recompute = l.recompute,
                    .tp_forward = l.tp_forward, .tp_backward = l.tp_backward, .cp_forward = l.cp_forward,
                    .cp_backward = l.cp_backward, .ep_forward = l.ep_forward, .ep_backward = l.ep_backward,
                    .expert_forward = l.expert_forward, .expert_backward = l.expert_backward, .params = l.params,
                    .expert_params = l.expert_params};
    out.kinds[k].kinds[k] = 1;
  }
  auto end_piece = [](const EndCost& end) {
    return ChunkCost{.forward = end.forward, .backward = end.backward, .tp_forward = end.tp_forward,
                     .tp_backward = end.tp_backward, .params = end.params, .expert_params = end.expert_params};
  };
  out.embedding = end_piece(p.pre);
  out.head = end_piece(p.post);
  out.head_mtp_layers = graph.model().mtp_layers;
}

}  // namespace

void step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape,
                const LayerCosts& lc, StepMemo& memo, StepCosts& out) {
  TRAINPLAN_CHECK(lc.key == layer_key(shape), "layer costs computed for another strategy");
  const Pieces p = pieces(graph, shape, lc);
  const GradientWire wire = gradient_wire(graph, cluster, shape, p);
  // Every field is written below: no zeroing of the whole struct, and the chunks' storage is kept
  // (search predicts millions of steps into the same StepCosts).
  const StageParams busiest = set_chunks(graph, cluster, sw, shape, p, wire.plain, memo, out);
  std::vector<Seconds> compress(wire.plain ? 0 : shape.chunks, 0.0);
  set_collectives(graph, shape, p, wire, compress, out.chunks);
  out.p2p = p2p_time(shape.groups.pp, lc);
  set_step_work(cluster, sw, shape, busiest, busiest_compression(compress, shape.strategy.pp), out);
  set_step_facts(graph, cluster, sw, shape, lc, p, out);
}

void step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape,
                const LayerCosts& lc, StepCosts& out) {
  StepMemo memo;
  step_costs(graph, cluster, sw, shape, lc, memo, out);
}

StepCosts step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s) {
  const PlanShape shape(graph.model(), cluster, software, s);
  StepCosts out;
  step_costs(graph, cluster, software, shape, layer_costs(graph, cluster, software, shape), out);
  return out;
}

const char* reason_key(InfeasibleReason r) {
  switch (r) {
    case InfeasibleReason::invalid_strategy: return "invalid";
    case InfeasibleReason::unsupported_dtype: return "unsupported dtype";
    case InfeasibleReason::cluster_too_small: return "cluster too small";
    case InfeasibleReason::out_of_memory: return "out of memory";
  }
  return "?";
}

std::optional<Infeasible> cannot_cost(const LayerGraph& graph, const Cluster& cluster, const Strategy& s) {
  std::optional<Infeasible> why = cannot_shape(graph.model(), cluster, s);
  // A strategy for another sequence length than the graph's is invalid: named before its dtype.
  if ((!why || why->reason == InfeasibleReason::unsupported_dtype) && s.seq_len != graph.seq_len()) {
    return Infeasible{.reason = InfeasibleReason::invalid_strategy,
                      .detail = fmt::format("sequence length {} differs from the layer graph's {}", s.seq_len, graph.seq_len())};
  }
  return why;
}

namespace {

// cannot_cost()'s reason as an estimate, written into `e`.
void set_cannot_cost(const Cluster& cluster, const Strategy& s, Infeasible why, Estimate& e) {
  e = Estimate{};
  e.strategy = s;
  e.capacity = cluster.gpu.hbm;
  e.feasible = false;
  e.infeasible.push_back(std::move(why));
}

}  // namespace

Estimate predict(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s) {
  Estimate e;
  if (auto why = cannot_cost(graph, cluster, s)) {
    set_cannot_cost(cluster, s, std::move(*why), e);
    return e;
  }
  const PlanShape shape(graph.model(), cluster, software, s);
  StepCosts costs;
  step_costs(graph, cluster, software, shape, layer_costs(graph, cluster, software, shape), costs);
  compose(costs, graph, cluster, s, e);
  return e;
}

void predict(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s,
             const LayerCosts& layer, PredictScratch& scratch, Estimate& out) {
  if (auto why = cannot_cost(graph, cluster, s)) {
    set_cannot_cost(cluster, s, std::move(*why), out);
    return;
  }
  const PlanShape shape(graph.model(), cluster, software, s);
  step_costs(graph, cluster, software, shape, layer, scratch.memo, scratch.costs);
  compose(scratch.costs, graph, cluster, s, out);
}

Seconds one_f_one_b_critical_path(std::span<const double> f, std::span<const double> g, int m) {
  const int p = static_cast<int>(f.size());
  const std::size_t slots = static_cast<std::size_t>(p) * static_cast<std::size_t>(m);
  const auto at = [m](int j, int i) { return static_cast<std::size_t>(j) * static_cast<std::size_t>(m) + i; };
  // Finish times of each stage's forward and backward of each micro-batch (-1: not yet run); the
  // search predicts millions of layouts, so no allocation below p m = 1024.
  const StageScratch<double, 1024> fwd_scratch(slots), bwd_scratch(slots);
  const std::span<double> fwd = fwd_scratch.span(), bwd = bwd_scratch.span();
  std::fill(fwd.begin(), fwd.end(), -1.0);
  std::fill(bwd.begin(), bwd.end(), -1.0);
  const StageScratch<int, 64> nf(static_cast<std::size_t>(p)), nb(static_cast<std::size_t>(p));
  const StageScratch<double, 64> clock_scratch(static_cast<std::size_t>(p));
  const std::span<int> next_f = nf.span(), next_b = nb.span();
  const std::span<double> clock = clock_scratch.span();
  std::fill(next_f.begin(), next_f.end(), 0);
  std::fill(next_b.begin(), next_b.end(), 0);
  std::fill(clock.begin(), clock.end(), 0.0);
  // make_schedule's 1F1B order (test_predict checks the two agree): min(p - 1 - j, m) warm-up
  // forwards, then a forward whenever as many forwards past the warm-up as backwards have run.
  const auto next_is_forward = [&](int j) {
    const int warmup = std::min(p - 1 - j, m);
    return next_f[j] < m && (next_f[j] < warmup || next_f[j] - warmup == next_b[j]);
  };
  // Sweeps up the stages (forwards flow that way) and back down (backwards do), each stage running
  // what it can: a wave passes in one sweep, so the sweeps are O(m), not O(p m).
  std::size_t done = 0;
  for (int sweep = 0; done < 2 * slots; ++sweep) {
    const std::size_t before = done;
    for (int step = 0; step < p; ++step) {
      const int j = sweep % 2 == 0 ? step : p - 1 - step;
      while (next_b[j] < m) {
        const bool forward = next_is_forward(j);
        const int i = forward ? next_f[j] : next_b[j];
        // A forward waits for the stage before; a backward for the stage after (the last stage's
        // for its own forward).
        const double ready = forward ? (j == 0 ? 0.0 : fwd[at(j - 1, i)])
                                     : (j + 1 == p ? fwd[at(j, i)] : bwd[at(j + 1, i)]);
        if (ready < 0) break;
        clock[j] = std::max(clock[j], ready) + (forward ? f[j] : g[j]);
        (forward ? fwd : bwd)[at(j, i)] = clock[j];
        ++(forward ? next_f : next_b)[j];
        ++done;
      }
    }
    TRAINPLAN_CHECK(done > before, "the 1F1B order has no runnable slot");
  }
  return *std::max_element(clock.begin(), clock.end());
}

Seconds one_f_one_b_bubble(std::span<const double> w, std::span<const double> f, std::span<const double> g, int m,
                           Seconds busiest) {
  // Beyond this many (stage, micro-batch) pairs the critical path would cost more memory (16 B a
  // pair) and time than a prediction should: the round-trip expression below stands in.
  constexpr long long kCriticalPathSlots = 1 << 20;
  const int p = static_cast<int>(w.size());
  if (m < p && static_cast<long long>(p) * m <= kCriticalPathSlots)
    return std::max(0.0, one_f_one_b_critical_path(f, g, m) - m * busiest);
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  double before = 0, step = 0;
  for (int j = 0; j < p; ++j) {
    const double later = total - before - w[j], k = std::min(p - 1 - j, m - 1);
    step = std::max(step, m * w[j] + before + std::max(0.0, later - k * f[j]) + std::max(0.0, later - k * g[j]));
    before += w[j];
  }
  // With few micro-batches the first and the last round trips are one: at most the other stages'
  // whole work, as with equal stages.
  return std::min(step - m * busiest, total - busiest);
}

namespace {

// The part of a collective of `comm` seconds left on the critical path when the stack hides a
// share `overlap` of it behind `window` seconds of compute; the hidden part still slows that
// compute by the cluster's contention share (StepCosts::overlap_slowdown).
// What it costs is exposed_comm's (predict.hpp) at overlap_cost_rate() of the stack's share.
Seconds exposed(const StepCosts& costs, Seconds comm, Seconds window, double overlap) {
  return exposed_comm(comm, window, costs.overlap_cost_rate(overlap));
}

// One pipeline stage's work per micro-batch: W_i = forward + backward (+ recompute, TP/CP
// exposure) and the stage's p2p transfers, and its DP/ZeRO traffic.
struct StageSum {
  Seconds compute, recompute, tp, cp, ep, pp, fwd, bwd;
  Seconds zero_mb, zero_mb_exposed, dp_step;
  StageLoad load;  // parameters (routed experts' among them) and layers of each kind
  Seconds work;    // compute + recompute + tp + cp + ep + pp + zero_mb_exposed
};

// What the step takes from the stages, in stage order: the busiest stage (the first of the
// largest W_i), sum_i W_i, the DP exposure, and the fullest stage.
struct StepSums {
  StageSum busiest{};
  Seconds work_sum = 0, step_exposed = 0, dp_total = 0;
  Seconds zero2_last = 0;  // ZeRO-2: what the step's last reduction shows beyond its per-micro-batch exposure
  int fullest = 0;         // the fullest stage (the first of the largest totals)
  Seconds one_f_one_b_bubble = 0;  // 1F1B: the fill and drain around the stages (one_f_one_b_bubble)
};


// Stage `stage`'s memory into e.per_stage (memory_model.hpp), the peak raised to it; returns its total.
Bytes set_stage_memory(const MemoryModel& mm, int stage, const StageLoad& load, Estimate& e) {
  StageMemory& mem = e.per_stage[static_cast<std::size_t>(stage)];
  mem = stage_memory(mm, stage, load);
  const Bytes total = mem.total();
  e.peak_memory = std::max(e.peak_memory, total);
  return total;
}

// The backward a stage's once-a-step gradient reduction can hide under, for a stage whose backward
// of one micro-batch takes `stage_backward`. A chunk's gradients are final after its last
// micro-batch's backward. Under 1F1B and GPipe (one chunk per stage) that is the step's last
// backward slot. The interleaved schedule runs the backwards of its last round of min(m, pp)
// micro-batches chunk by chunk, the last chunk first (Narayanan et al. 2021, Sec. 2.2.2; Megatron's
// get_model_chunk_id), so the chunks' gradients become final one after another over those
// min(m, pp) backwards of the whole stage, and the reduction of every chunk but the first can
// run under the backwards of the chunks after it. The simulator replays exactly this order.
Seconds reduction_window(const Strategy& s, Seconds stage_backward) {
  if (s.schedule != ScheduleKind::interleaved || s.vp == 1) return stage_backward;
  return std::min(s.micro_batches(), s.pp) * stage_backward;
}

// One pass over the stages (predict runs millions of times in a search): each stage's sums, what
// the step takes from them in stage order, and the stage's memory (memory_model.hpp; the runtime
// reserve from the cluster file, the allocator's behaviour and the safety margin from the
// software profile). Stage i sums chunks i, i + pp, i + 2 pp, ... in chunk order (chunks are
// ordered by virtual stage, chunks[chunk * pp + stage], as simulate() checks too).
//
// Where the DP/ZeRO traffic goes, by the ZeRO policy (chosen once per stage): ZeRO-3 gathers each
// chunk's parameters for its forward and again for its backward, unit by unit ahead of the
// kernels, so each gather runs under the slot it serves, and reduce-scatters the gradients during
// the backward; ZeRO-2 only the latter, its reduction running on into the next forward; ZeRO 0/1
// reduce once, during the step's last backward. Each costs exposed_comm against the compute it
// overlaps (as the simulator's slots do).
//
// Pipeline sends: every chunk sends its forward output to the next virtual stage and its input
// gradient to the previous one, except at the ends of the pipeline: the first stage sends no
// gradient from its first chunk and the last stage no activation from its last, so a middle stage
// makes 2 vp sends per micro-batch and an end stage 2 vp - 1 (the simulator's send_output), each
// charged at `pp_rate`.
//
// stage_sum gives one stage's chunks summed (chunks[chunk * pp + stage]): its compute,
// communication, pipeline sends and the exposed share of its per-micro-batch ZeRO traffic (work),
// and its load for the memory model; sum_stages runs it over the stages.
StageSum stage_sum(const StepCosts& costs, const Strategy& s, std::size_t i, double pp_rate) {
  const ZeroPolicy& zero = costs.zero;
  const std::size_t pp = static_cast<std::size_t>(s.pp);
  StageSum t{};
  auto sum_chunks = [&](auto add_dp) {
    for (std::size_t v = i; v < costs.chunks.size(); v += pp) {
      const ChunkCost& c = costs.chunks[v];
      TRAINPLAN_CHECK(c.stage == static_cast<int>(i), "step costs must be ordered by virtual stage (chunks[chunk * pp + stage])");
      t.compute += c.forward + c.backward;
      t.recompute += c.recompute;
      t.tp += c.tp_forward + c.tp_backward;
      t.cp += c.cp_forward + c.cp_backward;
      t.ep += c.ep_forward + c.ep_backward;
      t.fwd += c.forward + c.tp_forward + c.cp_forward + c.ep_forward;
      t.bwd += c.backward + c.recompute + c.tp_backward + c.cp_backward + c.ep_backward;
      t.load.params += c.params;
      t.load.expert_params += c.expert_params;
      t.load.layers += c.layers;
      for (std::size_t k = 0; k < c.kinds.size(); ++k) t.load.kinds[k] += c.kinds[k];
      add_dp(c);
    }
  };
  if (zero.shards_params) {
    sum_chunks([&](const ChunkCost& c) {
      const Seconds backward_gathers = costs.zero3_backward_gathers * c.zero3_gather;
      t.zero_mb += c.zero3_gather + backward_gathers + c.dp_reduce;
      t.zero_mb_exposed +=
          exposed(costs, c.zero3_gather, c.forward + c.tp_forward + c.cp_forward + c.ep_forward, costs.overlap.zero3) +
          exposed(costs, backward_gathers + c.dp_reduce,
                  c.backward + c.recompute + c.tp_backward + c.cp_backward + c.ep_backward, costs.overlap.zero3);
    });
  } else if (zero.reduce_each_micro_batch) {
    sum_chunks([&](const ChunkCost& c) { t.zero_mb += c.dp_reduce; });
    t.zero_mb_exposed = exposed(costs, t.zero_mb, t.fwd + t.bwd, costs.overlap.dp);
  } else {
    sum_chunks([&](const ChunkCost& c) { t.dp_step += c.dp_reduce; });
  }
  if (s.pp > 1) t.pp = (2.0 * s.vp - (i == 0) - (i + 1 == pp)) * costs.p2p * pp_rate;
  t.work = t.compute + t.recompute + t.tp + t.cp + t.ep + t.pp + t.zero_mb_exposed;
  return t;
}

StepSums sum_stages(const StepCosts& costs, const Strategy& s, double pp_rate, Estimate& e) {
  const int m = s.micro_batches();
  const std::size_t pp = static_cast<std::size_t>(s.pp);
  e.per_stage.resize(s.pp);
  e.stage_layers.resize(s.pp);
  StageSum b{};  // the busiest stage
  Seconds work_sum = 0, step_exposed = 0, dp_total = 0, zero2_last = 0;
  // Each stage's work, forward and backward per micro-batch, for the 1F1B fill and drain.
  const StageScratch<double, 3 * 64> scratch(3 * pp);
  const std::span<double> wfg = scratch.span();
  int fullest = 0;
  Bytes fullest_total = 0;
  for (std::size_t i = 0; i < pp; ++i) {
    const StageSum t = stage_sum(costs, s, i, pp_rate);
    if (i == 0 && !costs.zero.shards_params && costs.zero.reduce_each_micro_batch) {
      // The step's last backward (the first stage's) has no next forward to run on into: its
      // reduction shows as the end-of-step reductions do, last bucket in full.
      zero2_last = bucketed_exposed_comm(t.zero_mb, t.bwd, t.load.layers, costs.overlap_cost_rate(costs.overlap.dp)) -
                   t.zero_mb_exposed;
    }
    work_sum += t.work;
    wfg[i] = t.work;
    // The stage's work split as its forward and backward are (its sends and exposed ZeRO traffic
    // shared out in proportion).
    const double scale = t.fwd + t.bwd > 0 ? t.work / (t.fwd + t.bwd) : 0.0;
    wfg[pp + i] = scale * t.fwd;
    wfg[2 * pp + i] = scale * t.bwd;
    if (i == 0 || b.work < t.work) b = t;
    // DP gradient reduction overlaps with the backward after a chunk's gradients are final
    // (gradient buckets start as soon as their layer's gradients exist, one bucket per layer); the
    // last bucket shows.
    step_exposed = std::max(step_exposed, bucketed_exposed_comm(t.dp_step, reduction_window(s, t.bwd), t.load.layers,
                                                                costs.overlap_cost_rate(costs.overlap.dp)));
    dp_total = std::max(dp_total, t.dp_step + m * t.zero_mb);
    e.stage_layers[i] = t.load.layers;
    const Bytes total = set_stage_memory(costs.memory, static_cast<int>(i), t.load, e);
    if (i == 0 || fullest_total < total) {
      fullest = static_cast<int>(i);
      fullest_total = total;
    }
  }
  const Seconds bubble = s.schedule == ScheduleKind::one_f_one_b && pp > 1
                             ? one_f_one_b_bubble(wfg.first(pp), wfg.subspan(pp, pp), wfg.subspan(2 * pp, pp), m, b.work)
                             : 0.0;
  return {b, work_sum, step_exposed, dp_total, zero2_last, fullest, bubble};
}

// Pipeline: the busiest stage runs m micro-batches back to back; filling and draining the
// pipeline adds the other stages' work once, shortened v-fold by interleaving. For uniform
// stages this is the (p-1)/(v*m) bubble of Narayanan et al. 2021, Sec. 2.2.
void set_time(const StepCosts& costs, const Strategy& s, double pp_rate, const StepSums& sums, TimeBreakdown& t) {
  const int m = s.micro_batches();
  const StageSum& b = sums.busiest;
  t.compute = m * b.compute;
  t.recompute = m * b.recompute;
  t.tp_comm = m * b.tp;
  t.cp_comm = m * b.cp;
  t.ep_comm = m * b.ep;
  t.pp_comm = m * b.pp;
  t.bubble = s.schedule == ScheduleKind::one_f_one_b && s.pp > 1 ? sums.one_f_one_b_bubble
                                                                  : (sums.work_sum - b.work) / s.vp;
  // Interleaving: the first micro-batch goes round the p stages v times before the last stage's
  // first backward, and the last one comes back round them v times; at each of the v - 1
  // returns to a stage that already ran its p forwards (backwards) of the round, the stage waits
  // for the p transfers in between, whatever share of a send the stack overlaps.
  if (s.schedule == ScheduleKind::interleaved && s.pp > 1) {
    t.bubble += (1 - pp_rate) * 2.0 * (s.vp - 1) * s.pp * costs.p2p;
  }
  // The updated-parameter all-gather of ZeRO 1/2 follows the optimizer step.
  t.dp_comm = sums.dp_total + costs.dp_param_gather;
  // The ZeRO-1/2 parameter all-gather overlaps the next step's first forward where the stack
  // overlaps it (Megatron --overlap-param-gather).
  t.dp_comm_exposed = m * b.zero_mb_exposed + std::max(0.0, sums.zero2_last) + sums.step_exposed +
                      exposed(costs, costs.dp_param_gather, b.fwd, costs.overlap.param_gather);
  t.optimizer = costs.optimizer;
  t.step = t.compute + t.recompute + t.tp_comm + t.cp_comm + t.pp_comm + t.bubble + t.dp_comm_exposed + t.optimizer;
  if (t.ep_comm > 0) t.step += t.ep_comm;  // (added apart: a dense model's step keeps its bits)
}

// A plan must leave the profile's safety margin of the GPU's memory free: the model's error on
// measured peaks (see software/*.json "allocator") must not turn a predicted fit into an OOM.
void check_memory(const MemoryModel& mm, int fullest, Estimate& e) {
  const double margin = mm.safety_margin;
  if (e.peak_memory <= e.capacity * (1 - margin)) return;
  const StageMemory& stage = e.per_stage[fullest];
  e.feasible = false;
  e.infeasible.push_back({.reason = InfeasibleReason::out_of_memory,
                          .detail = {},
                          .stage = stage.stage,
                          .needed = stage.total(),
                          .available = e.capacity,
                          .margin = margin});
}

void set_throughput(const StepCosts& costs, const Cluster& cluster, const Strategy& s, Estimate& e) {
  Throughput& tp = e.throughput;
  const Seconds step = e.time.step;
  const double tokens_per_step = static_cast<double>(s.global_batch) * s.seq_len;
  tp.tokens_per_s = tokens_per_step / step;
  tp.tokens_per_s_per_gpu = tp.tokens_per_s / s.gpus();
  const double replicas_mb = static_cast<double>(s.global_batch) / s.micro_batch;
  tp.model_flops_per_step = costs.model_flops_per_micro_batch_per_replica * replicas_mb;
  tp.model_flops_per_step_full_attention = costs.model_flops_full_attention_per_micro_batch_per_replica * replicas_mb;
  tp.hardware_flops_per_step = costs.hardware_flops_per_micro_batch_per_replica * replicas_mb;
  tp.model_tflops_per_gpu = tp.model_flops_per_step / step / s.gpus() / kTera;
  tp.hardware_tflops_per_gpu = tp.hardware_flops_per_step / step / s.gpus() / kTera;
  const FlopsPerSecond peak = cluster.gpu.peak(s.dtype);
  tp.mfu = tp.model_tflops_per_gpu * kTera / peak;
  tp.mfu_full_attention = tp.model_flops_per_step_full_attention / step / s.gpus() / peak;
  tp.hfu = tp.hardware_tflops_per_gpu * kTera / peak;
}

// A fresh estimate of `s`, keeping the vectors' storage: every field is reset here or written by
// compose (per_stage and stage_layers entry by entry, time and throughput field by field).
void reset(const Cluster& cluster, const Strategy& s, Estimate& e) {
  e.strategy = s;
  e.feasible = true;
  e.infeasible.clear();
  e.peak_memory = 0;
  e.time = {};
  e.throughput = {};
  e.ps = {};
  e.capacity = cluster.gpu.hbm;
  if (s.gpus() > cluster.max_gpus()) {
    e.feasible = false;
    e.infeasible.push_back({.reason = InfeasibleReason::cluster_too_small,
                            .detail = cluster.name,
                            .needed = static_cast<double>(s.gpus()),
                            .available = static_cast<double>(cluster.max_gpus())});
  }
}

}  // namespace

Estimate compose(const StepCosts& costs, const LayerGraph& graph, const Cluster& cluster, const Strategy& s) {
  Estimate e;
  compose(costs, graph, cluster, s, e);
  return e;
}

void compose(const StepCosts& costs, [[maybe_unused]] const LayerGraph& graph, const Cluster& cluster, const Strategy& s,
             Estimate& e) {
  reset(cluster, s, e);
  // Without interleaving the pipeline sends lie on the 1F1B/GPipe dependency chain whatever the
  // sender overlaps; interleaving leaves other chunks' work to run meanwhile, so there the stack's
  // p2p overlap share decides (software "overlap.pp_interleaved").
  const double pp_rate = s.schedule == ScheduleKind::interleaved ? costs.overlap_cost_rate(costs.pp_overlap) : 1.0;
  const StepSums sums = sum_stages(costs, s, pp_rate, e);
  set_time(costs, s, pp_rate, sums, e.time);
  check_memory(costs.memory, sums.fullest, e);
  set_throughput(costs, cluster, s, e);
  set_parameter_server_figures(e);
}

}  // namespace trainplan
