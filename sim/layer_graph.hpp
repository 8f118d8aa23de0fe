// LayerGraph: a model's training ops as a Boost.Graph DAG (data dependencies, forward direction).
// Each op carries per-token forward FLOPs, memory traffic, parameters and the activations it saves
// for backward, for the whole (unsharded) op at the graph's sequence length. Cost models scale
// these by tokens, TP/CP/SP and dtype; see predict.cpp.
//
// Layers come in a few KINDS (LayerKind: a dense or an MoE MLP, and the attention window: full,
// sliding or chunked); every layer of a kind has the same ops. Cost models read each kind's op
// template (kind_ops()) once and multiply by the layers of that kind a chunk holds (kind_counts());
// a dense model with full attention has one kind, whose ops are layer_ops(). The full graph (every
// layer's ops and their data edges) decides each kind's tensor-parallel collectives: an edge along
// which a tensor's split changes (tensor region <-> sequence/replicated region) is where Megatron
// puts a TP communication operator (boundaries()); the cost model charges collectives from those.
#pragma once
#include <array>
#include <boost/graph/adjacency_list.hpp>
#include <cstdint>
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
  // Multi-head latent attention (ModelSpec::mla) in place of qkv:
  q_down,      // h -> q_lora_rank latent (replicated weights, on the sequence-split stream)
  q_up,        // q latent (or h, without q_lora_rank) -> heads x (nope + rope) queries
  kv_down,     // h -> kv_lora_rank latent + the shared rotary key part
  kv_up,       // kv latent -> heads x (nope keys + values)
  // Mixture of experts (ModelSpec::moe) in place of the MLP:
  router,      // logits h -> experts, top-k choice (replicated weights)
  expert_up,   // routed experts' up (and gate) projection, grouped by expert
  expert_activation,
  expert_down,
  shared_up,   // shared experts, tensor-parallel like a dense MLP
  shared_activation,
  shared_down,
  mtp_proj,    // multi-token prediction: [norm(h); norm(embedding)] 2h -> h
};
const char* to_string(OpKind k);

// How an op's work and tensors are split by tensor parallelism.
enum class Split {
  tensor,      // inside the TP region: divided by tp (column/row-parallel matmuls, attention heads)
  sequence,    // outside it: replicated across TP ranks, divided by tp only with sequence parallelism
  expert,      // routed experts: parameters split over the expert-parallel ranks (ep x etp); the
               // tokens are those routed to the rank (PlanShape's MoeShape), not a share of the stream
};

// A layer kind: what separates one layer's ops from another's.
struct LayerKind {
  bool moe = false;
  AttentionWindow window = AttentionWindow::full;
  bool operator==(const LayerKind&) const = default;
};
const char* to_string(const LayerKind& k);  // "dense", "moe", "dense sliding", ...

struct OpSpec {
  std::string name;      // e.g. "layer3.qkv"
  OpKind kind = OpKind::norm;
  int layer = -1;        // transformer layer index; -1 before the first layer, `layers` after the last
  Split split = Split::tensor;
  bool matmul = false;   // compute-bound kernel (a GEMM or attention), timed from the ops tables
  Flops flops_per_token = 0;        // forward FLOPs per token (backward: 2x); attention cores
                                    // over the unmasked sequence (full_attention_flops)
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
  // Elements per token of the op's output (where it leaves the op for the next: what a TP
  // collective on an edge out of it moves).
  double out_width = 0;
};

// An op's forward FLOPs per token under the causal convention: an attention core's
// flops_per_token count the whole score matrix (times its window's share), of which a causal mask
// leaves half (FlashAttention skips the masked blocks); every other op's count is its own.
inline constexpr double kCausalAttentionShare = 0.5;
inline Flops causal_flops_per_token(const OpSpec& op) {
  return op.kind == OpKind::attention ? kCausalAttentionShare * op.flops_per_token : op.flops_per_token;
}

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
// MLP-down), 1 attention, every crossing tensor hidden wide. Multi-head latent attention enters on
// its latents (q_lora_rank; kv_lora_rank + the rotary key part), and a routed-expert MLP crosses
// none (its tokens move by all-to-all), its shared experts two.
struct LayerBoundaries {
  static constexpr int kMax = 6;
  int enter = 0;
  int exit = 0;
  int attention = 0;
  // Elements per token of the tensor crossing each boundary, in the graph's edge order.
  std::array<double, kMax> enter_width{}, exit_width{};
};

// Parameters of `op` one of `tp` tensor-parallel ranks holds, as Megatron-LM lays them out
// (Shoeybi et al. 2019, Sec. 3; megatron/core/tensor_parallel/layers.py): tensor-split ops (column-
// and row-parallel linears) and the vocabulary-parallel embedding and LM head divide their
// parameters by tp, except their replicated_params (row-parallel biases, learned positions), which
// every rank holds; sequence-split ops (norms) are replicated. Routed experts are divided over the
// `expert_shards` = ep x etp ranks that hold them (experts / ep experts, each 1/etp).
double rank_params(const OpSpec& op, int tp, int expert_shards = 1);

// Parameter counts of a model (LayerGraph::counts()).
struct ParamCounts {
  double total = 0;      // every parameter of the model, tied embeddings once; MTP modules excluded
                         // (as published: DeepSeek-V3 671B without its 14B of MTP)
  double active = 0;     // those one token's forward uses: routed experts top_k / experts of them;
                         // the embedding table counted whole (Mixtral's, Qwen's and DeepSeek's convention)
  double embedding = 0;  // the input embedding table (gpt-oss's card counts active without it)
  double expert = 0;     // routed experts' parameters (sharded by ep x etp, reduced over edp)
  double mtp = 0;        // multi-token prediction modules (their own; embedding and head are shared)
};

class LayerGraph {
 public:
  using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, OpSpec>;

  // Builds the graph for `model` trained at sequence length `seq_len` tokens.
  LayerGraph(const ModelSpec& model, int seq_len);

  const ModelSpec& model() const { return model_; }
  int seq_len() const { return seq_len_; }
  const Graph& graph() const { return graph_; }

  // Layer kinds, in the order of their first layer; kinds_ holds at most kMaxKinds.
  static constexpr int kMaxKinds = 6;  // {dense, moe} x {full, sliding, chunked}
  using KindCounts = std::array<int, kMaxKinds>;
  int kind_count() const { return static_cast<int>(kinds_.size()); }
  const LayerKind& kind(int k) const { return kinds_[k].kind; }
  int layer_kind(int layer) const { return layer_kind_[layer]; }  // index of layer's kind
  std::span<const OpSpec> kind_ops(int k) const { return kinds_[k].ops; }
  // Split changes and attention cores of a layer of kind k (its first layer's in-edges).
  const LayerBoundaries& boundaries(int k) const { return kinds_[k].boundaries; }
  double kind_params(int k) const { return kinds_[k].params; }
  // The layers of each kind among layers [first, first + n), from prefix sums.
  KindCounts kind_counts(int first, int n) const;

  // Layer 0's ops (every layer's in a model of one kind), then the ops before and after the layers.
  std::span<const OpSpec> layer_ops() const { return kinds_.front().ops; }
  std::span<const OpSpec> pre_ops() const { return pre_ops_; }    // embedding
  std::span<const OpSpec> post_ops() const { return post_ops_; }  // final norm, LM head, loss
  // Multi-token prediction: per module its norms and 2h -> h projection, then the transformer
  // layer of kind mtp_kind(); the shared head's norm and loss follow (mtp_head_ops()). Empty
  // without MTP.
  std::span<const OpSpec> mtp_ops() const { return mtp_ops_; }
  std::span<const OpSpec> mtp_head_ops() const { return mtp_head_ops_; }
  int mtp_kind() const { return mtp_kind_; }  // -1 without MTP

  // Ops in a topological order of the DAG.
  std::vector<const OpSpec*> topological_order() const;

  // Layer 0's boundaries (every layer's in a model of one kind).
  const LayerBoundaries& layer_boundaries() const { return kinds_.front().boundaries; }

  double params_per_layer() const { return kinds_.front().params; }  // layer 0's
  // Layer 0's parameters on one of `tp` tensor-parallel ranks (rank_params of its ops).
  double params_per_layer_per_rank(int tp) const;
  // A kind's parameters on one rank: tensor-split ops over tp, routed experts over expert_shards.
  double kind_params_per_rank(int k, int tp, int expert_shards) const;
  double embedding_params() const;   // token + learned position embeddings
  double head_params() const;        // final norm + LM head (0 for the head matrix if tied)
  double total_params() const;       // tied embeddings counted once, MTP modules excluded
  ParamCounts counts() const;
  // Forward FLOPs of one token through the whole model (no recomputation): routed experts top_k
  // of them, MTP modules included (they are trained work). Two conventions for the attention
  // cores (causal_flops): forward_flops_per_token() counts the causal half of the score matrix a
  // causal model computes, the headline MFU's convention; the _full_attention form counts the whole
  // unmasked matrix, as Megatron-LM and NeMo count the FLOPs of their published MFU (Narayanan et
  // al. 2021, Eq. 3: 24Bsh^2(1 + s/6h + ...), whose s/6h term is the full QK^T and softmax*V).
  Flops forward_flops_per_token() const;
  Flops forward_flops_per_token_full_attention() const;

 private:
  // forward_flops_per_token under one convention: `flops` gives an op's count.
  Flops forward_flops(Flops (*flops)(const OpSpec&)) const;
  struct KindInfo {
    LayerKind kind;
    std::vector<OpSpec> ops;
    LayerBoundaries boundaries;
    double params = 0;
  };
  ModelSpec model_;
  int seq_len_;
  Graph graph_;
  std::vector<KindInfo> kinds_;
  std::vector<std::uint8_t> layer_kind_;
  std::vector<KindCounts> kind_prefix_;  // [l]: layers of each kind before layer l (layers + 1 rows)
  std::vector<OpSpec> pre_ops_, post_ops_, mtp_ops_, mtp_head_ops_;
  int mtp_kind_ = -1;
  int kind_of(const LayerKind& k);  // index of k, added at the end if new
  void add_layers();
  void add_mtp();
  // Adds the split changes on `v`'s in-edges (and `v` if an attention core) to `b`.
  void count_boundaries(Graph::vertex_descriptor v, LayerBoundaries& b) const;
};

}  // namespace trainplan
