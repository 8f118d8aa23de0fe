// Unit tests for sim/op_costs: the measured-table lookups (log-space interpolation between
// measured shapes, the edge rate held outside them, microseconds converted once) and the shipped
// H100 table against the measurements it was made from.
#include "sim/op_costs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "sim/json_reader.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

using nlohmann::json;
using testing::input_error;

// Two GEMM shapes two octaves apart in M: 1024 at 100 TFLOP/s, 4096 at 400 TFLOP/s.
json two_point_ops() {
  auto us = [](double m, double n, double k, double tflops) { return 2 * m * n * k / (tflops * 1e12) * 1e6; };
  json g = json::array();
  for (auto [m, r] : {std::pair{1024.0, 100.0}, std::pair{4096.0, 400.0}}) {
    const double t = us(m, 1024, 1024, r);
    g.push_back({{"m", m}, {"n", 1024}, {"k", 1024}, {"fwd_us", t}, {"dgrad_us", 2 * t}, {"wgrad_us", t}});
  }
  return json{{"source", "test"},
              {"measured_on", {{"gpu", "G"}, {"peak_tflops", 1000}, {"hbm_bandwidth_gbps", 2000}}},
              {"dtype", "bf16"},
              {"kernel_floor_us", 4},
              {"gemm", g},
              // causal fwd FLOPs 2 s^2 d bh: s 1024, d 64, bh 10 -> 1.342e9 FLOPs
              {"attention", json::array({json{{"seq", 1024}, {"head_dim", 64}, {"batch_heads", 10}, {"fwd_us", 10}, {"fwd_bwd_us", 35}},
                                         json{{"seq", 4096}, {"head_dim", 64}, {"batch_heads", 10}, {"fwd_us", 80}, {"fwd_bwd_us", 280}}})},
              {"memory_bound",
               {{"add", json::array({json{{"bytes", 1e6}, {"fwd_us", 10}, {"fwd_bwd_us", 30}},
                                     json{{"bytes", 1e8}, {"fwd_us", 100}, {"fwd_bwd_us", 300}}})},
                {"adamw_fused", json::array({json{{"bytes", 4e8}, {"step_us", 1000}}})}}}};
}

OpCostTables tables(const json& j) { return parse_op_costs(JsonObject(j, "t.json", "ops")); }

TEST(OpCosts, UnitsConvertedOnce) {
  const OpCostTables t = tables(two_point_ops());
  EXPECT_DOUBLE_EQ(t.kernel_floor, 4e-6);
  ASSERT_EQ(t.gemm.size(), 2u);
  EXPECT_NEAR(t.gemm[0].fwd, 2.0 * 1024 * 1024 * 1024 / 100e12, 1e-15);
  EXPECT_DOUBLE_EQ(t.attention[1].fwd_bwd, 280e-6);
  EXPECT_DOUBLE_EQ(t.memory[static_cast<int>(MemKernel::add)][1].bytes, 1e8);
  EXPECT_EQ(t.dtype, Dtype::bf16);
}

TEST(OpCosts, GemmExactAtMeasuredShapes) {
  const OpCostTables t = tables(two_point_ops());
  for (const auto& p : t.gemm) {
    EXPECT_NEAR(t.gemm_time(p.m, p.n, p.k, GemmPass::fwd), p.fwd, 1e-9 * p.fwd);
    EXPECT_NEAR(t.gemm_time(p.m, p.n, p.k, GemmPass::dgrad), p.dgrad, 1e-9 * p.dgrad);
    EXPECT_NEAR(t.gemm_time(p.m, p.n, p.k, GemmPass::wgrad), p.wgrad, 1e-9 * p.wgrad);
  }
}

TEST(OpCosts, GemmRateIsLogLinearBetweenShapes) {
  const OpCostTables t = tables(two_point_ops());
  // M = 2048 is half-way in log2 between 1024 and 4096: the rate is the geometric mean, 200 TFLOP/s.
  const double flops = 2.0 * 2048 * 1024 * 1024;
  EXPECT_NEAR(t.gemm_time(2048, 1024, 1024, GemmPass::fwd), flops / 200e12, 1e-6 * flops / 200e12);
  // A quarter of the way (M = 1024 * 2^0.5): 100 * 4^0.25 = 141.4 TFLOP/s.
  const double m = 1024 * std::sqrt(2.0);
  const double rate = 100e12 * std::pow(4.0, 0.25);
  EXPECT_NEAR(t.gemm_time(m, 1024, 1024, GemmPass::fwd), 2 * m * 1024 * 1024 / rate, 1e-6 * 2 * m * 1024 * 1024 / rate);
}

TEST(OpCosts, GemmRateHeldAboveAndFallingBelowTheMeasuredRange) {
  const OpCostTables t = tables(two_point_ops());
  // Below the smallest M the rate keeps falling as over the first measured step (100 -> 400
  // TFLOP/s over two octaves: rate ~ M^1, the steepest allowed): time no longer shrinks.
  EXPECT_NEAR(t.gemm_time(256, 1024, 1024, GemmPass::fwd), 2.0 * 1024 * 1024 * 1024 / 100e12, 1e-12);
  // N was measured at one size only: no slope to follow, the rate is held.
  EXPECT_NEAR(t.gemm_time(1024, 64, 1024, GemmPass::fwd), 2.0 * 1024 * 64 * 1024 / 100e12, 1e-15);
  // Larger: the largest shape's rate.
  const double big = 2.0 * 65536 * 1024 * 1024;
  EXPECT_NEAR(t.gemm_time(65536, 1024, 1024, GemmPass::fwd), big / 400e12, 1e-9 * big / 400e12);
  EXPECT_NEAR(t.best_gemm_rate(), 400e12, 1e3);
  EXPECT_EQ(t.gemm_time(0, 1024, 1024, GemmPass::fwd), 0);
}

TEST(OpCosts, AttentionByRateScaledWithBatchHeads) {
  const OpCostTables t = tables(two_point_ops());
  EXPECT_NEAR(t.attention_fwd(1024, 64, 10), 10e-6, 1e-12);
  EXPECT_NEAR(t.attention_bwd(1024, 64, 10), 25e-6, 1e-12);
  EXPECT_NEAR(t.attention_fwd(1024, 64, 30), 30e-6, 1e-12);  // 3x the heads, 3x the time
  // seq 4096 measured at 16x the FLOPs in 8x the time (rate 2x); seq 2048 half-way: rate sqrt(2)x,
  // FLOPs 4x -> time 4 / sqrt(2) x 10 us.
  EXPECT_NEAR(t.attention_fwd(2048, 64, 10), 40e-6 / std::sqrt(2.0), 1e-11);
  // Head dim outside the measured one: that rate, FLOPs scale with head_dim.
  EXPECT_NEAR(t.attention_fwd(1024, 128, 10), 20e-6, 1e-12);
  EXPECT_DOUBLE_EQ(causal_attention_fwd_flops(1024, 64, 10), 2.0 * 1024 * 1024 * 64 * 10);
}

TEST(OpCosts, OtherAttentionKernelsHaveTheirOwnTables) {
  // A second kernel at half the calibrated rate: its lookups take twice the time; the calibrated
  // table (index -1, and any name the GPU has no table for) is unchanged.
  json j = two_point_ops();
  j["attention_kernels"]["slow"] = {
      {"source", "test"},
      {"points", json::array({json{{"seq", 1024}, {"head_dim", 64}, {"batch_heads", 10}, {"fwd_us", 20}, {"fwd_bwd_us", 70}}})}};
  const OpCostTables t = tables(j);
  ASSERT_EQ(t.attention_kernel("slow"), 0);
  EXPECT_EQ(t.attention_kernel("calibrated"), -1);
  EXPECT_EQ(t.attention_kernel("flash3"), -1);
  EXPECT_TRUE(t.has_attention_kernel("slow"));
  EXPECT_TRUE(t.has_attention_kernel("calibrated"));
  EXPECT_FALSE(t.has_attention_kernel("flash3"));
  EXPECT_NEAR(t.attention_fwd(1024, 64, 10, 0), 20e-6, 1e-12);
  EXPECT_NEAR(t.attention_bwd(1024, 64, 10, 0), 50e-6, 1e-12);
  EXPECT_NEAR(t.attention_fwd(1024, 64, 10), 10e-6, 1e-12);
  EXPECT_NEAR(t.attention_fwd(4096, 64, 10, 0), 16 * 20e-6, 1e-12);  // one point: its rate held
  // Checked like every table: the name "calibrated" belongs to "attention", points need a source.
  j["attention_kernels"]["calibrated"] = j["attention_kernels"]["slow"];
  const std::string taken = input_error([&] { tables(j); });
  EXPECT_EQ(taken.rfind("t.json: ops.attention_kernels.calibrated = ", 0), 0u) << taken;
  EXPECT_NE(taken.find(", names the \"attention\" table; give this kernel another name"), std::string::npos) << taken;
  j["attention_kernels"].erase("calibrated");
  j["attention_kernels"]["slow"].erase("source");
  EXPECT_EQ(input_error([&] { tables(j); }), "t.json: ops.attention_kernels.slow.source is missing (required key)");
}

TEST(OpCosts, ShippedH100CarriesPublishedFlashAttention2Rates) {
  // dgx-h100.json's "flash2" is FlashAttention-2's published H100 rates (published_attention.py):
  // causal forward at head dim 128, seq 8192: 333 TFLOP/s, against the calibrated SDPA's 595.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const int fa2 = c.ops.attention_kernel("flash2");
  ASSERT_GE(fa2, 0);
  const double flops = causal_attention_fwd_flops(8192, 128, 32);
  EXPECT_NEAR(flops / c.ops.attention_fwd(8192, 128, 32, fa2) / 1e12, 333, 0.5);
  EXPECT_NEAR(2.5 * flops / c.ops.attention_bwd(8192, 128, 32, fa2) / 1e12, 318, 0.5);
  EXPECT_GT(c.ops.attention_fwd(8192, 128, 32, fa2), 1.7 * c.ops.attention_fwd(8192, 128, 32));
}

TEST(OpCosts, MemoryBoundByBandwidthInterpolatedInLogBytes) {
  const OpCostTables t = tables(two_point_ops());
  // add: 1e6 B in 10 us (1e11 B/s), 1e8 B in 100 us (1e12 B/s); 1e7 B is half-way: 10^11.5 B/s.
  EXPECT_NEAR(t.memory_fwd(MemKernel::add, 1e6), 10e-6, 1e-12);
  EXPECT_NEAR(t.memory_bwd(MemKernel::add, 1e8), 200e-6, 1e-12);
  // 10^7 bytes: log2 half-way is not a half-octave node here; check against the bounds and monotone rate.
  const double mid = t.memory_fwd(MemKernel::add, 1e7);
  EXPECT_GT(mid, 1e7 / 1e12);
  EXPECT_LT(mid, 1e7 / 1e11);
  // Outside: edge bandwidth held.
  EXPECT_NEAR(t.memory_fwd(MemKernel::add, 1e10), 1e10 / 1e12, 1e-9);
  // Below: bandwidth 1e11 -> 1e12 B/s over 6.6 octaves (p = 0.5): 1e3 B is 3 decades below 1e6 B,
  // so the bandwidth is 1e11 / 10^1.5.
  EXPECT_NEAR(t.memory_fwd(MemKernel::add, 1e3), 1e3 / (1e11 / std::pow(10.0, 1.5)), 1e-12);
  EXPECT_NEAR(t.stream(3e8), t.memory_fwd(MemKernel::add, 1e8), 1e-15);
}

TEST(OpCosts, UnmeasuredKernelsStreamTheirTrafficAtTheAddBandwidth) {
  const OpCostTables t = tables(two_point_ops());
  EXPECT_FALSE(t.has(MemKernel::layer_norm));
  // layer_norm forward moves 2x its input: 5e7 B in, 1e8 B moved = the add kernel on 1e8/3 B.
  EXPECT_NEAR(t.memory_fwd(MemKernel::layer_norm, 5e7), t.stream(1e8), 1e-15);
  EXPECT_TRUE(t.has(MemKernel::adamw_fused));
  EXPECT_NEAR(t.memory_fwd(MemKernel::adamw_fused, 4e8), 1000e-6, 1e-12);
  EXPECT_NEAR(t.memory_fwd(MemKernel::adamw_fused, 8e8), 2000e-6, 1e-12);  // one point: a constant rate
}

TEST(OpCosts, BadTablesNameTheField) {
  json j = two_point_ops();
  j["memory_bound"]["adamw_fused"][0].erase("step_us");
  EXPECT_EQ(input_error([&] { tables(j); }), "t.json: ops.memory_bound.adamw_fused[0].step_us is missing (required key)");
  j = two_point_ops();
  j["gemm"] = json::array();
  EXPECT_EQ(input_error([&] { tables(j); }), "t.json: ops.gemm = [], must hold at least 1 entries");
  j = two_point_ops();
  j["dtype"] = "int8";
  EXPECT_EQ(input_error([&] { tables(j); }), "t.json: ops.dtype = \"int8\", must be one of bf16|fp16|fp8|fp32");
}

TEST(OpCosts, MisalignedSlowdownIsReadAndBounded) {
  json j = two_point_ops();
  EXPECT_EQ(tables(j).misaligned_gemm_slowdown, 1);  // absent: not measured, no slowdown
  j["misaligned_gemm_slowdown"] = 2.5;
  EXPECT_EQ(tables(j).misaligned_gemm_slowdown, 2.5);
  j["misaligned_gemm_slowdown"] = 0.5;
  EXPECT_EQ(input_error([&] { tables(j); }), "t.json: ops.misaligned_gemm_slowdown = 0.5, must be in [1, 100]");
}

TEST(OpCosts, ShippedH100TableReproducesTheMeasurements) {
  // topologies/dgx-h100.json's table is topologies/measured/h100-ops.jsonl: at a measured shape the
  // lookup returns the measured time (one shape measured once).
  const Cluster c = testing::builtin_cluster("dgx-h100");
  // {"op": "gemm", "kind": "fwd", "tokens": 8192, "out": 4096, "inn": 4096, "s": 0.000374...}
  EXPECT_NEAR(c.ops.gemm_time(8192, 4096, 4096, GemmPass::fwd), 374.1e-6, 0.2e-6);
  // {"op": "sdpa_causal", "batch": 8, "heads": 16, "seq": 2048, "head_dim": 128, "fwd_s": 0.000292...}
  EXPECT_NEAR(c.ops.attention_fwd(2048, 128, 128), 292.1e-6, 0.2e-6);
  // {"op": "rms_norm", "tokens": 16384, "hidden": 4096, "fwd_s": 0.0001456}
  EXPECT_NEAR(c.ops.memory_fwd(MemKernel::rms_norm, 16384.0 * 4096 * 2), 145.6e-6, 0.2e-6);
  // {"op": "adamw", "impl": "fused", "params": 500000000, "s": 0.0055385}
  EXPECT_NEAR(c.ops.memory_fwd(MemKernel::adamw_fused, 5e8 * 4), 5538.5e-6, 1e-6);
  EXPECT_NEAR(c.ops.kernel_floor, 6.601e-6, 1e-9);
  // Rates stay below the dense peak everywhere.
  EXPECT_LT(c.ops.best_gemm_rate(), c.gpu.peak_bf16);
}

// The derivation rule by hand: a GPU with 3x the peak and 1.5x the HBM bandwidth of the measured
// one (1000 TFLOP/s, 2000 GB/s) runs every GEMM and attention kernel in a third of the time, every
// memory-bound kernel in two thirds, and keeps the kernel floor and misaligned-GEMM slowdown.
TEST(OpCosts, DerivedTablesScaleComputeByPeakAndMemoryByBandwidth) {
  json j = two_point_ops();
  j["misaligned_gemm_slowdown"] = 2.5;
  j["attention_kernels"] = {{"flash2", {{"source", "test"}, {"points", j["attention"]}}}};
  const OpCostTables m = tables(j);
  const OpCostTables d = derive_op_costs(m, {"measured-cluster", 3000e12, 3000e9, false, {}});
  EXPECT_EQ(d.derivation.from, "measured-cluster");
  EXPECT_DOUBLE_EQ(d.derivation.gemm_ratio, 3);
  EXPECT_DOUBLE_EQ(d.derivation.attention_fwd_ratio, 3);
  EXPECT_DOUBLE_EQ(d.derivation.attention_bwd_ratio, 3);
  EXPECT_FALSE(d.derivation.gemm_achieved);
  EXPECT_EQ(d.derivation.format_speedup(Dtype::fp8), 0);  // none published: op_time's peak ratio
  EXPECT_DOUBLE_EQ(d.derivation.memory_ratio, 1.5);
  EXPECT_EQ(d.measured_on.gpu, "G");  // still the GPU the times were measured on
  for (GemmPass pass : {GemmPass::fwd, GemmPass::dgrad, GemmPass::wgrad}) {
    EXPECT_NEAR(d.gemm_time(2048, 1024, 1024, pass), m.gemm_time(2048, 1024, 1024, pass) / 3, 1e-15);
  }
  EXPECT_NEAR(d.attention_fwd(2048, 64, 10), m.attention_fwd(2048, 64, 10) / 3, 1e-15);
  EXPECT_NEAR(d.attention_bwd(2048, 64, 10), m.attention_bwd(2048, 64, 10) / 3, 1e-15);
  EXPECT_NEAR(d.memory_fwd(MemKernel::add, 1e7), m.memory_fwd(MemKernel::add, 1e7) / 1.5, 1e-15);
  EXPECT_NEAR(d.memory_bwd(MemKernel::add, 1e7), m.memory_bwd(MemKernel::add, 1e7) / 1.5, 1e-15);
  EXPECT_NEAR(d.memory_fwd(MemKernel::adamw_fused, 4e8), 1000e-6 / 1.5, 1e-12);
  EXPECT_DOUBLE_EQ(d.kernel_floor, 4e-6);
  EXPECT_DOUBLE_EQ(d.misaligned_gemm_slowdown, 2.5);
  // Named attention kernels describe one kernel on the measured architecture: dropped unless kept.
  EXPECT_TRUE(d.attention_kernels.empty());
  const OpCostTables same_sm = derive_op_costs(m, {"measured-cluster", 3000e12, 3000e9, true, {}});
  ASSERT_EQ(same_sm.attention_kernels.size(), 1u);
  EXPECT_NEAR(same_sm.attention_fwd(2048, 64, 10, 0), m.attention_fwd(2048, 64, 10, 0) / 3, 1e-15);
}

// The achieved-rate form of the rule, by hand on the two-point table (GEMM 100 TFLOP/s at
// 1024x1024x1024 and 400 at 4096x1024x1024; attention forward at seq 4096, head dim 64:
// 2 * 4096^2 * 64 * 10 FLOPs in 80 us = 268.4 TFLOP/s) for a GPU of 3x the peak:
//   a GEMM figure of 900 TFLOP/s at 4096x1024x1024 gives 900 / 400 = 2.25 for every GEMM shape;
//   two figures (900 there, 400 at 1024^3: 4x) give their geometric mean, sqrt(2.25 x 4) = 3;
//   a best-over-shapes figure of 1000 compares with the table's best, 400: 2.5;
//   an attention-forward figure of 536.8 at seq 4096 gives 2 for the forward only (the backward,
//   without a figure, keeps the peak ratio 3);
//   an fp8 figure of 1620 beside the bf16 900 at the same shape gives fp8 a speed-up of 1.8.
TEST(OpCosts, DerivedTablesScaleByAchievedRatesWhereStated) {
  const OpCostTables m = tables(two_point_ops());
  auto gemm = [](Dtype dtype, double mm, double tflops) {
    AchievedRate a;
    a.dtype = dtype;
    a.m = mm;
    a.n = a.k = 1024;
    a.rate = tflops * 1e12;
    return a;
  };
  AchievedRate attention;
  attention.kernel = ReferenceKernel::attention_fwd;
  attention.seq = 4096;
  attention.head_dim = 64;
  attention.rate = 2 * 268.435456e12;
  const OpCostTables d = derive_op_costs(
      m, {"measured-cluster", 3000e12, 3000e9, false, {gemm(Dtype::bf16, 4096, 900), gemm(Dtype::fp8, 4096, 1620), attention}});
  EXPECT_NEAR(d.derivation.gemm_ratio, 2.25, 1e-12);
  EXPECT_TRUE(d.derivation.gemm_achieved);
  EXPECT_NEAR(d.gemm_time(4096, 1024, 1024, GemmPass::fwd), 2.0 * 4096 * 1024 * 1024 / 900e12, 1e-15);
  EXPECT_NEAR(d.gemm_time(1024, 1024, 1024, GemmPass::dgrad), m.gemm_time(1024, 1024, 1024, GemmPass::dgrad) / 2.25,
              1e-15);
  EXPECT_NEAR(d.derivation.fp8_speedup, 1.8, 1e-12);
  EXPECT_EQ(d.derivation.format_speedup(Dtype::mxfp8), 0);
  EXPECT_NEAR(d.derivation.attention_fwd_ratio, 2, 1e-9);
  EXPECT_TRUE(d.derivation.attention_fwd_achieved);
  EXPECT_NEAR(d.attention_fwd(4096, 64, 10), 40e-6, 1e-12);
  EXPECT_DOUBLE_EQ(d.derivation.attention_bwd_ratio, 3);
  EXPECT_FALSE(d.derivation.attention_bwd_achieved);
  EXPECT_NEAR(d.attention_bwd(4096, 64, 10), 200e-6 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(d.derivation.memory_ratio, 1.5);  // memory-bound kernels: the bandwidth ratio as before

  const OpCostTables two = derive_op_costs(
      m, {"measured-cluster", 3000e12, 3000e9, false, {gemm(Dtype::bf16, 4096, 900), gemm(Dtype::bf16, 1024, 400)}});
  EXPECT_NEAR(two.derivation.gemm_ratio, 3, 1e-12);

  AchievedRate best;
  best.best = true;
  best.rate = 1000e12;
  EXPECT_NEAR(m.best_gemm_rate(), 400e12, 1e3);
  const OpCostTables b = derive_op_costs(m, {"measured-cluster", 3000e12, 3000e9, false, {best}});
  EXPECT_NEAR(b.derivation.gemm_ratio, 2.5, 1e-12);
  EXPECT_NEAR(b.derivation.attention_fwd_ratio, 3, 1e-12);  // no attention figure: the peak ratio
}

}  // namespace
}  // namespace trainplan
