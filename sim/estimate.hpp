// Estimate: what predict() says of one strategy. Field names match trainplan/prediction/v1.
#pragma once
#include <string>
#include <vector>

#include "sim/strategy.hpp"
#include "sim/units.hpp"

namespace trainplan {

struct StageMemory {
  int stage = 0;
  Bytes weights = 0, gradients = 0, optimizer = 0, activations = 0, other = 0;
  Bytes total() const { return weights + gradients + optimizer + activations + other; }
};

struct TimeBreakdown {
  Seconds step = 0;
  Seconds compute = 0;          // forward + backward of the busiest stage, all micro-batches
  Seconds recompute = 0;        // extra forward work of recomputation (part of the step)
  Seconds tp_comm = 0;          // tensor-parallel collectives on the critical path
  Seconds cp_comm = 0;          // context-parallel exchange not hidden behind attention
  Seconds pp_comm = 0;          // pipeline send/recv on the critical path
  Seconds dp_comm = 0;          // data-parallel / ZeRO traffic, total
  Seconds dp_comm_exposed = 0;  // the part not overlapped with compute
  Seconds bubble = 0;           // pipeline fill and drain
  Seconds optimizer = 0;
};

struct Throughput {
  double tokens_per_s = 0;
  double tokens_per_s_per_gpu = 0;
  Flops model_flops_per_step = 0;     // 3x forward FLOPs of the model, no recomputation
  Flops hardware_flops_per_step = 0;  // FLOPs actually executed, recomputation included
  double model_tflops_per_gpu = 0;
  double hardware_tflops_per_gpu = 0;
  double mfu = 0;                     // model FLOP/s / peak
  double hfu = 0;                     // hardware FLOP/s / peak
};

struct Estimate {
  Strategy strategy;
  bool feasible = true;
  std::vector<std::string> infeasible_reasons;
  Bytes peak_memory = 0;
  Bytes capacity = 0;
  std::vector<StageMemory> per_stage;
  std::vector<int> stage_layers;  // transformer layers on each pipeline stage (all its chunks)
  TimeBreakdown time;
  Throughput throughput;
};

}  // namespace trainplan
