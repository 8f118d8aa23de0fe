// The step recorder of one rank: what it saw in each measured step (wall time, exclusive phases,
// the step's global loss) and its peak memory. It packs that into one row of numbers for the
// gather over the job, and rank 0 builds the job's Measurement from every rank's row.
// The runner measures; the recorder keeps and assembles; reports/ formats. No LibTorch here.
#pragma once
#include <vector>

#include "sim/measurement.hpp"

namespace trainplan::exec {

// Peak memory of one rank.
struct MemoryFigures {
  Bytes allocated = 0;  // CUDA caching allocator, peak allocated (0 on CPU)
  Bytes reserved = 0;   // CUDA caching allocator, peak reserved (0 on CPU)
  Bytes max_rss = 0;    // the process's maximum resident set
};

class StepRecorder {
 public:
  // One measured step of this rank. `loss` is the step's global mean loss (the same on every rank);
  // `dp_bytes` what the rank handed to its DP (or parameter-server) collectives in the step.
  void record(Seconds wall, const PhaseTimes& phases, double loss, Bytes dp_bytes = 0);
  int steps() const { return static_cast<int>(steps_.size()); }

  // This rank's figures as one row: per step (wall, the 11 PhaseTimes fields, DP bytes), then the
  // memory.
  std::vector<double> pack(const MemoryFigures& peak) const;

  // The job's measurement from every rank's pack() (rows[k] is rank k's; all from recorders with
  // the same number of steps). `header` carries the run's description (strategy, model, cluster,
  // backend, device, warmup, seed, environment, throughput.model_flops_per_step); per step the
  // wall time is the slowest rank's and the phases the busiest rank's (largest compute), per rank
  // the phase medians, DP bytes (median) and memory. Losses are this recorder's. summarize() fills
  // the rest. Ranks beyond the layout's workers (dedicated parameter servers) get zero coords.
  Measurement build(Measurement header, const std::vector<std::vector<double>>& rows) const;

 private:
  std::vector<StepRecord> steps_;
  std::vector<Bytes> dp_bytes_;  // per step
};

}  // namespace trainplan::exec
