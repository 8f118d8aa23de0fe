// Validation against published runs: Narayanan et al. 2021 (SC'21) Table 1, ten GPT models from
// 1.7B to 1T parameters on up to 3072 A100s (tests/data/narayanan2021_table1.json), predicted as
// the command line predicts them: the megatron-lm-2021 profile loaded by name, the rows' layout
// (fp16, full recomputation, materialised attention scores), nothing changed in code.
// Tolerances: every row within 10% of the published iteration time, mean absolute error at most 5%.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include <cmath>
#include <nlohmann/json.hpp>

#include "sim/json_reader.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"
#include "test_helpers.hpp"
#include "default_software.hpp"

namespace trainplan {
namespace {

// The sizes of a published row's "layout" as the paper and MLPerf row files spell them ("tp",
// "pp", "dp", "cp", "vp", "micro_batch", "global_batch"); the rest of the strategy is the test's.
Strategy layout_sizes(const nlohmann::json& l) {
  Strategy s;
  s.tp = l.at("tp");
  s.pp = l.at("pp");
  s.dp = l.at("dp");
  s.cp = l.at("cp");
  s.vp = l.at("vp");
  s.micro_batch = l.at("micro_batch");
  s.global_batch = l.at("global_batch");
  return s;
}

TEST(ValidationNarayanan2021, StepTimeWithinTolerance) {
  const auto data = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/narayanan2021_table1.json");
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  // The stack of these runs (software/megatron-lm-2021.json: no TP, DP or pipeline overlap, the
  // unfused loss), as `trainplan predict --software megatron-lm-2021` loads it.
  const Software sw = load_software("megatron-lm-2021", TRAINPLAN_SOURCE_DIR);
  double sum_abs = 0;
  int rows = 0;
  for (const auto& r : data.at("rows")) {
    const auto& mj = r.at("model");
    const auto& l = r.at("layout");
    // Megatron GPT: MHA, 4h MLP, GeLU, LayerNorm, learned positions, tied embeddings.
    ModelSpec m = testing::gpt(mj.at("layers"), mj.at("hidden"), mj.at("heads"), mj.at("seq_len"), mj.at("vocab"));
    Strategy s = layout_sizes(l);
    s.zero = l.at("zero_stage");
    s.seq_len = m.seq_len;
    s.recompute = Recompute::full;
    s.schedule = s.vp > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b;
    s.dtype = Dtype::fp16;
    s.attention = Attention::standard;  // 2021 Megatron materialised the attention scores
    ASSERT_EQ(s.gpus(), r.at("num_gpus").get<int>());
    const Estimate e = predict(LayerGraph(m, m.seq_len), c, sw, s);
    ASSERT_TRUE(e.feasible) << mj.dump() << ": " << (e.infeasible.empty() ? "" : reason_key(e.infeasible[0].reason));
    const double published = r.at("measured").at("iteration_time_s");
    const double err = (e.time.step - published) / published;
    std::printf("%8.1fB  %5d GPUs  predicted %7.2f s  published %7.2f s  error %+5.1f%%  (%.0f vs %.0f TFLOP/s)\n",
                mj.at("params_b").get<double>(), s.gpus(), e.time.step, published, 100 * err,
                e.throughput.hardware_tflops_per_gpu, r.at("measured").at("tflops_per_gpu").get<double>());
    EXPECT_LT(std::abs(err), 0.10) << fmt::format("{}B params: predicted {:.2f} s, published {:.2f} s",
                                                   mj.at("params_b").get<double>(), e.time.step, published);
    sum_abs += std::abs(err);
    ++rows;
  }
  ASSERT_EQ(rows, 10);
  const double mae = sum_abs / rows;
  std::printf("mean absolute error %.2f%%\n", 100 * mae);
  EXPECT_LE(mae, 0.05);
}

// Published FP8 pre-training throughput on DGX H100, one row per run: predicted tokens/s per GPU
// against the published figure with the megatron-core profile. Prints every row; returns the mean
// absolute relative error and checks each row against `row_tolerance`. A row's "zero" is its
// ZeRO stage (default 1, Megatron's distributed optimizer).
// Rows the model misses by more than the row tolerance today, keyed "model gpus", with what is not
// modelled. They are held to a wider bound so that they cannot get worse unnoticed; the target
// (every row within tolerance) is NOT met for them.
const std::map<std::string, std::pair<double, const char*>> kKnownMisses = {
    {"gpt3-5b 64", {0.30, "tp 1 FP8: the per-GPU GEMMs are the full 4096-wide layer, where the FP8 rule (16-bit table at "
                          "half the reduction) gives about 1.9x the 16-bit rate, more than FP8 training reaches; the "
                          "GPT-3 recipe's 0.1 attention dropout inside the flash kernel is not costed"}},
};

// The layout of one published NVIDIA FP8 row: its tp, pp, cp, vp, micro-batch, global batch and
// sequence; DP from the GPU count; ZeRO-1 (the distributed optimizer) unless the row says;
// sequence parallelism with TP; the interleaved schedule where vp > 1.
Strategy nvidia_fp8_layout(const nlohmann::json& r) {
  Strategy s;
  s.tp = r.at("tp");
  s.pp = r.at("pp");
  s.cp = r.at("cp");
  s.vp = r.at("vp");
  s.dp = r.at("gpus").get<int>() / (s.tp * s.pp * s.cp);
  s.zero = r.value("zero", 1);
  s.micro_batch = r.at("micro_batch");
  s.global_batch = r.at("global_batch");
  s.seq_len = r.at("seq_len");
  s.sequence_parallel = s.tp > 1;
  s.schedule = s.vp > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b;
  s.dtype = Dtype::fp8;
  return s;
}

double fp8_h100_throughput_error(const std::string& file, int expected_rows, double row_tolerance) {
  const auto data = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/" + file);
  const Cluster c = testing::builtin_cluster("dgx-h100");
  double sum_abs = 0;
  int rows = 0;
  for (const auto& r : data.at("rows")) {
    const ModelSpec m = load_model(r.at("model").get<std::string>(), TRAINPLAN_SOURCE_DIR);
    const Strategy s = nvidia_fp8_layout(r);
    EXPECT_EQ(s.gpus(), r.at("gpus").get<int>()) << r.dump();
    const Estimate e = predict(LayerGraph(m, s.seq_len), c, s);
    EXPECT_TRUE(e.feasible) << r.dump();
    if (!e.feasible) continue;
    const double published = r.at("tokens_per_s_per_gpu");
    const double err = (e.throughput.tokens_per_s_per_gpu - published) / published;
    const auto known = kKnownMisses.find(m.name + " " + std::to_string(s.gpus()));
    std::printf("%-13s %4d GPUs  predicted %8.0f tokens/s/GPU  published %8.0f  error %+5.1f%%%s%s\n",
                m.name.c_str(), s.gpus(), e.throughput.tokens_per_s_per_gpu, published, 100 * err,
                known != kKnownMisses.end() ? "  KNOWN MISS: " : "", known != kKnownMisses.end() ? known->second.second : "");
    EXPECT_LT(std::abs(err), known != kKnownMisses.end() ? known->second.first : row_tolerance) << r.dump();
    sum_abs += std::abs(err);
    ++rows;
  }
  EXPECT_EQ(rows, expected_rows);
  const double mae = rows > 0 ? sum_abs / rows : 1;
  std::printf("mean absolute error %.2f%%\n", 100 * mae);
  return mae;
}

// NeMo 24.12's published FP8 pre-training throughput on DGX H100 (tests/data/nemo2412_h100_fp8.json,
// nine rows from 8 to 512 GPUs). Not fitted on: a check that the H100 tables, the FP8 GEMM rule
// (the 16-bit table at a reduction dimension shortened by the fp8/bf16 peak ratio, op_time.cpp) and
// the megatron-core profile stay in range on runs at scale.
// Tolerances: every row within 20% of the published tokens/s per GPU, mean absolute error <= 12%.
TEST(ValidationNemo2412, Fp8ThroughputOnH100WithinTolerance) {
  EXPECT_LE(fp8_h100_throughput_error("nemo2412_h100_fp8.json", 9, 0.20), 0.12);
}

// Megatron-Bridge's published DGX-H100 rows of its 25.09, 25.11 and 26.02 containers
// (tests/data/megatron_bridge_h100_fp8.json: Llama 3 8B with Megatron FSDP on 8 GPUs, 70B on 64 and
// 405B on 1,024). The FP8 GEMM rule has no fitted constant; these rows (and NeMo 24.12's) were
// compared with a plain 1.5-2.0x FP8 GEMM speedup while the rule was chosen, and a single factor
// could not fit both the small and the large models. Tolerances: every row within 15%, mean
// absolute error <= 8% (the fidelity target for published runs).
TEST(ValidationMegatronBridge, Fp8ThroughputOnH100WithinTolerance) {
  EXPECT_LE(fp8_h100_throughput_error("megatron_bridge_h100_fp8.json", 8, 0.15), 0.08);
}

// Megatron's model FLOPs of 2024 (megatron/training/training.py num_floating_point_operations,
// and NeMo's flops_formulas.py until 2025-08-09): full attention, 12 FLOPs per weight per token
// and the logits, per global batch.
// Model TFLOP/s per GPU as Megatron-LM and NeMo publish them: FLOPs counting full attention.
double full_attention_tflops_per_gpu(const Estimate& e, const Strategy& s) {
  return e.throughput.model_flops_per_step_full_attention / e.time.step / s.gpus() / 1e12;
}

double megatron_model_flops(const ModelSpec& m, double global_batch, double seq) {
  const double h = m.hidden, L = m.layers;
  const double mlp = (m.activation == Activation::swiglu ? 1.5 : 1.0) * m.ffn_hidden / h;
  return 12.0 * global_batch * seq * L * h * h * (1 + double(m.kv_heads) / m.heads + seq / h + mlp + m.vocab / (2 * L * h));
}

// The Megatron-LM README's weak-scaling table (tests/data/megatron_lm_h100_bf16_weak_scaling.json:
// GPT 1.7B on 48 H100s to 462B on 6,144, BF16, TP and DP communication overlapped): per-GPU
// TFLOP/s predicted against published, as step time. The megatron-core profile's overlap.tp share
// was chosen with these rows among others, so they check the rest of the model, not that share.
// Tolerances: every row within 20%, mean absolute error <= 10%. Three rows are outside 10% today
// (step error, positive: predicted slower): the two smallest (1.7B -10.8%, 7.1B -10.5%: predicted
// fast, as NeMo's small FP8 models are) and 32B (+16.4%: tp 8 without pipelining and 48-way DP
// across nodes at 4 micro-batches per step, where trainplan leaves about 160 ms of gradient
// reduce-scatter and parameter all-gather exposed that the run evidently hid).
TEST(ValidationMegatronLm, H100Bf16WeakScalingWithinTolerance) {
  const auto data = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/megatron_lm_h100_bf16_weak_scaling.json");
  const Cluster c = testing::builtin_cluster("dgx-h100");
  double sum_abs = 0;
  int rows = 0;
  for (const auto& r : data.at("rows")) {
    const ModelSpec m = testing::gpt(r.at("layers"), r.at("hidden"), r.at("heads"), 4096, 131072);
    Strategy s;
    s.tp = r.at("tp");
    s.pp = r.at("pp");
    s.dp = r.at("dp");
    s.zero = 1;
    s.micro_batch = 1;
    s.global_batch = r.at("global_batch");
    s.seq_len = 4096;
    s.sequence_parallel = s.tp > 1;
    s.dtype = Dtype::bf16;
    ASSERT_EQ(s.gpus(), r.at("gpus").get<int>()) << r.dump();
    const Estimate e = predict(LayerGraph(m, s.seq_len), c, s);
    EXPECT_TRUE(e.feasible) << r.dump();
    EXPECT_NEAR(e.throughput.model_flops_per_step_full_attention / megatron_model_flops(m, s.global_batch, s.seq_len), 1.0, 1e-3) << r.dump();
    const double published = r.at("tflops_per_gpu");
    const double err = published / full_attention_tflops_per_gpu(e, s) - 1;  // step time: positive = predicted slower
    std::printf("%-5s %5d GPUs tp%d pp%-2d  predicted %5.1f TFLOP/s/GPU  published %5.1f  step error %+6.1f%%\n",
                r.at("model").get<std::string>().c_str(), s.gpus(), s.tp, s.pp, full_attention_tflops_per_gpu(e, s), published, 100 * err);
    EXPECT_LT(std::abs(err), 0.20) << r.dump();
    sum_abs += std::abs(err);
    ++rows;
  }
  ASSERT_EQ(rows, 9);
  std::printf("mean absolute error %.2f%%\n", 100 * sum_abs / rows);
  EXPECT_LE(sum_abs / rows, 0.10);
}

// NeMo 24.03.01's long-sequence table (tests/data/nemo2403_long_sequence_h100_fp8.json: Llama 2 7B
// FP8 on DGX H100 from 4K tokens on 4 GPUs to 1M tokens on 1,024 with context parallelism).
// Printed, not held to a tolerance: trainplan predicts these runs 3-35% faster than published, by
// more as the sequence grows and attention takes over the step. The rows it shares with NeMo's
// later tables agree (Llama 2 7B at 4K: 768 TFLOPS/GPU here, 780 in 24.12, predicted 792), so the
// gap is attention: the dgx-h100 flash-attention table is PyTorch 2.11's SDPA (595 TFLOP/s forward
// at 8K, head dim 128), and the rows are consistent with kernels about 1.6-1.9x slower, as
// FlashAttention-2 is on Hopper (35% of peak, against 75% for FlashAttention-3: Shah et al. 2024,
// arXiv:2407.08608); which kernel Transformer Engine chose in that container is not published.
// Asserted: the published figure is comparable (trainplan's model FLOPs per step are NeMo's count
// of that time, full attention, within 0.1%), and every configuration that ran fits in memory.
TEST(ValidationNemoLongSequence, PrintsTheLongSequenceRowsAndCountsFlopsAsNemo) {
  const auto data = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/nemo2403_long_sequence_h100_fp8.json");
  const Cluster c = testing::builtin_cluster("dgx-h100");
  double sum_abs = 0;
  int rows = 0;
  for (const auto& r : data.at("rows")) {
    const ModelSpec m = load_model(r.at("model").get<std::string>(), TRAINPLAN_SOURCE_DIR);
    const Strategy s = nvidia_fp8_layout(r);
    ASSERT_EQ(s.dp, r.at("dp").get<int>()) << r.dump();
    const Estimate e = predict(LayerGraph(m, s.seq_len), c, s);
    EXPECT_TRUE(e.feasible) << r.dump();
    EXPECT_NEAR(e.throughput.model_flops_per_step_full_attention / megatron_model_flops(m, s.global_batch, s.seq_len), 1.0, 1e-3) << r.dump();
    const double published = r.at("tflops_per_gpu");
    const double err = published / full_attention_tflops_per_gpu(e, s) - 1;  // step time: positive = predicted slower
    std::printf("llama2-7b %5dK tokens %5d GPUs tp%d pp%d dp%d cp%-2d predicted %4.0f TFLOP/s/GPU  published %4.0f  step error %+6.1f%%  (printed only)\n",
                s.seq_len / 1024, s.gpus(), s.tp, s.pp, s.dp, s.cp, full_attention_tflops_per_gpu(e, s), published, 100 * err);
    sum_abs += std::abs(err);
    ++rows;
  }
  ASSERT_EQ(rows, 9);
  std::printf("mean absolute step error %.1f%% (printed only)\n", 100 * sum_abs / rows);
}

// AMD: the MLPerf Training pre-training runs of tests/data/published/amd_training_runs.json on a GPU
// with a shipped cluster file (MI355X: mi355x, derived from dgx-h100 by its published best matmul
// rate; MI350X: mi350x, the same silicon at its lower clock, that rate scaled by the clock ratio;
// no figure of either was fitted on any run), predicted as the CLI predicts them under
// megatron-core: the config's layout, FP8, ZeRO-1 (Megatron's distributed optimizer). The LoRA
// fine-tuning rows freeze the base weights, which trainplan does not model (counted, not
// predicted). Tolerance: 15% per row.
TEST(ValidationAmd, MlperfPretrainingOnShippedClusters) {
  const auto data = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/published/amd_training_runs.json");
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  const std::map<std::string, std::string> clusters = {{"MI355X", "mi355x"}, {"MI350X", "mi350x"}, {"MI325X", "mi325x"}, {"MI300X", "mi300x"}};
  int predicted = 0, lora = 0;
  for (const auto& r : data.at("rows")) {
    const std::string id = r.at("id"), gpu = r.at("gpu").get<std::string>().substr(0, r.at("gpu").get<std::string>().find(' '));
    if (r.at("kind") != "pretraining") {
      ++lora;
      continue;
    }
    const auto cluster = clusters.find(gpu);
    if (cluster == clusters.end()) {
      std::printf("%-58s %s: no shipped cluster file, not predicted\n", id.c_str(), gpu.c_str());
      continue;
    }
    const auto& mj = r.at("model");
    const auto& l = r.at("layout");
    // Llama 3.1 8B has Llama 3 8B's shape (the built-in model), checked field by field.
    const ModelSpec m = load_model("llama3-8b", TRAINPLAN_SOURCE_DIR);
    ASSERT_EQ(std::vector<int>({m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab, m.seq_len}),
              std::vector<int>({mj.at("layers"), mj.at("hidden"), mj.at("heads"), mj.at("kv_heads"), mj.at("ffn"),
                                mj.at("vocab"), mj.at("seq")}))
        << id;
    Strategy s = layout_sizes(l);
    s.zero = 1;
    s.seq_len = m.seq_len;
    s.dtype = Dtype::fp8;
    ASSERT_EQ(s.gpus(), r.at("gpus").get<int>()) << id;
    const Estimate e = predict(LayerGraph(m, m.seq_len), testing::builtin_cluster(cluster->second.c_str()), sw, s);
    const double published = r.at("measured").at("step_time_s"), err = e.time.step / published - 1;
    std::printf("%-58s %s %s  predicted %6.3f s  published %6.3f s  error %+5.1f%%\n", id.c_str(), cluster->second.c_str(),
                describe(s).c_str(), e.time.step, published, 100 * err);
    EXPECT_TRUE(e.feasible) << id;
    EXPECT_LT(std::abs(err), 0.15) << id;
    ++predicted;
  }
  std::printf("%d AMD pre-training run(s) predicted; %d LoRA fine-tuning rows not expressible\n", predicted, lora);
  EXPECT_EQ(predicted, 2);
}

}  // namespace
}  // namespace trainplan
