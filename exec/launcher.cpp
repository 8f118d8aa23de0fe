// --nproc N: spawn N local ranks of this program, hold their rendezvous store, watch them.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <vector>
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

// The status pipe, one line per message, each written with one write(2) of at most PIPE_BUF
// bytes so that lines of different ranks never interleave:
//   P <rank> <step> <phase>                                        progress (tab-separated)
//   F <rank> <step> <allocated> <reserved> <capacity> <rss> <phase> <error>   failure
constexpr size_t kMaxField = 1500;

std::string clean_field(const std::string& s) {
  std::string out = s.substr(0, kMaxField);
  for (char& c : out)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return out;
}

void write_line(int fd, const std::string& line) {
  if (fd < 0) return;
  const ssize_t n = ::write(fd, line.data(), line.size());
  (void)n;  // the launcher being gone is not this rank's error
}

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t t = line.find('\t', start);
    out.push_back(line.substr(start, t == std::string::npos ? std::string::npos : t - start));
    if (t == std::string::npos) return out;
    start = t + 1;
  }
}

// Resident set of a running process from /proc/<pid>/statm (pages), -1 when unreadable.
double rss_of(pid_t pid) {
  FILE* f = std::fopen(fmt::format("/proc/{}/statm", pid).c_str(), "r");
  if (!f) return -1;
  long size = 0, resident = 0;
  const int got = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return got == 2 ? static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) : -1;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

using Clock = std::chrono::steady_clock;

// The launcher serves the TCPStore itself: with port 0 the kernel picks a free port, so two jobs
// on one machine never collide; an explicit busy MASTER_PORT is reported.
c10::intrusive_ptr<c10d::TCPStore> serve_store(int port) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;
  so.numWorkers = std::nullopt;
  try {
    return c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    throw InputError(fmt::format("MASTER_PORT {}: cannot listen on it ({}); choose a free port or unset MASTER_PORT",
                                 port, what));
  }
}

// Forks `nproc` ranks running `argv` (this program, /proc/self/exe), each with its rank's
// environment and the status pipe's write end; returns pid -> rank. The children's environments
// and argv are built before the first fork (nothing allocates after it), and each child dies with
// the launcher (PR_SET_PDEATHSIG).
std::map<pid_t, int> spawn_ranks(int nproc, const std::vector<std::string>& argv, int port, int status_fd,
                                 int status_read_fd) {
  std::vector<std::vector<std::string>> envs(nproc);
  for (int r = 0; r < nproc; ++r) {
    for (char** e = environ; *e; ++e)
      if (!overridden(*e)) envs[r].push_back(*e);
    envs[r].push_back(fmt::format("RANK={}", r));
    envs[r].push_back(fmt::format("LOCAL_RANK={}", r));
    envs[r].push_back(fmt::format("WORLD_SIZE={}", nproc));
    envs[r].push_back(fmt::format("LOCAL_WORLD_SIZE={}", nproc));
    envs[r].push_back("MASTER_ADDR=127.0.0.1");
    envs[r].push_back(fmt::format("MASTER_PORT={}", port));
    envs[r].push_back("TRAINPLAN_EXEC_SPAWNED=1");
    envs[r].push_back(fmt::format("TRAINPLAN_STATUS_FD={}", status_fd));
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
      close(status_read_fd);
      execve("/proc/self/exe", cargv.data(), envp[r].data());
      _exit(127);
    }
    alive[pid] = r;
  }
  return alive;
}

// The launcher's view of its running ranks: what each last reported on the status pipe, its last
// resident set, and once one has failed, the cause and when to stop the others.
class RankWatch {
 public:
  RankWatch(int nproc, int fd) : nproc_(nproc), fd_(fd), last_step_(nproc, -1), last_phase_(nproc, "starting"),
                                 last_rss_(nproc, -1) {}
  void drain();                                 // reads every complete line waiting on the pipe
  void sample_rss(const std::map<pid_t, int>& alive);
  void exited(const std::vector<std::pair<int, int>>& exited, const std::map<pid_t, int>& alive);
  void escalate(const std::map<pid_t, int>& alive);  // SIGTERM, then SIGKILL, to ranks still running
  bool failed() const { return failed_; }
  RunFailure cause() const;                     // after a failure: the job's one cause

 private:
  void take_line(const std::vector<std::string>& f);
  int nproc_, fd_;
  std::vector<int> last_step_;
  std::vector<std::string> last_phase_;
  std::vector<double> last_rss_;
  std::vector<RunFailure> reported_;  // failures the ranks reported, in the order they arrived
  std::optional<RunFailure> cause_;   // a rank killed by a signal or not responding
  std::string partial_;
  bool failed_ = false;
  Clock::time_point term_at_ = Clock::time_point::max(), kill_at_ = Clock::time_point::max();
};

void RankWatch::take_line(const std::vector<std::string>& f) {
  if (f.size() == 4 && f[0] == "P") {
    const int rank = std::stoi(f[1]);
    if (rank < 0 || rank >= nproc_) return;
    last_step_[rank] = std::stoi(f[2]);
    last_phase_[rank] = f[3];
  } else if (f.size() == 9 && f[0] == "F") {
    RunFailure r;
    r.rank = std::stoi(f[1]);
    r.step = std::stoi(f[2]);
    r.allocated = std::stod(f[3]);
    r.reserved = std::stod(f[4]);
    r.capacity = std::stod(f[5]);
    r.rss = std::stod(f[6]);
    r.phase = f[7];
    r.error = f[8];
    reported_.push_back(r);
  }
}

void RankWatch::drain() {
  char buf[4096];
  for (;;) {
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, 0) <= 0 || !(pfd.revents & POLLIN)) return;
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) return;
    partial_.append(buf, static_cast<size_t>(n));
    size_t pos;
    while ((pos = partial_.find('\n')) != std::string::npos) {
      const std::vector<std::string> f = split_tabs(partial_.substr(0, pos));
      partial_.erase(0, pos + 1);
      try {
        take_line(f);
      } catch (const std::exception&) {  // a malformed line is ignored, as an unknown one is
      }
    }
  }
}

void RankWatch::sample_rss(const std::map<pid_t, int>& alive) {
  for (auto& [p, r] : alive) {
    const double rss = rss_of(p);
    if (rss > 0) last_rss_[r] = rss;  // an exited rank not yet reaped (a zombie) reads 0
  }
}

// `exited`: (status, rank) of the ranks reaped now, killed ones first. The first failure decides:
// a rank that died by a signal is the cause and the rest are stopped now; a rank that exited with
// an error usually gave up on a peer (timeout, lost connection), so the other ranks get a few
// seconds to fail the same way, and whoever is still running then is named as not responding.
void RankWatch::exited(const std::vector<std::pair<int, int>>& exited, const std::map<pid_t, int>& alive) {
  for (const auto& [status, rank] : exited) {
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok || failed_) continue;
    failed_ = true;
    if (WIFSIGNALED(status)) {
      RunFailure k;
      k.rank = rank;
      k.step = last_step_[rank];
      k.phase = last_phase_[rank];
      k.error = fmt::format("rank {} {}", rank, describe_exit(status));
      k.rss = last_rss_[rank];
      cause_ = k;
      for (auto& [p, r] : alive) kill(p, SIGTERM);
      kill_at_ = Clock::now() + std::chrono::seconds(5);
    } else {
      term_at_ = Clock::now() + std::chrono::seconds(3);
    }
  }
}

void RankWatch::escalate(const std::map<pid_t, int>& alive) {
  if (!failed_ || alive.empty()) return;
  if (Clock::now() >= term_at_) {
    for (auto& [p, r] : alive) {
      const std::string msg = fmt::format("rank {} is not responding (last seen {})", r,
                                          last_step_[r] < 0 ? "before its first step" : fmt::format("in step {}", last_step_[r]));
      if (!cause_) {
        RunFailure h;
        h.rank = r;
        h.step = last_step_[r];
        h.phase = last_phase_[r];
        h.error = msg + "; stopped by the launcher";
        h.rss = last_rss_[r];
        cause_ = h;
      }
      kill(p, SIGTERM);
    }
    term_at_ = Clock::time_point::max();
    kill_at_ = Clock::now() + std::chrono::seconds(5);
  }
  if (Clock::now() >= kill_at_) {
    for (auto& [p, r] : alive) kill(p, SIGKILL);
    kill_at_ = Clock::time_point::max();
  }
}

// The rank killed by a signal, else the first failure a rank reported, else the rank that stopped
// responding.
RunFailure RankWatch::cause() const {
  if (cause_) return *cause_;
  if (!reported_.empty()) return reported_.front();
  RunFailure unknown;
  unknown.error = "a rank exited with an error before reporting it";
  return unknown;
}

// Reaps every rank that has exited: (status, rank), ranks killed by a signal first (they are the
// cause; the others merely saw them go).
std::vector<std::pair<int, int>> reap(std::map<pid_t, int>& alive) {
  std::vector<std::pair<int, int>> exited;
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
  return exited;
}

}  // namespace

void report_rank_progress(int status_fd, int rank, int step, const std::string& phase) {
  write_line(status_fd, fmt::format("P\t{}\t{}\t{}\n", rank, step, clean_field(phase)));
}

void report_rank_failure(int status_fd, const RunFailure& f) {
  write_line(status_fd, fmt::format("F\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n", f.rank, f.step, f.allocated, f.reserved,
                                    f.capacity, f.rss, clean_field(f.phase), clean_field(f.error)));
}

int launch_local(int nproc, const std::vector<std::string>& argv, int port, std::ostream& err,
                 const std::function<void(const RunFailure&)>& on_failure) {
  const c10::intrusive_ptr<c10d::TCPStore> store = serve_store(port);
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe() failed");
  fcntl(fds[0], F_SETFD, FD_CLOEXEC);
  std::map<pid_t, int> alive = spawn_ranks(nproc, argv, store->getPort(), fds[1], fds[0]);
  close(fds[1]);
  RankWatch watch(nproc, fds[0]);
  while (!alive.empty()) {
    pollfd pfd{fds[0], POLLIN, 0};
    poll(&pfd, 1, 100);
    watch.drain();
    watch.sample_rss(alive);
    const auto exited = reap(alive);
    watch.drain();  // a rank writes its failure before it exits
    watch.exited(exited, alive);
    watch.escalate(alive);
  }
  watch.drain();
  close(fds[0]);
  if (!watch.failed()) return 0;
  // One line for the whole job: the cause, not one line per rank that saw it.
  const RunFailure cause = watch.cause();
  const std::string where = cause.step < 0 ? fmt::format("while {}", cause.phase.empty() ? "starting" : cause.phase)
                                           : fmt::format("in step {}", cause.step);
  // Launcher-made causes already start with "rank N ..."; a rank's own error is its message.
  const std::string line = cause.error.rfind("rank ", 0) == 0
                               ? fmt::format("{} ({}); the job was stopped", cause.error, where)
                               : fmt::format("rank {} failed {}: {}; the job was stopped", cause.rank, where, cause.error);
  err << "trainplan exec: " << line << "\n";
  err.flush();
  if (on_failure) on_failure(cause);
  return 1;
}

}  // namespace trainplan::exec
