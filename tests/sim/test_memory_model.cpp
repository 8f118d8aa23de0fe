// memory_model: hand-worked values of each formula, and that predict and search's bounds read them.
#include <gtest/gtest.h>

#include "sim/memory_model.hpp"
#include "sim/predict.hpp"
#include "sim/schedule.hpp"
#include "sim/search.hpp"
#include "sim/software.hpp"
#include "test_helpers.hpp"
#include "default_software.hpp"

namespace trainplan {
namespace {

using testing::gpt;

TEST(MemoryModel, StateBytesPerParameter) {
  const StateBytes mixed = state_bytes(Dtype::bf16, false);
  EXPECT_EQ(mixed.weight, 2);
  EXPECT_EQ(mixed.grad, 2);
  EXPECT_EQ(mixed.optimizer, 12);
  EXPECT_EQ(state_bytes(Dtype::bf16, true).grad, 4);
  const StateBytes fp32 = state_bytes(Dtype::fp32, false);
  EXPECT_EQ(fp32.weight + fp32.grad + fp32.optimizer, 16);
  EXPECT_EQ(fp32.optimizer, 8);
}

TEST(MemoryModel, ZeroShardingWorkedExample) {
  // Rajbhandari et al. 2020, Sec. 3 / Fig. 1: Psi = 7.5B, N_d = 64, K = 12.
  //   ZeRO 0: (2 + 2 + 12) Psi = 120 GB;  1: 4 Psi + 12 Psi / 64 = 31.40625 GB;
  //   2: 2 Psi + 14 Psi / 64 = 16.640625 GB;  3: 16 Psi / 64 = 1.875 GB.
  const StateBytes b = state_bytes(Dtype::bf16, false);
  const double psi = 7.5e9;
  const double expect[] = {120e9, 31.40625e9, 16.640625e9, 1.875e9};
  for (int zero = 0; zero <= 3; ++zero) {
    EXPECT_DOUBLE_EQ(model_state_bytes(psi, b, zero, 64).total(), expect[zero]) << "ZeRO " << zero;
  }
  const ModelStateBytes z2 = model_state_bytes(psi, b, 2, 64);
  EXPECT_DOUBLE_EQ(z2.weights, 15e9);
  EXPECT_DOUBLE_EQ(z2.gradients, 2 * psi / 64);
  EXPECT_DOUBLE_EQ(z2.optimizer, 12 * psi / 64);
}

TEST(MemoryModel, InFlightChunksPerSchedule) {
  // 1F1B, 4 stages, 8 micro-batches: stage i holds p - i = 4, 3, 2, 1.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(in_flight_chunks(ScheduleKind::one_f_one_b, 4, i, 8, 1), 4 - i);
  // Fewer micro-batches than stages: capped at m.
  EXPECT_EQ(in_flight_chunks(ScheduleKind::one_f_one_b, 4, 0, 2, 1), 2);
  EXPECT_EQ(in_flight_chunks(ScheduleKind::gpipe, 4, 3, 8, 1), 8);
  // Interleaved, p = 4, v = 2, m = 8: stage 0 warms up (4-0-1) x 2 + (2-1) x 4 = 10 forwards, holds 11;
  // stage 3: 0 + 4 = 4, holds 5.
  EXPECT_EQ(in_flight_chunks(ScheduleKind::interleaved, 4, 0, 8, 2), 11);
  EXPECT_EQ(in_flight_chunks(ScheduleKind::interleaved, 4, 3, 8, 2), 5);
  // 2^30 micro-batches x v 2 is past an int: the same warm-up, not a wrapped (negative) count.
  EXPECT_EQ(in_flight_chunks(ScheduleKind::interleaved, 2, 0, 1 << 30, 2), 5);
  // And the closed form is the schedule's own count.
  for (ScheduleKind k : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved}) {
    const int v = k == ScheduleKind::interleaved ? 2 : 1;
    const Schedule sched = make_schedule(k, 4, 8, v);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(in_flight_chunks(k, 4, i, 8, v), sched.peak_in_flight(i));
  }
}

Strategy plain(int tp, bool sp, Recompute r, Attention a) {
  Strategy s;
  s.tp = tp;
  s.micro_batch = 1;
  s.global_batch = 8;
  s.seq_len = 2048;
  s.sequence_parallel = sp;
  s.recompute = r;
  s.attention = a;
  return s;
}

TEST(MemoryModel, LayerActivationsAreKorthikantisTable2) {
  // GPT layer, s = 2048, b = 1, h = 1024, a = 16, 16-bit: s b h (34 + 5 a s / h) bytes without
  // parallelism (Korthikanti et al. 2022, Eq. 1); with TP and SP everything divides by t (Eq. 5);
  // full recomputation keeps the layer input only: 2 s b h / t bytes with SP.
  const LayerGraph g(gpt(4, 1024, 16), 2048);
  const double sbh = 2048.0 * 1024;
  const double none = sbh * (34 + 5.0 * 16 * 2048 / 1024);
  EXPECT_DOUBLE_EQ(stored_layer_activation_bytes(g, plain(1, false, Recompute::none, Attention::standard)), none);
  EXPECT_DOUBLE_EQ(stored_layer_activation_bytes(g, plain(4, true, Recompute::none, Attention::standard)), none / 4);
  // Selective recomputation (or flash attention) drops the 5as/h score terms: 34 s b h.
  EXPECT_DOUBLE_EQ(stored_layer_activation_bytes(g, plain(1, false, Recompute::selective, Attention::standard)), 34 * sbh);
  EXPECT_DOUBLE_EQ(stored_layer_activation_bytes(g, plain(1, false, Recompute::none, Attention::flash)), 34 * sbh);
  EXPECT_DOUBLE_EQ(stored_layer_activation_bytes(g, plain(4, true, Recompute::full, Attention::standard)), 2 * sbh / 4);
  // The working layer of full recomputation keeps everything, scores included.
  EXPECT_DOUBLE_EQ(layer_activation_bytes(g, plain(1, false, Recompute::full, Attention::standard), true), none);
}

// A recipe without dropout (Llama-style) keeps no 1-byte masks and no dropped-out copy of the
// scores: 32 s b h with flash attention, s b h (32 + 2 a s / h) with materialised scores (the
// softmax output only), even on a stack that saves masks where there is dropout.
TEST(MemoryModel, LayerActivationsWithoutDropoutKeepNoMasks) {
  ModelSpec m = gpt(4, 1024, 16);
  m.dropout = 0;
  const LayerGraph g(m, 2048);
  const double sbh = 2048.0 * 1024;
  EXPECT_DOUBLE_EQ(stored_layer_activation_bytes(g, plain(1, false, Recompute::none, Attention::flash)), 32 * sbh);
  EXPECT_DOUBLE_EQ(stored_layer_activation_bytes(g, plain(1, false, Recompute::none, Attention::standard)),
                   sbh * (32 + 2.0 * 16 * 2048 / 1024));
  // The embedding's mask goes too: stage 0 holds nothing for the embedding.
  Strategy s = plain(1, false, Recompute::none, Attention::flash);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  const Software sw = load_software("megatron-core", TRAINPLAN_SOURCE_DIR);
  EXPECT_TRUE(sw.memory.dropout_masks);
  EXPECT_EQ(stage_activation_parts(memory_model(g, c, sw, s), 0, 4).embedding, 0);
  EXPECT_GT(stage_activation_parts(memory_model(LayerGraph(gpt(4, 1024, 16), 2048), c, sw, s), 0, 4).embedding, 0);
}

TEST(MemoryModel, StageActivationsAddTheEndStageExtras) {
  MemoryModel mm;
  mm.pp = 2;
  mm.vp = 1;
  mm.micro_batches = 4;
  mm.schedule = ScheduleKind::one_f_one_b;
  mm.stored_layer[0] = 100;
  mm.tokens = 10;
  mm.hidden = 4;
  mm.vocab = 50;
  mm.bytes.activation = 2;
  // Stage 0, 3 layers: 2 in flight x 3 x 100 = 600, + embedding dropout masks 2 x 10 x 4 x 1 B = 80.
  EXPECT_DOUBLE_EQ(stage_activation_bytes(mm, 0, 3), 680);
  // Stage 1: 1 in flight x 3 x 100 = 300, + fp32 logits 10 x 50 x 4 = 2000, + final norm input
  // 10 x 4 x 2 (stream) = 80, + head input 10 x 4 x 2 = 80.
  EXPECT_DOUBLE_EQ(stage_activation_bytes(mm, 1, 3), 2460);
  mm.working_layer = 7;
  EXPECT_DOUBLE_EQ(stage_activation_bytes(mm, 1, 3), 2467);
  // A stack without dropout masks, an fp32 stream and 12 B per logit at the loss's peak:
  // stage 0 600 + 7; stage 1 300 + 7 + 10 x 50 x 12 = 6000 + 10 x 4 x (4 + 2) = 240.
  mm.dropout_masks = false;
  mm.bytes.stream = 4;
  mm.bytes.logit = 12;
  EXPECT_DOUBLE_EQ(stage_activation_bytes(mm, 0, 3), 607);
  EXPECT_DOUBLE_EQ(stage_activation_bytes(mm, 1, 3), 6547);
}

// A stack that gathers the logits over TP for its loss (Software::parallel.loss_on_gathered_logits)
// holds all vocab rows on the last stage, not vocab / tp.
TEST(MemoryModel, GatheredLogitsHoldTheWholeVocabulary) {
  MemoryModel mm;
  mm.pp = 1;
  mm.vp = 1;
  mm.micro_batches = 1;
  mm.tokens = 10;
  mm.hidden = 4;
  mm.vocab = 50;
  mm.tp = 2;
  mm.dropout_masks = false;
  // 10 tokens x 25 rows x 4 B of fp32 logits + 10 x 4 x (2 + 2) of norm and head inputs.
  EXPECT_DOUBLE_EQ(stage_activation_parts(mm, 0, 0).head, 1000 + 160);
  mm.loss_on_gathered_logits = true;
  EXPECT_DOUBLE_EQ(stage_activation_parts(mm, 0, 0).head, 2000 + 160);
}

TEST(MemoryModel, PredictStagesAreTheMemoryModels) {
  const ModelSpec m = gpt(8, 2048, 16);
  const LayerGraph g(m, 2048);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s;
  s.dp = 2, s.tp = 2, s.pp = 2, s.zero = 3, s.micro_batch = 1, s.global_batch = 16, s.seq_len = 2048;
  s.sequence_parallel = true;
  const Estimate e = predict(g, c, Software{}, s);
  ASSERT_TRUE(e.feasible);
  const MemoryModel mm = memory_model(g, c, s);
  const StepCosts costs = step_costs(g, c, Software{}, s);
  for (int i = 0; i < s.pp; ++i) {
    double params = 0;
    for (const ChunkCost& ch : costs.chunks) if (ch.stage == i) params += ch.params;
    const StageMemory want = stage_memory(mm, i, params, e.stage_layers[i]);
    EXPECT_EQ(e.per_stage[i].weights, want.weights);
    EXPECT_EQ(e.per_stage[i].activations, want.activations);
    EXPECT_EQ(e.per_stage[i].other, want.other);
  }
  // ZeRO-3's gathered units in bf16 (2 B per parameter). A rank's layer: the tp-split weights and
  // column-parallel biases / 2, plus the replicated two LayerNorms (4h) and row-parallel biases
  // (2h) whole: (params - 6h) / 2 + 6h. The embedding: the vocabulary-split table V h / 2 and the
  // learned positions (seq x h) whole; the head: the final LayerNorm (2h) and, tied over two
  // stages, the last stage's own copy of the table.
  const double h = m.hidden, table = m.vocab * h / 2;
  const double layer = ((g.params_per_layer() - 6 * h) / 2 + 6 * h) * 2;
  EXPECT_DOUBLE_EQ(mm.gathered_layer, layer);
  EXPECT_DOUBLE_EQ(mm.gathered_embedding, (table + 2048 * h) * 2);
  EXPECT_DOUBLE_EQ(mm.gathered_head, (2 * h + table) * 2);
  EXPECT_FALSE(mm.head_reads_embedding);
  // The 51200-word table outweighs a layer: stage 0 peaks at the embedding and the first layer in
  // flight together, stage 1 at the head and the last layer (not at two layers).
  ASSERT_GT(mm.gathered_embedding, layer);
  ASSERT_GT(mm.gathered_head, layer);
  EXPECT_DOUBLE_EQ(e.per_stage[0].other, mm.gathered_embedding + layer);
  EXPECT_DOUBLE_EQ(e.per_stage[1].other, mm.gathered_head + layer);
  EXPECT_DOUBLE_EQ(mm.runtime, c.runtime_overhead);
  EXPECT_DOUBLE_EQ(e.per_stage[0].runtime, c.runtime_overhead);
}

// A stack profile (software/*.json "memory") as trainplan exec runs: autocast over fp32 parameters.
Software exec_like() {
  Software sw;
  sw.stream_bytes = 4;
  sw.autocast_casts_inputs = true;
  sw.qkv_fused = false;
  sw.gate_up_fused = false;
  sw.memory = {.fp32_parameters = true, .optimizer_extra_bytes = 4, .weight_copy_bytes = 2, .optimizer_temp_bytes = 8,
               .dropout_masks = false, .rms_norm_saved_stream_tensors = 2, .attention_output_copies = 1,
               .kv_expanded_saved = true, .rope_saved_copies = false, .activation_output_saved = true,
               .loss_bytes_per_logit = 12};
  return sw;
}

TEST(MemoryModel, ProfileLayerActivationsCountWhatTheStackSaves) {
  // GPT (LayerNorm, GeLU, f = 4h), flash, per token: two norm inputs in fp32 (2 x 4h), three bf16
  // casts for separate Q, K, V (3 x 2h), one for the up projection (2h), Q K V (3 x 2h), the
  // attention output and its copy (2 x 2h), GeLU input (2f) and output (2f): 42h bytes.
  const double h = 256;
  Strategy s;
  s.micro_batch = 2;
  s.global_batch = 2;
  s.seq_len = 128;
  const double tokens = 2 * 128;
  const LayerGraph g(gpt(2, 256, 4), 128);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(g, exec_like(), s, false), 42 * h * tokens);
  // Llama shape (RMSNorm written out, SwiGLU, f = 4h, kv = h/4): norms 2 x 2 x 4h, casts 3 x 2h and
  // 2 x 2h, Q and K, V expanded to h (3 x 2h), output and copy (2 x 2h), gate, up, silu output and
  // product (4 x 2f): 68h bytes.
  ModelSpec l = gpt(2, 256, 4);
  l.norm = Norm::rmsnorm;
  l.activation = Activation::swiglu;
  l.position = Position::rope;
  l.kv_heads = 1;
  const LayerGraph gl(l, 128);
  EXPECT_DOUBLE_EQ(layer_activation_bytes(gl, exec_like(), s, false), 68 * h * tokens);
  // Under full recomputation only the fp32 layer input stays.
  s.recompute = Recompute::full;
  EXPECT_DOUBLE_EQ(stored_layer_activation_bytes(gl, exec_like(), s), 4 * h * tokens);
}

// What trainplan exec's loss holds (software memory keys loss_chunk_bytes, loss_bytes_per_logit,
// loss_bytes_per_head_param, loss_input_bytes, loss_compute_dtype_copies), the final RMSNorm's two
// stream tensors, and 16-bit copies of the layers' weights only (weight_copies_layers_only),
// hand-worked on one stage: 256 tokens (2 x 128), hidden 256, a tied vocabulary of 1024 rows.
TEST(MemoryModel, ChunkedLossAndCopiesOfTheLayersOnly) {
  ModelSpec m = gpt(2, 256, 4, 128, 1024);
  m.norm = Norm::rmsnorm;
  const LayerGraph g(m, 128);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Software sw = exec_like();
  sw.memory.loss_bytes_per_logit = 4;
  sw.memory.loss_chunk_bytes = 4.0 * 1024 * 100;  // the fp32 logits of 100 tokens
  sw.memory.loss_bytes_per_head_param = 4;
  sw.memory.loss_input_bytes = 8;
  sw.memory.loss_compute_dtype_copies = true;
  sw.memory.weight_copies_layers_only = true;
  Strategy s;
  s.micro_batch = 2, s.global_batch = 2, s.seq_len = 128, s.dtype = Dtype::bf16;
  const MemoryModel mm = memory_model(g, c, sw, s);
  EXPECT_DOUBLE_EQ(mm.loss_chunk_tokens, 100);
  EXPECT_DOUBLE_EQ(mm.lm_head_params, 1024 * 256);
  // Logits of one chunk 100 x 1024 x (4 + 2), the head's weights 1024 x 256 x (4 + 2), and per
  // token x hidden the final norm's 2 x 4 B and the loss's input 8 + 2 B: 256 x 256 x 18.
  const double head = 100 * 1024 * 6.0 + 1024 * 256 * 6.0 + 256 * 256 * 18.0;
  EXPECT_DOUBLE_EQ(stage_activation_parts(mm, 0, 2).head, head);
  // In fp32 the 16-bit copies are the tensors themselves; the activations are 4 B wide.
  s.dtype = Dtype::fp32;
  EXPECT_DOUBLE_EQ(stage_activation_parts(memory_model(g, c, sw, s), 0, 2).head,
                   100 * 1024 * 4.0 + 1024 * 256 * 4.0 + 256 * 256 * 16.0);
  // A chunk larger than the micro-batch holds all of it.
  sw.memory.loss_chunk_bytes = 1e12;
  s.dtype = Dtype::bf16;
  EXPECT_DOUBLE_EQ(stage_activation_parts(memory_model(g, c, sw, s), 0, 2).head, head + 156 * 1024 * 6.0);
  // Copies: the two layers' parameters at 2 B, not the embedding (token and position tables) nor
  // the final norm; a stack copying every parameter copies those too.
  const Estimate e = predict(g, c, sw, s);
  const double layers = 2 * g.params_per_layer_per_rank(1);
  EXPECT_DOUBLE_EQ(e.per_stage.at(0).weight_copies, 2 * layers);
  sw.memory.weight_copies_layers_only = false;
  const double all = predict(g, c, sw, s).per_stage.at(0).weight_copies;
  EXPECT_DOUBLE_EQ(all, 2 * (layers + (1024 + 128) * 256.0 + 256));
}

// ZeRO-3's gathered units per stage (hand-worked): the largest pair of consecutive units of a chunk.
TEST(MemoryModel, Zero3GatheredUnitsPerStage) {
  MemoryModel mm;
  mm.pp = 3;
  mm.gathered_layer = 10;
  mm.gathered_embedding = 25;
  mm.gathered_head = 7;
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 0, 2), 35);  // embedding + layer 25 + 10 > two layers 20
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 1, 2), 20);  // two layers
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 1, 1), 10);  // one layer: never two at once
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 2, 2), 20);  // two layers 20 > head + layer 17
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 2, 1), 17);  // head + layer
  mm.gathered_head = 40;                                 // a large vocabulary's head
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 2, 4), 50);
  // Interleaved (vp 2): two layers over two chunks are one per chunk, three put two in one chunk.
  mm.vp = 2;
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 1, 2), 10);
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 1, 3), 20);
  // One stage with a tied head: its backward starts with the head, the embedding it reads and the
  // prefetched last layer in flight: 40 + 25 + 10.
  mm.pp = 1;
  mm.vp = 1;
  mm.head_reads_embedding = true;
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 0, 2), 75);
  mm.gathered_layer = mm.gathered_embedding = mm.gathered_head = 0;  // no ZeRO-3
  EXPECT_DOUBLE_EQ(zero3_gathered_bytes(mm, 0, 2), 0);
}

// ZeRO-3 gathers in the compute dtype: 2 B per parameter under bf16 even where the stack keeps
// fp32 parameters (4 B master weights), 4 B in fp32 training; nothing without ZeRO-3.
TEST(MemoryModel, Zero3GathersInTheComputeDtype) {
  const ModelSpec m = gpt(4, 256, 4, 128, 1000);
  const LayerGraph g(m, 128);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s;
  s.dp = 2, s.zero = 3, s.micro_batch = 1, s.global_batch = 2, s.seq_len = 128, s.dtype = Dtype::bf16;
  const double layer = g.params_per_layer_per_rank(1);
  const MemoryModel bf16 = memory_model(g, c, exec_like(), s);
  EXPECT_EQ(bf16.bytes.state.weight, 4);  // the fp32 master weights
  EXPECT_DOUBLE_EQ(bf16.gathered_layer, 2 * layer);
  EXPECT_TRUE(bf16.head_reads_embedding);  // tied, one stage
  s.dtype = Dtype::fp32;
  EXPECT_DOUBLE_EQ(memory_model(g, c, exec_like(), s).gathered_layer, 4 * layer);
  s.zero = 2;
  EXPECT_DOUBLE_EQ(memory_model(g, c, exec_like(), s).gathered_layer, 0);
}

TEST(MemoryModel, PeakIsTheLargerOfBackwardAndOptimizerAndTheAllocatorScalesTensors) {
  Software sw = exec_like();
  sw.allocator.reserved_over_allocated = 1.25;
  sw.allocator.workspace = 1000;
  const LayerGraph g(gpt(2, 256, 4), 128);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  Strategy s;
  s.micro_batch = 1;
  s.global_batch = 1;
  s.seq_len = 128;
  const MemoryModel mm = memory_model(g, c, sw, s);
  EXPECT_EQ(mm.bytes.state.weight + mm.bytes.state.grad + mm.bytes.state.optimizer, 4 + 4 + 12);
  const double params = 1e8;
  // Few activations: the optimizer's 8 B/parameter of temporaries are the peak.
  const StageMemory opt = stage_memory(mm, 0, params, 1);
  const Bytes acts = stage_activation_bytes(mm, 0, 1);
  ASSERT_LT(acts, 8 * params);
  EXPECT_EQ(opt.activations, 0);
  EXPECT_DOUBLE_EQ(opt.temporaries, 8 * params);
  EXPECT_DOUBLE_EQ(opt.weight_copies, 2 * params);
  const double tensors = 22 * params + 8 * params;
  EXPECT_DOUBLE_EQ(opt.allocator, 0.25 * tensors);
  EXPECT_DOUBLE_EQ(opt.reserved(), 1.25 * tensors + 1000);
  EXPECT_DOUBLE_EQ(opt.total(), opt.reserved() + c.runtime_overhead);
  // Few parameters: the backward (activations) is the peak.
  const StageMemory bwd = stage_memory(mm, 0, 10, 1);
  EXPECT_EQ(bwd.temporaries, 0);
  EXPECT_DOUBLE_EQ(bwd.activations, acts);
}

TEST(MemoryModel, SearchMemoryBoundIsBuiltFromTheSameFunctions) {
  // One stage, 1F1B: search's memory floor is runtime + model states of all parameters / tp
  // (ZeRO-sharded over dp x cp) + layers x stored activations per layer, less a 1e-9 margin.
  const ModelSpec m = gpt(8, 2048, 16);
  const LayerGraph g(m, 2048);
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  for (int zero = 0; zero <= 3; ++zero) {
    Strategy s;
    s.dp = 4, s.tp = 2, s.zero = zero, s.micro_batch = 2, s.global_batch = 16, s.seq_len = 2048;
    const double expect = c.runtime_overhead +
                          model_state_bytes(g.total_params() / 2, state_bytes(s), zero, 4).total() +
                          m.layers * stored_layer_activation_bytes(g, s);
    const CandidateBounds b = candidate_bounds(g, c, s);
    EXPECT_NEAR(b.peak_memory, expect, 1e-8 * expect) << "ZeRO " << zero;
    EXPECT_LE(b.peak_memory, predict(g, c, Software{}, s).peak_memory);
  }
}

}  // namespace
}  // namespace trainplan
