// Calibration micro-benchmarks with LibTorch: matmul rate by size, copy bandwidth, fused
// attention rate, and all-reduce time between local ranks (Gloo on CPU, NCCL across GPUs).
#include "exec/calibrate.hpp"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/version.h>
#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <sstream>

#include "exec/parallel.hpp"
#include "sim/check.hpp"
#include "sim/measurement.hpp"

namespace trainplan::exec {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of `f`: each timed sample runs `f` enough times to last at least
// `min_sample` (so that microsecond kernels are not lost in clock noise), `warmup` samples are
// discarded, and the median of `repeats` samples is returned. `agree` (collectives) makes every
// rank use the same number of calls per sample: it returns the largest of the ranks' counts.
Seconds time_per_call(const std::function<void()>& f, const std::function<void()>& sync, int warmup, int repeats,
                      Seconds min_sample, const std::function<int(int)>& agree = {}) {
  f();
  sync();
  auto t0 = Clock::now();
  f();
  sync();
  const double once = std::chrono::duration<double>(Clock::now() - t0).count();
  int inner = once >= min_sample ? 1 : static_cast<int>(std::ceil(min_sample / std::max(once, 1e-9)));
  if (agree) inner = agree(inner);
  std::vector<double> samples;
  for (int i = 0; i < warmup + repeats; ++i) {
    t0 = Clock::now();
    for (int k = 0; k < inner; ++k) f();
    sync();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count() / inner;
    if (i >= warmup) samples.push_back(dt);
  }
  return spread_of(std::move(samples)).median;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(line.find_first_not_of(" \t", pos + 1));
    }
  }
  return "unknown CPU";
}

// Resident set size of this process (VmRSS), bytes.
Bytes resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;
  }
  return 0;
}

// ---- link: all-reduce between `ranks` forked local processes ----

// One rank of the link test. Rank 0 writes "bytes seconds" lines (slowest rank's median) to `out_fd`.
int link_worker(int rank, int ranks, int port, int listen_fd, const CalibrateOptions& o, int out_fd) {
  try {
    const bool cuda = o.link_backend == "nccl";
    if (!cuda) torch::set_num_threads(std::max(1, o.threads));
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = ranks;
    so.waitWorkers = true;
    so.timeout = std::chrono::seconds(60);
    so.useLibUV = false;
    if (rank == 0) so.masterListenFd = listen_fd;
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);

    PhaseClock clock(cuda);
    Groups groups;
    std::unique_ptr<Comm> world;
    c10::intrusive_ptr<c10d::Backend> gloo;
    std::function<void(at::Tensor&, c10d::ReduceOp)> all_reduce;
    if (cuda) {
      // NCCL through the executor's own process groups (one rank per GPU).
      Strategy s;
      s.dp = ranks;
      GroupSettings gs;
      gs.backend = "nccl";
      gs.timeout = std::chrono::milliseconds(60000);
      groups = make_groups(RankLayout(s), rank, store, gs, clock);
      all_reduce = [&](at::Tensor& t, c10d::ReduceOp op) { groups.world->all_reduce(t, op); };
    } else {
      auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, ranks, opts);
      all_reduce = [&](at::Tensor& t, c10d::ReduceOp op) {
        std::vector<at::Tensor> ts{t};
        c10d::AllreduceOptions ao;
        ao.reduceOp = op;
        gloo->allreduce(ts, ao)->wait();
      };
    }
    const auto dev = cuda ? torch::Device(torch::kCUDA, rank) : torch::Device(torch::kCPU);
    auto sync = [&] {
      if (cuda) torch::cuda::synchronize(rank);
    };
    auto agree = [&](int inner) {
      auto x = torch::full({1}, static_cast<double>(inner), torch::TensorOptions().dtype(torch::kFloat64)).to(dev);
      all_reduce(x, c10d::ReduceOp::MAX);
      return static_cast<int>(x.cpu().item<double>());
    };
    std::vector<double> medians;
    for (Bytes b : o.link_bytes) {
      auto t = torch::ones({static_cast<long>(b / 4)}, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
      medians.push_back(
          time_per_call([&] { all_reduce(t, c10d::ReduceOp::SUM); }, sync, o.warmup, o.repeats, 2e-3, agree));
    }
    // Every rank agrees on the slowest rank's figure.
    auto m = torch::tensor(medians, torch::TensorOptions().dtype(torch::kFloat64)).to(dev);
    all_reduce(m, c10d::ReduceOp::MAX);
    m = m.cpu();
    if (rank == 0) {
      std::string text;
      for (std::size_t i = 0; i < o.link_bytes.size(); ++i) {
        text += fmt::format("{} {}\n", o.link_bytes[i], m[static_cast<long>(i)].item<double>());
      }
      if (::write(out_fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) return 3;
    }
    return 0;
  } catch (const std::exception& e) {
    std::string msg = fmt::format("ERROR rank {}: {}\n", rank, e.what());
    if (rank == 0 && ::write(out_fd, msg.data(), msg.size()) < 0) return 4;
    return 2;
  }
}

LinkResult link_benchmark(const CalibrateOptions& o) {
  LinkResult r;
  r.ranks = o.link_ranks;
  // The store master's listening socket is opened here and handed to rank 0: no port race.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    r.note = fmt::format("not measured: cannot open a loopback socket ({})", std::strerror(errno));
    return r;
  }
  const int port = ntohs(addr.sin_port);
  int pipefd[2];
  if (::pipe(pipefd) != 0) {
    ::close(fd);
    r.note = "not measured: pipe() failed";
    return r;
  }
  std::vector<pid_t> pids;
  for (int rank = 0; rank < o.link_ranks; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(pipefd[0]);
      if (rank != 0) ::close(fd);
      ::_exit(link_worker(rank, o.link_ranks, port, fd, o, pipefd[1]));
    }
    if (pid > 0) pids.push_back(pid);
  }
  ::close(fd);
  ::close(pipefd[1]);

  // Read rank 0's report; give up (and kill the ranks) after 300 s.
  std::string text;
  const auto deadline = Clock::now() + std::chrono::seconds(300);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{pipefd[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(pipefd[0], buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(pipefd[0]);
  bool all_ok = !timed_out && pids.size() == static_cast<std::size_t>(o.link_ranks);
  for (pid_t pid : pids) {
    if (timed_out) ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    all_ok = all_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!all_ok) {
    auto first_line = text.substr(0, text.find('\n'));
    r.note = timed_out ? "not measured: the all-reduce ranks did not finish within 300 s"
                       : fmt::format("not measured: a rank failed ({})", first_line.empty() ? "no message" : first_line);
    return r;
  }
  std::istringstream in(text);
  LinkPoint pt;
  while (in >> pt.bytes >> pt.median) r.points.push_back(pt);
  if (r.points.size() != o.link_bytes.size() || r.points.empty()) {
    r.note = "not measured: unreadable report from rank 0";
    r.points.clear();
    return r;
  }
  // Ring all-reduce t(M) = 2(n-1) a + 2(n-1)/n M / B (sim/collectives.hpp). Two unknowns: the
  // largest message gives B once a is removed; a is the median over the (up to) three smallest
  // messages of their time less the bandwidth term (one message alone is too noisy on a busy
  // host); two refinement passes.
  const double n = o.link_ranks;
  const double steps = 2 * (n - 1), factor = 2 * (n - 1) / n;
  const LinkPoint& small = r.points.front();
  const LinkPoint& large = r.points.back();
  const std::size_t n_small = std::max<std::size_t>(1, std::min<std::size_t>(3, r.points.size() - 1));
  double a = small.median / steps, B = factor * large.bytes / large.median;
  for (int it = 0; it < 3; ++it) {
    B = factor * large.bytes / std::max(large.median - steps * a, 0.5 * large.median);
    std::vector<double> residuals;
    for (std::size_t i = 0; i < n_small; ++i) {
      residuals.push_back(std::max(0.0, (r.points[i].median - factor * r.points[i].bytes / B) / steps));
    }
    a = spread_of(residuals).median;
  }
  r.latency = a;
  r.bus_bandwidth = B;
  r.measured = true;
  r.note = fmt::format("ring all-reduce over {} local processes ({}, 127.0.0.1), {} sizes {}..{} bytes, median of {}",
                       o.link_ranks, o.link_backend, r.points.size(), small.bytes, large.bytes, o.repeats);
  return r;
}

}  // namespace

CalibrationResult calibrate(const CalibrateOptions& opts) {
  CalibrateOptions o = opts;
  const bool cuda = o.device == "cuda";
  if (o.device != "cpu" && !cuda) throw InputError(fmt::format("--device {}: must be cpu or cuda", o.device));
  if (o.gemm_shapes.empty()) {
    for (int s : cuda ? std::vector<int>{256, 512, 1024, 2048, 4096, 8192, 16384}
                      : std::vector<int>{32, 64, 128, 256, 512, 1024, 2048}) {
      o.gemm_shapes.push_back({s, s, s});
    }
  }
  if (o.copy_bytes <= 0) o.copy_bytes = cuda ? 1024.0 * 1024 * 1024 : 256.0 * 1024 * 1024;
  if (o.link_bytes.empty()) {
    for (double b = 4096; b <= (cuda ? 1024.0 : 64.0) * 1024 * 1024; b *= 4) o.link_bytes.push_back(b);
  }

  CalibrationResult r;
  r.torch_version = TORCH_VERSION;
  // The link test forks first, before this process runs any LibTorch work.
  if (o.link_ranks >= 2) {
    r.link = link_benchmark(o);
  } else {
    r.link.note = "not measured (--link-ranks < 2)";
  }

  if (!cuda) torch::set_num_threads(std::max(1, o.threads));
  if (cuda && !torch::cuda::is_available()) throw InputError("--device cuda: no CUDA device is visible");
  r.threads = cuda ? 0 : torch::get_num_threads();
  const auto dtype = cuda ? torch::kBFloat16 : torch::kFloat32;
  r.dtype = cuda ? "bf16" : "fp32";
  const auto to = torch::TensorOptions().dtype(dtype).device(cuda ? torch::kCUDA : torch::kCPU);
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  r.device_name = cuda ? "cuda" : cpu_model_name();
  torch::manual_seed(0);
  { auto warm = torch::ones({8, 8}, to).sum().item<double>(); (void)warm; }
  r.baseline_rss = cuda ? 0 : resident_bytes();

  // GEMM: c[m x n] = a[m x k] b[k x n], 2 m n k FLOPs per call. The efficiency curve is by FLOPs
  // (sim/cluster.hpp), so of shapes with equal FLOPs the fastest one stays.
  for (const auto& sh : o.gemm_shapes) {
    auto a = torch::randn({sh.m, sh.k}, to), b = torch::randn({sh.k, sh.n}, to), c = torch::empty({sh.m, sh.n}, to);
    GemmPoint p{sh.m, sh.n, sh.k, 2.0 * sh.m * sh.n * sh.k, 0, 0};
    p.median = time_per_call([&] { at::mm_out(c, a, b); }, sync, o.warmup, o.repeats, 2e-3);
    p.rate = p.flops / p.median;
    r.best_gemm_rate = std::max(r.best_gemm_rate, p.rate);
    auto same = std::find_if(r.gemm.begin(), r.gemm.end(), [&](const GemmPoint& q) { return q.flops == p.flops; });
    if (same == r.gemm.end()) {
      r.gemm.push_back(p);
    } else if (p.rate > same->rate) {
      *same = p;
    }
  }
  std::sort(r.gemm.begin(), r.gemm.end(), [](const GemmPoint& x, const GemmPoint& y) { return x.flops < y.flops; });

  // Copy: one read and one write of `copy_bytes` per call.
  {
    const long elems = static_cast<long>(o.copy_bytes / (cuda ? 2 : 4));
    auto src = torch::ones({elems}, to), dst = torch::empty({elems}, to);
    const Seconds t = time_per_call([&] { dst.copy_(src); }, sync, o.warmup, o.repeats, 2e-3);
    r.copy_bandwidth = 2.0 * static_cast<double>(elems) * src.element_size() / t;
  }

  // Fused attention (SDPA, not causal): QK^T and PV, 4 b h s^2 d FLOPs.
  {
    const long b = cuda ? 8 : 1, h = cuda ? 32 : 8, s = cuda ? 2048 : 512, d = cuda ? 128 : 64;
    auto q = torch::randn({b, h, s, d}, to), k = torch::randn({b, h, s, d}, to), v = torch::randn({b, h, s, d}, to);
    r.attention_flops = 4.0 * b * h * s * s * d;
    r.attention_seq = static_cast<int>(s);
    r.attention_head_dim = static_cast<int>(d);
    r.attention_batch_heads = static_cast<int>(b * h);
    const Seconds t = time_per_call([&] { (void)at::scaled_dot_product_attention(q, k, v); }, sync, o.warmup,
                                    o.repeats, 2e-3);
    r.attention_rate = r.attention_flops / t;
  }

  // Framework cost of a small matmul in training: autograd forward + backward vs one bare kernel.
  {
    const long m = cuda ? 4096 : 128, k = cuda ? 1024 : 64, n = cuda ? 1024 : 64;
    r.autograd_m = static_cast<int>(m);
    r.autograd_n = static_cast<int>(n);
    r.autograd_k = static_cast<int>(k);
    auto x = torch::randn({m, k}, to).requires_grad_(true), w = torch::randn({k, n}, to).requires_grad_(true);
    auto g = torch::ones({m, n}, to), c = torch::empty({m, n}, to);
    r.autograd_matmul = time_per_call(
        [&] {
          x.mutable_grad() = at::Tensor();
          w.mutable_grad() = at::Tensor();
          torch::mm(x, w).backward(g);
        },
        sync, o.warmup, o.repeats, 2e-3);
    auto xd = x.detach(), wd = w.detach();
    r.bare_matmul = time_per_call([&] { at::mm_out(c, xd, wd); }, sync, o.warmup, o.repeats, 2e-3);
  }
  return r;
}

}  // namespace trainplan::exec
