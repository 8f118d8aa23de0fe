// exec/recorder: the step recorder packs one rank's figures and builds the job's Measurement from
// every rank's row: per step the slowest rank's wall time and the busiest rank's phases, per rank
// the phase medians and peak memory. Plain data (no LibTorch): values worked out by hand.
#include <gtest/gtest.h>

#include <stdexcept>

#include "exec/recorder.hpp"

namespace {

using trainplan::Measurement;
using trainplan::PhaseTimes;
using trainplan::exec::MemoryFigures;
using trainplan::exec::StepRecorder;

PhaseTimes phases(double fwd, double bwd, double other) {
  PhaseTimes p;
  p.forward = fwd;
  p.backward = bwd;
  p.other = other;
  p.dp_comm = 0.5;
  return p;
}

TEST(StepRecorder, BuildsTheJobMeasurementFromEveryRanksRow) {
  // Two ranks (dp 2), two measured steps after one warm-up step.
  StepRecorder rank0, rank1;
  rank0.record(1.0, phases(0.3, 0.4, 0.3), 5.5);
  rank0.record(2.0, phases(0.2, 0.2, 1.6), 5.4);
  rank1.record(1.5, phases(0.1, 0.1, 1.3), 5.5);
  rank1.record(1.0, phases(0.5, 0.4, 0.1), 5.4);
  MemoryFigures m0{0, 0, 100e6}, m1{0, 0, 120e6};

  Measurement header;
  header.strategy.dp = 2;
  header.strategy.global_batch = 4;
  header.strategy.micro_batch = 1;
  header.strategy.seq_len = 8;
  header.warmup = 1;
  const Measurement m = rank0.build(header, {rank0.pack(m0), rank1.pack(m1)});

  ASSERT_EQ(m.per_step.size(), 2u);
  EXPECT_EQ(m.per_step[0].step, 1);              // warm-up 1, so the first measured step is 1
  EXPECT_DOUBLE_EQ(m.per_step[0].wall, 1.5);     // slowest rank
  EXPECT_DOUBLE_EQ(m.per_step[0].phases.forward, 0.3);  // busiest rank: 0.7 s compute (rank 0)
  EXPECT_DOUBLE_EQ(m.per_step[0].loss, 5.5);
  EXPECT_DOUBLE_EQ(m.per_step[1].wall, 2.0);
  EXPECT_DOUBLE_EQ(m.per_step[1].phases.forward, 0.5);  // rank 1: 0.9 s compute
  EXPECT_DOUBLE_EQ(m.per_step[1].phases.dp_comm, 0.5);

  ASSERT_EQ(m.ranks.size(), 2u);
  EXPECT_EQ(m.ranks[1].rank, 1);
  EXPECT_EQ(m.ranks[1].coords.dp, 1);
  EXPECT_DOUBLE_EQ(m.ranks[0].phases.forward, 0.25);  // median of 0.3 and 0.2
  EXPECT_DOUBLE_EQ(m.ranks[1].phases.backward, 0.25);
  EXPECT_DOUBLE_EQ(m.ranks[1].max_rss, 120e6);
  EXPECT_DOUBLE_EQ(m.peak_memory, 120e6);  // summarize(): the largest rank
  EXPECT_EQ(m.steps, 2);
  EXPECT_DOUBLE_EQ(m.step_time.median, 1.75);
}

TEST(StepRecorder, RowsOfDifferentLengthAreABug) {
  StepRecorder a, b;
  a.record(1.0, phases(0.1, 0.1, 0.8), 1.0);
  Measurement header;
  EXPECT_THROW(a.build(header, {a.pack({}), b.pack({})}), std::logic_error);
}

}  // namespace
