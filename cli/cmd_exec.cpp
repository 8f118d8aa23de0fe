// trainplan exec: run a plan for real with LibTorch and measure it.
#include <fmt/format.h>

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "exec/exec.hpp"
#include "reports/measurement_console.hpp"
#include "reports/measurement_json.hpp"
#include "sim/check.hpp"
#include "cli/commands.hpp"
#include "cli/output.hpp"
#include "cli/plan_flags.hpp"
#include "sim/layer_graph.hpp"
#include "sim/atomic_file.hpp"
#include "sim/predict.hpp"
#include "sim/rank_layout.hpp"
#include "sim/zero_policy.hpp"

namespace trainplan::cli {

namespace {

const char* kHelp = R"(usage: trainplan exec [plan flags | --plan FILE] [--nproc N] [--steps K] [--warmup W] [--json FILE]

Runs the plan for real with LibTorch (NCCL on GPUs, Gloo on CPU): a sharded GPT-2- or Llama-style
model with the plan's TP/SP, PP schedule, DP/ZeRO, micro-batching and recomputation, trained on a
seeded synthetic token stream with AdamW. Mixture-of-experts models run their routed experts over
--ep ranks (all-to-all dispatch, dropless or with --capacity-factor; etp 1; ZeRO 0-2), the experts'
gradients reduced over the expert-data-parallel ranks; environment.expert_parallel in the JSON gives
each rank's all-to-all bytes and time per step. Measures per-step loss and wall time (warm-up steps
discarded), the phase breakdown and peak memory per rank.
Launch: --nproc N spawns N local ranks; under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) or Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, MASTER_ADDR, MASTER_PORT) this
process is one rank. Exit status: 0 ok, 1 a rank failed or the loss stopped being finite (the run
stops in that step: training diverged), 2 bad input.
Parameter servers: --dp-algorithm ps runs synchronous servers (data parallelism only, ZeRO 0;
dedicated servers are extra ranks after the workers). --grad-compression bf16|powersgd:R compresses
the ZeRO-0 all-reduce. The JSON's dp_bytes_sent_per_step counts the bytes handed to the DP
collectives (or parameter-server sends) per step.
Plan flags only predict and simulate model are refused with exit 2 and the rule, among them
--cuda-graphs full and --cuda-graph-modules (exec launches every kernel from the host),
--recompute-modules (exec recomputes whole layers or the attention core), --moe-a2a-overlap on,
--etp > 1 and --dp-algorithm ps-async.

)";

const char* kExecFlags = R"(execution:
  --nproc N                 spawn N local ranks (N = dp*tp*pp*cp, plus --ps-servers with dedicated
                            parameter servers); --gpus defaults to N (to WORLD_SIZE under torchrun,
                            SLURM_NTASKS under Slurm, else 1)
  --device cpu|cuda         where the ranks run (default: cuda when available, else cpu); Gloo ranks
                            may share one GPU (correctness checks)
  --backend nccl|gloo       collectives (default: nccl on cuda, gloo on cpu)
  --steps K                 measured steps (default 5)
  --warmup W                steps run first and discarded (default 1)
  --seed S                  parameter and data seed (default 1234)
  --lr X                    AdamW learning rate (default 1e-3)
  --loss-scale X            --dtype fp16: initial dynamic loss scale (default 65536)
  --loss-scale-window N     --dtype fp16: good steps before the scale doubles (default 2000); a step with
                            inf/NaN gradients is skipped and halves it
  --bucket-mb X             data-parallel gradient bucket in MiB of fp32 gradients (default 16); ZeRO-2/3
                            hold at most two buckets of gradients beyond their shard
  --fused-kernels auto|on|off  which ops run as trainplan's fused kernels (exec/kernels: one kernel
                            forward and one backward each; CUDA on GPUs, the same math in CPU loops on
                            the CPU) instead of LibTorch: auto (default) RMSNorm, RoPE and SwiGLU, which
                            LibTorch runs here as several kernels; on also LayerNorm and GELU, which it
                            runs as one; off none; recorded as environment.fused_kernels in the JSON
  --data FILE               train on a little-endian uint16 token file instead of synthetic tokens
  --timeout SECONDS         collective/rendezvous timeout; a dead or hung rank stops the job (default 30)
  --json FILE               write the trainplan/measurement/v1 JSON to FILE ("status": "ok"; a failed
                            run writes "status": "failed" with the rank, step, phase, error and memory)
  --dump-params FILE        debug: each rank writes its parameters after the last step to FILE.rank<R>
  --dump-grads FILE         debug: each rank writes the reduced gradients of the first step (what the
                            optimizer sees) to FILE.rank<R>
  --trace PREFIX            after the measured steps, run one more under the PyTorch profiler (host
                            operators; on GPUs every kernel and copy) and write each rank's chrome trace
                            to PREFIX.rank<R>.json (Perfetto, chrome://tracing, or
                            tests/gpu/step_profile.py --summarize); not counted in the measurement
  --cpu-autocast on|off     --dtype bf16/fp16 on the CPU: run under CPU autocast with fp32 master
                            weights as on GPUs (slow; checks the mixed-precision paths) instead of
                            computing fp32 (default off)
  --memory-accounting on|off  measurement: record each rank's step bytes by what they hold (weight copies,
                            saved activations, the step's peak, the optimizer's temporaries) from the
                            allocator, as environment.memory_accounting (default off)
)";

// An environment variable's number: decimal digits only (parse_integer without its '-'), else nothing.
std::optional<long long> env_number(const char* v) { return v[0] == '-' ? std::nullopt : parse_integer(v); }

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  const auto x = env_number(v);
  if (!x || *x > (1 << 30)) throw InputError(fmt::format("environment {}={}: must be a non-negative integer in decimal digits", name, v));
  return static_cast<int>(*x);
}

// MASTER_PORT as a TCP port: [1, 65535], or 0 ("any free port") where the local launcher serves
// the rendezvous itself. A larger value would silently wrap to another port.
int env_port(int fallback, bool zero_ok) {
  const char* v = std::getenv("MASTER_PORT");
  if (!v || !*v) return fallback;
  const auto x = env_number(v);
  if (!x || *x < (zero_ok ? 0 : 1) || *x > 65535) {
    throw InputError(fmt::format("environment MASTER_PORT={}: must be a TCP port in [{}, 65535], in decimal digits", v, zero_ok ? 0 : 1));
  }
  return static_cast<int>(*x);
}

// MASTER_ADDR must name a host this machine can resolve (a typo otherwise ends as a rendezvous
// timeout blamed on the port).
void check_master_addr(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(addr.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    throw InputError(fmt::format("environment MASTER_ADDR={}: cannot resolve it ({})", addr, ::gai_strerror(rc)));
  }
  ::freeaddrinfo(res);
}

// --data: a regular file of little-endian uint16 tokens, a whole number of them, at least one
// sequence plus its shifted target plus one (seq + 2, exec/tokens.cpp), every token below the
// model's vocabulary. Read once in 1 MiB pieces before any rank starts.
void check_data_file(const std::string& path, int vocab, int seq) {
  const std::string what = fmt::format("--data {}", path);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw InputError(fmt::format("{}: cannot open ({})", what, std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) {
    throw InputError(fmt::format("{}: not a regular file ({})", what, S_ISDIR(st.st_mode) ? "a directory" : "a FIFO, device or socket"));
  }
  const auto bytes = static_cast<std::uintmax_t>(st.st_size);
  if (bytes % 2 != 0) {
    throw InputError(fmt::format("{}: {} bytes, must be a whole number of 2-byte (uint16) tokens", what, bytes));
  }
  if (bytes / 2 < static_cast<std::uintmax_t>(seq) + 2) {
    throw InputError(fmt::format("{}: holds {} tokens, needs at least --seq + 2 = {}", what, bytes / 2, seq + 2));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open", what));
  std::vector<unsigned char> buf(1 << 20);
  std::uintmax_t index = 0;
  while (in) {
    in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    const auto n = static_cast<std::size_t>(in.gcount());
    for (std::size_t i = 0; i + 1 < n; i += 2, ++index) {
      const unsigned token = buf[i] | (static_cast<unsigned>(buf[i + 1]) << 8);  // little-endian
      if (token >= static_cast<unsigned>(vocab)) {
        throw InputError(fmt::format("{}: token {} at position {} is not below the model's vocab ({})", what, token,
                                     index, vocab));
      }
    }
  }
}

// The physical memory of this machine (/proc/meminfo MemTotal), bytes; 0 when unknown.
double host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemTotal:") return kb * 1024.0;
  return 0;
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

void check_divisible(const char* what, long long n, int tp) {
  if (n % tp != 0) throw InputError(fmt::format("--tp {}: the model's {} ({}) must be divisible by tp for exec", tp, what, n));
}

// The processes a job runs (RankLayout: the workers, plus dedicated parameter servers) and how
// the plan arrives at that number.
int job_ranks(const Strategy& s) { return RankLayout(s).job_ranks(); }
std::string describe_ranks(const Strategy& s) {
  const RankLayout l(s);
  if (l.job_ranks() == l.world()) return fmt::format("dp*tp*pp*cp = {} ranks", l.world());
  return fmt::format("{} ranks (dp*tp*pp*cp = {} workers and {} dedicated parameter server(s))", l.job_ranks(), l.world(),
                     l.servers());
}

// --gpus when neither it, --dp nor --plan is given: the ranks the job has (--nproc, or the
// launcher's world size), or 1.
std::optional<std::string> default_gpus(const Args& args) {
  Flags probe(args, "exec");
  if (probe.help() || probe.has("gpus") || probe.has("dp") || probe.has("plan")) return std::nullopt;
  if (const auto n = probe.get("nproc")) return *n;  // checked as --nproc below
  if (std::getenv("RANK") && std::getenv("WORLD_SIZE")) return std::to_string(env_int("WORLD_SIZE", 1));
  if (std::getenv("SLURM_PROCID") && std::getenv("SLURM_NTASKS")) return std::to_string(env_int("SLURM_NTASKS", 1));
  return std::string("1");
}

// The run's description for a failed-run JSON (no figures).
Measurement run_description(const exec::ExecPlan& plan, const exec::ExecOptions& o, bool cuda_device, int world) {
  Measurement m;
  set_run_strategy(m, plan.strategy, cuda_device || o.cpu_autocast);
  m.model = plan.model.name;
  m.cluster = plan.cluster;
  m.backend = o.backend;
  m.device = cuda_device ? "cuda" : "cpu";
  m.warmup = o.warmup;
  m.seed = o.seed;
  m.executor = exec::kExecutorFingerprint;
  m.environment = {{"backend", o.backend},
                   {"device", m.device},
                   {"ranks", world},
                   {"fused_kernels", exec::to_string(o.fused_kernels)}};
  return m;
}

// Module recomputation, CUDA graphs, parameter servers and gradient compression: the combinations
// exec runs; the planner models the others.
void check_exec_supports(const Strategy& s) {
  const ZeroPolicy zero = ZeroPolicy::of(s.zero);
  if (s.recompute_modules != 0)
    throw InputError(fmt::format("--recompute-modules {}: exec recomputes whole layers or the attention core only "
                                 "(--recompute full|selective)", recompute_modules_string(s.recompute_modules)));
  if (s.cuda_graphs != CudaGraphs::none)
    throw InputError(fmt::format("--cuda-graphs {}: exec launches every kernel from the host; use none (predict and "
                                 "simulate model graph replay)", to_string(s.cuda_graphs)));
  if (s.cuda_graph_modules != 0)
    throw InputError(fmt::format("--cuda-graph-modules {}: exec launches every kernel from the host; use none (predict "
                                 "and simulate model graph replay)", cuda_graph_modules_string(s.cuda_graph_modules)));
  if (s.dp_algorithm == DpAlgorithm::ps_async)
    throw InputError("--dp-algorithm ps-async: exec runs synchronous parameter servers only (use ps); predict and "
                     "simulate model ps-async");
  if (s.uses_ps()) {
    if (s.tp > 1 || s.pp > 1 || s.cp > 1)
      throw InputError(fmt::format("--dp-algorithm ps: exec runs parameter servers with data parallelism only, "
                                   "tp = pp = cp = 1 (got tp {}, pp {}, cp {})", s.tp, s.pp, s.cp));
    if (zero.shards_optimizer)
      throw InputError(fmt::format("--zero {}: with --dp-algorithm ps the servers hold the optimizer state; --zero must be 0",
                                   s.zero));
    if (s.dtype == Dtype::fp16)
      throw InputError("--dtype fp16: exec's parameter servers have no loss scaling; use bf16 or fp32 with --dp-algorithm ps");
    if (s.grad_compression.kind != CompressionKind::none)
      throw InputError(fmt::format("--grad-compression {}: exec compresses the all-reduce, not parameter-server pushes; "
                                   "use none with --dp-algorithm ps", to_string(s.grad_compression)));
  }
  if (s.grad_compression.kind != CompressionKind::none && zero.reduce_scatters)
    throw InputError(fmt::format("--grad-compression {}: exec compresses the ZeRO-0 all-reduce; --zero must be 0 (got {})",
                                 to_string(s.grad_compression), s.zero));
}

// The architecture features exec's model implements: MHA/GQA attention over the whole causal
// sequence, and MoE layers routed by softmax or sigmoid top-k over all experts (exec/moe.hpp).
void check_exec_model(const ModelSpec& m, int seq) {
  auto refuse = [&m](const std::string& what) {
    return InputError(fmt::format("--model {}: exec does not implement {}", m.name, what));
  };
  if (m.mla.on()) throw refuse("multi-head latent attention (mla)");
  for (int l = 0; l < m.layers; ++l)
    if (m.layer_attention_at(l, seq) != AttentionWindow::full)
      throw refuse(fmt::format("{} attention (layer {} at --seq {})", to_string(m.layer_attention_at(l, seq)), l, seq));
  if (m.attention_sinks) throw refuse("attention sinks");
  if (m.activation_clamp > 0) throw refuse("a clamped activation (activation_clamp)");
  if (m.rope_attention_factor != 1) throw refuse("a scaled rotary embedding (rope_attention_factor)");
  if (m.mtp_layers > 0) throw refuse("multi-token prediction (mtp_layers)");
  // exec/model.cpp builds GPT-2's linears (GeLU) with biases and Llama's (SwiGLU) without.
  const bool gpt = m.activation == Activation::gelu;
  if (m.linear_biases() != LinearBiases{gpt, gpt, gpt})
    throw refuse(fmt::format("{} linears with these biases (QKV {}, output {}, MLP {})", gpt ? "GeLU" : "SwiGLU",
                             m.linear_biases().qkv, m.linear_biases().out, m.linear_biases().mlp));
  if (m.moe.on() && m.moe.groups > 1) throw refuse("group-limited routing (moe.groups > 1)");
}

// The expert layouts exec runs: whole experts (etp 1) reached by all-to-all, routed by the model's
// router, gradients reduced by a replicated all-reduce or ZeRO 1/2 over the expert-data-parallel
// group; the planner models the others.
void check_exec_experts(const ModelSpec& m, const Strategy& s) {
  if (!m.moe.on()) return;  // validate() has refused expert flags for a dense model
  if (s.etp > 1)
    throw InputError(fmt::format("--etp {}: exec runs whole experts (expert tensor parallelism 1); predict and "
                                 "simulate model etp > 1", s.etp));
  if (s.dispatcher != Dispatcher::alltoall)
    throw InputError(fmt::format("--moe-dispatcher {}: exec dispatches tokens by all-to-all; use alltoall",
                                 to_string(s.dispatcher)));
  if (s.moe_a2a_overlap)
    throw InputError("--moe-a2a-overlap on: exec runs each micro-batch's all-to-alls in turn, hiding none behind "
                     "another's compute; use off");
  if (s.moe_imbalance != 1)
    throw InputError(fmt::format("--moe-imbalance {}: exec routes with the model's router, whose balance it measures; "
                                 "the imbalance is an assumption of predict and simulate (leave it 1)",
                                 s.moe_imbalance));
  if (ZeroPolicy::of(s.zero).shards_params)
    throw InputError(fmt::format("--zero {}: exec does not gather routed experts unit by unit; use --zero 0, 1 or 2 "
                                 "with an MoE model", s.zero));
  if (s.uses_ps() || s.grad_compression.kind != CompressionKind::none)
    throw InputError(fmt::format("--model {}: exec reduces routed experts by all-reduce or ZeRO over the "
                                 "expert-data-parallel group, not with parameter servers or gradient compression",
                                 m.name));
}

// The execution flags (the plan flags are read before them).
exec::ExecOptions read_exec_options(const Flags& f, bool cuda) {
  exec::ExecOptions o;
  o.steps = static_cast<int>(f.get_int("steps", 5, 1, 1000000));
  o.warmup = static_cast<int>(f.get_int("warmup", 1, 0, 1000000));
  o.seed = f.get_int("seed", 1234, 0, (1LL << 62));
  o.lr = f.get_double("lr", 1e-3, 0, 10);
  o.loss_scale = f.get_double("loss-scale", 65536, 1, 1e30);
  o.loss_scale_window = static_cast<int>(f.get_int("loss-scale-window", 2000, 1, 1 << 30));
  o.timeout_s = f.get_double("timeout", 30, 1, 86400);
  o.device = f.get_choice("device", cuda ? "cuda" : "cpu", {"cpu", "cuda"});
  o.backend = f.get_choice("backend", o.device == "cuda" ? "nccl" : "gloo", {"nccl", "gloo"});
  o.bucket_bytes = f.get_double("bucket-mb", 16, 1.0 / 1024, 65536) * (1 << 20);
  const std::string fused = f.get_choice("fused-kernels", "auto", {"auto", "on", "off"});
  o.fused_kernels = fused == "on"    ? exec::FusedKernels::on
                    : fused == "off" ? exec::FusedKernels::off
                                     : exec::FusedKernels::automatic;
  o.data_file = f.get_or("data", "");
  o.dump_params = f.get_or("dump-params", "");
  o.dump_grads = f.get_or("dump-grads", "");
  o.trace = f.get_or("trace", "");
  o.cpu_autocast = f.get_choice("cpu-autocast", "off", {"on", "off"}) == "on";
  o.memory_accounting = f.get_choice("memory-accounting", "off", {"on", "off"}) == "on";
  o.faults.kill_rank = static_cast<int>(f.get_int("fault-kill-rank", -1, -1, 1 << 24));
  o.faults.hang_rank = static_cast<int>(f.get_int("fault-hang-rank", -1, -1, 1 << 24));
  o.faults.nan_rank = static_cast<int>(f.get_int("fault-nan-rank", -1, -1, 1 << 24));
  o.faults.alloc_rank = static_cast<int>(f.get_int("fault-alloc-rank", -1, -1, 1 << 24));
  o.faults.step = static_cast<int>(f.get_int("fault-step", -1, -1, 1 << 30));
  const std::string bug = f.get_choice("fault-grad-bug", "none", {"none", "sum-dp", "sum-micro-batches"});
  o.faults.grad_bug = bug == "sum-dp"              ? exec::FaultOptions::GradBug::sum_dp
                      : bug == "sum-micro-batches" ? exec::FaultOptions::GradBug::sum_micro_batches
                                                   : exec::FaultOptions::GradBug::none;
  return o;
}

// What exec cannot run with this plan and these options, refused before any rank starts.
void check_exec_request(const PlanInputs& in, const exec::ExecOptions& o, bool cuda) {
  const Strategy& s = in.strategy;
  if (o.device == "cuda" && !cuda) throw InputError("--device cuda: this build has no CUDA or no GPU is visible");
  if (o.backend == "nccl" && o.device != "cuda") throw InputError("--backend nccl: needs --device cuda; use --backend gloo");
  if (o.device == "cuda" && quantized_gemms(s.dtype))
    throw InputError(fmt::format("--dtype {}: exec runs bf16, fp16 (dynamic loss scaling) or fp32 on GPUs, not {}",
                                 to_string(s.dtype), to_string(s.dtype)));
  // Both hook the thread's profiler state: the allocator reports to one of them only.
  if (o.memory_accounting && !o.trace.empty())
    throw InputError("--trace: not with --memory-accounting on (both attach to the profiler); run them separately");
  if (o.cpu_autocast && s.dtype != Dtype::bf16 && s.dtype != Dtype::fp16)
    throw InputError(fmt::format("--cpu-autocast on: runs bf16 or fp16, not {}", to_string(s.dtype)));
  if (o.cpu_autocast && o.device != "cpu")
    throw InputError(fmt::format("--cpu-autocast on: applies to --device cpu; on {} bf16 and fp16 run under autocast "
                                 "anyway", o.device));
  check_divisible("heads", in.model.heads, s.tp);
  check_divisible("kv_heads", in.model.kv_heads, s.tp);
  check_divisible("ffn_hidden", in.model.ffn_hidden, s.tp);
  if (s.sequence_parallel && s.tp > 1) check_divisible("sequence length / cp", s.seq_len / s.cp, s.tp);
  if (in.model.position == Position::alibi)
    throw InputError(fmt::format("--model {}: exec does not implement ALiBi positions", in.model.name));
  check_exec_supports(s);
  check_exec_model(in.model, s.seq_len);
  check_exec_experts(in.model, s);
  // The test faults fire on one rank at one step: one outside the job never fires, so the run would
  // pass a test that meant it to fail.
  const int ranks = job_ranks(s);
  for (const auto& [flag, rank] : {std::pair{"fault-kill-rank", o.faults.kill_rank}, std::pair{"fault-hang-rank", o.faults.hang_rank},
                                   std::pair{"fault-nan-rank", o.faults.nan_rank}, std::pair{"fault-alloc-rank", o.faults.alloc_rank}}) {
    if (rank >= ranks) {
      throw InputError(fmt::format("--{} {}: not a rank of the job, which has {} (0..{})", flag, rank, describe_ranks(s), ranks - 1));
    }
  }
  // A fault needs both its rank and its step: either alone never fires.
  const bool fault_rank = o.faults.kill_rank >= 0 || o.faults.hang_rank >= 0 || o.faults.nan_rank >= 0 ||
                          o.faults.alloc_rank >= 0;
  for (const auto& [flag, rank] : {std::pair{"fault-kill-rank", o.faults.kill_rank}, std::pair{"fault-hang-rank", o.faults.hang_rank},
                                   std::pair{"fault-nan-rank", o.faults.nan_rank}, std::pair{"fault-alloc-rank", o.faults.alloc_rank}}) {
    if (rank >= 0 && o.faults.step < 0)
      throw InputError(fmt::format("--{} {}: needs --fault-step N, the step it fires in (without it no fault fires)", flag, rank));
  }
  if (o.faults.step >= 0 && !fault_rank) {
    throw InputError(fmt::format("--fault-step {}: needs --fault-kill-rank, --fault-hang-rank, --fault-nan-rank or "
                                 "--fault-alloc-rank, the rank it fires on (without one no fault fires)",
                                 o.faults.step));
  }
  if (o.faults.step >= o.warmup + o.steps) {
    throw InputError(fmt::format("--fault-step {}: the run has --warmup {} + --steps {} = {} steps, numbered from 0",
                                 o.faults.step, o.warmup, o.steps, o.warmup + o.steps));
  }
}

// The plan as exec runs it: layers per virtual stage exactly as predict partitions them.
exec::ExecPlan exec_plan(const PlanInputs& in) {
  const Strategy& s = in.strategy;
  exec::ExecPlan plan;
  plan.model = in.model;
  plan.strategy = s;
  plan.cluster = in.cluster.name;
  const LayerGraph graph(in.model, s.seq_len);
  const StepCosts costs = step_costs(graph, in.cluster, in.software, s);
  for (const ChunkCost& c : costs.chunks) {
    if (c.layers == 0 && !in.split_note.empty()) {  // the accounting was implied, not given
      throw InputError(fmt::format("--pp {}: pp x vp ({}) exceeds the model's {} layers, which exec does not run; "
                                   "predict and simulate model it (fewer chunks, --pp x --vp, give every chunk a layer)",
                                   s.pp, s.pp * s.vp, in.model.layers));
    }
    if (c.layers == 0) {
      throw InputError(fmt::format("--pipeline-accounts {}: leaves pipeline chunk {} of stage {} without a transformer "
                                   "layer, which exec does not run; predict and simulate model it (fewer chunks, "
                                   "--pp x --vp, give every chunk a layer)",
                                   pipeline_accounts_string(s.pipeline_accounts), c.chunk, c.stage));
    }
    plan.first_layer.push_back(c.first_layer);
    plan.layers.push_back(c.layers);
  }
  plan.model_flops_per_step = costs.model_flops_per_micro_batch_per_replica * s.micro_batches() * s.dp;
  return plan;
}

// How this process was started: a rank spawned by the local launcher, one under torchrun or
// Slurm, or the command that launches --nproc local ranks.
struct Launch {
  bool spawned = std::getenv("TRAINPLAN_EXEC_SPAWNED") != nullptr;
  bool torchrun = std::getenv("RANK") != nullptr;
  bool slurm = !torchrun && std::getenv("SLURM_PROCID") != nullptr;
  bool local = false;  // --nproc here, with none of the above
};

// The predicted memory of the plan against this machine's (CPU: the host's, for every local rank;
// GPU: the cluster's HBM).
void check_memory_fits(const PlanInputs& in, const exec::ExecOptions& o, int local_ranks) {
  const LayerGraph graph(in.model, in.strategy.seq_len);
  // On CPU the ranks compute in fp32 whatever --dtype says (the measurement's compute_dtype), and
  // a CPU cluster has no 16-bit peak to cost a bf16 plan with: its memory is predicted in fp32.
  Strategy as_run = in.strategy;
  if (o.device == "cpu") as_run.dtype = Dtype::fp32;
  const Estimate e = predict(graph, in.cluster, in.software, as_run);
  if (o.device == "cpu") {
    // Every CPU rank allocates from the same host memory.
    const double host = host_memory_bytes();
    const double need = e.peak_memory * local_ranks;
    if (host > 0 && need > host) {
      throw InputError(fmt::format("--model {}: the plan needs a predicted {:.1f} GB per rank x {} rank(s) = {:.1f} GB, "
                                   "more than this machine's memory ({:.1f} GB, /proc/meminfo); choose a smaller "
                                   "model or more parallelism",
                                   in.model.name, e.peak_memory / 1e9, local_ranks, need / 1e9, host / 1e9));
    }
  } else if (e.peak_memory > in.cluster.gpu.hbm) {
    throw InputError(fmt::format("--model {}: the plan needs a predicted {:.1f} GB per GPU, more than the {:.1f} GB of "
                                 "{} ({}); choose a layout that fits (trainplan search)",
                                 in.model.name, e.peak_memory / 1e9, in.cluster.gpu.hbm / 1e9, in.cluster.gpu.name,
                                 in.cluster.name));
  }
}

// Checked once, before any rank starts (a spawned rank's launcher has checked them already): the
// data file, the dump files, and the predicted memory against this machine's. (The outputs'
// paths, the dump prefixes included, were registered with CommandFiles before any input was read.)
void check_before_start(const PlanInputs& in, const exec::ExecOptions& o, const Launch& launch,
                        std::optional<long long> nproc) {
  if (!o.data_file.empty()) check_data_file(o.data_file, in.model.vocab, in.strategy.seq_len);
  // Each rank writes PREFIX.rank<R> beside the prefix.
  for (const auto& [flag, prefix] : {std::pair{"dump-params", o.dump_params}, std::pair{"dump-grads", o.dump_grads}}) {
    if (!prefix.empty()) check_output_path(prefix + ".rank0", fmt::format("--{} {}", flag, prefix));
  }
  if (!o.trace.empty()) check_output_path(o.trace + ".rank0.json", fmt::format("--trace {}", o.trace));
  // Ranks on this machine: all of them under the local launcher, else the launcher's count.
  const int local_ranks = launch.local ? static_cast<int>(*nproc)
                                       : std::max(1, env_int(launch.torchrun ? "LOCAL_WORLD_SIZE" : "SLURM_NTASKS_PER_NODE", 1));
  check_memory_fits(in, o, local_ranks);
}

// This process as one rank of a job started by torchrun or Slurm (from their environment), or
// the only rank of a one-rank plan.
exec::RankEnv rank_env(const Strategy& s, const Launch& launch) {
  exec::RankEnv env;
  if (!launch.torchrun && !launch.slurm) {
    if (job_ranks(s) != 1) {
      throw InputError(fmt::format("the plan needs {}: add --nproc {}, or run under torchrun or Slurm",
                                   describe_ranks(s), job_ranks(s)));
    }
    return env;
  }
  const bool torchrun = launch.torchrun;
  env.rank = env_int(torchrun ? "RANK" : "SLURM_PROCID", 0);
  env.world = env_int(torchrun ? "WORLD_SIZE" : "SLURM_NTASKS", -1);
  if (env.world < 1) throw InputError(fmt::format("environment {}: required with {}", torchrun ? "WORLD_SIZE" : "SLURM_NTASKS", torchrun ? "RANK" : "SLURM_PROCID"));
  env.local_rank = env_int(torchrun ? "LOCAL_RANK" : "SLURM_LOCALID", torchrun ? env.rank : 0);
  env.master_addr = env_str("MASTER_ADDR", torchrun ? "127.0.0.1" : "");
  if (env.master_addr.empty()) throw InputError("environment MASTER_ADDR: required under Slurm (the first node's address)");
  if (!launch.spawned) check_master_addr(env.master_addr);
  env.master_port = env_port(29500, false);
  env.store_server_external = launch.spawned;
  env.status_fd = launch.spawned ? env_int("TRAINPLAN_STATUS_FD", -1) : -1;
  if (env.world != job_ranks(s))
    throw InputError(fmt::format("world size {} does not match the plan's {}", env.world, describe_ranks(s)));
  if (env.rank >= env.world) throw InputError(fmt::format("rank {} is not below the world size {}", env.rank, env.world));
  return env;
}

// Runs this rank; rank 0 prints and writes the measurement. A failed rank reports (to the local
// launcher, or on the console and, on rank 0, in the JSON) and ends the process.
int run_this_rank(const Context& ctx, const exec::ExecPlan& plan, const exec::ExecOptions& o, const exec::RankEnv& env,
                  const std::optional<JsonOutput>& json_out) {
  try {
    std::optional<Measurement> m = exec::run_rank(plan, o, env);
    if (m) {
      print_measurement(ctx.out, *m);
      if (json_out) json_out->write(measurement_to_json(*m));
    }
    return 0;
  } catch (const exec::RankFailure& e) {
    // Under the local launcher the launcher prints the job's one line; elsewhere each rank says why.
    if (env.status_fd < 0) ctx.err << "trainplan exec: " << e.what() << "\n";
    ctx.err.flush();
    ctx.out.flush();
    // Under the local launcher it writes the job's failure (it knows which rank failed first);
    // otherwise rank 0 writes what it saw.
    if (env.status_fd >= 0) {
      if (!e.reported) exec::report_rank_failure(env.status_fd, e.detail);
    } else if (json_out) {
      try {
        json_out->write(failed_measurement_to_json(run_description(plan, o, o.backend == "nccl", env.world), e.detail));
      } catch (const std::exception& w) {
        ctx.err << "trainplan exec: " << w.what() << "\n";
      }
    }
    // A failed rank leaves collectives in flight; tearing its process groups down can block on
    // peers that are gone, so this rank process ends here (the job has already failed).
    std::_Exit(1);
  }
}

// The arguments as given, with --gpus added where exec chooses it (default_gpus).
Args with_default_gpus(const Args& given) {
  Args args = given;
  if (const auto g = default_gpus(given)) {
    args.push_back("--gpus");
    args.push_back(*g);
  }
  return args;
}

// fp16's dynamic loss scaling is all --loss-scale and --loss-scale-window set; another dtype runs
// none, so either flag with it is refused.
void check_loss_scale_flags(const Flags& f, Dtype dtype) {
  for (const char* flag : {"loss-scale", "loss-scale-window"}) {
    if (f.has(flag) && dtype != Dtype::fp16)
      throw InputError(fmt::format("--{} {}: sets fp16's dynamic loss scaling; the plan runs {}, which has none "
                                   "(give --dtype fp16 or drop the flag)",
                                   flag, *f.get(flag), to_string(dtype)));
  }
}

// The run's notes, printed once nothing can be refused any more (just before the run): a refusal is
// exactly one line. A rank the local launcher spawned prints none (its launcher did).
void print_exec_notes(const Context& ctx, const PlanInputs& in, const Launch& launch) {
  if (launch.spawned) return;
  const std::string dropout =
      in.model.dropout > 0 ? fmt::format("{} has dropout {}; trainplan exec trains without dropout (as its software "
                                         "profile, trainplan-exec, predicts)",
                                         in.model.name, in.model.dropout)
                           : "";
  print_notes(ctx.err, "exec", {in.seq_note, in.split_note, dropout});
}

// --nproc: starts the job's ranks on this machine (each a `trainplan exec` with the same arguments)
// and waits for them; a failed job's description goes to --json.
int run_local_job(const Context& ctx, const Args& given, const PlanInputs& in, const exec::ExecPlan& plan,
                  const exec::ExecOptions& o, const Launch& launch, long long nproc,
                  const std::optional<std::string>& json_path) {
  const Strategy& s = in.strategy;
  if (nproc != job_ranks(s)) throw InputError(fmt::format("--nproc {}: the plan has {}", nproc, describe_ranks(s)));
  const std::optional<JsonOutput> out = open_json_output("json", json_path);  // an unwritable path: now
  std::vector<std::string> argv{"trainplan", "exec"};
  argv.insert(argv.end(), given.begin(), given.end());
  const Measurement run = run_description(plan, o, o.backend == "nccl", nproc);
  print_exec_notes(ctx, in, launch);
  return exec::launch_local(nproc, argv, env_port(0, true), ctx.err, [&](const RunFailure& fail) {
    if (out) out->write(failed_measurement_to_json(run, fail));
  });
}

// This process as one rank of the job (rank_env); rank 0 writes --json.
int run_as_rank(const Context& ctx, const PlanInputs& in, const exec::ExecPlan& plan, const exec::ExecOptions& o,
                const Launch& launch, const std::optional<std::string>& json_path) {
  const exec::RankEnv env = rank_env(in.strategy, launch);
  std::optional<JsonOutput> json_out;
  if (env.rank == 0) json_out = open_json_output("json", json_path);
  print_exec_notes(ctx, in, launch);
  return run_this_rank(ctx, plan, o, env, json_out);
}

}  // namespace

int cmd_exec(const Args& given, const Context& ctx) {
  const Args args = with_default_gpus(given);
  Flags f(args, "exec");
  if (f.help()) {
    ctx.out << kHelp << plan_flags_help() << kExecFlags;
    return 0;
  }
  // Before any input is read: the outputs (the dump prefixes name files too) writable, apart from
  // each other and from every input, and outside the built-in data folders. --data is streamed.
  const CommandFiles files(f, ctx, {"json", "dump-params", "dump-grads", "trace"}, {"data"});
  const bool cuda = exec::cuda_available();
  PlanInputs in = read_plan_flags(f, ctx.data_dir, "cpu-local", "trainplan-exec");
  // exec dispatches tokens by all-to-all whichever profile --software names for the prediction.
  if (!f.has("moe-dispatcher") && !f.has("plan")) in.strategy.dispatcher = Dispatcher::alltoall;
  const exec::ExecOptions o = read_exec_options(f, cuda);
  check_loss_scale_flags(f, in.strategy.dtype);
  const auto nproc = f.get_optional_int("nproc", 1, 1 << 20);
  const auto json_path = files.wants("json") ? std::optional<std::string>(files.path("json")) : std::nullopt;
  f.finish();
  Launch launch;
  launch.local = nproc && !launch.spawned && !launch.torchrun && !launch.slurm;
  check_exec_request(in, o, cuda);
  // The profile that describes what exec launches, unless --software names another.
  in.software = read_software_flag(f, ctx.data_dir, "trainplan-exec");
  const exec::ExecPlan plan = exec_plan(in);
  if (!launch.spawned) check_before_start(in, o, launch, nproc);
  if (launch.local) return run_local_job(ctx, given, in, plan, o, launch, *nproc, json_path);
  return run_as_rank(ctx, in, plan, o, launch, json_path);
}

}  // namespace trainplan::cli
