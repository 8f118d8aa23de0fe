// Validation of MoE step times: NVIDIA's published Megatron-Bridge MoE pre-training runs
// (tests/data/published/megatron_bridge_moe.json: DeepSeek-V3 on GB200 NVL72, Qwen3-30B-A3B and
// Qwen3-235B-A22B on DGX H100 and DGX B200, NeMo containers 25.09 to 26.06.01), predicted with the
// megatron-core profile on the shipped clusters, each row with its expert layout (ep, etp), its
// dispatcher, capacity factor, A2A overlap and recomputed modules. Layer counts that do not split
// evenly over pp x vp (61 over 16 chunks, 94 over 8, 16 or 32) are split by cost (partition_layers),
// the first and last chunks taking fewer layers beside the embedding and the head, as Megatron's
// uneven pipeline layouts do; no row is refused. The megatron-core profile's overlap.ep is fitted
// on the rows that run with the all-to-all overlap (AllToAllOverlapShareFit below) and its
// moe.host_per_expert_gemm_us on all of them (ExpertGemmHostTimeFit); nothing else was fitted on
// these rows. The MoE layer's kernel counts and its host wait at the dispatch are read from
// Megatron-core's code (the profile's moe.source).
// Target tolerances: every row within 20% of the published step time, mean absolute error at most
// 12%. Rows the model misses are listed below with a wider bound and the reason, so that they
// cannot get worse unnoticed; the target is NOT met for them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "sim/json_reader.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"
#include "test_helpers.hpp"
#include "validation/published_rows.hpp"

namespace trainplan {
namespace {

constexpr double kRowTarget = 0.20, kMeanTarget = 0.12;

struct KnownMiss {
  double bound;
  const char* reason;
};
// Two known misses, the same layout on the same 16 H100s (ep 8 in a node, micro-batch 1, 16 local
// experts) in two containers: row 12 (26.02) and row 19 (26.02.01), which the point release
// publishes 1.77x faster (9,058 against 5,113 tokens/s/GPU). No cost of the layout meets both. The
// model sits between them: its time for this layout is bound by the host launching 16 expert GEMMs
// a layer after the dropless dispatch's wait, and the perf recipes of this model on H100 capture
// attention, router and token preprocessing in CUDA graphs (cuda_graph_scope), which trainplan does
// not model (it charges those kernels' launches). Both rows are held to their bound and kept out of
// the fit below.
const char* kContainerPair =
    "the same layout is published 1.77x faster by 26.02.01 (row 19) than by 26.02 (row 12); CUDA graphs not modelled";
const std::map<int, KnownMiss> kKnownMisses = {{12, {0.35, kContainerPair}}, {19, {0.45, kContainerPair}}};

nlohmann::json read_rows() {
  return read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/published/megatron_bridge_moe.json").at("rows");
}

// The dispatcher a row ran: the table's, else the head recipe's, else the model provider's
// default (alltoall for Qwen3 MoE; the file's `assumed`). "flex/hybridep" is trainplan's flex.
Dispatcher row_dispatcher(const nlohmann::json& r) {
  std::string name;
  if (!r.at("moe").at("dispatcher").is_null()) {
    name = r.at("moe").at("dispatcher");
  } else if (!r.at("recipe_at_head").is_null() && r.at("recipe_at_head").contains("dispatcher")) {
    name = r.at("recipe_at_head").at("dispatcher");
  } else {
    name = "alltoall";
  }
  if (name.starts_with("flex")) name = "flex";
  return *parse_dispatcher(name);
}

// A row's layout, from its flags in trainplan's spelling (every row states ep and etp) and its MoE
// settings.
Strategy row_strategy(const nlohmann::json& r) {
  const nlohmann::json& f = r.at("flags");
  EXPECT_TRUE(f.contains("ep") && f.contains("etp")) << f.dump();
  Strategy s = testing::strategy_from_flags(f);
  const nlohmann::json& moe = r.at("moe");
  EXPECT_EQ(moe.at("routing"), "force-balanced");  // moe_imbalance 1, the default
  if (moe.at("token_drop") == "tokendrop") s.capacity_factor = moe.at("capacity_factor");
  s.dispatcher = row_dispatcher(r);
  const nlohmann::json& head = r.at("recipe_at_head");
  if (!head.is_null()) {
    s.moe_a2a_overlap = head.value("moe_a2a_overlap", false);
    // full_iteration: one graph per step (Strategy::cuda_graphs); "transformer_engine:attn,..."
    // the per-layer capture of those regions (Strategy::cuda_graph_modules).
    const std::string graph = head.value("cuda_graph", "");
    if (graph == "full_iteration") s.cuda_graphs = CudaGraphs::full;
    if (graph.starts_with("transformer_engine:"))
      s.cuda_graph_modules = parse_cuda_graph_modules(graph.substr(graph.find(':') + 1)).value();
    std::string modules;
    for (const auto& name : head.value("recompute_modules", nlohmann::json::array()))
      modules += (modules.empty() ? "" : ",") + name.get<std::string>();
    s.recompute_modules = *parse_recompute_modules(modules);
  }
  return s;
}

struct RowResult {
  bool predicted = false;
  double step = 0, published = 0;
};

RowResult predict_row(const nlohmann::json& r, int index, const Software& sw, bool print) {
  const ModelSpec m = parse_hf_config(r.at("model"), fmt::format("rows[{}]", index));
  const Cluster c = testing::builtin_cluster(r.at("cluster").get<std::string>().c_str());
  const Strategy s = row_strategy(r);
  EXPECT_EQ(s.gpus(), r.at("flags").at("gpus").get<int>()) << index;
  const std::string label = fmt::format("{} {}L", r.at("model").at("model_type").get<std::string>(), m.layers);
  const std::string row = fmt::format("{:>2} {:<15} {:<8} {:<11} {:>3} GPUs {:<6} {}", index, label,
                                      r.at("container").get<std::string>(), r.at("cluster").get<std::string>(),
                                      s.gpus(), r.at("precision").get<std::string>(), describe(s));
  if (auto why = validate(s, m)) {
    if (print) std::printf("%s  NOT PREDICTED: %s\n", row.c_str(), why->c_str());
    return {};
  }
  const Estimate e = predict(LayerGraph(m, s.seq_len), c, sw, s);
  // Two 25.09 rows do not fit trainplan's memory model (the recipe must recompute or offload what
  // the table does not state); their step time is compared all the same.
  EXPECT_TRUE(e.feasible || testing::only_out_of_memory(e)) << index;
  const double published = r.at("expected_step_s");
  if (print) {
    const auto known = kKnownMisses.find(index);
    std::printf("%s  predicted %6.2f s  published %6.2f s  error %+5.1f%%%s%s\n", row.c_str(), e.time.step, published,
                100 * (e.time.step - published) / published, e.feasible ? "" : "  (does not fit in memory)",
                known != kKnownMisses.end() ? "  KNOWN MISS" : "");
    const TimeBreakdown& t = e.time;
    std::printf("     compute %.2f recompute %.2f tp %.2f ep %.2f pp %.2f dp %.2f bubble %.2f optimizer %.2f  mfu %.1f%%\n",
                t.compute, t.recompute, t.tp_comm, t.ep_comm, t.pp_comm, t.dp_comm_exposed, t.bubble, t.optimizer,
                100 * e.throughput.mfu);
  }
  return {true, e.time.step, published};
}

TEST(ValidationMoe, MegatronBridgeStepTimes) {
  const auto rows = read_rows();
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  double sum_abs = 0;
  int compared = 0, index = -1;
  for (const auto& r : rows) {
    ++index;
    const RowResult p = predict_row(r, index, sw, true);
    if (!p.predicted) continue;
    const double err = (p.step - p.published) / p.published;
    const auto known = kKnownMisses.find(index);
    EXPECT_LT(std::abs(err), known != kKnownMisses.end() ? known->second.bound : kRowTarget)
        << fmt::format("row {}: predicted {:.2f} s, published {:.2f} s{}", index, p.step, p.published,
                       known != kKnownMisses.end() ? std::string(": ") + known->second.reason : "");
    sum_abs += std::abs(err);
    ++compared;
  }
  const double mae = compared ? sum_abs / compared : 0;
  std::printf("mean absolute error %.2f%% over %d rows (target %.0f%%%s)\n", 100 * mae, compared, 100 * kMeanTarget,
              mae > kMeanTarget ? ": NOT MET" : "");
  EXPECT_EQ(compared, 20);
  EXPECT_LE(mae, kMeanTarget);
}

// The same rows as a user who knows only the published layout would run them: the layout flags
// alone (no dispatcher, all-to-all overlap, recomputed modules, pipeline accounting or capacity
// factor), every setting at its default and the dispatcher the profile's, as the CLI takes it for a
// model with experts. This checks the defaults rather than the row knobs: the held-out runs this
// project is judged on come as layouts. Bound: the 15% mean expected of held-out MoE runs.
TEST(ValidationMoe, LayoutFlagsAloneWithTheProfileDefaults) {
  const auto rows = read_rows();
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  double sum_abs = 0;
  int index = -1;
  for (const auto& r : rows) {
    ++index;
    nlohmann::json f = r.at("flags");
    for (const char* knob : {"moe-dispatcher", "moe-a2a-overlap", "recompute-modules", "pipeline-accounts"}) f.erase(knob);
    Strategy s = testing::strategy_from_flags(f);
    s.dispatcher = sw.moe.dispatcher;
    const ModelSpec m = parse_hf_config(r.at("model"), fmt::format("rows[{}]", index));
    ASSERT_FALSE(validate(s, m)) << index;
    const double step = predict(LayerGraph(m, s.seq_len), testing::builtin_cluster(r.at("cluster").get<std::string>().c_str()), sw, s).time.step;
    const double published = r.at("expected_step_s"), err = step / published - 1;
    std::printf("%2d %-11s %-8s %s  predicted %6.2f s  published %6.2f s  error %+5.1f%%\n", index,
                r.at("cluster").get<std::string>().c_str(), r.at("container").get<std::string>().c_str(),
                describe(s).c_str(), step, published, 100 * err);
    sum_abs += std::abs(err);
  }
  const double mae = sum_abs / static_cast<double>(rows.size());
  std::printf("layout flags alone: mean absolute error %.2f%% over %zu rows (bound 15%%)\n", 100 * mae, rows.size());
  EXPECT_LE(mae, 0.15);
}

// overlap.ep of the megatron-core profile, the share of the expert all-to-all that
// --overlap-moe-expert-parallel-comm hides behind another micro-batch's compute, is FITTED here:
// the candidate with the smallest mean absolute error over the rows that run with the overlap,
// each published layout (model, cluster, layout) weighted once. Those rows therefore no longer
// check that constant independently.
TEST(ValidationMoe, AllToAllOverlapShareFit) {
  const auto rows = read_rows();
  const Software profile = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  double best_share = -1, best_err = 1e9;
  for (double share : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    Software sw = profile;
    sw.overlap.ep = share;
    std::map<std::string, std::pair<double, int>> by_layout;  // layout -> (sum of |error|, rows)
    int index = -1;
    for (const auto& r : rows) {
      ++index;
      if (!row_strategy(r).moe_a2a_overlap) continue;
      const RowResult p = predict_row(r, index, sw, false);
      ASSERT_TRUE(p.predicted) << index;
      auto& [sum, n] = by_layout[r.at("model").at("model_type").get<std::string>() + " " + r.at("cluster").get<std::string>() +
                                 " " + describe(row_strategy(r))];
      sum += std::abs(p.step - p.published) / p.published;
      ++n;
    }
    double mean = 0;
    std::string parts;
    for (const auto& [layout, e] : by_layout) {
      mean += e.first / e.second / by_layout.size();
      parts += fmt::format("  {:.1f}%", 100 * e.first / e.second);
    }
    std::printf("overlap.ep %.2f: mean of the layouts' mean |error| %.1f%% (%s )\n", share, 100 * mean, parts.c_str());
    if (mean < best_err) best_share = share, best_err = mean;
  }
  EXPECT_EQ(profile.overlap.ep, best_share);
}

// moe.host_per_expert_gemm_us of the megatron-core profile, the host time Transformer Engine's
// GroupedLinear spends per expert GEMM beyond the launch, is FITTED here: the candidate with the
// smallest mean absolute error over every row but the known misses (a container's regression is
// not a cost of the layout), each published layout (model, cluster, layout) weighted once. It matters where many local experts share few tokens (qwen3 at ep 8-16 with
// micro-batch 1: 16 local experts, ~256 tokens each), not for DeepSeek-V3 or Qwen3-235B at ep 32-64
// (4 local experts), whose rows it leaves unchanged. Those rows therefore no longer check this
// constant independently.
TEST(ValidationMoe, ExpertGemmHostTimeFit) {
  const auto rows = read_rows();
  const Software profile = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  ASSERT_TRUE(profile.moe.gemm_per_expert);
  double best_us = -1, best_err = 1e9;
  for (double us : {0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 80.0, 100.0}) {
    Software sw = profile;
    sw.moe.host_per_expert_gemm = us * kMicro;
    std::map<std::string, std::pair<double, int>> by_layout;  // layout -> (sum of |error|, rows)
    int index = -1;
    for (const auto& r : rows) {
      ++index;
      if (kKnownMisses.contains(index)) continue;
      const RowResult p = predict_row(r, index, sw, false);
      ASSERT_TRUE(p.predicted) << index;
      auto& [sum, n] = by_layout[r.at("model").at("model_type").get<std::string>() + " " +
                                 r.at("cluster").get<std::string>() + " " + describe(row_strategy(r))];
      sum += std::abs(p.step - p.published) / p.published;
      ++n;
    }
    double mean = 0;
    for (const auto& [layout, e] : by_layout) mean += e.first / e.second / by_layout.size();
    std::printf("moe.host_per_expert_gemm_us %3.0f: mean of the %zu layouts' mean |error| %.1f%%\n", us,
                by_layout.size(), 100 * mean);
    if (mean < best_err) best_us = us, best_err = mean;
  }
  EXPECT_DOUBLE_EQ(profile.moe.host_per_expert_gemm, best_us * kMicro);
}

// GPT-OSS 120B in BF16 on 64 GPUs of five systems (tests/data/published/megatron_bridge_gpt_oss.json,
// NeMo 26.04.01 with its recipes' knobs): a tracked gap, NOT the 20% target. trainplan predicts
// these runs 16-35% fast (their memory verdicts right: every one fits), while the same layouts publish within
// 6% of each other across five containers, so the runs are not one release's regression. Each
// row is held to 40% and the mean to 30% so that the gap cannot widen unnoticed. The clamped activation and the
// experts' eager output biases are costed (megatron-core's glu_clamp and moe.expert_bias), and so
// is the YaRN-scaled RoPE that Megatron-core runs unfused (rope_scaled); the rest is not known (the
// learnable-softmax attention runs through cuDNN only, 64-wide heads, and the recipes' CUDA graphs
// are not modelled).
TEST(ValidationMoe, GptOssRowsTracked) {
  const auto data = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/published/megatron_bridge_gpt_oss.json");
  const ModelSpec m = load_model("gpt-oss-120b", TRAINPLAN_SOURCE_DIR);
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  double sum_abs = 0;
  int rows = 0;
  for (const auto& r : data.at("rows")) {
    const nlohmann::json& f = r.at("flags");
    const Strategy s = testing::strategy_from_flags(f);
    ASSERT_EQ(s.gpus(), f.at("gpus").get<int>());
    ASSERT_FALSE(validate(s, m).has_value()) << r.at("system");
    const Estimate e = predict(LayerGraph(m, s.seq_len), testing::builtin_cluster(r.at("cluster").get<std::string>().c_str()), sw, s);
    EXPECT_TRUE(e.feasible) << r.at("system") << ": the run fitted";
    const double published = r.at("expected_step_s"), err = (e.time.step - published) / published;
    std::printf("gpt-oss-120b %-9s %s  predicted %5.2f s  published %5.2f s  error %+5.1f%%%s  (tracked, not met)\n",
                r.at("system").get<std::string>().c_str(), describe(s).c_str(), e.time.step, published, 100 * err,
                e.feasible ? "" : "  (predicted out of memory)");
    EXPECT_LT(std::abs(err), 0.4) << r.at("system");
    sum_abs += std::abs(err);
    ++rows;
  }
  EXPECT_EQ(rows, 5);
  EXPECT_LT(sum_abs / rows, 0.3);
  std::printf("gpt-oss-120b: mean absolute error %.1f%% over %d rows (tracked gap; the MoE target is 12%%)\n",
              100 * sum_abs / rows, rows);
}

// NVIDIA's newest published MoE table (NeMo 26.08, MXFP8 on GB300 and GB200 NVL72) with its
// recipes' knobs: HybridEP, the all-to-all overlap and one CUDA graph per iteration are modelled
// (--moe-dispatcher flex --moe-a2a-overlap on --cuda-graphs full); the fused grouped experts and FP8
// attention those recipes add have no costs here (each row of the file lists them). Tracked, not
// fitted: each row is held to 35% and the mean to 20% so the gap cannot widen unnoticed; the 12%
// target is not claimed for these rows.
TEST(ValidationMoe, NewestContainerRowsTracked) {
  const auto data = read_json_file(std::string(TRAINPLAN_TEST_DATA_DIR) + "/published/megatron_bridge_moe_2608.json");
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  double sum_abs = 0, sum_abs_eager = 0;
  int rows = 0;
  for (const auto& r : data.at("rows")) {
    const ModelSpec m = load_model(r.at("model").get<std::string>(), TRAINPLAN_SOURCE_DIR);
    const nlohmann::json& f = r.at("flags");
    const Strategy s = testing::strategy_from_flags(f);
    const std::string label = fmt::format("{} {}", m.name, r.at("system").get<std::string>());
    ASSERT_EQ(s.gpus(), f.at("gpus").get<int>()) << label;
    ASSERT_EQ(s.cuda_graphs, CudaGraphs::full) << label;
    ASSERT_FALSE(validate(s, m).has_value()) << label;
    const Cluster c = testing::builtin_cluster(r.at("cluster").get<std::string>().c_str());
    const LayerGraph g(m, s.seq_len);
    const Estimate e = predict(g, c, sw, s);
    const double published = r.at("expected_step_s"), err = (e.time.step - published) / published;
    std::printf("%-28s %s  predicted %6.2f s  published %6.2f s  error %+5.1f%%%s  (tracked)\n", label.c_str(),
                describe(s).c_str(), e.time.step, published, 100 * err, e.feasible ? "" : "  (predicted out of memory)");
    EXPECT_LT(std::abs(err), 0.35) << label;
    sum_abs += std::abs(err);
    Strategy eager = s;  // what the knobs modelled add: the same layout without them
    eager.cuda_graphs = CudaGraphs::none;
    eager.moe_a2a_overlap = false;
    sum_abs_eager += std::abs(predict(g, c, sw, eager).time.step / published - 1);
    ++rows;
  }
  ASSERT_EQ(rows, 8);
  std::printf("NeMo 26.08 MoE rows: mean absolute error %.1f%% over %d rows (tracked; bound 20%%); %.1f%% without the "
              "all-to-all overlap and the CUDA graph\n",
              100 * sum_abs / rows, rows, 100 * sum_abs_eager / rows);
  EXPECT_LT(sum_abs / rows, 0.20);
}

// DeepSeek-V3 as its technical report trained it (DeepSeek-AI 2024, arXiv:2412.19437), on the
// hgx-h800 cluster file (H800s with the NVLink and InfiniBand bandwidths that report states):
// 2,048 H800s; 16-way pipeline, 64-way expert parallelism over 8 nodes, ZeRO-1 data parallelism, no
// TP (Sec. 3.2); FP8 (Sec. 3.3); sequence 4K and the final batch of 15,360 sequences (Sec. 4.2);
// RMSNorm and MLA up-projections recomputed (Sec. 3.2.3); the MTP module trained (Sec. 2.2, the
// shipped model's mtp_layers 1). Published: 180K H800 GPU-hours per trillion tokens (Sec. 1 and
// Table 1), 1,543 tokens/s/GPU, 19.91 s per step of 62.9M tokens. Not modelled: DualPipe, whose
// bidirectional schedule hides the all-to-all under computation; it is costed as 1F1B with the
// all-to-all overlap (--moe-a2a-overlap), the nearest schedule trainplan has; the HAI-LLM stack is
// costed as megatron-core (DeepEP-style node-limited dispatch: flex). Memory is printed, not
// checked: the report keeps AdamW moments in BF16 and caches activations in FP8 (Sec. 3.3.3) and
// shares the MTP head with the last stage's, which trainplan does not model. Checked, not fitted;
// bound: the 15% expected of held-out MoE runs.
TEST(ValidationMoe, DeepSeekV3TechnicalReportRate) {
  const ModelSpec m = load_model("deepseek-v3", TRAINPLAN_SOURCE_DIR);
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  Strategy s;
  s.pp = 16;
  s.dp = 128;
  s.ep = 64;
  s.zero = 1;
  s.dtype = Dtype::fp8;
  s.micro_batch = 1;
  s.global_batch = 15360;
  s.seq_len = 4096;
  s.recompute_modules = kRecomputeLayernorm | kRecomputeMlaUpProj;
  s.moe_a2a_overlap = true;
  s.dispatcher = sw.moe.dispatcher;
  ASSERT_EQ(s.gpus(), 2048);
  ASSERT_FALSE(validate(s, m));
  const Estimate e = predict(LayerGraph(m, s.seq_len), testing::builtin_cluster("hgx-h800"), sw, s);
  const double tokens = static_cast<double>(s.global_batch) * s.seq_len;
  const double published = tokens / (1e12 / (180e3 * 3600) * s.gpus());  // 180K GPU-hours per 1e12 tokens
  const double err = e.time.step / published - 1;
  std::printf("deepseek-v3 hgx-h800 %s  predicted %.2f s  published %.2f s  error %+.1f%%  (peak %.1f GB of %.1f GB%s)\n",
              describe(s).c_str(), e.time.step, published, 100 * err, e.peak_memory / 1e9, e.capacity / 1e9,
              e.feasible ? "" : ": does not fit in trainplan's memory model");
  EXPECT_NEAR(published, 19.91, 0.01);
  EXPECT_LT(std::abs(err), 0.15);
}

// Ordering: within each model, cluster and GPU count with more than one published layout, the
// layouts ranked by predicted tokens/s must rank as the published ones do (a layout published in
// several containers counts with the mean of its rows' throughput). A swap the model makes is
// listed in kKnownSwaps as "better layout > worse layout" (published order) with the reason.
const std::map<std::string, const char*> kKnownSwaps = {};

TEST(ValidationMoe, LayoutOrderWithinEachSet) {
  const auto rows = read_rows();
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  struct Layout {
    double published = 0, predicted = 0;  // tokens/s, summed over its rows
    int rows = 0;
  };
  std::map<std::string, std::map<std::string, Layout>> sets;  // set -> layout -> throughput
  int index = -1;
  for (const auto& r : rows) {
    ++index;
    const RowResult p = predict_row(r, index, sw, false);
    if (!p.predicted) continue;
    const Strategy s = row_strategy(r);
    const double tokens = static_cast<double>(s.global_batch) * s.seq_len;
    const std::string set = fmt::format("{} {}L on {} x {}", r.at("model").at("model_type").get<std::string>(),
                                        r.at("model").at("num_hidden_layers").get<int>(), s.gpus(),
                                        r.at("cluster").get<std::string>());
    Layout& l = sets[set][describe(s)];
    l.published += tokens / p.published;
    l.predicted += tokens / p.step;
    ++l.rows;
  }
  int checked = 0;
  for (const auto& [set, layouts] : sets) {
    if (layouts.size() < 2) continue;
    std::vector<std::pair<std::string, Layout>> v(layouts.begin(), layouts.end());
    auto order = [&](auto key) {
      std::vector<std::pair<std::string, Layout>> o = v;
      std::sort(o.begin(), o.end(), [&](const auto& a, const auto& b) { return key(a.second) / a.second.rows > key(b.second) / b.second.rows; });
      std::string text;
      for (const auto& [name, l] : o) text += fmt::format("\n      {:>9.0f} tokens/s  {}", key(l) / l.rows, name);
      return std::make_pair(o, text);
    };
    const auto [published, published_text] = order([](const Layout& l) { return l.published; });
    const auto [predicted, predicted_text] = order([](const Layout& l) { return l.predicted; });
    std::printf("%s\n  published:%s\n  predicted:%s\n", set.c_str(), published_text.c_str(), predicted_text.c_str());
    for (std::size_t i = 0; i < published.size(); ++i) {
      for (std::size_t j = i + 1; j < published.size(); ++j) {
        const Layout& a = published[i].second;
        const Layout& b = published[j].second;
        const bool swapped = a.predicted / a.rows < b.predicted / b.rows;
        const std::string pair = published[i].first + " > " + published[j].first;
        const bool known = kKnownSwaps.contains(pair);
        if (swapped) std::printf("  SWAP: %s%s\n", pair.c_str(), known ? "  KNOWN" : "");
        EXPECT_EQ(swapped, known) << set << ": " << pair;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 5);
}

}  // namespace
}  // namespace trainplan
