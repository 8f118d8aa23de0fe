#include "sim/search.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <tuple>

#include "sim/check.hpp"
#include "sim/memory_model.hpp"
#include "sim/op_time.hpp"
#include "sim/param_server.hpp"
#include "sim/predict.hpp"
#include "sim/rank_layout.hpp"
#include "sim/search_scheduler.hpp"
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

SearchSpace default_space(const Cluster& c, int gpus, int global_batch, int seq_len, Attention attention) {
  SearchSpace s;
  s.attention = attention;
  if (attention == Attention::flash) s.recompute = {Recompute::none, Recompute::full};
  s.gpus = gpus;
  s.global_batch = global_batch;
  s.seq_len = seq_len;
  s.max_tp = c.gpus_per_node;
  s.max_cp = 1;
  while (s.max_cp * 2 <= c.gpus_per_node && seq_len / (s.max_cp * 2) >= 1024) s.max_cp *= 2;
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

using Clock = std::chrono::steady_clock;

struct Layout {
  int dp, tp, pp, cp;
  int dp_index;  // index of dp among the divisors of the global batch (Problem::mb_for_dp)
  int gpus() const { return dp * tp * pp * cp; }
};

// One (ZeRO, recompute, sequence-parallel, DP algorithm, compression) choice; the innermost
// odometer digits, flattened.
struct Setting {
  int zero;
  Recompute recompute;
  bool sp;
  DpAlgorithm dpa = DpAlgorithm::allreduce;
  GradCompression gc{};
  // Index into the per-layout model-state floors: the ZeRO stage, or 4 with parameter servers
  // (no optimizer states on the workers).
  int states() const { return dpa == DpAlgorithm::allreduce ? zero : 4; }
};

// Everything about the search that does not change per candidate, plus the bound constants.
struct Problem {
  const LayerGraph& graph;
  const Cluster& cluster;
  const Software& software;
  const SearchSpace& space;
  const SearchOptions& options;
  std::vector<int> micro_batches;   // divisors of global_batch within the limit, ascending
  // For each divisor dp of global_batch (ascending, Layout::dp_index): the indices into
  // micro_batches of the micro-batches with dp x mb dividing global_batch, ascending.
  std::vector<std::vector<int>> mb_for_dp;
  bool gpipe = false, one_f_one_b = false, interleaved = false;  // in space.schedules
  std::vector<Setting> settings_tp1, settings_tp;  // for tp == 1 / tp > 1
  // Bounds: per-rank forward matmul FLOPs per token of the whole model (times 1/tp) and of the
  // transformer layers alone; the fastest a matmul can run; bytes per parameter of model states.
  Flops matmul_flops_per_token = 0, layer_matmul_flops_per_token = 0;
  FlopsPerSecond best_matmul_rate = 0;
  double send_rate = 1;  // min_send_rate (predict.hpp): the least compose() charges per send second
  StateBytes state;  // bytes per parameter of the model states (memory_model.hpp)
  // stored_layer_activation_bytes, tabulated: [tp index][cp index][mb index][recompute][sp].
  std::vector<int> tps, cps;
  std::vector<Bytes> layer_act;
};

int index_of(const std::vector<int>& v, int x) {
  return static_cast<int>(std::lower_bound(v.begin(), v.end(), x) - v.begin());
}

Strategy make_strategy(const Problem& p, const Layout& l, int mb, ScheduleKind k, int vp, const Setting& st) {
  Strategy s;
  s.dp = l.dp;
  s.tp = l.tp;
  s.pp = l.pp;
  s.cp = l.cp;
  s.vp = vp;
  s.zero = st.zero;
  s.micro_batch = mb;
  s.global_batch = p.space.global_batch;
  s.seq_len = p.space.seq_len;
  s.recompute = st.recompute;
  s.sequence_parallel = st.sp;
  s.schedule = k;
  s.dtype = p.space.dtype;
  s.attention = p.space.attention;
  s.fp32_grad_accum = p.space.fp32_grad_accum;
  s.dp_algorithm = st.dpa;
  s.grad_compression = st.gc;
  if (s.uses_ps()) {
    s.ps_servers = p.space.ps_servers;
    s.ps_placement = p.space.ps_placement;
  }
  return s;
}

// What one worker thread keeps between the layouts it searches: the layer costs of every LayerKey
// it has met (predict.hpp; computed the first time a layout needs them, and the same whichever
// thread computes them, so no result depends on which did) and the scratch storage predict writes
// into, so that predicting a layout allocates nothing.
class Worker {
 public:
  explicit Worker(const Problem& p) : slot_(p.tps.size() * p.cps.size() * p.micro_batches.size() * 6, -1) {
    for (StepCosts& c : costs_) c.memoize_chunks = true;
  }

  // Layer costs of (tp, cp, micro-batch index, recompute, sp) of layout `l`. The reference stays
  // valid for the worker's life (a deque does not move its elements as it grows).
  const LayerCosts& layer(const Problem& p, const Layout& l, std::size_t mi, Recompute r, bool sp) {
    const std::size_t i = ((static_cast<std::size_t>(index_of(p.tps, l.tp)) * p.cps.size() + index_of(p.cps, l.cp)) *
                               p.micro_batches.size() + mi) * 6 + static_cast<std::size_t>(r) * 2 + sp;
    if (slot_[i] < 0) {
      const Strategy s = make_strategy(p, l, p.micro_batches[mi], ScheduleKind::one_f_one_b, 1, {0, r, sp});
      slot_[i] = static_cast<int>(keys_.size());
      keys_.push_back(layer_costs(p.graph, p.cluster, p.software, s));
    }
    return keys_[static_cast<std::size_t>(slot_[i])];
  }

  // predict's scratch for a strategy: one per (recompute, sp) -- the settings' innermost digits,
  // so that each sees one layer-cost setting under the ZeRO stages in turn (StepCosts's memos).
  StepCosts& costs(const Strategy& s) { return costs_[static_cast<std::size_t>(s.recompute) * 2 + s.sequence_parallel]; }
  Estimate estimate;  // the last prediction

 private:
  std::array<StepCosts, 6> costs_;
  std::vector<int> slot_;        // index into keys_ by (tp, cp, micro-batch, recompute, sp); -1: not yet
  std::deque<LayerCosts> keys_;  // the layer costs met so far
};

bool has(const std::vector<ScheduleKind>& v, ScheduleKind k) { return std::find(v.begin(), v.end(), k) != v.end(); }

// The (schedule, vp) digits valid for `pp` stages and `m` micro-batches per replica.
int max_vp_for(const Problem& p, int pp) {
  int max_vp = p.graph.model().layers / pp;
  if (p.space.max_vp > 0) max_vp = std::min(max_vp, p.space.max_vp);
  return max_vp;
}

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
  }
}

// How many (schedule, vp) digits for_each_schedule visits.
int count_schedules(const Problem& p, int pp, int m) {
  if (pp == 1) return p.one_f_one_b || p.gpipe ? 1 : 0;
  int n = (p.gpipe ? 1 : 0) + (p.one_f_one_b ? 1 : 0);
  if (p.interleaved && m % pp == 0) n += std::max(0, max_vp_for(p, pp) - 1);
  return n;
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; static_cast<long long>(i) * i <= n; ++i) {
    if (n % i) continue;
    d.push_back(i);
    if (i != n / i) d.push_back(n / i);
  }
  std::sort(d.begin(), d.end());
  return d;
}

int limit(int value, int fallback) { return value > 0 ? value : fallback; }

Problem make_problem(const LayerGraph& g, const Cluster& c, const Software& sw, const SearchSpace& sp, const SearchOptions& o) {
  const ModelSpec& m = g.model();
  if (sp.gpus < 1) throw InputError(fmt::format("--gpus {}: must be >= 1", sp.gpus));
  if (sp.global_batch < 1) throw InputError(fmt::format("--global-batch {}: must be >= 1", sp.global_batch));
  if (static_cast<long long>(sp.global_batch) * sp.seq_len > kMaxTokensPerStep) {
    throw InputError(fmt::format("--global-batch {}: global batch x sequence length ({} x {}) must be at most 2^40 tokens "
                                 "per step",
                                 sp.global_batch, sp.global_batch, sp.seq_len));
  }
  if (sp.seq_len != g.seq_len()) {
    throw InputError(fmt::format("--seq {}: differs from the layer graph's sequence length {}", sp.seq_len, g.seq_len()));
  }
  if (c.gpu.peak(sp.dtype) <= 0) {
    throw InputError(fmt::format("--dtype {}: {} ({}) has no {} peak", to_string(sp.dtype), c.name, c.gpu.name,
                                 to_string(sp.dtype)));
  }
  if (sp.exact_gpus && sp.gpus > c.max_gpus()) {
    throw InputError(fmt::format("--gpus {}: {} has at most {} GPUs", sp.gpus, c.name, c.max_gpus()));
  }
  if (o.top_k < 1) throw InputError(fmt::format("--top {}: must be >= 1", o.top_k));
  if (sp.zero_stages.empty() || sp.recompute.empty() || sp.schedules.empty() || sp.sequence_parallel.empty() ||
      sp.dp_algorithms.empty() || sp.grad_compressions.empty()) {
    throw InputError(
        "search space: zero stages, recompute, schedules, sequence-parallel, dp-algorithm and compression lists must not be empty");
  }
  Problem p{g, c, sw, sp, o, {}, {}, false, false, false, {}, {}, 0, 0, 0, 1, state_bytes(sp.dtype, sp.fp32_grad_accum), {}, {}, {}};
  for (int mb : divisors(sp.global_batch)) {
    if (sp.max_micro_batch <= 0 || mb <= sp.max_micro_batch) p.micro_batches.push_back(mb);
  }
  for (int dp : divisors(sp.global_batch)) {
    std::vector<int>& mis = p.mb_for_dp.emplace_back();
    for (std::size_t mi = 0; mi < p.micro_batches.size(); ++mi)
      if (sp.global_batch % (static_cast<long long>(dp) * p.micro_batches[mi]) == 0) mis.push_back(static_cast<int>(mi));
  }
  p.gpipe = has(sp.schedules, ScheduleKind::gpipe);
  p.one_f_one_b = has(sp.schedules, ScheduleKind::one_f_one_b);
  p.interleaved = has(sp.schedules, ScheduleKind::interleaved);
  for (int z : sp.zero_stages) {
    if (z < 0 || z > 3) throw InputError(fmt::format("search space: ZeRO stage {} must be 0..3", z));
    for (Recompute r : sp.recompute) {
      for (bool on : sp.sequence_parallel) {
        for (DpAlgorithm a : sp.dp_algorithms) {
          if (a != DpAlgorithm::allreduce && z != 0) continue;  // the servers hold the optimizer
          for (const GradCompression& gc : sp.grad_compressions) {
            if (gc.kind == CompressionKind::powersgd && z != 0) continue;
            if (gc.kind == CompressionKind::bf16 && sp.dtype != Dtype::fp32 && !sp.fp32_grad_accum) continue;
            if (!on) p.settings_tp1.push_back({z, r, false, a, gc});
            p.settings_tp.push_back({z, r, on, a, gc});
          }
        }
      }
    }
  }
  // Every (ZeRO stage, DP algorithm, compression) combination excluded above: the flags contradict
  // each other. That is bad input, not a search that found no layout.
  if (p.settings_tp.empty()) {
    auto list = [](const auto& items) {
      std::string out;
      for (const auto& x : items) out += (out.empty() ? "" : ",") + std::string(to_string(x));
      return out;
    };
    throw InputError(fmt::format("--dp-algorithms {}, --grad-compressions {} and --zero {} (--dtype {}, --fp32-grad-accum "
                                 "{}): no combination is valid; parameter servers and PowerSGD need ZeRO 0, bf16 "
                                 "compression needs fp32 gradients",
                                 list(sp.dp_algorithms), list(sp.grad_compressions), fmt::join(sp.zero_stages, ","),
                                 to_string(sp.dtype), sp.fp32_grad_accum ? "on" : "off"));
  }
  // Bound constants. Every matmul op is split at least tp ways; predict times a matmul no faster
  // than its graph FLOPs / matmul_rate_bound() (op_time.hpp).
  for (const auto& op : g.layer_ops()) if (op.matmul) p.layer_matmul_flops_per_token += op.flops_per_token;
  p.matmul_flops_per_token = m.layers * p.layer_matmul_flops_per_token;
  for (auto ops : {g.pre_ops(), g.post_ops()})
    for (const auto& op : ops) if (op.matmul) p.matmul_flops_per_token += op.flops_per_token;
  p.best_matmul_rate = matmul_rate_bound(c, sp.dtype);
  p.send_rate = min_send_rate(p.software, c);
  for (int tp : divisors(std::gcd(std::gcd(m.heads, m.kv_heads), m.ffn_hidden))) {
    if (tp <= limit(sp.max_tp, 1 << 30)) p.tps.push_back(tp);
  }
  for (int cp : divisors(sp.seq_len)) {
    if (cp <= limit(sp.max_cp, 1 << 30) && (cp == 1 || sp.seq_len % (2 * cp) == 0)) p.cps.push_back(cp);
  }
  return p;
}

// Tabulates the stored activation bytes per layer for every (tp, cp, mb, recompute, sp).
void tabulate_activations(Problem& p) {
  p.layer_act.assign(p.tps.size() * p.cps.size() * p.micro_batches.size() * 6, 0.0);
  std::size_t i = 0;
  for (int tp : p.tps)
    for (int cp : p.cps)
      for (int mb : p.micro_batches)
        for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
          for (bool sp : {false, true}) {
            Strategy s;
            s.tp = tp, s.cp = cp, s.micro_batch = mb, s.global_batch = p.space.global_batch;
            s.seq_len = p.space.seq_len, s.recompute = r, s.sequence_parallel = sp && tp > 1;
            s.dtype = p.space.dtype, s.attention = p.space.attention;
            p.layer_act[i++] = stored_layer_activation_bytes(p.graph, s);
          }
}

// The (dp, tp, pp, cp) factorizations of the space: most promising (most GPUs) first.
std::vector<Layout> make_layouts(const Problem& p) {
  const SearchSpace& sp = p.space;
  const Cluster& c = p.cluster;
  const int max_gpus = std::min(sp.gpus, c.max_gpus());
  const int gpn = c.gpus_per_node;
  std::vector<Layout> out;
  const int max_pp = std::min(p.graph.model().layers, limit(sp.max_pp, 1 << 30));
  const std::vector<int> dps = divisors(sp.global_batch);
  for (int tp : p.tps)
    for (int cp : p.cps)
      for (int pp = 1; pp <= max_pp; ++pp) {
        const long long mp = static_cast<long long>(tp) * cp * pp;
        if (mp > max_gpus) break;
        for (std::size_t di = 0; di < dps.size(); ++di) {
          const int dp = dps[di];
          const long long g = mp * dp;
          if (g > max_gpus || dp > limit(sp.max_dp, 1 << 30)) break;
          if (sp.exact_gpus ? g != sp.gpus : (g % gpn != 0 && gpn % g != 0)) continue;
          out.push_back({dp, tp, pp, cp, static_cast<int>(di)});
        }
      }
  std::stable_sort(out.begin(), out.end(), [](const Layout& a, const Layout& b) { return a.gpus() > b.gpus(); });
  return out;
}

// Activation floor, summed over the stages, in units of one layer's stored activations:
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

// Floor of the work of all stages for one micro-batch (summed over stages): forward + backward
// (2x) of every matmul at the best matmul rate, plus the repeated forward of the layers under
// full recomputation.
Seconds work_floor(const Problem& p, int tp, int cp, int mb, bool full_recompute) {
  const double tokens = static_cast<double>(mb) * p.space.seq_len / cp;
  Flops flops = 3 * p.matmul_flops_per_token;
  if (full_recompute) flops += p.graph.model().layers * p.layer_matmul_flops_per_token;
  return flops * tokens / tp / p.best_matmul_rate;
}

// Model-state bytes summed over stages: every parameter is held by some stage, split at least tp
// ways, sharded by ZeRO over dp x cp (memory_model's model_state_bytes, as predict uses it).
// Index 4 (parameter servers): weights and gradients only.
Bytes states_floor(const Problem& p, int dp, int tp, int cp, int zero) {
  StateBytes b = p.state;
  if (zero == 4) b.optimizer = 0;
  return model_state_bytes(p.graph.total_params() / tp, b, zero == 4 ? 0 : zero, static_cast<double>(dp * cp)).total();
}

// A relative margin so that rounding never lifts a bound above the figure it bounds.
constexpr double kMargin = 1 - 1e-9;

struct Bounds {
  Seconds step;
  Bytes memory;
};

// The floors of step time and peak memory (peak >= mean over stages of states + activations +
// the runtime overhead); see the header for the argument.
Bounds bounds(const Problem& p, const Strategy& s, Bytes per_layer_act, const LayerCosts& layer) {
  const int m = s.micro_batches();
  const Seconds step =
      std::max(work_floor(p, s.tp, s.cp, s.micro_batch, s.recompute == Recompute::full) * pipeline_factor(s.pp, m, s.vp),
               step_time_floor(layer, p.send_rate * p2p_time(p.cluster, layer, s.pp, RankLayout(s).stride(Dim::pp)), s.pp,
                               m, s.vp));
  const Bytes memory = p.cluster.runtime_overhead +
                       (states_floor(p, s.dp, s.tp, s.cp, s.uses_ps() ? 4 : s.zero) +
                        activation_floor_layers(p, s.schedule, s.pp, m, s.vp) * per_layer_act) / s.pp;
  return {step * kMargin, memory * kMargin};
}

// Total order of ranked candidates: objective, then fewer GPUs, less memory, then the simpler
// layout (fewest model-parallel ranks, then no CP, shallower pipeline, smaller TP, ...), so that
// among equal predictions the one that is easiest to run comes first.
struct Ranked {
  double value;
  Estimate e;
};
auto layout_key(const Strategy& s) {
  return std::make_tuple(s.tp * s.pp * s.cp, s.cp, s.pp, s.tp, s.vp, s.zero, s.micro_batch,
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
  const std::size_t k = static_cast<std::size_t>(o.top_k);
  if (would_keep(w.top, k, value, e)) {
    keep_best(w.top, k, {value, e});
    if (w.top.size() == k) t.kth = std::min(t.kth, w.top.back().value);
  }
}

// All candidates of one (dp, tp, pp, cp) layout. The bounds are hoisted to the level of the
// odometer they depend on, so whole subtrees are skipped with one test.
void run_layout(const Problem& p, const Layout& l, WorkerResult& w, Worker& worker) {
  const Thresholds& t = w.thresholds;  // tightened by this layout's own finds as it goes
  const auto& settings = l.tp > 1 ? p.settings_tp : p.settings_tp1;
  const std::int64_t per_schedule = static_cast<std::int64_t>(settings.size());
  const int gb = p.space.global_batch;
  const std::vector<int>& mb_indices = p.mb_for_dp[static_cast<std::size_t>(l.dp_index)];  // dp x mb divides gb
  auto count_all = [&] {
    std::int64_t n = 0;
    for (int mi : mb_indices) n += count_schedules(p, l.pp, gb / (l.dp * p.micro_batches[mi]));
    return n * per_schedule;
  };
  if (!p.options.prune) {
    for (const int mi_int : mb_indices) {
      const std::size_t mi = static_cast<std::size_t>(mi_int);
      const int mb = p.micro_batches[mi];
      for_each_schedule(p, l.pp, static_cast<int>(gb / (static_cast<long long>(l.dp) * mb)), [&](ScheduleKind kind, int vp) {
        for (const Setting& st : settings) {
          ++w.stats.candidates;
          evaluate(p, make_strategy(p, l, mb, kind, vp, st), worker.layer(p, l, mi, st.recompute, st.sp), w, worker);
        }
      });
    }
    return;
  }
  const double capacity = p.cluster.gpu.hbm;
  const Bytes overhead = p.cluster.runtime_overhead;
  const int gpus = l.gpus();
  // Per-setting state bytes (by ZeRO stage) and the smallest of them.
  double states[5];
  double min_states = std::numeric_limits<double>::infinity();
  for (int z = 0; z < 5; ++z) states[z] = states_floor(p, l.dp, l.tp, l.cp, z);
  for (const Setting& st : settings) min_states = std::min(min_states, states[st.states()]);
  // Layout level: out of memory with the best ZeRO stage and no activations, or slower than the
  // threshold with one micro-batch and no bubble.
  if ((overhead + min_states / l.pp) * kMargin > capacity) {
    const std::int64_t n = count_all();
    w.stats.candidates += n;
    w.stats.pruned_out_of_memory += n;
    return;
  }
  {
    const int mb0 = p.micro_batches.front();
    const Seconds floor = work_floor(p, l.tp, l.cp, mb0, false) * (gb / (static_cast<double>(l.dp) * mb0)) / l.pp * kMargin;
    if (beaten(p, t, floor, gpus)) {
      const std::int64_t n = count_all();
      w.stats.candidates += n;
      w.stats.pruned_by_bound += n;
      return;
    }
  }
  const std::size_t tp_i = index_of(p.tps, l.tp), cp_i = index_of(p.cps, l.cp);
  const int pp_stride = RankLayout(make_strategy(p, l, p.micro_batches.front(), ScheduleKind::one_f_one_b, 1, settings.front()))
                            .stride(Dim::pp);
  for (const int mi_int : mb_indices) {
    const std::size_t mi = static_cast<std::size_t>(mi_int);
    const int mb = p.micro_batches[mi];
    const int m = gb / (l.dp * mb);
    const Bytes* act = &p.layer_act[((tp_i * p.cps.size() + cp_i) * p.micro_batches.size() + mi) * 6];
    const Seconds work_plain = work_floor(p, l.tp, l.cp, mb, false), work_full = work_floor(p, l.tp, l.cp, mb, true);
    Bytes min_act = std::numeric_limits<double>::infinity();
    for (const Setting& st : settings) min_act = std::min(min_act, act[static_cast<int>(st.recompute) * 2 + st.sp]);
    // Layer costs and pipeline send time by (recompute, sp), looked up only once the cheaper
    // floors have not settled a subtree: step_time_floor (predict.hpp) of a setting.
    const LayerCosts* layer[6] = {};
    Seconds p2p[6];
    auto floor_of = [&](const Setting& st, int vp) {
      const int i = static_cast<int>(st.recompute) * 2 + st.sp;
      if (!layer[i]) {
        layer[i] = &worker.layer(p, l, mi, st.recompute, st.sp);
        p2p[i] = p.send_rate * p2p_time(p.cluster, *layer[i], l.pp, pp_stride);
      }
      return step_time_floor(*layer[i], p2p[i], l.pp, m, vp);
    };
    for_each_schedule(p, l.pp, m, [&](ScheduleKind kind, int vp) {
      w.stats.candidates += per_schedule;
      const double pipe = pipeline_factor(l.pp, m, vp);
      // Subtree level: every setting beaten by the matmul floor (O(1), so tested first), every
      // setting out of memory (O(pp)), or every setting beaten by the layer costs' floor
      // (step_time_floor in predict.hpp).
      if (beaten(p, t, work_plain * pipe * kMargin, gpus)) {
        w.stats.pruned_by_bound += per_schedule;
        return;
      }
      const double floor_layers = activation_floor_layers(p, kind, l.pp, m, vp);
      if ((overhead + (min_states + floor_layers * min_act) / l.pp) * kMargin > capacity) {
        w.stats.pruned_out_of_memory += per_schedule;
        return;
      }
      // step_time_floor depends on the setting only through (recompute, sp): each computed once.
      Seconds floor_by[6];
      bool floor_known[6] = {};
      auto floor_at = [&](const Setting& st) {
        const int i = static_cast<int>(st.recompute) * 2 + st.sp;
        if (!floor_known[i]) {
          floor_by[i] = floor_of(st, vp);
          floor_known[i] = true;
        }
        return floor_by[i];
      };
      double min_floor = std::numeric_limits<double>::infinity();
      for (const Setting& st : settings) min_floor = std::min(min_floor, floor_at(st));
      if (beaten(p, t, min_floor * kMargin, gpus)) {
        w.stats.pruned_by_bound += per_schedule;
        return;
      }
      for (const Setting& st : settings) {
        const Bytes memory = overhead + (states[st.states()] + floor_layers * act[static_cast<int>(st.recompute) * 2 + st.sp]) / l.pp;
        if (memory * kMargin > capacity) {
          ++w.stats.pruned_out_of_memory;
          continue;
        }
        const Seconds step = std::max((st.recompute == Recompute::full ? work_full : work_plain) * pipe, floor_at(st));
        if (beaten(p, t, step * kMargin, gpus)) {
          ++w.stats.pruned_by_bound;
          continue;
        }
        evaluate(p, make_strategy(p, l, mb, kind, vp, st), worker.layer(p, l, mi, st.recompute, st.sp), w, worker);
      }
    });
  }
}

// Merges one layout's result into the search's, in layout order.
void merge(WorkerResult& into, WorkerResult&& w, const SearchOptions& o) {
  for (auto& r : w.top) keep_best(into.top, static_cast<std::size_t>(o.top_k), std::move(r));
  for (auto& r : w.infeasible) keep_best(into.infeasible, static_cast<std::size_t>(std::max(0, o.keep_infeasible)), std::move(r));
  for (const auto& e : w.front) add_to_front(into.front, e);
  into.points.insert(into.points.end(), w.points.begin(), w.points.end());
  SearchStats& st = into.stats;
  st.candidates += w.stats.candidates;
  st.evaluated += w.stats.evaluated;
  st.feasible += w.stats.feasible;
  st.pruned_out_of_memory += w.stats.pruned_out_of_memory;
  st.pruned_by_bound += w.stats.pruned_by_bound;
  for (const auto& [reason, n] : w.reasons) into.reasons[reason] += n;
  Thresholds& t = into.thresholds;
  t.best_step = std::min(t.best_step, w.thresholds.best_step);
  if (into.top.size() == static_cast<std::size_t>(o.top_k)) t.kth = std::min(t.kth, into.top.back().value);
}

}  // namespace

CandidateBounds candidate_bounds(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& s) {
  SearchSpace space;
  space.seq_len = s.seq_len;
  space.global_batch = s.global_batch;
  space.dtype = s.dtype;
  space.attention = s.attention;
  space.fp32_grad_accum = s.fp32_grad_accum;
  const SearchOptions options;
  const Problem p = make_problem(graph, cluster, software, space, options);
  const Bounds b = bounds(p, s, stored_layer_activation_bytes(graph, s), layer_costs(graph, cluster, software, s));
  return {b.step, b.memory};
}

std::vector<Strategy> enumerate_space(const LayerGraph& graph, const Cluster& cluster, const SearchSpace& space) {
  const SearchOptions options;
  const Software none;  // enumeration predicts nothing
  const Problem p = make_problem(graph, cluster, none, space, options);
  std::vector<Strategy> out;
  for (const Layout& l : make_layouts(p)) {
    const auto& settings = l.tp > 1 ? p.settings_tp : p.settings_tp1;
    for (int mb : p.micro_batches) {
      if (space.global_batch % (static_cast<long long>(l.dp) * mb) != 0) continue;
      for_each_schedule(p, l.pp, space.global_batch / (static_cast<long long>(l.dp) * mb), [&](ScheduleKind kind, int vp) {
        for (const Setting& st : settings) out.push_back(make_strategy(p, l, mb, kind, vp, st));
      });
    }
  }
  return out;
}

SearchResult search(const LayerGraph& graph, const Cluster& cluster, const Software& software, const SearchSpace& space,
                    const SearchOptions& options) {
  const auto start = Clock::now();
  Problem p = make_problem(graph, cluster, software, space, options);
  if (options.prune) tabulate_activations(p);
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
    run_layout(p, layouts[i], out, workers[static_cast<std::size_t>(worker)]);
  };
  work.merge = [&](WorkerResult&& w) { merge(all, std::move(w), options); };
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

  SearchResult out;
  std::vector<Ranked>& top = all.top;
  std::vector<Ranked>& infeasible = all.infeasible;
  std::vector<Estimate>& front = all.front;
  SearchStats& st = out.stats;
  st = all.stats;
  for (const auto& [reason, n] : all.reasons) st.infeasible_by_reason[reason] += n;
  for (auto& r : top) {
    out.top_value.push_back(r.value);
    out.top.push_back(std::move(r.e));
  }
  for (auto& r : infeasible) out.infeasible.push_back(std::move(r.e));
  out.points = std::move(all.points);
  const double best_step = all.thresholds.best_step;
  for (auto& e : front) {
    if (e.time.step <= options.pareto_window * best_step) out.pareto.push_back(std::move(e));
  }
  st.layouts = static_cast<int>(layouts.size());
  st.max_gpus_considered = space.exact_gpus ? space.gpus : std::min(space.gpus, cluster.max_gpus());
  st.threads = threads;
  st.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
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
