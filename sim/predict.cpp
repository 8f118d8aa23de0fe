#include "sim/predict.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <cmath>
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

// Everything one rank's per-micro-batch work depends on (the strategy's LayerKey fields), computed
// once per layer_costs().
struct Setting {
  const LayerGraph& graph;
  const Cluster& cluster;
  const Software& sw;
  const Strategy& s;
  double tokens;          // tokens per rank per micro-batch: b * seq / cp
  double act_bytes;       // bytes per activation element
  double seq_share;       // share of a sequence-split tensor a rank holds: 1/tp with SP
  Link tp_link, cp_link;
  // TP collectives of one activation tensor (tokens x hidden) of the micro-batch; 0 without TP.
  Seconds tp_all_reduce = 0, tp_reduce_scatter = 0, tp_all_gather = 0;
  Seconds tp_point = 0;   // one TP all-reduce point (see tp_point_time())
  OpCosts ops;            // op times from the measured tables and the software profile (op_time.hpp)
};

void set_tp_collectives(Setting& x);

Setting make_setting(const LayerGraph& g, const Cluster& c, const Software& sw, const Strategy& s, const LayerKey& key) {
  Setting x{g, c, sw, s, 0, 0, 0, {}, {}, 0, 0, 0, 0, {}};
  x.tokens = s.tokens_per_rank();
  x.act_bytes = activation_bytes(s.dtype);
  x.seq_share = s.sequence_parallel ? 1.0 / s.tp : 1.0;
  x.tp_link = group_link(c, s.tp, key.tp_stride);
  x.cp_link = group_link(c, s.cp, key.cp_stride);
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

LayerCost layer_cost(const Setting& x) {
  LayerCost c;
  // Compute from the op time model (measured kernels, software profile); parameters and FLOPs
  // from the graph (Korthikanti et al. 2022).
  c.forward = x.ops.layer.fwd.time(x.sw);
  c.backward = x.ops.layer.bwd.time(x.sw);
  const Seconds attention_fwd = x.ops.layer.attention_fwd.time(x.sw);
  for (const auto& op : x.graph.layer_ops()) {
    c.params += rank_params(op, x.s.tp);
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
  // A stack that overlaps them with the GEMMs around them (Transformer Engine's --tp-comm-overlap:
  // each all-gather / reduce-scatter pipelined with the GEMM that consumes / produces it) hides
  // the share overlap.tp behind the layer's compute in the same direction; the hidden part still
  // slows that compute by the cluster's contention share. Share 0: all of it on the critical path.
  const TpTime tp = layer_tp_time(x, bounds);
  const double tp_rate = overlap_cost_rate(x.sw.overlap.tp, x.cluster.collectives.overlap_slowdown);
  c.tp_forward = exposed_comm(tp.forward, c.forward, tp_rate);
  c.tp_backward = exposed_comm(tp.backward, c.backward, tp_rate);
  if (x.s.recompute == Recompute::full) {
    c.recompute = c.forward;
    c.recompute_flops = c.flops;
    c.tp_backward += c.tp_forward;
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

EndCost end_cost(const Setting& x, std::span<const OpSpec> ops, const EndOpCosts& t) {
  EndCost c;
  c.forward = t.fwd.time(x.sw);
  c.backward = t.bwd.time(x.sw);
  for (const auto& op : ops) {
    // The vocabulary-parallel embedding and LM head split the vocabulary over TP ranks; norms and
    // learned position embeddings are replicated (rank_params).
    c.params += rank_params(op, x.s.tp);
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

namespace {

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

}  // namespace

std::vector<int> partition_layers(int layers, int chunks, double layer_cost, double first_extra,
                                  double last_extra) {
  TRAINPLAN_CHECK(chunks >= 1, "need at least one layer per chunk");
  std::vector<int> out(chunks);
  partition_layers_into(layers, out, layer_cost, first_extra, last_extra);
  return out;
}

namespace {

LayerKey layer_key(const Strategy& s, const RankLayout& layout) {
  LayerKey k;
  k.tp = s.tp;
  k.cp = s.cp;
  k.micro_batch = s.micro_batch;
  k.seq_len = s.seq_len;
  k.sequence_parallel = s.sequence_parallel;
  k.recompute = s.recompute;
  k.dtype = s.dtype;
  k.attention = s.attention;
  k.tp_stride = layout.stride(Dim::tp);
  k.cp_stride = layout.stride(Dim::cp);
  return k;
}

}  // namespace

LayerKey layer_key(const Strategy& s) { return layer_key(s, RankLayout(s)); }

LayerCosts layer_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s) {
  LayerCosts out;
  out.key = layer_key(s);
  const Setting x = make_setting(graph, cluster, software, s, out.key);
  out.layers = graph.model().layers;
  out.layer = layer_cost(x);
  out.pre = end_cost(x, graph.pre_ops(), x.ops.pre);
  out.post = end_cost(x, graph.post_ops(), x.ops.post);
  out.hidden_message = hidden_message(x);
  // With TP the receiver of a pipeline send all-gathers the activations over the TP group
  // (Narayanan et al. 2021, Sec. 4.1 scatter/gather) unless SP already keeps them sharded.
  if (s.tp > 1 && !s.sequence_parallel) {
    out.p2p_tp_gather = collective_time(Collective::all_gather, s.tp, out.hidden_message, x.tp_link);
  }
  out.stored_layer = stored_layer_activation_bytes(graph, software, s);
  out.working_layer = s.recompute == Recompute::full ? layer_activation_bytes(graph, software, s, true) : 0;
  out.model_forward_flops_per_token = graph.forward_flops_per_token();
  return out;
}

Seconds p2p_time(const Cluster& cluster, const LayerCosts& lc, int pp, int pp_stride) {
  if (pp == 1) return 0;
  // Activations between stages; with TP each rank sends 1/tp of them (and the receiver gathers
  // them over TP: LayerCosts::p2p_tp_gather).
  const Link pp_link = group_link(cluster, 2, pp_stride);
  const Bytes msg = lc.hidden_message / lc.key.tp;
  Seconds t = collective_time(Collective::send_recv, 2, msg, pp_link) + cluster.collectives.call_overhead;
  if (lc.key.tp > 1 && !lc.key.sequence_parallel) t += lc.p2p_tp_gather;
  return t;
}

namespace {

// partition_layers(layers, chunks, ...) from the memo of `out` when it holds these exact inputs,
// else computed into the memo's next entry (no allocation once that entry held as many chunks).
std::span<const int> memo_split(StepCosts& out, int layers, int chunks, double layer_cost, double first_extra,
                                double last_extra) {
  for (const StepCosts::SplitMemo& m : out.split_memo) {
    if (m.layers == layers && m.chunks == chunks && m.layer_cost == layer_cost && m.first_extra == first_extra &&
        m.last_extra == last_extra) {
      return m.split;
    }
  }
  StepCosts::SplitMemo& m = out.split_memo[static_cast<std::size_t>(out.split_memo_next)];
  out.split_memo_next = (out.split_memo_next + 1) % static_cast<int>(out.split_memo.size());
  m.layers = -1;  // invalid until the split is written
  m.split.resize(static_cast<std::size_t>(chunks));
  partition_layers_into(layers, m.split, layer_cost, first_extra, last_extra);
  m.layers = layers;
  m.chunks = chunks;
  m.layer_cost = layer_cost;
  m.first_extra = first_extra;
  m.last_extra = last_extra;
  return m.split;
}

}  // namespace

Seconds step_time_floor(const LayerCosts& lc, Seconds p2p, int pp, int m, int vp) {
  // Sends per micro-batch (compose's StageSum::pp): 2 vp on a middle stage, one fewer on each end
  // stage, so 2 vp pp - 2 over the pipeline and at least 2 vp - 1 on any stage.
  const Seconds end_sends = pp > 1 ? (2.0 * vp - 1) * p2p : 0;
  const Seconds sum = lc.replica_work() + (pp > 1 ? (2.0 * vp * pp - 2) * p2p : 0);
  const int most_layers = (lc.layers + pp - 1) / pp;
  const Seconds max = std::max(sum / pp, most_layers * lc.layer.total() + end_sends);
  return max * (m - 1.0 / vp) + sum / vp;
}

void step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const Strategy& s,
                const LayerCosts& lc, StepCosts& out) {
  const RankLayout layout(s);
  TRAINPLAN_CHECK(lc.key == layer_key(s, layout), "layer costs computed for another strategy");
  const LayerCost& layer = lc.layer;
  const EndCost& pre = lc.pre;
  EndCost post = lc.post;
  if (graph.model().tied_embeddings && s.pp > 1) post.params += graph.model().vocab * double(graph.model().hidden) / s.tp;

  const int dp_group = s.dp * s.cp;  // ranks that hold replicas of the same parameters
  const int dp_stride = s.cp > 1 ? std::min(layout.stride(Dim::dp), layout.stride(Dim::cp)) : layout.stride(Dim::dp);
  const Link dp_link = group_link(cluster, dp_group, dp_stride);

  const int nchunks = s.pp * s.vp;
  const StateBytes state = state_bytes(s);
  // Gradient compression (compression.hpp): bytes on the wire and extra compute of one layer and
  // of the end ops; parameter servers (param_server.hpp) replace the DP collective.
  // Uncompressed, the message is the gradient as held: no per-matrix shapes are needed (search
  // predicts millions of these).
  const bool plain = s.grad_compression.kind == CompressionKind::none;
  CompressionCost layer_cc, pre_cc, post_cc;
  if (plain) {
    layer_cc.wire = layer.params * state.grad;
    pre_cc.wire = pre.params * state.grad;
    post_cc.wire = post.params * state.grad;
  } else {
    layer_cc = compression_cost(layer_gradients(graph, s), cluster, s, state.grad);
    pre_cc = compression_cost(pre_gradients(graph, s), cluster, s, state.grad);
    post_cc = compression_cost(post_gradients(graph, s), cluster, s, state.grad);
  }
  const bool reduces = dp_group > 1 || s.uses_ps();  // gradients leave the GPU at all
  const PsNetwork ps = s.uses_ps() ? ps_network(cluster, s) : PsNetwork{};
  std::vector<Seconds> compress(plain ? 0 : nchunks, 0.0);

  // Every field is written below or here: no zeroing of the whole struct, and the chunks'
  // storage is kept (search predicts millions of steps into the same StepCosts).
  out.ps_servers = 0;
  out.dp_param_gather = 0;
  const Seconds call = cluster.collectives.call_overhead;
  // The chunks' fields that depend on neither ZeRO nor the DP group: as the last call left them
  // when it had the same inputs (bit for bit: every input of those fields; not with per-micro-
  // batch weight casts, which look up the cluster's tables, or with compression), else computed.
  const bool memoizable = out.memoize_chunks && plain && !sw.weight_cast_per_micro_batch;
  std::array<std::uint64_t, 22> inputs{};
  if (memoizable) {
    std::size_t k = 0;
    for (const double x : {layer.forward, layer.backward, layer.recompute, layer.tp_forward, layer.tp_backward,
                           layer.cp_forward, layer.cp_backward, layer.params, pre.forward, pre.backward, pre.tp_forward,
                           pre.tp_backward, pre.params, post.forward, post.backward, post.tp_forward, post.tp_backward,
                           post.params, state.grad})
      inputs[k++] = std::bit_cast<std::uint64_t>(x);
    for (const int x : {graph.model().layers, nchunks, s.pp}) inputs[k++] = static_cast<std::uint64_t>(x);
    TRAINPLAN_CHECK(k == inputs.size(), "chunk memo inputs");
  }
  double busiest_params = 0;
  if (memoizable && out.chunk_inputs_valid && out.chunk_inputs == inputs &&
      out.chunks.size() == static_cast<std::size_t>(nchunks)) {
    busiest_params = out.chunk_busiest_params;
  } else {
    out.chunks.resize(nchunks);
    // Layers per chunk: the split of these inputs kept in out's memo, or computed into it.
    const std::span<const int> split = memo_split(out, graph.model().layers, nchunks, layer.total(), pre.total(), post.total());
    // Parameters per stage, summed in chunk order (stage i holds chunks i, i + pp, i + 2 pp, ...).
    constexpr int kInlineStages = 64;
    double inline_stage_params[kInlineStages];
    std::vector<double> heap_stage_params(s.pp > kInlineStages ? s.pp : 0);
    const std::span<double> stage_params = s.pp > kInlineStages ? std::span<double>(heap_stage_params)
                                                                 : std::span<double>(inline_stage_params, s.pp);
    std::fill(stage_params.begin(), stage_params.end(), 0.0);
    int first_layer = 0;
    // The chunks' layers and their costs, n x one layer's (chunk v sits on stage v % pp as its
    // chunk v / pp there, counted rather than divided: this runs for every chunk of every
    // strategy a search predicts).
    for (int v = 0, stage = 0, chunk = 0; v < nchunks; ++v) {
      ChunkCost& c = out.chunks[v];
      c.stage = stage;
      c.chunk = chunk;
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
      if (++stage == s.pp) {
        stage = 0;
        ++chunk;
      }
    }
    // The end ops on the first and last chunk.
    auto add_end = [](ChunkCost& c, const EndCost& e) {
      c.forward += e.forward;
      c.backward += e.backward;
      c.tp_forward += e.tp_forward;
      c.tp_backward += e.tp_backward;
      c.params += e.params;
    };
    add_end(out.chunks.front(), pre);
    add_end(out.chunks.back(), post);
    const bool cast_per_micro_batch = sw.weight_cast_per_micro_batch;
    for (ChunkCost& c : out.chunks) {
      stage_params[c.stage] += c.params;
      // Stacks that cast fp32 weights to 16 bits every micro-batch (autocast) do it in the forward.
      if (cast_per_micro_batch) c.forward += weight_cast_cost(cluster, sw, c.params).time(sw);
      c.grad_bytes = c.params * state.grad;
    }
    for (const double params : stage_params) busiest_params = std::max(busiest_params, params);
    out.chunk_inputs_valid = memoizable;
    out.chunk_inputs = inputs;
    out.chunk_busiest_params = busiest_params;
  }
  // The DP/ZeRO collectives of each chunk.
  for (int v = 0; v < nchunks; ++v) {
    ChunkCost& c = out.chunks[v];
    const double n = c.layers;
    // The chunk's compression cost: n x the layer's, plus its end ops'. Uncompressed only the wire
    // bytes are used (below), summed in the same order.
    CompressionCost cc;
    if (!plain) {
      cc = n * layer_cc;
      if (c.has_embedding) cc += pre_cc;
      if (c.has_head) cc += post_cc;
      if (reduces) compress[v] = cc.compute;
    }
    if (v > 0 && c.params == out.chunks[v - 1].params) {  // same layers: same collectives
      c.zero3_gather = out.chunks[v - 1].zero3_gather;
      c.dp_reduce = out.chunks[v - 1].dp_reduce;
      continue;
    }
    c.zero3_gather = 0;
    c.dp_reduce = 0;
    if (plain) {
      cc.wire = n * layer_cc.wire;
      if (c.has_embedding) cc.wire += pre_cc.wire;
      if (c.has_head) cc.wire += post_cc.wire;
    }
    if (s.uses_ps()) {
      // Push the (compressed) gradients, pull the 16-bit parameters: per round one call and a
      // message each way (param_server.hpp).
      c.dp_reduce = cc.rounds * (cluster.collectives.call_overhead + 2 * ps.latency) +
                    ps_transfer_time(ps, cc.wire, c.params * state.weight);
      continue;
    }
    if (dp_group == 1) continue;
    // Collectives per call: ZeRO-3 gathers each layer's parameters and ZeRO-2/3 reduce-scatter each
    // layer's gradients with their own call (ring latency and the cluster's per-call overhead per
    // layer), the chunk's end ops in one more; ZeRO 0/1 reduce a chunk's gradients once per step
    // (ZeRO 0 all-reduce; ZeRO 1 reduce-scatter, its parameter all-gather follows the optimizer).
    // Compression changes the message (cc.wire instead of c.grad_bytes) and, for PowerSGD, makes
    // two rounds of each call (P, then Q).
    const double calls = std::max(1.0, n) + (c.params > n * layer.params ? 1 : 0);
    const double rounds = cc.rounds;
    if (s.zero == 3) {
      c.zero3_gather =
          calls * (collective_time(Collective::all_gather, dp_group, c.params * state.weight / calls, dp_link) + call);
    }
    if (s.zero >= 2) {
      c.dp_reduce =
          calls * (collective_time(Collective::reduce_scatter, dp_group, cc.wire / calls, dp_link) + call);
    } else {
      c.dp_reduce = rounds * (call + (s.zero == 1 ? collective_time(Collective::reduce_scatter, dp_group, cc.wire / rounds, dp_link)
                                                  : collective_time(Collective::all_reduce, dp_group, cc.wire / rounds, dp_link)));
    }
  }

  out.p2p = p2p_time(cluster, lc, s.pp, layout.stride(Dim::pp));
  const double opt_share = s.zero >= 1 ? 1.0 / dp_group : 1.0;
  // The optimizer as the software runs it over the parameters this rank updates; weight casts and
  // gradient-buffer upkeep once a step (where not every micro-batch). With parameter servers the
  // servers update their shards instead (each server GPU total / (S x GPUs per node) parameters,
  // param_server.hpp), between the last push and the last pull.
  if (s.uses_ps()) {
    double total_params = 0;
    for (const auto& c : out.chunks) total_params += c.params * s.tp;
    out.optimizer = optimizer_cost(cluster, sw, ps_params_per_server_gpu(total_params, ps)).time(sw);
    out.ps_servers = s.ps_servers;
  } else {
    out.optimizer = optimizer_cost(cluster, sw, busiest_params * opt_share).time(sw);
  }
  // Compression kernels run on the compute stream once a step (the last micro-batch's backward):
  // charged with the optimizer step, on the stage with the most of them.
  Seconds busiest_compress = 0;
  for (int i = 0; i < s.pp && !plain; ++i) {
    Seconds sum = 0;
    for (int v = i; v < nchunks; v += s.pp) sum += compress[v];
    busiest_compress = std::max(busiest_compress, sum);
  }
  out.optimizer += busiest_compress;
  out.compression = busiest_compress;
  if (!sw.weight_cast_per_micro_batch) out.optimizer += weight_cast_cost(cluster, sw, busiest_params).time(sw);
  if ((s.zero == 1 || s.zero == 2) && dp_group > 1) {
    out.dp_param_gather = collective_time(Collective::all_gather, dp_group, busiest_params * state.weight, dp_link) +
                          cluster.collectives.call_overhead;
  }
  // How much of the DP/ZeRO traffic the stack hides behind compute (compose and simulate read it).
  out.overlap = sw.overlap;
  out.pp_overlap = s.schedule == ScheduleKind::interleaved ? sw.overlap.pp_interleaved : sw.overlap.pp;
  out.overlap_slowdown = cluster.collectives.overlap_slowdown;
  out.zero_reduce_per_micro_batch = s.zero >= 2;
  const double replica_tokens = static_cast<double>(s.micro_batch) * s.seq_len;
  const Flops model_fwd = lc.model_forward_flops_per_token * replica_tokens;
  out.model_flops_per_micro_batch_per_replica = 3 * model_fwd;
  // Recomputed forward FLOPs, whole replica: per-rank layer figure x layers x (tp * cp) ranks.
  out.hardware_flops_per_micro_batch_per_replica =
      3 * model_fwd + layer.recompute_flops * graph.model().layers * s.tp * s.cp;
  out.memory = memory_model(graph, cluster, sw, s, lc.stored_layer, lc.working_layer);
  out.layer = {.layers = 1, .forward = layer.forward, .backward = layer.backward, .recompute = layer.recompute,
               .tp_forward = layer.tp_forward, .tp_backward = layer.tp_backward, .cp_forward = layer.cp_forward,
               .cp_backward = layer.cp_backward, .params = layer.params};
  auto end_piece = [](const EndCost& end) {
    return ChunkCost{.forward = end.forward, .backward = end.backward, .tp_forward = end.tp_forward,
                     .tp_backward = end.tp_backward, .params = end.params};
  };
  out.embedding = end_piece(pre);
  out.head = end_piece(post);
}

StepCosts step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s) {
  StepCosts out;
  step_costs(graph, cluster, software, s, layer_costs(graph, cluster, software, s), out);
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
  if (auto bad = validate(s, graph.model())) return Infeasible{.reason = InfeasibleReason::invalid_strategy, .detail = *bad};
  if (auto bad = validate_on(s, cluster)) return Infeasible{.reason = InfeasibleReason::invalid_strategy, .detail = *bad};
  if (s.seq_len != graph.seq_len()) {
    return Infeasible{.reason = InfeasibleReason::invalid_strategy,
                      .detail = fmt::format("sequence length {} differs from the layer graph's {}", s.seq_len, graph.seq_len())};
  }
  if (cluster.gpu.peak(s.dtype) <= 0) {
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

void predict(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s,
             const LayerCosts& layer, StepCosts& scratch, Estimate& out) {
  if (auto why = cannot_cost(graph, cluster, s)) {
    out = Estimate{};
    out.strategy = s;
    out.capacity = cluster.gpu.hbm;
    out.feasible = false;
    out.infeasible.push_back(std::move(*why));
    return;
  }
  step_costs(graph, cluster, software, s, layer, scratch);
  compose(scratch, graph, cluster, s, out);
}

namespace {

// The part of a collective of `comm` seconds left on the critical path when the stack hides a
// share `overlap` of it behind `window` seconds of compute; the hidden part still slows that
// compute by the cluster's contention share (StepCosts::overlap_slowdown).
// What it costs is exposed_comm's (predict.hpp) at overlap_cost_rate() of the stack's share.
Seconds exposed(const StepCosts& costs, Seconds comm, Seconds window, double overlap) {
  return exposed_comm(comm, window, costs.overlap_cost_rate(overlap));
}

}  // namespace

Estimate compose(const StepCosts& costs, const LayerGraph& graph, const Cluster& cluster, const Strategy& s) {
  Estimate e;
  compose(costs, graph, cluster, s, e);
  return e;
}

void compose(const StepCosts& costs, [[maybe_unused]] const LayerGraph& graph, const Cluster& cluster, const Strategy& s,
             Estimate& e) {
  // Start from a fresh estimate, keeping the vectors' storage: every field is reset here or
  // written below (per_stage and stage_layers entry by entry, time and throughput field by field).
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
  const int m = s.micro_batches();

  // Per stage and micro-batch: work W_i = forward + backward (+ recompute, TP/CP exposure) and
  // the stage's p2p transfers (one in and one out per chunk and direction, overlapped pairwise).
  struct StageSum {
    Seconds compute, recompute, tp, cp, pp, fwd, bwd;
    Seconds zero_mb, zero_mb_exposed, dp_step;
    double params;
    int layers;
    Seconds work;  // compute + recompute + tp + cp + pp + zero_mb_exposed
  };
  // Every chunk sends its forward output to the next virtual stage and its input gradient to the
  // previous one, except at the ends of the pipeline: the first stage sends no gradient from its
  // first chunk and the last stage no activation from its last, so a middle stage makes 2 vp
  // sends per micro-batch and an end stage 2 vp - 1 (the simulator's send_output). Without
  // interleaving these sends lie on the 1F1B/GPipe dependency chain whatever the sender
  // overlaps; interleaving leaves other chunks' work to run meanwhile, so there the stack's p2p
  // overlap share decides (software "overlap.pp_interleaved").
  const double pp_rate = s.schedule == ScheduleKind::interleaved ? costs.overlap_cost_rate(costs.pp_overlap) : 1.0;
  // Memory per stage (memory_model.hpp); the runtime reserve comes from the cluster file, the
  // allocator's behaviour and the safety margin from the software profile.
  const MemoryModel& mm = costs.memory;
  e.per_stage.resize(s.pp);
  e.stage_layers.resize(s.pp);
  // One pass over the stages (predict runs millions of times in a search): each stage's sums,
  // then what the step takes from them in stage order -- the busiest stage (the first of the
  // largest W_i), sum_i W_i, the DP exposure -- and the stage's memory.
  StageSum b{};  // the busiest stage
  Seconds work_sum = 0, step_exposed = 0, dp_total = 0, zero2_last = 0;
  int worst = 0;  // the fullest stage (the first of the largest totals)
  Bytes worst_total = 0;
  // Chunks are ordered by virtual stage (chunks[chunk * pp + stage], as simulate() checks too), so
  // stage i sums chunks i, i + pp, i + 2 pp, ... in chunk order.
  const std::size_t nchunks = costs.chunks.size();
  const std::size_t pp = static_cast<std::size_t>(s.pp);
  for (std::size_t i = 0; i < pp; ++i) {
    StageSum t{};
    // `add_dp` adds a chunk's DP/ZeRO traffic where the ZeRO stage puts it (chosen once per stage).
    auto sum_chunks = [&](auto add_dp) {
      for (std::size_t v = i; v < nchunks; v += pp) {
        const ChunkCost& c = costs.chunks[v];
        TRAINPLAN_CHECK(c.stage == static_cast<int>(i), "step costs must be ordered by virtual stage (chunks[chunk * pp + stage])");
        t.compute += c.forward + c.backward;
        t.recompute += c.recompute;
        t.tp += c.tp_forward + c.tp_backward;
        t.cp += c.cp_forward + c.cp_backward;
        t.fwd += c.forward + c.tp_forward + c.cp_forward;
        t.bwd += c.backward + c.recompute + c.tp_backward + c.cp_backward;
        t.params += c.params;
        t.layers += c.layers;
        add_dp(c);
      }
    };
    if (s.zero == 3) {
      sum_chunks([&](const ChunkCost& c) {
        t.zero_mb += 2 * c.zero3_gather + c.dp_reduce;
        t.zero_mb_exposed +=
            exposed(costs, c.zero3_gather, c.forward + c.tp_forward + c.cp_forward, costs.overlap.zero3) +
            exposed(costs, c.zero3_gather + c.dp_reduce, c.backward + c.recompute + c.tp_backward + c.cp_backward,
                    costs.overlap.zero3);
      });
    } else if (s.zero == 2) {
      sum_chunks([&](const ChunkCost& c) { t.zero_mb += c.dp_reduce; });
    } else {
      sum_chunks([&](const ChunkCost& c) { t.dp_step += c.dp_reduce; });
    }
    if (s.pp > 1) t.pp = (2.0 * s.vp - (i == 0) - (i + 1 == pp)) * costs.p2p * pp_rate;
    // ZeRO-3 (above, chunk by chunk) gathers each chunk's parameters for its forward and again
    // for its backward, unit by unit ahead of the kernels, so each gather runs under the slot it
    // serves, and reduce-scatters the gradients during the backward; ZeRO-2 only the latter, its
    // reduction running on into the next forward. Each costs exposed_comm against the compute it
    // overlaps (as the simulator's slots do).
    if (s.zero == 2) {
      t.zero_mb_exposed = exposed(costs, t.zero_mb, t.fwd + t.bwd, costs.overlap.dp);
      // The step's last backward (the first stage's) has no next forward to run on into: its
      // reduction shows as the end-of-step reductions do, last bucket in full.
      if (i == 0) {
        zero2_last = bucketed_exposed_comm(t.zero_mb, t.bwd, t.layers,
                                           costs.overlap_cost_rate(costs.overlap.dp)) -
                     t.zero_mb_exposed;
      }
    }
    t.work = t.compute + t.recompute + t.tp + t.cp + t.pp + t.zero_mb_exposed;
    work_sum += t.work;
    if (i == 0 || b.work < t.work) b = t;
    // DP gradient reduction overlaps with the last micro-batch's backward (gradient buckets start
    // as soon as their layer's gradients exist, one bucket per layer); the last bucket shows.
    step_exposed = std::max(step_exposed, bucketed_exposed_comm(t.dp_step, t.bwd, t.layers,
                                                                costs.overlap_cost_rate(costs.overlap.dp)));
    dp_total = std::max(dp_total, t.dp_step + m * t.zero_mb);
    e.stage_layers[i] = t.layers;
    StageMemory& mem = e.per_stage[i];
    mem = stage_memory(mm, static_cast<int>(i), t.params, t.layers);
    const Bytes total = mem.total();
    e.peak_memory = std::max(e.peak_memory, total);
    if (i == 0 || worst_total < total) {
      worst = static_cast<int>(i);
      worst_total = total;
    }
  }

  // Pipeline: the busiest stage runs m micro-batches back to back; filling and draining the
  // pipeline adds the other stages' work once, shortened v-fold by interleaving. For uniform
  // stages this is the (p-1)/(v*m) bubble of Narayanan et al. 2021, Sec. 2.2.
  TimeBreakdown& t = e.time;
  t.compute = m * b.compute;
  t.recompute = m * b.recompute;
  t.tp_comm = m * b.tp;
  t.cp_comm = m * b.cp;
  t.pp_comm = m * b.pp;
  t.bubble = (work_sum - b.work) / s.vp;
  // Interleaving: the first micro-batch goes round the p stages v times before the last stage's
  // first backward, and the last one comes back round them v times; at each of the v - 1
  // returns to a stage that already ran its p forwards (backwards) of the round, the stage waits
  // for the p transfers in between, whatever share of a send the stack overlaps.
  if (s.schedule == ScheduleKind::interleaved && s.pp > 1) {
    t.bubble += (1 - pp_rate) * 2.0 * (s.vp - 1) * s.pp * costs.p2p;
  }
  // The updated-parameter all-gather of ZeRO 1/2 follows the optimizer step.
  t.dp_comm = dp_total + costs.dp_param_gather;
  // The ZeRO-1/2 parameter all-gather overlaps the next step's first forward where the stack
  // overlaps it (Megatron --overlap-param-gather).
  t.dp_comm_exposed = m * b.zero_mb_exposed + std::max(0.0, zero2_last) + step_exposed +
                      exposed(costs, costs.dp_param_gather, b.fwd, costs.overlap.param_gather);
  t.optimizer = costs.optimizer;
  t.step = t.compute + t.recompute + t.tp_comm + t.cp_comm + t.pp_comm + t.bubble + t.dp_comm_exposed + t.optimizer;

  // A plan must leave the profile's safety margin of the GPU's memory free: the model's error on
  // measured peaks (see software/*.json "allocator") must not turn a predicted fit into an OOM.
  const double margin = mm.safety_margin;
  if (e.peak_memory > e.capacity * (1 - margin)) {
    const StageMemory& fullest = e.per_stage[worst];
    e.feasible = false;
    e.infeasible.push_back({.reason = InfeasibleReason::out_of_memory,
                            .detail = {},
                            .stage = fullest.stage,
                            .needed = fullest.total(),
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
}

}  // namespace trainplan
