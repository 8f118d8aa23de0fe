// Measurement: what `trainplan exec` observed when it ran a plan for real. The same breakdown
// names as the prediction's time object (sim/estimate.hpp, trainplan/prediction/v1), measured per
// step and summarised with median and spread. No LibTorch in here: exec fills it, reports write it.
//
// How exec fills it (benchmark practice, DESIGN.md convention 8):
//   1. one StepRecord per *measured* step (warm-up steps are run but not recorded);
//   2. one RankMeasurement per rank (peak memory, per-phase medians over the measured steps);
//   3. environment (devices, backend, library versions, hostname);
//   4. summarize(m) derives step_time, breakdown, per-stage memory and throughput.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/rank_layout.hpp"
#include "sim/strategy.hpp"
#include "sim/units.hpp"

namespace trainplan {

// Median, mean, sample standard deviation, min and max of a set of samples.
struct Spread {
  double median = 0, mean = 0, stdev = 0, min = 0, max = 0;
  int count = 0;
};

// Spread of `samples`. Median of an even count is the mean of the two middle values; stdev is
// the sample standard deviation sqrt(sum (x - mean)^2 / (n - 1)), 0 for fewer than 2 samples.
// All zero (count 0) for no samples.
Spread spread_of(std::vector<double> samples);

// Time of one step (or its median) split by phase. Names follow the prediction's time object:
// compute = forward + backward; each *_comm is time spent waiting in that dimension's
// collectives or send/recv (what the rank could not overlap); bubble = pipeline idle; other =
// the rest of the wall time (data loading, host overhead, timers), so that the phases add up.
struct PhaseTimes {
  Seconds forward = 0;
  Seconds backward = 0;           // without the recomputation inside it
  Seconds recompute = 0;          // forward work re-run during backward
  Seconds tp_comm = 0;
  Seconds cp_comm = 0;
  Seconds pp_comm = 0;
  Seconds ep_comm = 0;            // the experts' token all-to-alls (0 without expert parallelism)
  Seconds dp_comm = 0;            // all data-parallel / ZeRO traffic, overlapped or not
  Seconds dp_comm_exposed = 0;    // the part the rank waited for (not hidden behind backward)
  Seconds bubble = 0;             // idle waiting for a pipeline neighbour
  Seconds optimizer = 0;
  Seconds other = 0;

  Seconds compute() const { return forward + backward; }
};

struct StepRecord {
  int step = 0;          // index among all steps run, warm-up included (first measured = warmup)
  Seconds wall = 0;      // wall time of the step (the slowest rank's, as seen by the reporting rank)
  double loss = 0;       // the global mean loss of the step
  PhaseTimes phases;     // of the busiest rank (largest compute), as in the prediction
};

struct RankMeasurement {
  int rank = 0;
  RankCoord coords;                // from RankLayout(strategy).coord(rank)
  Bytes peak_allocated = 0;        // CUDA caching allocator, max_memory_allocated (0 on CPU)
  Bytes peak_reserved = 0;         // CUDA caching allocator, max_memory_reserved (0 on CPU)
  Bytes max_rss = 0;               // getrusage ru_maxrss of the rank's process (CPU runs)
  PhaseTimes phases;               // median of each phase over the measured steps
  // Bytes per step the rank handed to its data-parallel collectives (gradient reduction, ZeRO
  // gathers) or parameter-server sends, median over the measured steps: the collectives' input
  // sizes, not per-link traffic (a ring all-reduce sends 2(W-1)/W of its input). 0 when unknown.
  Bytes dp_bytes_sent = 0;

  // The figure compared with the predicted per-rank memory: reserved on GPU (the prediction's
  // "other" covers allocator slack), max RSS when no GPU figure was recorded.
  Bytes peak_bytes() const { return peak_reserved > 0 ? peak_reserved : max_rss; }
};

struct StagePeak {
  int stage = 0;
  Bytes peak = 0;        // largest RankMeasurement::peak_bytes() over the ranks of this stage
};

struct MeasuredThroughput {
  double tokens_per_s = 0;             // global_batch * seq_len / median step time
  double tokens_per_s_per_gpu = 0;     // tokens_per_s / ranks
  Flops model_flops_per_step = 0;      // set by exec from the layer graph; 0 when unknown
  double model_tflops_per_gpu = 0;     // model_flops_per_step / median step / ranks / 1e12
};

struct Measurement {
  Strategy strategy;      // as run: its dtype is the one the ranks computed in
  // The --dtype the plan asked for where the run computed in another (CPU ranks compute fp32
  // whatever the plan asks); "" when they are the same.
  std::string requested_dtype;
  std::string model;      // model name (as in the prediction's "model")
  std::string cluster;    // topology name the run is compared with (e.g. "cpu-local")
  std::string software;   // software profile that describes the run ("trainplan-exec"; "" if unknown)
  std::string executor;   // trainplan exec's memory-behaviour fingerprint (exec/exec.hpp
                          // kExecutorFingerprint; "" in other measurements and in those written before it)
  std::string backend;    // "nccl" | "gloo"
  std::string device;     // "cuda" | "cpu"
  int warmup = 0;         // steps run and discarded
  int steps = 0;          // measured steps (= per_step.size())
  long long seed = 0;
  std::vector<StepRecord> per_step;
  std::vector<RankMeasurement> ranks;
  nlohmann::json environment = nlohmann::json::object();  // devices, backend, torch version, host

  // Derived by summarize():
  Spread step_time;                 // over per_step[].wall
  PhaseTimes breakdown;             // per-phase median over per_step[].phases
  std::vector<StagePeak> per_stage; // peak memory per pipeline stage
  Bytes peak_memory = 0;            // largest peak_bytes() over all ranks
  Bytes dp_bytes_sent = 0;          // largest RankMeasurement::dp_bytes_sent (per step)
  MeasuredThroughput throughput;
};

// Sets m.strategy to the plan's `requested` strategy as the runner executes it: on a CPU device
// the ranks compute in fp32 (exec has no 16-bit CPU path), so the strategy says fp32 and
// m.requested_dtype keeps what the plan asked for.
void set_run_strategy(Measurement& m, const Strategy& requested, bool cuda_device);

// Why and where a run failed: `trainplan exec` writes this (with the run's description) instead of
// the figures when a rank fails. Memory figures are at the failure; negative when not known
// (e.g. a rank killed by a signal reports nothing, and on CPU there is no allocator).
struct RunFailure {
  int rank = -1;           // the rank that failed first (-1: unknown)
  int step = -1;           // the step it was in (-1: before its first step)
  std::string phase;       // what it was doing, e.g. "forward (micro-batch 2, chunk 0)"
  std::string error;       // the error, one line
  Bytes allocated = -1;    // CUDA caching allocator: allocated bytes
  Bytes reserved = -1;     // CUDA caching allocator: reserved bytes
  Bytes capacity = -1;     // the device's memory (CPU: the host's RAM)
  Bytes rss = -1;          // the process's resident set (or its last sample)
};

// Median of one phase over steps, e.g. phase_median(steps, &PhaseTimes::forward).
Seconds phase_median(const std::vector<StepRecord>& steps, Seconds PhaseTimes::*phase);
// Per-phase median of a list of per-step phase times.
PhaseTimes phase_medians(const std::vector<PhaseTimes>& samples);

// Fills the derived fields (step_time, breakdown, per_stage, peak_memory, throughput except
// model_flops_per_step, which it keeps) from per_step, ranks and strategy; sets steps.
void summarize(Measurement& m);

}  // namespace trainplan
