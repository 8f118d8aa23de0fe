// The token source (see tokens.hpp).
#include "exec/tokens.hpp"

#include <fmt/format.h>

#include <ATen/CPUGeneratorImpl.h>

#include <vector>

#include "exec/exec.hpp"

namespace trainplan::exec {

TokenSource::TokenSource(long long seed, const std::string& data_file, int vocab, int seq)
    : seed_(seed), file_name_(data_file), vocab_(vocab), seq_(seq) {
  if (data_file.empty()) return;
  file_.open(data_file, std::ios::binary | std::ios::ate);
  if (!file_) throw RankFailure(fmt::format("--data {}: cannot open", data_file));
  n_tokens_ = static_cast<int64_t>(file_.tellg()) / 2;
  if (n_tokens_ < seq + 2) throw RankFailure(fmt::format("--data {}: fewer than {} tokens", data_file, seq + 2));
}

at::Tensor TokenSource::sequence(int64_t index) {
  at::Tensor t = at::empty({seq_ + 1}, at::kLong);
  auto a = t.accessor<int64_t, 1>();
  if (file_.is_open()) {
    const int64_t start = (index * (seq_ + 1)) % (n_tokens_ - seq_ - 1);
    std::vector<uint16_t> buf(seq_ + 1);
    file_.seekg(start * 2);
    file_.read(reinterpret_cast<char*>(buf.data()), 2 * (seq_ + 1));
    for (int i = 0; i <= seq_; ++i) {
      if (buf[i] >= vocab_) throw RankFailure(fmt::format("data file token {} >= vocab {}", buf[i], vocab_));
      a[i] = buf[i];
    }
    return t;
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(
      (static_cast<uint64_t>(seed_) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(index) * 0xBF58476D1CE4E5B9ull) >> 2);
  at::Tensor noise = at::randint(0, 4, {seq_ + 1}, gen, at::kLong);
  auto na = noise.accessor<int64_t, 1>();
  a[0] = na[0] * 61 % vocab_;
  for (int i = 1; i <= seq_; ++i) a[i] = (a[i - 1] * 5 + 1 + na[i]) % vocab_;
  return t;
}

at::Tensor TokenSource::micro_batch(int step, int mb, int replica, int dp, int micro_batch, int global_batch) {
  std::vector<at::Tensor> rows;
  for (int j = 0; j < micro_batch; ++j) {
    const int64_t index = int64_t(step) * global_batch + (int64_t(mb) * dp + replica) * micro_batch + j;
    rows.push_back(sequence(index));
  }
  return at::stack(rows);
}

}  // namespace trainplan::exec
