#include "sim/predict.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
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

// Everything that depends only on the strategy, computed once per prediction.
struct Setting {
  const LayerGraph& graph;
  const Cluster& cluster;
  const Software& sw;
  const Strategy& s;
  double tokens;          // tokens per rank per micro-batch: b * seq / cp
  double act_bytes;       // bytes per activation element
  double seq_share;       // share of a sequence-split tensor a rank holds: 1/tp with SP
  FlopsPerSecond peak;
  Link tp_link, cp_link, pp_link, dp_link;
  int dp_group;           // ranks that hold replicas of the same parameters: dp * cp
  // TP collectives of one activation tensor (tokens x hidden) of the micro-batch; 0 without TP.
  Seconds tp_all_reduce = 0, tp_reduce_scatter = 0, tp_all_gather = 0;
  Seconds tp_point = 0;   // one TP all-reduce point (see tp_point_time())
  OpCosts ops;            // op times from the measured tables and the software profile (op_time.hpp)
};

void set_tp_collectives(Setting& x);

Setting make_setting(const LayerGraph& g, const Cluster& c, const Software& sw, const Strategy& s) {
  RankLayout layout(s);
  Setting x{g, c, sw, s, 0, 0, 0, 0, {}, {}, {}, {}, s.dp * s.cp};
  x.tokens = s.tokens_per_rank();
  x.act_bytes = activation_bytes(s.dtype);
  x.seq_share = s.sequence_parallel ? 1.0 / s.tp : 1.0;
  x.peak = c.gpu.peak(s.dtype);
  x.tp_link = group_link(c, s.tp, layout.stride(Dim::tp));
  x.cp_link = group_link(c, s.cp, layout.stride(Dim::cp));
  x.pp_link = group_link(c, 2, layout.stride(Dim::pp));
  const int dp_stride = s.cp > 1 ? std::min(layout.stride(Dim::dp), layout.stride(Dim::cp)) : layout.stride(Dim::dp);
  x.dp_link = group_link(c, x.dp_group, dp_stride);
  set_tp_collectives(x);
  x.ops = op_costs(g, c, sw, s);
  return x;
}

double share_of(const Setting& x, const OpSpec& op) {
  return op.split == Split::tensor ? 1.0 / x.s.tp : x.seq_share;
}

// One activation tensor of the micro-batch (tokens x hidden) as moved by TP collectives.
Bytes hidden_message(const Setting& x) { return x.tokens * x.graph.model().hidden * x.act_bytes; }

// The TP collectives of one hidden-sized tensor: an all-reduce, or with sequence parallelism a
// reduce-scatter and an all-gather (Korthikanti et al. 2022, Sec. 4.2.2). A TP "all-reduce point"
// (tp_point) is one of each direction's pair: the all-reduce, or reduce-scatter + all-gather.
void set_tp_collectives(Setting& x) {
  if (x.s.tp == 1) return;
  const Bytes m = hidden_message(x);
  // Each collective is one call per layer boundary: the cluster's per-call overhead on top.
  const Seconds call = x.cluster.collectives.call_overhead;
  if (x.s.sequence_parallel) {
    x.tp_reduce_scatter = collective_time(Collective::reduce_scatter, x.s.tp, m, x.tp_link) + call;
    x.tp_all_gather = collective_time(Collective::all_gather, x.s.tp, m, x.tp_link) + call;
    x.tp_point = x.tp_reduce_scatter + x.tp_all_gather;
  } else {
    x.tp_all_reduce = collective_time(Collective::all_reduce, x.s.tp, m, x.tp_link) + call;
    x.tp_point = x.tp_all_reduce;
  }
}

// TP communication of one layer, from the graph's split changes (LayerBoundaries): entering the
// tensor region is free forward and an all-reduce backward, leaving it an all-reduce forward and
// free backward; with SP every boundary is an all-gather one way and a reduce-scatter the other.
struct TpTime {
  Seconds forward = 0, backward = 0;
};
TpTime layer_tp_time(const Setting& x, const LayerBoundaries& b) {
  if (x.s.sequence_parallel) {
    return {b.enter * x.tp_all_gather + b.exit * x.tp_reduce_scatter,
            b.enter * x.tp_reduce_scatter + b.exit * x.tp_all_gather};
  }
  return {b.exit * x.tp_all_reduce, b.enter * x.tp_all_reduce};
}

// Costs of one transformer layer (all layers are identical) for one micro-batch.
struct LayerCost {
  Seconds forward = 0, backward = 0, recompute = 0, tp_forward = 0, tp_backward = 0, cp_forward = 0,
          cp_backward = 0;
  double params = 0;  // per rank
  Flops flops = 0;    // forward FLOPs per rank
  Flops recompute_flops = 0;
  Seconds total() const { return forward + backward + recompute + tp_forward + tp_backward + cp_forward + cp_backward; }
};

LayerCost layer_cost(const Setting& x) {
  LayerCost c;
  // Compute from the op time model (measured kernels, software profile); parameters and FLOPs
  // from the graph (Korthikanti et al. 2022).
  c.forward = x.ops.layer.fwd.time(x.sw);
  c.backward = x.ops.layer.bwd.time(x.sw);
  const Seconds attention_fwd = x.ops.layer.attention_fwd.time(x.sw);
  for (const auto& op : x.graph.layer_ops()) {
    c.params += op.params * (op.split == Split::tensor ? 1.0 / x.s.tp : 1.0);
    c.flops += op.flops_per_token * x.tokens * share_of(x, op);
    if (op.kind == OpKind::attention && x.s.recompute == Recompute::selective) {
      // Selective: the attention core is recomputed before the backward (Megatron's
      // core-attention checkpointing, with flash attention as with materialised scores).
      c.recompute = attention_fwd;
      c.recompute_flops = op.flops_per_token * x.tokens * share_of(x, op);
    }
  }
  // TP collectives where the graph's edges change a tensor's split (for GPT/Llama two each way);
  // full recomputation repeats the forward's.
  const LayerBoundaries& bounds = x.graph.layer_boundaries();
  const TpTime tp = layer_tp_time(x, bounds);
  c.tp_forward = tp.forward;
  c.tp_backward = tp.backward;
  if (x.s.recompute == Recompute::full) {
    c.recompute = c.forward;
    c.recompute_flops = c.flops;
    c.tp_backward += tp.forward;
  }
  if (x.s.cp > 1 && bounds.attention > 0) {
    // Ring attention: cp-1 steps, each passing the local K and V block to the next rank while
    // attending to the current one; only the part of a transfer longer than a step's compute
    // shows. Backward passes K, V and their gradients (twice the bytes, twice the compute).
    // The causal work is balanced as in Megatron (and exec/kernels/ring_attention): the sequence
    // is cut into 2*cp chunks, rank r holding chunks r and 2cp-1-r, so each step after the first
    // is half a block and every step takes attention_fwd / cp. exec also sends the gradient of
    // the last block home (one dK/dV hop more than counted here).
    const ModelSpec& m = x.graph.model();
    const Bytes kv = x.tokens * 2.0 * m.kv_heads * m.head_dim() / x.s.tp * x.act_bytes;
    const Seconds call = x.cluster.collectives.call_overhead;
    const Seconds send = collective_time(Collective::send_recv, 2, kv, x.cp_link) + call;
    const Seconds send2 = collective_time(Collective::send_recv, 2, 2 * kv, x.cp_link) + call;
    const Seconds step_fwd = attention_fwd / x.s.cp;
    // Per attention core of the layer (bounds.attention; one in GPT/Llama).
    c.cp_forward = bounds.attention * ((x.s.cp - 1) * std::max(0.0, send - step_fwd));
    c.cp_backward = bounds.attention * ((x.s.cp - 1) * std::max(0.0, send2 - 2 * step_fwd));
    if (x.s.recompute == Recompute::full) c.cp_backward += c.cp_forward;
  }
  return c;
}

// The ops before the first layer (embedding) or after the last (final norm, head, loss).
struct EndCost {
  Seconds forward = 0, backward = 0, tp_forward = 0, tp_backward = 0;
  double params = 0;
  Flops flops = 0;
  Seconds total() const { return forward + backward + tp_forward + tp_backward; }
};

EndCost end_cost(const Setting& x, std::span<const OpSpec> ops, const EndOpCosts& t) {
  EndCost c;
  c.forward = t.fwd.time(x.sw);
  c.backward = t.bwd.time(x.sw);
  for (const auto& op : ops) {
    // The vocabulary-parallel embedding and LM head split the vocabulary over TP ranks; norms and
    // learned position embeddings are replicated.
    const bool vocab_split = op.kind == OpKind::embedding || op.kind == OpKind::lm_head;
    c.params += op.params * (vocab_split ? 1.0 / x.s.tp : 1.0);
    c.flops += op.flops_per_token * x.tokens * share_of(x, op);
  }
  // Vocabulary-parallel embedding / cross-entropy: one all-reduce point each way. Not read off the
  // graph: its end ops carry no vocabulary split, and Megatron's operators would charge one
  // direction only (a model change for the fidelity work, which would move the golden outputs).
  c.tp_forward = x.tp_point;
  c.tp_backward = x.tp_point;
  return c;
}

}  // namespace

std::vector<int> partition_layers(int layers, int chunks, double layer_cost, double first_extra,
                                  double last_extra) {
  TRAINPLAN_CHECK(chunks >= 1 && layers >= chunks, "need at least one layer per chunk");
  if (chunks == 1) return {layers};
  if (!(std::isfinite(layer_cost) && std::isfinite(first_extra) && std::isfinite(last_extra)) || !(layer_cost > 0)) {
    // No usable costs (e.g. a dtype the GPU lacks): split evenly, later chunks take the remainder.
    std::vector<int> even(chunks, layers / chunks);
    for (int i = chunks - layers % chunks; i < chunks; ++i) ++even[i];
    return even;
  }
  // Largest layer count a chunk may hold under a time budget T, at least 1.
  auto cap = [&](double T, double extra) {
    return std::clamp(std::floor((T - extra) / layer_cost + 1e-9), 1.0, static_cast<double>(layers));
  };
  auto fits = [&](double T) {
    return cap(T, first_extra) + cap(T, last_extra) + (chunks - 2) * cap(T, 0.0) >= layers;
  };
  // The smallest budget T under which contiguous chunks hold every layer is a chunk's load k*c + e
  // for some whole k and e in {0, first_extra, last_extra}. It lies in [lb, lb + c], with lb the
  // larger of the average load and the lightest possible end chunks: at lb + c every chunk takes
  // at least (lb - e)/c layers, (n*lb - E - H)/c >= L in all. So at most six candidates remain.
  const double c = layer_cost;
  double lb = (layers * c + first_extra + last_extra) / chunks;
  lb = std::max({lb, c + first_extra, c + last_extra});
  double hi = lb + c;
  for (double e : {0.0, first_extra, last_extra}) {
    const double k0 = std::max(1.0, std::ceil((lb - e) / c - 1e-9));
    for (int step = 0; step < 3; ++step) {  // k*c + e in [lb, lb + c] spans at most two whole k
      const double T = (k0 + step) * c + e;
      if (T <= lb + c && T < hi && fits(T)) hi = T;
    }
  }
  // Water-fill under each chunk's cap: every chunk gets min(cap, q) for the highest level q that
  // fits, and the leftover layers go one each to chunks that can take more (later chunks first).
  const int cap_first = static_cast<int>(cap(hi, first_extra));
  const int cap_mid = static_cast<int>(cap(hi, 0.0));
  const int cap_last = static_cast<int>(cap(hi, last_extra));
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
  std::vector<int> caps(chunks, cap_mid);
  caps.front() = cap_first;
  caps.back() = cap_last;
  std::vector<int> out(chunks);
  int rest = layers;
  for (int i = 0; i < chunks; ++i) rest -= (out[i] = std::min(caps[i], q));
  for (int i = chunks - 1; i >= 0 && rest > 0; --i) {
    if (out[i] < caps[i]) {
      ++out[i];
      --rest;
    }
  }
  TRAINPLAN_CHECK(rest == 0, "layer partition lost layers");
  return out;
}

namespace {

StepCosts step_costs(const Setting& x) {
  const LayerGraph& graph = x.graph;
  const Strategy& s = x.s;
  const LayerCost layer = layer_cost(x);
  const EndCost pre = end_cost(x, graph.pre_ops(), x.ops.pre);
  EndCost post = end_cost(x, graph.post_ops(), x.ops.post);
  if (graph.model().tied_embeddings && s.pp > 1) post.params += graph.model().vocab * double(graph.model().hidden) / s.tp;

  const int nchunks = s.pp * s.vp;
  const std::vector<int> split = partition_layers(graph.model().layers, nchunks, layer.total(), pre.total(), post.total());
  const StateBytes state = state_bytes(s);
  // Gradient compression (compression.hpp): bytes on the wire and extra compute of one layer and
  // of the end ops; parameter servers (param_server.hpp) replace the DP collective.
  const CompressionCost layer_cc = compression_cost(layer_gradients(graph, s), x.cluster, s, state.grad);
  const CompressionCost pre_cc = compression_cost(pre_gradients(graph, s), x.cluster, s, state.grad);
  const CompressionCost post_cc = compression_cost(post_gradients(graph, s), x.cluster, s, state.grad);
  const bool reduces = x.dp_group > 1 || s.uses_ps();  // gradients leave the GPU at all
  const PsNetwork ps = ps_network(x.cluster, s);
  std::vector<Seconds> compress(nchunks, 0.0);

  StepCosts out;
  out.chunks.resize(nchunks);
  int first_layer = 0;
  for (int v = 0; v < nchunks; ++v) {
    ChunkCost& c = out.chunks[v];
    c.stage = v % s.pp;
    c.chunk = v / s.pp;
    c.first_layer = first_layer;
    c.layers = split[v];
    first_layer += split[v];
    c.has_embedding = v == 0;
    c.has_head = v == nchunks - 1;
    const double n = c.layers;
    c.forward = n * layer.forward;
    c.backward = n * layer.backward;
    c.recompute = n * layer.recompute;
    c.tp_forward = n * layer.tp_forward;
    c.tp_backward = n * layer.tp_backward;
    c.cp_forward = n * layer.cp_forward;
    c.cp_backward = n * layer.cp_backward;
    c.params = n * layer.params;
    const std::array<const EndCost*, 2> ends{c.has_embedding ? &pre : nullptr, c.has_head ? &post : nullptr};
    for (const EndCost* e : ends) {
      if (!e) continue;
      c.forward += e->forward;
      c.backward += e->backward;
      c.tp_forward += e->tp_forward;
      c.tp_backward += e->tp_backward;
      c.params += e->params;
    }
    // Stacks that cast fp32 weights to 16 bits every micro-batch (autocast) do it in the forward.
    if (x.sw.weight_cast_per_micro_batch) c.forward += weight_cast_cost(x.cluster, x.sw, c.params).time(x.sw);
    c.grad_bytes = c.params * state.grad;
    CompressionCost cc = n * layer_cc;
    if (c.has_embedding) cc += pre_cc;
    if (c.has_head) cc += post_cc;
    if (reduces) compress[v] = cc.compute;
    if (v > 0 && c.params == out.chunks[v - 1].params) {  // same layers: same collectives
      c.zero3_gather = out.chunks[v - 1].zero3_gather;
      c.dp_reduce = out.chunks[v - 1].dp_reduce;
      continue;
    }
    if (s.uses_ps()) {
      // Push the (compressed) gradients, pull the 16-bit parameters: per round one call and a
      // message each way (param_server.hpp).
      c.dp_reduce = cc.rounds * (x.cluster.collectives.call_overhead + 2 * ps.latency) +
                    ps_transfer_time(ps, cc.wire, c.params * state.weight);
      continue;
    }
    if (x.dp_group == 1) continue;
    // Collectives per call: ZeRO-3 gathers each layer's parameters and ZeRO-2/3 reduce-scatter each
    // layer's gradients with their own call (ring latency and the cluster's per-call overhead per
    // layer), the chunk's end ops in one more; ZeRO 0/1 reduce a chunk's gradients once per step
    // (ZeRO 0 all-reduce; ZeRO 1 reduce-scatter, its parameter all-gather follows the optimizer).
    // Compression changes the message (cc.wire instead of c.grad_bytes) and, for PowerSGD, makes
    // two rounds of each call (P, then Q).
    const Seconds call = x.cluster.collectives.call_overhead;
    const double calls = std::max(1.0, n) + (c.params > n * layer.params ? 1 : 0);
    const double rounds = cc.rounds;
    if (s.zero == 3) {
      c.zero3_gather =
          calls * (collective_time(Collective::all_gather, x.dp_group, c.params * state.weight / calls, x.dp_link) + call);
    }
    if (s.zero >= 2) {
      c.dp_reduce =
          calls * (collective_time(Collective::reduce_scatter, x.dp_group, cc.wire / calls, x.dp_link) + call);
    } else {
      c.dp_reduce = rounds * (call + (s.zero == 1 ? collective_time(Collective::reduce_scatter, x.dp_group, cc.wire / rounds, x.dp_link)
                                                  : collective_time(Collective::all_reduce, x.dp_group, cc.wire / rounds, x.dp_link)));
    }
  }

  if (s.pp > 1) {
    // Activations between stages; with TP each rank sends 1/tp of them and the receiver
    // all-gathers over NVLink (Narayanan et al. 2021, Sec. 4.1 scatter/gather) unless SP already
    // keeps them sharded.
    const Bytes msg = hidden_message(x) / s.tp;
    out.p2p = collective_time(Collective::send_recv, 2, msg, x.pp_link) + x.cluster.collectives.call_overhead;
    if (s.tp > 1 && !s.sequence_parallel) out.p2p += collective_time(Collective::all_gather, s.tp, hidden_message(x), x.tp_link);
  }
  // Stage i holds chunks i, i + pp, i + 2 pp, ...
  double busiest_params = 0;
  for (int i = 0; i < s.pp; ++i) {
    double params = 0;
    for (int v = i; v < nchunks; v += s.pp) params += out.chunks[v].params;
    busiest_params = std::max(busiest_params, params);
  }
  const double opt_share = s.zero >= 1 ? 1.0 / x.dp_group : 1.0;
  // The optimizer as the software runs it over the parameters this rank updates; weight casts and
  // gradient-buffer upkeep once a step (where not every micro-batch). With parameter servers the
  // servers update their shards instead (each server GPU total / (S x GPUs per node) parameters,
  // param_server.hpp), between the last push and the last pull.
  if (s.uses_ps()) {
    double total_params = 0;
    for (const auto& c : out.chunks) total_params += c.params * s.tp;
    out.optimizer = optimizer_cost(x.cluster, x.sw, ps_params_per_server_gpu(total_params, ps)).time(x.sw);
    out.ps_servers = s.ps_servers;
  } else {
    out.optimizer = optimizer_cost(x.cluster, x.sw, busiest_params * opt_share).time(x.sw);
  }
  // Compression kernels run on the compute stream once a step (the last micro-batch's backward):
  // charged with the optimizer step, on the stage with the most of them.
  Seconds busiest_compress = 0;
  for (int i = 0; i < s.pp; ++i) {
    Seconds sum = 0;
    for (int v = i; v < nchunks; v += s.pp) sum += compress[v];
    busiest_compress = std::max(busiest_compress, sum);
  }
  out.optimizer += busiest_compress;
  out.compression = busiest_compress;
  if (!x.sw.weight_cast_per_micro_batch) out.optimizer += weight_cast_cost(x.cluster, x.sw, busiest_params).time(x.sw);
  if ((s.zero == 1 || s.zero == 2) && x.dp_group > 1) {
    out.dp_param_gather = collective_time(Collective::all_gather, x.dp_group, busiest_params * state.weight, x.dp_link) +
                          x.cluster.collectives.call_overhead;
  }
  // How much of the DP/ZeRO traffic the stack hides behind compute (compose and simulate read it).
  out.overlap = x.sw.overlap;
  out.overlap_slowdown = x.cluster.collectives.overlap_slowdown;
  out.zero_reduce_per_micro_batch = s.zero >= 2;
  const double replica_tokens = static_cast<double>(s.micro_batch) * s.seq_len;
  const Flops model_fwd = graph.forward_flops_per_token() * replica_tokens;
  out.model_flops_per_micro_batch_per_replica = 3 * model_fwd;
  // Recomputed forward FLOPs, whole replica: per-rank layer figure x layers x (tp * cp) ranks.
  out.hardware_flops_per_micro_batch_per_replica =
      3 * model_fwd + layer.recompute_flops * graph.model().layers * s.tp * s.cp;
  out.memory = memory_model(graph, x.cluster, x.sw, s);
  return out;
}

}  // namespace

StepCosts step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s) {
  return step_costs(make_setting(graph, cluster, software, s));
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
  if (auto bad = validate(s, graph.model())) return Infeasible{.reason = InfeasibleReason::invalid_strategy, .detail = *bad};
  if (auto bad = validate_on(s, cluster)) return Infeasible{.reason = InfeasibleReason::invalid_strategy, .detail = *bad};
  if (s.seq_len != graph.seq_len()) {
    return Infeasible{.reason = InfeasibleReason::invalid_strategy,
                      .detail = fmt::format("sequence length {} differs from the layer graph's {}", s.seq_len, graph.seq_len())};
  }
  if (cluster.gpu.peak(s.dtype) <= 0 || (s.dtype == Dtype::fp8 && cluster.ops.fp8_gemm_speedup <= 0)) {
    return Infeasible{.reason = InfeasibleReason::unsupported_dtype, .detail = cluster.gpu.name};
  }
  return std::nullopt;
}

Estimate predict(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s) {
  if (auto why = cannot_cost(graph, cluster, s)) {
    Estimate e;
    e.strategy = s;
    e.capacity = cluster.gpu.hbm;
    e.feasible = false;
    e.infeasible.push_back(std::move(*why));
    return e;
  }
  return compose(step_costs(graph, cluster, software, s), graph, cluster, s);
}

namespace {

// The part of a collective of `comm` seconds left on the critical path when the stack hides a
// share `overlap` of it behind `window` seconds of compute; the hidden part still slows that
// compute by the cluster's contention share (StepCosts::overlap_slowdown).
Seconds exposed(const StepCosts& costs, Seconds comm, Seconds window, double overlap) {
  const Seconds hidden = overlap * std::min(comm, std::max(0.0, window));
  return comm - hidden + costs.overlap_slowdown * hidden;
}

}  // namespace

Estimate compose(const StepCosts& costs, const LayerGraph& graph, const Cluster& cluster, const Strategy& s) {
  Estimate e;
  e.strategy = s;
  e.capacity = cluster.gpu.hbm;
  if (s.gpus() > cluster.max_gpus()) {
    e.feasible = false;
    e.infeasible.push_back({.reason = InfeasibleReason::cluster_too_small,
                            .detail = cluster.name,
                            .needed = static_cast<double>(s.gpus()),
                            .available = static_cast<double>(cluster.max_gpus())});
  }
  const int m = s.micro_batches();

  // Per stage and micro-batch: work W_i = forward + backward (+ recompute, TP/CP exposure) and
  // the stage's p2p transfers (one in and one out per chunk and direction, overlapped pairwise).
  // No member initialisers: the inline buffer below is zeroed only as far as it is used.
  struct StageSum {
    Seconds compute, recompute, tp, cp, pp, fwd, bwd;
    Seconds zero_mb, zero_mb_exposed, dp_step;
    double params;
    int layers;
    Seconds work() const { return compute + recompute + tp + cp + pp + zero_mb_exposed; }
  };
  // Per-stage sums; on the stack for the usual pipeline depths (predict runs millions of times in
  // a search), on the heap beyond.
  constexpr int kInline = 64;
  StageSum inline_sums[kInline];
  std::vector<StageSum> heap_sums(s.pp > kInline ? s.pp : 0);
  const std::span<StageSum> st = s.pp > kInline ? std::span<StageSum>(heap_sums) : std::span<StageSum>(inline_sums, s.pp);
  for (StageSum& t : st) t = StageSum{};
  for (const auto& c : costs.chunks) {
    StageSum& t = st[c.stage];
    t.compute += c.forward + c.backward;
    t.recompute += c.recompute;
    t.tp += c.tp_forward + c.tp_backward;
    t.cp += c.cp_forward + c.cp_backward;
    t.fwd += c.forward + c.tp_forward + c.cp_forward;
    t.bwd += c.backward + c.recompute + c.tp_backward + c.cp_backward;
    t.params += c.params;
    t.layers += c.layers;
    if (s.zero == 3) t.zero_mb += 2 * c.zero3_gather + c.dp_reduce;
    else if (s.zero == 2) t.zero_mb += c.dp_reduce;
    else t.dp_step += c.dp_reduce;
  }
  for (auto& t : st) {
    if (s.pp > 1) t.pp = 2 * s.vp * costs.p2p;
    // ZeRO-3 gathers parameters ahead of the forward and the backward (prefetched, so hidden
    // behind compute up to its length) and reduce-scatters gradients during the backward;
    // ZeRO-2 only the latter. Only what outlasts the compute it overlaps is exposed.
    if (s.zero == 3) {
      const Seconds gather = t.zero_mb / 3;  // approximately equal thirds: gather, gather, reduce
      t.zero_mb_exposed = exposed(costs, gather, t.fwd, costs.overlap.zero3) +
                          exposed(costs, 2 * gather, t.bwd, costs.overlap.zero3);
    } else if (s.zero == 2) {
      t.zero_mb_exposed = exposed(costs, t.zero_mb, t.bwd, costs.overlap.dp);
    }
  }
  const auto busiest = std::max_element(st.begin(), st.end(), [](const StageSum& a, const StageSum& b) {
    return a.work() < b.work();
  });
  const Seconds work_sum = std::accumulate(st.begin(), st.end(), 0.0, [](Seconds acc, const StageSum& t) { return acc + t.work(); });
  const StageSum& b = *busiest;

  // Pipeline: the busiest stage runs m micro-batches back to back; filling and draining the
  // pipeline adds the other stages' work once, shortened v-fold by interleaving. For uniform
  // stages this is the (p-1)/(v*m) bubble of Narayanan et al. 2021, Sec. 2.2.
  TimeBreakdown& t = e.time;
  t.compute = m * b.compute;
  t.recompute = m * b.recompute;
  t.tp_comm = m * b.tp;
  t.cp_comm = m * b.cp;
  t.pp_comm = m * b.pp;
  t.bubble = (work_sum - b.work()) / s.vp;
  // DP gradient reduction overlaps with the last micro-batch's backward (gradient buckets start
  // as soon as their layer's gradients exist); the updated-parameter all-gather of ZeRO 1/2
  // follows the optimizer step.
  Seconds step_exposed = 0, dp_total = 0;
  for (const auto& stage : st) {
    step_exposed = std::max(step_exposed, exposed(costs, stage.dp_step, stage.bwd, costs.overlap.dp));
    dp_total = std::max(dp_total, stage.dp_step + m * stage.zero_mb);
  }
  t.dp_comm = dp_total + costs.dp_param_gather;
  // The ZeRO-1/2 parameter all-gather overlaps the next step's first forward where the stack
  // overlaps it (Megatron --overlap-param-gather).
  t.dp_comm_exposed = m * b.zero_mb_exposed + step_exposed + exposed(costs, costs.dp_param_gather, b.fwd, costs.overlap.param_gather);
  t.optimizer = costs.optimizer;
  t.step = t.compute + t.recompute + t.tp_comm + t.cp_comm + t.pp_comm + t.bubble + t.dp_comm_exposed + t.optimizer;

  // Memory per stage (memory_model.hpp); the runtime reserve comes from the cluster file, the
  // allocator's behaviour and the safety margin from the software profile.
  const MemoryModel& mm = costs.memory;
  e.per_stage.resize(s.pp);
  e.stage_layers.resize(s.pp);
  for (int i = 0; i < s.pp; ++i) {
    e.stage_layers[i] = st[i].layers;
    e.per_stage[i] = stage_memory(mm, i, st[i].params, st[i].layers);
    e.peak_memory = std::max(e.peak_memory, e.per_stage[i].total());
  }
  // A plan must leave the profile's safety margin of the GPU's memory free: the model's error on
  // measured peaks (see software/*.json "allocator") must not turn a predicted fit into an OOM.
  const double margin = mm.safety_margin;
  if (e.peak_memory > e.capacity * (1 - margin)) {
    const auto worst = std::max_element(e.per_stage.begin(), e.per_stage.end(),
                                        [](const StageMemory& a, const StageMemory& b) { return a.total() < b.total(); });
    e.feasible = false;
    e.infeasible.push_back({.reason = InfeasibleReason::out_of_memory,
                            .detail = {},
                            .stage = worst->stage,
                            .needed = worst->total(),
                            .available = e.capacity,
                            .margin = margin});
  }

  // Throughput.
  Throughput& tp = e.throughput;
  const double tokens_per_step = static_cast<double>(s.global_batch) * s.seq_len;
  tp.tokens_per_s = tokens_per_step / t.step;
  tp.tokens_per_s_per_gpu = tp.tokens_per_s / s.gpus();
  const double replicas_mb = static_cast<double>(s.global_batch) / s.micro_batch;
  tp.model_flops_per_step = costs.model_flops_per_micro_batch_per_replica * replicas_mb;
  tp.hardware_flops_per_step = costs.hardware_flops_per_micro_batch_per_replica * replicas_mb;
  tp.model_tflops_per_gpu = tp.model_flops_per_step / t.step / s.gpus() / kTera;
  tp.hardware_tflops_per_gpu = tp.hardware_flops_per_step / t.step / s.gpus() / kTera;
  const FlopsPerSecond peak = cluster.gpu.peak(s.dtype);
  tp.mfu = tp.model_tflops_per_gpu * kTera / peak;
  tp.hfu = tp.hardware_tflops_per_gpu * kTera / peak;
  set_parameter_server_figures(e);
  return e;
}

}  // namespace trainplan
