// Context parallelism: causal ring attention over the CP group with Megatron's load-balanced
// ("zigzag") split of the sequence.
//
// The sequence is cut into 2*cp equal chunks; CP rank r holds chunks r and 2*cp-1-r, in that
// order (Megatron-LM get_batch_on_this_cp_rank; Liu et al. 2023, Ring Attention). Every rank then
// does the same causal work: at ring step j it holds the K/V of rank src = (r - j) mod cp and
//   j = 0:     its own queries against its own keys, causal;
//   src < r:   all its queries against the first half of the block (chunk src), unmasked;
//   src > r:   the second half of its queries (chunk 2cp-1-r) against the whole block, unmasked;
// i.e. half a block's work per step after the first. The cp-1 transfers of K and V (forward) and
// of K, V and their gradients (backward) are the ones `predict` times (sim/predict.cpp).
#pragma once
#include <torch/torch.h>

#include "exec/parallel.hpp"

namespace trainplan::exec {

// Global positions of the tokens CP rank `rank` holds, in its local order: [seq / cp] int64.
at::Tensor zigzag_positions(int64_t seq, int cp, int rank);

// Causal attention of this rank's queries against the whole sequence's keys and values.
// q [b, hq, L, d], k and v [b, hkv, L, d] (hq a multiple of hkv: grouped-query attention), with L
// = seq / cp tokens in zigzag order; returns [b, hq, L, d] in q's dtype. Scale 1/sqrt(d). With one
// CP rank this is plain causal attention. K and V travel un-repeated (hkv heads).
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, Comm& cp);

}  // namespace trainplan::exec
