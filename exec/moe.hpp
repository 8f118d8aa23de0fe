// The routed experts of an MoE layer on one rank: the router, the token dispatch to the
// expert-parallel ranks holding each token's experts, the experts' MLPs and the combine back
// (Megatron-core moe/: TopKRouter, MoEAlltoAllTokenDispatcher, SequentialMLP; written anew here).
//
// Router (route): logits = x Wr^T (+ b) in fp32, then
//   softmax  probabilities over all experts, the top_k of them renormalised to sum to 1 (what
//            Megatron-core's default, a softmax over the top_k logits, gives: Mixtral's router);
//   sigmoid  an independent sigmoid per expert, the top_k of them divided by their sum when
//            top_k > 1 (Megatron-core's sigmoid scoring; DeepSeek-V3's normalised gates).
// Each token goes to its top_k experts; the layer's output for the token is the weighted sum of
// their outputs. No auxiliary load-balancing loss (a coefficient of 0).
//
// Dispatch (dropless, capacity_factor 0): the token copies are ordered by expert (stably, so by
// token within an expert); experts e*E/ep .. (e+1)*E/ep - 1 live on EP rank e, so each EP rank's
// copies are one contiguous block. The ranks first exchange how many copies each of their experts
// gets from each rank (an all-to-all of E int64 counts), then the copies themselves (an all-to-all
// of rows with those variable splits). A rank's received rows, ordered by source rank then local
// expert, are regrouped by local expert, each expert's MLP runs over its rows as one GEMM per
// projection, and the outputs go back by the reverse all-to-all (the combine) to be weighted and
// summed per token. The backward runs the same exchanges in reverse (ExpertAllToAll, an autograd
// function): the combine's gradient goes out as the dispatch went, the dispatch's as the combine.
//
// With a capacity factor C > 0 each expert takes at most capacity = ceil(T top_k C / E) copies
// from each rank's T tokens (Megatron-core's --moe-expert-capacity-factor, its per-rank capacity);
// of more it keeps those with the largest routing weights (drop policy "probs") and drops the
// others (their weight is 0), and fewer are padded with zero rows to exactly capacity
// (--moe-pad-expert-input-to-capacity): every rank then sends E x capacity rows and the counts
// need no exchange.
//
// Traffic: the bytes handed to the token all-to-alls (forward and backward), counted as Comm
// counts (a tensor's whole size, the rows a rank keeps for itself included), and apart from them
// the count exchanges' bytes.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "exec/parallel.hpp"
#include "sim/model_spec.hpp"

namespace trainplan::exec {

// One routed expert's weights: an MLP like the model's dense one. SwiGLU: w_in [2F, h], the gate's
// rows first, then the up projection's; GELU: w_in [F, h]. w_out [h, F]. Biases may be undefined.
struct ExpertWeights {
  at::Tensor w_in, b_in, w_out, b_out;
};

struct RouterWeights {
  at::Tensor w;  // [experts, h]
  at::Tensor b;  // [experts], or undefined
};

// What the routed experts need of the model and the plan.
struct MoeSettings {
  int experts = 0, top_k = 0;
  RouterScoring scoring = RouterScoring::softmax;
  Activation activation = Activation::swiglu;
  int ep = 1, ep_rank = 0;       // expert-parallel ranks; this rank holds experts [ep_rank E/ep, (ep_rank+1) E/ep)
  double capacity_factor = 0;    // 0: dropless
  bool fuse_swiglu = false, fuse_gelu = false;  // as exec/kernels/fused_ops (ModelSettings says which)
  int local_experts() const { return experts / ep; }
};

struct ExpertTraffic {
  double token_bytes = 0;  // the tokens' all-to-alls: dispatch and combine, forward and backward
  double count_bytes = 0;  // the exchanges of copies per expert (dropless only)
};

struct Routing {
  at::Tensor weights;  // [T, top_k] routing weight of each of a token's experts (differentiable)
  at::Tensor experts;  // [T, top_k] int64, the experts chosen
};

// The router over tokens x [T, h] (see the top).
Routing route(const at::Tensor& x, const RouterWeights& router, const MoeSettings& s);

// Copies of one rank's T tokens an expert takes at most with capacity factor C (Megatron-core
// moe_utils.get_capacity): ceil(T x top_k x C / experts).
int64_t expert_capacity(int64_t tokens, int top_k, int experts, double capacity_factor);

// The routed experts' output for this rank's tokens x [T, h]: [T, h] (the residual is not added).
// `local`: the weights of this rank's experts, in expert order. Collective over `ep`: every EP
// rank calls it for the same layer at the same point of its step.
at::Tensor routed_experts(const at::Tensor& x, const RouterWeights& router, const std::vector<ExpertWeights>& local,
                          const MoeSettings& s, Comm& ep, ExpertTraffic& traffic);

// An autograd all-to-all along dim 0 over `ep`: forward sends x's rows by in_splits and returns the
// out_splits rows received; backward sends the gradient back the other way. Counts both into
// traffic.token_bytes.
at::Tensor expert_all_to_all(const at::Tensor& x, Comm& ep, const std::vector<int64_t>& out_splits,
                             const std::vector<int64_t>& in_splits, ExpertTraffic& traffic);

}  // namespace trainplan::exec
