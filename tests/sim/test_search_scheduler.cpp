// search_scheduler: parallel_for runs each item once and reports errors the same way for any
// thread count; run_in_rounds gives exactly its one-thread specification for any thread count,
// round size and run-ahead setting, however the items' timing falls.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "sim/search_scheduler.hpp"

namespace {

using namespace trainplan;

TEST(ParallelFor, RunsEveryItemOnceOnTheWorkersAsked) {
  for (int threads : {1, 2, 3, 8}) {
    SCOPED_TRACE(threads);
    const std::size_t n = 1000;
    std::vector<std::atomic<int>> runs(n);
    const auto caller = std::this_thread::get_id();
    std::atomic<bool> worker0_elsewhere{false};
    parallel_for(n, threads, [&](std::size_t i, int w) {
      ++runs[i];
      ASSERT_GE(w, 0);
      ASSERT_LT(w, threads);
      if (w == 0 && std::this_thread::get_id() != caller) worker0_elsewhere = true;
    });
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << i;
    EXPECT_FALSE(worker0_elsewhere.load()) << "worker 0 is the calling thread";
  }
}

TEST(ParallelFor, ThreadCountIsClampedToTheItems) {
  EXPECT_EQ(worker_threads(8, 3), 3);
  EXPECT_EQ(worker_threads(2, 100), 2);
  EXPECT_EQ(worker_threads(5, 0), 1);
  EXPECT_GE(worker_threads(0, 100), 1);  // 0: the hardware's threads
  int calls = 0;
  parallel_for(0, 4, [&](std::size_t, int) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ParallelFor, EveryItemRunsAndTheLowestFailureIsRethrown) {
  for (int threads : {1, 2, 4}) {
    SCOPED_TRACE(threads);
    std::atomic<int> ran{0};
    try {
      parallel_for(64, threads, [&](std::size_t i, int) {
        ++ran;
        if (i == 40 || i == 7 || i == 50) throw std::runtime_error("item " + std::to_string(i));
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "item 7");
    }
    EXPECT_EQ(ran.load(), 64);
  }
}

// A toy search: item i offers the value v(i); it "prunes" (keeps nothing) unless v(i) beats the
// best merged before its round, and its result records the start it saw. Merging keeps the best.
struct Toy {
  int best = 1 << 30;
  bool operator==(const Toy&) const = default;
};
struct ToyResult {
  std::size_t item = 0;
  int start_best = 0;  // the start the result was computed from
  int kept = -1;       // v(i) if it beat the start, else -1
};
// Noise over a falling trend: the best improves in most rounds, so items that ran ahead from an
// older start are often found stale and run again.
int value_of(std::size_t i) {
  return static_cast<int>((i * 2654435761u) % 20011u) + std::max(0, 100000 - 50 * static_cast<int>(i));
}

ToyResult toy_run(std::size_t i, const Toy& s) {
  return {i, s.best, value_of(i) < s.best ? value_of(i) : -1};
}

// The specification of run_in_rounds, on one thread.
std::vector<ToyResult> toy_reference(std::size_t n, std::size_t per_round) {
  std::vector<ToyResult> trace;
  Toy state;
  for (std::size_t r = 0; r * per_round < n; ++r) {
    const Toy start = state;
    for (std::size_t i = r * per_round; i < std::min(n, (r + 1) * per_round); ++i) {
      trace.push_back(toy_run(i, start));
      if (trace.back().kept >= 0) state.best = std::min(state.best, trace.back().kept);
    }
  }
  return trace;
}

std::vector<ToyResult> toy_rounds(std::size_t n, int threads, RoundShape shape, bool run_ahead, std::atomic<int>* runs) {
  std::vector<ToyResult> trace;
  Toy state;
  RoundWork<Toy, ToyResult> work;
  work.run = [&](std::size_t i, const Toy& s, int, ToyResult& out) {
    ++*runs;
    // Uneven item times, so that threads overtake each other and run ahead.
    if (value_of(i) % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
    out = toy_run(i, s);
  };
  work.merge = [&](ToyResult&& r) {
    trace.push_back(r);
    if (r.kept >= 0) state.best = std::min(state.best, r.kept);
  };
  work.start = [&] { return state; };
  if (run_ahead) work.may_run_ahead = [](const Toy& s) { return s.best < 90000; };
  run_in_rounds(n, threads, work, shape);
  return trace;
}

TEST(RunInRounds, SameResultAsOneThreadForAnyThreadCountAndShape) {
  const std::size_t n = 2000;
  for (RoundShape shape : {RoundShape{16, 64}, RoundShape{1, 4}, RoundShape{7, 2}, RoundShape{50, 1}}) {
    const std::vector<ToyResult> want = toy_reference(n, shape.per_round);
    for (bool ahead : {false, true}) {
      for (int threads : {1, 2, 3, 7}) {
        SCOPED_TRACE(::testing::Message() << "per_round " << shape.per_round << " ring " << shape.ring << " ahead "
                                          << ahead << " threads " << threads);
        std::atomic<int> runs{0};
        const std::vector<ToyResult> got = toy_rounds(n, threads, shape, ahead, &runs);
        ASSERT_EQ(got.size(), want.size());
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_EQ(got[i].item, want[i].item);
          ASSERT_EQ(got[i].start_best, want[i].start_best) << "item " << i;
          ASSERT_EQ(got[i].kept, want[i].kept) << "item " << i;
        }
        EXPECT_GE(runs.load(), static_cast<int>(n));
        if (threads == 1) {
          EXPECT_EQ(runs.load(), static_cast<int>(n)) << "one thread never runs an item twice";
        }
      }
    }
  }
}

TEST(RunInRounds, AResultFromAStaleStartIsComputedAgain) {
  // Two threads; item 0 waits until item 16 (round 1) has run ahead from the first start. Round
  // 0's merge then improves the best, so item 16's result is stale and is computed again.
  Toy state;
  std::atomic<bool> ahead_ran{false};
  std::vector<std::atomic<int>> runs(64);
  std::vector<ToyResult> trace;
  RoundWork<Toy, ToyResult> work;
  work.run = [&](std::size_t i, const Toy& s, int, ToyResult& out) {
    ++runs[i];
    if (i == 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!ahead_ran.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    }
    if (i == 16) ahead_ran = true;
    out = toy_run(i, s);
  };
  work.merge = [&](ToyResult&& r) {
    trace.push_back(r);
    if (r.kept >= 0) state.best = std::min(state.best, r.kept);
  };
  work.start = [&] { return state; };
  work.may_run_ahead = [](const Toy&) { return true; };
  run_in_rounds(64, 2, work, RoundShape{16, 4});
  ASSERT_TRUE(ahead_ran.load());
  EXPECT_EQ(runs[16].load(), 2);
  const std::vector<ToyResult> want = toy_reference(64, 16);
  ASSERT_EQ(trace.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(trace[i].start_best, want[i].start_best) << i;
}

TEST(RunInRounds, ProgressCountsMergedItemsOnTheCallingThread) {
  const auto caller = std::this_thread::get_id();
  std::size_t last = 0;
  bool elsewhere = false, backwards = false;
  Toy state;
  RoundWork<Toy, ToyResult> work;
  work.run = [](std::size_t i, const Toy& s, int, ToyResult& out) { out = toy_run(i, s); };
  work.merge = [&](ToyResult&& r) {
    if (r.kept >= 0) state.best = std::min(state.best, r.kept);
  };
  work.start = [&] { return state; };
  work.progress = [&](std::size_t merged) {
    if (std::this_thread::get_id() != caller) elsewhere = true;
    if (merged < last || merged > 500) backwards = true;
    last = merged;
  };
  run_in_rounds(500, 3, work, RoundShape{16, 64});
  EXPECT_FALSE(elsewhere);
  EXPECT_FALSE(backwards);
}

TEST(RunInRounds, AFailingItemIsRethrownWithoutHanging) {
  for (int threads : {1, 2, 4}) {
    SCOPED_TRACE(threads);
    Toy state;
    RoundWork<Toy, ToyResult> work;
    work.run = [](std::size_t i, const Toy& s, int, ToyResult& out) {
      if (i == 300) throw std::runtime_error("item 300");
      out = toy_run(i, s);
    };
    work.merge = [&](ToyResult&& r) {
      if (r.kept >= 0) state.best = std::min(state.best, r.kept);
    };
    work.start = [&] { return state; };
    work.may_run_ahead = [](const Toy&) { return true; };
    EXPECT_THROW(run_in_rounds(1000, threads, work, RoundShape{16, 4}), std::runtime_error);
  }
}

}  // namespace
