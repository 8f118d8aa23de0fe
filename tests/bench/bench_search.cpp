// Speed of search().
//   predicts_per_s     full predict() calls per second (also items_per_second)
//   candidates_per_s   candidates settled per second, predicted or proven out by a bound
// The Llama-3-70B cases run on one thread and rate by CPU time: these are per-core figures
// (BM_SearchBruteForceLlama70B's predicts_per_s is "strategy evaluations per second per core",
// kept >= 1M/s).
// BM_Search530B rates by wall time over all its threads; elapsed_s is the search's own wall time
// (search.elapsed_s in trainplan/search/v1).
#include <benchmark/benchmark.h>

#include <thread>

#include "sim/cluster.hpp"
#include "sim/layer_graph.hpp"
#include "sim/model_spec.hpp"
#include "sim/search.hpp"
#include "sim/software.hpp"
#include "default_software.hpp"

namespace {

using namespace trainplan;

void report(benchmark::State& state, const SearchStats& total) {
  state.counters["candidates"] = static_cast<double>(total.candidates) / state.iterations();
  state.counters["predicted"] = static_cast<double>(total.evaluated) / state.iterations();
  state.counters["predicts_per_s"] = benchmark::Counter(static_cast<double>(total.evaluated), benchmark::Counter::kIsRate);
  state.counters["candidates_per_s"] = benchmark::Counter(static_cast<double>(total.candidates), benchmark::Counter::kIsRate);
  state.SetItemsProcessed(total.evaluated);
}

void accumulate(SearchStats& total, const SearchStats& s) {
  total.candidates += s.candidates;
  total.evaluated += s.evaluated;
}

// Brute force on one thread: every candidate predicted. predicts_per_s is evaluations/s/core.
void BM_SearchBruteForceLlama70B(benchmark::State& state) {
  const Cluster c = load_cluster("dgx-h100", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(load_model("llama3-70b", TRAINPLAN_SOURCE_DIR), 8192);
  const SearchSpace sp = default_space(c, 64, 512, 8192);
  SearchOptions o;
  o.prune = false;
  o.threads = 1;
  SearchStats total;
  for (auto _ : state) accumulate(total, search(g, c, sp, o).stats);
  report(state, total);
}
BENCHMARK(BM_SearchBruteForceLlama70B)->Unit(benchmark::kMillisecond);

// The same space with pruning, one thread.
void BM_SearchPrunedLlama70B(benchmark::State& state) {
  const Cluster c = load_cluster("dgx-h100", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(load_model("llama3-70b", TRAINPLAN_SOURCE_DIR), 8192);
  const SearchSpace sp = default_space(c, 64, 512, 8192);
  SearchOptions o;
  o.threads = 1;
  SearchStats total;
  for (auto _ : state) accumulate(total, search(g, c, sp, o).stats);
  report(state, total);
}
BENCHMARK(BM_SearchPrunedLlama70B)->Unit(benchmark::kMillisecond);

// The target: 530B on up to 5,128 A100-80GB (capped at the cluster's 4,480), global
// batch 2520, all cores. elapsed_s is the search's own wall time.
void BM_Search530B(benchmark::State& state) {
  const Cluster c = load_cluster("dgx-a100-80g", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(load_model("mt-nlg-530b", TRAINPLAN_SOURCE_DIR), 2048);  // Narayanan Table 1 shape
  const SearchSpace sp = default_space(c, 5128, 2520, 2048);
  SearchOptions o;
  o.threads = static_cast<int>(state.range(0));
  SearchStats total;
  double elapsed = 0;
  for (auto _ : state) {
    const SearchStats s = search(g, c, sp, o).stats;
    accumulate(total, s);
    elapsed += s.elapsed_s;
  }
  report(state, total);
  state.counters["elapsed_s"] = elapsed / state.iterations();
  state.counters["threads"] = static_cast<double>(o.threads);
}
BENCHMARK(BM_Search530B)
    ->Arg(1)
    ->Arg(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The 530B search as trainplan search runs it, refinement included (the analytic top
// kRefineWindow simulated and re-ranked whatever top_k lists), on one thread.
void BM_Search530BRefined(benchmark::State& state) {
  const Cluster c = load_cluster("dgx-a100-80g", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(load_model("mt-nlg-530b", TRAINPLAN_SOURCE_DIR), 2048);
  const SearchSpace sp = default_space(c, 5128, 2520, 2048);
  SearchOptions o;
  o.threads = 1;
  o.refine = true;
  o.top_k = static_cast<int>(state.range(0));
  SearchStats total;
  for (auto _ : state) accumulate(total, search(g, c, sp, o).stats);
  report(state, total);
}
BENCHMARK(BM_Search530BRefined)->Arg(1)->Arg(10)->Unit(benchmark::kMillisecond);

// DeepSeek-V3 on up to 256 H100s as `trainplan search` runs it by default (README): megatron-core,
// its flex dispatcher, every subset of the model's recomputable modules, refinement; one thread.
void BM_SearchDeepSeekV3(benchmark::State& state) {
  const Cluster c = load_cluster("dgx-h100", TRAINPLAN_SOURCE_DIR);
  const ModelSpec m = load_model("deepseek-v3", TRAINPLAN_SOURCE_DIR);
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 4096);
  SearchSpace sp = default_space(c, 256, 4096, 4096);
  sp.experts.dispatcher = sw.moe.dispatcher;
  sp.experts.recompute_modules = recomputable_modules(m);
  SearchOptions o;
  o.threads = 1;
  o.refine = true;
  o.top_k = 3;
  SearchStats total;
  for (auto _ : state) accumulate(total, search(g, c, sw, sp, o).stats);
  report(state, total);
}
BENCHMARK(BM_SearchDeepSeekV3)->Unit(benchmark::kMillisecond);

}  // namespace
