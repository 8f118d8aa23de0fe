// Strategy: how one training step is laid out on the GPUs. No model architecture in it.
#pragma once
#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/units.hpp"

namespace trainplan {

struct ModelSpec;
struct Cluster;

enum class Recompute { none, selective, full };
enum class ScheduleKind { gpipe, one_f_one_b, interleaved };
// flash: a fused kernel that never stores the a*s*s score matrix (FlashAttention, PyTorch SDPA);
// standard: scores materialised, softmax and dropout as separate kernels (Megatron 2021).
enum class Attention { flash, standard };
enum class Dim { tp, cp, dp, pp };
// How the data-parallel replicas combine gradients: a collective over the DP group (ring/tree
// all-reduce, or ZeRO's reduce-scatter), or parameter servers (Li et al. OSDI 2014): workers push
// gradients to S server shards and pull parameters back, with a barrier per step (ps) or without
// one (ps_async, updates applied as they arrive; param_server.hpp).
enum class DpAlgorithm { allreduce, ps, ps_async };
// Where parameter servers run: on S extra nodes of the cluster (dedicated), or on S of the job's
// own nodes, whose links then carry both worker and server traffic (colocated).
enum class PsPlacement { dedicated, colocated };
// Gradient compression on the wire (compression.hpp): none; bf16 (fp32 gradients cast to 16 bits
// for the reduction); PowerSGD of rank r (Vogels et al. 2019) with error feedback.
enum class CompressionKind { none, bf16, powersgd };
struct GradCompression {
  CompressionKind kind = CompressionKind::none;
  int rank = 0;  // PowerSGD rank r (>= 1); 0 otherwise
  bool operator==(const GradCompression&) const = default;
};
// How an MoE layer moves tokens to the ranks holding their experts (Megatron-core
// moe/token_dispatcher.py): an all-to-all over the expert-parallel group of every routed copy
// (MoEAlltoAllTokenDispatcher, NCCL); an all-gather of every rank's tokens with each rank keeping
// those of its experts and a reduce-scatter back (MoEAllGatherTokenDispatcher); or the "flex"
// dispatcher (MoEFlexTokenDispatcher over DeepEP or HybridEP), whose kernels send a token once to
// each node holding any of its experts and forward it over NVLink there.
enum class Dispatcher { alltoall, allgather, flex };
// Whether the host launches each kernel of the forward and backward or replays them from one CUDA
// graph per step (Megatron-core --cuda-graph-impl full_iteration, FullCudaGraphWrapper: the whole
// forward-backward of the iteration, the optimizer step outside it). Per-layer capture is
// Strategy::cuda_graph_modules.
enum class CudaGraphs { none, full };
// Megatron-core's per-layer CUDA graphs (--cuda-graph-impl transformer_engine or local with
// --cuda-graph-modules; TransformerConfig.cuda_graph_modules): bits of Strategy::cuda_graph_modules,
// each a region of every layer whose forward and backward kernels are captured once and replayed,
// one launch per region and pass instead of one per kernel:
//   attn            TransformerLayer._forward_attention: the input norm, the attention's
//                   projections and core, the residual add;
//   mlp             a dense layer's _forward_mlp: the pre-MLP norm, the MLP, the residual add;
//   moe             an MoE layer's _forward_mlp whole (router, dispatch, experts, combine), which
//                   Megatron-core captures only for drop-and-pad experts (fixed shapes);
//   moe_router      an MoE layer's _forward_mlp up to the router: the pre-MLP norm, the router and
//                   the shared experts where the stack does not overlap them with the dispatch;
//   moe_preprocess  with moe_router, the dispatcher's preprocessing (the routed copies' permutation).
enum GraphModule : unsigned {
  kGraphAttn = 1u,
  kGraphMlp = 2u,
  kGraphMoe = 4u,
  kGraphMoeRouter = 8u,
  kGraphMoePreprocess = 16u
};
inline constexpr GraphModule kGraphModuleList[] = {kGraphAttn, kGraphMlp, kGraphMoe, kGraphMoeRouter,
                                                   kGraphMoePreprocess};
// Megatron-core's module-level recomputation (--recompute-modules, with --recompute-granularity
// selective) beyond the core attention: bits of Strategy::recompute_modules.
//   moe_act      the routed experts' activation function (its output is not kept; Megatron-core
//                moe/experts.py, the activation wrapped in CheckpointWithoutOutput);
//   mla_up_proj  MLA's up projections and RoPE (queries, keys and values rebuilt from the latents
//                before the attention backward; multi_latent_attention.py);
//   layernorm    the outputs of the norms that are modules of their own, rebuilt before the
//                backward: an MoE layer's pre-MLP norm and MLA's input norm (transformer_layer.py,
//                CheckpointWithoutOutput). A dense layer's norms are fused into the next linear
//                (Transformer Engine's LayerNormLinear) and have no output of their own to drop;
//   mlp          a dense layer's MLP (its fused pre-MLP norm, up projection, activation and down
//                projection) re-run from its input before the backward, with its tensor-parallel
//                collectives (transformer_layer.py, tensor_parallel.checkpoint; MoE layers are
//                left alone, as Megatron-core does): NVIDIA's DeepSeek-V3 and Kimi-K2 recipes
//                recompute the large dense MLPs of their first layers this way.
enum RecomputeModule : unsigned {
  kRecomputeMoeAct = 1u,
  kRecomputeMlaUpProj = 2u,
  kRecomputeLayernorm = 4u,
  kRecomputeMlp = 8u
};
inline constexpr RecomputeModule kRecomputeModuleList[] = {kRecomputeMoeAct, kRecomputeMlaUpProj, kRecomputeLayernorm,
                                                           kRecomputeMlp};
// Every RecomputeModule bit: the list's, or-ed (one list to extend with a new module).
inline constexpr unsigned kAllRecomputeModules = [] {
  unsigned all = 0;
  for (RecomputeModule m : kRecomputeModuleList) all |= m;
  return all;
}();
// How a pipeline split is made (Strategy::pipeline_accounts). None set: by predicted time, the
// split trainplan recommends. Otherwise evenly by count, as Megatron-core splits: embedding and
// loss each count as one layer of the first / last chunk (its account flags); `layers` alone counts
// nothing but the layers, Megatron-core's default (num_layers / (pp x vp) per chunk, the embedding
// and the output layer on top of the first and last).
enum PipelineAccount : unsigned { kAccountEmbedding = 1u, kAccountLoss = 2u, kAccountLayers = 4u };
// The modules an even split counts beside the layers: 0, 1 or 2.
int counted_modules(unsigned accounts);

struct Strategy {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int vp = 1;                 // model chunks per pipeline stage (interleaved schedule only)
  int zero = 0;               // ZeRO stage 0..3 over the data-parallel group
  int micro_batch = 1;        // sequences per micro-batch per data-parallel replica
  int global_batch = 1;       // sequences per optimizer step, all replicas together
  int seq_len = 0;            // tokens per sequence
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  Dtype dtype = Dtype::bf16;
  Attention attention = Attention::flash;
  bool fp32_grad_accum = false;  // keep a 4-byte gradient buffer instead of a 16-bit one
  // Rank order, fastest-varying dimension first (Megatron's default: tp, cp, dp, pp).
  std::array<Dim, 4> order{Dim::tp, Dim::cp, Dim::dp, Dim::pp};
  DpAlgorithm dp_algorithm = DpAlgorithm::allreduce;
  int ps_servers = 1;         // parameter-server shards (nodes), with dp_algorithm ps / ps_async
  PsPlacement ps_placement = PsPlacement::dedicated;
  GradCompression grad_compression;
  // Mixture of experts (Megatron-core "MoE parallel folding", moe/README.md; parallel_state.py's
  // second RankGenerator): the experts of a pipeline stage are laid over its tp x cp x dp ranks
  // again as etp x ep x edp, edp = tp x cp x dp / (etp x ep): `ep` ranks hold different experts
  // (experts / ep each), `etp` split each expert's width, and the edp ranks holding the same expert
  // shard reduce its gradients. Defaults: no expert parallelism, etp 1 (every published recipe).
  int ep = 1, etp = 1;
  double moe_imbalance = 1.0;    // max / mean tokens per EP rank (1: balanced, as the published
                                 // benchmarks force with moe_router_force_load_balancing)
  Dispatcher dispatcher = Dispatcher::alltoall;
  double capacity_factor = 0;    // > 0: each expert takes at most tokens x top_k x C / experts
                                 // tokens, padded to that; 0: dropless
  unsigned recompute_modules = 0;  // RecomputeModule bits
  // Overlap one micro-batch's expert all-to-all with another's compute (Megatron-core
  // --overlap-moe-expert-parallel-comm, the 1F1B A2A overlap after DeepSeek-V3's DualPipe); the
  // share it hides is the software profile's overlap.ep. Off by default, as in Megatron-core.
  bool moe_a2a_overlap = false;
  // With full, passes cost their GPU time alone: no host time per launch (PlanShape::host).
  CudaGraphs cuda_graphs = CudaGraphs::none;
  // Per-layer graphs (GraphModule bits): the captured regions' kernels cost no host launches,
  // each region one (op_time.cpp). Exclusive with cuda_graphs full.
  unsigned cuda_graph_modules = 0;
  // Megatron-core's --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-
  // split (PipelineAccount bits): the embedding (loss) counts as one layer of the first (last)
  // pipeline chunk and the layers split evenly, (layers + counted) / (pp x vp) per chunk, so a
  // chunk may hold the embedding or the loss alone. 0: the transformer layers alone, split by the
  // software profile's rule (parallelism.pipeline_split).
  unsigned pipeline_accounts = 0;

  // Meaningful once validate() passed (it bounds the products, see kMaxGpus).
  int gpus() const { return dp * tp * pp * cp; }
  // Micro-batches each replica runs per step (gradient-accumulation steps).
  int micro_batches() const { return static_cast<int>(global_batch / (static_cast<long long>(dp) * micro_batch)); }
  // Tokens one rank processes per micro-batch: micro_batch x seq_len split over the CP group.
  double tokens_per_rank() const { return static_cast<double>(micro_batch) * seq_len / cp; }
  int size(Dim d) const;
  bool uses_ps() const { return dp_algorithm != DpAlgorithm::allreduce; }
  // Expert data parallelism: the ranks of a stage holding the same expert shard (validate()
  // checks that etp x ep divides tp x cp x dp).
  int edp() const { return tp * cp * dp / (etp * ep); }
};

// Largest job validate() accepts: dp x tp x pp x cp GPUs (2^24, ~100x the largest runs published),
// so that products of the sizes never overflow an int.
inline constexpr long long kMaxGpus = 1LL << 24;
// Largest global_batch x seq_len validate() accepts (2^40 tokens per step; published runs use
// about 2^24), so that token counts stay exact integers in a double and in int64 products.
inline constexpr long long kMaxTokensPerStep = 1LL << 40;

// The first rule `s` breaks for model `m`, as "<flag> <value>: <rule>", or nothing if valid.
std::optional<std::string> validate(const Strategy& s, const ModelSpec& m);

// Why one CUDA graph of the whole iteration (CudaGraphs::full) cannot replay model `m`'s experts
// with this dispatcher and capacity factor (the rule, for "--cuda-graphs full: rule"), or nullptr
// where it can: a dense model always; experts need static shapes (the flex dispatcher's pre-sized
// buffers, or a capacity factor). validate() and a search space's checks refuse by it.
const char* cuda_graphs_unavailable(const ModelSpec& m, Dispatcher dispatcher, double capacity_factor);
// The first rule the CUDA graphs of a plan or a search space break for model `m` (Megatron-core
// TransformerConfig's checks), as "--cuda-graphs full: <rule>" or "--cuda-graph-modules <value>:
// <rule>", or nothing: the whole-iteration graph and per-layer graphs exclude each other; the whole
// iteration needs fixed expert shapes (cuda_graphs_unavailable); of the per-layer `modules`
// (GraphModule bits), moe and moe_router need experts and exclude each other, moe_preprocess needs
// moe_router, moe drop-and-pad experts (a capacity factor), mlp a layer with a dense MLP. Full
// recomputation, which per-layer graphs exclude, is checked by the caller (a plan's setting, or a
// search space's list).
std::optional<std::string> cuda_graphs_error(const ModelSpec& m, CudaGraphs whole, unsigned modules,
                                             Dispatcher dispatcher, double capacity_factor);

// Why recomputing `module` does not apply to model `m` (the rule, for "--recompute-modules NAME:
// rule"), or nullptr where it does: moe_act needs experts; mla_up_proj multi-head latent
// attention; layernorm either (a norm that is a module of its own); mlp a layer with a dense MLP.
// validate() and a search space's checks refuse by it; recomputable_modules() gathers the modules
// it allows.
const char* module_unavailable(const ModelSpec& m, RecomputeModule module);
// The modules of `m` that Megatron-core's module recomputation applies to (RecomputeModule bits):
// moe_act and layernorm with experts; mla_up_proj and layernorm with multi-head latent attention;
// none for a dense model without MLA. A search tries every subset of them by default; mlp
// (module_unavailable allows it wherever a layer keeps a dense MLP) only where asked for.
unsigned recomputable_modules(const ModelSpec& m);

// The rules that need the cluster: parameter-server nodes must fit. Colocated servers live on the
// job's own nodes (ps_servers <= nodes the job spans); dedicated servers need nodes beyond the job's
// (job nodes + ps_servers <= the cluster's max_gpus / gpus_per_node). Same message format.
std::optional<std::string> validate_on(const Strategy& s, const Cluster& c);
// Nodes the job's GPUs occupy: ceil(gpus / gpus_per_node).
int job_nodes(const Strategy& s, const Cluster& c);

const char* to_string(Recompute r);
const char* to_string(ScheduleKind k);
const char* to_string(Attention a);
const char* to_string(Dim d);
const char* to_string(DpAlgorithm a);   // allreduce | ps | ps-async
const char* to_string(PsPlacement p);   // dedicated | colocated
const char* to_string(Dispatcher d);    // alltoall | allgather | flex
const char* to_string(CudaGraphs g);    // none | full
std::string recompute_modules_string(unsigned modules);  // "moe_act,mla_up_proj", "" for none
std::string cuda_graph_modules_string(unsigned modules);  // "attn,moe_router", "" for none
std::string pipeline_accounts_string(unsigned accounts);  // "embedding,loss", "layers", "" for none
std::string to_string(const GradCompression& g);  // none | bf16 | powersgd:R
// Parse the CLI/JSON spelling; std::nullopt when unknown.
std::optional<Recompute> parse_recompute(const std::string& s);
std::optional<ScheduleKind> parse_schedule(const std::string& s);
std::optional<Attention> parse_attention(const std::string& s);
std::optional<Dtype> parse_dtype(const std::string& s);
std::optional<Dim> parse_dim(const std::string& s);
std::optional<DpAlgorithm> parse_dp_algorithm(const std::string& s);
std::optional<PsPlacement> parse_ps_placement(const std::string& s);
// "none", "bf16" or "powersgd:R" with R a decimal integer >= 1 (at most 1 << 16).
std::optional<GradCompression> parse_grad_compression(const std::string& s);
std::optional<Dispatcher> parse_dispatcher(const std::string& s);
std::optional<CudaGraphs> parse_cuda_graphs(const std::string& s);
// A comma-separated list of moe_act, mla_up_proj, layernorm, mlp ("none" or "": no module); nullopt for another name.
std::optional<unsigned> parse_recompute_modules(const std::string& s);
// A comma-separated list of embedding, loss ("none" or "": neither); nullopt for another name.
std::optional<unsigned> parse_pipeline_accounts(const std::string& s);
// parse_recompute_modules and parse_pipeline_accounts over a list already split at its commas (the
// command line splits it once, refusing an empty or repeated item there): {"none"} names nothing.
std::optional<unsigned> parse_recompute_module_items(const std::vector<std::string>& items);
// A comma-separated list of attn, mlp, moe, moe_router, moe_preprocess ("none" or "": none).
std::optional<unsigned> parse_cuda_graph_modules(const std::string& s);
std::optional<unsigned> parse_cuda_graph_module_items(const std::vector<std::string>& items);
std::optional<unsigned> parse_pipeline_account_items(const std::vector<std::string>& items);

// Serialises in the "strategy" object of trainplan/prediction/v1. The data-parallel algorithm keys
// (dp_algorithm, ps_servers, ps_placement, grad_compression) and the expert keys (ep, etp,
// moe_imbalance, moe_dispatcher, capacity_factor, recompute_modules) are written only when they
// differ from the defaults (allreduce, no compression, no expert parallelism), so files written
// before them keep their bytes; reading treats each as optional with that default.
nlohmann::json to_json(const Strategy& s);
// Reads that object back (used by --plan). Throws InputError naming `file` and the field.
Strategy strategy_from_json(const nlohmann::json& j, const std::string& file);

// One-line human description, e.g. "dp8 tp8 pp4 vp3 cp1 zero1 mb2 gb1792 full 1f1b sp".
std::string describe(const Strategy& s);

}  // namespace trainplan
