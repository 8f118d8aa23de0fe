#include "sim/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sim/check.hpp"

namespace trainplan {

namespace {

std::vector<Slot> gpipe(int m) {
  std::vector<Slot> out;
  for (int mb = 0; mb < m; ++mb) out.push_back({Phase::forward, mb, 0});
  for (int mb = 0; mb < m; ++mb) out.push_back({Phase::backward, mb, 0});
  return out;
}

std::vector<Slot> one_f_one_b(int p, int stage, int m) {
  const int warmup = std::min(p - stage - 1, m);
  std::vector<Slot> out;
  for (int mb = 0; mb < warmup; ++mb) out.push_back({Phase::forward, mb, 0});
  for (int k = 0; k < m - warmup; ++k) {
    out.push_back({Phase::forward, warmup + k, 0});
    out.push_back({Phase::backward, k, 0});
  }
  for (int mb = m - warmup; mb < m; ++mb) out.push_back({Phase::backward, mb, 0});
  return out;
}

// Megatron-LM's interleaved order. Virtual micro-batch k (0 <= k < m*v) of a stage maps to
// chunk (k mod p*v) / p (reversed for backwards) and micro-batch (k / (p*v))*p + k mod p.
std::vector<Slot> interleaved(int p, int stage, int m, int v) {
  const int total = m * v;
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  auto slot = [&](int k, Phase phase) {
    int chunk = (k % (p * v)) / p;
    if (phase == Phase::backward) chunk = v - 1 - chunk;
    return Slot{phase, (k / (p * v)) * p + k % p, chunk};
  };
  std::vector<Slot> out;
  for (int k = 0; k < warmup; ++k) out.push_back(slot(k, Phase::forward));
  for (int k = 0; k < total - warmup; ++k) {
    out.push_back(slot(warmup + k, Phase::forward));
    out.push_back(slot(k, Phase::backward));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(slot(k, Phase::backward));
  return out;
}

// ZB-H1: see the header. `held` W passes wait in FIFO order; stage i releases one after each B
// once it has run i Bs (so it always holds back i), and the rest after its last B.
std::vector<Slot> zero_bubble_h1(int p, int stage, int m) {
  const int warmup = std::min(p - stage - 1, m);
  std::vector<Slot> out;
  int next_w = 0, bs = 0;
  auto backward = [&](int mb) {
    out.push_back({Phase::backward, mb, 0});
    if (++bs > stage) out.push_back({Phase::backward_weight, next_w++, 0});
  };
  for (int mb = 0; mb < warmup; ++mb) out.push_back({Phase::forward, mb, 0});
  for (int k = 0; k < m - warmup; ++k) {
    out.push_back({Phase::forward, warmup + k, 0});
    backward(k);
  }
  for (int mb = m - warmup; mb < m; ++mb) backward(mb);
  while (next_w < m) out.push_back({Phase::backward_weight, next_w++, 0});
  return out;
}

}  // namespace

Schedule make_zero_bubble_schedule(int stages, int micro_batches) {
  TRAINPLAN_CHECK(stages >= 1 && micro_batches >= 1, "schedule sizes must be >= 1");
  Schedule s{ScheduleKind::one_f_one_b, stages, micro_batches, 1, {}, true};
  for (int i = 0; i < stages; ++i) s.per_stage.push_back(zero_bubble_h1(stages, i, micro_batches));
  return s;
}

Schedule make_schedule(ScheduleKind kind, int stages, int micro_batches, int chunks) {
  TRAINPLAN_CHECK(stages >= 1 && micro_batches >= 1 && chunks >= 1, "schedule sizes must be >= 1");
  if (kind == ScheduleKind::interleaved) {
    TRAINPLAN_CHECK(micro_batches % stages == 0, "interleaved schedule needs micro-batches divisible by stages");
  } else {
    TRAINPLAN_CHECK(chunks == 1, "only the interleaved schedule has several chunks per stage");
  }
  Schedule s{kind, stages, micro_batches, chunks, {}, false};
  for (int i = 0; i < stages; ++i) {
    switch (kind) {
      case ScheduleKind::gpipe: s.per_stage.push_back(gpipe(micro_batches)); break;
      case ScheduleKind::one_f_one_b: s.per_stage.push_back(one_f_one_b(stages, i, micro_batches)); break;
      case ScheduleKind::interleaved: s.per_stage.push_back(interleaved(stages, i, micro_batches, chunks)); break;
    }
  }
  return s;
}

int Schedule::peak_in_flight(int stage) const {
  int live = 0, peak = 0;
  for (const Slot& s : per_stage.at(stage)) {
    const Phase frees = split_backward ? Phase::backward_weight : Phase::backward;
    live += s.phase == Phase::forward ? 1 : s.phase == frees ? -1 : 0;
    peak = std::max(peak, live);
  }
  return peak;
}

std::string to_string(const Slot& s) {
  const char letter = s.phase == Phase::forward ? 'F' : s.phase == Phase::backward ? 'B' : 'W';
  return fmt::format("{}{}.{}", letter, s.micro_batch, s.chunk);
}

Schedule schedule_for(const Strategy& s) { return make_schedule(s.schedule, s.pp, s.micro_batches(), s.vp); }

}  // namespace trainplan
