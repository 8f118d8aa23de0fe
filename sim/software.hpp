// Software: what a training stack launches for each op of a step, loaded from software/<name>.json
// (trainplan/software/v1). The same model, cluster and strategy cost differently under
// Megatron-core (fused kernels) and plain PyTorch eager: which kernels run, how many, how much
// host time each costs, how the loss and the optimizer are implemented, which collectives the
// stack overlaps with compute, and how its allocator rounds. Units converted once at load.
#pragma once
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/model_spec.hpp"
#include "sim/op_costs.hpp"
#include "sim/strategy.hpp"
#include "sim/units.hpp"

namespace trainplan {

// A memory-bound op as the stack runs it: the measured kernel family whose time it takes, how many
// times that kernel's time on the op's tensor (passes), and how many kernels it launches.
struct MemOpImpl {
  MemKernel kernel = MemKernel::add;
  double passes_fwd = 0, passes_bwd = 0;
  int kernels_fwd = 0, kernels_bwd = 0;
};

// Each memory-bound op of a step and the tensor its passes are counted on.
struct MemOps {
  MemOpImpl layer_norm;         // each LayerNorm; tensor: tokens x hidden residual stream
  MemOpImpl rms_norm;           // each RMSNorm; tensor: tokens x hidden residual stream
  MemOpImpl gelu;               // GeLU on the MLP output; tensor: tokens x ffn activations
  MemOpImpl swiglu;             // silu(gate) * up; tensor: gate + up (tokens x 2 ffn activations)
  MemOpImpl residual;           // each residual add (with dropout/bias where fused); tokens x hidden stream
  MemOpImpl dropout;            // what dropout adds to each residual branch when the model trains with it
                                // (model dropout > 0): passes beyond the residual add; tokens x hidden stream
  MemOpImpl bias_add;           // each separate bias add of a row-parallel linear; tokens x hidden
  MemOpImpl rope;               // rotary embedding of q and k; tensor: tokens x (q + k) activations
  MemOpImpl attention_copies;   // layout copies around the attention kernel; tokens x hidden
  MemOpImpl gqa_expand;         // K/V repeated to every query head (GQA models only); tokens x hidden
  MemOpImpl cp_merge;           // context parallelism, per ring step: merging the step's partial attention output
                                // (forward; tensor: tokens x q) and accumulating dQ, dK, dV (backward;
                                // tensor: tokens x (q + 2 kv))
  MemOpImpl autocast_cast;      // each cast of the fp32 stream to 16 bits before a GEMM; tokens x hidden
  MemOpImpl cross_entropy;      // loss over the vocabulary; tensor: 16-bit logits
  MemOpImpl embedding;          // token lookup; tensor: tokens x hidden activations
  MemOpImpl embedding_grad;     // dense embedding gradient per micro-batch; tensor: fp32 table
  MemOpImpl grad_accumulation;  // per micro-batch: gradients into the accumulation buffer; fp32 params
  MemOpImpl weight_cast;        // low-precision copies of the weights; fp32 params (see Software)
  MemOpImpl optimizer;          // per step; tensor: fp32 parameters this rank updates
  MemOpImpl fused_split;        // optional key: the backward of splitting a fused GEMM's output (QKV, gate/up)
                                // into its parts where the stack's split does more than a concatenation;
                                // charged once per part, tensor: the fused output (tokens x its width / tp)
  // Optional key: the clamps of a clamped gated activation's halves (ModelSpec::activation_clamp)
  // where the stack runs them outside its activation kernel; tensor: the activation's input (gate +
  // up). Default: plain PyTorch, one clamp per half, each reading and writing its half (forward, 4 B
  // per element: 0.67 of an add pass) and, backward, reading the gradient and the saved input and
  // writing the gradient (6 B: one pass). A stack with kernels here keeps the clamp's input for its
  // backward beside the activation's own (memory_model.cpp); all zero: clamped inside the kernel.
  MemOpImpl glu_clamp{MemKernel::add, 0.67, 1, 2, 2};
  // Optional key: RoPE where the model scales its cos and sin (ModelSpec::rope_attention_factor != 1,
  // YaRN) and the stack's rotation cannot take the factor; tensor as `rope`. Absent: `rope`, the
  // stack folding the factor into its cos and sin tables (Hugging Face's rotary embedding does).
  std::optional<MemOpImpl> rope_scaled;
};

// What the stack runs around an MoE layer's experts (the profile's optional "moe" object; the
// defaults are the plain PyTorch ops, each moving its tensor once: a gather or scatter copy reads and
// writes it, 2 of the add kernel's 3 bytes per element, 0.67 passes).
struct MoeOps {
  // The router's scoring (softmax or sigmoid) and top-k over fp32 logits; tensor: tokens x experts
  // x 4 B. Default: read once per kernel, two kernels each way.
  MemOpImpl router{MemKernel::add, 0.67, 0.67, 2, 2};
  // The routed token copies gathered into expert order before the dispatch (and sorted by local
  // expert after it); tensor: routed copies x hidden activations.
  MemOpImpl permute{MemKernel::add, 0.67, 0.67, 1, 1};
  // The experts' outputs scaled by their routing weights and summed back per token after the
  // combine; tensor: routed copies x hidden activations.
  MemOpImpl unpermute{MemKernel::add, 0.67, 0.67, 1, 1};
  // The experts' output biases (MoeSpec::expert_bias) where added outside the grouped GEMM; tensor:
  // this rank's received rows x hidden; kernels per local expert. Default: plain PyTorch, each
  // expert's rows plus its bias (an add pass, one kernel each), the bias gradient a sum over the
  // rows (reads the gradient once: 0.33 of a pass).
  MemOpImpl expert_bias{MemKernel::add, 1, 0.33, 1, 1};
  // The shared experts run while the dispatch all-to-all is in flight (Megatron-core
  // --moe-shared-expert-overlap); else after it.
  bool shared_expert_overlap = false;
  // The host launches a grouped GEMM as one GEMM per local expert (Transformer Engine's
  // GroupedLinear: a cuBLAS call per expert, each expert's input quantized on its own under FP8)
  // rather than one grouped kernel: the launches, not the GPU time, grow with the local experts.
  bool gemm_per_expert = false;
  // Host time per expert GEMM beyond its kernel launch where they are launched per expert (the
  // GroupedLinear's loops over per-expert quantizers and weights, the cuBLASLt heuristic query and
  // descriptors per GEMM, stream and event calls); the profile's "host_per_expert_gemm_us".
  Seconds host_per_expert_gemm = 0;
  // A dropless dispatch waits on the host for the token counts (Megatron-core's alltoall and
  // HybridEP dispatchers synchronise once per MoE layer forward to size the all-to-all): the host
  // cannot launch the experts ahead while the attention before them runs, so a layer's forward
  // costs its part before the dispatch and its part from the dispatch on, each the longer of its
  // GPU and host time. A capacity factor (static sizes) needs no such wait.
  bool dropless_dispatch_syncs = false;
  // The token dispatcher the stack runs when a plan or a search does not name one (the profile's
  // optional "dispatcher"; the CLI's --moe-dispatcher default for a model with experts).
  Dispatcher dispatcher = Dispatcher::alltoall;
};

// Share of a collective's time that the stack hides behind compute it can overlap with (0..1).
struct Overlap {
  double tp = 0;            // tensor/sequence-parallel collectives inside a layer
  // The backward's share where it differs (optional key "tp_backward"; unset: tp): Megatron's
  // asynchronous input-gradient all-reduce of a column-parallel linear runs behind that linear's
  // weight-gradient GEMM, while the forward's all-reduces stay inline.
  std::optional<double> tp_backward;
  double backward_tp() const { return tp_backward.value_or(tp); }
  double dp = 0;            // gradient reduction (all-reduce / reduce-scatter) during the backward
  double param_gather = 0;  // ZeRO-1/2 all-gather of updated parameters (next step's forward)
  double zero3 = 0;         // ZeRO-3 per-layer parameter gathers and gradient reduce-scatters
  double pp = 0;            // pipeline send/recv of activations and gradients, GPipe and 1F1B
  double pp_interleaved = 0;  // the same under the interleaved schedule
  double ep = 0;            // expert all-to-alls (dispatch and combine) behind another micro-batch's
                            // compute, where the strategy overlaps them (Strategy::moe_a2a_overlap;
                            // optional key, 0: the stack cannot)
};

// How the stack runs ZeRO-3's parameter gathers and gradient reduce-scatters, where that differs
// from plain NCCL calls ("zero3" in the file, optional: without it, neither applies).
struct Zero3Impl {
  // The most bus bandwidth per GPU its ZeRO-3 collectives reach, whatever the link (0: no cap):
  // a stack that gathers parameter by parameter through a list-based all_gather with a device
  // synchronise before each call and a copy per peer after it is bound by that work, not the link.
  BytesPerSecond max_bus_bandwidth = 0;
  // Under full recomputation the parameters are gathered again for the backward after the
  // recomputed forward released them: three gathers of each unit per micro-batch, not two.
  bool regathers_for_recompute = false;
};

// How the stack runs its parallel dimensions where stacks differ from Megatron-core ("parallelism"
// in the file, optional: without it, every field keeps Megatron-core's way, the default here).
struct ParallelImpl {
  // Without sequence parallelism, every column-parallel linear that reads the residual stream
  // all-reduces its own input gradient over TP (true: a stack whose linears each wrap their input
  // in their own copy-to-TP-region), or the stack sums them and reduces once where a TP region is
  // entered (false: Megatron, one QKV and one FC1 linear).
  bool tp_reduce_per_linear = false;
  // The LM head's logits are all-gathered over TP and every TP rank computes the loss over the
  // whole vocabulary (true: a column-parallel head with gathered output), or the loss is
  // vocabulary-parallel (false: Megatron's vocab_parallel_cross_entropy).
  bool loss_on_gathered_logits = false;
  // ZeRO 0/1 gradient reduction: the stack all-reduces whole gradients once a step in elements of
  // this many bytes (e.g. 4: bf16 gradients cast to fp32 for the reduction), whatever the ZeRO
  // stage; 0: as the ZeRO stage does it (ZeroPolicy), in the gradient's own width.
  double dp_all_reduce_bytes = 0;
  // Pipeline stages: the transformer layers are split by predicted time (false), or the stack's
  // list of modules (embedding, each transformer layer, final norm, LM head) is cut into equal
  // counts, the first stages taking one more where they do not divide (true: a uniform split).
  bool pipeline_uniform_modules = false;
  // Pipeline sends with TP and without SP: each TP rank sends 1/tp of the activation and the
  // receiver all-gathers it over TP (true: Megatron's scatter/gather, Narayanan et al. 2021 Sec.
  // 4.1), or every TP rank sends the whole tensor to its peer and nothing is gathered (false).
  bool pipeline_send_scatter_gather = true;
};

// What the stack keeps in memory, per parameter and per saved tensor (read by sim/memory_model,
// the one place these bytes are turned into a per-stage figure). The defaults are Megatron-style
// mixed precision as Korthikanti et al. 2022 count it: state_bytes() of the strategy, one saved
// copy of each tensor, dropout masks, fp32 logits.
struct MemoryProfile {
  bool fp32_parameters = false;     // parameters and their .grad are fp32 tensors (autocast over an
                                    // fp32 module): 4 + 4 B, Adam moments 8 B; else state_bytes()
  double optimizer_extra_bytes = 0; // further persistent optimizer bytes per parameter (e.g. a mask)
  double weight_copy_bytes = 0;     // 16-bit weight copies autocast keeps from forward to backward
  double optimizer_temp_bytes = 0;  // transient bytes per updated parameter during the optimizer step
  bool dropout_masks = true;        // the stack applies the model's dropout and saves its 1-byte masks
                                    // (false: it trains without dropout, as trainplan exec does)
  int rms_norm_saved_stream_tensors = 1;  // stream tensors each RMSNorm saves (2: written as mul(x, rsqrt))
  int attention_output_copies = 0;    // extra tokens x hidden tensors saved around attention
  bool kv_expanded_saved = false;     // K and V are saved repeated to every query head (GQA)
  bool rope_saved_copies = false;     // RoPE'd q and k are saved as new tensors beside the projection
  bool activation_output_saved = false;  // SwiGLU: silu(gate) is saved besides gate and up
  double loss_bytes_per_logit = 4;    // bytes per logit live at the loss's peak (of one micro-batch, or
                                      // of one chunk of it with loss_chunk_bytes)
  // Optional keys (their defaults describe a stack that keeps none of these):
  double loss_chunk_bytes = 0;        // the loss computes logits chunk by chunk over the tokens, each
                                      // chunk at most this many bytes of fp32 logits (4 B per logit of
                                      // the rank's vocabulary rows); 0: the whole micro-batch at once
  double loss_input_bytes = 0;        // bytes per element of the loss's input (tokens x hidden) held at
                                      // its peak (e.g. the input itself and its gradient computed in the
                                      // forward); 0: the head GEMM's saved 16-bit input (activation width)
  double loss_bytes_per_head_param = 0;  // bytes per LM-head weight (this rank's rows) the loss holds
                                         // at its peak beyond the weight itself (e.g. its gradient
                                         // computed in the forward, a 16-bit cast made per use)
  bool loss_compute_dtype_copies = false;  // under mixed precision the loss also holds one copy in the
                                           // 16-bit compute dtype of each figure the two keys above
                                           // count in fp32 (logits: the GEMM's output, then their
                                           // gradient's cast; the LM head's cast per use); in fp32 runs
                                           // such a cast is the tensor itself
  bool weight_copies_layers_only = false;  // weight_copy_bytes covers the transformer layers only: the
                                           // embedding and the head keep no 16-bit copy
};

// Caching allocator behaviour and fixed costs, fitted on measured peaks (see each profile's source).
struct Allocator {
  double reserved_over_allocated = 1;  // peak reserved / peak allocated, for the tensor bytes
  Bytes workspace = 0;                 // cuBLAS workspaces and small buffers inside the allocator
  double safety_margin = 0;            // share of capacity kept free: reserved + runtime must fit
                                       // in capacity x (1 - margin)
};

struct Software {
  std::string name;
  std::string source;       // what the profile describes (versions, files, flags)
  std::string assumptions;  // what was assumed rather than read or measured
  // The behaviour of trainplan's own executor this profile describes: the fingerprint `trainplan
  // exec` writes into its measurement ("executor"; exec/exec.hpp kExecutorFingerprint), so that
  // `trainplan compare` can say when a run came from another executor. Empty: a stack other than
  // trainplan exec (optional key "describes_executor").
  std::string describes_executor;
  Seconds host_per_kernel = 0;  // CPU time to issue one kernel through the framework
  bool qkv_fused = true;        // one QKV GEMM per layer (false: separate Q, K, V GEMMs)
  bool gate_up_fused = true;    // SwiGLU gate and up projections as one GEMM
  double stream_bytes = 2;      // bytes per element of the residual stream (4: fp32 under autocast)
  bool autocast_casts_inputs = false;  // each GEMM reading the fp32 stream casts it to 16 bits first
  bool weight_cast_per_micro_batch = false;  // weight casts every micro-batch (else once a step)
  double fp8_saved_gemm_input_bytes = 2;  // --dtype fp8: bytes per element of each saved GEMM input
  bool fp8_lm_head = false;     // --dtype fp8: the LM head GEMM runs in FP8 too (else in 16 bits)
  bool wgrad_accumulate_fused = true;  // weight gradients accumulate in the GEMM (no extra pass)
  int gemm_kernels = 1;         // kernels per GEMM call (bias epilogue, casts)
  int vocab_multiple = 1;       // vocabulary padded to a multiple of this x tp (Megatron: 128)
  int attention_kernels_fwd = 1, attention_kernels_bwd = 1;
  // Which attention kernel the stack runs: "calibrated" (the kernel of the cluster's measured
  // "ops.attention" table) or a name in the cluster's "ops.attention_kernels" (e.g. "flash2").
  std::string attention_kernel = "calibrated";
  // The attention a plan runs where --attention is not given ("attention.default", optional): the
  // stacks of 2021-2023 (megatron-lm-2021, megatron-deepspeed) materialised the scores.
  Attention default_attention = Attention::flash;
  double fp8_quantize_passes = 0;  // fp8: add-kernel passes over each GEMM input to quantize it
  // fp8 (one scale per tensor): kernels per quantized GEMM input (Transformer Engine's current
  // scaling: zero the amax, the amax, the scale, the cast-transpose = 4); block-scaled formats
  // quantize in one kernel. Optional in the profile ("gemm.fp8_quantize_kernels"), default 1.
  int fp8_quantize_kernels = 1;
  double fp8_bwd_gemm_slowdown = 1;  // fp8: dgrad and wgrad time over the fast-accumulation GEMM's
                                     // (split accumulation in higher precision, as Transformer Engine runs them)
  MemOps mem;
  MoeOps moe;
  Overlap overlap;
  Zero3Impl zero3;
  ParallelImpl parallel;
  MemoryProfile memory;
  Allocator allocator;
};

// Vocabulary rows the LM head, the logits and the embedding table cover under this stack: the
// vocabulary padded as the stack pads it (sim/model_spec.hpp padded_vocab).
inline long long vocab_rows(const Software& sw, int vocab, int tp) { return padded_vocab(vocab, tp, sw.vocab_multiple); }

// Whether a model trained with dropout probability `model_dropout` runs dropout under this stack
// (memory.dropout_masks: it applies the model's dropout and keeps the masks). Memory and time both ask.
inline bool runs_dropout(const Software& sw, double model_dropout) { return sw.memory.dropout_masks && model_dropout > 0; }

inline constexpr const char* kSoftwareSchema = "trainplan/software/v1";

Software parse_software(const nlohmann::json& j, const std::string& file);
// `name_or_path` is a built-in name (software/<name>.json under data_dir) or a path.
Software load_software(const std::string& name_or_path, const std::filesystem::path& data_dir);
// The file load_software reads for `name_or_path` (`flag` names it in the error for an unknown name).
std::filesystem::path software_file(const std::string& name_or_path, const std::filesystem::path& data_dir,
                                    const std::string& flag = "--software");
std::vector<std::string> builtin_software(const std::filesystem::path& data_dir);

// The profile predict, search and simulate use when none is named: Megatron-core, the stack the
// published large-scale runs this tool is checked against were trained with.
inline constexpr const char* kDefaultSoftware = "megatron-core";

}  // namespace trainplan
