// Cold start of whole `trainplan` processes, as a user runs them: fork, exec, wait. What it
// measures is process start-up (dynamic loading, reading the data files) plus the command's work,
// so these figures show what a planner costs per call. The planner binary links no LibTorch; a
// regression that pulls it back in shows here as ~0.25 s per call.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char** environ;

namespace {

// Runs TRAINPLAN_BINARY with `args`, output discarded; returns false when it did not exit 0.
bool run_trainplan(const std::vector<std::string>& args) {
  std::vector<std::string> owned{TRAINPLAN_BINARY};
  owned.insert(owned.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return false;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void cold_start(benchmark::State& state, const std::vector<std::string>& args) {
  for (auto _ : state) {
    if (!run_trainplan(args)) {
      state.SkipWithError("trainplan did not exit 0");
      return;
    }
  }
}

void BM_ColdStartPredictGpt2(benchmark::State& state) {
  cold_start(state, {"predict", "--model", "gpt2", "--cluster", "dgx-a100-80g", "--gpus", "8", "--global-batch", "64"});
}
void BM_ColdStartSearch530B(benchmark::State& state) {
  cold_start(state, {"search", "--model", "mt-nlg-530b", "--cluster", "dgx-a100-80g", "--gpus", "5128",
                     "--global-batch", "2520"});
}

// Wall time is what a user waits for; the child's CPU time is not this process's.
BENCHMARK(BM_ColdStartPredictGpt2)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_ColdStartSearch530B)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
