// What `trainplan calibrate` measured on one device and the local link (exec/calibrate.hpp runs
// the micro-benchmarks; reports/calibration_report.hpp turns the result into a topology file and
// a console table). Plain data, no LibTorch.
//
// Benchmark practice (DESIGN.md convention 8): every figure is the median of `repeats` timed runs
// after `warmup` untimed ones; on CUDA each run is bracketed by device synchronisation.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "sim/units.hpp"

namespace trainplan {

struct GemmPoint {
  int m = 0, n = 0, k = 0;             // tokens, outputs, inputs of y[m x n] = x[m x k] W^T
  Flops flops = 0;                     // 2 m n k
  Seconds median = 0;                  // forward x W^T
  FlopsPerSecond rate = 0;             // flops / median
  Seconds dgrad = 0;                   // dy[m x n] W[n x k]
  Seconds wgrad = 0;                   // dy^T[n x m] x[m x k]
  std::string label;                   // where the shape comes from, e.g. "gpt2 qkv tp1"
};

// Causal SDPA of `batch_heads` heads of seq x head_dim (the "ops.attention" rows).
struct AttentionPoint {
  int seq = 0, head_dim = 0, batch_heads = 0;
  Seconds fwd = 0, fwd_bwd = 0;
};

// One memory-bound kernel on an input tensor of `bytes` (the "ops.memory_bound" rows; `kernel`
// is the file spelling, sim/op_costs.hpp MemKernel). AdamW: fwd is one optimizer step, fwd_bwd 0.
struct MemPoint {
  std::string kernel;
  Bytes bytes = 0;
  Seconds fwd = 0, fwd_bwd = 0;
};

struct LinkPoint {
  Bytes bytes = 0;                     // all-reduced buffer
  Seconds median = 0;                  // slowest rank's median
};

struct LinkResult {
  bool measured = false;
  std::string note;                    // how it was measured, or why it was not
  int ranks = 0;
  std::vector<LinkPoint> points;
  // Fitted to the ring all-reduce cost used by sim/collectives.hpp,
  //   t(M) = 2(n-1) a + 2(n-1)/n M / B:
  // a from the (up to three) smallest messages (their bandwidth term removed, median), B from the
  // largest (its latency term removed).
  Seconds latency = 0;
  BytesPerSecond bus_bandwidth = 0;
};

struct CalibrationResult {
  std::string device_name;             // CPU model or GPU name
  std::string dtype;                   // matmul dtype measured: "fp32" (CPU) or "bf16" (CUDA)
  int threads = 0;
  std::vector<GemmPoint> gemm;         // ascending flops; of shapes with equal flops, the fastest
  FlopsPerSecond best_gemm_rate = 0;
  BytesPerSecond copy_bandwidth = 0;   // (read + write bytes) / median time of one large copy
  Flops attention_flops = 0;           // one fused attention forward (SDPA, not causal)
  FlopsPerSecond attention_rate = 0;
  int attention_seq = 0, attention_head_dim = 0, attention_batch_heads = 0;  // its shape
  // A small matmul as training runs it: y = x w through autograd, forward and backward (three
  // kernels of 2 m n k FLOPs each, m x k = 128 x 64, k x n = 64 x 64 on CPU; 4096 x 1024 x 1024 on
  // CUDA). Against the bare mm_out time of the same size it shows the framework's per-op cost,
  // which the topology schema has no field for (reported in the calibration text only).
  Seconds autograd_matmul = 0;
  Seconds bare_matmul = 0;        // one mm_out of the same shape
  int autograd_m = 0, autograd_n = 0, autograd_k = 0;
  // Host time per kernel: the slope of a chain of host_chain_dim-square linear layers' forward +
  // backward time between host_chain_layers[0] and [1] layers, per added kernel (three per layer);
  // backward_call_overhead is what is left of the shallow chain's time: the fixed cost of one
  // forward + backward() call. Software profiles take the first as host.per_kernel_us.
  Seconds host_per_kernel = 0;
  Seconds backward_call_overhead = 0;
  std::array<int, 2> host_chain_layers{};
  int host_chain_dim = 0;
  Bytes baseline_rss = 0;              // this process's resident set after LibTorch start-up (CPU)
  std::string torch_version;
  LinkResult link;
  // The op tables predict reads (sim/op_costs.hpp), measured one by one.
  std::vector<AttentionPoint> attention;    // causal, forward and forward + backward
  std::vector<MemPoint> memory;             // by kernel, ascending bytes
  Seconds kernel_floor = 0;                 // time per tiny kernel issued back to back
  // One GEMM with N one element off a 16-byte multiple against the aligned shape, forward + dgrad +
  // wgrad time over the aligned one's (at least 1): the tables' misaligned_gemm_slowdown.
  double misaligned_gemm_slowdown = 1;
  int misaligned_m = 0, misaligned_n = 0, misaligned_k = 0;  // the aligned shape; N - 1 is the other
  int kernel_floor_launches = 0;            // how many back-to-back kernels one sample issued
  std::string timing;                       // "CUDA events" or "wall clock"
  int warmup = 0, repeats = 0;
  std::vector<std::string> notes;           // what could not be measured here, and why
};

}  // namespace trainplan
