// Console formatting shared by every command (reports/console.hpp), the exec summary
// (reports/measurement_console.hpp) and the per-layer detail of predict --detail layers
// (sim/layer_detail.hpp): the rows must add up to the stage figures predict reports.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sstream>

#include "default_software.hpp"
#include "reports/console.hpp"
#include "reports/measurement_console.hpp"
#include "reports/prediction_json.hpp"
#include "sim/layer_detail.hpp"
#include "sim/search.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

TEST(Format, SecondsUseAFixedNumberOfDecimalsPerUnit) {
  EXPECT_EQ(format_seconds(0), "0 s");
  EXPECT_EQ(format_seconds(51.1254), "51.125 s");
  EXPECT_EQ(format_seconds(1.0), "1.000 s");
  EXPECT_EQ(format_seconds(0.04567), "45.67 ms");
  EXPECT_EQ(format_seconds(0.001), "1.00 ms");
  EXPECT_EQ(format_seconds(789.04e-6), "789.0 us");
  EXPECT_EQ(format_seconds(-0.0123), "-12.30 ms") << "differences keep their sign and the unit of their size";
}

TEST(Format, BytesAreDecimalWithOneDecimal) {
  EXPECT_EQ(format_bytes(80e9), "80.0 GB");
  EXPECT_EQ(format_bytes(12.345e9), "12.3 GB");
  EXPECT_EQ(format_bytes(512e6), "512.0 MB");
  EXPECT_EQ(format_bytes(1536), "1.5 kB");
  EXPECT_EQ(format_bytes(12), "12 B");
  EXPECT_EQ(format_bytes(-2.5e9), "-2.5 GB");
  EXPECT_EQ(format_bytes(1073741824.0), "1.1 GB") << "1 GiB is 1.07 decimal GB";
}

TEST(Format, UsdAndCounts) {
  EXPECT_EQ(format_usd(1234.4), "$1234");
  EXPECT_EQ(format_usd(12.345), "$12.35");
  EXPECT_EQ(format_usd(0.012345), "$0.0123");
  EXPECT_EQ(format_count(830), "830");
  EXPECT_EQ(format_count(124.4e6), "124.4M");
}

Measurement cpu_run() {
  Measurement m;
  m.model = "tiny-gpt";
  m.strategy.dp = 2;
  m.strategy.global_batch = 4;
  m.strategy.micro_batch = 2;
  m.strategy.seq_len = 64;
  m.strategy.dtype = Dtype::bf16;
  m.backend = "gloo";
  m.device = "cpu";
  m.warmup = 2;
  m.steps = 2;
  for (int i = 0; i < 2; ++i) {
    StepRecord r;
    r.step = m.warmup + i;
    r.loss = 10 - i;
    r.wall = 0.0251 + i * 0.001;
    m.per_step.push_back(r);
  }
  m.step_time.median = 0.0256;
  m.per_stage.push_back({});
  m.per_stage.back().peak = 3 * 1048576.0;
  m.environment["compute_dtype"] = "fp32";
  return m;
}

TEST(MeasurementConsole, NumbersStepsFromOneAndSaysWhatRan) {
  std::ostringstream os;
  print_measurement(os, cpu_run());
  const std::string out = os.str();
  EXPECT_TRUE(testing::Contains(out, "2 CPU ranks"));
  EXPECT_EQ(out.find("GPU"), std::string::npos) << out;
  EXPECT_TRUE(testing::Contains(out, "dtype fp32 (the plan asked for bf16)"));
  EXPECT_TRUE(testing::Contains(out, "\n     1 ")) << "the first measured step is step 1:\n" << out;
  EXPECT_TRUE(testing::Contains(out, "\n     2 "));
  EXPECT_EQ(out.find("\n     3 "), std::string::npos) << "warm-up steps are not counted in:\n" << out;
  EXPECT_TRUE(testing::Contains(out, "25.10 ms"));
  EXPECT_TRUE(testing::Contains(out, "peak memory, stage 0: 3.1 MB")) << "decimal units, not MiB:\n" << out;
  EXPECT_EQ(out.find("MiB"), std::string::npos);
  EXPECT_TRUE(testing::Contains(out, "per CPU rank"));
}

TEST(MeasurementConsole, GpuRunShowsTheAutocastDtype) {
  Measurement m = cpu_run();
  m.device = "cuda";
  m.backend = "nccl";
  m.environment["compute_dtype"] = "bf16 (autocast, fp32 master)";
  std::ostringstream os;
  print_measurement(os, m);
  EXPECT_TRUE(testing::Contains(os.str(), "2 GPUs"));
  EXPECT_TRUE(testing::Contains(os.str(), "dtype bf16 (autocast, fp32 master)\n"));
}

struct Plan {
  ModelSpec model = testing::gpt(12, 1024, 16, 1024);
  LayerGraph graph{model, 1024};
  Cluster cluster = testing::builtin_cluster("dgx-a100-80g");
};

Strategy pipeline(int pp, int vp, Recompute rc) {
  Strategy s;
  s.dp = 2;
  s.tp = 2;
  s.pp = pp;
  s.vp = vp;
  if (vp > 1) s.schedule = ScheduleKind::interleaved;
  s.zero = 1;
  s.micro_batch = 1;
  s.global_batch = 16;
  s.seq_len = 1024;
  s.recompute = rc;
  return s;
}

// Per stage: the rows' forward/backward/recompute/TP times (a layer range counted `count` times)
// add up to the stage's chunks, and their model states and activations to predict's stage memory.
void expect_rows_add_up(const Plan& p, const Strategy& s) {
  const StepCosts costs = step_costs(p.graph, p.cluster, s);
  const Estimate e = compose(costs, p.graph, p.cluster, s);
  const auto detail = layer_detail(costs);
  ASSERT_EQ(detail.size(), static_cast<std::size_t>(s.pp));
  int layers = 0;
  for (const StageDetail& d : detail) {
    double fwd = 0, bwd = 0, rc = 0, tp = 0, weights = 0, grads = 0, opt = 0, act = 0;
    for (const LayerRow& r : d.rows) {
      fwd += r.count * r.forward;
      bwd += r.count * r.backward;
      rc += r.count * r.recompute;
      tp += r.count * r.tp_comm;
      weights += r.count * r.weights;
      grads += r.count * r.gradients;
      opt += r.count * r.optimizer;
      act += r.count * r.activations;
      if (r.kind == LayerRow::Kind::layers) layers += r.count;
    }
    const StageMemory& m = e.per_stage[static_cast<std::size_t>(d.stage)];
    EXPECT_NEAR(fwd, d.forward, 1e-9 * d.forward) << "stage " << d.stage;
    EXPECT_NEAR(bwd, d.backward, 1e-9 * d.backward);
    EXPECT_NEAR(rc, d.recompute, 1e-9 * d.recompute + 1e-15);
    EXPECT_NEAR(tp, d.tp_comm, 1e-9 * d.tp_comm);
    EXPECT_NEAR(weights, m.weights, 1e-9 * m.weights);
    EXPECT_NEAR(grads, m.gradients, 1e-9 * m.gradients);
    EXPECT_NEAR(opt, m.optimizer, 1e-9 * m.optimizer);
    EXPECT_NEAR(act + d.working_layer, m.activations, 1e-9 * m.activations) << "stage " << d.stage;
  }
  EXPECT_EQ(layers, p.model.layers);
  EXPECT_EQ(detail.front().rows.front().kind, LayerRow::Kind::embedding);
  EXPECT_EQ(detail.back().rows.back().kind, LayerRow::Kind::head);
}

TEST(LayerDetail, RowsAddUpToTheStageFigures) {
  const Plan p;
  expect_rows_add_up(p, pipeline(1, 1, Recompute::none));
  expect_rows_add_up(p, pipeline(2, 1, Recompute::selective));
  expect_rows_add_up(p, pipeline(2, 3, Recompute::none));
  expect_rows_add_up(p, pipeline(4, 1, Recompute::full));
}

TEST(LayerDetail, FullRecomputationRecomputesEachLayersForward) {
  const Plan p;
  const auto detail = layer_detail(step_costs(p.graph, p.cluster, pipeline(2, 1, Recompute::full)));
  const LayerRow& r = detail[1].rows.front();
  ASSERT_EQ(r.kind, LayerRow::Kind::layers);
  EXPECT_GT(r.forward, 0);
  EXPECT_DOUBLE_EQ(r.recompute, r.forward);
  EXPECT_GT(detail[1].working_layer, 0);
  EXPECT_GT(r.activations, 0);
}

TEST(LayerDetail, JsonCarriesEveryRow) {
  const Plan p;
  const auto detail = layer_detail(step_costs(p.graph, p.cluster, pipeline(2, 1, Recompute::none)));
  const auto j = layer_detail_to_json(detail);
  ASSERT_EQ(j["stages"].size(), 2u);
  EXPECT_EQ(j["stages"][0]["rows"][0]["part"], "embedding");
  EXPECT_EQ(j["stages"][1]["rows"].back()["part"], "head");
  EXPECT_EQ(j["stages"][0]["rows"][1]["count"].get<int>() + j["stages"][1]["rows"][0]["count"].get<int>(), 12);
}

// A chunk whose layers are of several kinds (gpt-oss alternates sliding-window and full attention)
// names each kind by its count within the chunk's range, not as a range of its own.
// The per-layer detail of a built-in expert model at sequence 4096 on dgx-h100: pp stages, dp x ep
// expert ranks (ZeRO-1, micro-batch 1, 8 micro-batches per replica).
std::vector<StageDetail> moe_detail(const char* model, int pp, int dp, int ep) {
  const LayerGraph g(load_model(model, TRAINPLAN_SOURCE_DIR), 4096);
  Strategy s;
  s.pp = pp;
  s.dp = dp;
  s.ep = ep;
  s.zero = 1;
  s.micro_batch = 1;
  s.global_batch = 8 * dp;
  s.seq_len = 4096;
  return layer_detail(step_costs(g, testing::builtin_cluster("dgx-h100"), s));
}

TEST(LayerDetail, MixedKindsAreNamedByCountWithinTheChunk) {
  const auto detail = moe_detail("gpt-oss-120b", 2, 8, 8);
  std::vector<std::string> names;
  for (const LayerRow& r : detail[1].rows) names.push_back(layer_row_name(r));
  // (the split gives the last stage, which holds the 201k-token head, 17 layers: 19-35)
  EXPECT_EQ(names, (std::vector<std::string>{"8 moe sliding in 19-35", "9 moe in 19-35", "LM head"}));
  LayerRow one;  // a chunk of one kind keeps its range
  one.first_layer = 3;
  one.count = one.chunk_layers = 58;
  one.layer_kind = LayerKind{true, AttentionWindow::full};
  EXPECT_EQ(layer_row_name(one), "layers 3-60 moe");
  one.layer_kind = LayerKind{};
  EXPECT_EQ(layer_row_name(one), "layers 3-60");
}

// DeepSeek-V3's multi-token-prediction module runs on the last stage beside the LM head and is
// costed in the head's row, which says so (its parameters are the head's and the module's).
TEST(LayerDetail, TheHeadRowNamesTheMtpModulesItIncludes) {
  const auto detail = moe_detail("deepseek-v3", 16, 16, 8);
  const LayerRow& head = detail.back().rows.back();
  ASSERT_EQ(head.kind, LayerRow::Kind::head);
  EXPECT_EQ(layer_row_name(head), "LM head + 1 MTP");
  EXPECT_EQ(layer_detail_to_json(detail)["stages"].back()["rows"].back()["mtp_layers"], 1);
  LayerRow plain;
  plain.kind = LayerRow::Kind::head;
  EXPECT_EQ(layer_row_name(plain), "LM head");
}

TEST(Cost, IsSearchsCostObjective) {
  const Plan p;
  const Estimate e = predict(p.graph, p.cluster, pipeline(2, 1, Recompute::none));
  const auto j = cost_to_json(e, p.cluster);
  ASSERT_TRUE(j.is_object());
  EXPECT_DOUBLE_EQ(j["usd_per_step"].get<double>(), p.cluster.price_per_gpu_hour * 8 * e.time.step / 3600);
  EXPECT_DOUBLE_EQ(j["usd_per_step"].get<double>(), objective_value(Objective::cost, e, p.cluster));
  Cluster free = p.cluster;
  free.price_per_gpu_hour = 0;
  EXPECT_TRUE(cost_to_json(e, free).is_null()) << "no price, no cost figure";
}

// Against a peak that is itself a measured matmul rate (calibrate on a CPU) MFU can pass 100%: the
// console says why rather than print the figure bare.
TEST(PredictionConsole, ExplainsAnMfuAboveOneHundredPercent) {
  const Plan p;
  Estimate e = predict(p.graph, p.cluster, pipeline(2, 1, Recompute::none));
  ASSERT_LT(e.throughput.mfu, 1);
  std::ostringstream plain;
  print_prediction(plain, e, "plan");
  EXPECT_EQ(plain.str().find("above 100%"), std::string::npos);
  e.throughput.mfu = e.throughput.hfu = 1.046;
  std::ostringstream high;
  print_prediction(high, e, "plan");
  EXPECT_NE(high.str().find("MFU 104.6%"), std::string::npos);
  EXPECT_NE(high.str().find("above 100%: against a peak that is a measured matmul rate"), std::string::npos);
}

// The headline MFU counts causal attention as computed (half the score matrix); the console and
// the estimate also give the full-attention figure Megatron-LM and NeMo publish, which is larger
// by the masked half of the attention cores' FLOPs.
TEST(PredictionConsole, NamesBothMfuConventions) {
  const Plan p;
  const Estimate e = predict(p.graph, p.cluster, pipeline(2, 1, Recompute::none));
  const Throughput& t = e.throughput;
  EXPECT_GT(t.mfu_full_attention, t.mfu);
  EXPECT_NEAR(t.mfu_full_attention / t.mfu, t.model_flops_per_step_full_attention / t.model_flops_per_step, 1e-12);
  std::ostringstream os;
  print_prediction(os, e, "plan");
  EXPECT_NE(os.str().find(fmt::format("MFU {:.1f}%, HFU", 100 * t.mfu)), std::string::npos) << os.str();
  EXPECT_NE(os.str().find(fmt::format("counting full attention as Megatron-LM and NeMo publish MFU: MFU {:.1f}%",
                                      100 * t.mfu_full_attention)),
            std::string::npos)
      << os.str();
}

// Out of memory, the console names the largest part of the stage that does not fit and the flags
// that shrink that part, leaving out what the layout already does.
TEST(PredictionConsole, OutOfMemoryNamesTheLargestPartAndWhatShrinksIt) {
  const ModelSpec m = load_model("llama3-8b", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 8192);
  const Cluster c = testing::builtin_cluster("dgx-h100");
  auto console = [&](int dp, int zero, Recompute rc, int mb) {
    Strategy s;
    s.dp = dp;
    s.zero = zero;
    s.recompute = rc;
    s.micro_batch = mb;
    s.global_batch = 8 * dp * mb;
    s.seq_len = 8192;
    const Estimate e = predict(g, c, s);
    EXPECT_FALSE(e.feasible);
    std::ostringstream os;
    print_prediction(os, e, "plan");
    return os.str();
  };
  // Eight replicas without ZeRO: Adam's states (12 B a parameter) are the largest part.
  const std::string states = console(8, 0, Recompute::none, 1);
  EXPECT_NE(states.find("largest part of stage 0 is its optimizer states"), std::string::npos) << states;
  EXPECT_NE(states.find("--zero 1 (shards them over the 8 data-parallel ranks)"), std::string::npos) << states;
  // Micro-batches of 16 x 8192 tokens with the states sharded: the activations are.
  const std::string act = console(8, 1, Recompute::none, 16);
  EXPECT_NE(act.find("largest part of stage 0 is its activations"), std::string::npos) << act;
  EXPECT_NE(act.find("--recompute selective or full; a smaller --micro-batch"), std::string::npos) << act;
  const std::string full = console(8, 1, Recompute::full, 64);
  EXPECT_EQ(full.find("--recompute selective or full"), std::string::npos) << "already recomputing everything: " << full;
  // A layout that fits gets no hint.
  std::ostringstream fits;
  const Plan p;
  print_prediction(fits, predict(p.graph, p.cluster, pipeline(2, 1, Recompute::none)), "plan");
  EXPECT_EQ(fits.str().find("hint:"), std::string::npos);
}

}  // namespace
}  // namespace trainplan
