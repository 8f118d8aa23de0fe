#include "sim/plan_shape.hpp"

#include <algorithm>

#include "sim/check.hpp"
#include "sim/compression.hpp"
#include "sim/rank_layout.hpp"

namespace trainplan {

namespace {

// Gradients leave the GPU: a DP group (dp x cp replicas) of two or more, or parameter servers.
bool reduces_gradients(const Strategy& s) { return s.dp * s.cp > 1 || s.uses_ps(); }

// `s`, checked for what the derivations below divide by (validate() says which rule a user's plan
// breaks; a plan that reaches a shape unchecked is a bug).
const Strategy& checked(const Strategy& s) {
  TRAINPLAN_CHECK(s.dp >= 1 && s.tp >= 1 && s.pp >= 1 && s.cp >= 1 && s.vp >= 1 && s.micro_batch >= 1,
                  "a plan shape needs parallel sizes and a micro-batch of at least 1");
  TRAINPLAN_CHECK(ZeroPolicy::valid_stage(s.zero), "a plan shape needs a ZeRO stage of 0 to 3");
  return s;
}

}  // namespace

StateBytes state_bytes(Dtype dtype, bool fp32_grad_accum) {
  if (dtype == Dtype::fp32) return {4, 4, 8};
  return {2, fp32_grad_accum ? 4.0 : 2.0, 12};
}

StateBytes state_bytes(const MemoryProfile& p, const Strategy& s) {
  if (!p.fp32_parameters) return state_bytes(s);
  // fp32 parameters and .grad (4 + 4 B), Adam's two fp32 moments (8 B), the profile's extras.
  return {4, 4, 8 + p.optimizer_extra_bytes};
}

TokenShape token_shape(const Strategy& s) {
  TokenShape t;
  t.per_rank = s.tokens_per_rank();
  t.seq_share = s.sequence_parallel ? 1.0 / s.tp : 1.0;
  t.seq_split = s.sequence_parallel ? t.per_rank / s.tp : t.per_rank;
  t.tensor_share = 1.0 / s.tp;
  t.per_replica = static_cast<double>(s.micro_batch) * s.seq_len;
  return t;
}

MoeShape moe_shape(const ModelSpec& m, const Strategy& s, const TokenShape& t) {
  MoeShape x;
  if (!m.moe.on()) return x;
  const double factor = s.capacity_factor > 0 ? s.capacity_factor : s.moe_imbalance;
  x.tokens = t.seq_split;
  x.routed = x.tokens * m.moe.top_k * factor;
  x.received = x.routed * s.etp;
  x.local_experts = m.moe.experts / s.ep;
  x.expert_tokens = x.received / x.local_experts;
  x.expert_shards = s.ep * s.etp;
  return x;
}

double gemm_input_bytes(Dtype d) {
  switch (d) {
    case Dtype::bf16:
    case Dtype::fp16: return 2;
    case Dtype::fp32: return 4;
    case Dtype::fp8: return 1;
    case Dtype::mxfp8: return 1 + 1.0 / 32;
    case Dtype::nvfp4: return 0.5 + 1.0 / 16;
  }
  return 2;
}

bool stack_all_reduces_gradients(const Software& sw, const Strategy& s) {
  return sw.parallel.dp_all_reduce_bytes > 0 && !ZeroPolicy::of(s.zero).reduce_each_micro_batch;
}

ZeroPolicy zero_policy(const Software& sw, const Strategy& s) {
  ZeroPolicy z = ZeroPolicy::of(s.zero);
  if (stack_all_reduces_gradients(sw, s)) z.reduce_scatters = false;
  return z;
}

ElementBytes element_bytes(const Software& sw, const Strategy& s) {
  const bool fp32 = s.dtype == Dtype::fp32;
  ElementBytes b;
  b.activation = activation_bytes(s.dtype);
  b.stream = std::max(sw.stream_bytes, b.activation);
  b.gemm_input = gemm_input_bytes(s.dtype);
  b.saved_gemm_input = s.dtype == Dtype::fp8 ? sw.fp8_saved_gemm_input_bytes : b.activation;
  b.weight_copy = fp32 ? 0.0 : sw.memory.weight_copy_bytes;
  if (block_scaled(s.dtype)) {
    const bool keeps_quantized = sw.fp8_saved_gemm_input_bytes < b.activation;
    if (keeps_quantized) b.saved_gemm_input = b.gemm_input;
    b.quantize_moved = b.activation + 2 * b.gemm_input + (s.dtype == Dtype::nvfp4 ? b.activation : 0.0);
    b.weight_copy += 2 * b.gemm_input;
  }
  // Under mixed precision each rank casts its master shard to 16 bits and gathers that, whatever
  // the width of the master weights (FSDP MixedPrecision(param_dtype=bf16), Megatron's
  // distributed optimizer; exec/reducer.cpp likewise); FP8 too: its GEMMs quantize from the
  // 16-bit weights.
  b.gathered_param = state_bytes(s).weight;
  b.wire_grad = stack_all_reduces_gradients(sw, s) ? sw.parallel.dp_all_reduce_bytes : state_bytes(s).grad;
  // The loss's fp32 figures, and a copy of each in the 16-bit compute dtype where the stack keeps one.
  const double loss_copy = !fp32 && sw.memory.loss_compute_dtype_copies ? b.activation : 0.0;
  b.logit = sw.memory.loss_bytes_per_logit + loss_copy;
  b.loss_head = sw.memory.loss_bytes_per_head_param > 0 ? sw.memory.loss_bytes_per_head_param + loss_copy : 0.0;
  b.loss_input = sw.memory.loss_input_bytes > 0 ? sw.memory.loss_input_bytes + loss_copy : b.activation;
  b.state = state_bytes(sw.memory, s);
  b.optimizer_temp = sw.memory.optimizer_temp_bytes;
  // Parameter servers hold the optimizer states and run the optimizer (param_server.hpp): the
  // workers keep weights and gradients only.
  if (s.uses_ps()) {
    b.state.optimizer = 0;
    b.optimizer_temp = 0;
  }
  // Error feedback is kept for every parameter, the few uncompressed ones (norms, biases)
  // included, where gradients are reduced at all.
  if (reduces_gradients(s)) b.error_feedback = error_feedback_bytes_per_param(s.grad_compression);
  return b;
}

namespace {

ParallelGroups parallel_groups(const Cluster& c, const Strategy& s, const RankLayout& layout) {
  ParallelGroups g;
  g.tp = group_of(c, s.tp, layout.stride(Dim::tp));
  g.cp = group_of(c, s.cp, layout.stride(Dim::cp));
  const int dp_stride = s.cp > 1 ? std::min(layout.stride(Dim::dp), layout.stride(Dim::cp)) : layout.stride(Dim::dp);
  g.dp = group_of(c, s.dp * s.cp, dp_stride);
  g.zero3 = g.dp;
  g.pp = pipeline_group(c, s.pp, layout.stride(Dim::pp));
  g.ep = group_of(c, s.ep, layout.stride(ExpertDim::ep));
  g.etp = group_of(c, s.etp, layout.stride(ExpertDim::etp));
  g.edp = group_of(c, layout.size(ExpertDim::edp), layout.stride(ExpertDim::edp));
  g.edp_zero3 = g.edp;
  g.expert_mp = group_of(c, s.ep * s.etp, std::min(layout.stride(ExpertDim::etp), layout.stride(ExpertDim::ep)));
  return g;
}

}  // namespace

GroupLink pipeline_group(const Cluster& c, int pp, int stride) {
  // Stages `stride` ranks apart share a scale-up domain only while the whole pipeline fits in one:
  // once it does not, some adjacent pair straddles two domains (tp 4 x pp 16 on 8-GPU nodes: stages
  // 0-1 in one node, 1-2 across two), and with blocking or lock-stepped sends the slowest hop sets
  // the pace. Such a pair is costed as a pair one domain apart: one NIC each on the tier joining them.
  const bool crosses = static_cast<long long>(stride) * pp > c.scale_up_gpus;
  const int pair_stride = crosses ? std::max(stride, c.scale_up_gpus) : stride;
  return {pp, stride, group_link(c, 2, pair_stride), c.collectives.call_overhead, {}};
}

ParallelGroups parallel_groups(const Cluster& c, const Strategy& s) { return parallel_groups(c, s, RankLayout(s)); }

namespace {

// The groups with ZeRO-3's view of the DP (and EDP) group: the stack's cap on its collectives'
// bandwidth.
ParallelGroups with_zero3(ParallelGroups g, const Software& sw) {
  g.zero3.link = capped(g.dp.link, sw.zero3.max_bus_bandwidth);
  g.edp_zero3.link = capped(g.edp.link, sw.zero3.max_bus_bandwidth);
  return g;
}

}  // namespace

PlanShape::PlanShape(const ModelSpec& model, const Cluster& cluster, const Software& sw, const Strategy& s)
    : strategy(checked(s)),
      zero(zero_policy(sw, s)),
      micro_batches(s.micro_batches()),
      chunks(s.pp * s.vp),
      vocab_rows(static_cast<double>(trainplan::vocab_rows(sw, model.vocab, s.tp))),
      reduces_gradients(trainplan::reduces_gradients(s)),
      pp_overlap(s.schedule == ScheduleKind::interleaved ? sw.overlap.pp_interleaved : sw.overlap.pp),
      tokens(token_shape(s)),
      moe(moe_shape(model, s, tokens)),
      bytes(element_bytes(sw, s)),
      groups(with_zero3(parallel_groups(cluster, s, RankLayout(s)), sw)),
      host{sw.host_per_kernel, s.cuda_graphs == CudaGraphs::full} {
  // (Members initialised in place, not assigned: search builds one of these per layout.)
  if (s.uses_ps()) ps = ps_network(cluster, s, groups.dp);
}

Bytes expert_all_to_all_bytes(const ModelSpec& m, const PlanShape& shape) {
  return shape.moe.routed * m.hidden * shape.bytes.activation;
}

std::optional<Infeasible> cannot_shape(const ModelSpec& model, const Cluster& cluster, const Strategy& s) {
  if (auto bad = validate(s, model)) return Infeasible{.reason = InfeasibleReason::invalid_strategy, .detail = *bad};
  if (auto bad = validate_on(s, cluster)) return Infeasible{.reason = InfeasibleReason::invalid_strategy, .detail = *bad};
  if (cluster.gpu.peak(s.dtype) <= 0) {
    return Infeasible{.reason = InfeasibleReason::unsupported_dtype, .detail = cluster.gpu.name};
  }
  return std::nullopt;
}

std::variant<PlanShape, Infeasible> shape_plan(const ModelSpec& model, const Cluster& cluster, const Software& sw,
                                               const Strategy& s) {
  if (auto why = cannot_shape(model, cluster, s)) return std::move(*why);
  return PlanShape(model, cluster, sw, s);
}

}  // namespace trainplan
