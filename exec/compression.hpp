// Gradient compression in the ZeRO-0 data-parallel all-reduce: what `--grad-compression` asks the
// executor to put on the wire instead of the fp32 gradients (the scheme compressed_all_reduce of
// grad_sync.hpp runs it; the planner costs the same bytes, sim/compression.hpp).
//   bf16       the gradient is cast to bfloat16, all-reduced (summed) in bfloat16 and cast back:
//              half the bytes, rounding error ~2^-9 relative per element and sum.
//   powersgd:r rank-r PowerSGD with error feedback (Vogels, Karimireddy & Jaggi, NeurIPS 2019,
//              Algorithm 1), per gradient matrix M (m x n, this rank's contribution plus its error
//              from the previous step), Q (n x r) kept from the previous step (warm start):
//                P = M Q;  all-reduce P;  P = orthonormal columns of P;  Q = Mᵀ P;  all-reduce Q;
//                M̂ = P Qᵀ (the approximated sum over ranks);  error = M - M̂ / W (W ranks);
//              2 all-reduces of (m + n)·r elements instead of one of m·n. Matrices where
//              (m + n)·r >= m·n, and every non-matrix parameter (biases, norms), are all-reduced
//              uncompressed in fp32.
// Gradients arrive already divided by the global batch (the runner scales the loss), so the sum
// over ranks is the mean gradient, as with the uncompressed all-reduce.
#pragma once
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "exec/model.hpp"
#include "exec/parallel.hpp"
#include "sim/strategy.hpp"

namespace trainplan::exec {

class GradCompressor {
 public:
  // `seed`: the initial Q matrices are drawn from it, the same on every DP rank.
  GradCompressor(const GradCompression& kind, long long seed);
  ~GradCompressor();
  GradCompressor(const GradCompressor&) = delete;
  GradCompressor& operator=(const GradCompressor&) = delete;

  // Registers the next model chunk: its flat gradient and the parameters laid out in it. Returns
  // the chunk's index for reduce().
  int add_chunk(const at::Tensor& flat_grad, const std::vector<ParamInfo>& params);
  // Replaces the chunk's flat gradient by its (compressed) sum over `dp`, in place; waits. (dp
  // counts the bytes: Comm::bytes_sent.)
  void reduce(int chunk, Comm& dp);

 private:
  struct Matrix;
  struct Chunk;
  GradCompression kind_;
  long long seed_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
};

}  // namespace trainplan::exec
