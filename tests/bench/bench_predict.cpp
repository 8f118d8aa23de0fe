// Speed of predict(). A 1T-parameter model (Narayanan et al. 2021 Table 1, last row) on
// dgx-a100-80g with its published layout, and an interleaved Llama-3-70B layout on the same cluster.
#include <benchmark/benchmark.h>

#include "sim/cluster.hpp"
#include "sim/layer_graph.hpp"
#include "sim/predict.hpp"
#include "test_helpers.hpp"
#include "default_software.hpp"

namespace {

using namespace trainplan;

void BM_Predict1T(benchmark::State& state) {
  const Cluster c = load_cluster("dgx-a100-80g", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(trainplan::testing::gpt(128, 25600, 160), 2048);
  Strategy s;
  s.tp = 8;
  s.pp = 64;
  s.dp = 6;
  s.micro_batch = 1;
  s.global_batch = 3072;
  s.seq_len = 2048;
  s.recompute = Recompute::full;
  for (auto _ : state) benchmark::DoNotOptimize(predict(g, c, s));
  state.counters["params_T"] = g.total_params() / 1e12;
}
BENCHMARK(BM_Predict1T);

void BM_Predict70BInterleaved(benchmark::State& state) {
  const Cluster c = load_cluster("dgx-a100-80g", TRAINPLAN_SOURCE_DIR);
  const ModelSpec m = load_model("llama3-70b", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 8192);
  Strategy s;
  s.tp = 8;
  s.pp = 4;
  s.vp = 5;
  s.dp = 8;
  s.global_batch = 512;
  s.seq_len = 8192;
  s.schedule = ScheduleKind::interleaved;
  s.recompute = Recompute::selective;
  s.sequence_parallel = true;
  for (auto _ : state) benchmark::DoNotOptimize(predict(g, c, s));
}
BENCHMARK(BM_Predict70BInterleaved);

}  // namespace
