// trainplan exec: run one training plan for real, as one rank of a job, and measure it.
// This header has no LibTorch in it so that the CLI can include it cheaply.
#pragma once
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "exec/faults.hpp"
#include "sim/measurement.hpp"
#include "sim/model_spec.hpp"
#include "sim/strategy.hpp"

namespace trainplan::exec {

// The executor's memory behaviour, as the software profile that describes it names it
// (software/trainplan-exec.json "describes_executor"); every measurement records it
// (Measurement::executor) and `trainplan compare` says when a measurement came from an executor
// other than the one the prediction's profile describes. Change it whenever what exec keeps in
// memory changes (which tensors, their widths, their lifetimes, the allocator setting), and refit
// the profile with it: tests/exec/test_exec_memory.cpp holds the two equal and fails when exec's bytes
// by category move away from what the profile predicts or from those recorded for this name.
//   mem-1  the executor measured on the H100 (commit e64f6de; its measurements predate the name)
//   mem-2  fused q/k/v and gate/up GEMMs, chunked loss, fused AdamW, expandable segments
//   mem-3  RMSNorm, RoPE and SwiGLU as fused kernels by default (--fused-kernels auto), q/k/v split
//          by split_with_sizes, the loss's 16-bit casts of the head and its input made once
inline constexpr const char* kExecutorFingerprint = "mem-3";

// Which of the model's elementwise and per-row ops run as exec/kernels/fused_ops (one kernel
// forward, one backward) instead of LibTorch: none, all, or (automatic) those LibTorch runs here
// as several kernels -- RMSNorm, RoPE, SwiGLU -- leaving LayerNorm and GELU to LibTorch's single
// kernels. On one H200 (reports/measurements/README.md) the three fused saved 0.28 s of a
// llama-1b step's 1.50 s of kernel time, while the fused LayerNorm and GELU cost gpt2-xl 0.06 s
// more than LibTorch's.
enum class FusedKernels { off, automatic, on };
inline const char* to_string(FusedKernels f) {
  return f == FusedKernels::off ? "off" : f == FusedKernels::on ? "on" : "auto";
}

struct ExecOptions {
  int steps = 3;               // measured steps
  int warmup = 1;              // steps run first and discarded
  long long seed = 1234;       // parameters and synthetic data
  std::string backend;         // "gloo" | "nccl"
  std::string device;          // "cpu" | "cuda"; empty: cuda with nccl, else cpu
  double timeout_s = 30;       // collective / rendezvous timeout
  double lr = 1e-3;            // AdamW learning rate (constant)
  double loss_scale = 65536;   // fp16: initial dynamic loss scale
  int loss_scale_window = 2000;  // fp16: good steps before the scale grows
  double bucket_bytes = 16.0 * (1 << 20);  // DP gradient bucket (fp32 bytes)
  FusedKernels fused_kernels = FusedKernels::automatic;  // which ops run as exec/kernels/fused_ops
  std::string data_file;       // optional: little-endian uint16 token file; empty: synthetic
  std::string dump_params;     // debug: write this rank's parameters to <dump_params>.rank<R>
  std::string dump_grads;      // debug: ...and the reduced gradients of the first step to <dump_grads>.rank<R>
  std::string trace;           // one more step, after the measured ones, under the profiler: <trace>.rank<R>.json
  // bf16/fp16 plans on the CPU: false computes fp32 (and records that); true runs them under CPU
  // autocast with fp32 master weights as on GPUs (slow; checks the mixed-precision paths, ZeRO-3's
  // 16-bit gathers among them, without a GPU).
  bool cpu_autocast = false;
  // Measurement: each rank's step bytes by what they hold (exec/memory_probe.hpp), recorded as
  // environment.memory_accounting; off by default (every allocation then reports to a probe).
  bool memory_accounting = false;
  FaultOptions faults;         // test only: a rank that dies or hangs
};

// Where this process sits in the job (from RANK/WORLD_SIZE/... or SLURM_*, or the local spawner).
struct RankEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  bool store_server_external = false;  // the local spawner holds the TCPStore server
  int status_fd = -1;                  // the local spawner's progress pipe, -1 when none
};

// The plan as exec runs it: model, strategy, and the layers of each virtual stage (as predict
// partitions them).
struct ExecPlan {
  ModelSpec model;
  Strategy strategy;
  std::string cluster;                 // topology name, recorded in the measurement
  std::vector<int> first_layer;        // per virtual stage (chunk * pp + stage)
  std::vector<int> layers;             // per virtual stage
  double model_flops_per_step = 0;
};

// Runs this rank's share of warmup + steps training steps. Returns the job's measurement on rank 0
// and nothing on the others. Throws RankFailure when a collective fails or times out (message
// names this rank and the step).
std::optional<Measurement> run_rank(const ExecPlan& plan, const ExecOptions& opt, const RankEnv& env);

// A rank's failure: what() is the message for the console ("rank 1 failed in step 2: ..."),
// `detail` the rank, step, phase, error and memory at the failure for the failed-run JSON.
struct RankFailure : std::runtime_error {
  explicit RankFailure(const std::string& what) : std::runtime_error(what) { detail.error = what; }
  RankFailure(const std::string& what, RunFailure d) : std::runtime_error(what), detail(std::move(d)) {}
  RunFailure detail;
  bool reported = false;  // already sent to the local launcher (report_rank_failure)
};

// A rank started by launch_local tells the launcher why it failed (one line on its status pipe,
// written at once), so that the launcher can report the rank that failed first.
void report_rank_failure(int status_fd, const RunFailure& f);
// ...and where it is: the step and phase it has entered (the launcher names them if it dies).
void report_rank_progress(int status_fd, int rank, int step, const std::string& phase);

// True when this build can use CUDA and a device is visible.
bool cuda_available();

// Spawns `nproc` local ranks running `argv` (this program), each with RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT set; holds the rendezvous store; waits. When one rank fails
// it names the rank and its last step, stops the others (SIGTERM, then SIGKILL), calls
// `on_failure` (when set) with the failure that came first, and returns 1. The cause, in order: a
// rank killed by a signal; a rank that stopped responding; the first rank to report an error.
// Children die with the launcher (PR_SET_PDEATHSIG). `port` 0 picks a free one.
int launch_local(int nproc, const std::vector<std::string>& argv, int port, std::ostream& err,
                 const std::function<void(const RunFailure&)>& on_failure = {});

}  // namespace trainplan::exec
