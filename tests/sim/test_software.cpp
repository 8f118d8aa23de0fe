// Unit tests for sim/software: the shipped profiles load and say what they describe, units are
// converted at load, and a bad profile is rejected naming its field.
#include "sim/software.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "sim/json_reader.hpp"
#include "sim/layer_graph.hpp"
#include "sim/model_spec.hpp"
#include "sim/predict.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

using nlohmann::json;
using testing::input_error;
namespace fs = std::filesystem;
const fs::path kSource = TRAINPLAN_SOURCE_DIR;

TEST(Software, TheShippedProfilesLoad) {
  EXPECT_EQ(builtin_software(kSource),
            (std::vector<std::string>{"aleph-alpha-scaling", "aleph-alpha-scaling-rms", "deepspeed-zero3-2021", "llm-foundry",
                                      "megatron-core", "megatron-deepspeed", "megatron-lm-2021", "pytorch-eager",
                                      "trainplan-exec"}));
  for (const auto& name : builtin_software(kSource)) {
    SCOPED_TRACE(name);
    const Software s = load_software(name, kSource);
    EXPECT_EQ(s.name, name);
    EXPECT_GT(s.source.size(), 100u);
    EXPECT_GT(s.assumptions.size(), 100u);
    EXPECT_GT(s.host_per_kernel, 0);
    EXPECT_GT(s.mem.optimizer.passes_fwd, 0);
  }
  EXPECT_NO_THROW(load_software(kDefaultSoftware, kSource));
}

TEST(Software, ExecProfileDescribesWhatExecLaunches) {
  const Software e = load_software("trainplan-exec", kSource);
  EXPECT_EQ(e.describes_executor, "mem-3");  // exec/exec.hpp kExecutorFingerprint (test_exec_memory checks)
  EXPECT_TRUE(e.qkv_fused);                 // exec/model.cpp: attn.wqkv, one GEMM
  EXPECT_TRUE(e.gate_up_fused);             // mlp.wgu
  EXPECT_DOUBLE_EQ(e.stream_bytes, 4);      // fp32 residual stream under autocast
  EXPECT_NEAR(e.host_per_kernel, 23.3e-6, 1e-12);  // us converted to s
  EXPECT_EQ(e.mem.optimizer.kernel, MemKernel::adamw_fused);  // at::_fused_adamw_
  EXPECT_EQ(e.vocab_multiple, 128);         // padded_vocab(vocab, tp)
  EXPECT_DOUBLE_EQ(e.memory.loss_chunk_bytes, 1 << 30);  // exec's ModelSettings::loss_chunk_bytes
  EXPECT_TRUE(e.memory.weight_copies_layers_only);
  EXPECT_GT(e.mem.fused_split.passes_bwd, 0);  // q/k/v split, its gradients joined by one cat
  // --fused-kernels auto: RMSNorm as one kernel that saves its input alone, SwiGLU one that saves
  // only the fused gate/up output.
  EXPECT_EQ(e.memory.rms_norm_saved_stream_tensors, 1);
  EXPECT_FALSE(e.memory.activation_output_saved);
  EXPECT_EQ(e.mem.swiglu.kernels_fwd, 1);
  // The profile of the composite ops (mem-2), kept for the H200 rows measured with them.
  const Software mem2 = load_software((fs::path(TRAINPLAN_TEST_DATA_DIR) / "h200" / "trainplan-exec-mem-2.json").string(), kSource);
  EXPECT_EQ(mem2.describes_executor, "mem-2");
  EXPECT_EQ(mem2.memory.rms_norm_saved_stream_tensors, 2);  // x and x * rsqrt(...)
  // The profile of the executor measured on the H100 (commit e64f6de), kept for those rows.
  const Software old = load_software((fs::path(TRAINPLAN_TEST_DATA_DIR) / "h100" / "trainplan-exec-e64f6de.json").string(), kSource);
  EXPECT_EQ(old.describes_executor, "mem-1");
  EXPECT_FALSE(old.qkv_fused);              // separate wq, wk, wv then
  EXPECT_EQ(old.mem.optimizer.kernel, MemKernel::add);  // unfused AdamW
  EXPECT_EQ(old.vocab_multiple, 1);         // before exec padded the vocabulary
  EXPECT_DOUBLE_EQ(old.memory.loss_chunk_bytes, 0);  // the whole micro-batch's logits
  const Software m = load_software("megatron-core", kSource);
  EXPECT_EQ(m.vocab_multiple, 128);         // --make-vocab-size-divisible-by 128
  EXPECT_EQ(vocab_rows(m, 50257, 1), 50304);
  EXPECT_EQ(vocab_rows(m, 50257, 8), 51200);
  EXPECT_EQ(vocab_rows(load_software("pytorch-eager", kSource), 50257, 1), 50257);
  EXPECT_TRUE(m.qkv_fused);
  EXPECT_TRUE(m.wgrad_accumulate_fused);
  EXPECT_EQ(m.mem.optimizer.kernel, MemKernel::adamw_fused);
}

TEST(Software, LlmFoundryIsPytorchEagerWithFlashAttention2) {
  // The llm-foundry profile differs from pytorch-eager only in its attention kernel: on H100 its
  // attention takes FlashAttention-2's published time, so a long-sequence step is slower; on A100,
  // which has no FlashAttention-2 table (the calibrated table stands for it), the two agree.
  const Software eager = load_software("pytorch-eager", kSource), foundry = load_software("llm-foundry", kSource);
  EXPECT_EQ(eager.attention_kernel, "calibrated");
  EXPECT_EQ(foundry.attention_kernel, "flash2");
  const ModelSpec m = load_model("llama3-8b", kSource);
  const LayerGraph g(m, 16384);
  Strategy s;
  s.dp = 8;
  s.global_batch = 8;
  s.seq_len = 16384;
  s.recompute = Recompute::full;
  s.zero = 3;
  const Cluster h100 = testing::builtin_cluster("dgx-h100"), a100 = testing::builtin_cluster("dgx-a100-80g");
  EXPECT_GT(predict(g, h100, foundry, s).time.step, 1.1 * predict(g, h100, eager, s).time.step);
  EXPECT_DOUBLE_EQ(predict(g, a100, foundry, s).time.step, predict(g, a100, eager, s).time.step);
}

// The optional zero3 section: absent, no cap and no regather; DeepSpeed of 2021 states both.
TEST(Software, ZeroThreeImplementationIsOptional) {
  const Software core = load_software("megatron-core", kSource);
  EXPECT_EQ(core.zero3.max_bus_bandwidth, 0);
  EXPECT_FALSE(core.zero3.regathers_for_recompute);
  const Software ds = load_software("deepspeed-zero3-2021", kSource);
  EXPECT_NEAR(ds.zero3.max_bus_bandwidth, 21.3e9, 1);  // GB/s converted to B/s
  EXPECT_TRUE(ds.zero3.regathers_for_recompute);
  json j = read_json_file(kSource / "software" / "deepspeed-zero3-2021.json");
  j["zero3"]["max_bus_gbps"] = -1;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: zero3.max_bus_gbps = -1, must be in [0, 1e+06]");
  j = read_json_file(kSource / "software" / "deepspeed-zero3-2021.json");
  j["zero3"]["prefetch"] = 2;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: zero3.prefetch is not a known key");
}

// The optional parallelism section: absent, every field keeps Megatron-core's way; Aleph Alpha's
// scaling states all five, and each field is read strictly.
TEST(Software, ParallelismSectionIsOptionalAndStrict) {
  const Software core = load_software("megatron-core", kSource);
  EXPECT_FALSE(core.parallel.tp_reduce_per_linear);
  EXPECT_FALSE(core.parallel.loss_on_gathered_logits);
  EXPECT_EQ(core.parallel.dp_all_reduce_bytes, 0);
  EXPECT_FALSE(core.parallel.pipeline_uniform_modules);
  EXPECT_TRUE(core.parallel.pipeline_send_scatter_gather);
  const Software aa = load_software("aleph-alpha-scaling", kSource);
  EXPECT_TRUE(aa.parallel.tp_reduce_per_linear);
  EXPECT_TRUE(aa.parallel.loss_on_gathered_logits);
  EXPECT_EQ(aa.parallel.dp_all_reduce_bytes, 4);
  EXPECT_TRUE(aa.parallel.pipeline_uniform_modules);
  EXPECT_FALSE(aa.parallel.pipeline_send_scatter_gather);
  const json base = read_json_file(kSource / "software" / "aleph-alpha-scaling.json");
  json j = base;
  j["parallelism"]["dp_all_reduce_bytes"] = 0;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: parallelism.dp_all_reduce_bytes = 0, must be in [1, 8]");
  j = base;
  j["parallelism"]["loss"] = "fused";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }).rfind("s.json: parallelism.loss = \"fused\"", 0), 0u);
  j = base;
  j["parallelism"]["bucket_elements"] = 5e8;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: parallelism.bucket_elements is not a known key");
  j = base;
  j["parallelism"]["pipeline_send"] = "scatter";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }).rfind("s.json: parallelism.pipeline_send = \"scatter\"", 0), 0u);
  j = base;
  j["parallelism"].erase("pipeline_send");
  EXPECT_NE(input_error([&] { parse_software(j, "s.json"); }).find("parallelism.pipeline_send"), std::string::npos);
  j = base;
  j["parallelism"].erase("source");
  EXPECT_NE(input_error([&] { parse_software(j, "s.json"); }).find("parallelism.source"), std::string::npos);
}

TEST(Software, BadProfilesNameTheField) {
  const fs::path p = kSource / "software" / "megatron-core.json";
  json j = read_json_file(p);
  j["memory_bound"]["gelu"]["kernel"] = "fused_gelu";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: memory_bound.gelu.kernel = \"fused_gelu\", must be a measured kernel family (layer_norm, rms_norm, "
            "gelu, swiglu, add, cross_entropy_fp32, adamw_fused, adamw_foreach)");
  j = read_json_file(p);
  j["overlap"]["dp"] = 1.5;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: overlap.dp = 1.5, must be in [0, 1]");
  j = read_json_file(p);
  j["attention"]["default"] = "sdpa";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: attention.default = \"sdpa\", must be one of flash|standard");
  j = read_json_file(p);
  j["overlap"]["tp_backward"] = -0.5;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: overlap.tp_backward = -0.5, must be in [0, 1]");
  j = read_json_file(p);
  j["host"]["source"] = 3;
  EXPECT_NE(input_error([&] { parse_software(j, "s.json"); }).find("host.source"), std::string::npos);
  j = read_json_file(p);
  j["memory_bound"].erase("rope");
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: memory_bound.rope is missing (required key)");
  j = read_json_file(p);
  j["gemm"]["vocab_padding_multiple"] = 0;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: gemm.vocab_padding_multiple = 0, must be in [1, 1048576]");
  j = read_json_file(p);
  j["host"]["threads"] = 2;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: host.threads is not a known key");
  j = read_json_file(p);
  j["schema"] = "trainplan/software/v0";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: schema = \"trainplan/software/v0\", must be \"trainplan/software/v1\"");
  EXPECT_EQ(input_error([&] { load_software("tensorflow", kSource); }),
            "--software tensorflow: not a built-in software profile (one of: aleph-alpha-scaling, aleph-alpha-scaling-rms, "
            "deepspeed-zero3-2021, llm-foundry, megatron-core, megatron-deepspeed, megatron-lm-2021, pytorch-eager, "
            "trainplan-exec) and not a file");
  j = read_json_file(p);
  j["attention"]["kernel"] = "flash 2";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: attention.kernel = \"flash 2\", must be a kernel name of 1-64 letters, digits, '-', '_' or '.' "
            "(\"calibrated\": the cluster's measured attention table)");
}

// The MoE launch and dispatch keys: each bad value is refused by name with its rule.
TEST(Software, BadMoeLaunchKeysNameTheField) {
  const fs::path p = kSource / "software" / "megatron-core.json";
  json j = read_json_file(p);
  j["moe"]["grouped_gemm"] = "per_group";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: moe.grouped_gemm = \"per_group\", must be one of one_kernel|per_expert");
  j = read_json_file(p);
  j["moe"]["grouped_gemm"] = "one_kernel";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: moe.host_per_expert_gemm_us = 60, needs \"grouped_gemm\": \"per_expert\" (it is host time per "
            "expert GEMM)");
  j = read_json_file(p);
  j["moe"]["host_per_expert_gemm_us"] = -1;
  EXPECT_NE(input_error([&] { parse_software(j, "s.json"); }).find("moe.host_per_expert_gemm_us = -1, must be in [0,"),
            std::string::npos);
  j = read_json_file(p);
  j["moe"]["dropless_dispatch_syncs"] = "yes";
  EXPECT_NE(input_error([&] { parse_software(j, "s.json"); }).find("moe.dropless_dispatch_syncs"), std::string::npos);
  j = read_json_file(p);
  j["moe"]["dispatcher"] = "deepep";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: moe.dispatcher = \"deepep\", must be one of alltoall|allgather|flex");
  j = read_json_file(p);
  j["gemm"]["fp8_quantize_kernels"] = 0;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: gemm.fp8_quantize_kernels = 0, must be in [1, 100]");
  // Absent, a profile launches one grouped kernel, waits for nothing and quantizes in one kernel.
  j = read_json_file(p);
  j["moe"].erase("grouped_gemm");
  j["moe"].erase("host_per_expert_gemm_us");
  j["moe"].erase("dropless_dispatch_syncs");
  j["gemm"].erase("fp8_quantize_kernels");
  j["moe"].erase("dispatcher");
  EXPECT_EQ(parse_software(read_json_file(p), "s.json").moe.dispatcher, Dispatcher::flex);
  const Software plain = parse_software(j, "s.json");
  EXPECT_EQ(plain.moe.dispatcher, Dispatcher::alltoall);
  EXPECT_FALSE(plain.moe.gemm_per_expert);
  EXPECT_FALSE(plain.moe.dropless_dispatch_syncs);
  EXPECT_EQ(plain.moe.host_per_expert_gemm, 0);
  EXPECT_EQ(plain.fp8_quantize_kernels, 1);
}

// The optional keys: absent, a stack keeps none of what they describe; present, they are read and
// checked like any other.
TEST(Software, OptionalMemoryKeys) {
  const fs::path p = kSource / "software" / "megatron-core.json";
  json j = read_json_file(p);
  const Software m = parse_software(j, "s.json");
  EXPECT_EQ(m.describes_executor, "");
  EXPECT_DOUBLE_EQ(m.memory.loss_chunk_bytes, 0);
  EXPECT_DOUBLE_EQ(m.memory.loss_bytes_per_head_param, 0);
  EXPECT_FALSE(m.memory.loss_compute_dtype_copies);
  EXPECT_FALSE(m.memory.weight_copies_layers_only);
  EXPECT_EQ(m.mem.fused_split.kernels_bwd, 0);
  j["describes_executor"] = "mem 2";
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: describes_executor = \"mem 2\", must be 1-64 printable characters without spaces");
  j = read_json_file(p);
  j["memory"]["loss_chunk_bytes"] = -1;
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: memory.loss_chunk_bytes = -1, must be in [0, 1e+15]");
  j = read_json_file(p);
  j["memory"]["weight_copies_layers_only"] = 1;
  EXPECT_NE(input_error([&] { parse_software(j, "s.json"); }).find("memory.weight_copies_layers_only"), std::string::npos);
  j = read_json_file(p);
  j["memory_bound"]["fused_split"] = {{"kernel", "add"}, {"passes_fwd", 0}, {"passes_bwd", 1.2}, {"kernels_fwd", 0}};
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }),
            "s.json: memory_bound.fused_split.kernels_bwd is missing (required key)");
}

// A clamped gated activation's clamps and the experts' output biases: stated by megatron-core (as
// its code runs them), plain PyTorch's where a profile leaves them out, checked like any op.
TEST(Software, ClampAndExpertBiasOps) {
  const fs::path p = kSource / "software" / "megatron-core.json";
  json j = read_json_file(p);
  const Software m = parse_software(j, "s.json");
  EXPECT_EQ(m.mem.glu_clamp.kernels_fwd, 3);
  EXPECT_DOUBLE_EQ(m.moe.expert_bias.passes_bwd, 2.67);
  j["memory_bound"].erase("glu_clamp");
  j["moe"].erase("expert_bias");
  const Software plain = parse_software(j, "s.json");
  EXPECT_EQ(plain.mem.glu_clamp.kernels_fwd, 2);
  EXPECT_DOUBLE_EQ(plain.mem.glu_clamp.passes_fwd, 0.67);
  EXPECT_EQ(plain.moe.expert_bias.kernels_bwd, 1);
  j["moe"]["expert_bias"] = {{"kernel", "add"}, {"passes_fwd", -1}, {"passes_bwd", 1}, {"kernels_fwd", 1}, {"kernels_bwd", 1}};
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }), "s.json: moe.expert_bias.passes_fwd = -1, must be in [0, 1000]");
}

// RoPE where the model scales cos and sin: megatron-core states its unfused rotation; a profile
// that leaves it out folds the factor into its tables (rope_scaled absent: the plain rope's cost).
TEST(Software, ScaledRopeOp) {
  json j = read_json_file(kSource / "software" / "megatron-core.json");
  const Software m = parse_software(j, "s.json");
  ASSERT_TRUE(m.mem.rope_scaled.has_value());
  EXPECT_EQ(m.mem.rope_scaled->kernels_fwd, 24);
  EXPECT_DOUBLE_EQ(m.mem.rope_scaled->passes_bwd, 5.67);
  j["memory_bound"].erase("rope_scaled");
  EXPECT_FALSE(parse_software(j, "s.json").mem.rope_scaled.has_value());
  j["memory_bound"]["rope_scaled"] = {{"kernel", "add"}, {"passes_fwd", 1}, {"passes_bwd", 1}, {"kernels_fwd", -2}, {"kernels_bwd", 1}};
  EXPECT_EQ(input_error([&] { parse_software(j, "s.json"); }).find("s.json: memory_bound.rope_scaled.kernels_fwd = -2, must be"), 0u);
  for (const char* name : {"pytorch-eager", "trainplan-exec", "llm-foundry"})
    EXPECT_FALSE(load_software(name, kSource).mem.rope_scaled.has_value()) << name;
}

}  // namespace
}  // namespace trainplan
