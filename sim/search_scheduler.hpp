// search_scheduler: how search() spreads its work over threads, apart from what the work is.
//
// parallel_for runs independent items on a pool of threads that take the next item from one
// shared counter (dynamic distribution: a slow item holds up only its own thread).
//
// run_in_rounds runs items whose results feed each other (a search's layouts: what one finds
// tightens the pruning of the next) so that the outcome is the same for any thread count and any
// timing. Items are cut into rounds of `per_round` consecutive items; every item of round r runs
// from the *start* (search: the pruning thresholds) that merging all items of rounds 0..r-1, in
// item order, produced. Equivalently, with one thread:
//
//   for each round r:  s = start();  for each item i of r: out_i = run(i, s);
//                      for each item i of r: merge(out_i)
//
// That is the specification; the threads only compute it sooner. They claim items in order and
// run each from the latest merged start, without a barrier per round: an item may run ahead of
// the merge of the rounds before its own (by fewer than `ring` rounds, and only while
// may_run_ahead(start) says the start has settled enough to be worth it). Because run() is a pure
// function of (item, start), a result computed from the start its round would have seen is kept;
// one computed from another start is computed again when its round is merged. Rounds are merged
// in order, each once all its items are done, by whichever thread finds it complete.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <vector>

#include "sim/check.hpp"

namespace trainplan {

// Threads to use for `items` pieces of work when `requested` were asked for (0 or less: every
// hardware thread): at least 1, at most one per item.
int worker_threads(int requested, std::size_t items);

// Calls fn(item, worker) once for every item in [0, items) on `threads` threads (worker_threads
// decides how many): the calling thread is worker 0, the others are 1, 2, ... Returns when every
// item has run. If items throw, every item still runs and the exception of the lowest such item
// is rethrown here, so which error surfaces does not depend on the threads either.
void parallel_for(std::size_t items, int threads, const std::function<void(std::size_t item, int worker)>& fn);

// What run_in_rounds calls. Start must be copyable and equality-comparable (exactly: a result is
// reused only for the very start its round has); Result default-constructible and movable.
template <class Start, class Result>
struct RoundWork {
  // Computes `item` from `start` into `out` (a fresh Result) on `worker`'s thread; must be a pure
  // function of (item, start). Different workers call it concurrently.
  std::function<void(std::size_t item, const Start& start, int worker, Result& out)> run;
  // Merges one result into the caller's state; called in item order, never concurrently.
  std::function<void(Result&& result)> merge;
  // The start that the merges so far have produced (called right after merges, under their lock).
  std::function<Start()> start;
  // Whether items may run ahead of unmerged rounds from `start`. Running ahead only pays once
  // later merges seldom change the start; null: never.
  std::function<bool(const Start& start)> may_run_ahead;
  // Called on the calling thread after each item it runs, with the number of items merged so far.
  std::function<void(std::size_t merged_items)> progress;
};

struct RoundShape {
  std::size_t per_round = 16;  // items per round
  std::size_t ring = 64;       // rounds whose results are held at once: runs ahead at most ring - 1
};

template <class Start, class Result>
void run_in_rounds(std::size_t items, int threads, const RoundWork<Start, Result>& work, RoundShape shape = {});

// ---- implementation ----

namespace detail {

template <class Start, class Result>
class Rounds {
 public:
  Rounds(std::size_t items, const RoundWork<Start, Result>& work, RoundShape shape)
      : items_(items), work_(work), shape_(shape), rounds_((items + shape.per_round - 1) / shape.per_round),
        slots_(shape.ring * shape.per_round), done_(shape.ring), latest_(work.start()) {}

  // Claimed item `i` on `worker`: waits until its round may run, runs it, and merges what is complete.
  void item(std::size_t i, int worker) {
    const std::size_t r = i / shape_.per_round;
    Slot& slot = slots_[i % slots_.size()];
    if (wait_for_turn(r, slot)) {
      try {
        slot.result = Result{};
        work_.run(i, slot.used, worker, slot.result);
      } catch (...) {
        fail(i);
      }
    }
    if (done_[r % shape_.ring].fetch_add(1, std::memory_order_acq_rel) + 1 == round_size(r)) request_merge(worker);
    if (worker == 0 && work_.progress) work_.progress(std::min(items_, merged_.load() * shape_.per_round));
  }

  // After every item ran: merges the rounds whose last item finished while another thread held
  // the merge, and rethrows the first failure.
  void finish() {
    merge_ready(0);
    if (error_) std::rethrow_exception(error_);
    TRAINPLAN_CHECK(merged_.load() == rounds_, "run_in_rounds merged every round");
  }

 private:
  struct Slot {
    Result result;
    Start used;  // the start the item ran from
  };

  std::size_t round_size(std::size_t r) const { return std::min(shape_.per_round, items_ - r * shape_.per_round); }

  Start latest() {
    std::lock_guard<std::mutex> lock(latest_mutex_);
    return latest_;
  }

  // Round r may run once round r - 1 is merged, or ahead of it while its ring slot is free (round
  // r - ring merged) and the start allows. False once an item has failed (nothing runs any more).
  bool wait_for_turn(std::size_t r, Slot& slot) {
    for (;;) {
      const std::size_t m = merged_.load(std::memory_order_acquire);
      if (failed_.load()) return false;
      const Start now = latest();
      if (m >= r || (m + shape_.ring > r && work_.may_run_ahead && work_.may_run_ahead(now))) {
        slot.used = now;
        return true;
      }
      merged_.wait(m, std::memory_order_acquire);
    }
  }

  // Merges every complete round after the merged ones, in order; items that ran from another start
  // than their round's are run again on `worker`.
  void merge_ready(int worker) {
    for (std::size_t r = merged_.load(std::memory_order_acquire);
         r < rounds_ && !failed_.load() && done_[r % shape_.ring].load(std::memory_order_acquire) == round_size(r); ++r) {
      const Start start = work_.start();
      for (std::size_t j = r * shape_.per_round; j < r * shape_.per_round + round_size(r); ++j) {
        Slot& slot = slots_[j % slots_.size()];
        try {
          if (!(slot.used == start)) {
            slot.result = Result{};
            work_.run(j, start, worker, slot.result);
          }
          work_.merge(std::move(slot.result));
        } catch (...) {
          fail(j);
          return;
        }
        slot.result = Result{};
      }
      done_[r % shape_.ring].store(0, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lock(latest_mutex_);
        latest_ = work_.start();
      }
      merged_.store(r + 1, std::memory_order_release);
      merged_.notify_all();
    }
  }

  // Asks for a merge; whoever holds the merge lock sees the request before it lets go.
  void request_merge(int worker) {
    merge_wanted_.store(true);
    while (merge_wanted_.load() && merge_mutex_.try_lock()) {
      merge_wanted_.store(false);
      merge_ready(worker);
      merge_mutex_.unlock();
    }
  }

  // Records the failure of `item` (the lowest failed item's exception is kept) and wakes every
  // waiting thread: they skip their items from now on.
  void fail(std::size_t item) {
    {
      std::lock_guard<std::mutex> lock(latest_mutex_);
      if (!error_ || item < error_item_) error_ = std::current_exception(), error_item_ = item;
    }
    failed_.store(true);
    merged_.fetch_add(rounds_ + shape_.ring, std::memory_order_acq_rel);  // a change waiters see
    merged_.notify_all();
  }

  const std::size_t items_;
  const RoundWork<Start, Result>& work_;
  const RoundShape shape_;
  const std::size_t rounds_;
  std::vector<Slot> slots_;
  std::vector<std::atomic<std::size_t>> done_;  // items of the round in each ring place finished
  std::atomic<std::size_t> merged_{0};           // rounds merged
  std::mutex latest_mutex_;                      // guards latest_ and the error
  Start latest_;                                 // work.start() after the last merged round
  std::mutex merge_mutex_;                       // held by the thread merging rounds
  std::atomic<bool> merge_wanted_{false};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
  std::size_t error_item_ = 0;
};

}  // namespace detail

template <class Start, class Result>
void run_in_rounds(std::size_t items, int threads, const RoundWork<Start, Result>& work, RoundShape shape) {
  if (items == 0) return;
  shape.per_round = std::max<std::size_t>(1, shape.per_round);
  shape.ring = std::max<std::size_t>(1, shape.ring);
  detail::Rounds<Start, Result> rounds(items, work, shape);
  parallel_for(items, threads, [&](std::size_t i, int worker) { rounds.item(i, worker); });
  rounds.finish();
}

}  // namespace trainplan
