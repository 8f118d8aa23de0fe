// Measured op cost tables of one GPU (the "ops" object of a trainplan/cluster/v2 file) and their
// lookups. Every table holds kernel times measured on the GPU; nothing here is a fitted curve.
//
// Lookup rule, the same for every table: the achieved rate of a kernel (FLOP/s for GEMMs and
// attention, bytes/s for memory-bound kernels) is interpolated linearly in log(rate) over the log2
// of the kernel's shape, between measured shapes. Above the measured range the rate of the edge is
// held (clamped), so time keeps scaling with work; below it the rate keeps falling as it fell over
// the first measured step of that axis, as size^p with p clamped to [0, 1] (smaller kernels fill
// the GPU less well, but never take longer than larger ones). Measured points need not form
// a grid: at load they are spread onto the grid whose nodes along each axis are the measured
// coordinates (a node that is a measured shape takes that shape's rate; a combination that was
// not measured, inverse-distance weighting of the measured ones in log2 space, power 3), and a
// lookup is then multilinear on that grid in log2 coordinates (no allocation).
//
// One cleaning rule applies to GEMMs: a shape's time is capped by the time of any measured shape
// at least as large in M, N and K (work never shrinks as a GEMM grows; a larger time is a glitch
// of that measurement).
//
// Units: files store microseconds and bytes; everything here is seconds, bytes, FLOPs.
#pragma once
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "sim/units.hpp"

namespace trainplan {

class JsonObject;

// Which product of a linear layer y = x W^T: forward (x W^T), input gradient (dy W) or weight
// gradient (dy^T x). Each has M tokens, N outputs, K inputs as in the forward.
enum class GemmPass { fwd, dgrad, wgrad };

// Memory-bound kernel families measured per GPU. `bytes` of a lookup is the size of the kernel's
// main input tensor as the measurement defines it (see the "ops.memory_bound" comment in
// op_costs.cpp): the activation for norms/GELU/add, the gate+up input (2 x output) for SwiGLU,
// the 16-bit logits for fp32 cross-entropy, the fp32 parameters for AdamW.
enum class MemKernel { layer_norm, rms_norm, gelu, swiglu, add, cross_entropy_fp32, adamw_fused, adamw_foreach };
inline constexpr int kMemKernels = 8;
const char* to_string(MemKernel k);
// Parses a file spelling ("layer_norm", ...); false when unknown.
bool parse_mem_kernel(const std::string& s, MemKernel& out);

// A function of D log2-coordinates, tabulated on the grid of the measured coordinates.
template <int D>
class LogGrid {
 public:
  // `coords` are log2 of the shape, `values` the quantity to interpolate (here: log of a rate).
  void build(const std::vector<std::array<double, D>>& coords, const std::vector<double>& values);
  double at(const std::array<double, D>& log2_shape) const;  // multilinear, clamped to the grid
  bool empty() const { return values_.empty(); }
  double max_value() const;

 private:
  std::array<std::vector<double>, D> axis_;  // ascending log2 node positions per dimension
  std::vector<double> values_;               // row-major over the axes
};

struct GemmMeasure {
  double m = 0, n = 0, k = 0;            // tokens, outputs, inputs
  Seconds fwd = 0, dgrad = 0, wgrad = 0;
};
struct AttentionMeasure {
  double seq = 0, head_dim = 0, batch_heads = 0;  // causal self-attention, batch x heads instances
  Seconds fwd = 0, fwd_bwd = 0;
};
struct MemMeasure {
  Bytes bytes = 0;
  Seconds fwd = 0, fwd_bwd = 0;  // fwd_bwd = 0 where only a forward was measured (AdamW)
};

// The GPU a table was measured on ("ops.measured_on"): its name and datasheet figures, so that a
// cluster whose GPU differs from it can be told to derive its tables (derive_op_costs) instead of
// silently reusing another GPU's speeds.
struct MeasuredOn {
  std::string gpu;
  FlopsPerSecond peak = 0;        // dense datasheet peak in the table dtype
  BytesPerSecond hbm_bandwidth = 0;
};

// A published measured rate of one reference kernel on a GPU whose tables are derived (a cluster
// file's "ops.derive.achieved"): what lets the derivation rule scale by achieved rates instead of
// datasheet peaks. Rates are counted as the tables count them: 2MNK per GEMM, the causal half of
// attention (causal_attention_fwd_flops; the backward 2.5x the forward).
enum class ReferenceKernel { gemm, attention_fwd, attention_bwd };
struct AchievedRate {
  ReferenceKernel kernel = ReferenceKernel::gemm;
  Dtype dtype = Dtype::bf16;     // GEMM input format; attention runs in the table dtype
  bool best = false;             // GEMM: the best rate over a search of shapes (as "maximum
                                 // achievable matmul FLOPS" tables report), not the rate at one shape
  double m = 0, n = 0, k = 0;    // GEMM at one shape: M tokens, N outputs, K inputs (a forward product)
  double seq = 0, head_dim = 0;  // causal attention
  FlopsPerSecond rate = 0;
  // The same kernel at the same shape (or both best over shapes), whatever the format.
  bool same_reference(const AchievedRate& o) const {
    return kernel == o.kernel && best == o.best && m == o.m && n == o.n && k == o.k && seq == o.seq &&
           head_dim == o.head_dim;
  }
};

// A block-scaled format's GEMM rate relative to another format's, published for GPUs of the same
// tensor-core generation (a cluster file's "ops.derive.format_ratios"): where this GPU has no
// figure of its own in `format`, its speed-up over the table dtype is `over`'s times `ratio`;
// `over`'s is its achieved one where the file gives it, else `over_peak_speedup`, the datasheet
// peak ratio.
struct FormatRatio {
  Dtype format = Dtype::mxfp8;
  Dtype over = Dtype::fp8;
  double ratio = 1;
  double over_peak_speedup = 0;  // gpu.peak_tflops[over] / the table dtype's
};

// What the derivation rule needs of the GPU whose tables are derived.
struct DerivationInputs {
  std::string from;                     // the cluster whose measured tables are scaled
  FlopsPerSecond peak = 0;              // this GPU's dense datasheet peak in the table dtype
  BytesPerSecond hbm_bandwidth = 0;     // this GPU's HBM bandwidth
  bool keep_attention_kernels = false;  // see derive_op_costs
  std::vector<AchievedRate> achieved;   // published rates on this GPU; may be empty
  std::vector<FormatRatio> format_ratios;  // see FormatRatio; may be empty
  // Streaming multiprocessors (or compute units) of this GPU and of the measured one; either 0
  // (not stated) keeps every GEMM at its own shape (see derive_op_costs).
  int sm_count = 0, measured_sm_count = 0;
};

// How a derived table was made from a measured one (derive_op_costs); empty `from` when measured.
// Each ratio multiplies the measured rates of one family of tables; `*_achieved` says whether it
// came from published achieved rates (else it is the datasheet peak ratio).
struct OpDerivation {
  std::string from;                 // the cluster whose measured tables were scaled
  double gemm_ratio = 1;            // GEMM rates x this
  double attention_fwd_ratio = 1;   // attention forward rates x this
  double attention_bwd_ratio = 1;   // attention backward rates x this
  double memory_ratio = 1;          // memory-bound rates x this (target HBM bandwidth / measured)
  // A GEMM (m, n, k) on this GPU runs at the measured table's efficiency for (m x gemm_m_scale, n,
  // k x gemm_k_scale): the shape that gives the measured GPU as many tiles per SM and as long a
  // k-loop per tile (derive_op_costs). 1 and 1 on a measured table.
  double gemm_m_scale = 1, gemm_k_scale = 1;
  bool gemm_achieved = false, attention_fwd_achieved = false, attention_bwd_achieved = false;
  // Achieved speed-up of a quantized GEMM format over the table dtype on this GPU (its published
  // rate over the table-dtype rate published at the same shape); 0 where none was published and
  // the datasheet peak ratio stands (op_time.cpp).
  double fp8_speedup = 0, mxfp8_speedup = 0, nvfp4_speedup = 0;
  double format_speedup(Dtype d) const {
    return d == Dtype::fp8 ? fp8_speedup : d == Dtype::mxfp8 ? mxfp8_speedup : d == Dtype::nvfp4 ? nvfp4_speedup : 0;
  }
};

class OpCostTables {
 public:
  Dtype dtype = Dtype::bf16;      // dtype the GEMM and attention tables were measured in
  MeasuredOn measured_on;         // the GPU every time below was measured on (before derivation)
  OpDerivation derivation;        // how these times were derived from it (none: measured here)
  Seconds kernel_floor = 0;       // time per tiny kernel issued back to back (launch-bound floor)
  // Time multiplier for a GEMM whose row length (N or K) is not a multiple of 16 bytes: such
  // operands cannot take the aligned (TMA / 16-byte vector load) kernels. 1 where not measured.
  double misaligned_gemm_slowdown = 1;
  std::vector<GemmMeasure> gemm;
  std::vector<AttentionMeasure> attention;  // the attention kernel the calibration ran ("calibrated")
  // Other attention kernels timed or published on this GPU ("ops.attention_kernels"), by name: a
  // software profile names the kernel its stack runs (Software::attention_kernel).
  struct AttentionKernel {
    std::string name, source;
    std::vector<AttentionMeasure> points;
  };
  std::vector<AttentionKernel> attention_kernels;
  std::array<std::vector<MemMeasure>, kMemKernels> memory;

  // Builds the interpolation grids; call after filling the measured points (parse does).
  void prepare();

  // Time of one GEMM of M x N x K (2MNK FLOPs) in the table dtype.
  Seconds gemm_time(double m, double n, double k, GemmPass pass) const;
  // The attention_kernels entry of that name, or -1: the calibrated table ("calibrated", or a
  // kernel this GPU has no table for; see has_attention_kernel).
  int attention_kernel(const std::string& name) const;
  bool has_attention_kernel(const std::string& name) const {
    return name == kCalibratedAttention || attention_kernel(name) >= 0;
  }
  static constexpr const char* kCalibratedAttention = "calibrated";
  // Causal flash attention, `batch_heads` independent heads of `seq` x `head_dim`, with the kernel
  // of index `kernel` (attention_kernel(); -1: the calibrated table).
  Seconds attention_fwd(double seq, double head_dim, double batch_heads, int kernel = -1) const;
  Seconds attention_bwd(double seq, double head_dim, double batch_heads, int kernel = -1) const;
  // Memory-bound kernel on a tensor of `bytes` (see MemKernel).
  Seconds memory_fwd(MemKernel k, Bytes bytes) const;
  Seconds memory_bwd(MemKernel k, Bytes bytes) const;
  // Time to stream `bytes` through HBM (read + written) at the rate of the measured add kernel.
  Seconds stream(Bytes bytes_moved) const;
  bool has(MemKernel k) const { return !memory[static_cast<int>(k)].empty(); }
  // Fastest measured GEMM rate (FLOP/s), for bounds.
  FlopsPerSecond best_gemm_rate() const;
  FlopsPerSecond best_attention_rate() const;  // causal FLOPs per second, forward or backward

 private:
  std::array<LogGrid<3>, 3> gemm_grid_;      // per pass: log FLOP/s over log2 (m, n, k)
  // fwd, bwd: log FLOP/s over log2 (seq, head_dim); [0] the calibrated table, [1 + i] kernel i
  std::vector<std::array<LogGrid<2>, 2>> attention_grid_;
  std::array<std::array<LogGrid<1>, 2>, kMemKernels> memory_grid_;  // fwd, bwd: log bytes/s
};

// Causal attention FLOPs as the table counts them: QK^T and PV over half the score matrix,
// 2 * 2 * seq^2 * head_dim / 2 per head; backward 2.5x the forward (FlashAttention-2 paper, Sec. 4).
Flops causal_attention_fwd_flops(double seq, double head_dim, double batch_heads);
inline Flops causal_attention_bwd_flops(double seq, double head_dim, double batch_heads) {
  return 2.5 * causal_attention_fwd_flops(seq, head_dim, batch_heads);
}

// Reads the "ops" object of measured tables (exact keys; see op_costs.cpp for the format) and
// prepares the grids. A derived "ops" object ({"derive": ...}) is read by the cluster loader.
OpCostTables parse_op_costs(const JsonObject& o);

// The derivation rule: the tables of a GPU that was not measured, from the tables measured on
// another GPU (`measured`) and the figures of the new one, each kernel scaled by the resource that
// bounds it:
//   GEMM shape (tiles and k-loop): a GEMM's efficiency below the best is set by how its output
//     tiles fill the SMs (waves) and by how long each tile's k-loop runs against the tile's fixed
//     prologue and epilogue. So a GEMM (m, n, k) on this GPU takes the measured GPU's efficiency
//     at the shape that gives it the same tiles per SM, m x measured SMs / SMs, and the same
//     k-loop time, k x (measured peak per SM / peak per SM), both in the table dtype. A GPU with
//     fewer, slower SMs (A100 against H100) reaches its best rate at smaller shapes; one with
//     faster SMs (B200) needs larger ones. Datasheet figures only (gpu.sm_count, the peaks);
//     without both SM counts every GEMM keeps its own shape;
//   GEMM (compute-bound): rates x the ratio of ACHIEVED rates of a reference GEMM where this GPU's
//     file states published ones (in.achieved, table dtype): this GPU's rate over the measured
//     table's rate for the same reference, at the shape it maps to (the forward product), or, for
//     a best-over-shapes figure, the table's best rate (OpCostTables::best_gemm_rate); several
//     figures give the geometric mean of their ratios. Without one, the datasheet peak ratio
//     in.peak / measured_on.peak (the assumption: the same fraction of peak per shape);
//   attention forward and backward: the same, each from its own reference figures (causal flash
//     attention at a sequence length and head dimension), else the peak ratio;
//   quantized GEMM formats (fp8, mxfp8, nvfp4): their achieved speed-up over the table dtype, the
//     geometric mean over their figures of the format's rate over the table-dtype figure of the
//     same reference on this GPU (OpDerivation::format_speedup); else, where the file states a
//     format ratio published for the same tensor-core generation (in.format_ratios), the other
//     format's speed-up times that ratio; else op_time.cpp's peak ratio;
//   memory-bound kernels (norms, activations, adds, cross-entropy, AdamW): time x
//     measured_on.hbm_bandwidth / hbm_bandwidth (the same fraction of HBM bandwidth per size);
//   the kernel floor (launch and host overhead per kernel) and the misaligned-GEMM slowdown are
//     kept: they are set by the host and the kernels' alignment, not by the GPU's arithmetic;
//   named attention kernels (attention_kernels) are dropped unless `keep_attention_kernels`: such
//     a table is a fact about one kernel on the measured GPU's architecture (FlashAttention-2 has
//     no Hopper code path), and on another architecture the calibrated table stands for the
//     stack's kernel; keep them only for a GPU with the same SM (H200 on H100's GH100).
// Every built-in cluster not measured itself (A100, L40S, H200, Blackwell, AMD) uses this rule.
// The achieved figures are checked by the cluster loader (cluster.cpp); here they must be positive.
OpCostTables derive_op_costs(const OpCostTables& measured, const DerivationInputs& in);

// Largest relative difference between a table's measured_on GPU and the cluster's GPU (peak in the
// table dtype, HBM bandwidth) under which a cluster may use measured tables as they are.
inline constexpr double kMeasuredGpuTolerance = 0.10;

// A measured table's interpolation grid has a node for every combination of its points' distinct
// coordinates, and building it weighs every point at every node: nodes x points. A table of 400
// scattered GEMM shapes (a 40 KB file) made 6.4e7 nodes and ran for minutes, so a table whose
// nodes x points exceeds this is refused (the built-in tables are near 2e4).
inline constexpr double kMaxOpTableWork = 1 << 26;

// nodes x points of a table whose points have these coordinates (one array per point).
template <std::size_t D>
double op_table_work(const std::vector<std::array<double, D>>& points) {
  double nodes = 1;
  for (std::size_t d = 0; d < D; ++d) {
    std::vector<double> axis;
    for (const auto& p : points) axis.push_back(p[d]);
    std::sort(axis.begin(), axis.end());
    nodes *= static_cast<double>(std::unique(axis.begin(), axis.end()) - axis.begin());
  }
  return nodes * static_cast<double>(points.size());
}

}  // namespace trainplan
