// Speed of the step simulator (1F1B with pp = 64 and m = 512 well under a second).
// Costs are built by hand: uniform stages with p2p latency and gradient reductions, so the
// benchmark measures the simulator, not predict().
#include <benchmark/benchmark.h>

#include "sim/schedule.hpp"
#include "sim/simulate.hpp"
#include "default_software.hpp"

namespace {

using namespace trainplan;

StepCosts bench_costs(int p, int v, int layers_per_chunk, bool zero2) {
  StepCosts c;
  for (int k = 0; k < p * v; ++k) {
    ChunkCost x;
    x.stage = k % p;
    x.chunk = k / p;
    x.layers = layers_per_chunk;
    x.forward = 10e-3 / v;
    x.backward = 20e-3 / v;
    x.tp_forward = 1e-3 / v;
    x.tp_backward = 1e-3 / v;
    x.dp_reduce = 5e-3 / v;
    c.chunks.push_back(x);
  }
  c.p2p = 0.2e-3;
  c.optimizer = 3e-3;
  c.zero = ZeroPolicy::of(zero2 ? 2 : 0);
  return c;
}

// Arguments: pp, micro-batches.
void BM_Simulate1F1B(benchmark::State& state) {
  const int p = static_cast<int>(state.range(0)), m = static_cast<int>(state.range(1));
  const StepCosts c = bench_costs(p, 1, 2, false);
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, p, m);
  std::size_t events = 0;
  for (auto _ : state) {
    Timeline t = simulate(c, s);
    events = t.events.size();
    benchmark::DoNotOptimize(t);
  }
  state.counters["events"] = static_cast<double>(events);
  state.counters["slots/s"] = benchmark::Counter(2.0 * p * m, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Simulate1F1B)->Args({64, 512})->Args({8, 64})->Unit(benchmark::kMillisecond);

// Interleaved, ZeRO-2 per-micro-batch reductions in per-layer buckets (the most events per slot).
void BM_SimulateInterleavedZero2(benchmark::State& state) {
  const int p = static_cast<int>(state.range(0)), m = static_cast<int>(state.range(1)), v = 4;
  const StepCosts c = bench_costs(p, v, 2, true);
  const Schedule s = make_schedule(ScheduleKind::interleaved, p, m, v);
  for (auto _ : state) benchmark::DoNotOptimize(simulate(c, s));
}
BENCHMARK(BM_SimulateInterleavedZero2)->Args({64, 512})->Unit(benchmark::kMillisecond);

// Building the schedule itself, which the simulator's callers do once per plan.
void BM_MakeSchedule1F1B(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(make_schedule(ScheduleKind::one_f_one_b, 64, 512));
}
BENCHMARK(BM_MakeSchedule1F1B)->Unit(benchmark::kMillisecond);

}  // namespace
