#include "sim/software.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "sim/check.hpp"
#include "sim/json_reader.hpp"

namespace trainplan {

using nlohmann::json;

namespace {

MemOpImpl parse_mem_op(const JsonObject& o) {
  MemOpImpl m;
  if (!parse_mem_kernel(o.string("kernel"), m.kernel)) {
    throw o.error("kernel", "must be a measured kernel family (layer_norm, rms_norm, gelu, swiglu, add, "
                            "cross_entropy_fp32, adamw_fused, adamw_foreach)");
  }
  m.passes_fwd = o.number("passes_fwd", 0, 1e3);
  m.passes_bwd = o.number("passes_bwd", 0, 1e3);
  m.kernels_fwd = static_cast<int>(o.integer("kernels_fwd", 0, 1000));
  m.kernels_bwd = static_cast<int>(o.integer("kernels_bwd", 0, 1000));
  o.finish();
  return m;
}

// One function per object of a profile, each reading that object's keys (parse_software calls
// them in the file's order, so the first bad field is the one named).
void parse_host(JsonObject h, Software& s) {
  s.host_per_kernel = h.number("per_kernel_us", 0, 1e6) * kMicro;
  (void)h.optional_string("source");  // where the figure comes from, for the reader
  h.finish();
}

void parse_precision(JsonObject p, Software& s) {
  s.stream_bytes = p.number("residual_stream_bytes", 1, 8);
  s.autocast_casts_inputs = p.boolean("autocast_casts_gemm_inputs");
  s.weight_cast_per_micro_batch = p.boolean("weight_cast_per_micro_batch");
  s.fp8_saved_gemm_input_bytes = p.number("fp8_saved_gemm_input_bytes", 1, 4);
  s.fp8_lm_head = p.boolean("fp8_lm_head");
  p.finish();
}

void parse_gemm(JsonObject g, Software& s) {
  s.qkv_fused = g.boolean("qkv_fused");
  s.gate_up_fused = g.boolean("gate_up_fused");
  s.wgrad_accumulate_fused = g.boolean("wgrad_accumulate_fused");
  s.gemm_kernels = static_cast<int>(g.integer("kernels_per_gemm", 1, 100));
  s.vocab_multiple = static_cast<int>(g.integer("vocab_padding_multiple", 1, 1 << 20));
  s.fp8_quantize_passes = g.number("fp8_quantize_passes", 0, 100);
  if (g.has("fp8_quantize_kernels")) s.fp8_quantize_kernels = static_cast<int>(g.integer("fp8_quantize_kernels", 1, 100));
  s.fp8_bwd_gemm_slowdown = g.number("fp8_bwd_gemm_slowdown", 1, 10);
  g.finish();
}

void parse_attention(JsonObject a, Software& s) {
  s.attention_kernels_fwd = static_cast<int>(a.integer("kernels_fwd", 1, 1000));
  s.attention_kernels_bwd = static_cast<int>(a.integer("kernels_bwd", 1, 1000));
  s.attention_kernel = a.string("kernel");
  if (s.attention_kernel.empty() || s.attention_kernel.size() > 64 ||
      !std::all_of(s.attention_kernel.begin(), s.attention_kernel.end(),
                   [](unsigned char ch) { return std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.'; })) {
    throw a.error("kernel", "must be a kernel name of 1-64 letters, digits, '-', '_' or '.' (\"calibrated\": the cluster's measured attention table)");
  }
  if (a.has("default")) s.default_attention = *trainplan::parse_attention(a.choice("default", {"flash", "standard"}));
  a.finish();
}

void parse_memory_bound_ops(JsonObject m, Software& s) {
  s.mem.layer_norm = parse_mem_op(m.object("layer_norm"));
  s.mem.rms_norm = parse_mem_op(m.object("rms_norm"));
  s.mem.gelu = parse_mem_op(m.object("gelu"));
  s.mem.swiglu = parse_mem_op(m.object("swiglu"));
  s.mem.residual = parse_mem_op(m.object("residual"));
  s.mem.dropout = parse_mem_op(m.object("dropout"));
  s.mem.bias_add = parse_mem_op(m.object("bias_add"));
  s.mem.rope = parse_mem_op(m.object("rope"));
  s.mem.attention_copies = parse_mem_op(m.object("attention_copies"));
  s.mem.gqa_expand = parse_mem_op(m.object("gqa_expand"));
  s.mem.cp_merge = parse_mem_op(m.object("cp_merge"));
  s.mem.autocast_cast = parse_mem_op(m.object("autocast_cast"));
  s.mem.cross_entropy = parse_mem_op(m.object("cross_entropy"));
  s.mem.embedding = parse_mem_op(m.object("embedding"));
  s.mem.embedding_grad = parse_mem_op(m.object("embedding_grad"));
  s.mem.grad_accumulation = parse_mem_op(m.object("grad_accumulation"));
  s.mem.weight_cast = parse_mem_op(m.object("weight_cast"));
  s.mem.optimizer = parse_mem_op(m.object("optimizer"));
  if (m.has("fused_split")) s.mem.fused_split = parse_mem_op(m.object("fused_split"));
  if (m.has("glu_clamp")) s.mem.glu_clamp = parse_mem_op(m.object("glu_clamp"));
  if (m.has("rope_scaled")) s.mem.rope_scaled = parse_mem_op(m.object("rope_scaled"));
  m.finish();
}

void parse_overlap(JsonObject v, Software& s) {
  s.overlap.tp = v.number("tp", 0, 1);
  if (v.has("tp_backward")) s.overlap.tp_backward = v.number("tp_backward", 0, 1);
  s.overlap.dp = v.number("dp", 0, 1);
  s.overlap.param_gather = v.number("param_gather", 0, 1);
  s.overlap.zero3 = v.number("zero3", 0, 1);
  s.overlap.pp = v.number("pp", 0, 1);
  s.overlap.pp_interleaved = v.number("pp_interleaved", 0, 1);
  if (v.has("ep")) s.overlap.ep = v.number("ep", 0, 1);
  (void)v.string("source");
  v.finish();
}

void parse_moe(JsonObject m, Software& s) {
  s.moe.router = parse_mem_op(m.object("router"));
  s.moe.permute = parse_mem_op(m.object("permute"));
  s.moe.unpermute = parse_mem_op(m.object("unpermute"));
  if (m.has("expert_bias")) s.moe.expert_bias = parse_mem_op(m.object("expert_bias"));
  s.moe.shared_expert_overlap = m.boolean("shared_expert_overlap");
  if (m.has("grouped_gemm")) s.moe.gemm_per_expert = m.choice("grouped_gemm", {"one_kernel", "per_expert"}) == "per_expert";
  if (m.has("host_per_expert_gemm_us")) {
    if (!s.moe.gemm_per_expert)
      throw m.error("host_per_expert_gemm_us", "needs \"grouped_gemm\": \"per_expert\" (it is host time per expert GEMM)");
    s.moe.host_per_expert_gemm = m.number("host_per_expert_gemm_us", 0, 1e6) * kMicro;
  }
  if (m.has("dropless_dispatch_syncs")) s.moe.dropless_dispatch_syncs = m.boolean("dropless_dispatch_syncs");
  if (m.has("dispatcher")) s.moe.dispatcher = *parse_dispatcher(m.choice("dispatcher", {"alltoall", "allgather", "flex"}));
  (void)m.string("source");
  m.finish();
}

void parse_zero3(JsonObject z, Software& s) {
  s.zero3.max_bus_bandwidth = z.number("max_bus_gbps", 0, 1e6) * kGB;
  s.zero3.regathers_for_recompute = z.boolean("regathers_for_recompute");
  (void)z.string("source");
  z.finish();
}

void parse_parallelism(JsonObject p, Software& s) {
  ParallelImpl& x = s.parallel;
  x.tp_reduce_per_linear = p.choice("tp_input_gradient_reduce", {"per_region", "per_linear"}) == "per_linear";
  x.loss_on_gathered_logits = p.choice("loss", {"vocab_parallel", "gathered_logits"}) == "gathered_logits";
  x.dp_all_reduce_bytes = p.optional_number("dp_all_reduce_bytes", 1, 8).value_or(0);
  x.pipeline_uniform_modules = p.choice("pipeline_split", {"balanced", "uniform_modules"}) == "uniform_modules";
  x.pipeline_send_scatter_gather = p.choice("pipeline_send", {"scatter_gather", "whole"}) == "scatter_gather";
  (void)p.string("source");
  p.finish();
}

void parse_memory_profile(JsonObject m, Software& s) {
  MemoryProfile& p = s.memory;
  p.fp32_parameters = m.boolean("fp32_parameters");
  p.optimizer_extra_bytes = m.number("optimizer_extra_bytes", 0, 64);
  p.weight_copy_bytes = m.number("weight_copy_bytes", 0, 8);
  p.optimizer_temp_bytes = m.number("optimizer_temp_bytes", 0, 64);
  p.dropout_masks = m.boolean("dropout_masks");
  p.rms_norm_saved_stream_tensors = static_cast<int>(m.integer("rms_norm_saved_stream_tensors", 0, 8));
  p.attention_output_copies = static_cast<int>(m.integer("attention_output_copies", 0, 8));
  p.kv_expanded_saved = m.boolean("kv_expanded_saved");
  p.rope_saved_copies = m.boolean("rope_saved_copies");
  p.activation_output_saved = m.boolean("activation_output_saved");
  p.loss_bytes_per_logit = m.number("loss_bytes_per_logit", 0, 64);
  p.loss_chunk_bytes = m.optional_number("loss_chunk_bytes", 0, 1e15).value_or(0);
  p.loss_input_bytes = m.optional_number("loss_input_bytes", 0, 64).value_or(0);
  p.loss_bytes_per_head_param = m.optional_number("loss_bytes_per_head_param", 0, 64).value_or(0);
  p.loss_compute_dtype_copies = m.has("loss_compute_dtype_copies") && m.boolean("loss_compute_dtype_copies");
  p.weight_copies_layers_only = m.has("weight_copies_layers_only") && m.boolean("weight_copies_layers_only");
  (void)m.string("source");
  m.finish();
}

void parse_allocator(JsonObject a, Software& s) {
  s.allocator.reserved_over_allocated = a.number("reserved_over_allocated", 1, 10);
  s.allocator.workspace = a.number("workspace_gb", 0, 1e3) * kGB;
  s.allocator.safety_margin = a.number("safety_margin", 0, 0.5);
  (void)a.string("source");
  a.finish();
}

}  // namespace

Software parse_software(const json& j, const std::string& file) {
  JsonObject o(j, file);
  if (o.string("schema") != kSoftwareSchema) {
    throw o.error("schema", fmt::format("must be \"{}\"", kSoftwareSchema));
  }
  Software s;
  s.name = o.string("name");
  s.source = o.string("source");
  s.assumptions = o.string("assumptions");
  if (const auto e = o.optional_string("describes_executor")) {
    if (e->empty() || e->size() > 64 || !std::all_of(e->begin(), e->end(), [](unsigned char ch) { return std::isgraph(ch); }))
      throw o.error("describes_executor", "must be 1-64 printable characters without spaces");
    s.describes_executor = *e;
  }
  parse_host(o.object("host"), s);
  parse_precision(o.object("precision"), s);
  parse_gemm(o.object("gemm"), s);
  parse_attention(o.object("attention"), s);
  parse_memory_bound_ops(o.object("memory_bound"), s);
  parse_overlap(o.object("overlap"), s);
  if (o.has("moe")) parse_moe(o.object("moe"), s);
  if (o.has("zero3")) parse_zero3(o.object("zero3"), s);
  if (o.has("parallelism")) parse_parallelism(o.object("parallelism"), s);
  parse_memory_profile(o.object("memory"), s);
  parse_allocator(o.object("allocator"), s);
  o.finish();
  return s;
}

std::filesystem::path software_file(const std::string& name_or_path, const std::filesystem::path& data_dir,
                                    const std::string& flag) {
  std::filesystem::path path = name_or_path;
  const bool looks_like_path = name_or_path.find('/') != std::string::npos || path.extension() == ".json";
  if (looks_like_path) return path;
  path = data_dir / "software" / (name_or_path + ".json");
  // error_code overload: a name too long for the file system is "not found", not a crash.
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw InputError(fmt::format("{} {}: not a built-in software profile (one of: {}) and not a file", flag,
                                 name_or_path, fmt::join(builtin_software(data_dir), ", ")));
  }
  return path;
}

Software load_software(const std::string& name_or_path, const std::filesystem::path& data_dir) {
  const std::filesystem::path path = software_file(name_or_path, data_dir);
  return parse_software(read_json_file(path), path.string());
}

std::vector<std::string> builtin_software(const std::filesystem::path& data_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(data_dir / "software", ec)) {
    if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace trainplan
