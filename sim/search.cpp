#include "sim/search.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>
#include <tuple>

#include "sim/check.hpp"
#include "sim/param_server.hpp"
#include "sim/predict.hpp"
#include "sim/rank_layout.hpp"
#include "sim/search_bounds.hpp"
#include "sim/search_scheduler.hpp"
#include "sim/search_space.hpp"
#include "sim/simulate.hpp"

namespace trainplan {

const char* to_string(Objective o) {
  switch (o) {
    case Objective::throughput: return "throughput";
    case Objective::cost: return "cost";
    case Objective::time: return "time";
  }
  return "?";
}

std::optional<Objective> parse_objective(const std::string& s) {
  if (s == "throughput") return Objective::throughput;
  if (s == "cost") return Objective::cost;
  if (s == "time") return Objective::time;
  return std::nullopt;
}

bool only_full_recompute(const SearchSpace& space) {
  return std::all_of(space.recompute.begin(), space.recompute.end(), [](Recompute r) { return r == Recompute::full; });
}

SearchSpace default_space(const Cluster& c, int gpus, int global_batch, int seq_len, Attention attention) {
  SearchSpace s;
  s.attention = attention;
  if (attention == Attention::flash) s.recompute = {Recompute::none, Recompute::full};
  s.gpus = gpus;
  s.global_batch = global_batch;
  s.seq_len = seq_len;
  // TP and CP inside the scale-up domain (a node, or an NVLink rack of many): beyond it their
  // per-layer collectives would cross the scale-out network.
  s.max_tp = c.scale_up_gpus;
  s.max_cp = 1;
  while (s.max_cp * 2 <= c.scale_up_gpus && seq_len / (s.max_cp * 2) >= 1024) s.max_cp *= 2;
  s.max_vp = 8;
  return s;
}

double objective_value(Objective o, Seconds step, double tokens_per_s, int gpus, const Cluster& c) {
  switch (o) {
    case Objective::time: return step;
    case Objective::throughput: return -tokens_per_s;
    case Objective::cost: return c.price_per_gpu_hour * gpus * step / 3600.0;
  }
  return step;
}

double objective_value(Objective o, const Estimate& e, const Cluster& c) {
  // Dedicated parameter-server nodes are paid for too (param_server.hpp); the pruning bounds use
  // the layout's own GPUs, fewer, so they stay below.
  return objective_value(o, e.time.step, e.throughput.tokens_per_s, billed_gpus(e.strategy, c), c);
}

namespace {

using namespace search_detail;
using Clock = std::chrono::steady_clock;

// What one worker thread keeps between the layouts it searches: the layer costs of every LayerKey
// it has met (predict.hpp; computed the first time a layout needs them, and the same whichever
// thread computes them, so no result depends on which did) and the scratch storage predict writes
// into, so that predicting a layout allocates nothing.
class Worker {
 public:
  explicit Worker(const Problem& p) : slot_(p.tps.size(), p.cps.size(), p.micro_batches.size(), p.expert_layouts.size(), -1) {}

  // Layer costs of layout `l`'s layers with micro-batch micro_batches[mi] and variant `v`. The
  // reference stays valid for the worker's life (a deque does not move its elements as it grows).
  const LayerCosts& layer(const Problem& p, const Layout& l, std::size_t mi, LayerVariant v) {
    int& slot = slot_[l.shape(mi)][v];
    if (slot < 0) {
      const Strategy s = make_strategy(p, l, p.micro_batches[mi], ScheduleKind::one_f_one_b, 1, Setting{{}, v});
      slot = static_cast<int>(keys_.size());
      keys_.push_back(layer_costs(p.graph, p.cluster, p.software, s));
    }
    return keys_[static_cast<std::size_t>(slot)];
  }

  // predict's scratch for a strategy: one per layer variant -- the settings' innermost digits, so
  // that each sees one layer-cost setting under the ZeRO stages in turn (its StepMemo).
  PredictScratch& costs(const Strategy& s) {
    return costs_[LayerVariant{s.recompute, s.sequence_parallel, s.recompute_modules}];
  }
  Estimate estimate;  // the last prediction

 private:
  ByVariant<PredictScratch> costs_;
  LayerTable<int> slot_;         // index into keys_; -1: not yet
  std::deque<LayerCosts> keys_;  // the layer costs met so far
};

// Total order of ranked candidates: objective, then fewer GPUs, less memory, then the simpler
// layout (fewest model-parallel ranks, then no CP, shallower pipeline, smaller TP, smaller EP and
// ETP, ...), so that
// among equal predictions the one that is easiest to run comes first.
struct Ranked {
  double value;
  Estimate e;
};
auto layout_key(const Strategy& s) {
  return std::make_tuple(s.tp * s.pp * s.cp, s.cp, s.pp, s.tp, s.ep, s.etp, s.vp, s.zero, s.micro_batch,
                         static_cast<int>(s.recompute), s.sequence_parallel, static_cast<int>(s.schedule), s.dp);
}
auto rank_key(double value, const Estimate& e) {
  return std::make_tuple(value, e.strategy.gpus(), e.peak_memory, layout_key(e.strategy));
}
auto rank_key(const Ranked& r) { return rank_key(r.value, r.e); }
bool better(const Ranked& a, const Ranked& b) { return rank_key(a) < rank_key(b); }

// True when keep_best would keep (value, e) in `list` (so that it is copied only then).
bool would_keep(const std::vector<Ranked>& list, std::size_t k, double value, const Estimate& e) {
  if (list.size() < k) return true;
  // rank_key's order, its first member (the value) compared before the others are built.
  const Ranked& last = list.back();
  if (value < last.value) return true;
  if (last.value < value) return false;
  return rank_key(value, e) < rank_key(last);
}

// Keeps the k best by `better`.
void keep_best(std::vector<Ranked>& list, std::size_t k, Ranked r) {
  if (list.size() >= k && !better(r, list.back())) return;
  auto pos = std::upper_bound(list.begin(), list.end(), r, better);
  list.insert(pos, std::move(r));
  if (list.size() > k) list.pop_back();
}

// Pareto front over (step time, peak memory), sorted by step time, memory strictly decreasing.
void add_to_front(std::vector<Estimate>& front, const Estimate& e) {
  const double t = e.time.step, m = e.peak_memory;
  // First point with step > t; every point before it has step <= t.
  auto pos = std::upper_bound(front.begin(), front.end(), t, [](double x, const Estimate& f) { return x < f.time.step; });
  if (pos != front.begin()) {
    const Estimate& q = *std::prev(pos);
    if (q.peak_memory < m || (q.peak_memory == m && (q.time.step < t || layout_key(q.strategy) <= layout_key(e.strategy)))) {
      return;  // dominated, or equal and later in the layout order (ties keep the same point at any thread count)
    }
  }
  // Remove the points the new one dominates: step >= t and memory >= m, right after it.
  auto first = pos;
  while (first != front.begin() && std::prev(first)->time.step == t) --first;  // same step, more memory
  auto last = pos;
  while (last != front.end() && last->peak_memory >= m) ++last;
  pos = front.erase(first, last);
  front.insert(pos, e);
}

// The pruning thresholds a layout is searched under. Each layout starts from the thresholds of the
// layouts merged before its round (see search()) and tightens its own copy as it goes, so what a
// layout prunes never depends on thread timing.
struct Thresholds {
  double kth = std::numeric_limits<double>::infinity();        // K-th best objective
  double best_step = std::numeric_limits<double>::infinity();  // best feasible step time
  bool operator==(const Thresholds&) const = default;          // exact: a layout's result depends on nothing else
};

// What one layout contributes: its own top K, Pareto candidates, counts, and final thresholds.
struct WorkerResult {
  Thresholds thresholds;
  std::map<InfeasibleReason, std::int64_t> reasons;  // infeasible candidates by their first reason
  std::vector<Ranked> top;
  std::vector<Ranked> infeasible;  // ranked by step time
  std::vector<Estimate> front;
  std::vector<std::pair<Seconds, Bytes>> points;  // with SearchOptions::keep_points
  SearchStats stats;
};

// The objective's floor for a step-time floor: objective_value at that step time (tokens per step
// are fixed by the space).
double value_floor(const Problem& p, Seconds step, int gpus) {
  const double tokens_per_s = static_cast<double>(p.space.global_batch) * p.space.seq_len / step;
  return objective_value(p.options.objective, step, tokens_per_s, gpus, p.cluster);
}

// True when nothing with this step-time floor can enter the top K or the reported Pareto front.
bool beaten(const Problem& p, const Thresholds& t, Seconds step_floor, int gpus) {
  return step_floor > p.options.pareto_window * t.best_step && value_floor(p, step_floor, gpus) > t.kth;
}

// Predicts `s` (from its layer costs `lc`, or with the caller's evaluator) and files the estimate;
// it is copied only where it is kept.
void evaluate(const Problem& p, const Strategy& s, const LayerCosts& lc, WorkerResult& w, Worker& worker) {
  const SearchOptions& o = p.options;
  Estimate& e = worker.estimate;
  if (o.evaluate) e = o.evaluate(s);
  else predict(p.graph, p.cluster, p.software, s, lc, worker.costs(s), e);
  ++w.stats.evaluated;
  if (!e.feasible) {
    TRAINPLAN_CHECK(!e.infeasible.empty(), "an infeasible estimate must say why");
    ++w.reasons[e.infeasible.front().reason];
    const std::size_t k = static_cast<std::size_t>(std::max(0, o.keep_infeasible));
    if (k > 0 && e.time.step > 0 && would_keep(w.infeasible, k, e.time.step, e)) keep_best(w.infeasible, k, {e.time.step, e});
    return;
  }
  ++w.stats.feasible;
  if (o.keep_points) w.points.emplace_back(e.time.step, e.peak_memory);
  const double value = objective_value(o.objective, e, p.cluster);
  const double step = e.time.step;
  Thresholds& t = w.thresholds;
  t.best_step = std::min(t.best_step, step);
  if (step <= o.pareto_window * t.best_step) add_to_front(w.front, e);
  const std::size_t k = p.keep_top;
  if (would_keep(w.top, k, value, e)) {
    keep_best(w.top, k, {value, e});
    if (w.top.size() == k) t.kth = std::min(t.kth, w.top.back().value);
  }
}

// SearchStats::least_memory_floor: the least of the memory floors `floor` seen so far (0: none yet,
// and a 0 `floor` is none).
void keep_least_floor(Bytes& least, Bytes floor) {
  if (floor > 0 && (least == 0 || floor < least)) least = floor;
}

// All candidates of one (dp, tp, pp, cp) layout. The bounds are hoisted to the level of the
// odometer they depend on (layout, micro-batch, schedule, setting), so whole subtrees are
// skipped with one test; each level is a method.
class LayoutSearch {
 public:
  LayoutSearch(const Problem& p, const Layout& l, WorkerResult& w, Worker& worker)
      : p_(p), l_(l), settings_(p.settings(l)), w_(w), worker_(worker) {}

  void run() {
    if (!p_.options.prune) return brute_force();
    prepare_states();
    if (settled_whole()) return;
    pp_stride_ = RankLayout(make_strategy(p_, l_, p_.micro_batches.front(), ScheduleKind::one_f_one_b, 1, settings_.front()))
                     .stride(Dim::pp);
    for (std::size_t mi : p_.mb_for_dp[l_.dp_index]) micro_batch(mi);
  }

 private:
  std::int64_t per_schedule() const { return static_cast<std::int64_t>(settings_.size()); }

  // Every candidate predicted (SearchOptions::prune off).
  void brute_force() {
    for (std::size_t mi : p_.mb_for_dp[l_.dp_index]) {
      const int mb = p_.micro_batches[mi];
      for_each_schedule(p_, l_.pp, p_.micro_batches_per_replica(l_, mi), [&](ScheduleKind kind, int vp) {
        for (const Setting& st : settings_) {
          ++w_.stats.candidates;
          evaluate(p_, make_strategy(p_, l_, mb, kind, vp, st), worker_.layer(p_, l_, mi, st.variant), w_, worker_);
        }
      });
    }
  }

  // The model-state floor of each kind the settings use, and the smallest.
  void prepare_states() {
    ByStateKind<bool> known;
    for (const Setting& st : settings_) {
      const StateKind k = st.states();
      if (!known[k]) states_[k] = states_floor(p_, l_, k), known[k] = true;
      min_states_ = std::min(min_states_, states_[k]);
    }
  }

  // A candidate proven out of memory by a floor of `bytes` per GPU: the least such floor is what
  // the report quotes when nothing fits.
  void note_memory_floor(Bytes bytes) { keep_least_floor(w_.stats.least_memory_floor, bytes); }

  // Layout level: out of memory with the best ZeRO stage and no activations, or slower than the
  // thresholds with the smallest micro-batch and no bubble. True when that settles every candidate.
  bool settled_whole() {
    std::int64_t* verdict = nullptr;
    const Bytes states_floor = p_.cluster.runtime_overhead + min_states_ / l_.pp;
    if (states_floor * kMargin > p_.cluster.gpu.hbm) {
      verdict = &w_.stats.pruned_out_of_memory;
      note_memory_floor(states_floor);
    } else {
      const int mb0 = p_.micro_batches.front();
      const double m0 = p_.space.global_batch / (static_cast<double>(l_.dp) * mb0);
      if (beaten(p_, w_.thresholds, work_floor(p_, l_.tp, l_.cp, mb0, false) * m0 / l_.pp * kMargin, l_.gpus())) {
        verdict = &w_.stats.pruned_by_bound;
      }
    }
    if (!verdict) return false;
    std::int64_t n = 0;
    for (std::size_t mi : p_.mb_for_dp[l_.dp_index]) n += count_schedules(p_, l_.pp, p_.micro_batches_per_replica(l_, mi));
    w_.stats.candidates += n * per_schedule();
    *verdict += n * per_schedule();
    return true;
  }

  // Micro-batch level: the floors that depend on the micro-batch, then each (schedule, vp).
  void micro_batch(std::size_t mi) {
    mi_ = mi;
    m_ = p_.micro_batches_per_replica(l_, mi);
    act_ = &p_.bounds.layer_act[l_.shape(mi)];
    const int mb = p_.micro_batches[mi];
    work_plain_ = work_floor(p_, l_.tp, l_.cp, mb, false);
    work_full_ = work_floor(p_, l_.tp, l_.cp, mb, true);
    min_act_ = std::numeric_limits<double>::infinity();
    for (const Setting& st : settings_) min_act_ = std::min(min_act_, (*act_)[st.variant]);
    layer_ = ByVariant<const LayerCosts*>(nullptr);
    for_each_schedule(p_, l_.pp, m_, [&](ScheduleKind kind, int vp) { schedule(kind, vp); });
  }

  // step_time_floor (predict.hpp) of variant `v` under `vp`: the layer costs and pipeline send time
  // looked up once per micro-batch, and only once the cheaper floors have not settled a subtree.
  Seconds layer_floor(LayerVariant v, int vp) {
    if (!layer_[v]) {
      layer_[v] = &worker_.layer(p_, l_, mi_, v);
      p2p_[v] = p_.bounds.send_rate * p2p_time(p_.cluster, *layer_[v], l_.pp, pp_stride_);
    }
    return step_time_floor(*layer_[v], p2p_[v], l_.pp, m_, vp);
  }

  // Schedule level: every setting beaten by the matmul floor (O(1), so tested first), every
  // setting out of memory (O(pp)), or every setting beaten by the layer costs' floor; then each
  // setting by its own floors.
  void schedule(ScheduleKind kind, int vp) {
    w_.stats.candidates += per_schedule();
    const double pipe = pipeline_factor(l_.pp, m_, vp);
    if (beaten(p_, w_.thresholds, work_plain_ * pipe * kMargin, l_.gpus())) {
      w_.stats.pruned_by_bound += per_schedule();
      return;
    }
    const double floor_layers = activation_floor_layers(p_, kind, l_.pp, m_, vp);
    const Bytes overhead = p_.cluster.runtime_overhead;
    const Bytes schedule_floor = overhead + (min_states_ + floor_layers * min_act_) / l_.pp;
    if (schedule_floor * kMargin > p_.cluster.gpu.hbm) {
      w_.stats.pruned_out_of_memory += per_schedule();
      note_memory_floor(schedule_floor);
      return;
    }
    // step_time_floor depends on the setting only through its variant: each computed once.
    ByVariant<std::optional<Seconds>> floors;
    auto floor_at = [&](LayerVariant v) {
      if (!floors[v]) floors[v] = layer_floor(v, vp);
      return *floors[v];
    };
    double min_floor = std::numeric_limits<double>::infinity();
    for (const Setting& st : settings_) min_floor = std::min(min_floor, floor_at(st.variant));
    if (beaten(p_, w_.thresholds, min_floor * kMargin, l_.gpus())) {
      w_.stats.pruned_by_bound += per_schedule();
      return;
    }
    for (const Setting& st : settings_) {
      const Bytes memory = overhead + (states_[st.states()] + floor_layers * (*act_)[st.variant]) / l_.pp;
      if (memory * kMargin > p_.cluster.gpu.hbm) {
        ++w_.stats.pruned_out_of_memory;
        note_memory_floor(memory);
        continue;
      }
      const Seconds work = st.variant.recompute == Recompute::full ? work_full_ : work_plain_;
      if (beaten(p_, w_.thresholds, std::max(work * pipe, floor_at(st.variant)) * kMargin, l_.gpus())) {
        ++w_.stats.pruned_by_bound;
        continue;
      }
      const Strategy s = make_strategy(p_, l_, p_.micro_batches[mi_], kind, vp, st);
      evaluate(p_, s, worker_.layer(p_, l_, mi_, st.variant), w_, worker_);
    }
  }

  const Problem& p_;
  const Layout& l_;
  const std::vector<Setting>& settings_;
  WorkerResult& w_;  // its thresholds are tightened by this layout's own finds as it goes
  Worker& worker_;
  // Layout level.
  ByStateKind<Bytes> states_;
  Bytes min_states_ = std::numeric_limits<double>::infinity();
  int pp_stride_ = 1;
  // Micro-batch level.
  std::size_t mi_ = 0;
  int m_ = 1;                          // micro-batches per replica
  const ByVariant<Bytes>* act_ = nullptr;  // stored activation bytes of one layer
  Seconds work_plain_ = 0, work_full_ = 0;
  Bytes min_act_ = 0;
  ByVariant<const LayerCosts*> layer_;
  ByVariant<Seconds> p2p_;
};

// Merges one layout's result into the search's, in layout order.
void merge(WorkerResult& into, WorkerResult&& w, const Problem& p) {
  const SearchOptions& o = p.options;
  for (auto& r : w.top) keep_best(into.top, p.keep_top, std::move(r));
  for (auto& r : w.infeasible) keep_best(into.infeasible, static_cast<std::size_t>(std::max(0, o.keep_infeasible)), std::move(r));
  for (const auto& e : w.front) add_to_front(into.front, e);
  into.points.insert(into.points.end(), w.points.begin(), w.points.end());
  SearchStats& st = into.stats;
  st.candidates += w.stats.candidates;
  st.evaluated += w.stats.evaluated;
  st.feasible += w.stats.feasible;
  st.pruned_out_of_memory += w.stats.pruned_out_of_memory;
  keep_least_floor(st.least_memory_floor, w.stats.least_memory_floor);
  st.pruned_by_bound += w.stats.pruned_by_bound;
  for (const auto& [reason, n] : w.reasons) into.reasons[reason] += n;
  Thresholds& t = into.thresholds;
  t.best_step = std::min(t.best_step, w.thresholds.best_step);
  if (into.top.size() == p.keep_top) t.kth = std::min(t.kth, into.top.back().value);
}

// The search's answer from the merged result of every layout: the lists best first, the Pareto
// front cut at the window.
SearchResult to_result(WorkerResult&& all, const SearchOptions& options) {
  SearchResult out;
  out.stats = all.stats;
  for (const auto& [reason, n] : all.reasons) out.stats.infeasible_by_reason[reason] += n;
  for (auto& r : all.top) {
    out.top_value.push_back(r.value);
    out.top.push_back(std::move(r.e));
  }
  for (auto& r : all.infeasible) out.infeasible.push_back(std::move(r.e));
  out.points = std::move(all.points);
  for (auto& e : all.front) {
    if (e.time.step <= options.pareto_window * all.thresholds.best_step) out.pareto.push_back(std::move(e));
  }
  return out;
}

}  // namespace

SearchResult search(const LayerGraph& graph, const Cluster& cluster, const Software& software, const SearchSpace& space,
                    const SearchOptions& options) {
  const auto start = Clock::now();
  Problem p = make_problem(graph, cluster, software, space, options);
  if (options.prune) p.bounds = bound_constants(p, true);
  const std::vector<Layout> layouts = make_layouts(p);

  const int threads = worker_threads(options.threads, layouts.size());
  std::vector<Worker> workers;  // each thread's layer costs and scratch, kept over the search
  for (int t = 0; t < threads; ++t) workers.emplace_back(p);
  // Rounds of layouts (search_scheduler.hpp): every layout of a round starts from the thresholds
  // of all layouts of the earlier rounds, merged in layout order, so counts, rankings and every
  // figure are the same for any thread count and timing; a round only delays when one layout's
  // finds start pruning another's. Layouts come most promising first, so the first round sets
  // tight thresholds. Threads run ahead of the merged rounds only once the top list is full
  // (before that, every round tightens the thresholds).
  WorkerResult all;
  RoundWork<Thresholds, WorkerResult> work;
  work.run = [&](std::size_t i, const Thresholds& from, int worker, WorkerResult& out) {
    out.thresholds = from;
    LayoutSearch(p, layouts[i], out, workers[static_cast<std::size_t>(worker)]).run();
  };
  work.merge = [&](WorkerResult&& w) { merge(all, std::move(w), p); };
  work.start = [&] { return all.thresholds; };
  work.may_run_ahead = [](const Thresholds& t) { return std::isfinite(t.kth); };
  // Progress every 100 ms once the search has run 200 ms (short searches draw nothing).
  const auto total = static_cast<std::int64_t>(layouts.size());
  bool reported = false;
  auto next_report = start + std::chrono::milliseconds(200);
  if (options.progress) {
    work.progress = [&](std::size_t merged) {
      if (Clock::now() < next_report) return;
      options.progress(static_cast<std::int64_t>(merged), total);
      reported = true;
      next_report = Clock::now() + std::chrono::milliseconds(100);
    };
  }
  run_in_rounds(layouts.size(), threads, work, RoundShape{16, 64});
  if (reported) options.progress(total, total);

  SearchResult out = to_result(std::move(all), options);
  out.stats.layouts = static_cast<int>(layouts.size());
  out.stats.max_gpus_considered = space.exact_gpus ? space.gpus : std::min(space.gpus, cluster.max_gpus());
  out.stats.threads = threads;
  out.stats.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (options.refine) {
    refine_top_with_simulation(out, graph, cluster, software, options.objective, options.threads);
    const auto listed = std::min(out.top.size(), static_cast<std::size_t>(options.top_k));
    out.top.resize(listed);
    out.top_value.resize(listed);
  }
  return out;
}

void refine_top_with_simulation(SearchResult& r, const LayerGraph& graph, const Cluster& cluster, const Software& software,
                                Objective o, int threads) {
  // Each entry is simulated independently (the simulator is pure), so they are spread over the
  // threads; the result does not depend on how. An entry the simulator refuses
  // (simulation_size_error) fails the whole refinement (parallel_for rethrows the first error).
  std::vector<std::pair<double, Estimate>> refined(r.top.size());
  parallel_for(r.top.size(), threads, [&](std::size_t i, int) {
    Estimate s = predict_with_simulation(graph, cluster, software, r.top[i].strategy);
    refined[i] = {objective_value(o, s, cluster), std::move(s)};
  });
  // Stable: equal simulated values keep the search's tie order.
  std::stable_sort(refined.begin(), refined.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  r.top.clear();
  r.top_value.clear();
  for (auto& [value, e] : refined) {
    r.top_value.push_back(value);
    r.top.push_back(std::move(e));
  }
  r.stats.refined = static_cast<int>(r.top.size());
}

}  // namespace trainplan
