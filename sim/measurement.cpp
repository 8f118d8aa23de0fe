#include "sim/measurement.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace trainplan {

Spread spread_of(std::vector<double> samples) {
  Spread s;
  const std::size_t n = samples.size();
  if (n == 0) return s;
  std::sort(samples.begin(), samples.end());
  s.count = static_cast<int>(n);
  s.min = samples.front();
  s.max = samples.back();
  s.median = n % 2 == 1 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(n);
  if (n >= 2) {
    double ss = 0;
    for (double x : samples) ss += (x - s.mean) * (x - s.mean);
    s.stdev = std::sqrt(ss / static_cast<double>(n - 1));
  }
  return s;
}

namespace {

// Every phase member, so that per-phase loops do not repeat the list.
constexpr Seconds PhaseTimes::*kPhases[] = {
    &PhaseTimes::forward,  &PhaseTimes::backward, &PhaseTimes::recompute,       &PhaseTimes::tp_comm,
    &PhaseTimes::cp_comm,  &PhaseTimes::pp_comm,  &PhaseTimes::ep_comm,         &PhaseTimes::dp_comm,
    &PhaseTimes::dp_comm_exposed, &PhaseTimes::bubble, &PhaseTimes::optimizer, &PhaseTimes::other};

}  // namespace

PhaseTimes phase_medians(const std::vector<PhaseTimes>& samples) {
  PhaseTimes out;
  for (auto member : kPhases) {
    std::vector<double> xs;
    xs.reserve(samples.size());
    for (const PhaseTimes& p : samples) xs.push_back(p.*member);
    out.*member = spread_of(std::move(xs)).median;
  }
  return out;
}

Seconds phase_median(const std::vector<StepRecord>& steps, Seconds PhaseTimes::*phase) {
  std::vector<double> xs;
  xs.reserve(steps.size());
  for (const StepRecord& r : steps) xs.push_back(r.phases.*phase);
  return spread_of(std::move(xs)).median;
}

void summarize(Measurement& m) {
  m.steps = static_cast<int>(m.per_step.size());
  std::vector<double> walls;
  std::vector<PhaseTimes> phases;
  for (const StepRecord& r : m.per_step) {
    walls.push_back(r.wall);
    phases.push_back(r.phases);
  }
  m.step_time = spread_of(std::move(walls));
  m.breakdown = phase_medians(phases);

  std::map<int, Bytes> stage_peak;
  m.peak_memory = 0;
  for (const RankMeasurement& r : m.ranks) {
    Bytes& p = stage_peak[r.coords.pp];
    p = std::max(p, r.peak_bytes());
    m.peak_memory = std::max(m.peak_memory, r.peak_bytes());
  }
  m.dp_bytes_sent = 0;
  for (const RankMeasurement& r : m.ranks) m.dp_bytes_sent = std::max(m.dp_bytes_sent, r.dp_bytes_sent);
  m.per_stage.clear();
  for (const auto& [stage, peak] : stage_peak) m.per_stage.push_back({stage, peak});

  // Tokens per step = global_batch * seq_len (every sequence of the global batch, all replicas).
  const double tokens = static_cast<double>(m.strategy.global_batch) * m.strategy.seq_len;
  const double ranks = static_cast<double>(m.strategy.gpus());
  MeasuredThroughput& t = m.throughput;
  if (m.step_time.median > 0) {
    t.tokens_per_s = tokens / m.step_time.median;
    t.tokens_per_s_per_gpu = t.tokens_per_s / ranks;
    t.model_tflops_per_gpu = t.model_flops_per_step / m.step_time.median / ranks / kTera;
  } else {
    t.tokens_per_s = t.tokens_per_s_per_gpu = t.model_tflops_per_gpu = 0;
  }
}

void set_run_strategy(Measurement& m, const Strategy& requested, bool cuda_device) {
  m.strategy = requested;
  m.requested_dtype.clear();
  if (!cuda_device && requested.dtype != Dtype::fp32) {
    m.strategy.dtype = Dtype::fp32;
    m.requested_dtype = to_string(requested.dtype);
  }
}

}  // namespace trainplan
