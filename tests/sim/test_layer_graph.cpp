// The layer graph's FLOP, parameter and activation figures against the published formulas
// (shared reference FORMULAS.md: Narayanan et al. 2021 Eq. 2-3, Korthikanti et al. 2022).
#include <gtest/gtest.h>

#include <cmath>

#include "sim/layer_graph.hpp"
#include "sim/predict.hpp"
#include "test_helpers.hpp"
#include "default_software.hpp"

namespace trainplan {
namespace {

using testing::gpt;

TEST(LayerGraph, ParametersMatchMegatronEq2) {
  // Psi = 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)); the graph also counts the final LayerNorm (2h),
  // which Eq. 2 leaves out.
  for (auto m : {gpt(24, 2304, 24), gpt(96, 12288, 96), gpt(128, 25600, 160)}) {
    const double l = m.layers, h = m.hidden, V = m.vocab, s = m.seq_len;
    const double eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
    LayerGraph g(m, m.seq_len);
    EXPECT_DOUBLE_EQ(g.total_params(), eq2 + 2 * h);
  }
}

TEST(LayerGraph, Llama2_7bParameterCount) {
  // Hand count: 32 x (4h^2 + 3hf + 2h) + 2Vh + h with h=4096, f=11008, V=32000 = 6,738,415,616,
  // the parameter count of the released checkpoint.
  const ModelSpec m = load_model("llama2-7b", TRAINPLAN_SOURCE_DIR);
  LayerGraph g(m, m.seq_len);
  EXPECT_DOUBLE_EQ(g.total_params(), 6738415616.0);
}

TEST(LayerGraph, ForwardFlopsPerLayer) {
  // Forward, per token, counting full attention: 24h^2 + 4sh per layer plus 2hV for the LM head
  // (Narayanan Eq. 3 / 3); the causal count keeps half of QK^T and softmax*V: 24h^2 + 2sh.
  const ModelSpec m = gpt(4, 1024, 16, 512, 1000);
  LayerGraph g(m, 512);
  const double h = 1024, s = 512, V = 1000;
  EXPECT_DOUBLE_EQ(g.forward_flops_per_token_full_attention(), 4 * (24 * h * h + 4 * s * h) + 2 * h * V);
  EXPECT_DOUBLE_EQ(g.forward_flops_per_token(), 4 * (24 * h * h + 2 * s * h) + 2 * h * V);
}

StepCosts costs_for(const ModelSpec& m, Recompute r, int tp, int B, int b) {
  Strategy s;
  s.tp = tp;
  s.dp = 1;
  s.micro_batch = b;
  s.global_batch = B;
  s.seq_len = m.seq_len;
  s.recompute = r;
  s.dtype = Dtype::fp16;
  return step_costs(LayerGraph(m, m.seq_len), testing::builtin_cluster("dgx-a100-80g"), s);
}

TEST(LayerGraph, ModelFlopsMatchKorthikanti) {
  // Model FLOPs per step counting full attention: 72 B l s h^2 (1 + s/(6h) + V/(12hl)); causal
  // attention halves the s/(6h) term.
  const ModelSpec m = gpt(36, 4096, 32);
  const double B = 64, l = 36, s = 2048, h = 4096, V = 51200;
  const StepCosts c = costs_for(m, Recompute::none, 1, 64, 4);
  const double full = c.model_flops_full_attention_per_micro_batch_per_replica * (B / 4);
  EXPECT_NEAR(full / (72 * B * l * s * h * h * (1 + s / (6 * h) + V / (12 * h * l))), 1.0, 1e-12);
  const double causal = c.model_flops_per_micro_batch_per_replica * (B / 4);
  EXPECT_NEAR(causal / (72 * B * l * s * h * h * (1 + s / (12 * h) + V / (12 * h * l))), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(c.hardware_flops_per_micro_batch_per_replica, c.model_flops_per_micro_batch_per_replica);
}

TEST(LayerGraph, HardwareFlopsWithFullRecomputeMatchEq3) {
  // Narayanan et al. 2021 Eq. 3, 96 B s l h^2 (1 + s/(6h) + V/(16lh)), counts full attention;
  // executed FLOPs count the causal half: s/(12h), for any TP size.
  const ModelSpec m = gpt(40, 6144, 48);
  const double B = 32, l = 40, s = 2048, h = 6144, V = 51200;
  for (int tp : {1, 2, 8}) {
    const StepCosts c = costs_for(m, Recompute::full, tp, 32, 8);
    const double per_step = c.hardware_flops_per_micro_batch_per_replica * (B / 8);
    EXPECT_NEAR(per_step / (96 * B * s * l * h * h * (1 + s / (12 * h) + V / (16 * l * h))), 1.0, 1e-12) << tp;
  }
}

TEST(LayerGraph, SelectiveRecomputeAddsTheAttentionForward) {
  // Our count: selective recomputation repeats QK^T and softmax*V, 4 B s^2 l h FLOPs counting full
  // attention, of which the causal kernels execute half. (Korthikanti et al. give
  // 72 B l s h^2 (1 + s/(3h) + V/(12hl)), which adds 12 B s^2 l h; our figure follows from counting
  // the recomputed forward once.)
  ModelSpec m = gpt(24, 2048, 16);
  const StepCosts none = costs_for(m, Recompute::none, 1, 8, 1);
  Strategy s;
  s.dp = 1;
  s.micro_batch = 1;
  s.global_batch = 8;
  s.seq_len = 2048;
  s.recompute = Recompute::selective;
  s.attention = Attention::standard;
  const StepCosts sel = step_costs(LayerGraph(m, 2048), testing::builtin_cluster("dgx-a100-80g"), s);
  EXPECT_DOUBLE_EQ(sel.hardware_flops_per_micro_batch_per_replica - none.hardware_flops_per_micro_batch_per_replica,
                   2.0 * 2048 * 2048 * 24 * 2048);
}

TEST(LayerGraph, RuleOfThumbSixPsiPerToken) {
  // Kaplan et al.: ~6 Psi FLOPs per token; attention adds about 12 s l h / (72 l h^2) = s/(6h).
  const ModelSpec m = gpt(96, 12288, 96);
  LayerGraph g(m, 2048);
  const double ratio = 3 * g.forward_flops_per_token() / (6 * g.total_params());
  EXPECT_GT(ratio, 1.0);
  EXPECT_LT(ratio, 1.0 + 2048.0 / (6 * 12288) + 0.01);
}

// Activation bytes per layer, fp16, standard attention, b = 1 (Korthikanti et al. 2022, Table 2).
double act(const ModelSpec& m, int tp, bool sp, Recompute r, Attention a = Attention::standard) {
  Strategy s;
  s.tp = tp;
  s.dp = 1;
  s.global_batch = 1;
  s.seq_len = m.seq_len;
  s.sequence_parallel = sp;
  s.recompute = r;
  s.attention = a;
  s.dtype = Dtype::fp16;
  return stored_layer_activation_bytes(LayerGraph(m, m.seq_len), s);
}

TEST(LayerGraph, ActivationMemoryMatchesKorthikantiTable) {
  const ModelSpec m = gpt(4, 4096, 32);
  const double s = 2048, b = 1, h = 4096, a = 32, t = 8;
  const double sbh = s * b * h;
  EXPECT_DOUBLE_EQ(act(m, 1, false, Recompute::none), sbh * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(act(m, 8, false, Recompute::none), sbh * (10 + 24 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(act(m, 8, true, Recompute::none), sbh / t * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(act(m, 8, false, Recompute::selective), sbh * (10 + 24 / t));
  EXPECT_DOUBLE_EQ(act(m, 8, true, Recompute::selective), 34 * sbh / t);
  EXPECT_DOUBLE_EQ(act(m, 8, false, Recompute::full), 2 * sbh);
  // Fused attention never stores the a*s*s scores: the 5as/h term goes.
  EXPECT_DOUBLE_EQ(act(m, 1, false, Recompute::none, Attention::flash), sbh * 34);
}

TEST(LayerGraph, SplitChangesAlongEdgesGiveTheLayersTpBoundaries) {
  // GPT (LayerNorm, GeLU): norm1 -> qkv and norm2 -> mlp_up enter the TP region, out_proj ->
  // residual1 and mlp_down -> residual2 leave it; the skip edges stay outside. Same for Llama.
  ModelSpec llama = gpt(3, 256, 4, 128, 1000);
  llama.name = "llama-like";
  llama.norm = Norm::rmsnorm;
  llama.activation = Activation::swiglu;
  llama.kv_heads = 2;
  for (const ModelSpec& m : {gpt(3, 256, 4, 128, 1000), llama}) {
    const LayerGraph g(m, 128);
    const LayerBoundaries& b = g.layer_boundaries();
    EXPECT_EQ(b.enter, 2) << m.name;
    EXPECT_EQ(b.exit, 2) << m.name;
    EXPECT_EQ(b.attention, 1) << m.name;
  }
  // Counted from the graph's edges: the same count over every layer's in-edges, divided by layers.
  const LayerGraph g(gpt(3, 256, 4, 128, 1000), 128);
  int changes = 0;
  for (auto [e, end] = boost::edges(g.graph()); e != end; ++e) {
    const OpSpec& from = g.graph()[boost::source(*e, g.graph())];
    const OpSpec& to = g.graph()[boost::target(*e, g.graph())];
    if (from.layer >= 0 && from.layer < 3 && to.layer == from.layer && from.split != to.split) ++changes;
  }
  EXPECT_EQ(changes, 3 * 4);
}

TEST(LayerGraph, GraphIsADagFromEmbeddingToLoss) {
  const ModelSpec m = gpt(3, 256, 4, 128, 1000);
  LayerGraph g(m, 128);
  EXPECT_EQ(boost::num_vertices(g.graph()), 1u + 3 * g.layer_ops().size() + 3);
  auto order = g.topological_order();
  ASSERT_EQ(order.size(), boost::num_vertices(g.graph()));
  EXPECT_EQ(order.front()->kind, OpKind::embedding);
  EXPECT_EQ(order.back()->kind, OpKind::loss);
  // Layers appear in order.
  int last_layer = -1;
  for (const OpSpec* op : order) {
    EXPECT_GE(op->layer, last_layer);
    last_layer = std::max(last_layer, op->layer);
  }
}

TEST(LayerGraph, GroupedQueryAttentionShrinksQkv) {
  ModelSpec m = gpt(2, 4096, 32);
  m.kv_heads = 8;  // d = 128: K and V are 8*128 = 1024 wide
  LayerGraph g(m, 2048);
  const OpSpec& qkv = g.layer_ops()[1];
  ASSERT_EQ(qkv.kind, OpKind::qkv);
  EXPECT_DOUBLE_EQ(qkv.flops_per_token, 2.0 * 4096 * (4096 + 2 * 1024));
}

// head_dim != hidden / heads (Mistral-NeMo-12B: h 5120, a 32, d 128, g 8, f 14336, V 131072):
// every attention figure uses q = a d = 4096 and kv = g d = 1024, the rest h.
TEST(LayerGraph, HeadDimSetsTheAttentionWidth) {
  const ModelSpec m = load_model(std::string(TRAINPLAN_TEST_DATA_DIR) + "/hf/mistral-nemo-12b/config.json",
                                 TRAINPLAN_SOURCE_DIR);
  const double h = 5120, q = 4096, kv = 1024, f = 14336, V = 131072, s = 4096;
  const LayerGraph g(m, 4096);
  // Parameters by hand (see test_model_spec's MistralNemoHeadDim): 12,247,782,400.
  EXPECT_DOUBLE_EQ(g.total_params(), 12247782400.0);
  auto op = [&](OpKind k) -> const OpSpec& {
    for (const auto& o : g.layer_ops())
      if (o.kind == k) return o;
    throw std::runtime_error("no such op");
  };
  EXPECT_DOUBLE_EQ(op(OpKind::qkv).flops_per_token, 2 * h * (q + 2 * kv));
  EXPECT_DOUBLE_EQ(op(OpKind::qkv).params, h * (q + 2 * kv));
  EXPECT_DOUBLE_EQ(op(OpKind::attention).flops_per_token, 4 * s * q);
  EXPECT_DOUBLE_EQ(op(OpKind::attention).saved_tensor_elems_per_token, q + 2 * kv);
  EXPECT_DOUBLE_EQ(op(OpKind::out_proj).flops_per_token, 2 * q * h);
  EXPECT_DOUBLE_EQ(op(OpKind::out_proj).params, q * h);
  EXPECT_DOUBLE_EQ(op(OpKind::out_proj).saved_tensor_elems_per_token, q);
  // Forward FLOPs per token: 40 (2h(q + 2kv) + 4sq + 2qh + 6hf) + 2hV counting full attention,
  // 2sq for the causal half.
  EXPECT_DOUBLE_EQ(g.forward_flops_per_token_full_attention(),
                   40 * (2 * h * (q + 2 * kv) + 4 * s * q + 2 * q * h + 6 * h * f) + 2 * h * V);
  EXPECT_DOUBLE_EQ(g.forward_flops_per_token(),
                   40 * (2 * h * (q + 2 * kv) + 2 * s * q + 2 * q * h + 6 * h * f) + 2 * h * V);
  // Stored activations (flash attention, selective, no SP, tp 1, b 1): norm, QKV and MLP inputs
  // 4h, Q K V and the attention output q + 2kv + q, SwiGLU's gate, up and activation output 3f,
  // 16-bit (Mistral-NeMo trains without dropout: no 1-byte masks).
  Strategy st;
  st.dp = 1;
  st.global_batch = 1;
  st.seq_len = 4096;
  st.recompute = Recompute::none;
  st.attention = Attention::flash;
  st.dtype = Dtype::bf16;
  EXPECT_DOUBLE_EQ(stored_layer_activation_bytes(g, st), s * (2 * (4 * h + 2 * q + 2 * kv + 3 * f)));
}

// Megatron's TP layout (and exec's): column- and row-parallel weights and the vocabulary-parallel
// embedding are split over tp, the row-parallel biases (attention output, MLP down), the learned
// position table and the norms are replicated. GPT with h 64, 4 heads, f 256, V 256, s 64, tp 2:
//   per layer  norms 2 x 128 = 256 (whole); QKV (64 x 192 + 192) / 2 = 6240; output 64 x 64 / 2 +
//              64 = 2112; MLP up (64 x 256 + 256) / 2 = 8320; down 256 x 64 / 2 + 64 = 8256
//              -> 25,184 of the layer's 49,984 (not 24,992 = 49,984 / 2);
//   embedding  256 x 64 / 2 + 64 x 64 = 12,288.
TEST(LayerGraph, ReplicatedParametersAreNotSplitByTp) {
  const LayerGraph g(gpt(2, 64, 4, 64, 256), 64);
  EXPECT_DOUBLE_EQ(g.params_per_layer(), 49984.0);
  EXPECT_DOUBLE_EQ(g.params_per_layer_per_rank(2), 25184.0);
  EXPECT_DOUBLE_EQ(g.params_per_layer_per_rank(1), g.params_per_layer());
  EXPECT_DOUBLE_EQ(rank_params(g.pre_ops()[0], 2), 12288.0);
  // A Llama-style layer (no biases, RoPE) replicates only its norms.
  ModelSpec llama = gpt(2, 64, 4, 64, 256);
  llama.norm = Norm::rmsnorm;
  llama.position = Position::rope;
  const LayerGraph lg(llama, 64);
  EXPECT_DOUBLE_EQ(lg.params_per_layer_per_rank(2), (lg.params_per_layer() - 128) / 2 + 128);
  EXPECT_DOUBLE_EQ(rank_params(lg.pre_ops()[0], 2), 256 * 64 / 2.0);
  // predict holds these per rank: the stage's weights at tp 2 (bf16, ZeRO 0, one stage) are
  // 2 bytes x (2 layers x 25,184 + embedding 12,288 + final norm 128).
  Strategy s;
  s.tp = 2;
  s.dp = 1;
  s.global_batch = 1;
  s.seq_len = 64;
  const Estimate e = predict(g, testing::builtin_cluster("dgx-h100"), s);
  ASSERT_EQ(e.per_stage.size(), 1u);
  EXPECT_DOUBLE_EQ(e.per_stage[0].weights, 2.0 * (2 * 25184 + 12288 + 128));
}

}  // namespace
}  // namespace trainplan
