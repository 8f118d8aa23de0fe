// The step recorder (see recorder.hpp).
#include "exec/recorder.hpp"

#include <algorithm>
#include <stdexcept>

#include "sim/rank_layout.hpp"

namespace trainplan::exec {

namespace {

// The PhaseTimes fields in the order they are packed.
constexpr Seconds PhaseTimes::*kFields[] = {
    &PhaseTimes::forward, &PhaseTimes::backward, &PhaseTimes::recompute,       &PhaseTimes::tp_comm,
    &PhaseTimes::cp_comm, &PhaseTimes::pp_comm,  &PhaseTimes::ep_comm,         &PhaseTimes::dp_comm,
    &PhaseTimes::dp_comm_exposed, &PhaseTimes::bubble, &PhaseTimes::optimizer, &PhaseTimes::other};
constexpr int kFieldCount = static_cast<int>(std::size(kFields));
constexpr int kPerStep = 2 + kFieldCount;  // wall, the phases, DP bytes
constexpr int kMemory = 3;                 // allocated, reserved, max RSS

PhaseTimes unpack_phases(const double* x) {
  PhaseTimes p;
  for (int i = 0; i < kFieldCount; ++i) p.*kFields[i] = x[i];
  return p;
}

}  // namespace

void StepRecorder::record(Seconds wall, const PhaseTimes& phases, double loss, Bytes dp_bytes) {
  StepRecord r;
  r.wall = wall;
  r.phases = phases;
  r.loss = loss;
  steps_.push_back(r);
  dp_bytes_.push_back(dp_bytes);
}

std::vector<double> StepRecorder::pack(const MemoryFigures& peak) const {
  std::vector<double> row;
  row.reserve(steps_.size() * kPerStep + kMemory);
  for (size_t i = 0; i < steps_.size(); ++i) {
    row.push_back(steps_[i].wall);
    for (auto f : kFields) row.push_back(steps_[i].phases.*f);
    row.push_back(dp_bytes_[i]);
  }
  row.push_back(peak.allocated);
  row.push_back(peak.reserved);
  row.push_back(peak.max_rss);
  return row;
}

Measurement StepRecorder::build(Measurement m, const std::vector<std::vector<double>>& rows) const {
  const int steps = this->steps();
  const size_t want = static_cast<size_t>(steps) * kPerStep + kMemory;
  for (const auto& r : rows)
    if (r.size() != want) throw std::logic_error("StepRecorder::build: ranks recorded different step counts");
  const RankLayout layout(m.strategy);
  const int world = static_cast<int>(rows.size());
  m.per_step.clear();
  m.ranks.clear();
  for (int i = 0; i < steps; ++i) {
    StepRecord r;
    r.step = m.warmup + i;
    r.loss = steps_[i].loss;
    double busiest = -1;
    for (int k = 0; k < world; ++k) {
      const double* x = rows[k].data() + i * kPerStep;
      r.wall = std::max(r.wall, x[0]);
      const PhaseTimes p = unpack_phases(x + 1);
      if (p.compute() > busiest) {
        busiest = p.compute();
        r.phases = p;
      }
    }
    m.per_step.push_back(r);
  }
  for (int k = 0; k < world; ++k) {
    RankMeasurement rm;
    rm.rank = k;
    if (layout.is_worker(k)) rm.coords = layout.coord(k);
    const double* x = rows[k].data();
    std::vector<PhaseTimes> ps;
    std::vector<double> bytes;
    for (int i = 0; i < steps; ++i) {
      ps.push_back(unpack_phases(x + i * kPerStep + 1));
      bytes.push_back(x[i * kPerStep + 1 + kFieldCount]);
    }
    rm.phases = phase_medians(ps);
    rm.dp_bytes_sent = spread_of(bytes).median;
    const double* mem = x + steps * kPerStep;
    rm.peak_allocated = mem[0];
    rm.peak_reserved = mem[1];
    rm.max_rss = mem[2];
    m.ranks.push_back(rm);
  }
  summarize(m);
  return m;
}

}  // namespace trainplan::exec
