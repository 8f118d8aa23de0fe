// PlanShape: the facts of one training plan that follow from (model, cluster, software, strategy)
// alone, checked and derived once, then read by every component of the analytical model:
//
//   flags | plan.json ─► Strategy ─► PlanShape ─► step_costs ─► StepCosts ─► compose ─► Estimate
//                                    (this file)   (predict.hpp)    │
//                                                                    └────────► simulate ─► Timeline
//
// op_time (kernel times), layer_costs / step_costs (per-op and per-chunk costs), memory_model (the
// MemoryModel inside StepCosts), compression and parameter servers take their per-plan facts from
// here; none of them derives tokens, shares, element widths, group links or the ZeRO behaviour
// from the Strategy again, so they cannot disagree on them. What it holds:
//   tokens  per-rank tokens of a micro-batch and the shares of a split tensor a rank holds;
//   bytes   bytes per element of each kind of tensor (ElementBytes);
//   groups  one GroupLink per parallel group (TP, CP, DP with its CP replicas, PP neighbours, and
//           for experts EP, ETP, EDP), whose methods cost one collective call with the cluster's
//           per-call overhead;
//   moe     the tokens an MoE layer routes on this rank and the rows its experts take (MoeShape);
//   zero    the ZeroPolicy (zero_policy.hpp) of the strategy's stage, as the stack runs it
//           (zero_policy());
//   ps      the parameter servers' network (Strategy::uses_ps());
//   host    how the host issues the kernels of a pass (HostLaunch).
// Building one allocates nothing: search builds one for every layout it predicts.
#pragma once
#include <optional>
#include <variant>

#include "sim/cluster.hpp"
#include "sim/collectives.hpp"
#include "sim/estimate.hpp"
#include "sim/model_spec.hpp"
#include "sim/param_server.hpp"
#include "sim/software.hpp"
#include "sim/strategy.hpp"
#include "sim/zero_policy.hpp"

namespace trainplan {

// Bytes per parameter of each model state. Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO,
// Sec. 3.1): 16-bit weights and gradients (fp32 gradients with fp32_grad_accum), K = 12 bytes of
// fp32 master weights, momentum and variance. Pure fp32 training: 4-byte weights and gradients,
// K = 8 (momentum, variance).
struct StateBytes {
  double weight = 0, grad = 0, optimizer = 0;  // bytes per parameter
};
StateBytes state_bytes(Dtype dtype, bool fp32_grad_accum);
inline StateBytes state_bytes(const Strategy& s) { return state_bytes(s.dtype, s.fp32_grad_accum); }
// As the stack holds them: state_bytes() of the strategy, or with fp32 parameters (autocast over
// an fp32 module) 4 B weights, 4 B gradients and 8 B Adam moments plus the profile's optimizer
// extras.
StateBytes state_bytes(const MemoryProfile& p, const Strategy& s);

// The tokens one rank works on for one micro-batch, and the share it holds of a split tensor.
struct TokenShape {
  double per_rank = 0;      // b x seq / cp: tokens inside the TP region (Strategy::tokens_per_rank)
  double seq_share = 1;     // share of a sequence-split tensor a rank holds: 1/tp with SP, else 1
  double seq_split = 0;     // tokens of a sequence-split tensor on a rank: per_rank / tp with SP
  double tensor_share = 1;  // share of a tensor-split tensor (heads, ffn, vocabulary): 1/tp
  double per_replica = 0;   // b x seq: tokens of one micro-batch over a replica's TP x CP ranks
};
TokenShape token_shape(const Strategy& s);

// The tokens of one MoE layer on one rank for one micro-batch (zero for a dense model). Routing
// is balanced up to the strategy's imbalance (max / mean tokens per EP rank), and every figure is
// the busiest EP rank's, which the others wait for at the combine: with n tokens entering the
// layer and a factor f (the imbalance; with a capacity factor C, C itself: each expert padded to
// n x top_k x C / experts rows of the EP group, Megatron-core --moe-expert-capacity-factor with
// --moe-pad-expert-input-to-capacity), over ep x etp expert ranks holding experts / ep each:
//   tokens         n = b s / cp, / tp with SP (the sequence-split stream the router sees)
//   routed         n x top_k x f: token copies dispatched to this rank's experts (and combined back)
//   received       routed x etp: rows its grouped GEMMs take after the expert-TP all-gather
//   expert_tokens  received / (experts / ep) = ep x etp x n x top_k x f / experts per local expert
struct MoeShape {
  double tokens = 0, routed = 0, received = 0, expert_tokens = 0;
  int local_experts = 1;
  int expert_shards = 1;  // ep x etp: the ranks the routed experts' parameters are split over
};
MoeShape moe_shape(const ModelSpec& m, const Strategy& s, const TokenShape& t);

// Bytes per element of a GEMM input as the tensor cores read it, its scales included (the one
// storage rule of each format): bf16/fp16 2, fp32 4; fp8 1 (one fp32 scale per tensor, 0 per
// element); mxfp8 1 + 1/32 (an 8-bit E8M0 scale per 32 elements, OCP MX v1.0); nvfp4 0.5 + 1/16
// (4-bit E2M1 elements, an 8-bit E4M3 scale per 16, and one fp32 scale per tensor, 0 per element).
double gemm_input_bytes(Dtype d);

// Bytes per element of each kind of tensor, the one place these rules live. Under fp8, mxfp8 and
// nvfp4 only the GEMM inputs (and the copies a stack keeps of them) are in the low format: master
// weights and optimizer states stay fp32, weights, gradients, activations and every message of
// TP, CP, PP and DP (communication) stay 16-bit, as Transformer Engine runs them.
struct ElementBytes {
  double activation = 2;        // activations, and the TP/CP/PP messages made of them (4 in fp32)
  double stream = 2;            // the residual stream: the profile's residual_stream_bytes (4 for
                                // an fp32 stream under autocast), never narrower than activations
  double saved_gemm_input = 2;  // a GEMM input saved for the backward: under fp8 the profile's
                                // fp8_saved_gemm_input_bytes (quantized copies kept); under a
                                // block-scaled format gemm_input where the profile keeps quantized
                                // inputs (fp8_saved_gemm_input_bytes below 16 bits), else activation
  double gemm_input = 2;        // gemm_input_bytes(dtype): a GEMM operand as the tensor cores read it
  double quantize_moved = 0;    // block-scaled formats: bytes moved per element to quantize one GEMM
                                // input, read in 16 bits and written twice in the format (blocks run
                                // along the reduction dimension, so the forward and the weight
                                // gradient need differently blocked copies: rowwise, columnwise),
                                // NVFP4 reading it once more for the per-tensor amax; 0 otherwise
                                // (fp8 takes the profile's fp8_quantize_passes)
  double weight_copy = 0;       // weight copies per parameter: the 16-bit ones autocast keeps (none
                                // in fp32), plus under a block-scaled format the two quantized copies
                                // (rowwise, columnwise) cached across the step's micro-batches
  double gathered_param = 2;    // a parameter all-gathered over the DP group: in the compute dtype
                                // (ZeRO-3 units, ZeRO-1/2's gather after the step, a server pull),
                                // 2 under mixed precision whatever the master width, 4 in fp32
  double wire_grad = 2;         // a gradient as reduced over the DP group, before compression:
                                // state_bytes(strategy).grad, or the width a stack all-reduces it in
                                // (stack_all_reduces_gradients)
  double logit = 4;             // a logit of one micro-batch (or loss chunk) at the loss's peak (profile;
                                // with loss_compute_dtype_copies plus a 16-bit copy under mixed precision)
  double loss_head = 0;         // bytes the loss holds per LM-head weight beyond it (likewise)
  double loss_input = 2;        // bytes per element of the loss's input held at its peak: the profile's
                                // loss_input_bytes (likewise), else the head GEMM's saved input (activation)
  StateBytes state;             // model states per parameter as a worker holds them (the optimizer's
                                // are on the servers with parameter servers: 0)
  double optimizer_temp = 0;    // optimizer temporaries per updated parameter (0 with servers)
  double error_feedback = 0;    // gradient compression's error-feedback buffer per parameter, where
                                // gradients leave the GPU (compression.hpp), else 0
};
ElementBytes element_bytes(const Software& sw, const Strategy& s);

// Whether the stack reduces gradients with an all-reduce of whole gradients once a step in its own
// width (Software::parallel.dp_all_reduce_bytes) where the ZeRO stage reduces once a step (0, 1).
bool stack_all_reduces_gradients(const Software& sw, const Strategy& s);
// The strategy's ZeroPolicy as the stack runs it: ZeroPolicy::of(stage), with an all-reduce in
// place of ZeRO-1's reduce-scatter where the stack all-reduces whole gradients (it still shards
// the optimizer states and gathers the updated parameters after the step).
ZeroPolicy zero_policy(const Software& sw, const Strategy& s);

// The parallel groups of one rank, each with its link and collective costs.
struct ParallelGroups {
  GroupLink tp;  // tensor parallelism: tp ranks
  GroupLink cp;  // context parallelism (the ring attention's ring): cp ranks
  GroupLink dp;  // the ranks that hold replicas of the same parameters: dp x cp (CP ranks hold the
                 // same weights); gradients are reduced and ZeRO shards over it. Stride: the
                 // nearer of the DP and CP neighbours.
  GroupLink pp;  // the pipeline: pp stages; its link is the one between adjacent stages (the
                 // pipeline only sends to neighbours): group_link of 2 ranks pp-stride apart, or
                 // one scale-up domain apart once the pipeline spans more than one (pipeline_group)
  GroupLink zero3;  // the DP group as the stack's ZeRO-3 gathers and reduce-scatters use it: dp's
                    // link with its bandwidth capped at the profile's zero3.max_bus_gbps (PlanShape)
  // Experts (RankLayout's expert numbering): the all-to-all of token dispatch over `ep`; the
  // expert-TP all-gather / reduce-scatter of the routed tokens over `etp`; the reduction (and ZeRO
  // sharding) of the routed experts' gradients over `edp`; the allgather dispatcher's collectives
  // over the ep x etp ranks of `expert_mp`. Size 1 for a dense model.
  GroupLink ep, etp, edp, expert_mp;
  GroupLink edp_zero3;  // the EDP group as ZeRO-3's collectives use it (as zero3 for dp)
};
// The groups of `s` on cluster `c`, placed by RankLayout.
ParallelGroups parallel_groups(const Cluster& c, const Strategy& s);
// The pipeline group of `pp` stages `stride` ranks apart: ParallelGroups::pp.
GroupLink pipeline_group(const Cluster& c, int pp, int stride);

// How the host issues the kernels of a forward or backward pass (PassCost::time): one launch each
// at the software profile's host time per kernel (host.per_kernel_us), or, with the iteration
// captured in a CUDA graph (Strategy::cuda_graphs full), none: the replay issues them, so a pass
// costs its GPU time alone (the graph's one launch per step, tens of microseconds, is not charged).
// The optimizer step stays outside the graph (Megatron-core's full_iteration capture) and launches
// its kernels as without one (eager()).
struct HostLaunch {
  Seconds per_kernel = 0;
  bool graphed = false;
  HostLaunch eager() const { return {per_kernel, false}; }
};

struct PlanShape {
  Strategy strategy;
  ZeroPolicy zero;             // zero_policy(software, strategy)
  int micro_batches = 1;       // per replica per step (Strategy::micro_batches)
  int chunks = 1;              // model chunks of a replica, pp x vp (its virtual stages)
  double vocab_rows = 0;       // rows of the embedding table, LM head and logits before the TP
                               // split: the vocabulary padded as the stack pads it (vocab_rows())
  bool reduces_gradients = false;  // gradients leave the GPU: a DP group of two or more, or servers
  double pp_overlap = 0;       // share of a pipeline send the stack hides under this schedule
  TokenShape tokens;
  MoeShape moe;
  ElementBytes bytes;
  ParallelGroups groups;
  PsNetwork ps;                // the parameter servers' network (default without them)
  HostLaunch host;

  // Derives every fact of `s`, which must pass cannot_shape() (a broken precondition that would
  // divide by zero is a bug check). shape_plan() checks and derives in one call.
  PlanShape(const ModelSpec& model, const Cluster& cluster, const Software& sw, const Strategy& s);
};

// Bytes one rank hands to one expert all-to-all of one MoE layer for one micro-batch (the
// dispatch's or the combine's, forward or backward, under the alltoall dispatcher): the busiest EP
// rank's routed copies (MoeShape::routed), hidden elements each, in activation bytes (the one
// place of this figure: predict's expert collectives and exec's test read it). 0 for a dense model.
Bytes expert_all_to_all_bytes(const ModelSpec& m, const PlanShape& shape);

// Why `s` cannot be costed on `cluster` for `model`: it breaks a rule of validate() or
// validate_on() (invalid_strategy, naming the flag and rule), or the GPU has no peak for its dtype
// (unsupported_dtype). nullopt when a PlanShape may be built.
std::optional<Infeasible> cannot_shape(const ModelSpec& model, const Cluster& cluster, const Strategy& s);

// The checked plan: cannot_shape()'s reason, or the shape.
std::variant<PlanShape, Infeasible> shape_plan(const ModelSpec& model, const Cluster& cluster, const Software& sw,
                                               const Strategy& s);

}  // namespace trainplan
