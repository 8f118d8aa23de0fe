// trainplan exec on CPU with Gloo: every parallel layout trains the same model as one rank.
// For each layout, 3 steps with the same seed and global batch must give the single-rank run's
// per-step losses and, after the last step, its parameters, to 1e-4 relative: losses
// step by step, parameters tensor by tensor (2-norm; see expect_equivalent). AdamW normalises
// each update by the gradient's own size, so a gradient off by a constant factor (a sum instead of
// a mean over DP ranks or micro-batches) would leave the parameters equal: the reduced gradients
// of the first step, as the optimizer sees them, must also equal the single-rank run's, to 1e-5
// relative per tensor.
// Runs the real CLI (TRAINPLAN_BINARY) with --nproc; tiny models keep it to seconds per case.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <optional>
#include <string>
#include <vector>

#include "cli_fixture.hpp"
#include "exec_runs.hpp"
#include "sim/layer_graph.hpp"
#include "sim/model_spec.hpp"

namespace {

namespace fs = std::filesystem;

using trainplan::testing::run_merged;
using namespace trainplan::testing::exec_runs;

[[maybe_unused]] ::testing::Environment* const kRemoveWorkDir = ::testing::AddGlobalTestEnvironment(new RemoveWorkDir);

// exec_run (exec_runs.hpp), which must succeed. `layout`: plan flags (also given to predict);
// `exec_flags`: flags of exec alone.
ExecRun exec_ok(const std::string& model, int ranks, const std::string& layout, const std::string& tag,
                const std::string& exec_flags = "") {
  ExecRun r = exec_run(model, ranks, layout, tag, exec_flags);
  EXPECT_EQ(r.code, 0) << r.output;
  return r;
}

// The single-rank run every layout is compared with (`exec_flags`: exec's own flags for it).
const ExecRun& reference(const std::string& model, const std::string& exec_flags = "") {
  static std::map<std::string, ExecRun> cache;
  const std::string key = model + "\n" + exec_flags;
  auto it = cache.find(key);
  if (it == cache.end()) {
    std::string tag = model + "_ref";
    if (!exec_flags.empty()) tag += std::to_string(cache.size());
    it = cache.emplace(key, exec_ok(model, 1, "", tag, exec_flags)).first;
  }
  return it->second;
}

// predict's JSON for a layout (fp32 unless the layout names a --dtype, the exec tests' batch), or
// null when predict failed.
nlohmann::json predict_json(const std::string& model, int ranks, const std::string& layout, const std::string& tag) {
  const fs::path json = work_dir() / (tag + ".predict.json");
  const std::string dtype = layout.find("--dtype") == std::string::npos ? " --dtype fp32" : "";
  const std::string args = "predict --model " + model_path(model) + " --cluster dgx-h100" + dtype +
                           " --global-batch 4 --micro-batch 1 " + layout + " --gpus " + std::to_string(ranks) +
                           " --json " + json.string();
  const auto r = run_merged(args);
  EXPECT_EQ(r.code, 0) << "trainplan " << args << "\n" << r.output;
  if (r.code != 0) return {};
  std::ifstream jf(json);
  return nlohmann::json::parse(jf);
}

// Per-rank model states: the bytes of the tensors exec's DP reducer holds (the
// measurement's environment.model_states, counted from the tensors) equal predict's per-stage
// weights, gradients and optimizer figures (sim/memory_model) for the same plan, fp32 on the CPU
// (4 B weights, 4 B gradients, 8 B Adam moments), with ZeRO's sharding over the dp x cp replicas.
// The parameters exec holds differ from the layer graph's count in three named ways, each
// applied here as a count of parameters times the same bytes and sharding:
//   - GPT-2's key bias, kv_heads x head_dim / tp per layer, is left out (its exact gradient is 0);
//   - the embedding and LM head carry padded_vocab(vocab, tp) - vocab padding rows (/ tp);
//   - each chunk's flat buffer is padded to a multiple of the replicas (so shards are equal).
// The learned position table and the row-parallel biases (attn.bo, mlp.b2) are replicated on every
// TP rank in exec as in predict (layer_graph's rank_params), so they need no term.
// Returns predict's JSON.
nlohmann::json expect_states_match_predict(const ExecRun& run, const std::string& model, int ranks,
                                           const std::string& layout, const std::string& tag) {
  const auto pred = predict_json(model, ranks, layout, tag);
  if (pred.is_null()) return {};
  const auto& st = pred.at("strategy");
  const int zero = st.at("zero"), tp = st.at("tp"), pp = st.at("pp"), vp = st.at("vp");
  const int replicas = st.at("dp").get<int>() * st.at("cp").get<int>();
  EXPECT_EQ(vp, 1) << "one chunk per stage: each chunk's padding is not modelled here";
  const trainplan::ModelSpec spec = trainplan::load_model(model_path(model), TRAINPLAN_TEST_DATA_DIR);
  const bool gpt = spec.activation == trainplan::Activation::gelu;
  const double pad_rows = trainplan::padded_vocab(spec.vocab, tp) - spec.vocab;
  const auto& per_rank = run.measurement.at("environment").at("model_states").at("per_rank");
  EXPECT_EQ(per_rank.size(), static_cast<size_t>(ranks));
  for (const auto& got : per_rank) {
    const int stage = got.at("stage");
    const auto& want = pred.at("memory").at("per_stage").at(stage);
    // Parameters of one rank of this stage as the layer graph counts them (from predict's weights).
    const double graph_params = want.at("weights").get<double>() * (zero == 3 ? replicas : 1) / 4.0;
    const int layers = want.at("layers");
    double exec_params = graph_params - (gpt ? double(layers) * spec.kv_heads * spec.head_dim() / tp : 0.0);
    if (stage == 0) exec_params += pad_rows * spec.hidden / tp;  // embedding
    if (stage == pp - 1 && (pp > 1 || !spec.tied_embeddings)) exec_params += pad_rows * spec.hidden / tp;  // head
    const double flat = std::ceil(exec_params / replicas) * replicas;
    // exec's figure = predict's + (exec's parameters - the graph's) x bytes / sharding.
    auto expect = [&](const char* what, double bytes, bool sharded) {
      const double shard = sharded && replicas > 1 ? replicas : 1.0;
      const double predicted = want.at(what).get<double>();
      EXPECT_DOUBLE_EQ(got.at(what).get<double>(), predicted + (flat - graph_params) * bytes / shard)
          << layout << ": rank " << got.at("rank") << " (stage " << stage << ") " << what << ", predicted "
          << predicted << " for " << graph_params << " parameters of the layer graph, exec holds " << flat;
    };
    expect("weights", 4, zero == 3);
    expect("gradients", 4, zero >= 2);
    expect("optimizer", 8, zero >= 1);
  }
  return pred;
}

// ZeRO-2/3 hold no full-size gradient: the gradient tensor they keep is the fp32 shard (checked
// against predict above), and besides it at most two bucket buffers are in flight (the reducer's
// kMaxBucketsInFlight), each at most the bucket size plus one parameter (a bucket closes once it
// reaches the size; a tied-embedding copy goes as one piece). For real models that is a small
// share of the gradient; for these tiny ones the largest parameter is a quarter of a stage.
void expect_bucketed_gradients(const ExecRun& run, const std::string& layout) {
  const auto& ms = run.measurement.at("environment").at("model_states");
  const double bucket = ms.at("bucket_bytes");
  double largest = 0;  // bytes of the largest parameter any rank holds
  for (const auto& [name, p] : run.params) largest = std::max(largest, 4.0 * static_cast<double>(p.values.size()));
  for (const auto& got : ms.at("per_rank")) {
    const double peak = got.at("bucket_buffers_peak"), shard = got.at("gradients");
    EXPECT_GT(peak, 0) << layout << ": rank " << got.at("rank") << " reduced no bucket";
    EXPECT_LE(peak, 2 * (bucket + largest)) << layout << ": rank " << got.at("rank");
    EXPECT_DOUBLE_EQ(shard, got.at("optimizer").get<double>() / 2) << layout << ": the gradient is not the shard";
  }
}

// ZeRO-3 gathers each unit's parameters (embedding, layer, head) just before it runs and frees
// them after, with the next unit prefetched, in the compute dtype (4 B per parameter in
// fp32, 2 B under mixed precision). The peak of gathered bytes a rank held
// (environment.model_states.per_rank[].gathered_weights) is then predict's term for its stage
// (memory_model's zero3_gathered_bytes: the largest pair of consecutive units in flight, read here
// as predict's `other` with --zero 3 minus that with --zero 2, which differ in nothing else),
// exactly but for one named difference: exec's GPT-2 layer lacks the key bias (kv_heads x
// head_dim parameters per layer, see expect_states_match_predict), so a GPT-2 rank holds one or
// two key biases less than predict counts (one or two layers in the pair). With tp 1 and
// vocabularies that need no padding there is no other. It is also less than the stage's whole
// parameters (what ZeRO-3 held all step before). Returns predict's per-stage terms.
std::vector<double> expect_gathered_matches_predict(const ExecRun& run, const std::string& model, int ranks,
                                                    const std::string& layout, const std::string& tag) {
  const auto zero3 = layout.find("--zero 3");
  EXPECT_NE(zero3, std::string::npos) << layout;
  if (zero3 == std::string::npos) return {};
  std::string zero2 = layout;
  zero2.replace(zero3, 8, "--zero 2");
  const auto p3 = predict_json(model, ranks, layout, tag + "_z3"), p2 = predict_json(model, ranks, zero2, tag + "_z2");
  if (p3.is_null() || p2.is_null()) return {};
  const int replicas = p3.at("strategy").at("dp").get<int>() * p3.at("strategy").at("cp").get<int>();
  EXPECT_GT(replicas, 1) << layout;
  EXPECT_EQ(p3.at("strategy").at("tp").get<int>(), 1) << "exec's TP-replicated biases are not modelled here";
  const trainplan::ModelSpec spec = trainplan::load_model(model_path(model), TRAINPLAN_TEST_DATA_DIR);
  EXPECT_EQ(trainplan::padded_vocab(spec.vocab, 1), spec.vocab) << model << ": vocabulary padding is not modelled here";
  // Bytes per gathered parameter: the dtype the run computed in (CPU ranks: fp32 unless --cpu-autocast).
  const bool fp32 = run.measurement.at("strategy").at("dtype") == "fp32";
  EXPECT_EQ(fp32, p3.at("strategy").at("dtype") == "fp32") << layout << ": exec ran another dtype than predict costs";
  const double bytes = fp32 ? 4 : 2;
  const double key_bias = spec.activation == trainplan::Activation::gelu ? double(spec.kv_heads) * spec.head_dim() * bytes : 0;
  std::vector<double> per_stage;
  for (const auto& s : p3.at("memory").at("per_stage"))
    per_stage.push_back(s.at("other").get<double>() -
                        p2.at("memory").at("per_stage").at(per_stage.size()).at("other").get<double>());
  for (const auto& got : run.measurement.at("environment").at("model_states").at("per_rank")) {
    const int stage = got.at("stage");
    const double predicted = per_stage.at(stage);
    const double gathered = got.at("gathered_weights");
    const double stage_bytes = p3.at("memory").at("per_stage").at(stage).at("weights").get<double>() * replicas;
    EXPECT_GT(predicted, 0) << "predict models no gathered units for ZeRO-3";
    const double missing = predicted - gathered;
    if (key_bias == 0) {
      EXPECT_DOUBLE_EQ(gathered, predicted) << layout << ": rank " << got.at("rank") << " (stage " << stage << ")";
    } else {
      EXPECT_TRUE(missing == key_bias || missing == 2 * key_bias)
          << layout << ": rank " << got.at("rank") << " (stage " << stage << ") gathered " << gathered
          << " B, predict " << predicted << " B: not one or two key biases (" << key_bias << " B) apart";
    }
    // A stage of more than two units never holds all of them at once (one of one layer and the
    // embedding or the head is all its two units).
    const int layers = p3.at("memory").at("per_stage").at(stage).at("layers");
    const int units = layers + (stage == 0 ? 1 : 0) + (stage == static_cast<int>(per_stage.size()) - 1 ? 1 : 0);
    if (units > 2) {
      EXPECT_LT(gathered, stage_bytes) << layout << ": rank " << got.at("rank") << " held its whole stage gathered";
    }
  }
  return per_stage;
}

void expect_equivalent(const std::string& model, int ranks, const std::string& layout, const std::string& tag,
                       ExecRun* run = nullptr, const std::string& exec_flags = "") {
  const ExecRun& ref = reference(model);
  const ExecRun got = exec_ok(model, ranks, layout, tag, exec_flags);
  if (run) *run = got;
  expect_equivalent(ref, got, layout);
}

// The suite catches gradient-scale bugs, which AdamW would hide in the parameters. With a bug injected on purpose (a test-only
// fault: the loss summed instead of averaged over the 2 DP ranks, or over the 2 micro-batches per
// rank), every gradient is 2x the single-rank run's: the first step's losses still agree (the
// forward runs before any update) and AdamW, which divides each update by the gradient's own
// size, keeps the parameters close, but the gradient comparison (tolerance 1e-5) sees a relative
// difference of 1.
TEST(ExecEquivalence, GradientCheckCatchesASumInsteadOfAMean) {
  const ExecRun& ref = reference("tiny-gpt");
  ASSERT_EQ(ref.losses.size(), 3u) << ref.output;
  for (const std::string bug : {"sum-dp", "sum-micro-batches"}) {
    const ExecRun got = exec_ok("tiny-gpt", 2, "", "bug_" + bug, "--fault-grad-bug " + bug);
    ASSERT_EQ(got.losses.size(), 3u) << got.output;
    EXPECT_TRUE(close(got.losses[0], ref.losses[0])) << bug << ": " << got.losses[0] << " vs " << ref.losses[0];
    const double grads = worst_relative_difference(ref.grads, got.grads);
    const double params = worst_relative_difference(ref.params, got.params);
    EXPECT_NEAR(grads, 1.0, 1e-4) << bug << ": the gradients should be twice the single-rank run's";
    EXPECT_GT(grads, 1e-5) << bug << ": the equivalence check (1e-5) would not see this bug";
    EXPECT_LT(params, 1e-2) << bug << ": AdamW hides the scale in the parameters (here " << params << ")";
  }
}

TEST(ExecEquivalence, LossFallsOnSingleRank) {
  const ExecRun& ref = reference("tiny-gpt");
  ASSERT_EQ(ref.losses.size(), 3u) << ref.output;
  EXPECT_NEAR(ref.losses[0], std::log(256.0), 0.3);  // untrained: about ln(vocab)
  EXPECT_LT(ref.losses[2], ref.losses[0]);
}

// Runs a layout, checks it against the single-rank run, and checks its per-rank model states
// against predict's per-stage figures.
void expect_equivalent_and_states(const std::string& model, int ranks, const std::string& layout,
                                  const std::string& tag, const std::string& exec_flags = "") {
  ExecRun run;
  expect_equivalent(model, ranks, layout, tag, &run, exec_flags);
  if (run.measurement.is_null()) return;
  expect_states_match_predict(run, model, ranks, layout, tag);
  if (run.measurement.at("strategy").at("zero").get<int>() >= 2) expect_bucketed_gradients(run, layout);
}

// 10 KiB buckets: the tiny models' chunks then reduce in many buckets, as large models do in 16 MiB.
const std::string kSmallBuckets = "--bucket-mb 0.01";

TEST(ExecEquivalence, DataParallel2) { expect_equivalent_and_states("tiny-gpt", 2, "", "dp2"); }
TEST(ExecEquivalence, DataParallel2SmallBuckets) {
  expect_equivalent("tiny-gpt", 2, "", "dp2buckets", nullptr, kSmallBuckets);
}
TEST(ExecEquivalence, TensorParallel2) { expect_equivalent_and_states("tiny-gpt", 2, "--tp 2", "tp2"); }
TEST(ExecEquivalence, TensorParallel2SequenceParallel) {
  expect_equivalent("tiny-gpt", 2, "--tp 2 --sequence-parallel on", "tp2sp");
}
TEST(ExecEquivalence, Pipeline2GPipe) { expect_equivalent("tiny-gpt", 2, "--pp 2 --schedule gpipe", "pp2gpipe"); }
TEST(ExecEquivalence, Pipeline2OneFOneB) {
  expect_equivalent_and_states("tiny-gpt", 2, "--pp 2 --schedule 1f1b", "pp2_1f1b");
}
TEST(ExecEquivalence, InterleavedPipeline2x2) {
  expect_equivalent("tiny-gpt-4l", 2, "--pp 2 --vp 2 --schedule interleaved", "pp2vp2");
}
TEST(ExecEquivalence, DataParallel2TensorParallel2) { expect_equivalent("tiny-gpt", 4, "--tp 2", "dp2tp2"); }
TEST(ExecEquivalence, TensorParallel2Pipeline2) {
  expect_equivalent("tiny-gpt", 4, "--tp 2 --pp 2 --schedule 1f1b", "tp2pp2");
}
TEST(ExecEquivalence, Zero1DataParallel2) {
  expect_equivalent_and_states("tiny-gpt", 2, "--zero 1", "zero1", kSmallBuckets);
}
TEST(ExecEquivalence, Zero2DataParallel2) {
  expect_equivalent_and_states("tiny-gpt", 2, "--zero 2", "zero2", kSmallBuckets);
}
// Runs `layout` (ZeRO-3) against the single-rank run and returns predict's per-stage gathered terms,
// checked against exec's peaks; nothing where exec wrote no measurement.
std::optional<std::vector<double>> expect_zero3_gathered(const std::string& model, int ranks, const std::string& layout,
                                                         const std::string& tag, const std::string& exec_flags = "") {
  ExecRun run;
  expect_equivalent(model, ranks, layout, tag, &run, exec_flags);
  if (run.measurement.is_null()) return std::nullopt;
  return expect_gathered_matches_predict(run, model, ranks, layout, tag);
}
TEST(ExecEquivalence, Zero2OneBucketDataParallel2) { expect_equivalent("tiny-gpt", 2, "--zero 2", "zero2onebucket"); }
TEST(ExecEquivalence, Zero3DataParallel2) {
  expect_equivalent_and_states("tiny-gpt", 2, "--zero 3", "zero3", kSmallBuckets);
}
// ZeRO-3 unit by unit over four layers: the gathered peak is two layers', not the stage's.
TEST(ExecEquivalence, Zero3FourLayersGathersUnitByUnit) {
  ExecRun run;
  expect_equivalent("tiny-gpt-4l", 2, "--zero 3", "zero3_4l", &run, kSmallBuckets);
  if (run.measurement.is_null()) return;
  expect_states_match_predict(run, "tiny-gpt-4l", 2, "--zero 3", "zero3_4l");
  expect_gathered_matches_predict(run, "tiny-gpt-4l", 2, "--zero 3", "zero3_4l");
}
// Full recomputation re-runs each layer inside its backward: the layer must be gathered then.
TEST(ExecEquivalence, Zero3FullRecomputation) {
  expect_zero3_gathered("tiny-gpt-4l", 2, "--zero 3 --recompute full", "zero3_full");
}
// Llama style: fused q/k/v with grouped-query widths and fused gate/up, gathered unit by unit.
TEST(ExecEquivalence, Zero3LlamaStyleDataParallel2) { expect_zero3_gathered("tiny-llama", 2, "--zero 3", "llama_zero3"); }
// ZeRO-3 with TP and sequence parallelism: each TP rank gathers its own shards' units.
TEST(ExecEquivalence, Zero3DataParallel2TensorParallel2SequenceParallel) {
  expect_equivalent("tiny-gpt", 4, "--zero 3 --tp 2 --sequence-parallel on", "zero3tp2sp", nullptr, kSmallBuckets);
}
// ZeRO-2 with sequence parallelism: the TP-replicated gradients are summed over TP on the shard.
TEST(ExecEquivalence, Zero2TensorParallel2SequenceParallel) {
  expect_equivalent_and_states("tiny-gpt", 4, "--zero 2 --tp 2 --sequence-parallel on", "zero2tp2sp", kSmallBuckets);
}
// ZeRO-2 over the pipeline: the tied embedding's two copies are summed, then reduced to their owners.
TEST(ExecEquivalence, Zero2DataParallel2Pipeline2) {
  expect_equivalent_and_states("tiny-gpt", 4, "--zero 2 --pp 2 --schedule 1f1b", "zero2pp2", kSmallBuckets);
}
// ZeRO-2 over the context-parallel ranks (they hold replicas of the same parameters). With tp 2:
// at cp 2 alone, layers.1.attn.bo (a bias near zero after 3 AdamW steps) differs from the single-
// rank run by 1.05e-4 relative with ZeRO-2 and 0.997e-4 with ZeRO 0, against 1e-4: fp32 summation
// order made visible by AdamW (its gradients agree to 5e-7), on the tolerance's edge for any ZeRO.
TEST(ExecEquivalence, Zero2ContextParallel2TensorParallel2) {
  expect_equivalent_and_states("tiny-gpt", 4, "--zero 2 --cp 2 --tp 2", "zero2cp2tp2", kSmallBuckets);
}
TEST(ExecEquivalence, FullRecomputation) {
  expect_equivalent("tiny-gpt", 2, "--tp 2 --sequence-parallel on --recompute full", "full");
}
TEST(ExecEquivalence, SelectiveRecomputation) {
  expect_equivalent("tiny-gpt", 2, "--pp 2 --schedule 1f1b --recompute selective", "selective");
}
TEST(ExecEquivalence, LlamaStyleTensorParallel2) { expect_equivalent("tiny-llama", 2, "--tp 2", "llama_tp2"); }
// A head_dim other than hidden / heads (attention 4 x 8 = 32 wide, hidden 64; 4 x 24 = 96 with
// biases and learned positions): Q, K, V and the output projection are split by heads over TP,
// and the per-rank states match predict's.
TEST(ExecEquivalence, HeadDimTensorParallel2) {
  expect_equivalent_and_states("tiny-llama-headdim", 2, "--tp 2", "headdim_llama_tp2");
  expect_equivalent_and_states("tiny-gpt-headdim", 2, "--tp 2", "headdim_gpt_tp2");
}
TEST(ExecEquivalence, DataParallel2Pipeline2) {
  expect_equivalent_and_states("tiny-gpt", 4, "--pp 2 --schedule 1f1b", "dp2pp2");
}
TEST(ExecEquivalence, Zero2DataParallel2TensorParallel2) {
  expect_equivalent_and_states("tiny-gpt", 4, "--zero 2 --tp 2", "zero2tp2", kSmallBuckets);
}
TEST(ExecEquivalence, Zero3DataParallel2Pipeline2) {
  ExecRun run;
  expect_equivalent("tiny-gpt", 4, "--zero 3 --pp 2 --schedule 1f1b", "zero3pp2", &run, kSmallBuckets);
  if (run.measurement.is_null()) return;
  expect_states_match_predict(run, "tiny-gpt", 4, "--zero 3 --pp 2 --schedule 1f1b", "zero3pp2");
  expect_bucketed_gradients(run, "--zero 3 --pp 2 --schedule 1f1b");
  expect_gathered_matches_predict(run, "tiny-gpt", 4, "--zero 3 --pp 2 --schedule 1f1b", "zero3pp2");
}
// First and last stage: with one layer per stage no stage ever holds two layers; the
// first holds the embedding with its layer prefetched, the last its layer with the head (Llama
// style: no key bias, so exec and predict agree to the byte). tiny-llama's units: a layer 36992
// parameters (q/k/v 128 x 64, output 64 x 64, gate/up 256 x 64, down 64 x 128, two norms 64), the
// embedding 256 x 64 = 16384, the head 64 + 16384; 4 B each in fp32.
TEST(ExecEquivalence, Zero3Pipeline2GathersEmbeddingAndHeadWithALayer) {
  const auto per_stage =
      expect_zero3_gathered("tiny-llama", 4, "--zero 3 --pp 2 --schedule 1f1b", "llama_zero3pp2", kSmallBuckets);
  if (!per_stage) return;
  ASSERT_EQ(per_stage->size(), 2u);
  EXPECT_DOUBLE_EQ((*per_stage)[0], (16384 + 36992) * 4.0);
  EXPECT_DOUBLE_EQ((*per_stage)[1], (16448 + 36992) * 4.0);
}
// A small model with a large vocabulary: the LM head is the largest unit, and the peak is the head
// with the last layer (prefetched for the backward), not two layers: head 64 + 2048 x 64 = 131136
// parameters + layer 36992, against two layers 73984.
TEST(ExecEquivalence, Zero3LargeVocabularyHeadIsTheLargestUnit) {
  const auto per_stage = expect_zero3_gathered("tiny-llama-bigvocab", 2, "--zero 3", "bigvocab_zero3");
  if (!per_stage) return;
  ASSERT_EQ(per_stage->size(), 1u);
  EXPECT_DOUBLE_EQ((*per_stage)[0], (131136 + 36992) * 4.0);
}
// A tied head on the embedding's chunk reads the embedding's unit: the backward starts with the
// head, the table and the last layer (prefetched) in flight together. tiny-gpt-bigvocab: the
// table 2048 x 64 = 131072 + positions 64 x 64 = 4096, the head's LayerNorm 128, a layer 49984 in
// predict's graph (exec's lacks the 64-element key bias).
TEST(ExecEquivalence, Zero3TiedHeadHoldsTheEmbeddingWithTheLastLayer) {
  const auto per_stage = expect_zero3_gathered("tiny-gpt-bigvocab", 2, "--zero 3", "tied_bigvocab_zero3");
  if (!per_stage) return;
  ASSERT_EQ(per_stage->size(), 1u);
  EXPECT_DOUBLE_EQ((*per_stage)[0], (131072 + 4096 + 128 + 49984) * 4.0);
}
// Mixed precision: ZeRO-3 gathers each unit in bf16 (each owner casts its fp32 master
// part, 2 B per parameter), as FSDP and Megatron do, and predict counts 2 B. CPU ranks compute
// fp32 unless --cpu-autocast on runs them under CPU autocast with fp32 master weights, as on GPUs:
// that runs the 16-bit gathers here. The gathered peak is predict's bf16 term to the byte (two
// layers, 2 x 36992 x 2 B), and the run trains the single-rank bf16 run's model (autocast over
// fp32 parameters, no ZeRO) to bf16's precision (see the tolerances below).
// The two bf16 runs differ in what is 16-bit: ZeRO-3's gathered parameters (norm weights and the
// embedding table too) and so their gradients are bf16 (8 significant bits, 0.4% per rounding),
// where the single-rank run keeps fp32 parameters and casts per GEMM. Measured when these tests
// were written (seed 7, 2-norm per tensor): losses within 1.5e-5 (tiny-llama, dp 2) and 3.1e-5
// (tiny-gpt, dp 2 x pp 2) relative; the first step's gradients within 0.82% for both; the
// parameters after 3 steps within 0.92% and 3.1%. The 3.1% is layers.0.mlp.b1, a bias that
// starts at zero: AdamW's first steps move each element by about lr whatever its gradient's size,
// so an element whose gradient is near zero takes its direction from bf16 rounding (every matrix
// is within 1%). Tolerances: 1e-4 on losses; 2% on gradients, the sharp check (a gradient-scale
// bug, a sum for a mean, is 100%); 5% on parameters.
constexpr double kBf16LossTolerance = 1e-4, kBf16GradTolerance = 0.02, kBf16ParamTolerance = 0.05;
// Runs `layout` (ZeRO-3, bf16) under --cpu-autocast against the single-rank bf16 run of `model`
// and returns predict's per-stage gathered terms (checked against exec's peaks).
std::vector<double> expect_bf16_zero3(const std::string& model, int ranks, const std::string& layout,
                                      const std::string& tag) {
  const std::string flags = "--cpu-autocast on";
  const ExecRun ref = exec_ok(model, 1, "--dtype bf16", model + "_bf16_ref", flags);
  const ExecRun got = exec_ok(model, ranks, layout, tag, flags + " " + kSmallBuckets);
  EXPECT_EQ(ref.losses.size(), 3u) << ref.output;
  EXPECT_EQ(got.losses.size(), 3u) << got.output;
  if (ref.losses.size() != 3 || got.losses.size() != 3) return {};
  EXPECT_EQ(got.measurement.at("strategy").at("dtype"), "bf16");
  EXPECT_EQ(got.measurement.at("environment").at("compute_dtype"), "bf16 (autocast, fp32 master)");
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(got.losses[i], ref.losses[i], kBf16LossTolerance * ref.losses[i]) << layout << ": step " << i;
  const double params = worst_relative_difference(ref.params, got.params);
  const double grads = worst_relative_difference(ref.grads, got.grads);
  std::printf("%s bf16 vs single rank: losses %.6g %.6g %.6g vs %.6g %.6g %.6g, gradients %.3g, parameters %.3g\n",
              layout.c_str(), got.losses[0], got.losses[1], got.losses[2], ref.losses[0], ref.losses[1], ref.losses[2],
              grads, params);
  EXPECT_LT(grads, kBf16GradTolerance) << layout << ": reduced gradients of the first step";
  EXPECT_LT(params, kBf16ParamTolerance) << layout << ": parameters after 3 steps";
  return expect_gathered_matches_predict(got, model, ranks, layout, tag);
}
TEST(ExecEquivalence, Zero3MixedPrecisionGathersSixteenBit) {
  const auto per_stage = expect_bf16_zero3("tiny-llama", 2, "--zero 3 --dtype bf16", "llama_zero3_bf16");
  ASSERT_EQ(per_stage.size(), 1u);
  EXPECT_DOUBLE_EQ(per_stage[0], 2 * 36992 * 2.0);
}
// The same over two pipeline stages with a tied embedding: the last stage's 16-bit copy of the
// table has its gradient summed with the first stage's and reduced in fp32 to its owners.
TEST(ExecEquivalence, Zero3MixedPrecisionPipeline2Tied) {
  const auto per_stage = expect_bf16_zero3("tiny-gpt", 4, "--zero 3 --pp 2 --schedule 1f1b --dtype bf16", "zero3pp2_bf16");
  ASSERT_EQ(per_stage.size(), 2u);
  // tiny-gpt: table 256 x 64 = 16384 + positions 4096; head LayerNorm 128 + its copy of the table;
  // a layer 49984 in predict's graph; 2 B each.
  EXPECT_DOUBLE_EQ(per_stage[0], (16384 + 4096 + 49984) * 2.0);
  EXPECT_DOUBLE_EQ(per_stage[1], (128 + 16384 + 49984) * 2.0);
}
TEST(ExecEquivalence, Zero1DataParallel2TensorParallel2OddVocabulary) {
  expect_equivalent_and_states("tiny-gpt-oddvocab", 4, "--zero 1 --tp 2", "zero1tp2odd");
}

// The model exec builds holds the parameters the layer graph (which predict costs) counts. The one
// known difference is named: exec leaves out GPT-2's key bias (softmax is invariant to it, so its
// exact gradient is zero), kv_heads * head_dim parameters per layer.
TEST(ExecEquivalence, ParameterCountMatchesTheLayerGraph) {
  for (const std::string name : {"tiny-gpt", "tiny-llama", "tiny-llama-headdim", "tiny-gpt-headdim"}) {
    const ExecRun& ref = reference(name);
    ASSERT_FALSE(ref.params.empty()) << ref.output;
    double exec_params = 0;
    for (const auto& [n, p] : ref.params) {
      double k = 1;
      for (int64_t d : p.shape) k *= static_cast<double>(d);
      exec_params += k;
    }
    const trainplan::ModelSpec spec = trainplan::load_model(model_path(name), TRAINPLAN_TEST_DATA_DIR);
    const trainplan::LayerGraph graph(spec, spec.seq_len);
    const bool gpt = spec.activation == trainplan::Activation::gelu;  // as exec/model.cpp decides biases
    const double key_bias = gpt ? double(spec.layers) * spec.kv_heads * spec.head_dim() : 0;
    EXPECT_EQ(exec_params + key_bias, graph.total_params()) << name;
  }
}

// fp16 with dynamic loss scaling (on CPU the arithmetic stays fp32): scaling the loss by a power
// of two and unscaling the gradients is exact, so the run equals the fp32 one; with a growth
// interval of 2 the scale doubles once in 3 good steps.
TEST(ExecEquivalence, Fp16LossScalingDataParallel2) {
  ExecRun run;
  expect_equivalent("tiny-gpt", 2, "--dtype fp16 --loss-scale 1024 --loss-scale-window 2", "fp16", &run);
  const auto& ls = run.measurement.at("environment").at("loss_scaling");
  EXPECT_EQ(ls.at("initial_scale").get<double>(), 1024.0) << ls;
  EXPECT_EQ(ls.at("final_scale").get<double>(), 2048.0) << ls;
  EXPECT_TRUE(ls.at("skipped_steps").empty()) << ls;
}

// A NaN in one rank's gradients skips that step on every rank and halves the scale; training
// goes on with finite parameters.
TEST(ExecEquivalence, Fp16SkipsAStepWithNanGradients) {
  const ExecRun run = exec_ok("tiny-gpt", 2, "--pp 2 --schedule 1f1b --dtype fp16 --fault-nan-rank 1 --fault-step 1",
                               "fp16nan");
  ASSERT_EQ(run.losses.size(), 3u) << run.output;
  const auto& ls = run.measurement.at("environment").at("loss_scaling");
  EXPECT_EQ(ls.at("skipped_steps"), nlohmann::json::array({1})) << ls;
  EXPECT_EQ(ls.at("final_scale").get<double>(), 32768.0) << ls;  // 65536 * 0.5
  const ExecRun& ref = reference("tiny-gpt");
  ASSERT_EQ(ref.losses.size(), 3u);
  // Steps 0 and 1 ran the same parameters as the fp32 run (step 1's update was skipped after its
  // forward); step 2 then starts from step 0's update only, so its loss differs.
  EXPECT_TRUE(close(run.losses[0], ref.losses[0])) << run.losses[0] << " vs " << ref.losses[0];
  EXPECT_TRUE(close(run.losses[1], ref.losses[1])) << run.losses[1] << " vs " << ref.losses[1];
  EXPECT_FALSE(close(run.losses[2], ref.losses[2])) << run.losses[2];
  for (const auto& [name, p] : run.params)
    for (double v : p.values) ASSERT_TRUE(std::isfinite(v)) << name;
}

}  // namespace

// Vocabulary padding: an odd vocabulary is padded to a multiple of 128*tp; the padding
// rows must change neither the loss nor the real parameters.
namespace {
TEST(ExecEquivalence, OddVocabularyTensorParallel2) {
  expect_equivalent("tiny-gpt-oddvocab", 2, "--tp 2", "oddvocab_tp2");
}
TEST(ExecEquivalence, OddVocabularyTensorParallel2Pipeline2) {
  expect_equivalent("tiny-gpt-oddvocab", 4, "--tp 2 --pp 2 --schedule 1f1b", "oddvocab_tp2pp2");
}
// Context parallelism: ring attention over the zigzag sequence split.
TEST(ExecEquivalence, ContextParallel2) { expect_equivalent("tiny-gpt", 2, "--cp 2", "cp2"); }
TEST(ExecEquivalence, ContextParallel2TensorParallel2) { expect_equivalent("tiny-gpt", 4, "--cp 2 --tp 2", "cp2tp2"); }
TEST(ExecEquivalence, ContextParallel2DataParallel2) { expect_equivalent("tiny-gpt", 4, "--cp 2 --dp 2", "cp2dp2"); }
TEST(ExecEquivalence, ContextParallel2SequenceParallelRecompute) {
  expect_equivalent("tiny-gpt", 4, "--cp 2 --tp 2 --sequence-parallel on --recompute selective", "cp2tp2sp");
}
TEST(ExecEquivalence, ContextParallel2Pipeline2Zero1) {
  expect_equivalent("tiny-gpt", 4, "--cp 2 --pp 2 --schedule 1f1b --zero 1", "cp2pp2zero1");
}
TEST(ExecEquivalence, LlamaStyleContextParallel2) { expect_equivalent("tiny-llama", 2, "--cp 2", "llama_cp2"); }
}  // namespace

// Synchronous parameter servers: workers push gradients to the server shards, which sum
// them, step AdamW and send the parameters back; the training is the single-rank run's. The first
// step's reduced gradients compared are those the servers applied (sent back for the dump).
namespace {
TEST(ExecEquivalence, ParameterServerTwoWorkersOneDedicatedServer) {
  ExecRun run;
  expect_equivalent("tiny-gpt", 3, "--dp 2 --dp-algorithm ps --ps-servers 1 --ps-placement dedicated", "ps_w2s1",
                    &run);
  // The server (rank 2) holds no model: its dump is empty, the workers hold every parameter.
  const auto& ranks = run.measurement.at("memory").at("per_rank");
  ASSERT_EQ(ranks.size(), 3u);
  // Each worker pushes its whole gradient (fp32) once per step; the server sends the parameters
  // to both workers: twice as many bytes. (Flat buffers hold the parameters plus < dp padding.)
  const double worker = ranks.at(0).at("dp_bytes_sent_per_step").get<double>();
  const double server = ranks.at(2).at("dp_bytes_sent_per_step").get<double>();
  EXPECT_GT(worker, 0);
  EXPECT_EQ(ranks.at(1).at("dp_bytes_sent_per_step").get<double>(), worker);
  EXPECT_EQ(server, 2 * worker);
}
// Two shards: the shard boundary falls inside a parameter tensor (AdamW per element, weight decay
// by the tensor it belongs to).
TEST(ExecEquivalence, ParameterServerTwoWorkersTwoDedicatedServers) {
  expect_equivalent("tiny-gpt", 4, "--dp 2 --dp-algorithm ps --ps-servers 2 --ps-placement dedicated", "ps_w2s2");
}
// Colocated: worker 0 also serves the one shard (its own push and pull are local copies). The
// planner allows one colocated server per node the job spans (2 ranks: one node).
TEST(ExecEquivalence, ParameterServerColocated) {
  expect_equivalent("tiny-gpt", 2, "--dp 2 --dp-algorithm ps --ps-servers 1 --ps-placement colocated", "ps_coloc");
}
}  // namespace

// --fused-kernels on (exec/kernels/fused_ops: the norms, RoPE, SwiGLU and GELU as one forward and
// one backward kernel each; on the CPU their CPU loops) trains the same model as the LibTorch
// composites (--fused-kernels off): the same tolerances as every layout above (losses and parameters 1e-4, first-step
// gradients 1e-5 relative), in GPT style (LayerNorm, GELU) and Llama style (RMSNorm, RoPE,
// SwiGLU), on one rank and with TP + SP, CP (RoPE at the zigzag positions), ZeRO-3 and PP with full
// recomputation. On one rank the fused path rounds differently from the composite (other
// summation order), so a run that ignored the switch would give bit-identical parameters: the
// difference must also be above zero.
namespace {
void expect_fused_equivalent(const std::string& model, int ranks, const std::string& layout, const std::string& tag) {
  const ExecRun& composite = reference(model, "--fused-kernels off");
  const ExecRun run = exec_ok(model, ranks, layout, tag, "--fused-kernels on");
  expect_equivalent(composite, run, layout);
  if (run.measurement.is_null() || composite.measurement.is_null()) return;
  EXPECT_EQ(run.measurement.at("environment").at("fused_kernels"), "on");
  EXPECT_EQ(composite.measurement.at("environment").at("fused_kernels"), "off");
  EXPECT_EQ(reference(model).measurement.at("environment").at("fused_kernels"), "auto");  // the default
  if (ranks == 1) {
    EXPECT_GT(worst_relative_difference(composite.params, run.params), 0)
        << layout << ": bit-identical to the composite run: the fused kernels did not run";
  }
}
TEST(ExecEquivalence, FusedKernelsGptStyle) { expect_fused_equivalent("tiny-gpt", 1, "", "fused_gpt"); }
TEST(ExecEquivalence, FusedKernelsLlamaStyle) { expect_fused_equivalent("tiny-llama", 1, "", "fused_llama"); }
TEST(ExecEquivalence, FusedKernelsLlamaStyleTensorParallel2SequenceParallel) {
  expect_fused_equivalent("tiny-llama", 2, "--tp 2 --sequence-parallel on", "fused_llama_tp2sp");
}
TEST(ExecEquivalence, FusedKernelsLlamaStyleContextParallel2) {
  expect_fused_equivalent("tiny-llama", 2, "--cp 2", "fused_llama_cp2");
}
// ZeRO-3 frees a layer's parameters after its forward and gathers them again for its backward:
// the fused norms' saved weights must see the gathered memory, as LibTorch's ops' do.
TEST(ExecEquivalence, FusedKernelsLlamaStyleZero3DataParallel2) {
  expect_fused_equivalent("tiny-llama", 2, "--zero 3", "fused_llama_zero3");
}
TEST(ExecEquivalence, FusedKernelsGptStylePipeline2FullRecompute) {
  expect_fused_equivalent("tiny-gpt", 2, "--pp 2 --schedule 1f1b --recompute full", "fused_gpt_pp2");
}
}  // namespace
