// LayerGraph: a model's training ops as a Boost.Graph DAG (data dependencies, forward direction).
// Each op carries per-token forward FLOPs, memory traffic, parameters and the activations it saves
// for backward, for the whole (unsharded) op at the graph's sequence length. Cost models scale
// these by tokens, TP/CP/SP and dtype; see predict.cpp.
//
// All transformer layers are identical, so cost models read the per-layer template (layer_ops())
// and multiply by layer counts. The full graph (every layer's ops and their data edges) decides
// the layer's tensor-parallel collectives: an edge along which a tensor's split changes (tensor
// region <-> sequence/replicated region) is where Megatron puts a TP communication operator
// (layer_boundaries()); the cost model charges collectives from that count.
#pragma once
#include <boost/graph/adjacency_list.hpp>
#include <span>
#include <string>
#include <vector>

#include "sim/model_spec.hpp"
#include "sim/units.hpp"

namespace trainplan {

enum class OpKind {
  embedding,   // token (+ learned position) lookup
  norm,        // LayerNorm / RMSNorm
  qkv,         // fused Q, K, V projection
  attention,   // attention core: softmax(QK^T)V
  out_proj,    // attention output projection
  mlp_up,      // MLP up (and gate, for SwiGLU) projection
  activation,  // GeLU or SwiGLU's silu(gate)*up
  mlp_down,    // MLP down projection
  residual,    // residual add (+ dropout)
  lm_head,     // logits = h * W_vocab
  loss,        // softmax cross-entropy
};
const char* to_string(OpKind k);

// How an op's work and tensors are split by tensor parallelism.
enum class Split {
  tensor,      // inside the TP region: divided by tp (column/row-parallel matmuls, attention heads)
  sequence,    // outside it: replicated across TP ranks, divided by tp only with sequence parallelism
};

struct OpSpec {
  std::string name;      // e.g. "layer3.qkv"
  OpKind kind = OpKind::norm;
  int layer = -1;        // transformer layer index; -1 before the first layer, `layers` after the last
  Split split = Split::tensor;
  bool matmul = false;   // compute-bound kernel (a GEMM or attention), timed from the ops tables
  Flops flops_per_token = 0;        // forward FLOPs per token (backward: 2x)
  double traffic_elems_per_token = 0;  // forward memory traffic, in activation elements per token
  double params = 0;                // parameters owned by the op
  // Of `params`, those every TP rank holds whole although the op is split (rank_params): the
  // biases of row-parallel linears (added after the all-reduce) and the learned position table.
  double replicated_params = 0;
  // Activations saved for backward, per token. Elements are activation-dtype sized.
  double saved_tensor_elems_per_token = 0;  // inside the TP region: divided by tp
  double saved_seq_elems_per_token = 0;     // outside it: divided by tp only with SP
  double saved_mask_bytes_per_token = 0;    // 1-byte dropout masks (outside the TP region)
  double saved_fp32_tensor_elems_per_token = 0;  // fp32 logits kept by the loss (TP region)
  // Standard (non-fused) attention only: elements per token that grow with heads * seq (score
  // matrix, softmax output, dropout); zero for every other op.
  double score_elems_per_token = 0;
  double score_mask_bytes_per_token = 0;
};

// The TP/CP communication points of one transformer layer, read off the graph's edges.
// Megatron-LM's operators (Shoeybi et al. 2019, Sec. 3, Fig. 3 "f" and "g"; Korthikanti et al.
// 2022, Sec. 4.2.2 "g" and "g-bar" with sequence parallelism):
//   enter: an edge from a sequence-split op into a tensor-split op ("f"): identity forward,
//          all-reduce backward; with SP all-gather forward, reduce-scatter backward.
//   exit:  an edge from a tensor-split op to a sequence-split op ("g"): all-reduce forward,
//          identity backward; with SP reduce-scatter forward, all-gather backward.
//   attention: attention cores, each needing the K and V of the whole sequence (the context-
//          parallel ring exchange).
// GPT and Llama layers: 2 enter (before QKV and MLP-up), 2 exit (after the output projection and
// MLP-down), 1 attention.
struct LayerBoundaries {
  int enter = 0;
  int exit = 0;
  int attention = 0;
};

// Parameters of `op` one of `tp` tensor-parallel ranks holds, as Megatron-LM lays them out
// (Shoeybi et al. 2019, Sec. 3; megatron/core/tensor_parallel/layers.py): tensor-split ops (column-
// and row-parallel linears) and the vocabulary-parallel embedding and LM head divide their
// parameters by tp, except their replicated_params (row-parallel biases, learned positions), which
// every rank holds; sequence-split ops (norms) are replicated.
double rank_params(const OpSpec& op, int tp);

class LayerGraph {
 public:
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, OpSpec>;

  // Builds the graph for `model` trained at sequence length `seq_len` tokens.
  LayerGraph(const ModelSpec& model, int seq_len);

  const ModelSpec& model() const { return model_; }
  int seq_len() const { return seq_len_; }
  const Graph& graph() const { return graph_; }

  // One transformer layer's ops (layer 0's), then the ops before and after the layers.
  std::span<const OpSpec> layer_ops() const { return layer_ops_; }
  std::span<const OpSpec> pre_ops() const { return pre_ops_; }    // embedding
  std::span<const OpSpec> post_ops() const { return post_ops_; }  // final norm, LM head, loss

  // Ops in a topological order of the DAG.
  std::vector<const OpSpec*> topological_order() const;

  // Split changes and attention cores of one transformer layer (layer 0's in-edges in the graph).
  const LayerBoundaries& layer_boundaries() const { return boundaries_; }

  double params_per_layer() const { return params_per_layer_; }
  // One layer's parameters on one of `tp` tensor-parallel ranks (rank_params of its ops).
  double params_per_layer_per_rank(int tp) const;
  double embedding_params() const;   // token + learned position embeddings
  double head_params() const;        // final norm + LM head (0 for the head matrix if tied)
  double total_params() const;       // tied embeddings counted once
  // Forward FLOPs of one token through the whole model (no recomputation).
  Flops forward_flops_per_token() const;

 private:
  ModelSpec model_;
  int seq_len_;
  Graph graph_;
  std::vector<OpSpec> layer_ops_, pre_ops_, post_ops_;
  double params_per_layer_ = 0;
  LayerBoundaries boundaries_;
  // Adds the split changes on `v`'s in-edges (and `v` if an attention core) to boundaries_.
  void count_boundaries(Graph::vertex_descriptor v);
};

}  // namespace trainplan
