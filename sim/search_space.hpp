// search_space: what search() enumerates, as data (internal to search; search.hpp is the public
// interface).
//
// A candidate is a layout (dp, tp, pp, cp) -- the outer loop, one unit of parallel work -- times
// the odometer inside it: micro-batch, (schedule, vp), and a Setting (ZeRO stage, recomputation,
// sequence parallelism, DP algorithm, compression), innermost. The tables the search keeps per
// layout or per layer shape are typed by what they are indexed by (LayerVariant, LayerShape,
// StateKind): the one place each key becomes an index is its table.
#pragma once
#include <array>
#include <cstddef>
#include <vector>

#include "sim/cluster.hpp"
#include "sim/layer_graph.hpp"
#include "sim/memory_model.hpp"
#include "sim/search.hpp"
#include "sim/software.hpp"
#include "sim/strategy.hpp"
#include "sim/zero_policy.hpp"

namespace trainplan::search_detail {

// (recompute, sequence parallelism, recomputed modules): the setting digits one layer's costs and
// stored activations depend on (with the layer shape).
struct LayerVariant {
  Recompute recompute = Recompute::none;
  bool sp = false;
  unsigned modules = 0;  // RecomputeModule bits (strategy.hpp)
  static constexpr std::size_t kModuleSets = 16;  // every subset of the four RecomputeModule bits
  static_assert(kAllRecomputeModules < kModuleSets);
  static constexpr std::size_t kCount = 3 * 2 * kModuleSets;  // Recompute's three values x sp off/on x modules
  constexpr std::size_t index() const {
    return (static_cast<std::size_t>(recompute) * 2 + (sp ? 1 : 0)) * kModuleSets + modules;
  }
};

// A T for each LayerVariant.
template <class T>
class ByVariant {
 public:
  ByVariant() = default;
  explicit ByVariant(const T& fill) { cells_.fill(fill); }
  T& operator[](LayerVariant v) { return cells_[v.index()]; }
  const T& operator[](LayerVariant v) const { return cells_[v.index()]; }

 private:
  std::array<T, LayerVariant::kCount> cells_{};
};

// The module sets a candidate with recomputation `r` may recompute: every subset of the space's
// recompute_modules (the empty set first) with none or selective recomputation; with full
// recomputation, which recomputes every module already, only the empty set, and no set at all
// under per-layer CUDA graphs (which full recomputation does not run with).
std::vector<unsigned> module_sets(const SearchSpace& sp, Recompute r);

// Every layer variant of the space: each recomputation (none, selective, full) with its module
// sets, sequence parallelism off and on.
std::vector<LayerVariant> layer_variants(const SearchSpace& sp);

// One per-rank layer shape of the space: tp, cp, micro-batch and expert layout (ep, etp), as
// indices into Problem::tps, Problem::cps, Problem::micro_batches and Problem::expert_layouts.
struct LayerShape {
  std::size_t tp = 0, cp = 0, mb = 0, ex = 0;
};

// A ByVariant<T> for every LayerShape of a problem.
template <class T>
class LayerTable {
 public:
  LayerTable() = default;
  LayerTable(std::size_t tps, std::size_t cps, std::size_t mbs, std::size_t exs, const T& fill)
      : cps_(cps), mbs_(mbs), exs_(exs), rows_(tps * cps * mbs * exs, ByVariant<T>(fill)) {}
  ByVariant<T>& operator[](const LayerShape& s) { return rows_[index(s)]; }
  const ByVariant<T>& operator[](const LayerShape& s) const { return rows_[index(s)]; }

 private:
  std::size_t index(const LayerShape& s) const { return ((s.tp * cps_ + s.cp) * mbs_ + s.mb) * exs_ + s.ex; }
  std::size_t cps_ = 0, mbs_ = 0, exs_ = 1;
  std::vector<ByVariant<T>> rows_;
};

// An expert layout of the space (models with experts; {1, 1} for a dense model).
struct ExpertLayout {
  int ep = 1, etp = 1;
};

// What the model-state floor of a setting depends on besides the layout: how ZeRO shards the
// states over the data-parallel group, and whether parameter servers hold the optimizer states
// (the workers then keep weights and gradients only).
struct StateKind {
  ZeroPolicy zero;
  bool servers = false;
  static constexpr std::size_t kCount = (ZeroPolicy::kMaxStage + 1) * 2;  // every stage, with and without servers
  std::size_t index() const { return static_cast<std::size_t>(zero.stage) * 2 + (servers ? 1 : 0); }
  static StateKind of(const Strategy& s) { return {ZeroPolicy::of(s.zero), s.uses_ps()}; }
};

// A T for each StateKind.
template <class T>
class ByStateKind {
 public:
  T& operator[](const StateKind& k) { return cells_[k.index()]; }
  const T& operator[](const StateKind& k) const { return cells_[k.index()]; }

 private:
  std::array<T, StateKind::kCount> cells_{};
};

// One (ZeRO, recompute, sequence-parallel, DP algorithm, compression) choice: the innermost
// odometer digits, flattened.
struct Setting {
  ZeroPolicy zero;
  LayerVariant variant;
  DpAlgorithm dpa = DpAlgorithm::allreduce;
  GradCompression gc{};
  StateKind states() const { return {zero, dpa != DpAlgorithm::allreduce}; }
};

// One (dp, tp, pp, cp) factorization with an expert layout (ep, etp) that folds over it, with the
// indices of its dimensions in the problem's lists.
struct Layout {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  std::size_t dp_index = 0;  // of dp among the divisors of the global batch (Problem::mb_for_dp)
  std::size_t tp_index = 0, cp_index = 0;  // into Problem::tps, Problem::cps
  int ep = 1, etp = 1;
  std::size_t ex_index = 0;  // into Problem::expert_layouts
  int gpus() const { return dp * tp * pp * cp; }
  LayerShape shape(std::size_t mb_index) const { return {tp_index, cp_index, mb_index, ex_index}; }
};

// Constants of the pruning bounds (search_bounds.hpp fills them; empty when nothing is pruned).
struct BoundConstants {
  // Forward matmul FLOPs per token of the whole model (a rank does 1/tp of them) and of all its
  // transformer layers alone; the fastest a matmul can run.
  Flops matmul_flops_per_token = 0, layers_matmul_flops_per_token = 0;
  FlopsPerSecond best_matmul_rate = 0;
  double send_rate = 1;  // min_send_rate (predict.hpp): the least compose() charges per send second
  StateBytes state;      // bytes per parameter of the model states (memory_model.hpp)
  LayerTable<Bytes> layer_act;  // stored_layer_activation_bytes of every layer shape and variant
};

// Everything about a search that does not change per candidate.
struct Problem {
  const LayerGraph& graph;
  const Cluster& cluster;
  const Software& software;
  const SearchSpace& space;
  const SearchOptions& options;
  std::vector<int> micro_batches;  // divisors of global_batch within the limit, ascending
  // For each divisor dp of global_batch (ascending, Layout::dp_index): the indices into
  // micro_batches of the micro-batches with dp x mb dividing global_batch, ascending.
  std::vector<std::vector<std::size_t>> mb_for_dp;
  std::vector<int> tps, cps;  // tensor- and context-parallel sizes the space allows, ascending
  // Expert layouts: every ep dividing the experts (up to max_ep; at least the space's imbalance)
  // with etp 1, and with etp = t for every t > 1 of tps dividing the experts' width; {1, 1} alone
  // for a dense model. A layout takes those that fold over its tp x cp x dp with an etp the space
  // allows (ExpertSpace: etp 1, etp = tp).
  std::vector<ExpertLayout> expert_layouts;
  bool gpipe = false, one_f_one_b = false, interleaved = false;  // in space.schedules
  std::vector<Setting> settings_tp1, settings_tp;                // for tp == 1 / tp > 1
  // How many best candidates the analytic search keeps (and prunes against the last of): top_k,
  // or the refinement window (search.hpp, kRefineWindow).
  std::size_t keep_top = 1;
  BoundConstants bounds;

  const std::vector<Setting>& settings(const Layout& l) const { return l.tp > 1 ? settings_tp : settings_tp1; }
  // Micro-batches per replica of a layout with micro-batch micro_batches[mi].
  int micro_batches_per_replica(const Layout& l, std::size_t mi) const {
    return static_cast<int>(space.global_batch / (static_cast<long long>(l.dp) * micro_batches[mi]));
  }
};

// The problem of `space`, its inputs checked: throws InputError naming the flag and the rule.
Problem make_problem(const LayerGraph& g, const Cluster& c, const Software& sw, const SearchSpace& space,
                     const SearchOptions& o);

// The (dp, tp, pp, cp) factorizations of the space: most promising (most GPUs) first.
std::vector<Layout> make_layouts(const Problem& p);

// The candidate of a layout, micro-batch, (schedule, vp) and setting.
Strategy make_strategy(const Problem& p, const Layout& l, int mb, ScheduleKind k, int vp, const Setting& st);

// The (schedule, vp) digits valid for `pp` stages and `m` micro-batches per replica, in
// enumeration order: f(kind, vp) for each.
template <class F>
void for_each_schedule(const Problem& p, int pp, int m, F&& f);
// How many (schedule, vp) digits for_each_schedule visits.
int count_schedules(const Problem& p, int pp, int m);

// ---- implementation ----

int max_vp_for(const Problem& p, int pp);
// The chunks per stage of the accounted split (Strategy::pipeline_accounts: the embedding and the
// loss counted as layers) beyond the split by time: (layers + 2) / pp where that divides, exceeds
// layers / pp and is within the space's max_vp (Llama 3.1 405B's 126 layers on pp 16 x vp 8); 0
// where there is none. make_strategy accounts any layout with more chunks than layers.
int accounted_vp_for(const Problem& p, int pp);

template <class F>
void for_each_schedule(const Problem& p, int pp, int m, F&& f) {
  if (pp == 1) {
    // One stage: the schedule does not matter; take 1f1b (or gpipe if that is all that is asked).
    if (p.one_f_one_b) f(ScheduleKind::one_f_one_b, 1);
    else if (p.gpipe) f(ScheduleKind::gpipe, 1);
    return;
  }
  if (p.gpipe) f(ScheduleKind::gpipe, 1);
  if (p.one_f_one_b) f(ScheduleKind::one_f_one_b, 1);
  if (p.interleaved && m % pp == 0) {
    const int max_vp = max_vp_for(p, pp);
    for (int vp = 2; vp <= max_vp; ++vp) f(ScheduleKind::interleaved, vp);
    if (const int vp = accounted_vp_for(p, pp)) f(ScheduleKind::interleaved, vp);
  }
}

}  // namespace trainplan::search_detail
