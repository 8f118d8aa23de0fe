// Validation against a second stack's published runs: MosaicML llm-foundry's MPT training
// benchmarks (tests/data/llmfoundry_mpt.json, 216 runs of MPT-125M to 70B with Composer and PyTorch
// FSDP on 8-512 A100-40GB, A100-80GB and H100 GPUs; the models are tests/data/mpt/*.json). Nothing
// in trainplan was fitted on these rows. Every run is predicted with the megatron-core profile
// (fused kernels, the default), ZeRO-3 for FSDP FULL_SHARD and ZeRO-2 for SHARD_GRAD_OP, full
// recomputation for activation checkpointing.
//
// What is asserted, and why only that:
//   - the model files: each run's published parameter count (it grows with the learned position
//     table, so it depends on the sequence length) within 0.5%;
//   - memory: every run that ran is predicted to need no more than the GPU's memory (an out of
//     memory prediction for a run that ran would make search drop a real plan);
//   - scaling: the change in tokens/s per GPU from the fewest GPUs of a configuration to more
//     GPUs within 10% of the published change (the ZeRO gathers and reduce-scatters across nodes);
//   - A100 step time at sequences up to 4096 (93 runs): mean absolute error at most 8%, every run
//     within 25% (the worst: MPT-70B on 64 A100-40GB at micro-batch 2, predicted 24% fast, and the
//     near-capacity MPT-1B run of the memory test, 22%).
// Printed, not asserted: the H100 runs and the A100 runs at 8K-64K tokens. The benchmarks ran
// the 2023 flash-attn package (built for A100, not Hopper-tuned) and PyTorch 2.0-2.1 kernels; the
// H100 tables here are PyTorch 2.11 kernels, so trainplan predicts these H100 runs faster than
// they were (MFU 55% against 40% at 2K tokens), by more as attention grows with the sequence.
// That is a different software stack, not a different GPU; a profile of that stack would need
// its kernels measured. Also printed, not asserted: every run under the pytorch-eager profile
// (closer on H100, further on A100: no one shipped profile fits both GPUs' runs).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>

#include "sim/json_reader.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"
#include "sim/software.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

struct MptRun {
  nlohmann::json row;
  ModelSpec model;
  Strategy strategy;
  std::string cluster;
};

std::vector<MptRun> runs() {
  const std::string dir = TRAINPLAN_TEST_DATA_DIR;
  const auto data = read_json_file(dir + "/llmfoundry_mpt.json");
  const std::map<std::string, std::string> clusters{
      {"A100-40GB", "dgx-a100-40g"}, {"A100-80GB", "dgx-a100-80g"}, {"H100-80GB", "dgx-h100"}};
  std::vector<MptRun> out;
  for (const auto& r : data.at("rows")) {
    MptRun run;
    run.row = r;
    run.model = load_model(dir + "/mpt/" + r.at("model").get<std::string>() + ".json", TRAINPLAN_SOURCE_DIR);
    run.cluster = clusters.at(r.at("gpu").get<std::string>());
    Strategy& s = run.strategy;
    s.dp = r.at("gpus");
    s.zero = r.at("sharding") == "FULL_SHARD" ? 3 : 2;
    s.micro_batch = r.at("micro_batch");
    s.global_batch = r.at("global_batch");
    s.seq_len = r.at("seq_len");
    s.recompute = r.at("activation_checkpointing").get<bool>() ? Recompute::full : Recompute::none;
    s.dtype = r.at("precision") == "amp_fp8" ? Dtype::fp8 : Dtype::bf16;
    out.push_back(std::move(run));
  }
  return out;
}

std::string describe(const MptRun& r) {
  return fmt::format("{} {} seq {} on {} x {} mb {}", r.row.at("model").get<std::string>(), r.row.at("precision").get<std::string>(),
                     r.strategy.seq_len, r.strategy.gpus(), r.row.at("gpu").get<std::string>(), r.strategy.micro_batch);
}

// Each predicted with the default (megatron-core) profile unless another is named; one cluster
// load per GPU kind.
struct Predicted {
  MptRun run;
  Estimate e;
};

std::vector<Predicted> predicted(const std::string& software = "megatron-core") {
  const Software sw = load_software(software, TRAINPLAN_SOURCE_DIR);
  std::map<std::string, Cluster> clusters;
  std::vector<Predicted> out;
  for (MptRun& r : runs()) {
    if (!clusters.count(r.cluster)) clusters.emplace(r.cluster, testing::builtin_cluster(r.cluster.c_str()));
    const Estimate e = predict(LayerGraph(r.model, r.strategy.seq_len), clusters.at(r.cluster), sw, r.strategy);
    out.push_back({std::move(r), e});
  }
  return out;
}

TEST(ValidationLlmFoundry, ModelFilesHaveThePublishedParameterCounts) {
  const auto all = runs();
  ASSERT_EQ(all.size(), 216u);
  for (const MptRun& r : all) {
    const double published = r.row.at("num_params");
    const double ours = LayerGraph(r.model, r.strategy.seq_len).total_params();
    EXPECT_NEAR(ours / published, 1.0, 0.005) << describe(r) << ": " << ours << " vs " << published;
  }
}

TEST(ValidationLlmFoundry, EveryRunThatRanFitsInDeviceMemory) {
  int near_capacity = 0;
  for (const Predicted& p : predicted()) {
    EXPECT_LE(p.e.peak_memory, p.e.capacity)
        << describe(p.run) << ": predicted " << p.e.peak_memory / 1e9 << " GB of " << p.e.capacity / 1e9 << " GB";
    if (!p.e.feasible) ++near_capacity;  // within the profile's safety margin of capacity
  }
  // Within the 5% safety margin, so reported infeasible: one run, MPT-1B at 2K on 32 A100-40GB
  // (mb 10): 40.5 of 42.5 GB predicted. It ran 18% slower per GPU than the same configuration on
  // 64 and 128 GPUs, as a run does when the caching allocator has to free and retry near capacity.
  EXPECT_LE(near_capacity, 1);
}

TEST(ValidationLlmFoundry, ThroughputPerGpuScalesAsPublished) {
  // Configurations published at several GPU counts: the ratio of tokens/s per GPU at each count to
  // that at the fewest GPUs, predicted against published.
  using Key = std::tuple<std::string, std::string, int, int, bool, std::string, std::string>;
  std::map<Key, std::vector<Predicted>> groups;
  for (Predicted& p : predicted()) {
    const auto& r = p.run.row;
    groups[{r.at("gpu"), r.at("model"), r.at("seq_len"), r.at("micro_batch"), r.at("activation_checkpointing"),
            r.at("precision"), r.at("sharding")}]
        .push_back(std::move(p));
  }
  int pairs = 0;
  double worst = 0;
  for (auto& [key, g] : groups) {
    if (g.size() < 2) continue;
    std::sort(g.begin(), g.end(), [](const Predicted& a, const Predicted& b) { return a.run.strategy.gpus() < b.run.strategy.gpus(); });
    const Predicted& base = g.front();
    // Left out as a base: the run within the safety margin of capacity (see the memory test), whose
    // published throughput is 18% below the same configuration at 64 and 128 GPUs.
    if (!base.e.feasible) continue;
    for (std::size_t i = 1; i < g.size(); ++i) {
      const double published = g[i].run.row.at("tokens_per_s_per_gpu").get<double>() / base.run.row.at("tokens_per_s_per_gpu").get<double>();
      const double ours = g[i].e.throughput.tokens_per_s_per_gpu / base.e.throughput.tokens_per_s_per_gpu;
      const double err = ours / published - 1;
      std::printf("%-40s %4d -> %4d GPUs: published x%.3f, predicted x%.3f (%+.1f%%)\n", describe(g[i].run).c_str(),
                  base.run.strategy.gpus(), g[i].run.strategy.gpus(), published, ours, 100 * err);
      EXPECT_LT(std::abs(err), 0.10) << describe(g[i].run) << " against " << base.run.strategy.gpus() << " GPUs";
      worst = std::max(worst, std::abs(err));
      ++pairs;
    }
  }
  std::printf("%d pairs, worst %.1f%%\n", pairs, 100 * worst);
  EXPECT_GE(pairs, 35);
}

// Step-time error of one run: published / predicted tokens per second - 1 (positive: predicted slower).
double step_error(const Predicted& p) {
  return p.run.row.at("tokens_per_s_per_gpu").get<double>() / p.e.throughput.tokens_per_s_per_gpu - 1;
}

// The set a run is summarised in: its GPU, and up to 4K tokens or longer.
std::string set_of(const Predicted& p) {
  return fmt::format("{} {}", p.run.row.at("gpu").get<std::string>(), p.run.strategy.seq_len <= 4096 ? "seq <= 4K" : "seq 8K-64K");
}

// Prints each set's mean absolute step error (`label` before the set, `suffix` after the figure).
void print_set_errors(const std::vector<Predicted>& runs, const char* label, const char* suffix) {
  std::map<std::string, std::pair<double, int>> by_set;  // sum of |error|, count
  for (const Predicted& p : runs) {
    auto& v = by_set[set_of(p)];
    v.first += std::abs(step_error(p));
    v.second += 1;
  }
  for (const auto& [set, v] : by_set)
    std::printf("%s%-24s %3d runs, mean absolute step error %.1f%%%s\n", label, set.c_str(), v.second, 100 * v.first / v.second, suffix);
}

TEST(ValidationLlmFoundry, A100StepTimeWithinTolerance) {
  double sum_abs = 0;
  int asserted = 0;
  const std::vector<Predicted> all = predicted();
  for (const Predicted& p : all) {
    const auto& r = p.run.row;
    const double err = step_error(p);
    const bool a100 = r.at("gpu") != "H100-80GB";
    const bool held = a100 && p.run.strategy.seq_len <= 4096;
    std::printf("%-44s published %7.0f tok/s/GPU  predicted %7.0f  step error %+6.1f%%%s\n", describe(p.run).c_str(),
                r.at("tokens_per_s_per_gpu").get<double>(), p.e.throughput.tokens_per_s_per_gpu, 100 * err,
                held ? "" : "  (printed only)");
    if (!held) continue;
    EXPECT_LT(std::abs(err), 0.25) << describe(p.run);
    sum_abs += std::abs(err);
    ++asserted;
  }
  print_set_errors(all, "", "");
  // Printed only, for choosing a profile: the same runs under pytorch-eager (PyTorch-native kernels,
  // no Megatron fusion; Composer + FSDP sits between the two stacks). It is closer on H100 and
  // further on A100, whose tables are derived from H100's (dgx-a100-80g.json ops.source).
  print_set_errors(predicted("pytorch-eager"), "pytorch-eager: ", " (printed only)");
  print_set_errors(predicted("llm-foundry"), "llm-foundry: ", " (printed only)");
  ASSERT_EQ(asserted, 93);
  std::printf("asserted: %d A100 runs at <= 4K tokens, mean absolute error %.1f%%\n", asserted, 100 * sum_abs / asserted);
  EXPECT_LE(sum_abs / asserted, 0.08);
}

// The H100 runs at sequences up to 4096 (56 runs, 8-512 GPUs) under the profile of the stack that
// ran them (software/llm-foundry.json: Composer + FSDP, eager PyTorch modules, flash-attn 2 at the
// FlashAttention-2 H100 rates of dgx-h100.json), the small models (760M-3B, hidden 1536-2560)
// among them. Under megatron-core these runs come out 20.7% fast on average (its fused kernels and
// a Hopper-tuned attention table are not this stack). Tolerance: mean absolute step error at most
// 12% over all of them and over the sub-3B models alone, every run within 25% (the worst today:
// MPT-760M at 4096 tokens, 19.5% fast, with the error growing with the sequence from 1-6% at 512
// tokens: attention, whose 2023 flash-attn the FA3 paper's FlashAttention-2 bars may overstate).
TEST(ValidationLlmFoundry, H100StepTimeUnderItsOwnStackWithinTolerance) {
  double sum_all = 0, sum_small = 0;
  int all = 0, small = 0;
  for (const Predicted& p : predicted("llm-foundry")) {
    if (p.run.row.at("gpu") != "H100-80GB" || p.run.strategy.seq_len > 4096) continue;
    const double err = step_error(p);
    EXPECT_LT(std::abs(err), 0.25) << describe(p.run);
    sum_all += std::abs(err);
    ++all;
    const std::string model = p.run.row.at("model");
    if (model == "mpt-760m" || model == "mpt-1b" || model == "mpt-3b") {
      sum_small += std::abs(err);
      ++small;
    }
  }
  ASSERT_EQ(all, 56);
  ASSERT_EQ(small, 28);
  std::printf("llm-foundry profile, H100 at <= 4K tokens: %d runs, mean absolute step error %.1f%%; 760M-3B: %d runs, %.1f%%\n",
              all, 100 * sum_all / all, small, 100 * sum_small / small);
  EXPECT_LE(sum_all / all, 0.12);
  EXPECT_LE(sum_small / small, 0.12);
}

}  // namespace
}  // namespace trainplan
