// Estimate: what predict() says of one strategy. Field names match trainplan/prediction/v1.
#pragma once
#include <string>
#include <vector>

#include "sim/strategy.hpp"
#include "sim/units.hpp"

namespace trainplan {

// A stage's memory at its peak moment (memory_model.hpp): the backward (activations held) or the
// optimizer step (temporaries held, activations freed), whichever is larger.
struct StageMemory {
  int stage = 0;
  Bytes weights = 0, gradients = 0, optimizer = 0, activations = 0, other = 0;
  Bytes weight_copies = 0;  // 16-bit copies of the weights autocast keeps over the step
  Bytes temporaries = 0;    // optimizer temporaries, when the optimizer step is the peak
  Bytes allocator = 0;      // what the caching allocator reserves beyond the tensors (rounding, fragmentation)
  Bytes runtime = 0;        // outside the allocator: the cluster's runtime reserve (CUDA context, NCCL)
  // What the caching allocator holds (torch.cuda.max_memory_reserved's figure).
  Bytes reserved() const { return weights + gradients + optimizer + activations + other + weight_copies + temporaries + allocator; }
  Bytes total() const { return reserved() + runtime; }
};

struct TimeBreakdown {
  Seconds step = 0;
  Seconds compute = 0;          // forward + backward of the busiest stage, all micro-batches
  Seconds recompute = 0;        // extra forward work of recomputation (part of the step)
  Seconds tp_comm = 0;          // tensor-parallel collectives on the critical path
  Seconds cp_comm = 0;          // context-parallel exchange not hidden behind attention
  Seconds ep_comm = 0;          // expert all-to-all (dispatch, combine) on the critical path
  Seconds pp_comm = 0;          // pipeline send/recv on the critical path
  Seconds dp_comm = 0;          // data-parallel / ZeRO traffic, total
  Seconds dp_comm_exposed = 0;  // the part not overlapped with compute
  Seconds bubble = 0;           // pipeline fill and drain
  Seconds optimizer = 0;
};

struct Throughput {
  double tokens_per_s = 0;
  double tokens_per_s_per_gpu = 0;
  // Model FLOPs are 3x the forward FLOPs of the model without recomputation, attention counted
  // as a causal model computes it (half the score matrix: the headline convention), and again
  // counting the whole matrix (the convention of Megatron-LM's and NeMo's published MFU;
  // LayerGraph::forward_flops_per_token_full_attention).
  Flops model_flops_per_step = 0;
  Flops model_flops_per_step_full_attention = 0;
  Flops hardware_flops_per_step = 0;  // FLOPs executed (causal attention), recomputation included
  double model_tflops_per_gpu = 0;
  double hardware_tflops_per_gpu = 0;
  double mfu = 0;                     // model FLOP/s / peak (causal attention)
  double mfu_full_attention = 0;      // model FLOP/s counting full attention / peak
  double hfu = 0;                     // hardware FLOP/s / peak
};

// Why a plan cannot run, as a value; reports/ words it (reports/infeasible.hpp).
enum class InfeasibleReason {
  invalid_strategy,   // the strategy breaks a rule of validate() for the model, or of the layer graph
  unsupported_dtype,  // the GPU has no peak for the strategy's dtype
  cluster_too_small,  // more GPUs than the cluster has
  out_of_memory,      // the fullest stage needs more than the GPU's memory
};
// The short name of a reason, as search counts it: "invalid", "unsupported dtype",
// "cluster too small", "out of memory".
const char* reason_key(InfeasibleReason r);

struct Infeasible {
  InfeasibleReason reason = InfeasibleReason::invalid_strategy;
  // invalid_strategy: the offending field and its rule (validate()'s words, e.g. "--tp 3: ...");
  // unsupported_dtype: the GPU; cluster_too_small: the cluster.
  std::string detail;
  int stage = -1;                     // out_of_memory: the fullest pipeline stage
  double needed = 0, available = 0;   // out_of_memory: bytes; cluster_too_small: GPUs
  double margin = 0;                  // out_of_memory: share of `available` kept free (the software
                                      // profile's safety margin); needed > available x (1 - margin)
};

// Parameter servers (strategy.uses_ps(), param_server.hpp); all zero otherwise.
struct ParamServerFigures {
  int workers = 0;           // replicas that push updates (dp)
  double staleness = 0;      // expected staleness of an applied update, in updates (sync: 0)
  double updates_per_s = 0;  // optimizer updates applied per second (sync: 1 / step; async: W / step)
};

struct Estimate {
  Strategy strategy;
  bool feasible = true;
  std::vector<Infeasible> infeasible;  // why not, when !feasible (at least one)
  Bytes peak_memory = 0;
  Bytes capacity = 0;
  std::vector<StageMemory> per_stage;
  std::vector<int> stage_layers;  // transformer layers on each pipeline stage (all its chunks)
  TimeBreakdown time;
  Throughput throughput;
  ParamServerFigures ps;
};

}  // namespace trainplan
