// The training data of exec: a seeded synthetic token stream (each next token a fixed affine map
// of the previous plus small noise, so the loss can fall), or windows of a uint16 token file.
// Every layout reads the same sequences in the same order, so all layouts train on the same data.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace trainplan::exec {

class TokenSource {
 public:
  // `data_file` empty: synthetic tokens from `seed`. Throws RankFailure when the file cannot be
  // read or is shorter than one sequence.
  TokenSource(long long seed, const std::string& data_file, int vocab, int seq);

  // Sequence number `index` of the job's stream: seq + 1 tokens (int64, CPU).
  at::Tensor sequence(int64_t index);

  // Micro-batch `mb` of data-parallel replica `replica` in step `step`: [micro_batch, seq + 1].
  // The sequences of one step are step*G .. step*G + G-1 whatever the layout (G = global batch);
  // replica d's micro-batch mb holds sequences (mb*dp + d)*micro_batch + j, j < micro_batch.
  at::Tensor micro_batch(int step, int mb, int replica, int dp, int micro_batch, int global_batch);

 private:
  long long seed_;
  std::string file_name_;
  int vocab_, seq_;
  std::ifstream file_;
  int64_t n_tokens_ = 0;
};

}  // namespace trainplan::exec
