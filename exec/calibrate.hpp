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
#include "sim/units.hpp"

namespace trainplan::exec {

struct CalibrateOptions {
  std::string device = "cpu";          // "cpu" | "cuda"
  int threads = 1;                     // CPU: intra-op threads of one rank (torch::set_num_threads)
  int warmup = 3;
  int repeats = 10;
  struct Shape {
    int m = 0, n = 0, k = 0;           // c[m x n] = a[m x k] b[k x n]
  };
  std::vector<Shape> gemm_shapes;      // empty: a default ladder of squares
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

// Runs the link test first (it forks the local ranks before this process starts any LibTorch
// threads or CUDA context), then the device benchmarks. Throws InputError for unusable options.
CalibrationResult calibrate(const CalibrateOptions& o);

}  // namespace trainplan::exec
