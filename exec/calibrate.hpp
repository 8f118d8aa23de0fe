// Calibration micro-benchmarks: what one device (a GPU, or the CPU cores one rank gets) and the
// link between local ranks actually deliver. `trainplan calibrate` turns the result into a
// topology file (topologies/*.json) that predict reads. No LibTorch types in this header.
//
// Benchmark practice (DESIGN.md convention 8): every figure is the median of `repeats` timed runs
// after `warmup` untimed ones; on CUDA each run is bracketed by device synchronisation.
#pragma once
#include <string>
#include <vector>

#include "sim/calibration.hpp"
#include "sim/layer_graph.hpp"
#include "sim/units.hpp"

namespace trainplan::exec {

struct CalibrateOptions {
  std::string device = "cpu";          // "cpu" | "cuda"
  int threads = 1;                     // CPU: intra-op threads of one rank (torch::set_num_threads)
  int warmup = 3;
  int repeats = 10;
  struct Shape {
    int m = 0, n = 0, k = 0;           // y[m x n] = x[m x k] W^T: tokens, outputs, inputs
    std::string label;                 // where the shape comes from (console and "source")
  };
  // Every shape is timed as forward x W^T, dgrad dy W and wgrad dy^T x.
  std::vector<Shape> gemm_shapes;      // squares (--sizes, --shapes); empty and no model shapes: a ladder
  std::vector<Shape> model_shapes;     // one transformer layer's GEMMs (layer_gemm_shapes)
  std::vector<int> attention_seqs;     // causal SDPA sequence lengths; empty: a default ladder
  std::vector<int> attention_head_dims;  // empty: 64 and 128
  std::vector<Bytes> mem_bytes;        // memory-bound kernels' input sizes; empty: a default ladder
  int launches = 2000;                 // back-to-back tiny kernels per kernel-floor sample
  int host_chain_layers = 16;          // layers the deep chain of the host-time test adds
  Bytes copy_bytes = 0;                // size of the copied buffer; 0: a default
  int link_ranks = 2;                  // local processes in the all-reduce test; < 2: skip it
  std::string link_backend = "gloo";   // "gloo" | "nccl"
  std::vector<Bytes> link_bytes;       // all-reduce message sizes; empty: a default ladder
};

// The result types (GemmPoint, LinkPoint, LinkResult, CalibrationResult) live in
// sim/calibration.hpp: reports/ formats them without depending on exec/.
using trainplan::CalibrationResult;
using trainplan::GemmPoint;
using trainplan::LinkPoint;
using trainplan::LinkResult;

// The GEMMs of one transformer layer of `graph`'s model and its LM head (the layer graph's matmul
// ops other than the attention core) as op_time.cpp issues them for tensor parallelism `tp`:
// column-parallel QKV, MLP up and LM head split N by tp, row-parallel output projection and MLP
// down split K. K is the op's input width, N = forward FLOPs per token / (2 K). One shape per
// token count in `tokens`.
std::vector<CalibrateOptions::Shape> layer_gemm_shapes(const LayerGraph& graph, int tp, const std::vector<int>& tokens);

// Runs the link test first (it forks the local ranks before this process starts any LibTorch
// threads or CUDA context), then the device benchmarks. Throws InputError for unusable options.
CalibrationResult calibrate(const CalibrateOptions& o);

}  // namespace trainplan::exec
