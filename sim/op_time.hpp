// Op time model: the GPU time and kernel count of each op of a training step on one rank, from the
// cluster's measured kernel tables (op_costs.hpp) and the software profile (software.hpp). FLOPs
// and tensor sizes come from the model and the layer graph (Korthikanti et al. 2022; Narayanan et
// al. 2021); nothing here is fitted.
//
// The tokens per rank, the shares of split tensors and the element widths (the residual stream's,
// the activations') are the plan's (PlanShape, plan_shape.hpp); nothing here derives them.
//
// A pass (one layer's forward or backward for one micro-batch, ...) costs its GPU time or the
// host's time to issue its kernels, whichever is longer: the host runs ahead of the GPU until the
// GPU runs out of queued work, so a pass of small kernels is launch-bound.
#pragma once
#include <array>

#include "sim/cluster.hpp"
#include "sim/layer_graph.hpp"
#include "sim/plan_shape.hpp"
#include "sim/software.hpp"
#include "sim/strategy.hpp"

namespace trainplan {

struct PassCost {
  Seconds gpu = 0;     // sum of the kernels' times on the GPU
  double kernels = 0;  // kernels launched
  Seconds host = 0;    // host time beyond the kernels' launches (per-expert work, MoeOps)
  // Wall time of the pass: max(GPU time, kernels x host time per kernel + host); the GPU time
  // alone where a CUDA graph issues the kernels (HostLaunch).
  Seconds time(const HostLaunch& h) const;
  // The same pass with a host wait before its part `tail`: each part the longer of its GPU and
  // host time, as the host cannot launch the tail while the GPU runs the head.
  Seconds time_with_wait_before(const PassCost& tail, const HostLaunch& h) const;
  PassCost& operator+=(const PassCost& o) {
    gpu += o.gpu;
    kernels += o.kernels;
    host += o.host;
    return *this;
  }
};
PassCost operator*(double n, const PassCost& p);

// One transformer layer of one kind, one micro-batch, one rank (TP/CP/SP/EP split applied).
struct LayerOpCosts {
  PassCost fwd;
  PassCost bwd;            // without recomputation; with the per-micro-batch gradient accumulation
  PassCost attention_fwd;  // the attention core alone (what selective recomputation repeats)
  // MoE layers: the shared experts' part of fwd and bwd (what runs beside the dispatch all-to-all
  // where the stack overlaps them); zero otherwise.
  PassCost shared_fwd, shared_bwd;
  PassCost expert_fwd, expert_bwd;  // the routed experts' grouped GEMMs and activation
  // MoE layers: the forward's part from the dispatch on (the experts and the unpermute), which a
  // stack whose dropless dispatch waits on the host cannot launch ahead (MoeOps).
  PassCost after_dispatch_fwd;
  // The forward work the strategy's recompute_modules repeat before the backward (moe_act: the
  // experts' activation; mla_up_proj: MLA's up projections and RoPE).
  PassCost module_recompute;
};

// The ops before the first layer (embedding) and after the last (final norm, LM head, loss).
struct EndOpCosts {
  PassCost fwd, bwd;
};

struct OpCosts {
  std::array<LayerOpCosts, LayerGraph::kMaxKinds> kinds;  // one per layer kind (LayerGraph::kind)
  EndOpCosts pre, post;
  // One multi-token-prediction module without its transformer layer (a kind's): its two norms and
  // 2h -> h projection, the shared head's norm, GEMM and loss. Zero without MTP.
  EndOpCosts mtp;
};

// The op costs of one plan: its tokens, shares and element widths (the residual stream's, the
// activations') are the shape's.
OpCosts op_costs(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const PlanShape& shape);
// The same for a strategy that passes cannot_shape() (its shape built here).
OpCosts op_costs(const LayerGraph& graph, const Cluster& cluster, const Software& sw, const Strategy& s);

// Per step on one rank: the optimizer over `params_updated` parameters (after ZeRO sharding) and
// the weight casts and gradient-buffer work over `params_held` (see Software::weight_cast).
PassCost optimizer_cost(const Cluster& cluster, const Software& sw, double params_updated);
PassCost weight_cast_cost(const Cluster& cluster, const Software& sw, double params_held);

// Time of one GEMM of M x N x K in `dtype` on this cluster (the table's rate, scaled for another
// dtype; never faster than streaming its operands once).
Seconds gemm_time(const Cluster& c, Dtype dtype, double m, double n, double k, GemmPass pass);

// An upper bound on the rate at which the op time model runs any op the layer graph marks as a
// matmul, counted in the graph's FLOPs (flash attention runs the causal half of the graph's
// attention FLOPs): for lower bounds on compute time (search).
FlopsPerSecond matmul_rate_bound(const Cluster& c, Dtype dtype);

}  // namespace trainplan
