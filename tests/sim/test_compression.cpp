// Gradient compression: PowerSGD's (m + n) r elements per matrix, bf16's halving, the gradient
// shapes behind them, and what predict does with the smaller message and the extra memory.
#include <gtest/gtest.h>

#include "default_software.hpp"
#include "sim/compression.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"

namespace {

using namespace trainplan;

Strategy with(GradCompression g, int dp = 16) {
  Strategy s;
  s.dp = dp;
  s.global_batch = dp;
  s.seq_len = 1024;
  s.grad_compression = g;
  return s;
}

TEST(Compression, PowerSgdSendsMPlusNTimesRPerMatrix) {
  const Cluster c = load_cluster("dgx-h100", TRAINPLAN_SOURCE_DIR);
  EXPECT_EQ(powersgd_elements(1024, 4096, 4), (1024 + 4096) * 4);
  // One 1024 x 4096 matrix and 100 bias parameters, rank 4, 2-byte gradients:
  // (5120 x 4 + 100) elements x 2 B, in two rounds; error feedback 1024 x 4096 x 4 B.
  GradientShapes grads{{{1024, 4096}}, 100};
  const CompressionCost p = compression_cost(grads, c, with({CompressionKind::powersgd, 4}), 2.0);
  EXPECT_EQ(p.wire, (5120.0 * 4 + 100) * 2);
  EXPECT_EQ(p.rounds, 2);
  EXPECT_EQ(p.error_feedback, 1024.0 * 4096 * 4);
  EXPECT_GT(p.compute, 0);
  // A matrix that rank r would not shrink ((4 + 4) x 4 >= 16) is sent as it is.
  const CompressionCost small = compression_cost(GradientShapes{{{4, 4}}, 0}, c, with({CompressionKind::powersgd, 4}), 2.0);
  EXPECT_EQ(small.wire, 16.0 * 2);
  EXPECT_EQ(small.error_feedback, 0.0);
  // bf16: 2 bytes per fp32 gradient; none: the buffer as it is.
  EXPECT_EQ(compression_cost(grads, c, with({CompressionKind::bf16, 0}), 4.0).wire, grads.params() * 2);
  const CompressionCost none = compression_cost(grads, c, with({}), 4.0);
  EXPECT_EQ(none.wire, grads.params() * 4);
  EXPECT_EQ(none.compute, 0.0);
  EXPECT_EQ(none.rounds, 1);
}

TEST(Compression, GradientShapesHoldEveryParameterOfTheRank) {
  for (const char* name : {"gpt2", "llama3-8b"}) {
    const LayerGraph g(load_model(name, TRAINPLAN_SOURCE_DIR), 1024);
    for (int tp : {1, 2}) {
      Strategy s = with({});
      s.tp = tp;
      // Tensor-split ops' parameters / tp, except the row-parallel biases (GPT-2's output and MLP
      // down projections, h each), which every TP rank holds (Megatron); norms whole.
      const ModelSpec& m = g.model();
      double expected = 0;
      for (const auto& op : g.layer_ops()) expected += op.params * (op.split == Split::tensor ? 1.0 / tp : 1.0);
      if (m.norm == Norm::layernorm) expected += 2.0 * m.hidden * (1.0 - 1.0 / tp);
      EXPECT_NEAR(layer_gradients(g, s).params(), expected, 1e-6) << name << " tp" << tp;
    }
  }
  // Llama-3-8B's layer, tp 1: QKV 4096 x (4096 + 2 x 1024), out 4096 x 4096, up 4096 x 28672, down 14336 x 4096.
  const LayerGraph l(load_model("llama3-8b", TRAINPLAN_SOURCE_DIR), 1024);
  const GradientShapes shapes = layer_gradients(l, with({}));
  ASSERT_EQ(shapes.matrices.size(), 4u);
  EXPECT_EQ(shapes.matrices[0].n, 6144);
  EXPECT_EQ(shapes.matrices[2].n, 28672);
  EXPECT_EQ(shapes.matrices[3].m, 14336);
}

TEST(Compression, PredictSendsLessAndKeepsTheErrorFeedbackCopy) {
  const Cluster c = load_cluster("dgx-h100", TRAINPLAN_SOURCE_DIR);
  const LayerGraph g(load_model("gpt2-xl", TRAINPLAN_SOURCE_DIR), 1024);
  const Software sw = trainplan::testing::default_software();
  const Estimate plain = predict(g, c, sw, with({}, 32));
  const Estimate psgd = predict(g, c, sw, with({CompressionKind::powersgd, 4}, 32));
  ASSERT_TRUE(plain.feasible && psgd.feasible);
  EXPECT_LT(psgd.time.dp_comm, plain.time.dp_comm / 10);  // rank 4 of 1600-wide matrices: ~1/200 of the bytes
  EXPECT_GT(psgd.time.optimizer, plain.time.optimizer);   // its matmuls and error feedback
  // Error feedback: 4 B per parameter in "other" (allocator overhead aside).
  EXPECT_NEAR(psgd.per_stage[0].other - plain.per_stage[0].other, 4 * g.total_params(), 1.0);
  // bf16 halves fp32 gradients' bytes: with 4-byte gradients the all-reduce time roughly halves.
  Strategy fp32 = with({}, 32);
  fp32.fp32_grad_accum = true;
  Strategy half = fp32;
  half.grad_compression = {CompressionKind::bf16, 0};
  const Estimate a = predict(g, c, sw, fp32), b = predict(g, c, sw, half);
  EXPECT_LT(b.time.dp_comm, 0.55 * a.time.dp_comm);
  EXPECT_GT(b.time.dp_comm, 0.45 * a.time.dp_comm);
}

}  // namespace
