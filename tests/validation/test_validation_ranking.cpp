// Validation of the order of layouts: a planner sells the ranking of the layouts it compares, so
// per set of measured layouts of one model on one cluster, the Spearman rank correlation of
// predicted against measured step time (tests/data/published/multi_layout_sets.json: Hagemann et
// al. 2023, arXiv:2311.05610, the layout sweep of LLaMA 13B/30B/65B with a 128k vocabulary at
// sequence 2k and 8k on 32-256 A100 80GB; the README there says how the sets were read).
//
// How the sets are used:
//   - one set = one model, sequence length and GPU count, as the file groups them;
//   - the attention kernel varies inside a set. The main sets are ranked on their
//     'flash_attention2' rows (the most complete kernel column), predicted under
//     software/aleph-alpha-scaling.json (that codebase's eager RMSNorm); the sequence-parallel
//     sets ran only 'flash_attention2 + RMS kernel', predicted under aleph-alpha-scaling-rms
//     (the fused RMSNorm). The other columns (PyTorch and Megatron-fused attention over
//     materialised scores, FlashAttention 1.0.8) run kernels no shipped profile describes on A100;
//     the FlashAttention 1.0.8 column is ranked on its own, printed only, under the same profile;
//   - the sheets mark sequence parallelism on at tp 1, where it does nothing: it is on only with
//     tp > 1 here;
//   - rows that ran (outcome "ok") are ranked; rows that ran out of memory ("oom") and those rows
//     are a memory test: the predicted verdict (fits / out of memory) against the measured one;
//     "kernel_not_available" and "other_error" rows are not measurements and are left out;
//   - a layout run twice (two trials) counts twice; Spearman ranks ties by their mean rank.
//
// Tolerance: per set, Spearman >= 0.9. Sets the model misses today are listed in kKnownMisses
// with what is not modelled and a floor they must stay above (the target is NOT met for them).
// Memory: the verdicts agree on at least 90% of the ok and oom rows (426 of 466 today), and at most
// 6% of the runs that ran are predicted out of memory (a planner that drops a layout that runs
// loses it; today 12 of 207: layouts with few model-parallel ranks per parameter, tp x pp of 1-4,
// and four large micro-batch 65B layouts, all near the 80 GB). The other disagreements (28 of the
// 259 oom rows predicted to fit) are printed: there the sweep's own sets disagree with each other (65B at
// tp 8 pp 8, micro-batch 4, fused RMSNorm, no recomputation: ran with one data-parallel replica on 64
// GPUs, trial 132978, and ran out of memory with two on 128, trial 132252, where each GPU holds less).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "sim/json_reader.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"
#include "sim/software.hpp"
#include "rank_correlation.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

// LLaMA 13B / 30B / 65B (Touvron et al. 2023, Table 2) with the sweep's untied 128,000-token
// vocabulary (the file's derived_not_stated.vocab), at the set's sequence length.
ModelSpec llama_of(const std::string& set, int seq) {
  struct Shape {
    const char* tag;
    int layers, hidden, heads, ffn;
  };
  constexpr Shape kShapes[] = {{"-13b-", 40, 5120, 40, 13824}, {"-30b-", 60, 6656, 52, 17920}, {"-65b-", 80, 8192, 64, 22016}};
  for (const Shape& s : kShapes) {
    if (set.find(s.tag) == std::string::npos) continue;
    ModelSpec m;
    m.name = std::string("llama") + s.tag;
    m.layers = s.layers;
    m.hidden = s.hidden;
    m.heads = s.heads;
    m.kv_heads = s.heads;
    m.ffn_hidden = s.ffn;
    m.vocab = 128000;
    m.seq_len = seq;
    m.activation = Activation::swiglu;
    m.norm = Norm::rmsnorm;
    m.position = Position::rope;
    m.tied_embeddings = false;
    return m;
  }
  ADD_FAILURE() << "no model for set " << set;
  return {};
}

using testing::ranks;
using testing::spearman;

TEST(Spearman, HandWorkedValues) {
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {10, 20, 30, 40}), 1.0);
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
  // Ranks 1 2 3 4 against 2 1 4 3: d^2 sums to 4, rho = 1 - 6*4/(4*15) = 0.6.
  EXPECT_NEAR(spearman({1, 2, 3, 4}, {2, 1, 4, 3}), 0.6, 1e-12);
  EXPECT_EQ(ranks({5, 1, 5}), (std::vector<double>{2.5, 1, 2.5}));  // ties share their mean rank
}

// Sets below the 0.9 target today: the floor they are held to and what the model does not capture.
const std::map<std::string, std::pair<double, const char*>> kKnownMisses = {
    {"hagemann2023-13b-seq2048-32gpu-seqpar",
     {0.3, "micro-batch 1 rows are predicted 5-20% slow where the micro-batch 2 rows are within 6% (tp 1 pp 1: +19% at "
           "mb 1, +4% at mb 2): these runs were faster at mb 1 than at mb 2, the model has them slower; the costs it "
           "charges per micro-batch (unfused gradient accumulation, pipeline hand-offs) exceed what these runs show"}},
    {"hagemann2023-13b-seq2048-64gpu",
     {0.7, "the flash_attention2 runs with pipelining slow down with the micro-batch (pp 2: 44 s at mb 1, 73 s at mb 8) "
           "where the same layouts with FlashAttention 1.0.8 stay flat (42-45 s): not an effect of the layout; and "
           "the micro-batch 1 rows above (tp 1 mb 1 up to +18%)"}},
    {"hagemann2023-30b-seq2048-256gpu",
     {0.6, "the layouts with one or two pipeline stages (data parallelism 64-128) ran 15-30% slower than those with "
            "four stages at the same tp, which the model does not reproduce (it predicts them 5-29% fast, with the fp32 gradient all-reduce). "
            "The shortfall grows with the fp32 gradient bytes a node all-reduces (tp x 2 x its ranks' share): -1..+4 s at 68 GB "
            "(pp 4), +1..+9 s at 135 GB (pp 2), +8..+12 s at 270 GB (pp 1), about 24 GB/s per node where the model "
            "gives a DGX A100's eight HDR adapters; the 32-128 GPU sets show no such slope, and the FlashAttention 1.0.8 "
            "column of this set ranks no better (0.641): the 32-node network is the suspect, its topology is not published"}},
    {"hagemann2023-30b-seq2048-64gpu-seqpar",
     {0.8, "every row within 11%, but the layouts span about 15%: tp 1-2 rows are predicted 3-10% slow and tp 4 rows "
           "-6% to +3%, enough to swap neighbours"}},
    {"hagemann2023-13b-seq8192-128gpu",
     {0.8, "tensor parallelism costs more than modelled: tp 4 rows are predicted 8-12% fast, tp 1-2 mostly within 7%"}},
};

struct SetResult {
  std::vector<double> predicted, measured;
  std::vector<bool> predicted_fits;  // per ranked run: the plan is predicted to fit in memory
  int verdicts = 0, agree = 0, ran = 0, ran_predicted_oom = 0, oom_predicted_fit = 0;
  double gpu_s_per_token = 0;  // GPUs / tokens per step: a step time in GPU-seconds per token
};

// The software profile of a row's kernel column, or nullptr for a column not ranked here.
const Software* profile_for(const std::string& set, const std::string& kernel, const Software& eager_norm,
                            const Software& fused_norm) {
  const bool seqpar_set = set.find("-seqpar") != std::string::npos;
  if (!seqpar_set && kernel == "flash_attention2") return &eager_norm;
  if (seqpar_set && kernel == "flash_attention2 + RMS kernel") return &fused_norm;
  return nullptr;
}

// Which rows of a set are ranked, under which profile (nullptr: not ranked).
using ColumnProfile = std::function<const Software*(const std::string& set, const std::string& kernel)>;

std::map<std::string, SetResult> predict_sets(const ColumnProfile& profile_of) {
  const auto data = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/published/multi_layout_sets.json");
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  std::map<std::string, SetResult> sets;
  for (const auto& r : data.at("rows")) {
    const std::string set = r.at("set"), outcome = r.at("outcome");
    const Software* sw = profile_of(set, r.at("attention_kernel"));
    if (!sw || (outcome != "ok" && outcome != "oom")) continue;
    const int seq = set.find("-seq8192-") != std::string::npos ? 8192 : 2048;
    const ModelSpec m = llama_of(set, seq);
    Strategy s;
    s.tp = r.at("tp");
    s.pp = r.at("pp");
    s.dp = r.at("dp");
    s.zero = 1;  // optimizer states sharded over data parallelism (the file's "assumed")
    s.micro_batch = r.at("micro_batch");
    s.global_batch = r.at("global_batch");
    s.seq_len = seq;
    s.recompute = r.at("recompute") == "full" ? Recompute::full : Recompute::none;
    s.sequence_parallel = r.at("sequence_parallel").get<bool>() && s.tp > 1;
    s.dtype = Dtype::bf16;
    EXPECT_EQ(s.gpus(), r.at("gpus").get<int>()) << set << " trial " << r.at("trial");
    const Estimate e = predict(LayerGraph(m, seq), c, *sw, s);
    SetResult& out = sets[set];
    out.verdicts += 1;
    out.agree += e.feasible == (outcome == "ok");
    if (outcome != "ok") {
      out.oom_predicted_fit += e.feasible;
      continue;
    }
    out.ran += 1;
    out.ran_predicted_oom += !e.feasible;
    out.predicted.push_back(e.time.step);
    out.measured.push_back(r.at("step_time_s"));
    out.predicted_fits.push_back(e.feasible);
    out.gpu_s_per_token = static_cast<double>(s.gpus()) / (static_cast<double>(s.global_batch) * seq);
  }
  return sets;
}

// The sets on the columns ranked here (profile_for).
std::map<std::string, SetResult> predict_ranked_sets() {
  const Software eager_norm = load_software("aleph-alpha-scaling", TRAINPLAN_SOURCE_DIR);
  const Software fused_norm = load_software("aleph-alpha-scaling-rms", TRAINPLAN_SOURCE_DIR);
  return predict_sets(
      [&](const std::string& set, const std::string& kernel) { return profile_for(set, kernel, eager_norm, fused_norm); });
}

// Mean of |predicted / measured - 1| over a set's runs.
double mean_abs_error(const SetResult& r) {
  double sum = 0;
  for (std::size_t i = 0; i < r.predicted.size(); ++i) sum += std::abs(r.predicted[i] / r.measured[i] - 1);
  return sum / static_cast<double>(r.predicted.size());
}

TEST(ValidationRanking, Hagemann2023LayoutOrderPerSet) {
  const std::map<std::string, SetResult> sets = predict_ranked_sets();
  ASSERT_EQ(sets.size(), 10u);
  int verdicts = 0, agree = 0, ran = 0, ran_predicted_oom = 0, oom_predicted_fit = 0, met = 0;
  for (const auto& [set, r] : sets) {
    ASSERT_GE(r.predicted.size(), 7u) << set;
    const double rho = spearman(r.predicted, r.measured);
    const double mae = mean_abs_error(r);
    const auto known = kKnownMisses.find(set);
    std::printf("%-40s %3zu runs  Spearman %.3f  mean abs. step error %5.1f%%  memory verdicts %3d/%3d agree%s%s\n",
                set.c_str(), r.predicted.size(), rho, 100 * mae, r.agree, r.verdicts,
                known != kKnownMisses.end() ? "  KNOWN MISS: " : "", known != kKnownMisses.end() ? known->second.second : "");
    EXPECT_GE(rho, known != kKnownMisses.end() ? known->second.first : 0.9) << set;
    met += rho >= 0.9;
    verdicts += r.verdicts;
    agree += r.agree;
    ran += r.ran;
    ran_predicted_oom += r.ran_predicted_oom;
    oom_predicted_fit += r.oom_predicted_fit;
  }
  std::printf("%d of %zu sets at Spearman >= 0.9; memory verdicts agree on %d of %d rows; %d of %d runs that ran "
              "predicted out of memory; %d of %d that ran out of memory predicted to fit\n",
              met, sets.size(), agree, verdicts, ran_predicted_oom, ran, oom_predicted_fit, verdicts - ran);
  EXPECT_GE(agree, 0.9 * verdicts);
  EXPECT_LE(ran_predicted_oom, 0.06 * ran);
}

// Tolerance: in at least 8 of the 10 sets, one of the three layouts trainplan ranks first ran within
// 3% of the set's measured best (9 today; the exception, 13B at 2k on 32 GPUs, loses its two fastest
// layouts to the memory model, which predicts them out of memory at 88.6 GB though they ran).
TEST(ValidationRanking, Hagemann2023TopLayoutsRunNearTheBest) {
  const std::map<std::string, SetResult> sets = predict_ranked_sets();
  int near = 0;
  for (const auto& [set, r] : sets) {
    // Of the runs predicted to fit: a planner does not offer a layout it predicts out of memory.
    const double first = testing::top_regret(r.predicted, r.measured, 1, r.predicted_fits);
    const double three = testing::top_regret(r.predicted, r.measured, 3, r.predicted_fits);
    std::printf("%-40s first-ranked layout %5.1f%% slower than the measured best; best of the top 3 %5.1f%%\n",
                set.c_str(), 100 * first, 100 * three);
    near += three <= 0.03;
  }
  std::printf("%d of %zu sets: one of the top 3 within 3%% of the measured best (bound: 8)\n", near, sets.size());
  EXPECT_GE(near, 8);
}

// Per model, as a planner compares the layouts of one model across the GPU counts and sequence
// lengths it might run: every set of the model pooled, each run's step time in GPU-seconds per
// token (GPUs x step / tokens per step, which leaves the order inside a set as it is). Pooling adds
// the differences between sets, which are easier to rank than those inside one, so the per-set
// figures above stay the stricter test; per model and sequence length is printed beside.
TEST(ValidationRanking, Hagemann2023LayoutOrderPerModel) {
  const std::map<std::string, SetResult> sets = predict_ranked_sets();
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by_model, by_model_seq;
  for (const auto& [set, r] : sets) {
    const std::string model = set.substr(set.find('-') + 1, set.find('-', set.find('-') + 1) - set.find('-') - 1);
    const std::string seq = set.find("-seq8192-") != std::string::npos ? "8K" : "2K";
    for (std::size_t i = 0; i < r.predicted.size(); ++i) {
      for (auto* pool : {&by_model[model], &by_model_seq[model + " " + seq]}) {
        pool->first.push_back(r.predicted[i] * r.gpu_s_per_token);
        pool->second.push_back(r.measured[i] * r.gpu_s_per_token);
      }
    }
  }
  ASSERT_EQ(by_model.size(), 3u);
  for (const auto& [key, pm] : by_model_seq)
    std::printf("%-8s %3zu runs  Spearman %.3f  (per model and sequence length; printed only)\n", key.c_str(), pm.first.size(),
                spearman(pm.first, pm.second));
  for (const auto& [model, pm] : by_model) {
    const double rho = spearman(pm.first, pm.second);
    std::printf("%-8s %3zu runs  Spearman %.3f  (per model)\n", model.c_str(), pm.first.size(), rho);
    EXPECT_GE(rho, 0.9) << model;
  }
}

// The same sweep's FlashAttention 1.0.8 column, ranked on its own (printed only, not asserted):
// no shipped profile describes that kernel's speed on A100, so its rows are predicted under
// aleph-alpha-scaling, whose attention runs at FlashAttention-2's. That shifts the step times
// (the 8K sets' errors are large), but within a column every layout runs the same kernel, so
// the order is the model's: a check of generality on measurements nothing here was chosen on.
TEST(ValidationRanking, Hagemann2023FlashAttention1ColumnPrintedOnly) {
  const Software eager_norm = load_software("aleph-alpha-scaling", TRAINPLAN_SOURCE_DIR);
  const std::map<std::string, SetResult> sets = predict_sets([&](const std::string& set, const std::string& kernel) {
    return set.find("-seqpar") == std::string::npos && kernel == "flash_attentionv1.0.8" ? &eager_norm : nullptr;
  });
  ASSERT_EQ(sets.size(), 5u);
  int met = 0;
  for (const auto& [set, r] : sets) {
    ASSERT_GE(r.predicted.size(), 7u) << set;
    const double rho = spearman(r.predicted, r.measured);
    std::printf("%-40s %3zu runs  Spearman %.3f  mean abs. step error %5.1f%%  (FlashAttention 1.0.8 column; printed only)\n",
                set.c_str(), r.predicted.size(), rho, 100 * mean_abs_error(r));
    met += rho >= 0.9;
  }
  std::printf("%d of %zu FlashAttention 1.0.8 sets at Spearman >= 0.9 (printed only)\n", met, sets.size());
}

}  // namespace
}  // namespace trainplan
