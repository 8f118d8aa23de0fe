#include "sim/strategy.hpp"

#include <fmt/format.h>

#include <bit>
#include <charconv>
#include <iterator>
#include <span>

#include "sim/check.hpp"
#include "sim/cluster.hpp"
#include "sim/json_reader.hpp"
#include "sim/model_spec.hpp"
#include "sim/zero_policy.hpp"

namespace trainplan {

using nlohmann::json;

int Strategy::size(Dim d) const {
  switch (d) {
    case Dim::tp: return tp;
    case Dim::cp: return cp;
    case Dim::dp: return dp;
    case Dim::pp: return pp;
  }
  return 1;
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}
const char* to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
  }
  return "?";
}
const char* to_string(Attention a) { return a == Attention::flash ? "flash" : "standard"; }
const char* to_string(Dim d) {
  switch (d) {
    case Dim::tp: return "tp";
    case Dim::cp: return "cp";
    case Dim::dp: return "dp";
    case Dim::pp: return "pp";
  }
  return "?";
}

const char* to_string(DpAlgorithm a) {
  switch (a) {
    case DpAlgorithm::allreduce: return "allreduce";
    case DpAlgorithm::ps: return "ps";
    case DpAlgorithm::ps_async: return "ps-async";
  }
  return "?";
}
const char* to_string(PsPlacement p) { return p == PsPlacement::dedicated ? "dedicated" : "colocated"; }
const char* to_string(CudaGraphs g) { return g == CudaGraphs::full ? "full" : "none"; }
const char* to_string(Dispatcher d) {
  switch (d) {
    case Dispatcher::alltoall: return "alltoall";
    case Dispatcher::allgather: return "allgather";
    case Dispatcher::flex: return "flex";
  }
  return "?";
}

namespace {
using NamedBit = std::pair<const char*, unsigned>;
constexpr NamedBit kRecomputeModules[] = {
    {"moe_act", kRecomputeMoeAct},
    {"mla_up_proj", kRecomputeMlaUpProj},
    {"layernorm", kRecomputeLayernorm},
    {"mlp", kRecomputeMlp}};
static_assert(std::size(kRecomputeModules) == std::size(kRecomputeModuleList), "every recompute module has a name");
constexpr NamedBit kGraphModules[] = {{"attn", kGraphAttn},
                                      {"mlp", kGraphMlp},
                                      {"moe", kGraphMoe},
                                      {"moe_router", kGraphMoeRouter},
                                      {"moe_preprocess", kGraphMoePreprocess}};
static_assert(std::size(kGraphModules) == std::size(kGraphModuleList), "every graph module has a name");
constexpr NamedBit kPipelineAccounts[] = {
    {"embedding", kAccountEmbedding}, {"loss", kAccountLoss}, {"layers", kAccountLayers}};

// The names of `bits`' set bits, comma-separated in the table's order.
std::string bits_string(unsigned bits, std::span<const NamedBit> names) {
  std::string out;
  for (const auto& [name, bit] : names) {
    if (!(bits & bit)) continue;
    if (!out.empty()) out += ',';
    out += name;
  }
  return out;
}

// The items of a comma-separated list, empty ones included ("a,,b" has three).
std::vector<std::string> comma_items(const std::string& s) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t end = std::min(s.find(',', start), s.size());
    items.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

// The bits of a list of the table's names ({"none"}: no bit); nullopt for another name.
std::optional<unsigned> parse_bit_items(const std::vector<std::string>& items, std::span<const NamedBit> names) {
  if (items.size() == 1 && items[0] == "none") return 0u;
  unsigned out = 0;
  for (const std::string& item : items) {
    bool known = false;
    for (const auto& [name, bit] : names) {
      if (item == name) out |= bit, known = true;
    }
    if (!known) return std::nullopt;
  }
  return out;
}

// A comma-separated list of the table's names ("none" or "": no bit); nullopt for another name.
std::optional<unsigned> parse_bits(const std::string& s, std::span<const NamedBit> names) {
  if (s.empty()) return 0u;
  return parse_bit_items(comma_items(s), names);
}
}  // namespace

std::string recompute_modules_string(unsigned modules) { return bits_string(modules, kRecomputeModules); }
std::optional<unsigned> parse_recompute_modules(const std::string& s) { return parse_bits(s, kRecomputeModules); }
std::optional<unsigned> parse_recompute_module_items(const std::vector<std::string>& items) {
  return parse_bit_items(items, kRecomputeModules);
}
std::string cuda_graph_modules_string(unsigned modules) { return bits_string(modules, kGraphModules); }
std::optional<unsigned> parse_cuda_graph_modules(const std::string& s) { return parse_bits(s, kGraphModules); }
std::optional<unsigned> parse_cuda_graph_module_items(const std::vector<std::string>& items) {
  return parse_bit_items(items, kGraphModules);
}
std::string pipeline_accounts_string(unsigned accounts) { return bits_string(accounts, kPipelineAccounts); }
std::optional<unsigned> parse_pipeline_accounts(const std::string& s) { return parse_bits(s, kPipelineAccounts); }
std::optional<unsigned> parse_pipeline_account_items(const std::vector<std::string>& items) {
  return parse_bit_items(items, kPipelineAccounts);
}
int counted_modules(unsigned accounts) { return std::popcount(accounts & (kAccountEmbedding | kAccountLoss)); }

std::optional<CudaGraphs> parse_cuda_graphs(const std::string& s) {
  if (s == "none") return CudaGraphs::none;
  if (s == "full") return CudaGraphs::full;
  return std::nullopt;
}
std::optional<Dispatcher> parse_dispatcher(const std::string& s) {
  if (s == "alltoall") return Dispatcher::alltoall;
  if (s == "allgather") return Dispatcher::allgather;
  if (s == "flex") return Dispatcher::flex;
  return std::nullopt;
}
std::string to_string(const GradCompression& g) {
  switch (g.kind) {
    case CompressionKind::none: return "none";
    case CompressionKind::bf16: return "bf16";
    case CompressionKind::powersgd: return fmt::format("powersgd:{}", g.rank);
  }
  return "?";
}

std::optional<DpAlgorithm> parse_dp_algorithm(const std::string& s) {
  if (s == "allreduce") return DpAlgorithm::allreduce;
  if (s == "ps") return DpAlgorithm::ps;
  if (s == "ps-async") return DpAlgorithm::ps_async;
  return std::nullopt;
}
std::optional<PsPlacement> parse_ps_placement(const std::string& s) {
  if (s == "dedicated") return PsPlacement::dedicated;
  if (s == "colocated") return PsPlacement::colocated;
  return std::nullopt;
}
std::optional<GradCompression> parse_grad_compression(const std::string& s) {
  if (s == "none") return GradCompression{};
  if (s == "bf16") return GradCompression{CompressionKind::bf16, 0};
  const std::string prefix = "powersgd:";
  if (s.size() <= prefix.size() || s.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  int r = 0;
  const char* first = s.data() + prefix.size();
  const char* last = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(first, last, r);
  if (ec != std::errc() || ptr != last || r < 1 || r > (1 << 16)) return std::nullopt;
  return GradCompression{CompressionKind::powersgd, r};
}

std::optional<Recompute> parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  return std::nullopt;
}
std::optional<ScheduleKind> parse_schedule(const std::string& s) {
  if (s == "gpipe") return ScheduleKind::gpipe;
  if (s == "1f1b") return ScheduleKind::one_f_one_b;
  if (s == "interleaved") return ScheduleKind::interleaved;
  return std::nullopt;
}
std::optional<Attention> parse_attention(const std::string& s) {
  if (s == "flash") return Attention::flash;
  if (s == "standard") return Attention::standard;
  return std::nullopt;
}
std::optional<Dtype> parse_dtype(const std::string& s) {
  if (s == "bf16") return Dtype::bf16;
  if (s == "fp16") return Dtype::fp16;
  if (s == "fp8") return Dtype::fp8;
  if (s == "fp32") return Dtype::fp32;
  if (s == "mxfp8") return Dtype::mxfp8;
  if (s == "nvfp4") return Dtype::nvfp4;
  return std::nullopt;
}
std::optional<Dim> parse_dim(const std::string& s) {
  if (s == "tp") return Dim::tp;
  if (s == "cp") return Dim::cp;
  if (s == "dp") return Dim::dp;
  if (s == "pp") return Dim::pp;
  return std::nullopt;
}

namespace {

// "--flag value: rule", the message of a broken rule (the value formatted as fmt prints it).
template <class Value>
std::optional<std::string> bad(const char* flag, const Value& value, const std::string& rule) {
  return fmt::format("{} {}: {}", flag, value, rule);
}

constexpr const char* kDenseModelRule = "needs a model with experts (the model is dense)";

// The expert flags of a dense model: each must keep its default (a flag is never silently ignored).
std::optional<std::string> validate_dense_experts(const Strategy& s) {
  const char* rule = kDenseModelRule;
  if (s.ep != 1) return bad("--ep", s.ep, rule);
  if (s.etp != 1) return bad("--etp", s.etp, rule);
  if (s.moe_imbalance != 1) return bad("--moe-imbalance", s.moe_imbalance, rule);
  if (s.capacity_factor != 0) return bad("--capacity-factor", s.capacity_factor, rule);
  if (s.dispatcher != Dispatcher::alltoall) return bad("--moe-dispatcher", to_string(s.dispatcher), rule);
  if (s.moe_a2a_overlap) return bad("--moe-a2a-overlap", "on", rule);
  return std::nullopt;
}

// The experts fold over a pipeline stage's ranks (RankLayout): etp x ep must divide tp x cp x dp. A
// rule of the layout alone, whatever the model: the rule broken, or none.
std::optional<std::string> expert_fold_error(const Strategy& s) {
  const long long dense = static_cast<long long>(s.tp) * s.cp * s.dp, expert = static_cast<long long>(s.etp) * s.ep;
  if (dense % expert == 0) return std::nullopt;
  return fmt::format("etp x ep ({} x {}) must divide a pipeline stage's tp x cp x dp ({} x {} x {}): the experts fold "
                     "over its ranks, edp = tp x cp x dp / (etp x ep)",
                     s.etp, s.ep, s.tp, s.cp, s.dp);
}

// Megatron-core's two rank generators (parallel_state.py) must give the same pipeline groups: the
// ranks laid out before pp in --rank-order number tp x cp x dp dense and etp x ep x edp expert
// (tp -> etp, cp -> 1, dp -> ep x edp), so those products must agree.
bool same_pipeline_groups(const Strategy& s) {
  long long dense = 1, expert = 1;
  for (Dim d : s.order) {
    if (d == Dim::pp) break;
    dense *= s.size(d);
    expert *= d == Dim::tp ? s.etp : d == Dim::dp ? static_cast<long long>(s.ep) * s.edp() : 1;
  }
  return dense == expert;
}

// The expert rules (Megatron-LM megatron/training/arguments.py and parallel_state.py).
std::optional<std::string> validate_experts(const Strategy& s, const ModelSpec& m) {
  for (RecomputeModule module : kRecomputeModuleList) {
    if (!(s.recompute_modules & module)) continue;
    if (const char* rule = module_unavailable(m, module))
      return bad("--recompute-modules", recompute_modules_string(module), rule);
  }
  if (s.recompute_modules && s.recompute == Recompute::full)
    return bad("--recompute-modules", recompute_modules_string(s.recompute_modules),
               "full recomputation already recomputes every module");
  if (!m.moe.on()) return validate_dense_experts(s);
  if (s.ep < 1) return bad("--ep", s.ep, "must be >= 1");
  if (s.etp < 1) return bad("--etp", s.etp, "must be >= 1");
  if (m.moe.experts % s.ep != 0)
    return bad("--ep", s.ep, fmt::format("must divide the model's experts ({})", m.moe.experts));
  if (auto rule = expert_fold_error(s)) return bad("--ep", s.ep, *rule);
  if (m.moe.expert_ffn % s.etp != 0)
    return bad("--etp", s.etp, fmt::format("must divide the experts' width ({})", m.moe.expert_ffn));
  const long long shared = static_cast<long long>(m.moe.shared_experts) * m.moe.shared_ffn;
  if (shared % s.tp != 0)
    return bad("--tp", s.tp, fmt::format("must divide the shared experts' width ({})", shared));
  if (s.tp > 1 && !s.sequence_parallel)
    return bad("--sequence-parallel", "off", "an MoE model with --tp > 1 needs sequence parallelism (Megatron-LM)");
  if (s.ep > 1 && s.dtype == Dtype::fp16)
    return bad("--dtype", "fp16", "expert parallelism is not supported with fp16 (Megatron-LM); use bf16");
  if (!(s.moe_imbalance >= 1 && s.moe_imbalance <= s.ep))
    return bad("--moe-imbalance", s.moe_imbalance,
               fmt::format("must be in [1, ep] = [1, {}] (max / mean tokens per expert-parallel rank)", s.ep));
  const double max_capacity = static_cast<double>(m.moe.experts) / m.moe.top_k;
  if (s.capacity_factor != 0 && !(s.capacity_factor > 0 && s.capacity_factor <= max_capacity))
    return bad("--capacity-factor", s.capacity_factor,
               fmt::format("must be in (0, experts / top_k] = (0, {}] (0: dropless)", max_capacity));
  if (s.moe_a2a_overlap && s.ep == 1)
    return bad("--moe-a2a-overlap", "on", "needs --ep > 1 (there is no expert all-to-all to overlap)");
  if (!same_pipeline_groups(s))
    return bad("--rank-order", fmt::format("{},{},{},{}", to_string(s.order[0]), to_string(s.order[1]),
                                           to_string(s.order[2]), to_string(s.order[3])),
               "the expert ranks (etp x ep x edp) must give the same pipeline groups as the dense ones "
               "(Megatron-core): order pp after tp, cp and dp");
  return std::nullopt;
}

}  // namespace

const char* cuda_graphs_unavailable(const ModelSpec& m, Dispatcher dispatcher, double capacity_factor) {
  // A graph replays fixed shapes; dropless routing sizes each expert's tokens at run time unless the
  // flex dispatcher's sync-free path pre-sizes its buffers (Megatron-core's paged stash: HybridEP,
  // the fused grouped experts, --moe-expert-rank-capacity-factor) or a capacity pads every expert.
  if (!m.moe.on() || capacity_factor > 0 || dispatcher == Dispatcher::flex) return nullptr;
  return "a dropless MoE plan needs --moe-dispatcher flex (sync-free, pre-sized expert buffers) or a "
         "--capacity-factor: a CUDA graph replays fixed shapes (Megatron-core)";
}

std::optional<std::string> cuda_graphs_error(const ModelSpec& m, CudaGraphs whole, unsigned modules,
                                             Dispatcher dispatcher, double capacity_factor) {
  const auto bad_modules = [modules](const char* rule) {
    return fmt::format("--cuda-graph-modules {}: {}", cuda_graph_modules_string(modules), rule);
  };
  if (whole == CudaGraphs::full) {
    if (modules)
      return bad_modules("per-layer graphs and --cuda-graphs full exclude each other (one graph already holds the step)");
    if (const char* rule = cuda_graphs_unavailable(m, dispatcher, capacity_factor))
      return fmt::format("--cuda-graphs full: {}", rule);
  }
  if ((modules & (kGraphMoe | kGraphMoeRouter)) && !m.moe.on()) return bad_modules("moe and moe_router need experts");
  if ((modules & kGraphMoe) && (modules & kGraphMoeRouter))
    return bad_modules("moe (the whole MoE block) and moe_router (its part up to the router) exclude each other");
  if ((modules & kGraphMoePreprocess) && !(modules & kGraphMoeRouter))
    return bad_modules("moe_preprocess is captured with moe_router (Megatron-core): name both");
  if ((modules & kGraphMoe) && capacity_factor <= 0)
    return bad_modules("moe captures the dispatch, which replays fixed shapes only with drop-and-pad experts: give "
                       "--capacity-factor (or capture moe_router,moe_preprocess)");
  if (modules & kGraphMlp)
    if (const char* rule = module_unavailable(m, kRecomputeMlp)) return bad_modules(rule);
  return std::nullopt;
}

const char* module_unavailable(const ModelSpec& m, RecomputeModule module) {
  switch (module) {
    case kRecomputeMoeAct: return m.moe.on() ? nullptr : kDenseModelRule;
    case kRecomputeMlaUpProj: return m.mla.on() ? nullptr : "needs a model with multi-head latent attention";
    case kRecomputeLayernorm:
      // Megatron-core's layernorm module recomputes only norms that are modules of their own.
      return m.moe.on() || m.mla.on() ? nullptr
                                      : "needs a model with experts or multi-head latent attention (a dense layer's "
                                        "norms are fused into the next linear and have no output of their own)";
    case kRecomputeMlp:
      for (int l = 0; l < m.layers; ++l)
        if (!m.is_moe_layer(l)) return nullptr;
      return "needs a layer with a dense MLP (every layer of the model routes to experts; Megatron-core's mlp "
             "module leaves MoE layers alone)";
  }
  return nullptr;
}

unsigned recomputable_modules(const ModelSpec& m) {
  unsigned modules = 0;
  for (const auto& [name, bit] : kRecomputeModules)
    if (!module_unavailable(m, static_cast<RecomputeModule>(bit))) modules |= bit;
  // The mlp module is searched where asked for (--recompute-modules): it touches only the dense
  // layers (DeepSeek-V3's first three), and every module doubles the settings a search tries.
  return modules & ~static_cast<unsigned>(kRecomputeMlp);
}

namespace {

// Every pipeline chunk gets a layer, or with --pipeline-accounts the layers and what it counts
// split evenly (Megatron-core asserts the same divisibility for its account flags).
std::optional<std::string> validate_pipeline_split(const Strategy& s, const ModelSpec& m) {
  const long long chunks = static_cast<long long>(s.pp) * s.vp;
  if (s.pipeline_accounts == 0) {
    if (m.layers >= chunks) return std::nullopt;
    return fmt::format("--pp {}: pp x vp ({}) must not exceed the model's layers ({}){}", s.pp, chunks, m.layers,
                       m.layers + 2 >= chunks ? "; --pipeline-accounts embedding,loss counts those as layers too" : "");
  }
  const std::string flag = "--pipeline-accounts " + pipeline_accounts_string(s.pipeline_accounts);
  if ((s.pipeline_accounts & kAccountLayers) && s.pipeline_accounts != kAccountLayers) {
    return flag + ": layers (the layers alone, split evenly) cannot be listed with embedding or loss, "
                  "which count beside them";
  }
  if (s.pp < 2) return flag + ": needs --pp >= 2 (it splits the model over pipeline chunks)";
  const int counted = counted_modules(s.pipeline_accounts);
  if (counted == 0 && m.layers % chunks != 0) {
    return fmt::format("{}: the model's layers ({}) must split evenly over pp x vp ({}) chunks", flag, m.layers, chunks);
  }
  if ((m.layers + counted) % chunks != 0) {
    return fmt::format("{}: the model's layers and the {} counted ({} + {} = {}) must split evenly over pp x vp ({}) "
                       "chunks",
                       flag, counted == 2 ? "embedding and loss" : s.pipeline_accounts == kAccountLoss ? "loss" : "embedding",
                       m.layers, counted, m.layers + counted, chunks);
  }
  return std::nullopt;
}

// Every size and count is positive, and ZeRO a known stage.
std::optional<std::string> validate_sizes(const Strategy& s) {
  if (s.dp < 1) return bad("--dp", s.dp, "must be >= 1");
  if (s.tp < 1) return bad("--tp", s.tp, "must be >= 1");
  if (s.pp < 1) return bad("--pp", s.pp, "must be >= 1");
  if (s.cp < 1) return bad("--cp", s.cp, "must be >= 1");
  if (s.vp < 1) return bad("--vp", s.vp, "must be >= 1");
  if (!ZeroPolicy::valid_stage(s.zero)) return bad("--zero", s.zero, "must be 0, 1, 2 or 3");
  if (s.micro_batch < 1) return bad("--micro-batch", s.micro_batch, "must be >= 1");
  if (s.global_batch < 1) return bad("--global-batch", s.global_batch, "must be >= 1");
  if (s.seq_len < 1) return bad("--seq", s.seq_len, "must be >= 1");
  return std::nullopt;
}

// The GPU count and the tokens per step stay within their bounds.
std::optional<std::string> validate_totals(const Strategy& s) {
  // Products in 64 bits before anything divides by them (dp x micro-batch wrapping to 0 was an FPE),
  // stopped once past the bound: four factors of up to 2^24 (a --plan file's) overflow 64 bits too.
  long long gpus = s.dp;
  for (long long factor : {s.tp, s.pp, s.cp}) gpus = gpus > kMaxGpus ? gpus : gpus * factor;
  if (gpus > kMaxGpus) {
    return bad("--gpus", fmt::format("{:.0f}", static_cast<double>(s.dp) * s.tp * s.pp * s.cp),
               fmt::format("dp x tp x pp x cp ({} x {} x {} x {}) must be at most {}", s.dp, s.tp, s.pp, s.cp, kMaxGpus));
  }
  if (static_cast<long long>(s.global_batch) * s.seq_len > kMaxTokensPerStep) {
    return bad("--global-batch", s.global_batch,
               fmt::format("global batch x sequence length ({} x {}) must be at most 2^40 tokens per step",
                           s.global_batch, s.seq_len));
  }
  return std::nullopt;
}

// Tensor parallelism splits the heads, kv_heads and MLP evenly; the batch splits evenly over the
// replicas' micro-batches; context parallelism splits the sequence into 2 x cp chunks; sequence
// parallelism needs tensor parallelism.
std::optional<std::string> validate_splits(const Strategy& s, const ModelSpec& m) {
  if (m.heads % s.tp != 0) return bad("--tp", s.tp, fmt::format("must divide the model's heads ({})", m.heads));
  if (m.kv_heads % s.tp != 0)
    return bad("--tp", s.tp, fmt::format("must divide the model's kv_heads ({})", m.kv_heads));
  if (m.ffn_hidden % s.tp != 0)
    return bad("--tp", s.tp, fmt::format("must divide the model's ffn_hidden ({})", m.ffn_hidden));
  if (s.global_batch % (static_cast<long long>(s.dp) * s.micro_batch) != 0) {
    return bad("--global-batch", s.global_batch,
               fmt::format("must be divisible by dp x micro-batch ({} x {})", s.dp, s.micro_batch));
  }
  if (s.cp > 1 && s.seq_len % (2 * s.cp) != 0)
    return bad("--cp", s.cp, fmt::format("2 x cp must divide the sequence length ({})", s.seq_len));
  if (s.sequence_parallel && s.tp == 1) return bad("--sequence-parallel", "on", "needs --tp > 1");
  return std::nullopt;
}

// Virtual stages only with the interleaved schedule, which needs them, two stages or more, and
// micro-batches that fill whole rounds of the pipeline.
std::optional<std::string> validate_schedule(const Strategy& s) {
  if (s.schedule == ScheduleKind::interleaved) {
    if (s.pp < 2) return bad("--schedule", "interleaved", "needs --pp >= 2");
    if (s.vp < 2) return bad("--vp", s.vp, "must be >= 2 with the interleaved schedule");
    if (s.micro_batches() % s.pp != 0) {
      return bad("--global-batch", s.global_batch,
                 fmt::format("interleaving needs micro-batches per replica ({}) divisible by pp ({})",
                             s.micro_batches(), s.pp));
    }
  } else if (s.vp != 1) {
    return bad("--vp", s.vp, "must be 1 unless --schedule interleaved");
  }
  return std::nullopt;
}

// The parameter-server flags only with a parameter-server algorithm, which holds the optimizer
// states itself (no ZeRO sharding of them).
std::optional<std::string> validate_parameter_servers(const Strategy& s) {
  if (s.ps_servers < 1) return bad("--ps-servers", s.ps_servers, "must be >= 1");
  if (!s.uses_ps()) {
    if (s.ps_servers != 1) return bad("--ps-servers", s.ps_servers, "needs --dp-algorithm ps or ps-async");
    if (s.ps_placement != PsPlacement::dedicated)
      return bad("--ps-placement", to_string(s.ps_placement), "needs --dp-algorithm ps or ps-async");
  } else if (ZeroPolicy::of(s.zero).shards_optimizer) {
    return bad("--dp-algorithm", to_string(s.dp_algorithm), "needs --zero 0 (the servers hold the optimizer states)");
  }
  return std::nullopt;
}

// Gradient compression: PowerSGD with a rank and over an all-reduce; bf16 only where the
// gradients are wider than 16 bits.
std::optional<std::string> validate_grad_compression(const Strategy& s) {
  const GradCompression& g = s.grad_compression;
  if (g.kind == CompressionKind::powersgd) {
    if (g.rank < 1) return bad("--grad-compression", to_string(g), "PowerSGD rank must be >= 1");
    if (ZeroPolicy::of(s.zero).reduce_scatters)
      return bad("--grad-compression", to_string(g),
                 "needs --zero 0 (PowerSGD compresses an all-reduce, not ZeRO's reduce-scatter)");
  } else if (g.rank != 0) {
    return bad("--grad-compression", to_string(g), "a rank is only given with powersgd");
  }
  if (g.kind == CompressionKind::bf16 && s.dtype != Dtype::fp32 && !s.fp32_grad_accum)
    return bad("--grad-compression", "bf16", "gradients are already 16-bit; needs --fp32-grad-accum on or --dtype fp32");
  return std::nullopt;
}

// Full-iteration and per-layer CUDA graphs: what each can replay (Megatron-core TransformerConfig).
std::optional<std::string> validate_cuda_graphs(const Strategy& s, const ModelSpec& m) {
  if (s.cuda_graph_modules && s.recompute == Recompute::full)
    return bad("--cuda-graph-modules", cuda_graph_modules_string(s.cuda_graph_modules),
               "full recomputation runs only with --cuda-graphs full (Megatron-core)");
  return cuda_graphs_error(m, s.cuda_graphs, s.cuda_graph_modules, s.dispatcher, s.capacity_factor);
}

}  // namespace

// The rules by topic, in a fixed order: the first broken rule is the one reported.
std::optional<std::string> validate(const Strategy& s, const ModelSpec& m) {
  if (auto rule = validate_sizes(s)) return rule;
  if (auto rule = validate_totals(s)) return rule;
  if (auto rule = validate_splits(s, m)) return rule;
  if (auto rule = validate_schedule(s)) return rule;
  if (auto rule = validate_pipeline_split(s, m)) return rule;
  if (auto rule = validate_experts(s, m)) return rule;
  if (auto rule = validate_cuda_graphs(s, m)) return rule;
  if (auto rule = validate_parameter_servers(s)) return rule;
  return validate_grad_compression(s);
}

int job_nodes(const Strategy& s, const Cluster& c) {
  return (s.gpus() + c.gpus_per_node - 1) / c.gpus_per_node;
}

std::optional<std::string> validate_on(const Strategy& s, const Cluster& c) {
  if (!s.uses_ps()) return std::nullopt;
  const int nodes = job_nodes(s, c);
  if (s.ps_placement == PsPlacement::colocated && s.ps_servers > nodes) {
    return fmt::format("--ps-servers {}: colocated servers must not exceed the job's nodes ({})", s.ps_servers, nodes);
  }
  const int cluster_nodes = c.max_gpus() / c.gpus_per_node;
  if (s.ps_placement == PsPlacement::dedicated && nodes + s.ps_servers > cluster_nodes) {
    return fmt::format("--ps-servers {}: dedicated servers need nodes beyond the job's {}; {} has {} nodes",
                       s.ps_servers, nodes, c.name, cluster_nodes);
  }
  return std::nullopt;
}

json to_json(const Strategy& s) {
  json order = json::array();
  for (Dim d : s.order) order.push_back(to_string(d));
  json j{{"dp", s.dp},
              {"tp", s.tp},
              {"pp", s.pp},
              {"cp", s.cp},
              {"vp", s.vp},
              {"zero", s.zero},
              {"micro_batch", s.micro_batch},
              {"global_batch", s.global_batch},
              {"micro_batches", s.micro_batches()},
              {"seq_len", s.seq_len},
              {"recompute", to_string(s.recompute)},
              {"sequence_parallel", s.sequence_parallel},
              {"schedule", to_string(s.schedule)},
              {"dtype", to_string(s.dtype)},
              {"attention", to_string(s.attention)},
              {"fp32_grad_accum", s.fp32_grad_accum},
              {"rank_order", order}};
  if (s.uses_ps()) {
    j["dp_algorithm"] = to_string(s.dp_algorithm);
    j["ps_servers"] = s.ps_servers;
    j["ps_placement"] = to_string(s.ps_placement);
  }
  if (s.grad_compression.kind != CompressionKind::none) j["grad_compression"] = to_string(s.grad_compression);
  if (s.ep != 1) j["ep"] = s.ep;
  if (s.etp != 1) j["etp"] = s.etp;
  if (s.moe_imbalance != 1) j["moe_imbalance"] = s.moe_imbalance;
  if (s.dispatcher != Dispatcher::alltoall) j["moe_dispatcher"] = to_string(s.dispatcher);
  if (s.capacity_factor != 0) j["capacity_factor"] = s.capacity_factor;
  if (s.recompute_modules != 0) j["recompute_modules"] = recompute_modules_string(s.recompute_modules);
  if (s.moe_a2a_overlap) j["moe_a2a_overlap"] = true;
  if (s.cuda_graphs != CudaGraphs::none) j["cuda_graphs"] = to_string(s.cuda_graphs);
  if (s.cuda_graph_modules != 0) j["cuda_graph_modules"] = cuda_graph_modules_string(s.cuda_graph_modules);
  if (s.pipeline_accounts != 0) j["pipeline_accounts"] = pipeline_accounts_string(s.pipeline_accounts);
  return j;
}

namespace {

// The optional expert keys of a strategy object (to_json writes them where not the default).
void read_expert_fields(const JsonObject& o, Strategy& s) {
  if (o.has("ep")) s.ep = static_cast<int>(o.integer("ep", 1, 1 << 24));
  if (o.has("etp")) s.etp = static_cast<int>(o.integer("etp", 1, 1 << 24));
  if (o.has("moe_imbalance")) s.moe_imbalance = o.number("moe_imbalance", 1, 1 << 24);
  if (o.has("moe_dispatcher"))
    s.dispatcher = *parse_dispatcher(o.choice("moe_dispatcher", {"alltoall", "allgather", "flex"}));
  if (o.has("moe_a2a_overlap")) s.moe_a2a_overlap = o.boolean("moe_a2a_overlap");
  if (o.has("capacity_factor")) s.capacity_factor = o.number("capacity_factor", 0, 1 << 24, true);
  if (auto r = o.optional_string("recompute_modules")) {
    auto parsed = parse_recompute_modules(*r);
    if (!parsed) throw o.error("recompute_modules", "must list moe_act, mla_up_proj, layernorm, mlp (comma-separated)");
    s.recompute_modules = *parsed;
  }
}

// A size or count of a strategy object: a whole number in [1, 2^24].
int size_field(const JsonObject& o, const char* key) { return static_cast<int>(o.integer(key, 1, 1 << 24)); }

// The parallel sizes, ZeRO stage and batch of a strategy object, and the products every reader
// forms from them (gpus(), micro_batches()), which must be defined: four sizes of up to 2^24
// overflowed int (and long long), and a batch not divisible by dp x micro_batch gave 0
// micro-batches. "micro_batches" (to_json writes it) must be the count the batch gives.
void read_sizes_and_batch(const JsonObject& o, Strategy& s) {
  s.dp = size_field(o, "dp");
  s.tp = size_field(o, "tp");
  s.pp = size_field(o, "pp");
  s.cp = size_field(o, "cp");
  s.vp = size_field(o, "vp");
  s.zero = static_cast<int>(o.integer("zero", 0, 3));
  s.micro_batch = size_field(o, "micro_batch");
  s.global_batch = size_field(o, "global_batch");
  // Each partial product is at most 2^24 x 2^24 here.
  long long gpus = s.dp;
  for (int factor : {s.tp, s.pp, s.cp}) {
    gpus *= factor;
    if (gpus > kMaxGpus) {
      throw o.error("dp", fmt::format("dp x tp x pp x cp ({} x {} x {} x {}) must be at most {} GPUs", s.dp, s.tp, s.pp,
                                      s.cp, kMaxGpus));
    }
  }
  const long long replica_batch = static_cast<long long>(s.dp) * s.micro_batch;
  if (s.global_batch % replica_batch != 0) {
    throw o.error("global_batch", fmt::format("must be divisible by dp x micro_batch ({} x {})", s.dp, s.micro_batch));
  }
  if (o.has("micro_batches") && o.integer("micro_batches", 1, 1 << 24) != s.global_batch / replica_batch) {
    throw o.error("micro_batches", fmt::format("must equal global_batch / (dp x micro_batch) = {} / ({} x {}) = {}",
                                               s.global_batch, s.dp, s.micro_batch, s.global_batch / replica_batch));
  }
}

// "rank_order": tp, cp, dp and pp, each once, fastest-varying first.
std::array<Dim, 4> read_rank_order(const JsonObject& o) {
  const json& order = o.raw("rank_order");
  if (!order.is_array() || order.size() != 4) throw o.error("rank_order", "must list tp, cp, dp, pp once each");
  std::array<Dim, 4> out{};
  bool used[4] = {false, false, false, false};
  for (std::size_t k = 0; k < 4; ++k) {
    auto d = order[k].is_string() ? parse_dim(order[k].get<std::string>()) : std::nullopt;
    if (!d || used[static_cast<int>(*d)]) throw o.error("rank_order", "must list tp, cp, dp, pp once each");
    used[static_cast<int>(*d)] = true;
    out[k] = *d;
  }
  return out;
}

// The optional data-parallel keys (to_json writes them where not the default): the parameter
// servers and the gradient compression.
void read_data_parallel_fields(const JsonObject& o, Strategy& s) {
  if (o.has("dp_algorithm")) s.dp_algorithm = *parse_dp_algorithm(o.choice("dp_algorithm", {"allreduce", "ps", "ps-async"}));
  if (o.has("ps_servers")) s.ps_servers = static_cast<int>(o.integer("ps_servers", 1, 1 << 20));
  if (o.has("ps_placement")) s.ps_placement = *parse_ps_placement(o.choice("ps_placement", {"dedicated", "colocated"}));
  if (auto g = o.optional_string("grad_compression")) {
    auto parsed = parse_grad_compression(*g);
    if (!parsed) throw o.error("grad_compression", "must be none, bf16 or powersgd:R with R >= 1");
    s.grad_compression = *parsed;
  }
}

// The optional "pipeline_accounts" key (to_json writes it where not none).
void read_pipeline_accounts(const JsonObject& o, Strategy& s) {
  if (auto a = o.optional_string("pipeline_accounts")) {
    auto parsed = parse_pipeline_accounts(*a);
    if (!parsed) throw o.error("pipeline_accounts", "must list embedding, loss (comma-separated), or be layers or none");
    s.pipeline_accounts = *parsed;
  }
}

}  // namespace

Strategy strategy_from_json(const json& j, const std::string& file) {
  JsonObject o(j, file, "strategy");
  Strategy s;
  read_sizes_and_batch(o, s);
  s.seq_len = size_field(o, "seq_len");
  s.recompute = *parse_recompute(o.choice("recompute", {"none", "selective", "full"}));
  s.sequence_parallel = o.boolean("sequence_parallel");
  s.schedule = *parse_schedule(o.choice("schedule", {"gpipe", "1f1b", "interleaved"}));
  s.dtype = *parse_dtype(o.choice("dtype", {"bf16", "fp16", "fp8", "fp32", "mxfp8", "nvfp4"}));
  s.attention = *parse_attention(o.choice("attention", {"flash", "standard"}));
  s.fp32_grad_accum = o.boolean("fp32_grad_accum");
  if (o.has("cuda_graphs")) s.cuda_graphs = *parse_cuda_graphs(o.choice("cuda_graphs", {"none", "full"}));
  if (auto g = o.optional_string("cuda_graph_modules")) {
    auto parsed = parse_cuda_graph_modules(*g);
    if (!parsed)
      throw o.error("cuda_graph_modules",
                    "must list attn, mlp, moe, moe_router, moe_preprocess (comma-separated) or be none");
    s.cuda_graph_modules = *parsed;
  }
  s.order = read_rank_order(o);
  read_data_parallel_fields(o, s);
  read_expert_fields(o, s);
  if (auto rule = expert_fold_error(s)) throw o.error("ep", *rule);
  read_pipeline_accounts(o, s);
  o.finish();
  return s;
}

std::string describe(const Strategy& s) {
  std::string out = fmt::format("dp{} tp{} pp{}", s.dp, s.tp, s.pp);
  if (s.vp > 1) out += fmt::format(" vp{}", s.vp);
  if (s.cp > 1) out += fmt::format(" cp{}", s.cp);
  out += fmt::format(" zero{} mb{} {} {}", s.zero, s.micro_batch, to_string(s.recompute), to_string(s.schedule));
  if (s.sequence_parallel) out += " sp";
  if (s.ep > 1) out += fmt::format(" ep{}", s.ep);
  if (s.etp > 1) out += fmt::format(" etp{}", s.etp);
  if (s.moe_imbalance != 1) out += fmt::format(" imb{}", s.moe_imbalance);
  if (s.capacity_factor > 0) out += fmt::format(" cf{}", s.capacity_factor);
  if (s.dispatcher != Dispatcher::alltoall) out += fmt::format(" {}", to_string(s.dispatcher));
  if (s.moe_a2a_overlap) out += " a2a-overlap";
  if (s.cuda_graphs == CudaGraphs::full) out += " graphs";
  if (s.cuda_graph_modules) out += " graphs:" + cuda_graph_modules_string(s.cuda_graph_modules);
  if (s.recompute_modules) out += " rc:" + recompute_modules_string(s.recompute_modules);
  if (s.pipeline_accounts) out += " split+" + pipeline_accounts_string(s.pipeline_accounts);
  if (s.uses_ps())
    out += fmt::format(" {}{}{}", to_string(s.dp_algorithm), s.ps_servers,
                       s.ps_placement == PsPlacement::colocated ? "c" : "");
  if (s.grad_compression.kind != CompressionKind::none) {
    out += ' ';
    out += to_string(s.grad_compression);  // (not " " + string: GCC 12 warns on it, -Wrestrict)
  }
  return out;
}

}  // namespace trainplan
