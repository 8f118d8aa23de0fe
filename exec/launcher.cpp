// --nproc N: spawn N local ranks of this program, hold their rendezvous store, watch them.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <ostream>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "exec/exec.hpp"
#include "sim/check.hpp"

extern char** environ;

namespace trainplan::exec {

namespace {

bool overridden(const char* kv) {
  static const char* const names[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=",
                                      "MASTER_PORT=", "TRAINPLAN_EXEC_SPAWNED=", "TRAINPLAN_STATUS_FD=",
                                      "SLURM_PROCID=", "SLURM_NTASKS=", "SLURM_LOCALID="};
  for (const char* n : names)
    if (std::strncmp(kv, n, std::strlen(n)) == 0) return true;
  return false;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

}  // namespace

int launch_local(int nproc, const std::vector<std::string>& argv, int port, std::ostream& err) {
  // The launcher serves the TCPStore itself: with port 0 the kernel picks a free port, so two
  // jobs on one machine never collide; an explicit busy MASTER_PORT is reported.
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;
  so.numWorkers = std::nullopt;
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw InputError(fmt::format("MASTER_PORT {}: cannot listen on it ({}); choose a free port or unset MASTER_PORT",
                                 port, what));
  }
  const int actual_port = store->getPort();

  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe() failed");
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);

  // Environment and argv of the children, built before fork (nothing allocates after it).
  std::vector<std::vector<std::string>> envs(nproc);
  for (int r = 0; r < nproc; ++r) {
    for (char** e = environ; *e; ++e)
      if (!overridden(*e)) envs[r].push_back(*e);
    envs[r].push_back(fmt::format("RANK={}", r));
    envs[r].push_back(fmt::format("LOCAL_RANK={}", r));
    envs[r].push_back(fmt::format("WORLD_SIZE={}", nproc));
    envs[r].push_back(fmt::format("LOCAL_WORLD_SIZE={}", nproc));
    envs[r].push_back("MASTER_ADDR=127.0.0.1");
    envs[r].push_back(fmt::format("MASTER_PORT={}", actual_port));
    envs[r].push_back("TRAINPLAN_EXEC_SPAWNED=1");
    envs[r].push_back(fmt::format("TRAINPLAN_STATUS_FD={}", fds[1]));
  }
  std::vector<std::vector<char*>> envp(nproc);
  for (int r = 0; r < nproc; ++r) {
    for (auto& s : envs[r]) envp[r].push_back(s.data());
    envp[r].push_back(nullptr);
  }
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);

  const pid_t parent = getpid();
  std::map<pid_t, int> alive;  // pid -> rank
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (auto& [p, rr] : alive) kill(p, SIGKILL);
      throw std::runtime_error("fork() failed");
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      if (getppid() != parent) _exit(1);
      close(fds[0]);
      execve("/proc/self/exe", cargv.data(), envp[r].data());
      _exit(127);
    }
    alive[pid] = r;
  }
  close(fds[1]);

  std::vector<int> last_step(nproc, -1);
  std::string partial;
  bool failed = false;
  using Clock = std::chrono::steady_clock;
  Clock::time_point term_at = Clock::time_point::max(), kill_at = Clock::time_point::max();
  auto drain = [&] {
    char buf[4096];
    for (;;) {
      pollfd pfd{fds[0], POLLIN, 0};
      if (poll(&pfd, 1, 0) <= 0 || !(pfd.revents & POLLIN)) return;
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n <= 0) return;
      partial.append(buf, static_cast<size_t>(n));
      size_t pos;
      while ((pos = partial.find('\n')) != std::string::npos) {
        int rank = -1, step = -1;
        if (sscanf(partial.c_str(), "%d %d", &rank, &step) == 2 && rank >= 0 && rank < nproc) last_step[rank] = step;
        partial.erase(0, pos + 1);
      }
    }
  };
  while (!alive.empty()) {
    pollfd pfd{fds[0], POLLIN, 0};
    poll(&pfd, 1, 100);
    drain();
    // Reap everything that has exited; report a killed rank before ranks that merely saw it go.
    std::vector<std::pair<int, int>> exited;  // (status, rank)
    for (;;) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      auto it = alive.find(pid);
      if (it == alive.end()) continue;
      exited.emplace_back(status, it->second);
      alive.erase(it);
    }
    std::stable_sort(exited.begin(), exited.end(),
                     [](const auto& a, const auto& b) { return WIFSIGNALED(a.first) > WIFSIGNALED(b.first); });
    for (const auto& [status, rank] : exited) {
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok || failed) continue;
      failed = true;
      const std::string where =
          last_step[rank] < 0 ? "before its first step" : fmt::format("in step {}", last_step[rank]);
      err << fmt::format("trainplan exec: rank {} {} {}; stopping the other {} rank(s)\n", rank, describe_exit(status),
                         where, alive.size());
      err.flush();
      // A rank that died by a signal is the cause: stop the rest now. A rank that exited with an
      // error usually gave up on a peer (timeout, lost connection): the other ranks get a few
      // seconds to fail the same way, and whoever is still running then is named as not responding.
      if (WIFSIGNALED(status)) {
        for (auto& [p, r] : alive) kill(p, SIGTERM);
        kill_at = Clock::now() + std::chrono::seconds(5);
      } else {
        term_at = Clock::now() + std::chrono::seconds(3);
      }
    }
    if (failed && !alive.empty() && Clock::now() >= term_at) {
      for (auto& [p, r] : alive) {
        err << fmt::format("trainplan exec: rank {} is not responding (last seen {}); stopping it\n", r,
                           last_step[r] < 0 ? "before its first step" : fmt::format("in step {}", last_step[r]));
        kill(p, SIGTERM);
      }
      err.flush();
      term_at = Clock::time_point::max();
      kill_at = Clock::now() + std::chrono::seconds(5);
    }
    if (failed && !alive.empty() && Clock::now() >= kill_at) {
      for (auto& [p, r] : alive) kill(p, SIGKILL);
      kill_at = Clock::time_point::max();
    }
  }
  close(fds[0]);
  return failed ? 1 : 0;
}

}  // namespace trainplan::exec
