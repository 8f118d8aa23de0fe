#include "sim/search_bounds.hpp"

#include <algorithm>
#include <limits>

#include "sim/memory_model.hpp"
#include "sim/op_time.hpp"
#include "sim/rank_layout.hpp"

namespace trainplan {

namespace search_detail {

namespace {

// The stored activation bytes per layer of every (tp, cp, micro-batch, recompute, sp); sp only
// where tp > 1 (the tp == 1 entries with sp on hold the figure without it).
LayerTable<Bytes> activation_table(const Problem& p) {
  LayerTable<Bytes> t(p.tps.size(), p.cps.size(), p.micro_batches.size(), 0.0);
  for (std::size_t ti = 0; ti < p.tps.size(); ++ti)
    for (std::size_t ci = 0; ci < p.cps.size(); ++ci)
      for (std::size_t mi = 0; mi < p.micro_batches.size(); ++mi)
        for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
          for (bool sp : {false, true}) {
            Strategy s;
            s.tp = p.tps[ti], s.cp = p.cps[ci], s.micro_batch = p.micro_batches[mi];
            s.global_batch = p.space.global_batch, s.seq_len = p.space.seq_len;
            s.recompute = r, s.sequence_parallel = sp && s.tp > 1;
            s.dtype = p.space.dtype, s.attention = p.space.attention;
            t[{ti, ci, mi}][LayerVariant{r, sp}] = stored_layer_activation_bytes(p.graph, s);
          }
  return t;
}

}  // namespace

BoundConstants bound_constants(const Problem& p, bool with_activation_table) {
  BoundConstants b;
  // Every matmul op is split at least tp ways; predict times a matmul no faster than its graph
  // FLOPs / matmul_rate_bound() (op_time.hpp).
  const LayerGraph& g = p.graph;
  for (const auto& op : g.layer_ops())
    if (op.matmul) b.layer_matmul_flops_per_token += op.flops_per_token;
  b.matmul_flops_per_token = g.model().layers * b.layer_matmul_flops_per_token;
  for (auto ops : {g.pre_ops(), g.post_ops()})
    for (const auto& op : ops)
      if (op.matmul) b.matmul_flops_per_token += op.flops_per_token;
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
  if (full_recompute) flops += p.graph.model().layers * b.layer_matmul_flops_per_token;
  return flops * tokens / tp / b.best_matmul_rate;
}

Bytes states_floor(const Problem& p, const Layout& l, const StateKind& k) {
  StateBytes per_param = p.bounds.state;
  if (k.servers) per_param.optimizer = 0;
  return model_state_bytes(p.graph.total_params() / l.tp, per_param, k.zero, static_cast<double>(l.dp * l.cp)).total();
}

// sum_i in_flight_i * layers_i / vp, with at least one layer per chunk (vp per stage) and the
// remaining layers where the fewest micro-batches are in flight. The in-flight counts are
// memory_model's in_flight_chunks, stage by stage. 1F1B sums them exactly; the other schedules
// take pp x the smallest (a weaker floor, kept as it was so that the pruning counts stay the same).
double activation_floor_layers(const Problem& p, ScheduleKind kind, int pp, int m, int vp) {
  const int L = p.graph.model().layers;
  double sum_f = 0, min_f = std::numeric_limits<double>::infinity();
  for (int i = 0; i < pp; ++i) {
    const double f = in_flight_chunks(kind, pp, i, m, vp);
    sum_f += f;
    min_f = std::min(min_f, f);
  }
  if (kind != ScheduleKind::one_f_one_b) sum_f = pp * min_f;
  return (sum_f * vp + (L - pp * vp) * min_f) / vp;
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
  const SearchOptions options;
  Problem p = make_problem(graph, cluster, software, space, options);
  p.bounds = bound_constants(p, false);
  const Bounds b = bounds(p, s, stored_layer_activation_bytes(graph, s), layer_costs(graph, cluster, software, s));
  return {b.step, b.memory};
}

}  // namespace trainplan
