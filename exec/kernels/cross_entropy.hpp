// The LM head's loss without the whole micro-batch's logits: a vocabulary-parallel cross-entropy
// that computes logits, loss and the logits' gradient one chunk of tokens at a time.
#pragma once
#include <torch/torch.h>

#include "exec/parallel.hpp"

namespace trainplan::exec {

// The rows of the (padded) vocabulary one TP rank holds in the embedding and LM head.
struct VocabShard {
  int64_t first = 0;  // global id of the rank's first row
  int64_t valid = 0;  // of its rows, how many are real tokens (the rest are padding, see padded_vocab)
};
VocabShard vocab_shard(int64_t vocab, int64_t rows_per_rank, int tp_rank);

// Mean cross-entropy over T tokens of softmax(x w^T) against `targets`, with the vocabulary split
// over the TP group: x [T, h] (identical on every TP rank), w [rows, h] this rank's rows, of which
// the first shard.valid are real (padding rows get no logit, so no probability and no gradient),
// targets [T] global token ids. Returns a scalar, equal on every TP rank.
//
// Per chunk of `chunk_tokens` tokens the forward computes the logits (fp32), their log-sum-exp
// over the whole vocabulary (max and sums all-reduced over TP) and at once the logits' gradient
// (softmax - one_hot) / T, which it multiplies into dL/dx [T, h] and dL/dw [rows, h]; only those
// two are kept for the backward. Peak extra memory is one chunk's logits instead of T x rows.
// dL/dx is this rank's partial sum: the caller's copy_to_tp/gather_from_sp sums it over TP.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets,
                                        VocabShard shard, Comm& tp, int64_t chunk_tokens);

// The same loss by plain autograd on the full logits (the reference the chunked one is tested
// against; also what the executor computed before the chunked loss).
at::Tensor vocab_parallel_cross_entropy_reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& targets,
                                                  VocabShard shard, Comm& tp);

}  // namespace trainplan::exec
