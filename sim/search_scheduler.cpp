#include "sim/search_scheduler.hpp"

#include <limits>
#include <thread>

namespace trainplan {

int worker_threads(int requested, std::size_t items) {
  const int wanted = requested > 0 ? requested : static_cast<int>(std::thread::hardware_concurrency());
  const std::size_t most = std::clamp<std::size_t>(items, 1, std::numeric_limits<int>::max());
  return std::clamp(wanted, 1, static_cast<int>(most));
}

void parallel_for(std::size_t items, int threads, const std::function<void(std::size_t item, int worker)>& fn) {
  std::atomic<std::size_t> next{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  std::size_t error_item = 0;
  auto work = [&](int worker) {
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      try {
        fn(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error || i < error_item) error = std::current_exception(), error_item = i;
      }
    }
  };
  const int n = worker_threads(threads, items);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(n - 1));
  for (int t = 1; t < n; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace trainplan
