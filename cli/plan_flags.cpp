#include "cli/plan_flags.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "reports/console.hpp"
#include "reports/prediction_json.hpp"
#include "reports/search_json.hpp"
#include "sim/check.hpp"
#include "sim/json_reader.hpp"

namespace trainplan::cli {

using nlohmann::json;

namespace {

bool on_off(const Flags& f, const std::string& name, bool fallback) {
  return f.get_choice(name, fallback ? "on" : "off", {"on", "off"}) == "on";
}

// The prediction inside a --plan file: a prediction itself, or the best entry of a search (with
// the search's model_spec and software), read (and so checked, every figure) by the readers
// compare and report use.
PredictionDoc plan_prediction(const std::string& path) {
  const json j = read_json_file(path);
  if (!j.is_object() || !j.contains("schema") || !j["schema"].is_string()) {
    throw InputError(fmt::format("{}: schema is missing (expected {} or {})", path, kPredictionSchema, kSearchSchema));
  }
  const std::string schema = j["schema"];
  if (schema == kSearchSchema) {
    SearchDoc search = search_from_json(j, path);
    if (search.top.empty()) throw InputError(fmt::format("{}: top is empty (the search found no feasible layout)", path));
    PredictionDoc best = std::move(search.top.front());
    if (!best.model_spec) best.model_spec = std::move(search.model_spec);
    if (best.software.empty()) best.software = search.software;
    return best;
  }
  if (schema != kPredictionSchema) {
    // JsonObject::error shows the value cut to 80 characters.
    throw JsonObject(j, path).error("schema", fmt::format("must be {} or {}", kPredictionSchema, kSearchSchema));
  }
  return prediction_from_json(j, path);
}

}  // namespace

Software read_software_flag(const Flags& f, const std::filesystem::path& data_dir, const std::string& fallback) {
  return load_software(f.get_or("software", fallback), data_dir);
}

std::string sequence_note(const ModelSpec& model) {
  if (model.seq_len_source.empty()) return "";
  return fmt::format("sequence length {}: {}; --seq sets it", model.seq_len, model.seq_len_source);
}

std::string dropout_note(const ModelSpec& model, const Software& software) {
  if (model.dropout <= 0 || runs_dropout(software, model.dropout)) return "";
  return fmt::format("{} has dropout {}; software profile {} runs none (its memory.dropout_masks is false), so "
                     "these figures leave dropout out; a profile that runs it (e.g. --software megatron-core) "
                     "costs its masks and kernels",
                     model.name, model.dropout, software.name);
}

std::string attention_kernel_note(const Cluster& cluster, const Software& software) {
  if (cluster.ops.has_attention_kernel(software.attention_kernel)) return "";
  return fmt::format("software profile {} runs attention kernel {}, which cluster {} has no table for "
                     "(ops.attention_kernels); its attention is costed with the cluster's calibrated table",
                     software.name, software.attention_kernel, cluster.name);
}

std::string parameters_text(const LayerGraph& graph) {
  const ParamCounts c = graph.counts();
  if (!parameter_counts(graph)) return fmt::format("{} parameters", format_count(c.total));
  return fmt::format("{} parameters, {} active", format_count(c.total), format_count(c.active));
}

std::optional<ParamCounts> parameter_counts(const LayerGraph& graph) {
  const ModelSpec& m = graph.model();
  if (!m.moe.on() && m.mtp_layers == 0) return std::nullopt;
  return graph.counts();
}

void print_notes(std::ostream& err, const char* command, std::initializer_list<std::string> notes) {
  for (const std::string& note : notes)
    if (!note.empty()) err << "trainplan " << command << ": note: " << printable(note) << "\n";
}

namespace {

// Model, cluster and software: the flags, else the --plan file's (`plan`), else the defaults. The
// plan's model is the spec it carries (model_spec: the file or Hugging Face config it was made
// from may be gone), else, in plans written before it carried one, its name loaded anew.
// A name taken from the plan (not given by a flag) that does not load is the plan's fault: the
// message names --plan, not a --model/--cluster/--software the user never gave.
void load_specs(const Flags& f, const std::filesystem::path& data_dir, const std::string& default_cluster,
                const std::string& default_software, const PredictionDoc* plan, PlanInputs& in) {
  const auto plan_path = f.get("plan");
  auto from_plan_file = [&](const char* flag, const std::string& name, auto load) {
    if (f.has(flag) || !plan) return load();
    try {
      return load();
    } catch (const InputError& e) {
      throw InputError(fmt::format("--plan {}: its {} '{}' does not load; give --{} NAME|FILE ({})", *plan_path, flag,
                                   name, flag, e.what()));
    }
  };
  const std::string plan_model = plan ? plan->model : "", plan_cluster = plan ? plan->cluster : "",
                    plan_software = plan ? plan->software : "";
  if (!f.has("model") && plan && plan->model_spec) {
    in.model = *plan->model_spec;
  } else {
    const std::string model_name = f.has("model") || plan_model.empty() ? f.require("model") : plan_model;
    in.model = from_plan_file("model", model_name, [&] { return load_model(model_name, data_dir); });
  }
  std::string cluster_name = f.get_or("cluster", plan_cluster.empty() ? default_cluster : plan_cluster);
  if (cluster_name.empty()) cluster_name = f.require("cluster");
  in.cluster = from_plan_file("cluster", cluster_name, [&] { return load_cluster(cluster_name, data_dir); });
  const std::string software_name = plan_software.empty() ? default_software : plan_software;
  in.software = from_plan_file("software", software_name, [&] { return read_software_flag(f, data_dir, software_name); });
}

// --rank-order tp,cp,dp,pp: each dimension once, fastest-varying first.
void read_rank_order(const std::string& order, Strategy& s) {
  bool used[4] = {false, false, false, false};
  int k = 0;
  for (const std::string& item : split_list("rank-order", order)) {
    auto d = parse_dim(item);
    if (!d || k >= 4 || used[static_cast<int>(*d)]) {
      throw InputError(fmt::format("--rank-order {}: must list tp, cp, dp, pp once each, fastest first", order));
    }
    used[static_cast<int>(*d)] = true;
    s.order[k++] = *d;
  }
  if (k != 4) throw InputError(fmt::format("--rank-order {}: must list tp, cp, dp, pp once each, fastest first", order));
}

// The layout flags over `s` (the plan's strategy, or the defaults): every field but dp.
void read_layout_flags(const Flags& f, const ModelSpec& model, bool have_plan, Strategy& s) {
  auto int_flag = [&](const char* name, int current, int lo, int hi) {
    return static_cast<int>(f.get_int(name, current, lo, hi));
  };
  s.tp = int_flag("tp", s.tp, 1, 1 << 16);
  s.pp = int_flag("pp", s.pp, 1, 1 << 16);
  s.cp = int_flag("cp", s.cp, 1, 1 << 16);
  s.vp = int_flag("vp", s.vp, 1, 1 << 10);
  s.zero = int_flag("zero", s.zero, 0, 3);
  s.micro_batch = int_flag("micro-batch", s.micro_batch, 1, 1 << 20);
  if (auto gb = f.get_optional_int("global-batch", 1, 1 << 30)) {
    s.global_batch = static_cast<int>(*gb);
  } else if (!have_plan) {
    throw InputError(fmt::format("--global-batch: required for 'trainplan {}' (sequences per optimizer step)", f.command()));
  }
  s.seq_len = int_flag("seq", have_plan ? s.seq_len : model.seq_len, 1, 1 << 24);
  s.recompute = *parse_recompute(f.get_choice("recompute", to_string(s.recompute), {"none", "selective", "full"}));
  s.sequence_parallel = on_off(f, "sequence-parallel", s.sequence_parallel);
  const ScheduleKind default_schedule = (!have_plan && s.vp > 1) ? ScheduleKind::interleaved : s.schedule;
  s.schedule = *parse_schedule(f.get_choice("schedule", to_string(default_schedule), {"gpipe", "1f1b", "interleaved"}));
  s.dtype = *parse_dtype(f.get_choice("dtype", to_string(s.dtype), {"bf16", "fp16", "fp8", "fp32", "mxfp8", "nvfp4"}));
  s.attention = *parse_attention(f.get_choice("attention", to_string(s.attention), {"flash", "standard"}));
  s.fp32_grad_accum = on_off(f, "fp32-grad-accum", s.fp32_grad_accum);
  s.cuda_graphs = read_cuda_graphs(f, s.cuda_graphs);
  s.cuda_graph_modules = read_cuda_graph_modules(f, s.cuda_graph_modules);
  s.dp_algorithm = *parse_dp_algorithm(f.get_choice("dp-algorithm", to_string(s.dp_algorithm), {"allreduce", "ps", "ps-async"}));
  s.ps_servers = int_flag("ps-servers", s.ps_servers, 1, 1 << 20);
  s.ps_placement = *parse_ps_placement(f.get_choice("ps-placement", to_string(s.ps_placement), {"dedicated", "colocated"}));
  if (auto g = f.get("grad-compression")) {
    auto parsed = parse_grad_compression(*g);
    if (!parsed) throw InputError(fmt::format("--grad-compression {}: must be none, bf16 or powersgd:R with R an integer in [1, 65536]", *g));
    s.grad_compression = *parsed;
  }
  if (auto order = f.get("rank-order")) read_rank_order(*order, s);
  if (auto a = f.get("pipeline-accounts")) {
    // Split once: split_list refuses an empty or repeated item, as for every list flag.
    auto parsed = parse_pipeline_account_items(split_list("pipeline-accounts", *a));
    if (!parsed) {
      throw InputError(
          fmt::format("--pipeline-accounts {}: must be none, layers, or a comma-separated list of embedding, loss", *a));
    }
    s.pipeline_accounts = *parsed;
  }
}

// The expert settings a plan and a search space share, over `x` (Strategy and ExpertSpace name
// them alike): --moe-imbalance --moe-dispatcher --moe-a2a-overlap --capacity-factor
// --recompute-modules.
template <class Settings>
void read_moe_settings(const Flags& f, Settings& x) {
  x.moe_imbalance = f.get_double("moe-imbalance", x.moe_imbalance, 1, 1 << 16);
  x.dispatcher =
      *parse_dispatcher(f.get_choice("moe-dispatcher", to_string(x.dispatcher), {"alltoall", "allgather", "flex"}));
  x.moe_a2a_overlap = on_off(f, "moe-a2a-overlap", x.moe_a2a_overlap);
  x.capacity_factor = f.get_double("capacity-factor", x.capacity_factor, 0, 1 << 16);
  if (auto r = f.get("recompute-modules")) {
    // Split once: split_list refuses an empty or repeated item, as for every list flag.
    auto parsed = parse_recompute_module_items(split_list("recompute-modules", *r));
    if (!parsed) {
      throw InputError(fmt::format(
          "--recompute-modules {}: must be none or a comma-separated list of moe_act, mla_up_proj, layernorm, mlp", *r));
    }
    x.recompute_modules = *parsed;
  }
}

// The dispatcher a plan or a search runs when --moe-dispatcher is not given: the software
// profile's for a model with experts; alltoall (the value validate() requires) for a dense one.
Dispatcher default_dispatcher(const ModelSpec& model, const Software& software) {
  return model.moe.on() ? software.moe.dispatcher : Dispatcher::alltoall;
}

// More pipeline chunks than layers, by one or two: Megatron-core runs such a layout only with its
// account flags counting the embedding and the loss as layers (NVIDIA's recipes run Llama 3.1
// 405B's 126 layers over pp 16 x vp 8 that way), so without --pipeline-accounts that split is
// taken: both where two chunks are over, the loss (the heavier: the LM head and the loss) where
// one is. Returns the note saying so; empty, and `s` unchanged, otherwise.
std::string account_extra_chunks(const ModelSpec& model, Strategy& s) {
  const long long over = static_cast<long long>(s.pp) * s.vp - model.layers;
  if (s.pipeline_accounts != 0 || s.pp < 2 || over < 1 || over > 2) return "";
  s.pipeline_accounts = over == 2 ? (kAccountEmbedding | kAccountLoss) : kAccountLoss;
  const std::string counted = pipeline_accounts_string(s.pipeline_accounts);
  return fmt::format("pp x vp ({}) exceeds the model's {} layers: the split counts {}, as Megatron-core must to run "
                     "it (--pipeline-accounts {})",
                     static_cast<long long>(s.pp) * s.vp, model.layers,
                     over == 2 ? "the embedding and the loss as pipeline layers" : "the loss as a pipeline layer",
                     counted);
}

// The expert flags over `s`: --ep --etp and the shared settings above (validate() checks them
// against the model).
void read_expert_flags(const Flags& f, Strategy& s) {
  s.ep = static_cast<int>(f.get_int("ep", s.ep, 1, 1 << 16));
  s.etp = static_cast<int>(f.get_int("etp", s.etp, 1, 1 << 16));
  read_moe_settings(f, s);
}

// DP defaults to gpus / (tp * pp * cp); --gpus and --dp must agree when both are given.
// At most 2^56: a flag's size is at most 2^16 and a plan's dp x tp x pp x cp at most 2^24.
void read_gpus_flags(const Flags& f, bool have_plan, Strategy& s) {
  const long long model_parallel = static_cast<long long>(s.tp) * s.pp * s.cp;
  auto gpus = f.get_optional_int("gpus", 1, 1 << 24);
  auto dp = f.get_optional_int("dp", 1, 1 << 24);
  if (dp) s.dp = static_cast<int>(*dp);
  if (gpus) {
    if (*gpus % model_parallel != 0) {
      throw InputError(fmt::format("--gpus {}: must be divisible by tp x pp x cp ({} x {} x {} = {})", *gpus, s.tp, s.pp,
                                   s.cp, model_parallel));
    }
    if (!dp) s.dp = static_cast<int>(*gpus / model_parallel);
    // In 64 bits: --dp 2^24 times tp x pp x cp = 2^24 overflowed s.gpus()'s int.
    const long long product = static_cast<long long>(s.dp) * model_parallel;
    if (product != *gpus) {
      throw InputError(fmt::format("--gpus {}: must equal dp x tp x pp x cp ({} x {} x {} x {} = {})", *gpus, s.dp,
                                   s.tp, s.pp, s.cp, product));
    }
  } else if (!dp && !have_plan) {
    throw InputError(fmt::format("--gpus: required for 'trainplan {}' (or give --dp)", f.command()));
  }
}

}  // namespace

PlanInputs read_plan_flags(const Flags& f, const std::filesystem::path& data_dir, const std::string& default_cluster,
                           const std::string& default_software) {
  const auto plan = f.get("plan");
  std::optional<PredictionDoc> from_plan;
  if (plan) from_plan = plan_prediction(*plan);
  PlanInputs in;
  load_specs(f, data_dir, default_cluster, default_software, from_plan ? &*from_plan : nullptr, in);
  const bool have_plan = from_plan.has_value();
  Strategy s = have_plan ? from_plan->estimate.strategy : Strategy{};
  if (!have_plan) {
    s.dispatcher = default_dispatcher(in.model, in.software);
    s.attention = in.software.default_attention;
  }
  if (!f.has("seq") && !have_plan) in.seq_note = sequence_note(in.model);
  read_layout_flags(f, in.model, have_plan, s);
  read_expert_flags(f, s);
  read_gpus_flags(f, have_plan, s);
  if (!have_plan && !f.has("pipeline-accounts")) in.split_note = account_extra_chunks(in.model, s);
  // A layout read from --plan names the plan file: its sizes were never given as flags.
  auto refuse = [&](const std::string& why) {
    return have_plan ? InputError(fmt::format("--plan {}: {}", *plan, why)) : InputError(why);
  };
  if (auto bad = validate(s, in.model)) throw refuse(*bad);
  if (auto bad = validate_on(s, in.cluster)) throw refuse(*bad);
  in.strategy = s;
  return in;
}

void read_dp_space_flags(const Flags& f, SearchSpace& space) {
  space.dp_algorithms = list_flag<DpAlgorithm>(f, "dp-algorithms", "allreduce,ps,ps-async", parse_dp_algorithm,
                                               space.dp_algorithms);
  space.grad_compressions = list_flag<GradCompression>(f, "grad-compressions", "none,bf16,powersgd:R (R in [1, 65536])",
                                                       parse_grad_compression, space.grad_compressions);
  const bool any_ps = std::any_of(space.dp_algorithms.begin(), space.dp_algorithms.end(),
                                  [](DpAlgorithm a) { return a != DpAlgorithm::allreduce; });
  if (f.has("ps-servers") && !any_ps) throw InputError("--ps-servers: needs --dp-algorithms with ps or ps-async");
  if (f.has("ps-placement") && !any_ps) throw InputError("--ps-placement: needs --dp-algorithms with ps or ps-async");
  space.ps_servers = static_cast<int>(f.get_int("ps-servers", space.ps_servers, 1, 1 << 20));
  space.ps_placement =
      *parse_ps_placement(f.get_choice("ps-placement", to_string(space.ps_placement), {"dedicated", "colocated"}));
  space.fp32_grad_accum = on_off(f, "fp32-grad-accum", space.fp32_grad_accum);
}

void read_expert_space_flags(const Flags& f, const ModelSpec& model, const Software& software, ExpertSpace& x) {
  x.dispatcher = default_dispatcher(model, software);
  x.recompute_modules = recomputable_modules(model);  // each subset is searched (search.hpp)
  if (auto e = f.get_optional_int("max-ep", 1, 1 << 16)) x.max_ep = static_cast<int>(*e);
  const std::vector<std::string> etps = list_flag<std::string>(
      f, "etp", "1,tp", [](const std::string& v) { return v == "1" || v == "tp" ? std::optional(v) : std::nullopt; },
      {"1", "tp"});
  x.etp_one = std::find(etps.begin(), etps.end(), "1") != etps.end();
  x.etp_tp = std::find(etps.begin(), etps.end(), "tp") != etps.end();
  read_moe_settings(f, x);
}

CudaGraphs read_cuda_graphs(const Flags& f, CudaGraphs current) {
  return *parse_cuda_graphs(f.get_choice("cuda-graphs", to_string(current), {"none", "full"}));
}

unsigned read_cuda_graph_modules(const Flags& f, unsigned current) {
  auto v = f.get("cuda-graph-modules");
  if (!v) return current;
  // Split once: split_list refuses an empty or repeated item, as for every list flag.
  auto parsed = parse_cuda_graph_module_items(split_list("cuda-graph-modules", *v));
  if (!parsed) {
    throw InputError(fmt::format("--cuda-graph-modules {}: must be none or a comma-separated list of attn, mlp, moe, "
                                 "moe_router, moe_preprocess",
                                 *v));
  }
  return *parsed;
}

std::string expert_space_flags_help() {
  return R"(experts (models with experts or MLA; every candidate shares all but ep, etp and its modules):
  --max-ep E                largest expert-parallel size (default: the experts); ep takes every
                            divisor of the experts with etp x ep dividing a stage's tp x cp x dp
  --etp LIST                expert-tensor-parallel sizes, from 1,tp (default 1,tp)
  --moe-imbalance X         max / mean tokens per expert-parallel rank for ep > 1 (default 1;
                            ep below X is not searched)
  --moe-dispatcher alltoall|allgather|flex  token dispatcher (default: the software profile's;
                            megatron-core flex, the others alltoall)
  --moe-a2a-overlap on|off  hide the all-to-all behind another micro-batch's compute (ep > 1)
  --capacity-factor C       cap (and pad) each expert's tokens (default 0: dropless)
  --recompute-modules LIST  modules a candidate without full recomputation may recompute, each
                            subset of them searched, none included: from moe_act, mla_up_proj,
                            layernorm, mlp, or none (default: every one the model has but mlp,
                            which only this flag adds; moe_act and layernorm with experts,
                            mla_up_proj and layernorm with MLA)
)";
}

std::string dp_space_flags_help() {
  return R"(data-parallel algorithm (opt in; the default space is the all-reduce without compression):
  --dp-algorithms LIST      from allreduce,ps,ps-async (parameter servers need ZeRO 0)
  --ps-servers S            parameter-server shards for the ps candidates (default 1)
  --ps-placement dedicated|colocated  servers on S extra nodes (default) or on the job's nodes
  --grad-compressions LIST  from none,bf16,powersgd:R (bf16 needs fp32 gradients; PowerSGD ZeRO 0)
  --fp32-grad-accum on|off  keep 4-byte gradients (default off)
)";
}

std::string plan_flags_help() {
  return R"(plan (model, cluster and layout):
  --model NAME|FILE         built-in model (models/NAME.json), a trainplan model file, or a
                            Hugging Face config.json (llama, mistral, qwen2, gpt2, gpt_neox,
                            mixtral, qwen2_moe, qwen3_moe, deepseek_v3, kimi_k2, gpt_oss, llama4)
  --cluster NAME|FILE       built-in cluster (topologies/NAME.json) or a topology file
  --software NAME|FILE      training stack whose kernels are costed (software/NAME.json):
                            megatron-core (default: fused kernels, as the published large runs),
                            pytorch-eager, trainplan-exec (what `trainplan exec` launches),
                            llm-foundry (Composer + FSDP with flash-attn 2, as MosaicML's runs);
                            stacks of published runs: megatron-lm-2021, megatron-deepspeed,
                            deepspeed-zero3-2021, aleph-alpha-scaling, aleph-alpha-scaling-rms
  --gpus N                  GPUs in the job; must equal dp x tp x pp x cp
  --tp T                    tensor-parallel size (default 1; must divide heads and kv_heads)
  --pp P                    pipeline stages (default 1)
  --dp D                    data-parallel replicas (default gpus / (tp x pp x cp))
  --cp C                    context-parallel size (default 1; 2 x cp must divide --seq)
  --vp V                    model chunks per stage for --schedule interleaved (default 1)
  --zero 0|1|2|3            ZeRO stage over the data-parallel group (default 0)
  --micro-batch b           sequences per micro-batch (default 1)
  --global-batch B          sequences per optimizer step (required; divisible by dp x b)
  --seq S                   tokens per sequence (default: the model's seq_len; for a Hugging
                            Face config 8192 for the Llama 3 family, else 4096, at most its
                            max_position_embeddings, with a note on stderr)
  --recompute none|selective|full   activation recomputation (default none)
  --sequence-parallel on|off        Megatron sequence parallelism, needs tp > 1 (default off)
  --schedule gpipe|1f1b|interleaved pipeline schedule (default 1f1b; interleaved if --vp > 1)
  --dtype bf16|fp16|fp8|fp32|mxfp8|nvfp4   training precision (default bf16): fp8 with one scale
                                    per tensor; mxfp8 (8-bit, a scale per 32) and nvfp4 (4-bit, a
                                    scale per 16) need a GPU with their peak (Blackwell)
  --attention flash|standard        fused attention or materialised scores (default: the
                                    software profile's: standard for megatron-lm-2021 and
                                    megatron-deepspeed, flash for the others)
  --fp32-grad-accum on|off          keep 4-byte gradients (default off)
  --cuda-graphs none|full           the host launches every kernel (default), or one CUDA graph
                                    per step replays the forward and backward (Megatron-core
                                    --cuda-graph-impl full_iteration): no host time per kernel,
                                    the optimizer outside the graph; a dropless MoE model needs
                                    --moe-dispatcher flex or a --capacity-factor (fixed shapes)
  --cuda-graph-modules LIST         per-layer CUDA graphs (Megatron-core --cuda-graph-impl
                                    transformer_engine or local, --cuda-graph-modules): regions of
                                    every layer replayed with one launch per pass, from attn (norm,
                                    attention, residual add), mlp (a dense layer's MLP side), moe
                                    (an MoE block whole: needs --capacity-factor), moe_router (up
                                    to the router, with unoverlapped shared experts),
                                    moe_preprocess (the permutation; with moe_router). Default none;
                                    not with --cuda-graphs full or --recompute full
  --rank-order tp,cp,dp,pp          rank order, fastest-varying first (default tp,cp,dp,pp)
  --pipeline-accounts LIST  count the embedding and/or the loss as one layer of the first / last
                            pipeline chunk and split the layers evenly, (layers + counted) / (pp x
                            vp) per chunk (Megatron-core's --account-for-embedding-in-pipeline-
                            split, --account-for-loss-in-pipeline-split): embedding, loss; layers:
                            the layers alone split evenly, Megatron-core's default split; none:
                            the layers alone, split by predicted time. Default: none, or where
                            pp x vp exceeds the layers by 1 or 2, embedding,loss / loss (a note
                            says so: Megatron-core runs such a layout only that way)
  --dp-algorithm allreduce|ps|ps-async  how DP replicas combine gradients: collective (default),
                            parameter servers with a barrier per step, or asynchronous servers
  --ps-servers S            parameter-server shards, one node each (default 1; needs ps/ps-async)
  --ps-placement dedicated|colocated  servers on S extra nodes (default) or on S of the job's nodes
  --grad-compression none|bf16|powersgd:R  gradient compression on the wire (default none; bf16
                            needs fp32 gradients; PowerSGD rank R >= 1 with error feedback, zero 0)
experts (models with experts; Megatron-core's folding: etp x ep must divide tp x cp x dp of a stage,
edp = tp x cp x dp / (etp x ep) ranks share an expert shard):
  --ep E                    expert-parallel size (default 1; must divide the experts)
  --etp T                   expert-tensor-parallel size (default 1, as every published recipe)
  --moe-imbalance X         max / mean tokens per expert-parallel rank, in [1, ep] (default 1:
                            balanced, as published benchmarks force it)
  --moe-dispatcher alltoall|allgather|flex  how tokens reach their experts: NCCL all-to-all of
                            every routed copy, all-gather, or DeepEP/HybridEP (a token crosses
                            once to each node holding its experts). Default: the software
                            profile's (megatron-core: flex, as NVIDIA's recipes; others alltoall)
  --moe-a2a-overlap on|off  hide the expert all-to-all behind another micro-batch's compute
                            (Megatron-core --overlap-moe-expert-parallel-comm; default off)
  --capacity-factor C       cap (and pad) each expert at tokens x top_k x C / experts tokens
                            (default 0: dropless; at most experts / top_k)
  --recompute-modules LIST  recompute these modules in the backward: moe_act (the experts'
                            activation), mla_up_proj (MLA's up projections), layernorm (the
                            MoE pre-MLP norm's and MLA's input norm's outputs), mlp (a dense
                            layer's MLP, from its input); default none
  --plan FILE               take the layout (and model/cluster) from a trainplan/prediction/v1
                            file or the best entry of a trainplan/search/v1 file; flags override.
                            The model is the one the plan carries (its model file or config
                            need not exist any more)
)";
}

}  // namespace trainplan::cli
