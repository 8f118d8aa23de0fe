#include <gtest/gtest.h>

#include <limits>
#include <numeric>

#include "sim/collectives.hpp"
#include "sim/memory_model.hpp"
#include "sim/op_time.hpp"
#include "sim/plan_shape.hpp"
#include "sim/predict.hpp"
#include "sim/schedule.hpp"
#include "test_helpers.hpp"
#include "default_software.hpp"

namespace trainplan {
namespace {

using testing::gpt;

Strategy layout(int dp, int tp, int pp, int b, int B, int seq = 2048) {
  Strategy s;
  s.dp = dp;
  s.tp = tp;
  s.pp = pp;
  s.micro_batch = b;
  s.global_batch = B;
  s.seq_len = seq;
  return s;
}

TEST(Predict, ZeroPaperWorkedExample) {
  // Rajbhandari et al. 2020, Sec. 3: Psi = 7.5B, 64-way DP, mixed-precision Adam:
  // 120 / 31.4 / 16.6 / 1.9 GB of model states per GPU for stages 0-3.
  const ModelSpec m = gpt(4, 1024, 16, 1024, 1000);
  const LayerGraph g(m, 1024);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  const double expect_gb[] = {120, 31.4, 16.6, 1.9};
  for (int zero = 0; zero <= 3; ++zero) {
    Strategy s = layout(64, 1, 1, 1, 64, 1024);
    s.zero = zero;
    const Estimate e = predict(g, c, s);
    const StageMemory& st = e.per_stage.at(0);
    const double per_param = (st.weights + st.gradients + st.optimizer) / g.total_params();
    EXPECT_NEAR(per_param * 7.5e9 / 1e9, expect_gb[zero], 0.05) << "stage " << zero;
  }
}

TEST(Predict, VocabularyPaddingAndMisalignedGemms) {
  // megatron-core pads the vocabulary to a multiple of 128 x tp: 50257 costs what 50304 costs.
  // pytorch-eager does not pad: its LM head runs misaligned GEMMs, slower by the cluster's
  // misaligned_gemm_slowdown (dgx-h100: > 1), so 50257 costs more than the padded 50304.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  ASSERT_GT(c.ops.misaligned_gemm_slowdown, 1);
  const Strategy s = layout(1, 1, 1, 8, 32, 1024);
  const LayerGraph odd(gpt(12, 768, 12, 1024, 50257), 1024), even(gpt(12, 768, 12, 1024, 50304), 1024);
  // (The parameter counts still differ by 47 rows x 768, so the optimizer step differs by a hair.)
  EXPECT_NEAR(predict(odd, c, s).time.step / predict(even, c, s).time.step, 1, 1e-4);
  const Software eager = load_software("pytorch-eager", TRAINPLAN_SOURCE_DIR);
  EXPECT_GT(predict(odd, c, eager, s).time.step, 1.05 * predict(even, c, eager, s).time.step);
  // The head GEMMs are the only misaligned ones: the slowdown applies to them alone.
  const double t = gemm_time(c, Dtype::bf16, 8192, 50257, 768, GemmPass::fwd);
  EXPECT_NEAR(t / gemm_time(c, Dtype::bf16, 8192, 50256, 768, GemmPass::fwd), c.ops.misaligned_gemm_slowdown, 1e-3);
  // 1028 elements are 16-byte rows in fp32 (4112 B) but not in bf16 (2056 B).
  const auto ratio = [&](Dtype d) {
    return gemm_time(c, d, 8192, 1028, 768, GemmPass::fwd) / gemm_time(c, d, 8192, 1024, 768, GemmPass::fwd);
  };
  EXPECT_NEAR(ratio(Dtype::fp32), 1028.0 / 1024, 1e-2);
  EXPECT_NEAR(ratio(Dtype::bf16), c.ops.misaligned_gemm_slowdown * 1028.0 / 1024, 1e-2);
}

TEST(Predict, ResidualStreamIsNeverNarrowerThanTheActivations) {
  // A profile may declare a 1-byte residual stream (software.cpp accepts 1..8 for
  // residual_stream_bytes), but the stream holds the activations it adds up: it is never narrower
  // than them. Under bf16 a 1-byte profile costs what a 2-byte one does, in the norm and residual
  // kernels' time as in the saved activations; a 4-byte (fp32) stream costs more in both.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const LayerGraph g(gpt(4, 4096, 32, 2048, 32000), 2048);
  Software one = testing::default_software(), two = one, four = one;
  one.stream_bytes = 1;
  two.stream_bytes = 2;
  four.stream_bytes = 4;
  Strategy s = layout(1, 1, 1, 4, 4);
  const OpCosts t1 = op_costs(g, c, one, s), t2 = op_costs(g, c, two, s), t4 = op_costs(g, c, four, s);
  EXPECT_EQ(t1.kinds[0].fwd.gpu, t2.kinds[0].fwd.gpu);
  EXPECT_EQ(t1.kinds[0].bwd.gpu, t2.kinds[0].bwd.gpu);
  EXPECT_EQ(t1.pre.fwd.gpu, t2.pre.fwd.gpu);   // the embedding writes the stream
  EXPECT_EQ(t1.post.fwd.gpu, t2.post.fwd.gpu);  // the final norm reads it
  EXPECT_GT(t4.kinds[0].fwd.gpu, t2.kinds[0].fwd.gpu);
  EXPECT_EQ(predict(g, c, one, s).time.step, predict(g, c, two, s).time.step);
  // Time and memory read the same width: with full recomputation a layer keeps only its input, one
  // stream tensor.
  s.recompute = Recompute::full;
  EXPECT_EQ(stored_layer_activation_bytes(g, one, s), stored_layer_activation_bytes(g, two, s));
  EXPECT_EQ(stored_layer_activation_bytes(g, four, s), 2 * stored_layer_activation_bytes(g, two, s));
  EXPECT_EQ(predict(g, c, one, s).peak_memory, predict(g, c, two, s).peak_memory);
  EXPECT_EQ(predict(g, c, one, s).time.step, predict(g, c, two, s).time.step);
}

TEST(Predict, APipelineSendAndItsTpGatherAreOneCallEach) {
  // tp 4, pp 2 on dgx-h100 (8 per node): a stage boundary sends 1/tp of the micro-batch's
  // activations to the next stage (4 ranks apart, inside the node), and without SP the receiver
  // all-gathers the whole tensor over its TP group (Narayanan et al. 2021, Sec. 4.1). Each is one
  // collective call: the table's cost plus the cluster's per-call overhead, once.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  ASSERT_GT(c.collectives.call_overhead, 0);
  const Software& sw = testing::default_software();
  const LayerGraph g(gpt(4, 2048, 16), 2048);
  const Strategy s = layout(1, 4, 2, 2, 8);
  const PlanShape shape(g.model(), c, sw, s);
  const LayerCosts lc = layer_costs(g, c, sw, shape);
  const Bytes hidden = 2.0 * 2048 * 2048 * 2;  // b x seq x h x 2 B
  EXPECT_EQ(lc.hidden_message, hidden);
  const Seconds send = collective_time(Collective::send_recv, 2, hidden / 4, group_link(c, 2, 4));
  const Seconds gather = collective_time(Collective::all_gather, 4, hidden, group_link(c, 4, 1));
  EXPECT_DOUBLE_EQ(lc.p2p_tp_gather, gather + c.collectives.call_overhead);
  EXPECT_DOUBLE_EQ(p2p_time(shape.groups.pp, lc), send + c.collectives.call_overhead + lc.p2p_tp_gather);
  EXPECT_DOUBLE_EQ(step_costs(g, c, sw, s).p2p, p2p_time(shape.groups.pp, lc));
  // With SP the activations stay sharded: the send alone.
  Strategy sp = s;
  sp.sequence_parallel = true;
  const PlanShape sp_shape(g.model(), c, sw, sp);
  const LayerCosts sp_lc = layer_costs(g, c, sw, sp_shape);
  EXPECT_EQ(sp_lc.p2p_tp_gather, 0);
  EXPECT_DOUBLE_EQ(p2p_time(sp_shape.groups.pp, sp_lc), send + c.collectives.call_overhead);
}

TEST(Predict, ContextParallelMergesEachRingStep) {
  // With cp > 1 each of the cp ring steps merges its partial attention output (forward, over the
  // q-sized tensor) and adds its dQ, dK, dV into accumulators (backward, over q + 2 kv): the
  // profile's cp_merge passes, nothing at cp = 1.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  ModelSpec m = gpt(4, 2048, 16, 4096, 32000);
  m.kv_heads = 4;  // GQA: kv is a quarter of q
  const LayerGraph g(m, 4096);
  Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  Software none = sw;
  none.mem.cp_merge = MemOpImpl{sw.mem.cp_merge.kernel, 0, 0, 0, 0};
  Strategy s = layout(1, 1, 1, 1, 8, 4096);
  const OpCosts one = op_costs(g, c, sw, s);
  EXPECT_DOUBLE_EQ(one.kinds[0].fwd.gpu, op_costs(g, c, none, s).kinds[0].fwd.gpu);
  s.cp = 2;
  const OpCosts with = op_costs(g, c, sw, s), without = op_costs(g, c, none, s);
  const double tokens = 4096 / 2, q = 2048, kv = 512;
  EXPECT_NEAR(with.kinds[0].fwd.gpu - without.kinds[0].fwd.gpu,
              2 * sw.mem.cp_merge.passes_fwd * c.ops.memory_fwd(sw.mem.cp_merge.kernel, tokens * q * 2), 1e-12);
  EXPECT_NEAR(with.kinds[0].bwd.gpu - without.kinds[0].bwd.gpu,
              2 * sw.mem.cp_merge.passes_bwd * c.ops.memory_bwd(sw.mem.cp_merge.kernel, tokens * (q + 2 * kv) * 2),
              1e-12);
  EXPECT_DOUBLE_EQ(with.kinds[0].fwd.kernels - without.kinds[0].fwd.kernels, 2.0 * sw.mem.cp_merge.kernels_fwd);
  EXPECT_GT(predict(g, c, sw, s).time.step, predict(g, c, none, s).time.step);
}

TEST(Predict, DropoutCostsTimeWhereTheModelHasItAndTheStackRunsIt) {
  // A model trained with dropout pays the profile's dropout passes on both residual branches of each
  // layer (Megatron-core: fused into the bias-dropout-add); a Llama-style model (dropout 0) and a
  // stack that runs no dropout (pytorch-eager: memory.dropout_masks false) pay nothing.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  ModelSpec m = gpt(4, 2048, 16, 2048, 51200);
  const Software mc = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  const Software eager = load_software("pytorch-eager", TRAINPLAN_SOURCE_DIR);
  const Strategy s = layout(1, 1, 1, 4, 8);
  m.dropout = 0;
  const LayerGraph plain(m, 2048);
  m.dropout = 0.1;
  const LayerGraph dropped(m, 2048);
  const OpCosts with = op_costs(dropped, c, mc, s), without = op_costs(plain, c, mc, s);
  const double stream = 4 * 2048 * 2048 * 2.0;  // tokens x hidden, bf16 stream
  EXPECT_NEAR(with.kinds[0].fwd.gpu - without.kinds[0].fwd.gpu, 2 * mc.mem.dropout.passes_fwd * c.ops.memory_fwd(MemKernel::add, stream), 1e-12);
  EXPECT_NEAR(with.kinds[0].bwd.gpu - without.kinds[0].bwd.gpu, 2 * mc.mem.dropout.passes_bwd * c.ops.memory_bwd(MemKernel::add, stream), 1e-12);
  EXPECT_DOUBLE_EQ(with.kinds[0].bwd.kernels - without.kinds[0].bwd.kernels, 2.0 * mc.mem.dropout.kernels_bwd);
  const double slower = predict(dropped, c, mc, s).time.step / predict(plain, c, mc, s).time.step;
  EXPECT_GT(slower, 1.0);
  EXPECT_LT(slower, 1.05);  // memory-bound passes beside the GEMMs of a 2048-wide layer
  EXPECT_DOUBLE_EQ(predict(dropped, c, eager, s).time.step, predict(plain, c, eager, s).time.step);
  // Materialised scores: the dropout kernel on the scores only where the model has dropout.
  Strategy standard = s;
  standard.attention = Attention::standard;
  EXPECT_GT(op_costs(dropped, c, mc, standard).kinds[0].attention_fwd.gpu, op_costs(plain, c, mc, standard).kinds[0].attention_fwd.gpu);
}

TEST(Predict, Fp8LeavesTheLmHeadIn16BitsUnlessTheStackQuantizesIt) {
  // Megatron-core's output layer is not a Transformer Engine module: under --dtype fp8 the
  // transformer layers' GEMMs run in FP8 and the head's in bf16 (no quantize passes either).
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = gpt(4, 4096, 32, 2048, 50304);
  const LayerGraph g(m, 2048);
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  ASSERT_FALSE(sw.fp8_lm_head);
  Software quantized = sw;
  quantized.fp8_lm_head = true;
  Strategy s = layout(1, 1, 1, 4, 8);  // micro-batches of 4 x 2048 tokens
  const OpCosts bf16 = op_costs(g, c, sw, s);
  s.dtype = Dtype::fp8;
  const OpCosts fp8 = op_costs(g, c, sw, s), all_fp8 = op_costs(g, c, quantized, s);
  EXPECT_DOUBLE_EQ(fp8.post.fwd.gpu, bf16.post.fwd.gpu);
  EXPECT_DOUBLE_EQ(fp8.post.bwd.gpu, bf16.post.bwd.gpu);
  EXPECT_DOUBLE_EQ(fp8.kinds[0].fwd.gpu, all_fp8.kinds[0].fwd.gpu);  // only the head differs
  EXPECT_LT(fp8.kinds[0].fwd.gpu, bf16.kinds[0].fwd.gpu);
  // Quantizing the head: its forward GEMM at the FP8 rule plus one quantize pass over its input.
  const double tokens = 4 * 2048, head_in = tokens * 4096 * 2;
  EXPECT_NEAR(all_fp8.post.fwd.gpu - fp8.post.fwd.gpu,
              gemm_time(c, Dtype::fp8, tokens, 50304, 4096, GemmPass::fwd) -
                  gemm_time(c, Dtype::bf16, tokens, 50304, 4096, GemmPass::fwd) +
                  sw.fp8_quantize_passes * c.ops.memory_fwd(MemKernel::add, head_in),
              1e-12);
  EXPECT_LT(all_fp8.post.fwd.gpu, fp8.post.fwd.gpu);
  EXPECT_GT(predict(g, c, sw, s).time.step, predict(g, c, quantized, s).time.step);
}

TEST(Predict, Fp8BackwardGemmSlowdownScalesTheBackwardGemmsOnly) {
  // gemm.fp8_bwd_gemm_slowdown: the dgrad and wgrad GEMMs of an FP8 layer take that factor longer
  // (Transformer Engine's split accumulator); the forward, and every 16-bit GEMM, are unchanged.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = gpt(4, 4096, 32, 2048, 50304);
  const LayerGraph g(m, 2048);
  Software fast = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  fast.fp8_bwd_gemm_slowdown = 1;
  Software split = fast;
  split.fp8_bwd_gemm_slowdown = 1.2;
  Strategy s = layout(1, 1, 1, 4, 8);
  EXPECT_DOUBLE_EQ(op_costs(g, c, fast, s).kinds[0].bwd.gpu, op_costs(g, c, split, s).kinds[0].bwd.gpu);  // bf16
  s.dtype = Dtype::fp8;
  const OpCosts a = op_costs(g, c, fast, s), b = op_costs(g, c, split, s);
  EXPECT_DOUBLE_EQ(a.kinds[0].fwd.gpu, b.kinds[0].fwd.gpu);
  // The layer's four linears (QKV, projection, FC1, FC2), each dgrad + wgrad, 20% longer.
  const double tokens = 4 * 2048, h = 4096;
  double gemms = 0;
  for (auto [n, k] : {std::pair{3 * h, h}, {h, h}, {4 * h, h}, {h, 4 * h}})
    gemms += gemm_time(c, Dtype::fp8, tokens, n, k, GemmPass::dgrad) + gemm_time(c, Dtype::fp8, tokens, n, k, GemmPass::wgrad);
  EXPECT_NEAR(b.kinds[0].bwd.gpu - a.kinds[0].bwd.gpu, 0.2 * gemms, 1e-9);
}

// Block-scaled formats on B200: a GEMM runs as the 16-bit table's GEMM with its reduction
// dimension shortened by the format's speed-up (MXFP8 the achieved FP8 one x the MXFP8/FP8 ratio
// the file states, 1.967 x 0.953 = 1.8746; NVFP4 the peak ratio 9000/2250 = 4), and
// each linear's input is quantized by a memory-bound pass that moves, per element, 2 B read and
// two quantized copies written (NVFP4 also a 2 B read for its per-tensor amax): 4.0625 B for
// MXFP8, 5.125 B for NVFP4, in units of the add kernel's 6 B per 16-bit element. The backward
// GEMMs take no split-accumulator slowdown (that is Hopper FP8's).
TEST(Predict, BlockScaledGemmsAndTheirQuantizationOnB200) {
  const Cluster c = testing::builtin_cluster("dgx-b200");
  const double m = 8192, n = 8192, k = 8192;
  const double mx_speedup = c.ops.derivation.mxfp8_speedup;
  ASSERT_NEAR(mx_speedup, 3432.5 / 1745.0 * 0.953, 1e-12);
  EXPECT_DOUBLE_EQ(gemm_time(c, Dtype::mxfp8, m, n, k, GemmPass::fwd),
                   c.ops.gemm_time(m, n, k / mx_speedup, GemmPass::fwd));
  // NVFP4 at 1.81x the achieved FP8 rate (the B300's published ratio, format_ratios), not the
  // datasheet's 4x BF16.
  const double fp4_speedup = c.ops.derivation.nvfp4_speedup;
  ASSERT_NEAR(fp4_speedup, 3432.5 / 1745.0 * 1.81, 1e-12);
  EXPECT_DOUBLE_EQ(gemm_time(c, Dtype::nvfp4, m, n, k, GemmPass::fwd), c.ops.gemm_time(m, n, k / fp4_speedup, GemmPass::fwd));
  EXPECT_DOUBLE_EQ(gemm_time(c, Dtype::nvfp4, m, n, k, GemmPass::dgrad),
                   c.ops.gemm_time(m, n / fp4_speedup, k, GemmPass::dgrad));
  EXPECT_DOUBLE_EQ(gemm_time(c, Dtype::nvfp4, m, n, k, GemmPass::wgrad),
                   c.ops.gemm_time(m / fp4_speedup, n, k, GemmPass::wgrad));
  // A misaligned row: NVFP4 packs 32 elements in 16 bytes, so 8192 + 16 is off a multiple.
  EXPECT_DOUBLE_EQ(gemm_time(c, Dtype::nvfp4, m, n, k + 16, GemmPass::fwd),
                   c.ops.misaligned_gemm_slowdown * c.ops.gemm_time(m, n, (k + 16) / fp4_speedup, GemmPass::fwd));

  const ModelSpec model = gpt(4, 4096, 32, 2048, 50304);
  const LayerGraph g(model, 2048);
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  Software quantized_head = sw;
  quantized_head.fp8_lm_head = true;
  Strategy s = layout(1, 1, 1, 4, 8);
  const double tokens = 4 * 2048, head_in = tokens * 4096 * 2;
  for (auto [dtype, moved] : {std::pair{Dtype::mxfp8, 2 + 2 * 1.03125}, std::pair{Dtype::nvfp4, 2 + 2 * 0.5625 + 2}}) {
    s.dtype = dtype;
    const OpCosts base = op_costs(g, c, sw, s), head = op_costs(g, c, quantized_head, s);
    EXPECT_NEAR(head.post.fwd.gpu - base.post.fwd.gpu,
                gemm_time(c, dtype, tokens, 50304, 4096, GemmPass::fwd) -
                    gemm_time(c, Dtype::bf16, tokens, 50304, 4096, GemmPass::fwd) +
                    moved / 6 * c.ops.memory_fwd(MemKernel::add, head_in),
                1e-12)
        << to_string(dtype);
    Software split = sw;
    split.fp8_bwd_gemm_slowdown = 1.5;
    EXPECT_DOUBLE_EQ(op_costs(g, c, split, s).kinds[0].bwd.gpu, base.kinds[0].bwd.gpu) << to_string(dtype);
  }
  s.dtype = Dtype::mxfp8;
  const double mx = predict(g, c, sw, s).time.step;
  s.dtype = Dtype::nvfp4;
  const double fp4 = predict(g, c, sw, s).time.step;
  s.dtype = Dtype::bf16;
  EXPECT_LT(fp4, mx);
  EXPECT_LT(mx, predict(g, c, sw, s).time.step);
}

TEST(Predict, TpOverlapShareHidesTensorParallelCommBehindTheLayer) {
  // overlap.tp: the share of a layer's TP collectives the stack hides behind that layer's compute
  // in the same direction; the hidden part still costs the cluster's contention share. 0: all of
  // it on the critical path.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = gpt(4, 8192, 64, 4096, 50304);
  const LayerGraph g(m, 4096);
  Software none = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  none.overlap.tp = 0;
  Software half = none, all = none;
  half.overlap.tp = 0.5;
  all.overlap.tp = 1;
  Strategy s = layout(1, 8, 1, 1, 8, 4096);
  s.sequence_parallel = true;
  const ChunkCost raw = step_costs(g, c, none, s).kinds[0], h = step_costs(g, c, half, s).kinds[0],
                  full = step_costs(g, c, all, s).kinds[0];
  ASSERT_GT(raw.tp_forward, 0);
  ASSERT_LT(raw.tp_forward, raw.forward);  // the whole collective fits behind the layer's GEMMs
  const double slowdown = c.collectives.overlap_slowdown;
  EXPECT_NEAR(h.tp_forward, raw.tp_forward * (0.5 + 0.5 * slowdown), 1e-12);
  EXPECT_NEAR(full.tp_forward, raw.tp_forward * slowdown, 1e-12);
  EXPECT_NEAR(full.tp_backward, raw.tp_backward * slowdown, 1e-12);
  EXPECT_DOUBLE_EQ(h.forward, raw.forward);  // compute itself is unchanged
  EXPECT_LT(predict(g, c, half, s).time.tp_comm, predict(g, c, none, s).time.tp_comm);
}

TEST(Predict, TpBackwardShareHidesOnlyTheBackwardsCollectives) {
  // overlap.tp_backward: Megatron's asynchronous input-gradient all-reduce hides the backward's TP
  // collectives while the forward's stay inline; unset, the backward takes overlap.tp. With full
  // recomputation the recomputed forward's collectives join the backward, inline like the forward's.
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  const ModelSpec m = gpt(4, 8192, 64, 4096, 50304);
  const LayerGraph g(m, 2048);
  Software inline_tp = load_software("megatron-lm-2021", TRAINPLAN_SOURCE_DIR);
  ASSERT_EQ(inline_tp.overlap.tp, 0);
  ASSERT_EQ(inline_tp.overlap.backward_tp(), 0);  // unset: the forward's share
  Software async = inline_tp;
  async.overlap.tp_backward = 1;
  Strategy s = layout(1, 8, 1, 1, 8, 2048);
  const ChunkCost raw = step_costs(g, c, inline_tp, s).kinds[0], hidden = step_costs(g, c, async, s).kinds[0];
  ASSERT_GT(raw.tp_backward, 0);
  ASSERT_LT(raw.tp_backward, raw.backward);  // the collectives fit behind the backward's GEMMs
  EXPECT_DOUBLE_EQ(hidden.tp_forward, raw.tp_forward);
  EXPECT_NEAR(hidden.tp_backward, raw.tp_backward * c.collectives.overlap_slowdown, 1e-12);
  s.recompute = Recompute::full;
  const ChunkCost rc_raw = step_costs(g, c, inline_tp, s).kinds[0], rc_hidden = step_costs(g, c, async, s).kinds[0];
  EXPECT_NEAR(rc_hidden.tp_backward, rc_raw.tp_forward + raw.tp_backward * c.collectives.overlap_slowdown, 1e-12);
  EXPECT_LT(predict(g, c, async, s).time.step, predict(g, c, inline_tp, s).time.step);
}

TEST(Predict, ExposedCommIsTheSlowdownOrWhatOutlastsTheCompute) {
  // While a collective runs, compute advances at 1 - rate: a collective shorter than the compute
  // costs rate x its length; one that outlasts the compute sets the pace, and the excess shows.
  EXPECT_DOUBLE_EQ(exposed_comm(1.0, 4.0, 0.25), 0.25);  // fits: rate x comm
  EXPECT_DOUBLE_EQ(exposed_comm(3.0, 2.0, 0.25), 1.0);   // outlasts: comm - window
  EXPECT_DOUBLE_EQ(exposed_comm(2.5, 2.0, 0.5), 1.25);   // outlasts, but slowed longer than that
  EXPECT_DOUBLE_EQ(exposed_comm(3.0, 2.0, 1.0), 3.0);    // nothing overlapped: all of it
  EXPECT_DOUBLE_EQ(exposed_comm(3.0, 0.0, 0.0), 3.0);    // nothing to hide behind
  EXPECT_DOUBLE_EQ(exposed_comm(0.0, 2.0, 0.5), 0.0);
}

TEST(Predict, Fp32GradientAccumulationAddsTwoBytesPerParameter) {
  const ModelSpec m = gpt(4, 1024, 16, 1024, 1000);
  const LayerGraph g(m, 1024);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s = layout(8, 1, 1, 1, 8, 1024);
  const double base = predict(g, c, s).per_stage[0].gradients;
  s.fp32_grad_accum = true;
  EXPECT_DOUBLE_EQ(predict(g, c, s).per_stage[0].gradients, 2 * base);
}

TEST(Predict, PartitionIsUniformWithoutEndCosts) {
  EXPECT_EQ(partition_layers(32, 4, 1.0, 0, 0), (std::vector<int>{8, 8, 8, 8}));
  auto p = partition_layers(10, 3, 1.0, 0, 0);
  EXPECT_EQ(std::accumulate(p.begin(), p.end(), 0), 10);
  EXPECT_EQ(*std::max_element(p.begin(), p.end()), 4);
  EXPECT_EQ(*std::min_element(p.begin(), p.end()), 3);
}

TEST(Predict, PartitionWithoutUsableCostsSplitsEvenly) {
  // A dtype the GPU lacks makes every cost infinite; the partition must still return (it used to
  // loop forever) and keep every layer.
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(partition_layers(10, 4, inf, inf, inf), (std::vector<int>{2, 2, 3, 3}));
  EXPECT_EQ(partition_layers(8, 2, 0.0, 1.0, 1.0), (std::vector<int>{4, 4}));
  // Costs many orders of magnitude apart: the first chunk is nearly all embedding, so it keeps one
  // layer and the others share the rest.
  EXPECT_EQ(partition_layers(6, 3, 1e-300, 1e300, 0.0), (std::vector<int>{1, 2, 3}));
}

TEST(Predict, PartitionOfLayersOfDifferentCostsKeepsEveryLayerOnOneChunk) {
  // One chunk (pp 1) of layers of two kinds: 1 + (1e-16 + 1e-16) rounds above (1 + 1e-16) +
  // 1e-16, so a bound summed in the other order than the chunk's load left the whole model over
  // it and the partition failed an internal check on every MoE model with one stage.
  const std::vector<double> costs{0.5, 0.25, 0.25};
  EXPECT_EQ(partition_layers(costs, 1, 1e-16, 1e-16), (std::vector<int>{3}));
  EXPECT_EQ(partition_layers(costs, 2, 1e-16, 1e-16), (std::vector<int>{1, 2}));
  EXPECT_EQ(partition_layers(costs, 3, 0.0, 0.0), (std::vector<int>{1, 1, 1}));
}

TEST(Predict, PartitionMovesLayersOffAHeavyHead) {
  // A head worth 3 layers: the last stage takes fewer layers so that no stage exceeds the rest.
  auto p = partition_layers(30, 4, 1.0, 0.0, 3.0);
  EXPECT_EQ(std::accumulate(p.begin(), p.end(), 0), 30);
  EXPECT_LT(p.back(), p.front());
  double worst = 0;
  for (std::size_t i = 0; i < p.size(); ++i) worst = std::max(worst, p[i] + (i + 1 == p.size() ? 3.0 : 0.0));
  EXPECT_LE(worst, 9.0);  // 33 units of work over 4 stages: 8.25, so 9 with whole layers
  for (int n : p) EXPECT_GE(n, 1);
}

TEST(Predict, InFlightMatchesTheSchedule) {
  for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved}) {
    for (int p : {2, 4, 8}) {
      for (int m : {p, 2 * p, 4 * p}) {
        const int v = kind == ScheduleKind::interleaved ? 3 : 1;
        const Schedule sched = make_schedule(kind, p, m, v);
        for (int i = 0; i < p; ++i) {
          EXPECT_EQ(in_flight_chunks(kind, p, i, m, v), sched.peak_in_flight(i))
              << to_string(kind) << " p=" << p << " m=" << m << " stage " << i;
        }
      }
    }
  }
}

TEST(Predict, StepIsTheSumOfItsParts) {
  const ModelSpec m = gpt(48, 8192, 64);
  const LayerGraph g(m, 2048);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s = layout(4, 8, 4, 1, 64);
  s.zero = 1;
  s.recompute = Recompute::full;
  const Estimate e = predict(g, c, s);
  const TimeBreakdown& t = e.time;
  EXPECT_NEAR(t.step, t.compute + t.recompute + t.tp_comm + t.cp_comm + t.pp_comm + t.bubble + t.dp_comm_exposed + t.optimizer,
              1e-9 * t.step);
  EXPECT_GT(t.tp_comm, 0);
  EXPECT_GT(t.pp_comm, 0);
  EXPECT_GT(t.bubble, 0);
  EXPECT_LE(t.dp_comm_exposed, t.dp_comm);
  EXPECT_NEAR(e.throughput.mfu, e.throughput.model_flops_per_step / t.step / s.gpus() / c.gpu.peak(s.dtype), 1e-12);
}

TEST(Predict, BubbleFollowsTheClosedForm) {
  // Tiny vocabulary: the end stages cost next to nothing, so stages are uniform and the bubble is
  // (p-1)/m of the ideal time (1F1B) and (p-1)/(v m) interleaved.
  const ModelSpec m = gpt(24, 4096, 32, 2048, 8);
  const LayerGraph g(m, 2048);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  for (int v : {1, 2}) {
    Strategy s = layout(1, 1, 4, 1, 16);
    if (v > 1) {
      s.schedule = ScheduleKind::interleaved;
      s.vp = v;
    }
    const Estimate e = predict(g, c, s);
    ASSERT_TRUE(e.feasible) << reason_key(e.infeasible.front().reason);
    const TimeBreakdown& t = e.time;
    const double ideal = t.compute + t.recompute + t.tp_comm + t.pp_comm;
    EXPECT_NEAR(t.bubble / ideal, 3.0 / (16 * s.vp), 0.01 * 3.0 / (16 * s.vp)) << "vp " << s.vp;
  }
}

TEST(Predict, RecomputationTradesTimeForMemory) {
  const ModelSpec m = gpt(32, 4096, 32);
  const LayerGraph g(m, 2048);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s = layout(8, 1, 1, 2, 64);
  s.attention = Attention::standard;
  const Estimate none = predict(g, c, s);
  s.recompute = Recompute::selective;
  const Estimate sel = predict(g, c, s);
  s.recompute = Recompute::full;
  const Estimate full = predict(g, c, s);
  EXPECT_GT(none.per_stage[0].activations, sel.per_stage[0].activations);
  EXPECT_GT(sel.per_stage[0].activations, full.per_stage[0].activations);
  EXPECT_LT(none.time.step, sel.time.step);
  EXPECT_LT(sel.time.step, full.time.step);
  EXPECT_EQ(none.time.recompute, 0);
}

TEST(Predict, InfeasibleReasonsAreValues) {
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  {
    const ModelSpec m = gpt(96, 12288, 96);  // 175B on 8 GPUs without sharding
    const Estimate e = predict(LayerGraph(m, 2048), c, layout(1, 8, 1, 1, 8));
    ASSERT_FALSE(e.feasible);
    ASSERT_EQ(e.infeasible.size(), 1u);
    const Infeasible& why = e.infeasible[0];
    EXPECT_EQ(why.reason, InfeasibleReason::out_of_memory);
    EXPECT_EQ(reason_key(why.reason), std::string("out of memory"));
    EXPECT_EQ(why.stage, 0);
    // The fullest stage's total and the GPU's memory, exactly as the estimate states them.
    EXPECT_EQ(why.needed, e.per_stage[0].total());
    EXPECT_EQ(why.needed, e.peak_memory);
    EXPECT_EQ(why.available, c.gpu.hbm);
    // 175B / 8-way TP x 16 bytes of model states alone is ~350 GB.
    EXPECT_GT(why.needed, 300e9);
  }
  const ModelSpec small = gpt(4, 1024, 16);
  const LayerGraph g(small, 2048);
  {
    Strategy s = layout(1, 1, 1, 1, 8);
    s.dtype = Dtype::fp8;
    const Estimate e = predict(g, c, s);
    ASSERT_FALSE(e.feasible);
    EXPECT_EQ(e.infeasible.at(0).reason, InfeasibleReason::unsupported_dtype);
    EXPECT_EQ(e.infeasible.at(0).detail, c.gpu.name);
    EXPECT_TRUE(e.per_stage.empty());  // nothing costed
  }
  {
    const Estimate e = predict(g, c, layout(16384, 1, 1, 1, 16384));
    ASSERT_FALSE(e.feasible);
    const Infeasible& why = e.infeasible.at(0);
    EXPECT_EQ(why.reason, InfeasibleReason::cluster_too_small);
    EXPECT_EQ(why.needed, 16384);
    EXPECT_EQ(why.available, c.max_gpus());
    EXPECT_EQ(why.detail, c.name);
    EXPECT_FALSE(e.per_stage.empty());  // still costed: the figures say what it would take
  }
  {
    const Estimate e = predict(g, c, layout(1, 3, 1, 1, 8));
    ASSERT_FALSE(e.feasible);
    EXPECT_EQ(e.infeasible.at(0).reason, InfeasibleReason::invalid_strategy);
    EXPECT_EQ(e.infeasible.at(0).detail.rfind("--tp 3", 0), 0u) << e.infeasible.at(0).detail;
    EXPECT_FALSE(cannot_cost(g, c, layout(1, 1, 1, 1, 8)).has_value());
    EXPECT_EQ(cannot_cost(g, c, layout(1, 3, 1, 1, 8))->reason, InfeasibleReason::invalid_strategy);
  }
}

TEST(Predict, TpCollectivesPerLayerComeFromTheGraph) {
  // Per layer and micro-batch: 2 all-reduces forward and 2 backward (Megatron's f and g at the
  // graph's two TP-region entries and exits); with SP a reduce-scatter + all-gather pair in place of
  // each. Read as the difference between 8 and 4 layers (the end ops cancel), one stage.
  // A profile that overlaps none of them (overlap.tp 0), so the chunks carry the collectives' full time.
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  sw.overlap.tp = 0;
  for (bool sp : {false, true}) {
    Strategy s = layout(1, 4, 1, 1, 8);
    s.sequence_parallel = sp;
    const StepCosts c8 = step_costs(LayerGraph(gpt(8, 2048, 16), 2048), c, sw, s);
    const StepCosts c4 = step_costs(LayerGraph(gpt(4, 2048, 16), 2048), c, sw, s);
    const Seconds fwd = (c8.chunks[0].tp_forward - c4.chunks[0].tp_forward) / 4;
    const Seconds bwd = (c8.chunks[0].tp_backward - c4.chunks[0].tp_backward) / 4;
    const Link link = group_link(c, 4, 1);
    const Bytes msg = 2048.0 * 2048 * 2;  // tokens x hidden x 2 bytes
    // Each collective call also pays the cluster's per-call overhead (one call, or two with SP).
    const Seconds call = c.collectives.call_overhead;
    const Seconds point = sp ? collective_time(Collective::reduce_scatter, 4, msg, link) +
                                   collective_time(Collective::all_gather, 4, msg, link) + 2 * call
                             : collective_time(Collective::all_reduce, 4, msg, link) + call;
    EXPECT_NEAR(fwd, 2 * point, 1e-9 * point) << "sp " << sp;
    EXPECT_NEAR(bwd, 2 * point, 1e-9 * point) << "sp " << sp;
  }
}

// A stack whose column-parallel linears each all-reduce their own input gradient
// (parallelism.tp_reduce_per_linear, without SP) pays one more all-reduce per layer backward for
// each linear beside the first one reading the same input: the up projection beside a separate
// SwiGLU gate, and K and V beside Q where those are separate GEMMs. Forward and SP unchanged.
TEST(Predict, PerLinearTpReductionsAddOneAllReducePerSeparateLinear) {
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Software region = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  region.overlap.tp = 0;
  region.qkv_fused = true;
  region.gate_up_fused = false;
  auto per_layer = [&](const Software& sw, Activation act, bool sp) {
    Strategy s = layout(1, 4, 1, 1, 8);
    s.sequence_parallel = sp;
    ModelSpec m8 = gpt(8, 2048, 16), m4 = gpt(4, 2048, 16);
    m8.activation = m4.activation = act;
    const ChunkCost a = step_costs(LayerGraph(m8, 2048), c, sw, s).chunks[0];
    const ChunkCost b = step_costs(LayerGraph(m4, 2048), c, sw, s).chunks[0];
    return std::pair{(a.tp_forward - b.tp_forward) / 4, (a.tp_backward - b.tp_backward) / 4};
  };
  Software per = region;
  per.parallel.tp_reduce_per_linear = true;
  const Seconds one = collective_time(Collective::all_reduce, 4, 2048.0 * 2048 * 2, group_link(c, 4, 1)) +
                      c.collectives.call_overhead;
  const auto [f0, b0] = per_layer(region, Activation::swiglu, false);
  const auto [f1, b1] = per_layer(per, Activation::swiglu, false);
  EXPECT_NEAR(f1, f0, 1e-12);
  EXPECT_NEAR(b0, 2 * one, 1e-9);
  EXPECT_NEAR(b1, 3 * one, 1e-9);  // QKV, gate, up
  per.qkv_fused = false;
  EXPECT_NEAR(per_layer(per, Activation::swiglu, false).second, 5 * one, 1e-9);  // Q, K, V, gate, up
  EXPECT_NEAR(per_layer(per, Activation::gelu, false).second, 4 * one, 1e-9);    // Q, K, V, FC1
  EXPECT_NEAR(per_layer(per, Activation::swiglu, true).second, per_layer(region, Activation::swiglu, true).second, 1e-12);
}

// A stack that gathers the LM head's logits over TP and computes the loss over the whole
// vocabulary on every rank (parallelism.loss_on_gathered_logits) pays one all-gather of the 16-bit
// logits in the last chunk's forward, a longer loss, and holds tp times the logits; at tp 1 nothing
// changes.
TEST(Predict, GatheredLogitsLossAllGathersAndHoldsTheWholeVocabulary) {
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Software parallel = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  parallel.overlap.tp = 0;
  // Both cut by module count, so the longer loss does not move a layer between the stages.
  parallel.parallel.pipeline_uniform_modules = true;
  Software gathered = parallel;
  gathered.parallel.loss_on_gathered_logits = true;
  const ModelSpec m = gpt(4, 2048, 16);
  const LayerGraph g(m, 2048);
  Strategy s = layout(1, 4, 2, 1, 8);
  s.dtype = Dtype::bf16;
  const ChunkCost a = step_costs(g, c, parallel, s).chunks.back(), b = step_costs(g, c, gathered, s).chunks.back();
  const double rows = PlanShape(m, c, gathered, s).vocab_rows;
  const Seconds gather = collective_time(Collective::all_gather, 4, 2048.0 * rows * 2, group_link(c, 4, 1)) +
                         c.collectives.call_overhead;
  EXPECT_NEAR(b.tp_forward - a.tp_forward, gather, 1e-9);
  EXPECT_DOUBLE_EQ(b.tp_backward, a.tp_backward);
  EXPECT_GT(b.forward, a.forward);  // the loss runs over tp times the logits, after copying them
  const Estimate ea = predict(g, c, parallel, s), eb = predict(g, c, gathered, s);
  EXPECT_GT(eb.per_stage.back().activations, ea.per_stage.back().activations);
  EXPECT_EQ(eb.per_stage.front().activations, ea.per_stage.front().activations);
  s = layout(1, 1, 2, 1, 8);
  EXPECT_EQ(predict(g, c, gathered, s).time.step, predict(g, c, parallel, s).time.step);
}

// A stack that all-reduces whole gradients in fp32 (parallelism.dp_all_reduce_bytes 4) under
// ZeRO-1 pays an all-reduce of 4 B per parameter where Megatron's distributed optimizer
// reduce-scatters 2 B ones.
TEST(Predict, Fp32GradientAllReduceInPlaceOfZeroOnesReduceScatter) {
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  const Software core = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  Software fp32 = core;
  fp32.parallel.dp_all_reduce_bytes = 4;
  const ModelSpec m = gpt(4, 2048, 16);
  const LayerGraph g(m, 2048);
  Strategy s = layout(16, 1, 1, 1, 64);
  s.dtype = Dtype::bf16;
  s.zero = 1;
  const ChunkCost a = step_costs(g, c, core, s).chunks[0], b = step_costs(g, c, fp32, s).chunks[0];
  const PlanShape shape(m, c, fp32, s);
  EXPECT_DOUBLE_EQ(b.grad_bytes, b.params * 4);
  EXPECT_DOUBLE_EQ(a.grad_bytes, a.params * state_bytes(s).grad);
  EXPECT_NEAR(b.dp_reduce, shape.groups.dp.all_reduce(b.grad_bytes), 1e-12);
  EXPECT_NEAR(a.dp_reduce, shape.groups.dp.reduce_scatter(a.grad_bytes), 1e-12);
  EXPECT_GT(predict(g, c, fp32, s).time.dp_comm, predict(g, c, core, s).time.dp_comm);
}

// The uniform split of the module list [embedding, layers..., final norm, LM head] (Aleph Alpha's
// pipe_partition_uniform, DeepSpeed's partition_method "uniform"): layers + 3 modules, the first
// (layers + 3) % chunks chunks one more.
TEST(Predict, UniformModuleSplitCutsTheModuleListIntoEqualCounts) {
  EXPECT_EQ(uniform_module_split(40, 2), (std::vector<int>{21, 19}));          // 22 | 21 modules
  EXPECT_EQ(uniform_module_split(30, 4), (std::vector<int>{8, 8, 8, 6}));      // 9 | 8 | 8 | 8
  EXPECT_EQ(uniform_module_split(60, 4), (std::vector<int>{15, 16, 16, 13}));  // 16 | 16 | 16 | 15
  EXPECT_EQ(uniform_module_split(5, 1), (std::vector<int>{5}));
  EXPECT_TRUE(uniform_module_split(2, 2).empty());  // 3 | 2 modules: the second holds no layer
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  sw.parallel.pipeline_uniform_modules = true;
  Strategy s = layout(1, 1, 2, 1, 8);
  EXPECT_EQ(predict(LayerGraph(gpt(40, 1024, 16), 2048), c, sw, s).stage_layers, (std::vector<int>{21, 19}));
  // Where the uniform split leaves a stage without a layer, the stages are split by time.
  EXPECT_EQ(predict(LayerGraph(gpt(2, 1024, 16), 2048), c, sw, s).stage_layers, (std::vector<int>{1, 1}));
}

// Megatron-core's account flags (Strategy::pipeline_accounts): the embedding and the loss count
// as one layer each and the layers split evenly, so 6 layers over pp 2 x vp 4 = 8 chunks give the
// first chunk the embedding alone and the last the LM head and loss alone: {0, 1, 1, 1, 1, 1, 1, 0}.
TEST(Predict, AccountedPipelineSplitCountsTheEmbeddingAndTheLossAsLayers) {
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  const ModelSpec m = gpt(6, 1024, 16);
  const LayerGraph g(m, 2048);
  Strategy s = layout(1, 1, 2, 1, 8);
  s.schedule = ScheduleKind::interleaved;
  s.vp = 4;
  EXPECT_NE(validate(s, m).value_or("").find("pp x vp (8) must not exceed the model's layers (6); "
                                             "--pipeline-accounts embedding,loss counts those as layers too"),
            std::string::npos);
  s.pipeline_accounts = kAccountEmbedding | kAccountLoss;
  ASSERT_FALSE(validate(s, m)) << *validate(s, m);
  const StepCosts costs = step_costs(g, c, s);
  std::vector<int> split;
  for (const ChunkCost& chunk : costs.chunks) split.push_back(chunk.layers);
  EXPECT_EQ(split, (std::vector<int>{0, 1, 1, 1, 1, 1, 1, 0}));
  // The embedding alone is a gather, far shorter than a layer; the last chunk holds the head.
  EXPECT_LT(costs.chunks.front().forward, 0.1 * costs.chunks[1].forward);
  EXPECT_GT(costs.chunks.back().params, costs.chunks[1].params);
  EXPECT_GT(predict(g, c, s).time.step, 0);
  // The loss alone over 7 layers: {1, ..., 1, 0}; the embedding alone: {0, 1, ..., 1}.
  const ModelSpec seven = gpt(7, 1024, 16);
  for (const auto& [accounts, want] : {std::pair{kAccountLoss, std::vector<int>{1, 1, 1, 1, 1, 1, 1, 0}},
                                       std::pair{kAccountEmbedding, std::vector<int>{0, 1, 1, 1, 1, 1, 1, 1}}}) {
    s.pipeline_accounts = accounts;
    ASSERT_FALSE(validate(s, seven));
    split.clear();
    for (const ChunkCost& chunk : step_costs(LayerGraph(seven, 2048), c, s).chunks) split.push_back(chunk.layers);
    EXPECT_EQ(split, want) << pipeline_accounts_string(accounts);
  }
  // The counts must divide evenly, and there must be a pipeline to place them in.
  s.pipeline_accounts = kAccountEmbedding;
  EXPECT_EQ(validate(s, m).value_or(""), "--pipeline-accounts embedding: the model's layers and the embedding counted "
                                         "(6 + 1 = 7) must split evenly over pp x vp (8) chunks");
  s = layout(2, 1, 1, 1, 8);
  s.pipeline_accounts = kAccountLoss;
  EXPECT_EQ(validate(s, m).value_or(""),
            "--pipeline-accounts loss: needs --pp >= 2 (it splits the model over pipeline chunks)");
}

// Megatron-core without its account flags splits the layers alone evenly, the LM head on top of
// the last stage (--pipeline-accounts layers); trainplan's default balances the stages by time, so
// a heavy head moves layers off the last stage (a 256k vocabulary over 1024-wide layers: the head's
// 1024 x 256000 weights are about twenty layers' 12 x 1024^2).
TEST(Predict, LayersAloneSplitEvenlyWithTheHeadOnTheLastStage) {
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  const ModelSpec m = gpt(8, 1024, 16, 2048, 256000);
  const LayerGraph g(m, 2048);
  Strategy s = layout(1, 1, 2, 1, 8);
  const std::vector<int> balanced = predict(g, c, s).stage_layers;
  EXPECT_GT(balanced.front(), balanced.back());  // the head's stage takes fewer layers
  s.pipeline_accounts = kAccountLayers;
  ASSERT_FALSE(validate(s, m));
  const Estimate even = predict(g, c, s);
  EXPECT_EQ(even.stage_layers, (std::vector<int>{4, 4}));
  EXPECT_GT(even.time.step, predict(g, c, layout(1, 1, 2, 1, 8)).time.step);  // the head's stage is the busiest
  EXPECT_EQ(describe(s).find("split+layers") != std::string::npos, true);
  // Nothing else is counted, so the layers alone must divide; and it lists alone.
  EXPECT_EQ(validate(layout(1, 1, 2, 1, 8), gpt(7, 1024, 16)), std::nullopt);
  EXPECT_EQ(validate(s, gpt(7, 1024, 16)).value_or(""),
            "--pipeline-accounts layers: the model's layers (7) must split evenly over pp x vp (2) chunks");
  s.pipeline_accounts = kAccountLayers | kAccountLoss;
  EXPECT_NE(validate(s, m).value_or("").find("cannot be listed with embedding or loss"), std::string::npos);
  EXPECT_EQ(parse_pipeline_accounts("layers"), kAccountLayers);
  EXPECT_EQ(pipeline_accounts_string(kAccountLayers), "layers");
}

// The 1F1B fill and drain, by hand (one_f_one_b_bubble): equal stages (w 3 = f 1 + g 2) over 4
// stages give the other stages' work, 3 x 3 = 9; one micro-batch goes through every stage and
// back, the others' whole work too; a heavy first stage (w 10, then three of 1, f = g = w / 2,
// 8 micro-batches) finishes its 4 forwards (20) after the first micro-batch's round trip (5 + 3)
// and its cool-down backwards likewise, so it never waits: no bubble beyond its 80, where the
// others' whole work (3) was charged before.
TEST(Predict, OneFOneBBubbleWaitsForTheRoundTripsOnly) {
  const std::vector<double> w{3, 3, 3, 3}, f{1, 1, 1, 1}, g{2, 2, 2, 2};
  EXPECT_DOUBLE_EQ(one_f_one_b_bubble(w, f, g, 8, 3), 9);
  EXPECT_DOUBLE_EQ(one_f_one_b_bubble(w, f, g, 1, 3), 9);
  const std::vector<double> hw{10, 1, 1, 1}, hf{5, 0.5, 0.5, 0.5};
  EXPECT_DOUBLE_EQ(one_f_one_b_bubble(hw, hf, hf, 8, 10), 0);
  EXPECT_DOUBLE_EQ(one_f_one_b_bubble(hw, hf, hf, 1, 10), 3);  // one micro-batch: there and back
  // The heavy stage last: it waits for every earlier stage's forward and backward of the first
  // and last micro-batch, 3 in all, as before.
  const std::vector<double> lw{1, 1, 1, 10}, lf{0.5, 0.5, 0.5, 5};
  EXPECT_DOUBLE_EQ(one_f_one_b_bubble(lw, lf, lf, 8, 10), 3);
}

// Fewer micro-batches than stages: the critical path of the schedule, by hand.
//   Equal stages (f 1, g 2) over 4 stages, 2 micro-batches: the first goes through the four
//   forwards (4), the last stage's backward (2) follows its second forward, and the second comes
//   back through the four backwards: (m + p - 1) w = 5 x 3 = 15, the formula's (p - 1) w bubble.
//   Two stages, a heavy first (f 4, g 4) and a light second (f 1, g 1), one micro-batch: 4 + 1 +
//   1 + 4 = 10; two micro-batches: stage 0 runs F1 F2 (0-8), stage 1 F1 B1 (4-6) F2 B2 (8-10),
//   stage 0 B1 (8-12) B2 (12-16): 16 = 2 x 8, no bubble.
//   Seven stages of f = 0.98, 1.08, 1.08, 0.98, 0.88, 0.88, 0.88 (g = 2 f) and 4 micro-batches:
//   28.2 by an independent event-by-event replay, where the round-trip expression gives 30.0.
TEST(Predict, OneFOneBWithFewMicroBatchesIsTheCriticalPath) {
  const std::vector<double> f{1, 1, 1, 1}, g{2, 2, 2, 2};
  EXPECT_DOUBLE_EQ(one_f_one_b_critical_path(f, g, 2), 15);
  const std::vector<double> w{3, 3, 3, 3};
  EXPECT_DOUBLE_EQ(one_f_one_b_bubble(w, f, g, 2, 3), 9);
  const std::vector<double> hf{4, 1}, hg{4, 1};
  EXPECT_DOUBLE_EQ(one_f_one_b_critical_path(hf, hg, 1), 10);
  EXPECT_DOUBLE_EQ(one_f_one_b_critical_path(hf, hg, 2), 16);
  const std::vector<double> uf{0.98, 1.08, 1.08, 0.98, 0.88, 0.88, 0.88};
  std::vector<double> ug, uw;
  for (double x : uf) ug.push_back(2 * x), uw.push_back(3 * x);
  EXPECT_NEAR(one_f_one_b_critical_path(uf, ug, 4), 28.2, 1e-9);
  EXPECT_NEAR(one_f_one_b_bubble(uw, uf, ug, 4, 3 * 1.08), 28.2 - 4 * 3 * 1.08, 1e-9);
}

// The critical path follows make_schedule's 1F1B order (the simulator's and the executor's): a
// replay of that schedule's slots, written here independently, gives the same step for every
// p <= 8, m < p and unequal stages.
TEST(Predict, OneFOneBCriticalPathRunsTheScheduleOrder) {
  std::uint64_t state = 12345;
  auto uniform = [&] {  // a fixed pseudo-random sequence in [0.5, 1.5)
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return 0.5 + static_cast<double>(state >> 11) / 9007199254740992.0;
  };
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m < p; ++m) {
      std::vector<double> f(p), g(p);
      for (int j = 0; j < p; ++j) f[j] = uniform(), g[j] = 2 * uniform();
      const Schedule order = make_schedule(ScheduleKind::one_f_one_b, p, m);
      std::vector<std::vector<double>> fwd(p, std::vector<double>(m, -1)), bwd = fwd;
      std::vector<std::size_t> next(p, 0);
      std::vector<double> clock(p, 0);
      for (bool moved = true; moved;) {
        moved = false;
        for (int j = 0; j < p; ++j) {
          for (; next[j] < order.per_stage[j].size(); ++next[j], moved = true) {
            const Slot& slot = order.per_stage[j][next[j]];
            const int i = slot.micro_batch;
            const bool forward = slot.phase == Phase::forward;
            const double ready = forward ? (j == 0 ? 0 : fwd[j - 1][i]) : (j + 1 == p ? fwd[j][i] : bwd[j + 1][i]);
            if (ready < 0) break;
            clock[j] = std::max(clock[j], ready) + (forward ? f[j] : g[j]);
            (forward ? fwd : bwd)[j][i] = clock[j];
          }
        }
      }
      EXPECT_NEAR(one_f_one_b_critical_path(f, g, m), *std::max_element(clock.begin(), clock.end()), 1e-12)
          << "p " << p << " m " << m;
    }
  }
}

TEST(Predict, PredictIsComposeOfStepCosts) {
  const ModelSpec m = gpt(8, 2048, 16);
  const LayerGraph g(m, 2048);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s = layout(2, 2, 2, 1, 16);
  s.zero = 2;
  const Estimate a = predict(g, c, s);
  const Estimate b = compose(step_costs(g, c, s), g, c, s);
  EXPECT_EQ(a.time.step, b.time.step);
  EXPECT_EQ(a.peak_memory, b.peak_memory);
  EXPECT_EQ(a.throughput.mfu, b.throughput.mfu);
}

TEST(Predict, ZeroThreeShardsWeightsAndAddsGatherTraffic) {
  const ModelSpec m = gpt(24, 4096, 32);
  const LayerGraph g(m, 2048);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s = layout(16, 1, 1, 1, 64);
  const Estimate z0 = predict(g, c, s);
  s.zero = 3;
  const Estimate z3 = predict(g, c, s);
  EXPECT_NEAR(z3.per_stage[0].weights * 16, z0.per_stage[0].weights, 1e-6 * z0.per_stage[0].weights);
  EXPECT_GT(z3.time.dp_comm, z0.time.dp_comm);
}

// A stack whose ZeRO-3 collectives are bound by its own work (software zero3.max_bus_gbps) gathers
// at the capped bus bandwidth whatever the link, and one that gathers again for the recomputed
// forward (zero3.regathers_for_recompute) pays a third gather per micro-batch under full
// recomputation, in both engines.
TEST(Predict, ZeroThreeStackCapAndRegather) {
  const ModelSpec m = gpt(24, 4096, 32);
  const LayerGraph g(m, 2048);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s = layout(64, 1, 1, 1, 64);
  s.zero = 3;
  s.recompute = Recompute::full;
  Software sw = testing::default_software();
  const StepCosts plain = step_costs(g, c, sw, s);
  sw.zero3.max_bus_bandwidth = 20e9;
  const StepCosts capped_costs = step_costs(g, c, sw, s);
  // One layer's gather: one call over the 64-rank DP group at 20 GB/s of bus bandwidth.
  const GroupLink dp = group_of(c, 64, 1);
  const GroupLink slow{dp.size, dp.stride, capped(dp.link, 20e9), dp.call_overhead};
  const double layer_bytes = capped_costs.kinds[0].params * 2;
  EXPECT_NEAR(capped_costs.chunks[0].zero3_gather,
              24 * slow.all_gather(layer_bytes) + slow.all_gather(capped_costs.chunks[0].params * 2 - 24 * layer_bytes),
              1e-9);
  EXPECT_GT(capped_costs.chunks[0].zero3_gather, 3 * plain.chunks[0].zero3_gather);
  EXPECT_EQ(capped_costs.zero3_backward_gathers, 1);
  const Estimate once = predict(g, c, sw, s);
  sw.zero3.regathers_for_recompute = true;
  const StepCosts again = step_costs(g, c, sw, s);
  EXPECT_EQ(again.zero3_backward_gathers, 2);
  const Estimate twice = predict(g, c, sw, s);
  EXPECT_NEAR(twice.time.dp_comm - once.time.dp_comm, again.chunks[0].zero3_gather, 1e-9);
  EXPECT_GT(twice.time.step, once.time.step);
  EXPECT_NEAR(predict_with_simulation(g, c, sw, s).time.step / twice.time.step, 1.0, 0.02);
  s.recompute = Recompute::none;  // without recomputation nothing is gathered a third time
  EXPECT_EQ(step_costs(g, c, sw, s).zero3_backward_gathers, 1);
}

TEST(Predict, ContextParallelSplitsActivations) {
  const ModelSpec m = gpt(8, 4096, 32, 32768);
  const LayerGraph g(m, 32768);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s = layout(1, 1, 1, 1, 4, 32768);
  const Estimate cp1 = predict(g, c, s);
  s.cp = 4;
  const Estimate cp4 = predict(g, c, s);
  EXPECT_NEAR(cp4.per_stage[0].activations * 4, cp1.per_stage[0].activations, 0.01 * cp1.per_stage[0].activations);
  EXPECT_LT(cp4.time.step, cp1.time.step);
}

}  // namespace
}  // namespace trainplan

namespace trainplan {
namespace {

// Every figure of two estimates, compared exactly: the layer-cost path must be the same
// arithmetic, not an approximation.
void expect_same(const Estimate& a, const Estimate& b, const std::string& what) {
  EXPECT_EQ(a.feasible, b.feasible) << what;
  ASSERT_EQ(a.infeasible.size(), b.infeasible.size()) << what;
  for (std::size_t i = 0; i < a.infeasible.size(); ++i) {
    EXPECT_EQ(a.infeasible[i].reason, b.infeasible[i].reason) << what;
    EXPECT_EQ(a.infeasible[i].needed, b.infeasible[i].needed) << what;
  }
  EXPECT_EQ(a.time.step, b.time.step) << what;
  EXPECT_EQ(a.time.compute, b.time.compute) << what;
  EXPECT_EQ(a.time.bubble, b.time.bubble) << what;
  EXPECT_EQ(a.time.tp_comm, b.time.tp_comm) << what;
  EXPECT_EQ(a.time.cp_comm, b.time.cp_comm) << what;
  EXPECT_EQ(a.time.pp_comm, b.time.pp_comm) << what;
  EXPECT_EQ(a.time.dp_comm_exposed, b.time.dp_comm_exposed) << what;
  EXPECT_EQ(a.time.optimizer, b.time.optimizer) << what;
  EXPECT_EQ(a.peak_memory, b.peak_memory) << what;
  EXPECT_EQ(a.stage_layers, b.stage_layers) << what;
  ASSERT_EQ(a.per_stage.size(), b.per_stage.size()) << what;
  for (std::size_t i = 0; i < a.per_stage.size(); ++i) EXPECT_EQ(a.per_stage[i].total(), b.per_stage[i].total()) << what;
  EXPECT_EQ(a.throughput.hfu, b.throughput.hfu) << what;
}

TEST(Predict, FromSharedLayerCostsIsTheSamePrediction) {
  // Search predicts many layouts from the layer costs of their LayerKey, writing into reused
  // scratch. Layouts that share a key (different dp, pp, vp, ZeRO, schedule), in an order where
  // the scratch shrinks and grows, must get exactly predict()'s figures.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const Software& sw = testing::default_software();
  const LayerGraph g(gpt(24, 2048, 16), 2048);
  PredictScratch scratch;
  Estimate out;
  for (int tp : {1, 2}) {
    for (bool sp : {false, true}) {
      if (sp && tp == 1) continue;
      for (Recompute r : {Recompute::none, Recompute::full}) {
        Strategy key = layout(1, tp, 1, 1, 64);
        key.sequence_parallel = sp;
        key.recompute = r;
        const LayerCosts lc = layer_costs(g, c, sw, key);
        for (int pp : {4, 1, 8, 2}) {
          for (int zero : {0, 3, 1, 2}) {
            for (int vp : {1, 3}) {
              Strategy s = key;
              s.pp = pp;
              s.dp = 8 / pp;
              s.zero = zero;
              s.vp = pp > 1 ? vp : 1;
              s.schedule = s.vp > 1 ? ScheduleKind::interleaved : ScheduleKind::one_f_one_b;
              if (validate(s, g.model())) continue;
              predict(g, c, sw, s, lc, scratch, out);
              expect_same(predict(g, c, sw, s), out, describe(s));
              // The floor search prunes with is below the prediction.
              EXPECT_LE(step_time_floor(lc, min_send_rate(sw, c) * scratch.costs.p2p, s.pp, s.micro_batches(), s.vp), out.time.step) << describe(s);
            }
          }
        }
      }
    }
  }
}

TEST(Predict, LayerCostsOfAnotherKeyAreRejected) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const Software& sw = testing::default_software();
  const LayerGraph g(gpt(8, 2048, 16), 2048);
  Strategy a = layout(4, 2, 1, 1, 64), b = a;
  b.micro_batch = 2;
  const LayerCosts lc = layer_costs(g, c, sw, a);
  StepCosts costs;
  auto step = [&](const Strategy& s) { step_costs(g, c, sw, PlanShape(g.model(), c, sw, s), lc, costs); };
  EXPECT_THROW(step(b), std::logic_error);
  b = a;
  b.dp = 2;  // dp is not part of the key, but it moves the TP group's ranks only with another order
  b.order = {Dim::dp, Dim::tp, Dim::cp, Dim::pp};
  EXPECT_THROW(step(b), std::logic_error);
  b.order = a.order;
  EXPECT_NO_THROW(step(b));
}

}  // namespace
}  // namespace trainplan

// Hand-worked MoE layer costs: the expert all-to-all on the two-tier H100 cluster, the grouped
// GEMMs under routing imbalance, and the experts' model states per rank over ep x etp x edp.
namespace trainplan {
namespace {

Strategy moe_layout(int dp, int ep) {
  Strategy s;
  s.dp = dp;
  s.ep = ep;
  s.global_batch = 4 * dp;
  s.micro_batch = 1;
  s.seq_len = 4096;
  return s;
}

TEST(MoeHandWorked, AllToAllBytesAndTimePerLayerOnTwoTiers) {
  // Qwen3-30B-A3B, dp16 ep16 (two DGX H100 nodes), one micro-batch of 4096 tokens, bf16, tp 1.
  // A rank sends its routed copies: 4096 tokens x top-8 x hidden 2048 x 2 B = 134,217,728 B.
  // Pairwise exchange over 16 ranks, 8 per node: 15 steps at the leaf tier's 5 us, and at once
  // 7/16 of it over NVLink (450 GB/s x 0.8) and 8/16 over the GPU's own NIC (50 GB/s x 0.85):
  // 75 us + max(163.10 us, 1579.03 us) + 10 us call overhead = 1664.03 us, for the dispatch and
  // again for the combine; nothing overlaps them, so 3.328 ms shows each way per layer.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  ASSERT_EQ(c.node.bandwidth * c.node.efficiency, 360e9);
  ASSERT_EQ(c.network.at(0).bandwidth * c.network.at(0).efficiency, 42.5e9);
  const ModelSpec m = load_model("qwen3-30b-a3b", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 4096);
  const Strategy s = moe_layout(16, 16);
  ASSERT_FALSE(validate(s, m).has_value()) << *validate(s, m);
  const double M = 4096.0 * 8 * 2048 * 2;
  EXPECT_EQ(M, 134217728.0);
  const double a2a = 15 * 5e-6 + std::max(7.0 / 16 * M / 360e9, 8.0 / 16 * M / 42.5e9) + 10e-6;
  EXPECT_NEAR(a2a, 1664.03e-6, 0.01e-6);
  const LayerCosts lc = layer_costs(g, c, testing::default_software(), s);
  EXPECT_NEAR(lc.kinds[0].ep_forward, 2 * a2a, 1e-12);
  EXPECT_NEAR(lc.kinds[0].ep_backward, 2 * a2a, 1e-12);
  // Inside one node (ep 8 of dp 16): 7 steps of 3 us + 7/8 M over NVLink + 10 us = 357.2 us.
  const LayerCosts in_node = layer_costs(g, c, testing::default_software(), moe_layout(16, 8));
  EXPECT_NEAR(in_node.kinds[0].ep_forward, 2 * (7 * 3e-6 + 7.0 / 8 * M / 360e9 + 10e-6), 1e-12);
  EXPECT_NEAR(in_node.kinds[0].ep_forward, 2 * 357.2e-6, 0.1e-6);
}

TEST(MoeHandWorked, GroupedGemmRowsFollowTheImbalance) {
  // Mixtral, ep 8 (one expert per rank): the busiest rank's expert takes 4096 x 2 x imbalance
  // rows; with ep 1 each of the 8 local experts takes 4096 x 2 / 8 = 1024. The grouped GEMMs are
  // up [h -> 2 f] and down [f -> h] per expert (h 4096, f 14336), one table lookup per expert's
  // shape; the activation is switched off (no passes) so that expert_fwd is the GEMMs alone.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = load_model("mixtral-8x7b", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 4096);
  Software sw = testing::default_software();
  sw.mem.swiglu = MemOpImpl{};
  const double h = 4096, f = 14336;
  auto gemms = [&](double experts, double rows, GemmPass pass) {
    return experts * (gemm_time(c, Dtype::bf16, rows, 2 * f, h, pass) + gemm_time(c, Dtype::bf16, rows, h, f, pass));
  };
  for (double imbalance : {1.0, 1.5, 2.0}) {
    Strategy s = moe_layout(8, 8);
    s.moe_imbalance = imbalance;
    const LayerOpCosts k = op_costs(g, c, sw, s).kinds[0];
    EXPECT_NEAR(k.expert_fwd.gpu, gemms(1, 8192 * imbalance, GemmPass::fwd), 1e-12) << imbalance;
    EXPECT_NEAR(k.expert_bwd.gpu, gemms(1, 8192 * imbalance, GemmPass::dgrad) + gemms(1, 8192 * imbalance, GemmPass::wgrad),
                1e-12)
        << imbalance;
  }
  const LayerOpCosts all_local = op_costs(g, c, sw, moe_layout(8, 1)).kinds[0];
  EXPECT_NEAR(all_local.expert_fwd.gpu, gemms(8, 1024, GemmPass::fwd), 1e-12);
}

// The host's side of an MoE layer under megatron-core (its moe section): Qwen3-30B-A3B at ep 8 has
// 16 local experts; Transformer Engine launches one GEMM per expert, two forward (up, down) and
// four backward, each with the profile's 60 us of host work beyond the launch: 32 x 60 = 1.92 ms
// forward and 64 x 60 = 3.84 ms backward. FP8 quantizes each expert's two inputs in 4 kernels
// each (current scaling): 2 x 16 x 4 = 128 more forward. The dropless dispatch waits on the host,
// so the layer's forward is its part before the dispatch and its part from it on, each the longer
// of GPU and host time; with a capacity factor (static sizes) it is the longer of the whole.
TEST(MoeHandWorked, ExpertGemmLaunchesAndTheDispatchWaitOnTheHost) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = load_model("qwen3-30b-a3b", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 4096);
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  ASSERT_TRUE(sw.moe.gemm_per_expert && sw.moe.dropless_dispatch_syncs);
  ASSERT_DOUBLE_EQ(sw.moe.host_per_expert_gemm, 60e-6);
  const double act_fwd = sw.mem.swiglu.kernels_fwd, act_bwd = sw.mem.swiglu.kernels_bwd;
  const Strategy s = moe_layout(8, 8);
  const LayerOpCosts k = op_costs(g, c, sw, s).kinds[0];
  EXPECT_DOUBLE_EQ(k.expert_fwd.kernels, 2 * 16 + act_fwd);
  EXPECT_NEAR(k.expert_fwd.host, 1.92e-3, 1e-12);
  EXPECT_DOUBLE_EQ(k.expert_bwd.kernels, 4 * 16 + act_bwd);
  EXPECT_NEAR(k.expert_bwd.host, 3.84e-3, 1e-12);
  Software one = sw;
  one.moe.gemm_per_expert = false;
  const LayerOpCosts grouped = op_costs(g, c, one, s).kinds[0];
  EXPECT_DOUBLE_EQ(grouped.expert_fwd.kernels, 2 + act_fwd);
  EXPECT_EQ(grouped.expert_fwd.host, 0);
  EXPECT_EQ(grouped.expert_fwd.gpu, k.expert_fwd.gpu);  // the launches cost the host, not the GPU
  Strategy fp8 = s;
  fp8.dtype = Dtype::fp8;
  EXPECT_DOUBLE_EQ(op_costs(g, c, sw, fp8).kinds[0].expert_fwd.kernels, 2 * 16 + 2 * 16 * 4 + act_fwd);
  // The wait: the forward is split at the dispatch (the experts and the unpermute after it).
  const LayerCosts lc = layer_costs(g, c, sw, s);
  const PassCost& f = k.fwd;
  const PassCost& tail = k.after_dispatch_fwd;
  const PassCost head{f.gpu - tail.gpu, f.kernels - tail.kernels, f.host - tail.host};
  const HostLaunch launch{sw.host_per_kernel, false};
  EXPECT_NEAR(lc.kinds[0].forward, head.time(launch) + tail.time(launch), 1e-12);
  EXPECT_GT(lc.kinds[0].forward, f.time(launch));
  Strategy dropping = s;
  dropping.capacity_factor = 1;
  const LayerOpCosts kd = op_costs(g, c, sw, dropping).kinds[0];
  EXPECT_NEAR(layer_costs(g, c, sw, dropping).kinds[0].forward, kd.fwd.time(launch), 1e-12);
  // By hand: a head of 0.9 ms GPU / 0.2 ms host and a tail of 0.1 / 0.8 take 0.9 + 0.8 with the
  // wait, where the host could otherwise launch the tail under the head: max(1.0, 1.0).
  const HostLaunch host10{10e-6, false};
  const PassCost whole{1e-3, 100, 0}, after{0.1e-3, 80, 0};
  EXPECT_NEAR(whole.time_with_wait_before(after, host10), 1.7e-3, 1e-12);
  EXPECT_NEAR(whole.time(host10), 1.0e-3, 1e-12);
}

TEST(CudaGraphs, APassReplayedFromAGraphCostsItsGpuTimeAlone) {
  // By hand: 1 ms of GPU time in 100 kernels plus 0.5 ms of other host work; at 10 us a launch the
  // host needs 1.5 ms, so the eager pass is host-bound; replayed from a graph it takes its 1 ms,
  // and a wait on the host before its last 80 kernels costs nothing more.
  const PassCost pass{1e-3, 100, 0.5e-3}, tail{0.1e-3, 80, 0};
  EXPECT_NEAR(pass.time(HostLaunch{10e-6, false}), 1.5e-3, 1e-12);
  EXPECT_NEAR(pass.time(HostLaunch{10e-6, true}), 1.0e-3, 1e-12);
  EXPECT_NEAR(pass.time_with_wait_before(tail, HostLaunch{10e-6, true}), 1.0e-3, 1e-12);
  EXPECT_EQ(HostLaunch({10e-6, true}).eager().graphed, false);
}

// Qwen3-30B-A3B at micro-batch 1 on 8 H100s under megatron-core with the flex dispatcher: host-bound
// (one GEMM launch and 60 us of host work per expert, the dispatch waiting on the host). Not
// copyable: the graph refers to the model.
struct HostBoundMoe {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = load_model("qwen3-30b-a3b", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g{m, 4096};
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  const Strategy s = [] {
    Strategy x = moe_layout(8, 8);
    x.dispatcher = Dispatcher::flex;
    return x;
  }();
  HostBoundMoe() = default;
  HostBoundMoe(const HostBoundMoe&) = delete;
};

TEST(CudaGraphs, AGraphedMoeStepIsTheStepWithoutHostTime) {
  // With the iteration in one graph every layer of the host-bound plan costs its GPU time: the
  // step equals the one under the same profile with every host cost removed (the optimizer's host
  // time is below its GPU time in both).
  const HostBoundMoe plan;
  const auto& [c, m, g, sw, s] = plan;
  Strategy graphed = s;
  graphed.cuda_graphs = CudaGraphs::full;
  ASSERT_FALSE(validate(graphed, m).has_value());
  const LayerOpCosts ops = op_costs(g, c, sw, s).kinds[0];
  const LayerCosts eager = layer_costs(g, c, sw, s), replayed = layer_costs(g, c, sw, graphed);
  EXPECT_GT(eager.kinds[0].forward, 1.2 * ops.fwd.gpu);  // host-bound without the graph
  EXPECT_NEAR(replayed.kinds[0].forward, ops.fwd.gpu, 1e-12);
  EXPECT_NEAR(replayed.kinds[0].backward, ops.bwd.gpu, 1e-12);
  Software no_host = sw;
  no_host.host_per_kernel = 0;
  no_host.moe.host_per_expert_gemm = 0;
  no_host.moe.dropless_dispatch_syncs = false;
  const Estimate with_graph = predict(g, c, sw, graphed), without_host = predict(g, c, no_host, s);
  EXPECT_NEAR(with_graph.time.step, without_host.time.step, 1e-9 * without_host.time.step);
  EXPECT_LT(with_graph.time.step, 0.9 * predict(g, c, sw, s).time.step);
}

TEST(CudaGraphs, ADroplessMoePlanNeedsFixedShapes) {
  const ModelSpec m = load_model("qwen3-30b-a3b", TRAINPLAN_SOURCE_DIR);
  Strategy s = moe_layout(8, 8);
  s.cuda_graphs = CudaGraphs::full;
  s.dispatcher = Dispatcher::alltoall;
  const auto why = validate(s, m);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("--cuda-graphs full"), std::string::npos) << *why;
  s.capacity_factor = 1.0;  // drop-and-pad: every expert's tokens fixed
  EXPECT_FALSE(validate(s, m).has_value());
  s.capacity_factor = 0;
  s.dispatcher = Dispatcher::flex;  // the sync-free path's pre-sized buffers
  EXPECT_FALSE(validate(s, m).has_value());
  EXPECT_EQ(cuda_graphs_unavailable(load_model("llama2-7b", TRAINPLAN_SOURCE_DIR), Dispatcher::alltoall, 0), nullptr);
}

TEST(CudaGraphs, ACapturedRegionCostsOneLaunchPerPass) {
  // Per-layer graphs (Strategy::cuda_graph_modules) leave every kernel's GPU time as it is and
  // replace the launches of the captured regions by one per region and pass. Llama 3 8B under
  // megatron-core (gradient accumulation fused into the GEMMs, so every kernel of a layer belongs
  // to its attention side or its MLP side): with both sides captured a layer's forward and
  // backward each launch two graphs and nothing else; with the attention side alone, the MLP
  // side's kernels stay and the attention side's become one launch.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = load_model("llama3-8b", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 4096);
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  ASSERT_TRUE(sw.wgrad_accumulate_fused);
  Strategy s;
  s.dp = 8, s.global_batch = 64, s.seq_len = 4096, s.zero = 1;
  Strategy layer = s, attn = s, mlp = s;
  layer.cuda_graph_modules = kGraphAttn | kGraphMlp;
  attn.cuda_graph_modules = kGraphAttn;
  mlp.cuda_graph_modules = kGraphMlp;
  for (const Strategy* x : {&layer, &attn, &mlp}) ASSERT_FALSE(validate(*x, m).has_value());
  const LayerOpCosts e = op_costs(g, c, sw, s).kinds[0], l = op_costs(g, c, sw, layer).kinds[0];
  const LayerOpCosts a = op_costs(g, c, sw, attn).kinds[0], p = op_costs(g, c, sw, mlp).kinds[0];
  for (const auto& [eager, graphed] : {std::pair{e.fwd, l.fwd}, std::pair{e.bwd, l.bwd}}) {
    EXPECT_DOUBLE_EQ(graphed.gpu, eager.gpu);
    EXPECT_DOUBLE_EQ(graphed.kernels, 2.0);
    EXPECT_DOUBLE_EQ(graphed.host, 0.0);
  }
  // The two sides' kernels add up to the layer's: (eager - attn side + 1) + (eager - mlp side + 1).
  EXPECT_DOUBLE_EQ((a.fwd.kernels - 1) + (p.fwd.kernels - 1), e.fwd.kernels);
  EXPECT_DOUBLE_EQ((a.bwd.kernels - 1) + (p.bwd.kernels - 1), e.bwd.kernels);
  EXPECT_GT(a.fwd.kernels, 1.0);
  EXPECT_GT(p.fwd.kernels, 1.0);
}

TEST(CudaGraphs, CapturingTheMoeLayersBeforeTheDispatchShortensAHostBoundStep) {
  // Capturing the host-bound plan's attention and MoE block up to the dispatch (NVIDIA's
  // transformer_engine recipes: attn, moe_router, moe_preprocess) saves their launches but not the
  // experts': the step lies between the eager one and the whole-iteration graph's.
  const HostBoundMoe plan;
  const auto& [c, m, g, sw, s] = plan;
  Strategy regions = s, whole = s, experts = s;
  regions.cuda_graph_modules = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
  whole.cuda_graphs = CudaGraphs::full;
  experts.capacity_factor = 1.0;  // drop-and-pad: the whole MoE block can be captured
  experts.cuda_graph_modules = kGraphAttn | kGraphMoe;
  for (const Strategy* x : {&regions, &whole, &experts}) ASSERT_FALSE(validate(*x, m).has_value());
  const double eager = predict(g, c, sw, s).time.step, partial = predict(g, c, sw, regions).time.step;
  EXPECT_LT(partial, eager);
  EXPECT_GT(partial, predict(g, c, sw, whole).time.step);
  // With every region of the layer captured no host launch is left in its passes but the graphs'.
  const LayerOpCosts all = op_costs(g, c, sw, experts).kinds[0];
  EXPECT_DOUBLE_EQ(all.fwd.kernels, 2.0);
  EXPECT_DOUBLE_EQ(all.fwd.host, 0.0);
  EXPECT_DOUBLE_EQ(all.bwd.kernels, 2.0);
}

TEST(CudaGraphs, PerLayerRegionsFollowMegatronCoresRules) {
  const ModelSpec moe = load_model("qwen3-30b-a3b", TRAINPLAN_SOURCE_DIR);
  const ModelSpec dense = load_model("llama3-8b", TRAINPLAN_SOURCE_DIR);
  Strategy s = moe_layout(8, 8);
  const auto refused = [&](unsigned modules, const ModelSpec& m, const char* words) {
    Strategy x = s;
    if (!m.moe.on()) x.ep = 1;
    x.cuda_graph_modules = modules;
    const auto why = validate(x, m);
    if (!why) return ::testing::AssertionFailure() << cuda_graph_modules_string(modules) << " accepted";
    if (why->find("--cuda-graph-modules") == std::string::npos || why->find(words) == std::string::npos)
      return ::testing::AssertionFailure() << *why;
    return ::testing::AssertionSuccess();
  };
  EXPECT_TRUE(refused(kGraphMoe, moe, "drop-and-pad"));           // dropless: shapes vary
  EXPECT_TRUE(refused(kGraphMoePreprocess, moe, "moe_router"));   // only with the router
  EXPECT_TRUE(refused(kGraphMoe | kGraphMoeRouter, moe, "exclude"));
  EXPECT_TRUE(refused(kGraphMlp, moe, "dense MLP"));              // every Qwen3 layer is MoE
  EXPECT_TRUE(refused(kGraphMoeRouter, dense, "need experts"));
  Strategy x = s;
  x.cuda_graph_modules = kGraphAttn;
  x.cuda_graphs = CudaGraphs::full;
  x.dispatcher = Dispatcher::flex;
  EXPECT_NE(validate(x, moe).value_or("").find("exclude each other"), std::string::npos);
  x.cuda_graphs = CudaGraphs::none;
  x.recompute = Recompute::full;
  EXPECT_NE(validate(x, moe).value_or("").find("full recomputation"), std::string::npos);
  x.recompute = Recompute::none;
  x.cuda_graph_modules = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
  EXPECT_FALSE(validate(x, moe).has_value());
}

TEST(MoeHandWorked, ExpertStatesPerRankOverEpEtpAndEdpWithZero1) {
  // Mixtral, dp 16 tp 2 (sp) ep 4 etp 2: the 32 x 8 experts' 3 x 4096 x 14336 weights each
  // (45.1B) are split over ep x etp = 8 ranks and their ZeRO-1 optimizer states over edp = tp x dp
  // / (etp x ep) = 4; the dense parameters over tp = 2, their optimizer states over dp = 16.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = load_model("mixtral-8x7b", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 4096);
  const double E = 32.0 * 8 * 3 * 4096 * 14336;
  EXPECT_DOUBLE_EQ(g.counts().expert, E);
  Strategy s = moe_layout(16, 4);
  s.tp = 2;
  s.etp = 2;
  s.sequence_parallel = true;
  s.zero = 1;
  ASSERT_FALSE(validate(s, m).has_value());
  EXPECT_EQ(s.edp(), 4);
  const double D = g.counts().total - E;  // split over tp (the router and norms in full: below)
  const StageMemory mem = predict(g, c, s).per_stage.at(0);
  const StateBytes b = state_bytes(Dtype::bf16, false);
  const double expert_weights = b.weight * E / 8, expert_optimizer = b.optimizer * E / (8 * 4);
  // The dense part's replicated pieces (norms, router) make it at least D / tp and under D / tp
  // plus 1% of it.
  EXPECT_GE(mem.weights, expert_weights + b.weight * D / 2);
  EXPECT_LE(mem.weights, expert_weights + 1.01 * b.weight * D / 2);
  EXPECT_GE(mem.optimizer, expert_optimizer + b.optimizer * D / (2 * 16));
  EXPECT_LE(mem.optimizer, expert_optimizer + 1.01 * b.optimizer * D / (2 * 16));
  // Doubling ep to 8 (edp 2) halves the expert weights per rank and keeps the expert optimizer
  // states at E / 16 per rank (ep x etp x edp = 16 either way).
  s.ep = 8;
  const StageMemory wider = predict(g, c, s).per_stage.at(0);
  EXPECT_NEAR(mem.weights - wider.weights, expert_weights / 2, 1e-6 * expert_weights);
  EXPECT_NEAR(mem.optimizer, wider.optimizer, 1e-6 * mem.optimizer);
}

// Megatron-core's layernorm module (--recompute-modules layernorm) drops the outputs of the norms
// that are modules of their own and rebuilds them before the backward. Qwen3-30B-A3B (MoE, no
// MLA): only the pre-MLP norm, read by the router: one tokens x h tensor at 2 bytes less per
// layer (4096 x 2048 x 2 B = 16 MiB at micro-batch 1), and one norm forward more to recompute.
// DeepSeek-V3's MoE layers (MLA, shared expert): the pre-MLP norm's output (the router's; the
// shared expert reads the same tensor and never counted it) and MLA's input norm's (the query
// down projection's input): two such tensors (4096 x 7168 x 2 B each). Dense models refuse it.
// gpt-oss's clamped activation and expert biases under megatron-core, at ep 8 on 8 H100s with one
// micro-batch of 4096 tokens: a rank's experts take 4096 x top-4 = 16,384 rows over 16 local
// experts. The clamps run on the activation's input, 16,384 x 2 x 2880 x 2 B = 188,743,680 B
// (1.33 add passes forward, 1.67 backward, 3 kernels each way); the down projections' biases on
// their output, 16,384 x 2880 x 2 B = 94,371,840 B, each expert's 1/16 of it (2 passes and 2
// kernels per expert forward, 2.67 and 4 backward). The clamps keep their input as well: one more
// copy of the activation's input per layer, which recomputing moe_act drops.
TEST(MoeHandWorked, ClampedActivationAndExpertBiasesAsTheStackRunsThem) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  const ModelSpec oss = load_model("gpt-oss-120b", TRAINPLAN_SOURCE_DIR);
  ASSERT_EQ(oss.activation_clamp, 7.0);
  ASSERT_TRUE(oss.moe.expert_bias);
  ModelSpec plain = oss;
  plain.activation_clamp = 0;
  plain.moe.expert_bias = false;
  const Strategy s = moe_layout(8, 8);
  const LayerOpCosts with = op_costs(LayerGraph(oss, 4096), c, sw, s).kinds[0];
  const LayerOpCosts without = op_costs(LayerGraph(plain, 4096), c, sw, s).kinds[0];
  const double act_in = 16384.0 * 2 * 2880 * 2, rows = 16384.0 * 2880 * 2;
  const double clamp_fwd = 1.33 * c.ops.memory_fwd(MemKernel::add, act_in);
  const double bias_fwd = 16 * 2 * c.ops.memory_fwd(MemKernel::add, rows / 16);
  const double clamp_bwd = 1.67 * c.ops.memory_bwd(MemKernel::add, act_in);
  const double bias_bwd = 16 * 2.67 * c.ops.memory_bwd(MemKernel::add, rows / 16);
  EXPECT_NEAR(with.expert_fwd.gpu - without.expert_fwd.gpu, clamp_fwd + bias_fwd, 1e-12);
  EXPECT_NEAR(with.expert_bwd.gpu - without.expert_bwd.gpu, clamp_bwd + bias_bwd, 1e-12);
  EXPECT_DOUBLE_EQ(with.expert_fwd.kernels - without.expert_fwd.kernels, 3 + 2 * 16);
  EXPECT_DOUBLE_EQ(with.expert_bwd.kernels - without.expert_bwd.kernels, 3 + 4 * 16);
  // Memory: the clamp's input beside the activation's; none of it kept under moe_act recompute.
  auto saved = [&](const ModelSpec& m, unsigned modules) {
    Strategy r = s;
    r.recompute_modules = modules;
    return layer_activation_bytes(LayerGraph(m, 4096), sw, PlanShape(m, c, sw, r), 0, false);
  };
  EXPECT_DOUBLE_EQ(saved(oss, 0) - saved(plain, 0), act_in);
  EXPECT_DOUBLE_EQ(saved(oss, kRecomputeMoeAct) - saved(plain, kRecomputeMoeAct), 0);
  // A stack that clamps inside its activation kernel costs and keeps nothing more.
  Software fused = sw;
  fused.mem.glu_clamp = MemOpImpl{};
  ModelSpec unbiased = oss;
  unbiased.moe.expert_bias = false;
  EXPECT_EQ(op_costs(LayerGraph(unbiased, 4096), c, fused, s).kinds[0].expert_fwd.gpu, without.expert_fwd.gpu);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(LayerGraph(unbiased, 4096), fused, PlanShape(unbiased, c, fused, s), 0, false),
                   saved(plain, 0));
}

// gpt-oss's YaRN-scaled RoPE (cos and sin x 1.3466) under megatron-core, whose fused RoPE takes no
// such factor: q and k rotated in eager PyTorch, on 4096 tokens x (64 x 64 + 8 x 64) x 2 B =
// 37,748,736 B at 4 add passes and 24 kernels forward, 5.67 passes and 18 kernels backward, where
// the fused kernel takes 0.67 passes and one kernel each way. On the sliding and the full layers
// alike; a stack that folds the factor into its tables (no rope_scaled), or a model with latent
// attention, costs the same either way.
TEST(MoeHandWorked, ScaledRopeRunsUnfusedWhereTheStackCannotTakeTheFactor) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  const ModelSpec oss = load_model("gpt-oss-120b", TRAINPLAN_SOURCE_DIR);
  ASSERT_NEAR(oss.rope_attention_factor, 1.3466, 1e-4);
  ModelSpec plain = oss;
  plain.rope_attention_factor = 1;
  const Strategy s = moe_layout(8, 8);
  const double qk = 4096.0 * (64 * 64 + 8 * 64) * 2, floor = c.ops.kernel_floor;
  const double fwd = std::max(4 * c.ops.memory_fwd(MemKernel::add, qk), 24 * floor) -
                     std::max(0.67 * c.ops.memory_fwd(MemKernel::add, qk), floor);
  const double bwd = std::max(5.67 * c.ops.memory_bwd(MemKernel::add, qk), 18 * floor) -
                     std::max(0.67 * c.ops.memory_bwd(MemKernel::add, qk), floor);
  const OpCosts with = op_costs(LayerGraph(oss, 4096), c, sw, s), without = op_costs(LayerGraph(plain, 4096), c, sw, s);
  ASSERT_EQ(LayerGraph(oss, 4096).kind_count(), 2);
  for (int k : {0, 1}) {
    EXPECT_NEAR(with.kinds[k].fwd.gpu - without.kinds[k].fwd.gpu, fwd, 1e-12) << k;
    EXPECT_NEAR(with.kinds[k].bwd.gpu - without.kinds[k].bwd.gpu, bwd, 1e-12) << k;
    EXPECT_DOUBLE_EQ(with.kinds[k].fwd.kernels - without.kinds[k].fwd.kernels, 24 - 1) << k;
    EXPECT_DOUBLE_EQ(with.kinds[k].bwd.kernels - without.kinds[k].bwd.kernels, 18 - 1) << k;
  }
  // Latent attention keeps the fused RoPE: Megatron-core's MLA kernels take scaled tables.
  ModelSpec ds = load_model("deepseek-v3", TRAINPLAN_SOURCE_DIR), ds_scaled = ds;
  ds_scaled.rope_attention_factor = 1.3;
  const Strategy d = moe_layout(32, 32);
  const OpCosts ds_with = op_costs(LayerGraph(ds_scaled, 4096), c, sw, d), ds_without = op_costs(LayerGraph(ds, 4096), c, sw, d);
  for (int k = 0; k < LayerGraph(ds, 4096).kind_count(); ++k) EXPECT_EQ(ds_with.kinds[k].fwd.gpu, ds_without.kinds[k].fwd.gpu) << k;
  Software folded = sw;
  folded.mem.rope_scaled.reset();
  const LayerOpCosts folded_full = op_costs(LayerGraph(oss, 4096), c, folded, s).kinds[1];
  EXPECT_EQ(folded_full.fwd.gpu, without.kinds[1].fwd.gpu);
  EXPECT_EQ(folded_full.bwd.gpu, without.kinds[1].bwd.gpu);
}

TEST(MoeHandWorked, LayernormModuleDropsTheOwnNormsOutputs) {
  const Software& sw = testing::default_software();
  const Cluster c = testing::builtin_cluster("dgx-h100");
  auto saved = [&](const ModelSpec& m, unsigned modules, int kind) {
    const LayerGraph g(m, 4096);
    Strategy s = moe_layout(8, 8);
    s.recompute_modules = modules;
    EXPECT_FALSE(validate(s, m).has_value());
    return layer_activation_bytes(g, sw, PlanShape(m, c, sw, s), kind, false);
  };
  const ModelSpec qwen = load_model("qwen3-30b-a3b", TRAINPLAN_SOURCE_DIR);
  EXPECT_DOUBLE_EQ(saved(qwen, 0, 0) - saved(qwen, kRecomputeLayernorm, 0), 4096.0 * 2048 * 2);
  const ModelSpec ds = load_model("deepseek-v3", TRAINPLAN_SOURCE_DIR);
  const LayerGraph dg(ds, 4096);
  int moe_kind = -1;
  for (int k = 0; k < dg.kind_count(); ++k)
    if (dg.kind(k).moe) moe_kind = k;
  ASSERT_GE(moe_kind, 0);
  EXPECT_DOUBLE_EQ(saved(ds, 0, moe_kind) - saved(ds, kRecomputeLayernorm, moe_kind), 2 * 4096.0 * 7168 * 2);
  // The recompute: one norm forward per own norm (Qwen3: one), over the layer's tokens.
  Strategy s = moe_layout(8, 8);
  const OpCosts plain = op_costs(LayerGraph(qwen, 4096), c, sw, s);
  s.recompute_modules = kRecomputeLayernorm;
  const OpCosts rebuilt = op_costs(LayerGraph(qwen, 4096), c, sw, s);
  EXPECT_GT(rebuilt.kinds[0].module_recompute.gpu, plain.kinds[0].module_recompute.gpu);
  EXPECT_DOUBLE_EQ(rebuilt.kinds[0].module_recompute.kernels - plain.kinds[0].module_recompute.kernels,
                   sw.mem.rms_norm.kernels_fwd);
  Strategy dense = layout(1, 1, 1, 8, 64);
  dense.recompute_modules = kRecomputeLayernorm;
  EXPECT_EQ(validate(dense, gpt(8, 2048, 16)).value_or(""),
            "--recompute-modules layernorm: needs a model with experts or multi-head latent attention (a dense layer's "
            "norms are fused into the next linear and have no output of their own)");
}

TEST(RecomputeModules, MlpKeepsTheMlpInputAndRerunsItsForward) {
  // Llama 3 8B, tp 2 with SP, one micro-batch of 8192 tokens, bf16, megatron-core. Each layer
  // drops the MLP's saved tensors past its input: the up projection's sequence-split input
  // (h / tp x 2 B), SwiGLU's input (2f / tp x 2 B) and the down projection's input (f / tp x 2 B),
  // h = 4096, f = 14336: 47,104 B a token, x 8192 tokens x 32 layers = 12.35 GB.
  const Software& sw = testing::default_software();
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = load_model("llama3-8b", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(m, 8192);
  Strategy s = layout(4, 2, 1, 1, 64, 8192);
  s.sequence_parallel = true;
  Strategy mlp = s;
  mlp.recompute_modules = kRecomputeMlp;
  ASSERT_FALSE(validate(mlp, m).has_value());
  const double per_token = 4096.0 / 2 * 2 + 2 * 14336.0 / 2 * 2 + 14336.0 / 2 * 2;
  EXPECT_DOUBLE_EQ(per_token, 47104);
  const Estimate kept = predict(g, c, sw, s), rebuilt = predict(g, c, sw, mlp);
  EXPECT_NEAR(kept.per_stage[0].activations - rebuilt.per_stage[0].activations, per_token * 8192 * 32, 1);
  // The recompute: the fused norm, both GEMMs and the activation forward, once per layer and
  // micro-batch, with the MLP's all-gather and reduce-scatter again in the backward.
  const PassCost again = op_costs(g, c, sw, mlp).kinds[0].module_recompute;
  const double tokens = 8192, kernels_mlp = 2 * sw.gemm_kernels + sw.mem.swiglu.kernels_fwd + sw.mem.rms_norm.kernels_fwd;
  EXPECT_DOUBLE_EQ(again.kernels, kernels_mlp);
  const Seconds floor = c.ops.kernel_floor;
  const Seconds gemms = std::max(floor, gemm_time(c, Dtype::bf16, tokens, 2 * 14336.0 / 2, 4096, GemmPass::fwd)) +
                        std::max(floor, gemm_time(c, Dtype::bf16, tokens, 4096, 14336.0 / 2, GemmPass::fwd));
  const Seconds swiglu = std::max(floor, sw.mem.swiglu.passes_fwd *
                                             c.ops.memory_fwd(MemKernel::swiglu, tokens * 2 * 14336.0 / 2 * 2));
  const Seconds norm = std::max(floor, sw.mem.rms_norm.passes_fwd *
                                           c.ops.memory_fwd(MemKernel::rms_norm, tokens / 2 * 4096 * 2));
  EXPECT_NEAR(again.gpu, gemms + swiglu + norm, 1e-12);
  const LayerCosts lc = layer_costs(g, c, sw, mlp);
  EXPECT_NEAR(lc.kinds[0].recompute, again.time(HostLaunch{sw.host_per_kernel, false}), 1e-12);
  EXPECT_GT(lc.kinds[0].tp_backward, layer_costs(g, c, sw, s).kinds[0].tp_backward);
  EXPECT_NEAR(rebuilt.time.recompute, 32 * 16 * lc.kinds[0].recompute, 1e-9);
  // MoE layers are left alone: Qwen3-30B routes every layer, so the module does not apply.
  const std::string why = validate([] {
    Strategy q = moe_layout(8, 8);
    q.recompute_modules = kRecomputeMlp;
    return q;
  }(), load_model("qwen3-30b-a3b", TRAINPLAN_SOURCE_DIR)).value_or("");
  EXPECT_NE(why.find("--recompute-modules mlp: needs a layer with a dense MLP"), std::string::npos) << why;
}

}  // namespace
}  // namespace trainplan
