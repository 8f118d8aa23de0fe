// The sharded decoder-only transformer: one model chunk (a contiguous range of layers, plus the
// embedding on the first virtual stage and the final norm, LM head and loss on the last) as held
// by one tensor- and context-parallel rank. GPT-2 style (LayerNorm, GELU, learned positions, biases) and Llama
// style (RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases).
//
// Parameters are initialised from (seed, parameter name) on the full, unsharded tensor and then
// sliced, so every layout starts from the same model. All parameters of a chunk are laid out in
// one flat buffer (and their gradients in a second), which DP/ZeRO reduce and shard as a whole.
// With ZeRO-3 over several replicas there is no flat parameter buffer: each unit (the embedding,
// each layer, the head) has a buffer of its own that a UnitGatherer (unit_gather.hpp) fills just
// before the unit runs, forward and backward, and frees after; under mixed precision in the 16-bit
// compute dtype (ModelSettings::unit_dtype), so those parameters are 16-bit tensors.
//
// GEMM fusion: a layer's q, k and v projections are one parameter (`attn.wqkv`, this TP rank's
// rows of wq, wk and wv stacked: its own heads, one GEMM, split after), and so are SwiGLU's gate
// and up projections (`mlp.wgu`); ParamInfo::parts names the unfused tensors inside, which the
// dumps and PowerSGD's per-matrix compression see (ModelChunk::tensors).
//
// The embedding and LM head hold padded_vocab(vocab, tp) rows (sim/model_spec.hpp); the padding
// rows start at zero, are never looked up, and get no logit, so they change neither the loss nor
// any gradient. With context parallelism the chunk sees the sequence positions
// zigzag_positions(seq, cp, cp_rank) (exec/kernels/ring_attention.hpp) and attends over the CP
// group by ring attention; its loss is the mean over the whole sequence.
//
// Mixture of experts (ModelSpec::moe, on the layers is_moe_layer names): the layer's MLP is
// replaced by a router, the routed experts (exec/moe.hpp: dispatched to the expert-parallel ranks
// by all-to-all) and, where the model has them, shared experts (a tensor-parallel MLP like the
// dense one, optionally gated). The router and the shared experts are parameters of the chunk; the
// routed experts this rank holds (experts / ep of each MoE layer, whole: etp 1) are a ModelChunk
// of their own (ChunkPlacement::experts, set_experts), a second flat buffer that the
// expert-data-parallel group reduces and ZeRO shards, declared and initialised by the same code.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

#include "exec/moe.hpp"
#include "exec/parallel.hpp"
#include "sim/model_spec.hpp"
#include "sim/strategy.hpp"

namespace trainplan::exec {

class ModelChunk;

struct ChunkPlacement {
  int first_layer = 0;
  int layers = 0;
  bool has_embedding = false;  // first virtual stage
  bool has_head = false;       // last virtual stage
  // The routed experts of the chunk's MoE layers alone (this EP rank's experts of each): the
  // parameters of the chunk whose layers run them (set_experts); its forward is never called.
  bool experts = false;
};

struct ParamInfo {
  std::string name;                 // e.g. "layers.3.attn.wo"; the tied LM head is "embed.wte"
  std::vector<int64_t> full_shape;  // unsharded shape
  int shard_dim = -1;               // dimension split over TP ranks, -1 when replicated
  int64_t offset = 0;               // first element in the chunk's flat buffer
  int64_t numel = 0;                // elements on this rank
  bool decay = false;               // AdamW weight decay applies (matrices)
  at::Tensor param;                 // view into the flat (or its unit's) buffer, requires grad
  // A fused parameter stacks along dim 0 this rank's rows of several tensors of the unfused model
  // (each split over TP along dim 0, so a rank keeps its own heads together). Empty: the
  // parameter is one tensor itself. `full_shape` is then the parts' full shapes stacked.
  struct Part {
    std::string name;                 // e.g. "layers.3.attn.wq"
    std::vector<int64_t> full_shape;  // its unsharded shape
    int64_t rows = 0;                 // its rows on this rank
  };
  std::vector<Part> parts;
};

// A contiguous range of a chunk's parameters that runs as one piece: the embedding, one layer, or
// the head (whose tied word embedding, on the same chunk, is the embedding unit's).
struct ParamUnit {
  int64_t begin = 0, end = 0;    // element range in the chunk's flat layout
  bool backward_values = true;   // its backward reads the parameters' values (the embedding's does not)
  at::Tensor buffer;             // with unit buffers: the storage its parameters view
  // A 16-bit unit buffer (ModelSettings::unit_dtype): the parameters' initial values in fp32, kept
  // until UnitGathers (ZeRO 3) has taken its fp32 master shard from them, then released.
  at::Tensor initial;
};

// A unit buffer's memory (ZeRO-3). Freed: the storage object stays, and the parameters' views
// of it (and the tensors autograd saved of them) keep their shapes but point at no memory.
// Allocated again: returns a tensor over the new memory to fill, with a version counter of its
// own (writing through it does not invalidate what autograd saved of the parameters).
void free_unit_memory(ParamUnit& u);
at::Tensor alloc_unit_memory(ParamUnit& u);
bool unit_present(const ParamUnit& u);

// ZeRO-3: brings a unit's parameters before the chunk reads them and frees them after.
class UnitGatherer {
 public:
  virtual ~UnitGatherer() = default;
  // `unit`'s parameters are present on return; `prefetch` (-1: none), the unit the chunk runs
  // next, may start coming meanwhile.
  virtual void need(ModelChunk& chunk, int unit, int prefetch) = 0;
  virtual void release(ModelChunk& chunk, int unit) = 0;  // no longer read until the next need
};

struct ModelSettings {
  ModelSpec spec;
  int seq_len = 0;
  int tp = 1, tp_rank = 0;
  int cp = 1, cp_rank = 0;
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  long long seed = 0;
  int64_t pad_to = 1;  // flat buffers are padded to a multiple of this (the DP size, for ZeRO)
  // ZeRO-3 over several replicas: a buffer per ParamUnit instead of the flat parameter buffer.
  bool unit_buffers = false;
  // The unit buffers' dtype, and so the parameters' (ZeRO-3 gathers them in it): the 16-bit
  // compute dtype under mixed precision, fp32 otherwise. Gradients then come back in it.
  at::ScalarType unit_dtype = at::kFloat;
  // A flat gradient buffer that the parameters' .grad are views of (autograd accumulates into it).
  // false (ZeRO-2/3 over several replicas): no buffer; each backward's gradients are fresh tensors
  // that the sharded optimizer (grad_sync.hpp) reduces into its shard bucket by bucket and releases.
  bool grad_buffer = true;
  at::Device device = at::kCPU;
  // The loss computes logits for at most this many bytes (fp32) at a time (chunked cross-entropy).
  // 1 GiB: few chunks (each costs ~15 kernels, two TP all-reduces and a pass over the head's
  // gradient): gpt2-xl's micro-batch of 4 x 1024 tokens (vocabulary 50304) is one chunk,
  // Llama-3.2-1B's 4 x 2048 (128256) four; about 2 GiB at the chunk's peak (fp32 logits, their
  // 16-bit GEMM output, the gradient's cast) against eager PyTorch's ~12 B per logit of the whole
  // micro-batch.
  int64_t loss_chunk_bytes = int64_t(1) << 30;
  // Which ops run as the fused ops of exec/kernels/fused_ops.hpp (one kernel forward, one
  // backward; CUDA kernels on GPUs, the same math in CPU loops on the CPU) instead of LibTorch:
  // fuse_composites the ops written here as several LibTorch ops (RMSNorm, RoPE, SwiGLU),
  // fuse_library_ops those LibTorch runs as one kernel (LayerNorm, GELU). Same math; results
  // agree to rounding (tests/exec/test_exec_fused.cpp). Set from ExecOptions::fused_kernels.
  bool fuse_composites = false, fuse_library_ops = false;
  // MoE layers: this rank's place in the expert-parallel group (it holds experts
  // [ep_rank E/ep, (ep_rank + 1) E/ep) of each MoE layer) and the capacity factor (0: dropless).
  int ep = 1, ep_rank = 0;
  double capacity_factor = 0;
};

// Tokens of one sequence a rank holds between layers: seq / cp, and of those 1/tp with sequence
// parallelism. Pipeline stages exchange activations of [local_seq_len, micro-batch, hidden].
int64_t local_seq_len(const ModelSettings& s);

class ModelChunk {
 public:
  ModelChunk(const ModelSettings& s, const ChunkPlacement& place, Comm& tp, Comm& cp, PhaseClock& clock);
  ~ModelChunk();
  ModelChunk(const ModelChunk&) = delete;
  ModelChunk& operator=(const ModelChunk&) = delete;

  // First chunk: `input` is tokens [b, seq] (int64, the whole sequences: each CP rank takes its
  // positions); else the previous stage's activation [local_seq_len, b, hidden]. Last chunk:
  // returns the mean loss over the micro-batch's tokens (targets [b, seq]), equal on every TP and
  // CP rank; else the activation for the next stage.
  at::Tensor forward(const at::Tensor& input, const at::Tensor& targets);

  std::vector<ParamInfo>& params() { return params_; }
  // The unfused model's tensors as this rank holds them: every parameter, a fused one split into
  // its parts (name, full shape, TP split along dim 0, element range; `param` a detached view).
  std::vector<ParamInfo> tensors() const;
  // Elements [offset, offset + numel) of the flat layout (a view of the flat or a unit buffer;
  // with unit buffers the unit must be present).
  at::Tensor values(int64_t offset, int64_t numel) const;
  int64_t numel() const { return numel_; }        // elements of the flat layout (padded)
  at::Tensor& flat() { return flat_; }            // all parameters (padded); undefined with unit buffers
  std::vector<ParamUnit>& units() { return units_; }
  void set_gatherer(UnitGatherer* g) { gatherer_ = g; }
  at::Tensor& flat_grad() { return flat_grad_; }  // their gradients (padded); undefined without grad_buffer
  const ChunkPlacement& placement() const { return place_; }
  // Gradients of parameters replicated across TP ranks; with sequence parallelism each TP rank
  // holds only its sequence slice's contribution, so these must be summed over the TP group.
  std::vector<at::Tensor> tp_partial_grads();
  // The tied word-embedding copy on this chunk (first or last chunk of a tied model), if any.
  at::Tensor tied_embedding_grad();
  // The chunk's routed experts (a chunk of the same placement with `experts` set), the
  // expert-parallel group its MoE layers dispatch over, and where they count their all-to-all
  // bytes. Needed before the first forward of a chunk with MoE layers; all must outlive it.
  void set_experts(ModelChunk& experts, Comm& ep, ExpertTraffic& traffic);

 private:
  struct Layer;
  // Declares a parameter (pass 1); returns its index in params_. Init: normal(0, init_std), or
  // the constant `fill` when init_std == 0.
  // `init_rows` (> 0): only the first init_rows rows are drawn, the rest are zero (vocabulary padding).
  int declare(const std::string& name, std::vector<int64_t> full_shape, int shard_dim, double init_std,
              double fill = 0, int64_t init_rows = -1);
  // Declares a fused matrix: the parts [rows_i, cols] (full shapes, split over TP along dim 0),
  // each initialised as declare(part name, ..., 0, init_std) would, stacked by rows per rank.
  int declare_fused(const std::string& name, const std::vector<std::pair<std::string, int64_t>>& part_rows,
                    int64_t cols, double init_std);
  void begin_unit(bool backward_values);  // the parameters declared next belong to a new unit
  std::unique_ptr<Layer> declare_layer(int layer);  // layer `layer` of the model (its global index)
  // An MLP of width f into l's MLP fields, its parameters named prefix + "w1" etc. (the dense MLP,
  // or an MoE layer's shared experts side by side).
  void declare_mlp(Layer& l, const std::string& prefix, int64_t f);
  std::unique_ptr<Layer> declare_experts(int layer);  // an expert chunk's layer: its routed experts
  void make_rope_tables();
  void need(int unit, int prefetch = -1);
  void release(int unit);
  // Backward reaches `t`, the output of unit `before` (-1: the chunk's input): unit before + 1 is
  // done, unit `before` (with `also`, the tied embedding's unit) runs next.
  void hook_boundary(at::Tensor& t, int before, int also = -1);
  void materialize();  // pass 2: allocate the flat buffers, create and initialise the views
  at::Tensor norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const;
  at::Tensor layer_forward(const Layer& l, const at::Tensor& x) const;
  at::Tensor mlp(const Layer& l, const at::Tensor& h2) const;  // full-sequence input -> summed (SP: sliced) output
  at::Tensor moe_block(const Layer& l, const at::Tensor& hn) const;  // this rank's normed tokens -> MoE output
  at::Tensor attention_core(const Layer& l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const;
  at::Tensor embed(const at::Tensor& tokens);
  at::Tensor head_loss(const at::Tensor& x, const at::Tensor& targets);
  at::Tensor to_tp(const at::Tensor& x) const;    // replicated/SP input -> full sequence on every TP rank
  at::Tensor from_tp(const at::Tensor& x) const;  // partial sums -> summed (SP: summed and sliced)

  ModelSettings s_;
  ChunkPlacement place_;
  Comm& tp_;
  Comm& cp_;
  PhaseClock& clock_;
  std::vector<ParamInfo> params_;
  struct Init {  // one per part (a plain parameter is its own one part)
    std::string name;
    std::vector<int64_t> full_shape;
    double std_dev, fill;
    int64_t rows;  // initialised rows (the rest are zero)
  };
  std::vector<std::vector<Init>> init_;  // per parameter
  at::Tensor flat_, flat_grad_;
  int64_t numel_ = 0;
  std::vector<ParamUnit> units_;
  UnitGatherer* gatherer_ = nullptr;
  int embed_unit_ = -1, first_layer_unit_ = -1, head_unit_ = -1;
  std::vector<std::unique_ptr<Layer>> layers_;
  int wte_ = -1, wpe_ = -1, norm_w_ = -1, norm_b_ = -1, head_ = -1;  // indices into params_
  at::Tensor positions_;  // global positions of this CP rank's tokens [seq / cp]
  at::Tensor rope_cos_, rope_sin_;
  int heads_local_ = 0, kv_local_ = 0, head_dim_ = 0;
  MoeSettings moe_;                  // from the spec and settings (MoE models)
  ModelChunk* experts_ = nullptr;    // set_experts
  Comm* ep_ = nullptr;
  ExpertTraffic* traffic_ = nullptr;
};

}  // namespace trainplan::exec
