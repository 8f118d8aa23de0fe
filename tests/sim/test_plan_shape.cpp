// PlanShape: the per-plan facts every cost component reads, worked by hand from the strategy, the
// software profile and the cluster.
#include <gtest/gtest.h>

#include "sim/memory_model.hpp"
#include "sim/param_server.hpp"
#include "sim/plan_shape.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

using testing::gpt;

Strategy plan(int dp, int tp, int pp, int cp, int b, int B, int seq = 4096) {
  Strategy s;
  s.dp = dp, s.tp = tp, s.pp = pp, s.cp = cp, s.micro_batch = b, s.global_batch = B, s.seq_len = seq;
  return s;
}

Software profile(const char* name) { return load_software(name, TRAINPLAN_SOURCE_DIR); }

TEST(PlanShape, TokensAndTheSharesARankHolds) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = gpt(8, 4096, 32, 4096, 32000);
  Strategy s = plan(2, 4, 1, 2, 2, 8);
  s.sequence_parallel = true;
  // b x seq / cp = 2 x 4096 / 2 = 4096 tokens per rank; SP keeps a quarter of a sequence-split
  // tensor (1024 tokens); a tensor-split one is a quarter whatever SP; a replica's micro-batch is
  // b x seq = 8192 tokens.
  const PlanShape sp(m, c, profile("megatron-core"), s);
  EXPECT_EQ(sp.tokens.per_rank, 4096);
  EXPECT_EQ(sp.tokens.seq_share, 0.25);
  EXPECT_EQ(sp.tokens.seq_split, 1024);
  EXPECT_EQ(sp.tokens.tensor_share, 0.25);
  EXPECT_EQ(sp.tokens.per_replica, 8192);
  s.sequence_parallel = false;
  const PlanShape plain(m, c, profile("megatron-core"), s);
  EXPECT_EQ(plain.tokens.seq_share, 1);
  EXPECT_EQ(plain.tokens.seq_split, 4096);
  EXPECT_EQ(plain.tokens.tensor_share, 0.25);
  // Per replica and step: 8 / (2 x 2) = 2 micro-batches; one chunk per stage.
  EXPECT_EQ(plain.micro_batches, 2);
  EXPECT_EQ(plain.chunks, 1);
  // megatron-core pads 32000 to a multiple of 128 x tp = 512: 32256 rows.
  EXPECT_EQ(plain.vocab_rows, 32256);
}

TEST(PlanShape, ElementWidthsPerTensorKind) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = gpt(8, 1024, 16, 4096, 32000);
  const Software megatron = profile("megatron-core"), exec = profile("trainplan-exec");
  Strategy s = plan(2, 1, 1, 1, 1, 2);
  // Megatron-core, bf16: everything 16-bit, Adam's 12 B of fp32 state, 4 B logits.
  const ElementBytes bf16 = PlanShape(m, c, megatron, s).bytes;
  EXPECT_EQ(bf16.activation, 2);
  EXPECT_EQ(bf16.stream, 2);
  EXPECT_EQ(bf16.saved_gemm_input, 2);
  EXPECT_EQ(bf16.gathered_param, 2);
  EXPECT_EQ(bf16.wire_grad, 2);
  EXPECT_EQ(bf16.state.weight + bf16.state.grad + bf16.state.optimizer, 16);
  EXPECT_EQ(bf16.logit, 4);
  EXPECT_EQ(bf16.error_feedback, 0);
  // FP8 under Megatron-core: GEMM inputs are saved quantized (1 B); activations stay 16-bit.
  s.dtype = Dtype::fp8;
  const ElementBytes fp8 = PlanShape(m, c, megatron, s).bytes;
  EXPECT_EQ(fp8.saved_gemm_input, 1);
  EXPECT_EQ(fp8.activation, 2);
  EXPECT_EQ(fp8.gathered_param, 2);
  // fp32 training: 4-byte activations, stream, gathers and gradients; Adam's two moments only.
  s.dtype = Dtype::fp32;
  const ElementBytes fp32 = PlanShape(m, c, megatron, s).bytes;
  EXPECT_EQ(fp32.activation, 4);
  EXPECT_EQ(fp32.stream, 4);
  EXPECT_EQ(fp32.gathered_param, 4);
  EXPECT_EQ(fp32.wire_grad, 4);
  EXPECT_EQ(fp32.state.optimizer, 8);
  // trainplan exec (autocast over fp32 parameters): an fp32 stream, 4 + 4 + 8 B of states as
  // held, 16-bit weight copies; the ZeRO gathers stay in the compute dtype. Its chunked loss holds
  // fp32 logits and their 16-bit copy (4 + 2 B), and per LM-head weight its fp32 gradient and
  // 16-bit cast (4 + 2 B); in fp32 the copies are the tensors themselves.
  s.dtype = Dtype::bf16;
  const ElementBytes autocast = PlanShape(m, c, exec, s).bytes;
  EXPECT_EQ(autocast.stream, 4);
  EXPECT_EQ(autocast.activation, 2);
  EXPECT_EQ(autocast.state.weight, 4);
  EXPECT_EQ(autocast.state.optimizer, 8);
  EXPECT_EQ(autocast.weight_copy, 2);
  EXPECT_EQ(autocast.gathered_param, 2);
  EXPECT_EQ(autocast.logit, 6);
  EXPECT_EQ(autocast.loss_head, 6);
  s.dtype = Dtype::fp32;
  EXPECT_EQ(PlanShape(m, c, exec, s).bytes.logit, 4);
  EXPECT_EQ(PlanShape(m, c, exec, s).bytes.loss_head, 4);
  EXPECT_EQ(PlanShape(m, c, megatron, s).bytes.loss_head, 0);
  s.dtype = Dtype::bf16;
  // 4-byte gradients on the wire with fp32 accumulation.
  s.fp32_grad_accum = true;
  EXPECT_EQ(PlanShape(m, c, megatron, s).bytes.wire_grad, 4);
  // PowerSGD keeps a 4-byte error-feedback buffer where gradients leave the GPU (dp 2), not on
  // one replica.
  s.grad_compression = {CompressionKind::powersgd, 4};
  EXPECT_EQ(PlanShape(m, c, megatron, s).bytes.error_feedback, 4);
  s.dp = 1, s.global_batch = 1;
  EXPECT_EQ(PlanShape(m, c, megatron, s).bytes.error_feedback, 0);
}

TEST(PlanShape, ParameterServersHoldTheOptimizerStates) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = gpt(8, 1024, 16, 4096, 32000);
  const Software exec = profile("trainplan-exec");
  Strategy s = plan(16, 1, 1, 1, 1, 16);
  s.dp_algorithm = DpAlgorithm::ps;
  s.ps_servers = 2;
  const PlanShape shape(m, c, exec, s);
  EXPECT_EQ(shape.bytes.state.optimizer, 0);
  EXPECT_EQ(shape.bytes.optimizer_temp, 0);
  EXPECT_EQ(shape.bytes.state.weight, 4);
  EXPECT_TRUE(shape.reduces_gradients);
  // The servers' network: 16 workers on 2 nodes, 8 replicas per node, the cluster's call overhead.
  EXPECT_EQ(shape.ps.servers, 2);
  EXPECT_EQ(shape.ps.nodes, 2);
  EXPECT_EQ(shape.ps.local_replicas, 8);
  EXPECT_EQ(shape.ps.call_overhead, c.collectives.call_overhead);
  EXPECT_EQ(shape.ps.gpu_bandwidth, ps_network(c, s).gpu_bandwidth);
}

TEST(PlanShape, OneGroupLinkPerParallelGroup) {
  // dgx-h100: 8 GPUs per node. Rank order tp, cp, dp, pp with tp 8, cp 2, dp 4, pp 2: TP fills a
  // node (stride 1), CP neighbours are 8 ranks apart, DP ones 16, stages 64.
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = gpt(8, 4096, 32, 4096, 32000);
  const Strategy s = plan(4, 8, 2, 2, 1, 8);
  const PlanShape shape(m, c, profile("megatron-core"), s);
  const ParallelGroups& g = shape.groups;
  EXPECT_EQ(g.tp.size, 8);
  EXPECT_EQ(g.tp.stride, 1);
  EXPECT_EQ(g.tp.link.bandwidth, c.node.bandwidth * c.node.efficiency);  // inside the node
  EXPECT_EQ(g.cp.size, 2);
  EXPECT_EQ(g.cp.stride, 8);
  EXPECT_EQ(g.cp.link.latency, group_link(c, 2, 8).latency);
  // DP with its CP replicas: dp x cp = 8 ranks, the nearer neighbour (CP, 8 apart) sets the stride.
  EXPECT_EQ(g.dp.size, 8);
  EXPECT_EQ(g.dp.stride, 8);
  EXPECT_EQ(g.dp.link.bandwidth, group_link(c, 8, 8).bandwidth);
  // The pipeline sends to its neighbour: the link of two ranks 64 apart.
  EXPECT_EQ(g.pp.size, 2);
  EXPECT_EQ(g.pp.stride, 64);
  EXPECT_EQ(g.pp.link.bandwidth, group_link(c, 2, 64).bandwidth);
  for (const GroupLink* l : {&g.tp, &g.cp, &g.dp, &g.pp}) EXPECT_EQ(l->call_overhead, c.collectives.call_overhead);
  EXPECT_TRUE(shape.reduces_gradients);
  // One group of each kind for the same strategy, whoever asks.
  EXPECT_EQ(parallel_groups(c, s).dp.stride, g.dp.stride);
  EXPECT_EQ(pipeline_group(c, s.pp, 64).link.latency, g.pp.link.latency);
}

// A pipeline that outgrows one node crosses a node boundary between some pair of adjacent stages:
// tp 4 x pp 16 on 8-GPU nodes puts stages 0-1 in node 0 and stage 2 in node 1. Its hop is the
// network's (one NIC per rank of the pair), though two stages four ranks apart fit in one node.
TEST(PlanShape, APipelineWiderThanANodeSendsOverTheNetwork) {
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  ASSERT_EQ(c.scale_up_gpus, 8);
  const LinkTier& leaf = c.network.front();
  const GroupLink inside = pipeline_group(c, 2, 4);  // 8 ranks: one node
  EXPECT_EQ(inside.link.latency, c.node.latency);
  EXPECT_EQ(inside.link.bandwidth, c.node.bandwidth * c.node.efficiency);
  const GroupLink across = pipeline_group(c, 16, 4);  // 64 ranks: 8 nodes
  EXPECT_EQ(across.stride, 4);
  EXPECT_EQ(across.link.latency, leaf.latency);
  EXPECT_DOUBLE_EQ(across.link.bandwidth, leaf.bandwidth * leaf.efficiency);
  // Stages a whole node apart or more were already across the network; nothing changes there.
  EXPECT_EQ(pipeline_group(c, 4, 8).link.bandwidth, group_link(c, 2, 8).bandwidth);
}

TEST(PlanShape, ZeroPolicyAndScheduleOverlap) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = gpt(8, 1024, 16, 4096, 32000);
  const Software sw = profile("megatron-core");
  Strategy s = plan(2, 1, 2, 1, 1, 8);
  for (int stage = 0; stage <= ZeroPolicy::kMaxStage; ++stage) {
    s.zero = stage;
    EXPECT_EQ(PlanShape(m, c, sw, s).zero, ZeroPolicy::of(stage));
  }
  EXPECT_EQ(PlanShape(m, c, sw, s).pp_overlap, sw.overlap.pp);
  s.schedule = ScheduleKind::interleaved;
  s.vp = 2;
  const PlanShape interleaved(m, c, sw, s);
  EXPECT_EQ(interleaved.pp_overlap, sw.overlap.pp_interleaved);
  EXPECT_EQ(interleaved.chunks, 4);
}

// A stack that all-reduces whole gradients once a step (parallelism.dp_all_reduce_bytes) runs
// ZeRO 0 and 1 with an all-reduce in that width: ZeRO-1 keeps its sharded optimizer states and its
// gather after the step, but reduces like ZeRO 0; ZeRO 2 and 3, which reduce every micro-batch,
// stay as the stage has them.
TEST(PlanShape, AStackThatAllReducesGradientsInItsOwnWidth) {
  const Cluster c = testing::builtin_cluster("dgx-h100");
  const ModelSpec m = gpt(8, 1024, 16, 4096, 32000);
  Software sw = profile("megatron-core");
  sw.parallel.dp_all_reduce_bytes = 4;
  Strategy s = plan(4, 1, 1, 1, 1, 8);
  s.dtype = Dtype::bf16;
  for (int stage : {0, 1}) {
    s.zero = stage;
    ZeroPolicy expected = ZeroPolicy::of(stage);
    expected.reduce_scatters = false;
    const PlanShape shape(m, c, sw, s);
    EXPECT_EQ(shape.zero, expected) << stage;
    EXPECT_EQ(shape.bytes.wire_grad, 4) << stage;  // fp32 on the wire, the bf16 gradient cast
    EXPECT_EQ(shape.bytes.state.grad, PlanShape(m, c, profile("megatron-core"), s).bytes.state.grad);
  }
  EXPECT_TRUE(zero_policy(sw, s).shards_optimizer);
  EXPECT_TRUE(zero_policy(sw, s).gather_params_after_step);
  for (int stage : {2, 3}) {
    s.zero = stage;
    EXPECT_FALSE(stack_all_reduces_gradients(sw, s));
    EXPECT_EQ(PlanShape(m, c, sw, s).zero, ZeroPolicy::of(stage)) << stage;
    EXPECT_EQ(PlanShape(m, c, sw, s).bytes.wire_grad, state_bytes(s).grad) << stage;
  }
}

TEST(PlanShape, ShapePlanRefusesWhatCannotBeCosted) {
  const ModelSpec m = gpt(8, 1024, 16, 4096, 32000);
  const Software sw = profile("megatron-core");
  const Cluster h100 = testing::builtin_cluster("dgx-h100"), a100 = testing::builtin_cluster("dgx-a100-80g");
  Strategy s = plan(1, 3, 1, 1, 1, 1);
  const auto bad = shape_plan(m, h100, sw, s);
  ASSERT_TRUE(std::holds_alternative<Infeasible>(bad));
  EXPECT_EQ(std::get<Infeasible>(bad).reason, InfeasibleReason::invalid_strategy);
  EXPECT_NE(std::get<Infeasible>(bad).detail.find("--tp 3"), std::string::npos);
  s.tp = 2;
  s.dtype = Dtype::fp8;  // the A100 has no FP8 peak
  const auto no_fp8 = shape_plan(m, a100, sw, s);
  ASSERT_TRUE(std::holds_alternative<Infeasible>(no_fp8));
  EXPECT_EQ(std::get<Infeasible>(no_fp8).reason, InfeasibleReason::unsupported_dtype);
  const auto ok = shape_plan(m, h100, sw, s);
  ASSERT_TRUE(std::holds_alternative<PlanShape>(ok));
  EXPECT_EQ(std::get<PlanShape>(ok).strategy.tp, 2);
  EXPECT_FALSE(cannot_shape(m, h100, s).has_value());
  // Built unchecked from a strategy no validate() passed, a shape refuses what it would divide by
  // (a bug check, not a crash).
  Strategy zero_dp = s;
  zero_dp.dp = 0;
  EXPECT_THROW(PlanShape(m, h100, sw, zero_dp), std::logic_error);
}

// What each number format stores at what width (plan_shape.hpp), by hand:
//   MXFP8 (OCP MX v1.0): 1 byte per element + one 1-byte E8M0 scale per 32 = 1.03125 B;
//   NVFP4: half a byte per element + one 1-byte E4M3 scale per 16 = 0.5625 B (the per-tensor fp32
//   scale is 4 B per tensor, nothing per element).
// Master weights and optimizer states stay fp32 (12 B), weights and gradients 16-bit (2 B), the
// saved GEMM inputs and the two cached weight copies (rowwise and columnwise blocks) in the format.
TEST(PlanShape, BlockScaledFormatsStoreTheirScales) {
  EXPECT_DOUBLE_EQ(gemm_input_bytes(Dtype::mxfp8), 1.03125);
  EXPECT_DOUBLE_EQ(gemm_input_bytes(Dtype::nvfp4), 0.5625);
  EXPECT_DOUBLE_EQ(gemm_input_bytes(Dtype::fp8), 1);
  EXPECT_DOUBLE_EQ(gemm_input_bytes(Dtype::bf16), 2);
  const Software mc = profile("megatron-core");  // keeps quantized GEMM inputs (fp8_saved_gemm_input_bytes 1)
  Strategy s = plan(8, 1, 1, 1, 1, 8);
  s.dtype = Dtype::mxfp8;
  ElementBytes b = element_bytes(mc, s);
  EXPECT_DOUBLE_EQ(b.activation, 2);
  EXPECT_DOUBLE_EQ(b.gemm_input, 1.03125);
  EXPECT_DOUBLE_EQ(b.saved_gemm_input, 1.03125);
  EXPECT_DOUBLE_EQ(b.weight_copy, 2 * 1.03125);         // rowwise and columnwise, cached over the step
  EXPECT_DOUBLE_EQ(b.quantize_moved, 2 + 2 * 1.03125);  // read 16-bit, write both copies
  EXPECT_DOUBLE_EQ(b.state.weight, 2);
  EXPECT_DOUBLE_EQ(b.state.optimizer, 12);              // fp32 master, momentum, variance
  EXPECT_DOUBLE_EQ(b.gathered_param, 2);                // communication stays 16-bit
  EXPECT_DOUBLE_EQ(b.wire_grad, 2);
  s.dtype = Dtype::nvfp4;
  b = element_bytes(mc, s);
  EXPECT_DOUBLE_EQ(b.saved_gemm_input, 0.5625);
  EXPECT_DOUBLE_EQ(b.weight_copy, 1.125);
  EXPECT_DOUBLE_EQ(b.quantize_moved, 2 + 1.125 + 2);    // and a read for the per-tensor amax
  EXPECT_DOUBLE_EQ(b.state.optimizer, 12);
  // A stack that saves its GEMM inputs in 16 bits (pytorch-eager) keeps 2 B under any format; its
  // autocast copies (2 B) and the format's two come on top.
  const Software eager = profile("pytorch-eager");
  b = element_bytes(eager, s);
  EXPECT_DOUBLE_EQ(b.saved_gemm_input, 2);
  EXPECT_DOUBLE_EQ(b.weight_copy, 2 + 1.125);
  s.dtype = Dtype::fp8;  // per-tensor FP8 is as it was: the profile's saved width, no format copies
  EXPECT_DOUBLE_EQ(element_bytes(mc, s).saved_gemm_input, 1);
  EXPECT_DOUBLE_EQ(element_bytes(mc, s).weight_copy, 0);
  EXPECT_DOUBLE_EQ(element_bytes(mc, s).quantize_moved, 0);
}

// The saved activations of one layer, by hand: the four linear layers keep their inputs (QKV and
// MLP up read the h-wide stream, the output projection the q-wide attention output, MLP down the
// f-wide activation), t x (2h + q + f) elements, at the format's width; the rest is 16-bit and the
// same under every format. GPT h 1024, f 4096, t = 2048 tokens: 2048 x 7168 elements.
TEST(PlanShape, SavedActivationsOfAQuantizedLayerByHand) {
  const LayerGraph g(gpt(2, 1024, 16, 2048, 32000), 2048);
  const Software mc = profile("megatron-core");
  Strategy s = plan(1, 1, 1, 1, 1, 1, 2048);
  const Bytes bf16 = layer_activation_bytes(g, mc, s, false);
  const double gemm_inputs = 2048.0 * (2 * 1024 + 1024 + 4096);
  s.dtype = Dtype::mxfp8;
  EXPECT_NEAR(bf16 - layer_activation_bytes(g, mc, s, false), gemm_inputs * (2 - 1.03125), 1e-6);
  s.dtype = Dtype::nvfp4;
  EXPECT_NEAR(bf16 - layer_activation_bytes(g, mc, s, false), gemm_inputs * (2 - 0.5625), 1e-6);
  s.dtype = Dtype::fp8;
  EXPECT_NEAR(bf16 - layer_activation_bytes(g, mc, s, false), gemm_inputs * (2 - 1), 1e-6);
}

// Block-scaled formats need a GPU with their peak: Blackwell has them, Hopper and MI300X do not.
TEST(PlanShape, BlockScaledFormatsNeedTheirPeak) {
  const ModelSpec m = gpt(8, 4096, 32, 4096, 32000);
  Strategy s = plan(8, 1, 1, 1, 1, 8);
  for (Dtype d : {Dtype::mxfp8, Dtype::nvfp4}) {
    s.dtype = d;
    for (const char* name : {"dgx-h100", "mi300x", "mi355x"}) {
      const auto why = cannot_shape(m, testing::builtin_cluster(name), s);
      ASSERT_TRUE(why.has_value()) << name;
      EXPECT_EQ(why->reason, InfeasibleReason::unsupported_dtype) << name;
    }
    EXPECT_FALSE(cannot_shape(m, testing::builtin_cluster("dgx-b200"), s).has_value());
  }
  s.dtype = Dtype::fp8;  // per-tensor FP8 on MI300X, as on Hopper
  EXPECT_FALSE(cannot_shape(m, testing::builtin_cluster("mi300x"), s).has_value());
}

}  // namespace
}  // namespace trainplan
