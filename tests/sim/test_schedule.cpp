// Pipeline schedules as data: orders checked against the published definitions.
//   GPipe (Huang et al. 2019): all forwards, then all backwards.
//   1F1B / PipeDream-Flush (Narayanan et al. 2021, Sec. 2.2.1, Fig. 4 top): stage i runs
//     min(p - i - 1, m) warm-up forwards, then one forward / one backward, then the backwards left.
//   Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2, Fig. 4 bottom; Megatron-LM
//     forward_backward_pipelining_with_interleaving): (p - i - 1) * 2 + (v - 1) * p warm-up
//     forwards, chunks visited in groups of p micro-batches, backwards in reverse chunk order.
//   ZB-H1 (Qi et al. 2024, Sec. 3.1): 1F1B with the backward split into B and W, W held back.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "sim/schedule.hpp"

namespace {

using namespace trainplan;

std::string order(const std::vector<Slot>& slots) {
  std::ostringstream os;
  for (std::size_t k = 0; k < slots.size(); ++k) os << (k ? " " : "") << to_string(slots[k]);
  return os.str();
}

int leading_forwards(const std::vector<Slot>& slots) {
  int n = 0;
  while (n < static_cast<int>(slots.size()) && slots[n].phase == Phase::forward) ++n;
  return n;
}

TEST(Schedule, GPipeRunsAllForwardsThenAllBackwards) {
  const Schedule s = make_schedule(ScheduleKind::gpipe, 3, 4);
  ASSERT_EQ(s.per_stage.size(), 3u);
  for (const auto& stage : s.per_stage) EXPECT_EQ(order(stage), "F0.0 F1.0 F2.0 F3.0 B0.0 B1.0 B2.0 B3.0");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.peak_in_flight(i), 4);
}

TEST(Schedule, OneFOneBStageOrdersByHand) {
  // p = 4, m = 6 (Narayanan et al. 2021, Fig. 4 top, with 6 micro-batches).
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 4, 6);
  EXPECT_EQ(order(s.per_stage[0]), "F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 B3.0 B4.0 B5.0");
  EXPECT_EQ(order(s.per_stage[1]), "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 F4.0 B2.0 F5.0 B3.0 B4.0 B5.0");
  EXPECT_EQ(order(s.per_stage[2]), "F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 F4.0 B3.0 F5.0 B4.0 B5.0");
  EXPECT_EQ(order(s.per_stage[3]), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 F5.0 B5.0");
}

TEST(Schedule, OneFOneBWarmupIsPMinusStageMinusOne) {
  for (int p : {1, 2, 4, 8, 16}) {
    for (int m : {1, 2, 3, 8, 32}) {
      const Schedule s = make_schedule(ScheduleKind::one_f_one_b, p, m);
      for (int i = 0; i < p; ++i) {
        const int warmup = std::min(p - i - 1, m);
        // The warm-up forwards, plus the first steady-state forward when there is one.
        EXPECT_EQ(leading_forwards(s.per_stage[i]), warmup < m ? warmup + 1 : m) << "p=" << p << " m=" << m << " i=" << i;
        // Steady state alternates F, B; then only backwards.
        const auto& slots = s.per_stage[i];
        for (int k = 0; k < m - warmup; ++k) {
          EXPECT_EQ(slots[warmup + 2 * k].phase, Phase::forward);
          EXPECT_EQ(slots[warmup + 2 * k + 1].phase, Phase::backward);
        }
        // Activations held at once: p - i micro-batches (Narayanan et al. 2021, Sec. 2.2.1).
        EXPECT_EQ(s.peak_in_flight(i), std::min(p - i, m));
      }
    }
  }
}

TEST(Schedule, InterleavedStageOrderByHand) {
  // p = 2, v = 2, m = 4. Virtual micro-batch k -> chunk (k mod 4) / 2, micro-batch (k / 4) * 2 + k mod 2.
  // Stage 0 warms up with (2-0-1)*2 + (2-1)*2 = 4 forwards; stage 1 with 2.
  const Schedule s = make_schedule(ScheduleKind::interleaved, 2, 4, 2);
  EXPECT_EQ(order(s.per_stage[0]), "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(order(s.per_stage[1]), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(s.virtual_stage(1, 1), 3);
  EXPECT_EQ(s.virtual_stages(), 4);
}

TEST(Schedule, InterleavedWarmupMatchesMegatron) {
  for (int p : {2, 4, 8}) {
    for (int v : {2, 3, 4}) {
      for (int groups : {1, 2, 4}) {
        const int m = groups * p;
        const Schedule s = make_schedule(ScheduleKind::interleaved, p, m, v);
        for (int i = 0; i < p; ++i) {
          const int total = m * v;
          const int warmup = std::min((p - i - 1) * 2 + (v - 1) * p, total);
          EXPECT_EQ(leading_forwards(s.per_stage[i]), warmup < total ? warmup + 1 : total)
              << "p=" << p << " v=" << v << " m=" << m << " i=" << i;
          EXPECT_EQ(s.peak_in_flight(i), std::min(warmup + 1, total));
          // The first forwards visit chunk 0 for p micro-batches, then chunk 1, ...
          for (int k = 0; k < std::min(warmup, p * v); ++k) {
            EXPECT_EQ(s.per_stage[i][k].chunk, k / p);
            EXPECT_EQ(s.per_stage[i][k].micro_batch, k % p);
          }
        }
      }
    }
  }
}

// Every (micro-batch, chunk) runs forward then backward exactly once on every stage.
void expect_complete(const Schedule& s) {
  ASSERT_EQ(static_cast<int>(s.per_stage.size()), s.stages);
  for (int i = 0; i < s.stages; ++i) {
    std::map<std::pair<int, int>, int> state;  // 0 none, 1 forward done, 2 backward done
    for (const Slot& slot : s.per_stage[i]) {
      ASSERT_GE(slot.micro_batch, 0);
      ASSERT_LT(slot.micro_batch, s.micro_batches);
      ASSERT_GE(slot.chunk, 0);
      ASSERT_LT(slot.chunk, s.chunks);
      int& st = state[{slot.micro_batch, slot.chunk}];
      if (slot.phase == Phase::forward) {
        EXPECT_EQ(st, 0) << "second forward of " << to_string(slot) << " on stage " << i;
        st = 1;
      } else if (slot.phase == Phase::backward) {
        EXPECT_EQ(st, 1) << "backward without a forward before it: " << to_string(slot) << " on stage " << i;
        st = 2;
      } else {
        ASSERT_TRUE(s.split_backward) << "weight-gradient slot in a schedule without split backward";
        EXPECT_EQ(st, 2) << "weight gradient without a backward before it: " << to_string(slot) << " on stage " << i;
        st = 3;
      }
    }
    const int final_state = s.split_backward ? 3 : 2;
    EXPECT_EQ(static_cast<int>(state.size()), s.micro_batches * s.chunks);
    for (const auto& [key, st] : state) EXPECT_EQ(st, final_state);
    EXPECT_EQ(static_cast<int>(s.per_stage[i].size()), final_state * s.micro_batches * s.chunks);
  }
}

TEST(Schedule, EveryMicroBatchAndChunkForwardThenBackwardOnce) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 5, 8, 16}) {
      expect_complete(make_schedule(ScheduleKind::gpipe, p, m));
      expect_complete(make_schedule(ScheduleKind::one_f_one_b, p, m));
      expect_complete(make_zero_bubble_schedule(p, m));
      if (m % p == 0) {
        for (int v : {1, 2, 3}) expect_complete(make_schedule(ScheduleKind::interleaved, p, m, v));
      }
    }
  }
}

TEST(Schedule, ZeroBubbleH1StageOrdersByHand) {
  // p = 4, m = 6 (Qi et al. 2024, ZB-H1): 1F1B's F/B order; stage i holds back its first i W
  // passes and releases the oldest one after each later B, the rest at the end.
  const Schedule s = make_zero_bubble_schedule(4, 6);
  EXPECT_TRUE(s.split_backward);
  EXPECT_EQ(order(s.per_stage[0]), "F0.0 F1.0 F2.0 F3.0 B0.0 W0.0 F4.0 B1.0 W1.0 F5.0 B2.0 W2.0 B3.0 W3.0 B4.0 W4.0 B5.0 W5.0");
  EXPECT_EQ(order(s.per_stage[1]), "F0.0 F1.0 F2.0 B0.0 F3.0 B1.0 W0.0 F4.0 B2.0 W1.0 F5.0 B3.0 W2.0 B4.0 W3.0 B5.0 W4.0 W5.0");
  EXPECT_EQ(order(s.per_stage[3]), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 W0.0 F4.0 B4.0 W1.0 F5.0 B5.0 W2.0 W3.0 W4.0 W5.0");
  // Without the W passes it is exactly 1F1B. Activations stay until the W pass, so every stage
  // holds up to p micro-batches: 1F1B's peak (stage 0), now on every stage (Qi et al. 2024,
  // Sec. 3.1: ZB-H1's peak memory does not exceed 1F1B's).
  const Schedule base = make_schedule(ScheduleKind::one_f_one_b, 4, 6);
  for (int i = 0; i < 4; ++i) {
    std::vector<Slot> fb;
    for (const Slot& slot : s.per_stage[i]) {
      if (slot.phase != Phase::backward_weight) fb.push_back(slot);
    }
    EXPECT_EQ(fb, base.per_stage[i]) << "stage " << i;
    EXPECT_EQ(s.peak_in_flight(i), base.peak_in_flight(0)) << "stage " << i;
  }
  EXPECT_EQ(to_string(Slot{Phase::backward_weight, 2, 0}), "W2.0");
}

TEST(Schedule, OnlyTheZeroBubbleScheduleSplitsTheBackward) {
  // Executors that run make_schedule's output never see a weight-gradient slot.
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved}) {
    const Schedule s = make_schedule(kind, 4, 8, kind == ScheduleKind::interleaved ? 2 : 1);
    EXPECT_FALSE(s.split_backward);
    for (const auto& stage : s.per_stage) {
      for (const Slot& slot : stage) EXPECT_NE(slot.phase, Phase::backward_weight);
    }
  }
}

TEST(Schedule, RejectsUnsupportedSizes) {
  EXPECT_THROW(make_schedule(ScheduleKind::interleaved, 4, 6, 2), std::logic_error);  // m % p != 0
  EXPECT_THROW(make_schedule(ScheduleKind::one_f_one_b, 4, 8, 2), std::logic_error);  // chunks need interleaving
  EXPECT_THROW(make_schedule(ScheduleKind::gpipe, 0, 8), std::logic_error);
}

TEST(Schedule, SlotNames) {
  EXPECT_EQ(to_string(Slot{Phase::forward, 3, 1}), "F3.1");
  EXPECT_EQ(to_string(Slot{Phase::backward, 0, 0}), "B0.0");
}

}  // namespace
