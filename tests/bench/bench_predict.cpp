// Speed of predict(). A 1T-parameter model (Narayanan et al. 2021 Table 1, last row) on
// dgx-a100-80g with its published layout, an interleaved Llama-3-70B layout on the same cluster, and
// DeepSeek-V3 (dense, MoE and MTP layer kinds, MLA, expert all-to-all) on 256 H100s with the
// layout trainplan search ranks first for a 4096 x 4096-token batch.
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

void BM_PredictDeepSeekV3(benchmark::State& state) {
  const Cluster c = load_cluster("dgx-h100", TRAINPLAN_SOURCE_DIR);
  const ModelSpec m = load_model("deepseek-v3", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 4096);
  Strategy s;
  s.dp = 8;
  s.tp = 2;
  s.pp = 16;
  s.ep = 8;
  s.zero = 1;
  s.micro_batch = 2;
  s.global_batch = 4096;
  s.seq_len = 4096;
  s.recompute = Recompute::full;
  s.sequence_parallel = true;
  for (auto _ : state) benchmark::DoNotOptimize(predict(g, c, s));
}
BENCHMARK(BM_PredictDeepSeekV3);

}  // namespace
