// predict: the analytical model of one training step. Pure: no I/O, no state, no exceptions for
// infeasible plans (they come back as Estimate::feasible = false with Infeasible values).
//
// The data flow, one direction:
//
//   flags | plan.json ─► Strategy ─► PlanShape (plan_shape.hpp: tokens, element widths, one
//        GroupLink per parallel group, ZeroPolicy; checked and derived once)
//     ─► layer_costs(graph, shape): one layer's and the end ops' costs per micro-batch (op_time.hpp's
//        kernel times from the cluster's measured tables and the software profile, TP/CP collectives)
//     ─► step_costs(graph, shape, layer costs): StepCosts, per chunk and per step (DP/ZeRO
//        collectives, pipeline sends, optimizer) and the MemoryModel (memory_model.hpp)
//     ─► compose(StepCosts, strategy): Estimate, closed form      (or simulate(): Timeline)
//
//   predict(g, c, sw, s) = cannot_cost(g, c, s) ? that reason : compose(step_costs(g, c, sw, s), g, c, s)
//
// step_costs() is the single source of per-op costs: compose() sums them in closed form and the
// step simulator (simulate.hpp) replays them over the Schedule, so both agree on what each piece of
// work costs; callers that need both (predict --engine des, search refinement, exec's layer split)
// compute the costs once and hand them to each. Memory figures come from memory_model.hpp.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "sim/cluster.hpp"
#include "sim/estimate.hpp"
#include "sim/layer_graph.hpp"
#include "sim/memory_model.hpp"
#include "sim/plan_shape.hpp"
#include "sim/software.hpp"
#include "sim/strategy.hpp"

namespace trainplan {

// Cost of one model chunk (a contiguous range of layers on one pipeline stage) for ONE micro-batch.
struct ChunkCost {
  int stage = 0;               // pipeline stage holding the chunk
  int chunk = 0;               // chunk index on that stage (0..vp-1)
  int first_layer = 0;         // first transformer layer
  int layers = 0;              // transformer layers in the chunk
  LayerGraph::KindCounts kinds{};  // of which each layer kind's (LayerGraph::kind_counts)
  bool has_embedding = false;  // first virtual stage
  bool has_head = false;       // last virtual stage (final norm, LM head, loss)
  Seconds forward = 0;         // forward compute
  Seconds backward = 0;        // backward compute (without recomputation)
  Seconds recompute = 0;       // recomputation done before the backward
  Seconds tp_forward = 0;      // TP collectives in the forward, the part on the critical path (what
                               // the profile's overlap.tp does not hide, plus contention on the rest)
  Seconds tp_backward = 0;     // the same in the backward and its recomputation
  Seconds cp_forward = 0;      // exposed context-parallel exchange, forward
  Seconds cp_backward = 0;     // exposed context-parallel exchange, backward
  Seconds ep_forward = 0;      // exposed expert all-to-all (dispatch and combine), forward
  Seconds ep_backward = 0;     // the same in the backward (and the recomputed forward)
  Seconds expert_forward = 0;  // of forward, the routed experts' GEMMs and activation (between the
  Seconds expert_backward = 0; // dispatch and the combine); of backward, the same
  Bytes grad_bytes = 0;        // gradient bytes this chunk's parameters produce per rank
  double params = 0;           // parameters of the chunk per rank (after TP split; experts after EP)
  double expert_params = 0;    // of which routed experts' (reduced and ZeRO-sharded over EDP)
  Seconds zero3_gather = 0;    // ZeRO-3 all-gather of the chunk's parameters (one pass)
  Seconds dp_reduce = 0;       // reduction of the chunk's gradients over the DP group (once per step)
};

// Compute time lost per second of a collective that overlaps compute, for a stack that hides
// `share` of it on a cluster whose hidden communication slows compute by `slowdown`.
inline double overlap_cost_rate(double share, double slowdown) { return 1 - share + slowdown * share; }

// Seconds of a collective of `comm` seconds left on the critical path when it can overlap `window`
// seconds of compute at `rate` (overlap_cost_rate). The model: the collective runs at its own pace
// and, while it runs, compute advances at 1 - rate (a stack that overlaps nothing, rate 1, waits
// for it). So the compute is slowed by rate x comm, or, where the collective outlasts the
// compute, the collective itself sets the pace and comm - window shows. The step simulator
// advances its compute stream the same way (simulate.cpp, finish_under_dp), so the two engines
// agree where a stream of collectives outlasts the compute it overlaps.
inline Seconds exposed_comm(Seconds comm, Seconds window, double rate) {
  return std::max(rate * comm, comm - std::max(0.0, window));
}

// exposed_comm for a gradient reduction sent in `buckets` equal buckets that become ready evenly
// over a backward of `window` seconds, when nothing runs after it (the step's last backward): the
// last bucket (comm / buckets) starts as the backward ends and shows in full; the others have
// the backward after the first bucket to hide in. The simulator's reduce_gradients.
inline Seconds bucketed_exposed_comm(Seconds comm, Seconds window, int buckets, double rate) {
  const double n = std::max(1, buckets);
  const Seconds tail = comm / n;
  return tail + exposed_comm(comm - tail, window - window / n, rate);
}

// The least compose() charges per second of a pipeline send: 1 on the 1F1B/GPipe chain, the
// stack's interleaved overlap rate under interleaving (step_time_floor's bound uses it).
inline double min_send_rate(const Software& sw, const Cluster& c) {
  return std::min(1.0, overlap_cost_rate(sw.overlap.pp_interleaved, c.collectives.overlap_slowdown));
}

// The costs of one plan's step: what compose() sums in closed form and simulate() replays. A
// result: it holds no cache (step_costs' memo is the caller's StepMemo).
struct StepCosts {
  std::vector<ChunkCost> chunks;   // ordered by virtual stage: chunks[chunk * pp + stage]
  // The memory model of the strategy under the software profile (memory_model.hpp): its tensor
  // accounting, allocator and safety margin decide compose()'s memory and out-of-memory verdict.
  MemoryModel memory;
  Seconds p2p = 0;                 // one activation (or gradient) send between adjacent stages
  Seconds optimizer = 0;           // optimizer step on the busiest stage (on the servers with
                                   // parameter servers), plus gradient-compression kernels
  int ps_servers = 0;              // parameter-server shards (0: none); dp_reduce is then push + pull
                                   // and the optimizer runs on the servers
  Seconds compression = 0;         // gradient-compression kernels on the busiest stage (in optimizer)
  Seconds dp_param_gather = 0;     // ZeRO 1/2 all-gather of updated parameters after the step
  ZeroPolicy zero;                 // the plan's ZeRO policy: when the DP/ZeRO collectives run
                                   // (reduce_each_micro_batch: every backward reduce-scatters)
  int zero3_backward_gathers = 1;  // ZeRO-3 gathers of a chunk before its backward: 2 where the
                                   // stack gathers again for the recomputed forward and again for
                                   // the backward (Software::zero3.regathers_for_recompute)
  Overlap overlap;                 // share of each DP/ZeRO collective the software hides behind compute
  double pp_overlap = 0;           // share of each p2p send hidden behind compute under this schedule
  double overlap_slowdown = 0;     // compute slowdown per second of hidden communication (cluster)
  // Compute time lost per second of a collective that runs while compute could run: the share the
  // stack cannot hide (1 - share) blocks compute, the hidden rest slows it by the contention share.
  // compose() (analytic) and simulate() (per event) both charge overlapped communication at this rate.
  double overlap_cost_rate(double share) const { return trainplan::overlap_cost_rate(share, overlap_slowdown); }
  Flops hardware_flops_per_micro_batch_per_replica = 0;  // recomputation included
  Flops model_flops_per_micro_batch_per_replica = 0;  // causal attention (the headline MFU's)
  Flops model_flops_full_attention_per_micro_batch_per_replica = 0;  // full attention (Megatron's)
  // The pieces the chunks are summed from, per micro-batch on one rank: one transformer layer of
  // each kind (LayerGraph::kind), the ops before the first layer (embedding) and after the last
  // (final norm, LM head, loss, and MTP modules). Only the time and params fields are set. For
  // per-layer reports (layer_detail.hpp).
  std::array<ChunkCost, LayerGraph::kMaxKinds> kinds;
  std::array<LayerKind, LayerGraph::kMaxKinds> layer_kinds{};  // what each kind is (LayerGraph::kind)
  int kind_count = 1;
  ChunkCost embedding, head;
  int head_mtp_layers = 0;  // the MTP modules `head` includes (ModelSpec::mtp_layers)
};

// What step_costs() may keep between calls to skip work whose inputs did not change, owned by the
// caller (search's worker keeps one per scratch; one thread uses it). A search predicts many
// strategies with the same layer costs and chunk count, each layer-cost setting under every ZeRO
// stage in turn: the layer split (partition_layers) is a pure function of a few inputs, and the
// chunks' fields that depend on neither ZeRO nor the DP group are left as the last call wrote them
// into the same StepCosts when every input of those fields is the same, bit for bit. Nothing in it
// is part of a result; only step_costs reads or writes its fields.
struct StepMemo {
  struct Split {
    int layers = -1, chunks = -1;
    bool uniform_modules = false;  // Software::parallel.pipeline_uniform_modules
    unsigned accounts = 0;         // Strategy::pipeline_accounts
    std::array<double, LayerGraph::kMaxKinds> kind_cost{};  // one layer's cost of each kind
    double first_extra = 0, last_extra = 0;
    std::vector<int> split;
  };
  std::array<Split, 8> splits;  // the splits computed last, with their inputs
  int next_split = 0;           // entry to replace next (round robin)
  using ChunkKey = std::array<std::uint64_t, 31>;
  // The StepCosts whose chunks the fields below describe (nullptr: none). Its chunks must not be
  // written by anything else between two step_costs calls (compose and simulate only read them).
  const StepCosts* chunks_of = nullptr;
  ChunkKey chunk_key{};        // the inputs of those chunks' memoized fields (step_costs, predict.cpp)
  double busiest_params = 0;   // the most parameters a stage of them holds
  double busiest_expert_params = 0;  // of which routed experts
};

// Where predict() writes a step when it predicts many in a row (search): the costs and the memo of
// how they were last written, kept together so that the memo always describes these costs.
struct PredictScratch {
  StepCosts costs;
  StepMemo memo;
};

// Costs of one transformer layer of one kind for one micro-batch on one rank.
struct LayerCost {
  Seconds forward = 0, backward = 0, recompute = 0, tp_forward = 0, tp_backward = 0, cp_forward = 0,
          cp_backward = 0;
  Seconds ep_forward = 0, ep_backward = 0;  // exposed expert all-to-all (MoE layers)
  Seconds expert_forward = 0, expert_backward = 0;  // of forward, backward: the routed experts' part
  double params = 0;         // per rank
  double expert_params = 0;  // of which routed experts' (after EP x ETP)
  Flops flops = 0;           // forward FLOPs per rank
  Flops recompute_flops = 0;
  Seconds total() const {
    return forward + backward + recompute + tp_forward + tp_backward + cp_forward + cp_backward + ep_forward + ep_backward;
  }
};

// The ops before the first layer (embedding) or after the last (final norm, head, loss), one
// micro-batch on one rank.
struct EndCost {
  Seconds forward = 0, backward = 0, tp_forward = 0, tp_backward = 0;
  double params = 0;
  double expert_params = 0;  // the MTP modules' routed experts
  Flops flops = 0;
  Seconds total() const { return forward + backward + tp_forward + tp_backward; }
};

// The strategy fields one rank's per-micro-batch work depends on: the TP/CP/SP split, the
// micro-batch, recomputation, sequence length, dtype, attention kernel, the expert layout (ep,
// etp, imbalance, capacity, dispatcher, module recomputation), and where the TP, CP and expert
// groups sit (their rank strides; the EDP group's size too, which a stage's dp sets). pp, vp,
// ZeRO, the schedule and the global batch are not in it.
struct LayerKey {
  int tp = 1, cp = 1, micro_batch = 1, seq_len = 0;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  Dtype dtype = Dtype::bf16;
  Attention attention = Attention::flash;
  int tp_stride = 1, cp_stride = 1;
  int ep = 1, etp = 1, ep_stride = 1, etp_stride = 1;
  double moe_imbalance = 1, capacity_factor = 0;
  Dispatcher dispatcher = Dispatcher::alltoall;
  unsigned recompute_modules = 0;
  bool moe_a2a_overlap = false;
  bool operator==(const LayerKey&) const = default;
};
LayerKey layer_key(const PlanShape& shape);
LayerKey layer_key(const Strategy& s);

// What one rank's work for one micro-batch costs, for every strategy with the same LayerKey: one
// layer, the end ops, and the TP gather after a pipeline send. step_costs() composes a step from
// it; search computes it once per key and predicts the many layouts that share it from it (the
// result is the same as computing it anew: predict stays a function of its inputs).
struct LayerCosts {
  LayerKey key;
  int layers = 0;              // transformer layers of the model
  int kind_count = 1;          // layer kinds (LayerGraph::kind_count)
  std::array<LayerCost, LayerGraph::kMaxKinds> kinds;  // one layer of each kind
  LayerGraph::KindCounts kind_layers{};                // the model's layers of each kind
  EndCost pre, post;           // without the tied-embedding copy of the last stage (step_costs adds
                               // it); post holds the MTP modules, their layers included
  Bytes hidden_message = 0;    // one tokens x hidden activation tensor of the micro-batch
  Bytes p2p_message = 0;       // what one rank sends to the next pipeline stage: hidden_message / tp
                               // (Megatron's scatter/gather; with SP the tensor is already split),
                               // or all of it (Software::parallel.pipeline_send_scatter_gather false)
  Seconds p2p_tp_gather = 0;   // receiver's TP all-gather after a scattered pipeline send (tp > 1, no SP):
                               // a call of its own, so it pays the per-call overhead as every call does
  // Activation bytes of one layer of each kind for memory_model(): as stored between forward and
  // backward, and the working set of a layer being recomputed (full recomputation, the largest
  // kind's; else 0).
  std::array<Bytes, LayerGraph::kMaxKinds> stored_layer{};
  Bytes working_layer = 0;
  Flops model_forward_flops_per_token = 0;  // LayerGraph::forward_flops_per_token() (causal)
  Flops model_forward_flops_per_token_full_attention = 0;  // ..._full_attention()
  // Work of one micro-batch summed over every chunk of a replica: the layers of each kind x its
  // total() + pre.total() + post.total() (the sum over stages of compose()'s per-stage work is at
  // least this).
  Seconds replica_work() const {
    Seconds w = 0;
    for (int k = 0; k < kind_count; ++k) w += kind_layers[k] * kinds[k].total();
    return w + pre.total() + post.total();
  }
  // The cheapest layer's total() (every layer's in a model of one kind).
  Seconds min_layer_total() const {
    Seconds t = kinds[0].total();
    for (int k = 1; k < kind_count; ++k) t = std::min(t, kinds[k].total());
    return t;
  }
};
LayerCosts layer_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software, const PlanShape& shape);
// The same for a strategy that passes cannot_shape() (its shape built here).
LayerCosts layer_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software,
                       const Strategy& strategy);

// Per-op costs of a plan from layer costs computed for its LayerKey (checked), written into `out`
// (its storage is reused: no allocation once it has held a step of as many chunks), with `memo`
// (StepMemo) kept for the next call.
void step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software, const PlanShape& shape,
                const LayerCosts& layer, StepMemo& memo, StepCosts& out);
// The same without a memo kept.
void step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software, const PlanShape& shape,
                const LayerCosts& layer, StepCosts& out);
// Per-op costs of `strategy`, which must pass cannot_cost() (its shape and layer costs built here).
StepCosts step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software,
                     const Strategy& strategy);

// One activation (or gradient) send between adjacent pipeline stages over the pipeline group `pp`
// (PlanShape's groups.pp), for a micro-batch with these layer costs (StepCosts::p2p; 0 with one
// stage): the send, one call, and with TP but no SP the receiver's TP all-gather.
Seconds p2p_time(const GroupLink& pp, const LayerCosts& layer);
// The same for `pp` stages `pp_stride` ranks apart (pipeline_group()).
Seconds p2p_time(const Cluster& cluster, const LayerCosts& layer, int pp, int pp_stride);

// A floor of compose()'s step time for any strategy with these layer costs, pipeline send time
// `p2p`, `pp` stages, `m` micro-batches per replica and `vp` chunks per stage. With W_i stage i's
// work per micro-batch in compose (its layers' costs, end ops, p2p sends, exposed ZeRO
// traffic), S = sum W_i >= replica_work + (2 vp pp - 2) p2p and M = max W_i >= max(S / pp,
// ceil(layers / pp) x layer.total() + (2 vp - 1) p2p) (some stage holds ceil(layers / pp) layers
// and makes at least 2 vp - 1 sends per micro-batch), and
// compose's step >= m M + (S - M) / vp = M (m - 1/vp) + S / vp, increasing in M as m >= 1 >= 1/vp,
// under interleaving (vp > 1). With one chunk per stage the 1F1B fill and drain can be less than
// the other stages' work (one_f_one_b_bubble). Its step is at least S (the last stage's m
// micro-batches after every earlier stage's first), and at least m M + max(0, S - M - k M / 2),
// k = min(pp - 1, m - 1): of the busiest stage's terms, P + max(0, X - P - k f) + max(0, X - P -
// k g) with X = S - M, f + g = M, is least at f = g = M / 2 and P = X - k M / 2 (it grows in M and
// S, as m - 1 >= k). GPipe charges the other stages' whole work, more than either.
Seconds step_time_floor(const LayerCosts& layer, Seconds p2p, int pp, int m, int vp);

// The floor above with M = S / pp, per second of S (search's coarser floors use it):
// (m + (pp - 1) / vp) / pp under interleaving; with one chunk per stage
// max(1, (m + max(0, pp - 1 - k / 2)) / pp), k = min(pp - 1, m - 1).
inline double pipeline_factor(int pp, int m, int vp) {
  if (vp > 1) return (m + static_cast<double>(pp - 1) / vp) / pp;
  const double k = std::min(pp - 1, m - 1);
  return std::max(1.0, (m + std::max(0.0, pp - 1 - k / 2)) / pp);
}

// The 1F1B schedule's fill and drain with stages of unequal work (stage j: forward f_j, backward
// g_j, all its work w_j = f_j + g_j per micro-batch; k_j = p - 1 - j later stages, S_j = their summed work):
// stage j starts when the first micro-batch reaches it and ends when the last backward has gone
// back to stage 0 (the earlier stages' work, P_j); before its first backward it runs its k_j
// warm-up forwards while the first micro-batch goes through the later stages and back (it waits
// S_j - k_j f_j where that is positive), and in the cool-down its k_j last backwards wait for the
// last micro-batch's round trip (S_j - k_j g_j), k_j at most m - 1. The step is the largest of
//   m w_j + P_j + max(0, S_j - k_j f_j) + max(0, S_j - k_j g_j)
// and the bubble what it adds to the busiest stage's m w_b. Equal stages give (p - 1) w: the
// (p-1)/m bubble of Narayanan et al. 2021. Where later stages are lighter the busiest waits less
// than their whole work, as the step simulator finds.
// With fewer micro-batches than stages there is no steady state to wait around (stage j's warm-up
// takes min(p - 1 - j, m) forwards, all of them where m <= p - 1 - j), and unequal stages make
// the expression above overshoot; the step is then the schedule's critical path, computed exactly
// (one_f_one_b_critical_path: p m < p^2 operations), up to 2^20 (stage, micro-batch) pairs.
Seconds one_f_one_b_bubble(std::span<const double> w, std::span<const double> f, std::span<const double> g, int m,
                           Seconds busiest);

// The step of the 1F1B schedule (make_schedule's order, schedule.hpp: stage j's min(p - 1 - j, m)
// warm-up forwards, then a forward and a backward in turn, then the remaining backwards), with stage j's
// forward taking f_j and backward g_j per micro-batch, and each slot waiting for the same
// micro-batch on the stage before (forward) or after (backward): the longest path of that graph.
Seconds one_f_one_b_critical_path(std::span<const double> f, std::span<const double> g, int m);

// Transformer layers per virtual stage (pp*vp chunks), contiguous, balanced by predicted time with
// the embedding on the first and the LM head on the last chunk.
std::vector<int> partition_layers(int layers, int chunks, double layer_cost, double first_extra,
                                  double last_extra);
// The same for layers of different costs (`layer_costs`, one per layer): the split whose busiest
// chunk (its layers' costs plus its extra) is least, found by bisection on that load with a greedy
// fill from prefix sums (feasible(T): each chunk in turn takes the most layers that keep it within
// T and leave one for each chunk after it). With equal costs it balances as well as the form above.
std::vector<int> partition_layers(std::span<const double> layer_costs, int chunks, double first_extra,
                                  double last_extra);
// Transformer layers per chunk as a stack that cuts its list of modules into equal counts splits
// them (Software::parallel.pipeline_uniform_modules): the list is the embedding, the `layers`
// transformer layers, the final norm and the LM head (layers + 3 modules); each chunk takes
// (layers + 3) / chunks of them in order, the first (layers + 3) % chunks one more (Aleph Alpha's
// scaling, pipe_partition_uniform; DeepSpeed's PipelineModule partition_method="uniform"). Empty
// where a chunk would get no transformer layer (the caller then splits by time).
std::vector<int> uniform_module_split(int layers, int chunks);

// Why `strategy` cannot be costed at all: cannot_shape()'s reason (it fails validate() against
// graph.model() or validate_on() the cluster: invalid_strategy; the GPU has no peak for its dtype:
// unsupported_dtype), or its seq_len differs from graph.seq_len() (invalid_strategy). nullopt when a
// PlanShape may be built and step_costs() called.
std::optional<Infeasible> cannot_cost(const LayerGraph& graph, const Cluster& cluster, const Strategy& strategy);

// The analytical estimate from costs already computed by step_costs(graph, cluster, strategy)
// (the strategy must pass cannot_cost()). Pure; adds cluster_too_small and out_of_memory reasons.
Estimate compose(const StepCosts& costs, const LayerGraph& graph, const Cluster& cluster, const Strategy& strategy);
// The same, written into `out` (its vectors' storage is reused).
void compose(const StepCosts& costs, const LayerGraph& graph, const Cluster& cluster, const Strategy& strategy,
             Estimate& out);

// The analytical estimate: cannot_cost()'s reason as an infeasible estimate, or
// compose(step_costs(...)) of the strategy's PlanShape.
Estimate predict(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& strategy);
// The same from layer costs computed for the strategy's LayerKey, written into `out`, with
// `scratch` holding the step costs and their memo: no allocation once both have held a step of
// this size (search).
void predict(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& strategy,
             const LayerCosts& layer, PredictScratch& scratch, Estimate& out);

}  // namespace trainplan
