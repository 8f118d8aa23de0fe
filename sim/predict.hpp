// predict: the analytical model of one training step. Pure: no I/O, no state, no exceptions for
// infeasible plans (they come back as Estimate::feasible = false with Infeasible values).
//
//   predict(g, c, sw, s) = cannot_cost(g, c, s) ? that reason : compose(step_costs(g, c, sw, s), g, c, s)
//
// The software profile (software.hpp) says what the training stack launches for each op; op
// times come from the cluster's measured kernel tables (op_time.hpp).
//
// step_costs() is the single source of per-op costs: compose() sums them in closed form and the
// step simulator (simulate.hpp) replays them over the Schedule, so both agree on what each piece of
// work costs; callers that need both (predict --engine des, search refinement, exec's layer split)
// compute the costs once and hand them to each. Memory figures come from memory_model.hpp.
#pragma once
#include <optional>
#include <vector>

#include "sim/cluster.hpp"
#include "sim/estimate.hpp"
#include "sim/layer_graph.hpp"
#include "sim/memory_model.hpp"
#include "sim/software.hpp"
#include "sim/strategy.hpp"

namespace trainplan {

// Cost of one model chunk (a contiguous range of layers on one pipeline stage) for ONE micro-batch.
struct ChunkCost {
  int stage = 0;               // pipeline stage holding the chunk
  int chunk = 0;               // chunk index on that stage (0..vp-1)
  int first_layer = 0;         // first transformer layer
  int layers = 0;              // transformer layers in the chunk
  bool has_embedding = false;  // first virtual stage
  bool has_head = false;       // last virtual stage (final norm, LM head, loss)
  Seconds forward = 0;         // forward compute
  Seconds backward = 0;        // backward compute (without recomputation)
  Seconds recompute = 0;       // recomputation done before the backward
  Seconds tp_forward = 0;      // TP collectives in the forward (not overlapped)
  Seconds tp_backward = 0;     // TP collectives in backward and its recomputation
  Seconds cp_forward = 0;      // exposed context-parallel exchange, forward
  Seconds cp_backward = 0;     // exposed context-parallel exchange, backward
  Bytes grad_bytes = 0;        // gradient bytes this chunk's parameters produce per rank
  double params = 0;           // parameters of the chunk per rank (after TP split)
  Seconds zero3_gather = 0;    // ZeRO-3 all-gather of the chunk's parameters (one pass)
  Seconds dp_reduce = 0;       // reduction of the chunk's gradients over the DP group (once per step)
};

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
  bool zero_reduce_per_micro_batch = false;  // ZeRO 2/3 reduce-scatter gradients every micro-batch
  Overlap overlap;                 // share of each DP/ZeRO collective the software hides behind compute
  double overlap_slowdown = 0;     // compute slowdown per second of hidden communication (cluster)
  Flops hardware_flops_per_micro_batch_per_replica = 0;  // recomputation included
  Flops model_flops_per_micro_batch_per_replica = 0;
};

// Per-op costs of `strategy` (assumed valid for the graph's model; see validate()).
StepCosts step_costs(const LayerGraph& graph, const Cluster& cluster, const Software& software,
                     const Strategy& strategy);

// Transformer layers per virtual stage (pp*vp chunks), contiguous, balanced by predicted time with
// the embedding on the first and the LM head on the last chunk.
std::vector<int> partition_layers(int layers, int chunks, double layer_cost, double first_extra,
                                  double last_extra);

// Why `strategy` cannot be costed at all: it fails validate() against graph.model(), its seq_len
// differs from graph.seq_len() (invalid_strategy), or the GPU has no peak for its dtype
// (unsupported_dtype). nullopt when step_costs() may be called.
std::optional<Infeasible> cannot_cost(const LayerGraph& graph, const Cluster& cluster, const Strategy& strategy);

// The analytical estimate from costs already computed by step_costs(graph, cluster, strategy)
// (the strategy must pass cannot_cost()). Pure; adds cluster_too_small and out_of_memory reasons.
Estimate compose(const StepCosts& costs, const LayerGraph& graph, const Cluster& cluster, const Strategy& strategy);

// The analytical estimate: cannot_cost()'s reason as an infeasible estimate, or
// compose(step_costs(...)).
Estimate predict(const LayerGraph& graph, const Cluster& cluster, const Software& software, const Strategy& strategy);

}  // namespace trainplan
