// search: enumerate every valid layout of one model on one cluster, predict each, rank them.
//
// The space is (dp, tp, pp, cp) -- every factorization whose GPU count fits the limits -- times a
// small odometer over micro-batch, schedule (with vp), ZeRO stage, recomputation, sequence
// parallelism, DP algorithm and compression (search_space.hpp). Each candidate is checked with
// predict() (or a caller-given evaluator). Work is split over threads by layout, in rounds
// (search_scheduler.hpp): a layout prunes against the thresholds of the layouts merged in earlier
// rounds (in layout order) and its own finds, so every count and figure is the same for any
// thread count and timing.
//
// Pruning never changes the result. A candidate is skipped without predicting it only when
//  - a lower bound of its peak memory (model states + a floor of its activations) exceeds the GPU
//    memory: it is provably out of memory (counted as pruned_out_of_memory), or
//  - a lower bound of its objective is worse than the K-th best found so far, and its step-time
//    bound exceeds the Pareto window (pareto_window x best step time): it can enter neither the
//    top K nor the reported Pareto front (counted as pruned_by_bound). The step-time bound is the
//    larger of matmul FLOPs at the GPU's best rate times the pipeline factor (cheap, tested first)
//    and step_time_floor() of the candidate's layer costs (predict.hpp: its layers, end ops and
//    pipeline sends as predict costs them, without DP/ZeRO traffic and the optimizer). The
//    floors are in search_bounds.hpp. (K here is the list the analytic search keeps: top_k, or
//    with refinement the window of max(top_k, kRefineWindow) candidates the simulator re-ranks.)
// Layer costs are computed once per LayerKey by each worker thread (predict.hpp), so predicting a
// layout costs only its composition; results are the same as predict()'s.
// tests/sim/test_search.cpp checks pruned == brute force and bound <= predict on small spaces.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/cluster.hpp"
#include "sim/software.hpp"
#include "sim/estimate.hpp"
#include "sim/layer_graph.hpp"
#include "sim/strategy.hpp"

namespace trainplan {

enum class Objective { throughput, cost, time };
const char* to_string(Objective o);
std::optional<Objective> parse_objective(const std::string& s);

// The expert part of a search space (models with experts only; a dense model's space must keep
// these defaults): expert-parallel sizes ep dividing the experts up to max_ep (0: no limit) that
// fold over a layout (etp x ep divides tp x cp x dp), each with etp 1 (etp_one) and etp = tp
// (etp_tp); and what every candidate shares (strategy.hpp): the routing imbalance (candidates with
// ep below it are not enumerated; ep 1 is balanced), capacity factor, dispatcher, all-to-all
// overlap (ep > 1 only). Module recomputation: the modules a candidate may recompute with
// recomputation none or selective; every subset of them is a setting of its own (the empty set,
// none, included), so the search picks which to recompute.
struct ExpertSpace {
  int max_ep = 0;
  bool etp_one = true, etp_tp = true;
  double moe_imbalance = 1, capacity_factor = 0;
  Dispatcher dispatcher = Dispatcher::alltoall;
  bool moe_a2a_overlap = false;
  unsigned recompute_modules = 0;
  bool operator==(const ExpertSpace&) const = default;
};

// What to enumerate. Limits of 0 mean "no limit beyond what validate() allows".
struct SearchSpace {
  int gpus = 1;                 // GPUs available
  bool exact_gpus = false;      // use exactly `gpus`; otherwise any count up to it in whole nodes
                                // (or a divisor of one node)
  int global_batch = 1;         // sequences per step
  int seq_len = 0;              // tokens per sequence (must equal the layer graph's)
  int max_tp = 0, max_pp = 0, max_cp = 0, max_dp = 0, max_vp = 0, max_micro_batch = 0;
  std::vector<int> zero_stages{0, 1, 2, 3};
  std::vector<Recompute> recompute{Recompute::none, Recompute::selective, Recompute::full};
  // gpipe gives the same predicted step time as 1f1b with at least its memory, so it is left out
  // unless asked for.
  std::vector<ScheduleKind> schedules{ScheduleKind::one_f_one_b, ScheduleKind::interleaved};
  std::vector<bool> sequence_parallel{false, true};  // true only where tp > 1
  Dtype dtype = Dtype::bf16;
  Attention attention = Attention::flash;
  bool fp32_grad_accum = false;
  CudaGraphs cuda_graphs = CudaGraphs::none;  // every candidate's (Strategy::cuda_graphs)
  unsigned cuda_graph_modules = 0;  // every candidate's (Strategy::cuda_graph_modules); full
                                    // recomputation is then not tried (validate() refuses it)
  // How replicas combine gradients (strategy.hpp). The default space keeps the all-reduce and no
  // compression; callers opt in to parameter servers (with ps_servers/ps_placement for all of
  // them) and compressions. Combinations validate() refuses (PS or PowerSGD with ZeRO > 0, bf16
  // with 16-bit gradients) are not enumerated.
  std::vector<DpAlgorithm> dp_algorithms{DpAlgorithm::allreduce};
  std::vector<GradCompression> grad_compressions{GradCompression{}};
  int ps_servers = 1;
  PsPlacement ps_placement = PsPlacement::dedicated;
  ExpertSpace experts;  // models with experts
};

// Whether every candidate of the space recomputes whole layers (its recompute list holds full
// alone): none has modules left to recompute.
bool only_full_recompute(const SearchSpace& space);

// Default limits for a cluster: tp and cp within one scale-up domain (a node, or a 72-GPU NVLink
// rack: Cluster::scale_up_gpus), cp only while each rank keeps at least
// 1024 tokens, vp up to 8. With flash attention, selective recomputation (recomputing the
// attention core) is what the fused kernel already does -- predict gives it the figures of no
// recomputation -- so it is only listed with standard attention. Callers override single fields.
SearchSpace default_space(const Cluster& c, int gpus, int global_batch, int seq_len,
                          Attention attention = Attention::flash);

// Refinement (SearchOptions::refine) re-ranks the analytic ranking's first
// max(top_k, kRefineWindow) feasible candidates by their simulated objective
// (predict_with_simulation) and lists the best top_k of them. The window does not shrink with
// top_k, so for any top_k <= kRefineWindow the list is the first top_k entries of one and the
// same re-ranked window: --top 1 names the best layout of --top 10. (When only the analytic top
// K were simulated, --top 1 reported the analytic best, which the simulator often puts behind
// another of the top few.) A larger top_k widens the window with it, so its best can only be
// better.
// Why a fixed window and not "simulate until no unsimulated candidate's lower bound can beat the
// simulated best": the step-time floors lie up to ~5% below predict's step time, and the
// simulated step is up to ~16% longer than predict's (or up to ~1.5% shorter), so that
// certificate needs every candidate whose floor is under the simulated best simulated: tens to
// hundreds per search (530B on 4,480 A100s: over 130 among the analytic top 200), far beyond the
// planner's time budget. Why 10: it is the default --top, so the default search simulates no more
// than before; and in nine spaces tried when this was written (megatron-core; GPT-3 175B on 64
// and 1,024 A100-80GB, MT-NLG 530B on 4,480 A100-80GB, Llama 3.1 405B on 1,024 H100, Llama 3 70B
// on 64 H100, Llama 2 70B on 128 A100-80GB, GPT-3 20B on 64 A100-40GB, Llama 2 7B on 16 and
// Llama 3 8B on 64 H100) the simulator's best of the analytic top 200 was among the analytic top 4.
inline constexpr int kRefineWindow = 10;

struct SearchOptions {
  Objective objective = Objective::throughput;
  int top_k = 10;
  // Re-rank with the discrete-event step simulator (see kRefineWindow); the listed entries then
  // carry simulated time figures. Pruning and the Pareto front stay on the analytic model, which
  // the bounds are proven against.
  bool refine = false;
  int threads = 0;              // 0: all hardware threads
  bool prune = true;            // false: predict every candidate (brute force, for tests)
  // The reported Pareto front (step time vs peak memory) is exact for step times up to
  // pareto_window x the best step time (candidates beyond it may be pruned, and are not reported).
  double pareto_window = 1.25;
  int keep_infeasible = 3;      // best infeasible candidates kept, with their reasons
  // Replaces predict() (tests). Must be thread-safe; pruning assumes it agrees with predict's
  // memory and compute floors, so tests with a fake evaluator set prune = false.
  std::function<Estimate(const Strategy&)> evaluate;
  // Called from the calling thread 10 times a second once a search has run 0.2 s, and once at
  // the end if it was called before: (layouts done, layouts in all).
  std::function<void(std::int64_t, std::int64_t)> progress;
  // Keep (step time, peak memory) of every feasible candidate predicted in SearchResult::points
  // (for the report's scatter plot; 16 bytes per candidate).
  bool keep_points = false;
};

struct SearchStats {
  std::int64_t candidates = 0;            // valid strategies in the space
  std::int64_t evaluated = 0;             // predicted in full
  std::int64_t feasible = 0;              // of those evaluated
  std::map<InfeasibleReason, std::int64_t> infeasible_by_reason;  // of those evaluated, by first reason
  std::int64_t pruned_out_of_memory = 0;  // memory bound above capacity: infeasible, not predicted
  Bytes least_memory_floor = 0;           // of those, the smallest memory bound per GPU (0: none pruned)
  std::int64_t pruned_by_bound = 0;       // objective bound worse than the K-th best: not predicted
  int layouts = 0;                        // (dp, tp, pp, cp) factorizations enumerated
  int max_gpus_considered = 0;            // min(gpus, the cluster's size)
  double elapsed_s = 0;
  int threads = 1;
  int refined = 0;                        // candidates simulated to rank the top list (the
                                          // refinement window; the top entries are the best of them)
};

struct SearchResult {
  std::vector<Estimate> top;        // best first, by the objective
  std::vector<double> top_value;    // objective value of each (see objective_value)
  std::vector<Estimate> pareto;     // feasible, non-dominated in (step time, peak memory), by step time
  std::vector<Estimate> infeasible; // best infeasible by step time, with their reasons
  // With SearchOptions::keep_points: every feasible candidate predicted (pruned ones are not),
  // as (step time, peak memory), in layout order (the same for any thread count).
  std::vector<std::pair<Seconds, Bytes>> points;
  SearchStats stats;
};

// Re-evaluates every top entry with the discrete-event step simulator (predict_with_simulation)
// and re-ranks them by `o` (search() with SearchOptions::refine calls it on its refinement window).
// Sets stats.refined. Throws InputError (simulation_size_error) if an entry is too large to simulate.
void refine_top_with_simulation(SearchResult& r, const LayerGraph& graph, const Cluster& cluster, const Software& software,
                                Objective o, int threads = 0);  // 0: all hardware threads

// The figure ranked by `o`, lower is better: step time (s) for time, minus tokens/s for
// throughput, USD per step (price per GPU-hour x GPUs x step time / 3600 s/h) for cost. The one
// place the objective is computed: ranking uses it on estimates, pruning on step-time floors.
double objective_value(Objective o, Seconds step, double tokens_per_s, int gpus, const Cluster& c);
// The same for an estimate: its step time, tokens/s and GPUs.
double objective_value(Objective o, const Estimate& e, const Cluster& c);

// Searches `space` for `graph`'s model on `cluster`. Throws InputError if the space is empty of
// valid layouts' prerequisites (seq_len differs from the graph's, gpus < 1, ...).
SearchResult search(const LayerGraph& graph, const Cluster& cluster, const Software& software, const SearchSpace& space,
                    const SearchOptions& options = {});

// Every valid candidate of `space` in enumeration order (for tests and for counting).
std::vector<Strategy> enumerate_space(const LayerGraph& graph, const Cluster& cluster, const SearchSpace& space);

// Lower bounds used for pruning (exposed for tests: each must never exceed predict's figure).
struct CandidateBounds {
  Seconds step = 0;      // <= predict(...).time.step
  Bytes peak_memory = 0; // <= predict(...).peak_memory
};
CandidateBounds candidate_bounds(const LayerGraph& graph, const Cluster& cluster, const Software& software,
                                 const Strategy& s);

}  // namespace trainplan
