#include "sim/search_bounds.hpp"

#include <algorithm>
#include <span>
#include <limits>

#include "sim/memory_model.hpp"
#include "sim/op_time.hpp"
#include "sim/rank_layout.hpp"

namespace trainplan {

namespace search_detail {

namespace {

// The least stored activation bytes of a layer of any kind (a floor of each layer's), for a strategy.
Bytes least_layer_activation(const LayerGraph& g, const Strategy& s) {
  Bytes least = stored_layer_activation_bytes(g, s, 0);
  for (int k = 1; k < g.kind_count(); ++k) least = std::min(least, stored_layer_activation_bytes(g, s, k));
  return least;
}

// The strategy one layer's stored activations are figured for: layer shape `at` on one stage of
// one replica, variant `v`, the space's other settings, as make_strategy builds every candidate's.
// Sequence parallelism only with tp > 1: the tp == 1 entries with sp on hold the figure without it.
Strategy layer_strategy(const Problem& p, const LayerShape& at, LayerVariant v) {
  Layout l;
  l.tp = p.tps[at.tp], l.tp_index = at.tp;
  l.cp = p.cps[at.cp], l.cp_index = at.cp;
  l.ep = p.expert_layouts[at.ex].ep, l.etp = p.expert_layouts[at.ex].etp, l.ex_index = at.ex;
  v.sp = v.sp && l.tp > 1;
  return make_strategy(p, l, p.micro_batches[at.mb], ScheduleKind::one_f_one_b, 1, Setting{{}, v});
}

// The stored activation bytes per layer (the least of the layer kinds') of every (tp, cp,
// micro-batch, expert layout) and layer variant the space has.
LayerTable<Bytes> activation_table(const Problem& p) {
  LayerTable<Bytes> t(p.tps.size(), p.cps.size(), p.micro_batches.size(), p.expert_layouts.size(), 0.0);
  const std::vector<LayerVariant> variants = layer_variants(p.space);
  for (std::size_t ti = 0; ti < p.tps.size(); ++ti)
    for (std::size_t ci = 0; ci < p.cps.size(); ++ci)
      for (std::size_t mi = 0; mi < p.micro_batches.size(); ++mi)
        for (std::size_t xi = 0; xi < p.expert_layouts.size(); ++xi) {
          const LayerShape at{ti, ci, mi, xi};
          for (LayerVariant v : variants) t[at][v] = least_layer_activation(p.graph, layer_strategy(p, at, v));
        }
  return t;
}

// Forward matmul FLOPs per token of `ops`, routed experts' at the least share of their balanced
// rows a rank computes: all of them, or with a capacity factor C < 1 (tokens dropped) C of them.
Flops matmul_flops(std::span<const OpSpec> ops, double expert_share) {
  Flops f = 0;
  for (const auto& op : ops)
    if (op.matmul) f += op.flops_per_token * (op.split == Split::expert ? expert_share : 1.0);
  return f;
}

}  // namespace

BoundConstants bound_constants(const Problem& p, bool with_activation_table) {
  BoundConstants b;
  // Every matmul op is split at least tp ways; predict times a matmul no faster than its graph
  // FLOPs / matmul_rate_bound() (op_time.hpp). Layers of every kind, and the MTP modules'.
  const LayerGraph& g = p.graph;
  const double cf = p.space.experts.capacity_factor;
  const double expert_share = cf > 0 && cf < 1 ? cf : 1.0;
  const LayerGraph::KindCounts counts = g.kind_counts(0, g.model().layers);
  for (int k = 0; k < g.kind_count(); ++k) b.layers_matmul_flops_per_token += counts[k] * matmul_flops(g.kind_ops(k), expert_share);
  b.matmul_flops_per_token = b.layers_matmul_flops_per_token;
  for (auto ops : {g.pre_ops(), g.post_ops()}) b.matmul_flops_per_token += matmul_flops(ops, 1.0);
  if (g.mtp_kind() >= 0) {
    const Flops module = matmul_flops(g.kind_ops(g.mtp_kind()), expert_share) + matmul_flops(g.mtp_ops(), 1.0) +
                         matmul_flops(g.mtp_head_ops(), 1.0);
    b.matmul_flops_per_token += g.model().mtp_layers * module;
  }
  b.best_matmul_rate = matmul_rate_bound(p.cluster, p.space.dtype);
  b.send_rate = min_send_rate(p.software, p.cluster);
  b.state = state_bytes(p.space.dtype, p.space.fp32_grad_accum);
  if (with_activation_table) b.layer_act = activation_table(p);
  return b;
}

Seconds work_floor(const Problem& p, int tp, int cp, int mb, bool full_recompute) {
  const BoundConstants& b = p.bounds;
  const double tokens = static_cast<double>(mb) * p.space.seq_len / cp;
  Flops flops = 3 * b.matmul_flops_per_token;
  if (full_recompute) flops += b.layers_matmul_flops_per_token;
  return flops * tokens / tp / b.best_matmul_rate;
}

Bytes states_floor(const Problem& p, const Layout& l, const StateKind& k) {
  StateBytes per_param = p.bounds.state;
  if (k.servers) per_param.optimizer = 0;
  const ParamCounts c = p.graph.counts();
  const double dense = c.total - c.expert;  // (MTP modules left out: a floor)
  Bytes floor = model_state_bytes(dense / l.tp, per_param, k.zero, static_cast<double>(l.dp * l.cp)).total();
  // Routed experts: split over ep x etp and sharded over edp, at least 1 / (tp cp dp) of each
  // state per rank, for any expert layout of the stage (ep x etp x edp = tp x cp x dp).
  if (c.expert > 0) floor += c.expert / (static_cast<double>(l.tp) * l.cp * l.dp) * (per_param.weight + per_param.grad + per_param.optimizer);
  return floor;
}

// sum_i in_flight_i * layers_i / vp, with at least one layer per chunk (vp per stage) and the
// remaining layers where the fewest micro-batches are in flight; with more chunks than layers (an
// accounted split) the chunks without a layer are taken where the most are in flight. The in-flight counts are
// memory_model's in_flight_chunks, stage by stage. 1F1B sums them exactly; the other schedules
// take pp x the smallest (a weaker floor, kept as it was so that the pruning counts stay the same).
double activation_floor_layers(const Problem& p, ScheduleKind kind, int pp, int m, int vp) {
  const int L = p.graph.model().layers;
  double sum_f = 0, min_f = std::numeric_limits<double>::infinity(), max_f = 0;
  for (int i = 0; i < pp; ++i) {
    const double f = in_flight_chunks(kind, pp, i, m, vp);
    sum_f += f;
    min_f = std::min(min_f, f);
    max_f = std::max(max_f, f);
  }
  if (kind != ScheduleKind::one_f_one_b) sum_f = pp * min_f;
  return (sum_f * vp + (L - pp * vp) * (L >= pp * vp ? min_f : max_f)) / vp;
}

// Peak memory >= the mean over stages of states + activations, plus the runtime overhead.
Bounds bounds(const Problem& p, const Strategy& s, Bytes per_layer_act, const LayerCosts& layer) {
  const int m = s.micro_batches();
  const Seconds p2p = p.bounds.send_rate * p2p_time(p.cluster, layer, s.pp, RankLayout(s).stride(Dim::pp));
  const Seconds step =
      std::max(work_floor(p, s.tp, s.cp, s.micro_batch, s.recompute == Recompute::full) * pipeline_factor(s.pp, m, s.vp),
               step_time_floor(layer, p2p, s.pp, m, s.vp));
  const Layout l{s.dp, s.tp, s.pp, s.cp};
  const Bytes memory = p.cluster.runtime_overhead + (states_floor(p, l, StateKind::of(s)) +
                                                     activation_floor_layers(p, s.schedule, s.pp, m, s.vp) * per_layer_act) /
                                                        s.pp;
  return {step * kMargin, memory * kMargin};
}

}  // namespace search_detail

CandidateBounds candidate_bounds(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s) {
  using namespace search_detail;
  SearchSpace space;
  space.seq_len = s.seq_len;
  space.global_batch = s.global_batch;
  space.dtype = s.dtype;
  space.attention = s.attention;
  space.fp32_grad_accum = s.fp32_grad_accum;
  if (graph.model().moe.on()) space.experts.capacity_factor = s.capacity_factor;  // (bound_constants' expert share)
  const SearchOptions options;
  Problem p = make_problem(graph, cluster, software, space, options);
  p.bounds = bound_constants(p, false);
  const Bounds b = bounds(p, s, least_layer_activation(graph, s), layer_costs(graph, cluster, software, s));
  return {b.step, b.memory};
}

}  // namespace trainplan
