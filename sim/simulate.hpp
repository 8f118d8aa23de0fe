// simulate: a discrete-event simulation of one training step of one data-parallel replica.
//
// What is simulated. Every pipeline stage of the replica (all TP/CP ranks of a stage behave the
// same, and every DP replica does the same, so one replica's stages stand for the whole job) has
// four streams:
//   compute      the stage's slots from the Schedule, in order. A slot's duration includes its
//                TP collectives and exposed CP exchange (they sit on the critical path inside the
//                layer); a backward also includes its recomputation (a separate event before it).
//   pp_forward   sends of activations to the next virtual stage (one at a time, p2p each).
//   pp_backward  sends of input gradients to the previous virtual stage.
//   dp           data-parallel / ZeRO collectives, one at a time in issue order: gradient
//                reductions, ZeRO-3 parameter gathers, the ZeRO-1/2 parameter all-gather.
//   ep           the expert all-to-all of an MoE chunk, inside its slots: in a forward the
//                dispatch follows the chunk's work before its experts (attention, router,
//                permutation) and the experts wait for it; the combine follows the experts and the
//                rest of the slot waits for it; a backward runs the same in reverse. Each is the
//                exposed part the closed form charges (ChunkCost::ep_forward / ep_backward, half
//                each), the compute stream idle meanwhile.
// Rules (all costs from StepCosts, see predict.hpp; the simulator reads no Strategy or PlanShape,
// only the costs step_costs derived from them):
//   - a slot starts when the compute stream is free and its input has arrived: a forward of
//     (mb, chunk) on virtual stage k needs stage k-1's forward output plus one p2p transfer; a
//     backward needs stage k+1's input gradient plus one p2p transfer (the last virtual stage
//     starts from its own loss). Sends are asynchronous: the sender's compute does not wait.
//   - zero-bubble schedules (Schedule::split_backward): a backward computes the input gradient
//     (recomputation, TP/CP and half the backward kernels: one of its two matmuls, see
//     predict.cpp op_time) and sends it; the weight-gradient slot does the other half. Gradients
//     then become ready during the weight-gradient slot.
//   - gradient buckets: a chunk's gradients become ready layer by layer during its backward
//     (bucket j of n = max(1, layers) ready at start + (j+1)/n of the slot). ZeRO 0/1 reduce a
//     chunk's gradients once, during its last backward (last micro-batch); where the plan's
//     ZeroPolicy (StepCosts::zero) reduces each micro-batch (ZeRO 2/3) every backward
//     reduce-scatters them.
//   - ZeRO-3 (chunk zero3_gather > 0): the parameters of each slot's chunk are all-gathered on the
//     dp stream as the slot starts (unit by unit ahead of its kernels, as FSDP and exec's
//     DpReducer prefetch), so the gather overlaps the slot, which cannot end before it.
//   - at the end each stage waits for its reductions, runs the optimizer step on the compute
//     stream, then the ZeRO-1/2 all-gather of updated parameters on the dp stream.
//   - parameter servers (costs.ps_servers > 0): the reductions are push/pull events on the dp
//     stream; at the end the stage runs its compression kernels (if any) on the compute stream,
//     then waits for the servers' optimizer step (a ps_update event on Stream::ps_server, counted
//     as the stage's optimizer time).
// The step is the latest end over all stages. Pure: no I/O, no state.
//
// With uniform stages, zero p2p cost and no DP traffic the simulated step is the closed form
// m*W + (p-1)*W/v of Narayanan et al. 2021 Sec. 2.2 (W = per-stage forward+backward of one
// micro-batch); with uneven stages or p2p latency it is longer (tests/sim/test_simulate.cpp).
#pragma once
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "sim/estimate.hpp"
#include "sim/predict.hpp"
#include "sim/schedule.hpp"
#include "sim/units.hpp"

namespace trainplan {

// ps_server: the parameter servers' own stream (their optimizer step on their shards), not one of
// a worker rank's kStreams.
enum class Stream { compute, pp_forward, pp_backward, dp, ep, ps_server };
inline constexpr int kStreams = 5;  // streams of a worker rank

enum class EventKind {
  forward,          // forward of (micro_batch, chunk), TP/CP included          (compute)
  recompute,        // recomputation before a backward                          (compute)
  backward,         // backward of (micro_batch, chunk), TP/CP included; with a
                    // split-backward schedule the input-gradient part only     (compute)
  backward_weight,  // weight-gradient part of a split backward                 (compute)
  optimizer,        // optimizer step                                           (compute)
  send_activation,  // forward output to the next virtual stage                 (pp_forward)
  send_gradient,    // input gradient to the previous virtual stage             (pp_backward)
  grad_reduce,      // gradient all-reduce / reduce-scatter (merged buckets)    (dp)
  zero3_gather,     // ZeRO-3 all-gather of a chunk's parameters for one slot   (dp)
  param_gather,     // ZeRO-1/2 all-gather of updated parameters after the step (dp)
  ps_push_pull,     // parameter servers: push gradients, pull parameters        (dp)
  ps_update,        // parameter servers apply the optimizer to their shards     (ps_server)
  dispatch,         // expert all-to-all: tokens to their experts (or gradients back) (ep)
  combine,          // expert all-to-all: expert outputs back (or their gradients)  (ep)
};

const char* to_string(Stream s);
const char* to_string(EventKind k);

struct Event {
  int stage = 0;         // pipeline stage (every TP/CP rank of the stage runs the same events)
  Stream stream = Stream::compute;
  EventKind kind = EventKind::forward;
  int micro_batch = -1;  // -1 for optimizer and param_gather
  int chunk = -1;        // chunk on the stage (0..v-1); -1 for optimizer and param_gather
  Seconds start = 0, end = 0;
  // For the first compute event of a slot whose input came over a p2p link: the index in
  // Timeline::events of that send (what this slot waited for); -1 otherwise.
  std::ptrdiff_t input_send = -1;
};

// Where one stage's time went. Compute-stream work plus its waits add up to the moment its
// optimizer step ends; after_optimizer more gives `end`.
struct StageUsage {
  int stage = 0;
  Seconds compute = 0;      // forward + backward kernels, all slots
  Seconds recompute = 0;
  Seconds tp = 0;           // TP collectives inside the slots
  Seconds cp = 0;           // exposed CP exchange inside the slots
  Seconds ep = 0;           // exposed expert all-to-all inside the slots
  Seconds optimizer = 0;
  Seconds wait_bubble = 0;  // compute idle until another stage's slot produced its input
  Seconds wait_pp = 0;      // compute idle while its input was in flight, or held by its own p2p sends
  Seconds wait_dp = 0;      // compute idle for ZeRO-3 gathers and for reductions before the optimizer
  Seconds after_optimizer = 0;  // dp collectives still running after the optimizer step (end - its end)
  Seconds dp_interference = 0;  // compute time lost to overlapping dp collectives (overlap_cost_rate)
  Seconds pp_busy = 0;      // pp_forward + pp_backward streams busy
  Seconds dp_busy = 0;      // dp stream busy
  Seconds end = 0;          // end of the stage's last event
  // The compute stream's slots and optimizer (its expert all-to-all waits inside the slots too).
  Seconds busy() const { return compute + recompute + tp + cp + ep + optimizer + dp_interference; }
};

struct Timeline {
  std::vector<Event> events;        // ordered by stage, then issue order per stream
  Seconds step = 0;                 // latest end over all stages
  int ps_servers = 0;               // parameter-server shards (0: none; see Stream::ps_server)
  std::vector<StageUsage> stages;   // per pipeline stage
  // Time the stage's compute stream is idle during the step; share of the step busy and idle.
  // busy() sums the parts in another order than the events' end times were, so a stage busy for
  // the whole step came out 1e-14 s over it (idle_s -1e-14 in the JSON): clamped to [0, step].
  Seconds idle(int stage) const { return std::max(0.0, step - stages.at(stage).busy()); }
  double busy_share(int stage) const { return step > 0 ? std::min(1.0, stages.at(stage).busy() / step) : 0.0; }
  double idle_share(int stage) const { return 1.0 - busy_share(stage); }
  // Streams a worker rank shows: compute, the two pipeline streams, dp, and the ep stream where
  // the step has expert all-to-alls (a dense plan's trace keeps its four tracks per rank).
  int rank_streams() const {
    for (const StageUsage& u : stages)
      if (u.ep > 0) return kStreams;
    return kStreams - 1;
  }
};

// What simulate() keeps of a step: every event (the trace, for `simulate` and its reports), or
// only the per-stage usage and the step (Timeline::events left empty). Both run the same
// simulation -- no time depends on the events kept -- so stages and step are identical; without
// events a step of 10^4 slots needs no memory per slot beyond the schedule (search refinement).
enum class Record { events, usage };

// Simulates one step of `schedule` with `costs` (costs.chunks ordered by virtual stage, one per
// (stage, chunk) of the schedule). Throws std::logic_error (TRAINPLAN_CHECK) on mismatched sizes or a
// schedule that deadlocks.
Timeline simulate(const StepCosts& costs, const Schedule& schedule, Record record = Record::events);

// Global ranks of data-parallel replica 0 that run pipeline stage i: result[i], ascending (all its
// TP and CP ranks), from RankLayout.
std::vector<std::vector<int>> replica_stage_ranks(const Strategy& s);

// Time breakdown of the simulated step, read on the busiest stage (most compute-stream work):
// compute/recompute/tp/cp/optimizer are its work, pp_comm its waits for transfers in flight,
// dp_comm_exposed its waits for ZeRO-3 gathers, for reductions before the optimizer and the
// parameter all-gather after it; bubble is the rest of the step (waits for other stages' work).
// dp_comm is the busiest dp stream of any stage. The fields add up to `step` exactly.
TimeBreakdown simulated_breakdown(const Timeline& t);

// The analytic estimate with its time figures replaced by the simulation's (for
// `predict --engine des` and search refinement): time = simulated_breakdown(simulate(costs,
// schedule)); throughput rescaled by analytic step / simulated step (same FLOPs and tokens per
// step); memory and feasibility unchanged. An estimate without a step time (invalid strategy) is
// returned as is. (It simulates with Record::usage: the estimate needs no events.)
Estimate refine_with_simulation(const Estimate& analytic, const StepCosts& costs, const Schedule& schedule);
// The same from a timeline already simulated.
Estimate refine_with_simulation(const Estimate& analytic, const Timeline& timeline);

// Bound on the simulator's work: it keeps every slot's events (about 3 per slot), so memory grows
// with the 2 x pp x vp x micro-batches slots of a step. Measured on the dev machine (Release,
// llama3-8b, pp 2): 2^20 slots took 0.75 GB peak and 16 s with --trace (a 336 MB trace), i.e.
// ~0.7 KB per slot. The bound, 2^18 slots (~0.2 GB), is 4x the largest step of Narayanan 2021
// Table 1 (tests/data/narayanan2021_table1.json: 1T model, p = 64, m = 512: 65,536 slots).
inline constexpr long long kMaxSimulatedSlots = 1LL << 18;
// The schedule slots of one step of `s`: forward and backward of each micro-batch per chunk per
// stage (the weight-gradient slots of zero-bubble schedules are counted as part of the backward).
long long simulated_slots(const Strategy& s);
// "--global-batch B: ..." naming the flags when simulated_slots(s) > kMaxSimulatedSlots, else nothing.
std::optional<std::string> simulation_size_error(const Strategy& s);

// predict() with its time figures from the simulation, in one call (for search refinement), the
// step costs computed once: costs = step_costs(g, c, s); refine_with_simulation(compose(costs, g,
// c, s), costs, schedule_for(s)). Strategies that cannot be costed come back as predict() returns them.
// Throws InputError (simulation_size_error) for a step too large to simulate.
Estimate predict_with_simulation(const LayerGraph& graph, const Cluster& cluster, const Software& software,
                                 const Strategy& strategy);

}  // namespace trainplan
