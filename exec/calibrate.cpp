// Calibration micro-benchmarks with LibTorch: the op tables predict reads (sim/op_costs.hpp: GEMMs
// by shape and pass, causal attention, memory-bound kernels, the kernel floor), copy bandwidth, and
// all-reduce time between local ranks (Gloo on CPU, NCCL across GPUs).
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

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <functional>
#include <sstream>
#include <tuple>

#include "exec/parallel.hpp"
#include "sim/check.hpp"
#include "sim/measurement.hpp"
#include "sim/model_spec.hpp"
#include "sim/op_costs.hpp"

namespace trainplan::exec {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of `f`: each timed sample runs `f` enough times to last at least
// `min_sample` (so that microsecond kernels are not lost in clock noise), `warmup` samples are
// discarded, and the median of `repeats` samples is returned. `agree` (collectives) makes every
// rank use the same number of calls per sample: it returns the largest of the ranks' counts.
// `cuda_events`: a sample is the time between two CUDA events recorded on the current stream of
// GPU 0 around its calls (GPU time, c10::Event::elapsedTime in ms); otherwise wall clock around
// the calls and `sync`.
Seconds time_per_call(const std::function<void()>& f, const std::function<void()>& sync, int warmup, int repeats,
                      Seconds min_sample, const std::function<int(int)>& agree = {}, bool cuda_events = false) {
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
    double dt = 0;
    if (cuda_events) {
      const c10::Stream stream =
          c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(c10::Device(c10::DeviceType::CUDA, 0));
      // BACKEND_DEFAULT: a CUDA event with timing enabled (PYTORCH_DEFAULT disables it).
      c10::Event start(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      c10::Event end(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      start.record(stream);
      for (int k = 0; k < inner; ++k) f();
      end.record(stream);
      end.synchronize();
      dt = start.elapsedTime(end) * 1e-3 / inner;
    } else {
      t0 = Clock::now();
      for (int k = 0; k < inner; ++k) f();
      sync();
      dt = std::chrono::duration<double>(Clock::now() - t0).count() / inner;
    }
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

// The link test's all-reduce between the local ranks: NCCL through the executor's own process
// groups (one rank per GPU), or a Gloo group over 127.0.0.1.
class LinkGroup {
 public:
  LinkGroup(bool cuda, int rank, int ranks, const c10::intrusive_ptr<c10d::Store>& store) : clock_(cuda) {
    if (cuda) {
      Strategy s;
      s.dp = ranks;
      GroupSettings gs;
      gs.backend = "nccl";
      gs.timeout = std::chrono::milliseconds(60000);
      groups_ = make_groups(RankLayout(s), rank, store, gs, clock_);
      return;
    }
    auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    gloo_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, ranks, opts);
  }
  void all_reduce(at::Tensor& t, c10d::ReduceOp op) {
    if (!gloo_) return groups_.world->all_reduce(t, op);
    std::vector<at::Tensor> ts{t};
    c10d::AllreduceOptions ao;
    ao.reduceOp = op;
    gloo_->allreduce(ts, ao)->wait();
  }

 private:
  PhaseClock clock_;
  Groups groups_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
};

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
    LinkGroup group(cuda, rank, ranks, store);
    const auto dev = cuda ? torch::Device(torch::kCUDA, rank) : torch::Device(torch::kCPU);
    auto sync = [&] {
      if (cuda) torch::cuda::synchronize(rank);
    };
    auto agree = [&](int inner) {
      auto x = torch::full({1}, static_cast<double>(inner), torch::TensorOptions().dtype(torch::kFloat64)).to(dev);
      group.all_reduce(x, c10d::ReduceOp::MAX);
      return static_cast<int>(x.cpu().item<double>());
    };
    std::vector<double> medians;
    for (Bytes b : o.link_bytes) {
      auto t = torch::ones({static_cast<long>(b / 4)}, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
      medians.push_back(
          time_per_call([&] { group.all_reduce(t, c10d::ReduceOp::SUM); }, sync, o.warmup, o.repeats, 2e-3, agree));
    }
    // Every rank agrees on the slowest rank's figure.
    auto m = torch::tensor(medians, torch::TensorOptions().dtype(torch::kFloat64)).to(dev);
    group.all_reduce(m, c10d::ReduceOp::MAX);
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

// A loopback socket listening on a port the kernel picks (-1 when it cannot be opened).
int listen_loopback(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  port = ntohs(addr.sin_port);
  return fd;
}

// Reads what rank 0 writes to `fd` until every rank has closed it, or 300 s have passed
// (`timed_out`; the caller then kills the ranks).
std::string read_report(int fd, bool& timed_out) {
  std::string text;
  const auto deadline = Clock::now() + std::chrono::seconds(300);
  timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      return text;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return text;
    text.append(buf, static_cast<std::size_t>(n));
  }
}

// Ring all-reduce t(M) = 2(n-1) a + 2(n-1)/n M / B (sim/collectives.hpp) fitted to the measured
// points. Two unknowns: the largest message gives B once a is removed; a is the median over the
// (up to) three smallest messages of their time less the bandwidth term (one message alone is too
// noisy on a busy host); two refinement passes.
void fit_ring(LinkResult& r, const CalibrateOptions& o) {
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
}

LinkResult link_benchmark(const CalibrateOptions& o) {
  LinkResult r;
  r.ranks = o.link_ranks;
  // The store master's listening socket is opened here and handed to rank 0: no port race.
  int port = 0;
  const int fd = listen_loopback(port);
  if (fd < 0) {
    r.note = fmt::format("not measured: cannot open a loopback socket ({})", std::strerror(errno));
    return r;
  }
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
  bool timed_out = false;
  const std::string text = read_report(pipefd[0], timed_out);
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
  fit_ring(r, o);
  return r;
}

// The options with every empty list and size replaced by its default ladder for the device.
CalibrateOptions with_defaults(CalibrateOptions o) {
  const bool cuda = o.device == "cuda";
  if (o.gemm_shapes.empty() && o.model_shapes.empty()) {
    for (int s : cuda ? std::vector<int>{256, 512, 1024, 2048, 4096, 8192, 16384}
                      : std::vector<int>{32, 64, 128, 256, 512, 1024, 2048}) {
      o.gemm_shapes.push_back({s, s, s, "square"});
    }
  }
  if (o.copy_bytes <= 0) o.copy_bytes = cuda ? 1024.0 * 1024 * 1024 : 256.0 * 1024 * 1024;
  if (o.link_bytes.empty()) {
    for (double b = 4096; b <= (cuda ? 1024.0 : 64.0) * 1024 * 1024; b *= 4) o.link_bytes.push_back(b);
  }
  if (o.attention_seqs.empty()) {
    o.attention_seqs = cuda ? std::vector<int>{1024, 2048, 4096, 8192} : std::vector<int>{128, 256, 512};
  }
  if (o.attention_head_dims.empty()) o.attention_head_dims = {64, 128};
  if (o.mem_bytes.empty()) {
    o.mem_bytes = cuda ? std::vector<Bytes>{32.0 * (1 << 20), 128.0 * (1 << 20), 512.0 * (1 << 20)}
                       : std::vector<Bytes>{1.0 * (1 << 20), 8.0 * (1 << 20)};
  }
  return o;
}

// What every device benchmark shares: the device, its table dtype (bf16 on CUDA, fp32 on CPU),
// and the timing rule: the median of `repeats` samples after `warmup`, CUDA events on a GPU.
struct Bench {
  Bench(bool on_cuda, int w, int r)
      : cuda(on_cuda), warmup(w), repeats(r),
        to(torch::TensorOptions().dtype(cuda ? torch::kBFloat16 : torch::kFloat32).device(cuda ? torch::kCUDA : torch::kCPU)),
        to32(torch::TensorOptions().dtype(torch::kFloat32).device(cuda ? torch::kCUDA : torch::kCPU)) {}
  Seconds timed(const std::function<void()>& f) const {
    const bool on_cuda = cuda;
    auto sync = [on_cuda] {
      if (on_cuda) torch::cuda::synchronize();
    };
    return time_per_call(f, sync, warmup, repeats, 2e-3, {}, cuda);
  }
  bool cuda;
  int warmup, repeats;
  torch::TensorOptions to, to32;
};

// Launch overhead: `launches` in-place adds on one element back to back, per kernel. A single
// small GEMM would add its own work to the launch cost.
void measure_kernel_floor(const Bench& b, const CalibrateOptions& o, CalibrationResult& r) {
  auto x = torch::zeros({1}, b.to32);
  r.kernel_floor_launches = o.launches;
  r.kernel_floor = b.timed([&] {
                     for (int i = 0; i < o.launches; ++i) x.add_(1);
                   }) /
                   o.launches;
}

// GEMMs y = x W^T on M tokens, N outputs, K inputs: forward x W^T, dgrad dy W, wgrad dy^T x
// (as ops_bench.py times them), 2 m n k FLOPs each.
void time_gemm(const Bench& b, GemmPoint& p) {
  auto x = torch::randn({p.m, p.k}, b.to), w = torch::randn({p.n, p.k}, b.to), dy = torch::randn({p.m, p.n}, b.to);
  auto y = torch::empty({p.m, p.n}, b.to), dx = torch::empty({p.m, p.k}, b.to), dw = torch::empty({p.n, p.k}, b.to);
  p.flops = 2.0 * p.m * p.n * p.k;
  p.median = b.timed([&] { at::mm_out(y, x, w.t()); });
  p.dgrad = b.timed([&] { at::mm_out(dx, dy, w); });
  p.wgrad = b.timed([&] { at::mm_out(dw, dy.t(), x); });
  p.rate = p.flops / p.median;
}

// Every distinct shape once (the labels of a repeated one joined), sorted by work.
void measure_gemms(const Bench& b, const CalibrateOptions& o, CalibrationResult& r) {
  std::vector<CalibrateOptions::Shape> shapes = o.model_shapes;
  shapes.insert(shapes.end(), o.gemm_shapes.begin(), o.gemm_shapes.end());
  for (const auto& sh : shapes) {
    auto same = std::find_if(r.gemm.begin(), r.gemm.end(),
                             [&](const GemmPoint& q) { return q.m == sh.m && q.n == sh.n && q.k == sh.k; });
    if (same != r.gemm.end()) {
      if (same->label.find(sh.label) == std::string::npos) same->label += ", " + sh.label;
      continue;
    }
    GemmPoint p{sh.m, sh.n, sh.k, 0, 0, 0, 0, 0, sh.label};
    time_gemm(b, p);
    r.best_gemm_rate = std::max(r.best_gemm_rate, p.rate);
    r.gemm.push_back(p);
  }
  std::sort(r.gemm.begin(), r.gemm.end(), [](const GemmPoint& x, const GemmPoint& y) {
    return std::tie(x.flops, x.m, x.n, x.k) < std::tie(y.flops, y.m, y.n, y.k);
  });
}

// Misaligned GEMMs: the same M x K with N and N - 1 outputs (an odd N, like GPT-2's 50257-token
// LM head, leaves every row of W, Y and dY off a 16-byte boundary), all three products each.
void measure_misaligned_gemm(const Bench& b, CalibrationResult& r) {
  const int m = b.cuda ? 8192 : 256, n = b.cuda ? 8192 : 256, k = b.cuda ? 2048 : 256;
  auto three = [&](int nn) {
    GemmPoint p{m, nn, k, 0, 0, 0, 0, 0, "misaligned"};
    time_gemm(b, p);
    return p.median + p.dgrad + p.wgrad;
  };
  const Seconds aligned = three(n), misaligned = three(n - 1);
  r.misaligned_gemm_slowdown = std::max(1.0, misaligned / aligned);
  r.misaligned_m = m;
  r.misaligned_n = n;
  r.misaligned_k = k;
}

// Copy: one read and one write of `copy_bytes` per call.
void measure_copy(const Bench& b, const CalibrateOptions& o, CalibrationResult& r) {
  const long elems = static_cast<long>(o.copy_bytes / (b.cuda ? 2 : 4));
  auto src = torch::ones({elems}, b.to), dst = torch::empty({elems}, b.to);
  const Seconds t = b.timed([&] { dst.copy_(src); });
  r.copy_bandwidth = 2.0 * static_cast<double>(elems) * src.element_size() / t;
}

// Causal SDPA (flash where the device has it), forward and forward + backward (gradients of q,
// k, v), as ops_bench.py: batch x heads chosen so batch * seq is a fixed token count and heads *
// head_dim a fixed width (16384 tokens x 2048 on CUDA, 1024 x 256 on CPU). The attention
// efficiency of the topology's gpu section comes from the largest attention measured.
void measure_attention(const Bench& b, const CalibrateOptions& o, CalibrationResult& r) {
  for (int d : o.attention_head_dims) {
    for (int s : o.attention_seqs) {
      const long bs = std::max<long>(1, (b.cuda ? 16384 : 1024) / s), h = std::max<long>(1, (b.cuda ? 2048 : 256) / d);
      auto q = torch::randn({bs, h, s, d}, b.to).requires_grad_(true);
      auto k = torch::randn({bs, h, s, d}, b.to).requires_grad_(true);
      auto v = torch::randn({bs, h, s, d}, b.to).requires_grad_(true);
      auto g = torch::randn({bs, h, s, d}, b.to);
      AttentionPoint a{s, d, static_cast<int>(bs * h), 0, 0};
      a.fwd = b.timed([&] { (void)at::scaled_dot_product_attention(q, k, v, {}, 0.0, true); });
      a.fwd_bwd = b.timed([&] {
        for (auto* t : {&q, &k, &v}) t->mutable_grad() = at::Tensor();
        at::scaled_dot_product_attention(q, k, v, {}, 0.0, true).backward(g);
      });
      r.attention.push_back(a);
    }
  }
  if (r.attention.empty()) return;
  const auto& a = *std::max_element(r.attention.begin(), r.attention.end(), [](const auto& x, const auto& y) {
    return 1.0 * x.seq * x.seq * x.head_dim * x.batch_heads < 1.0 * y.seq * y.seq * y.head_dim * y.batch_heads;
  });
  r.attention_flops = causal_attention_fwd_flops(a.seq, a.head_dim, a.batch_heads);
  r.attention_rate = r.attention_flops / a.fwd;
  r.attention_seq = a.seq;
  r.attention_head_dim = a.head_dim;
  r.attention_batch_heads = a.batch_heads;
}

// One memory-bound kernel, forward and forward + backward (the leaves' gradients dropped before
// each run); a kernel the device lacks is noted instead.
void time_mem_kernel(const Bench& b, CalibrationResult& r, const std::string& name, Bytes bytes,
                     const std::function<at::Tensor()>& fwd, const std::vector<at::Tensor*>& leaves,
                     const std::function<void(at::Tensor&)>& backward) {
  try {
    MemPoint p{name, bytes, 0, 0};
    p.fwd = b.timed([&] { (void)fwd(); });
    p.fwd_bwd = b.timed([&] {
      for (auto* t : leaves) t->mutable_grad() = at::Tensor();
      at::Tensor y = fwd();
      backward(y);
    });
    r.memory.push_back(p);
  } catch (const c10::Error& e) {
    r.notes.push_back(fmt::format("{} not measured: {}", name, std::string(e.what_without_backtrace()).substr(0, 120)));
  }
}

// Memory-bound kernels, as ops_bench.py runs them, with autograd recording; `bytes` is the size
// of the input tensor as sim/op_costs.hpp defines it. Norm and activation inputs are
// tokens x width (width 4096 on CUDA, 1024 on CPU); cross-entropy logits tokens x 50304 (CUDA) or
// 8192 (CPU), cast to fp32 inside.
void measure_memory_kernels(const Bench& b, const CalibrateOptions& o, CalibrationResult& r) {
  const long width = b.cuda ? 4096 : 1024, vocab = b.cuda ? 50304 : 8192;
  const double esize = b.cuda ? 2 : 4;
  for (Bytes bytes : o.mem_bytes) {
    const long tokens = std::max<long>(1, std::lround(bytes / esize / width));
    const Bytes act_bytes = tokens * width * esize;
    auto x = torch::randn({tokens, width}, b.to).requires_grad_(true);
    auto g = torch::randn({tokens, width}, b.to);
    auto w = torch::ones({width}, b.to).requires_grad_(true), bias = torch::zeros({width}, b.to).requires_grad_(true);
    auto grad_g = [&](at::Tensor& y) { y.backward(g); };
    time_mem_kernel(b, r, "layer_norm", act_bytes, [&] { return at::layer_norm(x, {width}, w, bias); }, {&x, &w, &bias}, grad_g);
    time_mem_kernel(b, r, "rms_norm", act_bytes, [&] { return at::rms_norm(x, {width}, w); }, {&x, &w}, grad_g);
    time_mem_kernel(b, r, "gelu", act_bytes, [&] { return at::gelu(x, "tanh"); }, {&x}, grad_g);
    time_mem_kernel(b, r, "add", act_bytes, [&] { return x + g; }, {&x}, grad_g);
    // SwiGLU: input gate+up (tokens x 2 width), output silu(gate) * up.
    {
      const long t2 = std::max<long>(1, std::lround(bytes / esize / (2 * width)));
      auto u = torch::randn({t2, 2 * width}, b.to).requires_grad_(true);
      auto gu = torch::randn({t2, width}, b.to);
      time_mem_kernel(b, r, "swiglu", t2 * 2 * width * esize, [&] {
        auto parts = u.chunk(2, -1);
        return at::silu(parts[0]) * parts[1];
      }, {&u}, [&](at::Tensor& y) { y.backward(gu); });
    }
    // Cross-entropy in fp32 on the table-dtype logits (cast, log-softmax, NLL).
    {
      const long tl = std::max<long>(1, std::lround(bytes / esize / vocab));
      auto logits = torch::randn({tl, vocab}, b.to).requires_grad_(true);
      auto target = torch::randint(0, vocab, {tl}, torch::TensorOptions().dtype(torch::kLong).device(b.to.device()));
      time_mem_kernel(b, r, "cross_entropy_fp32", tl * vocab * esize,
                      [&] { return at::cross_entropy_loss(logits.to(torch::kFloat32), target); }, {&logits},
                      [&](at::Tensor& y) { y.backward(); });
    }
  }
}

// AdamW step over fp32 parameters of `bytes` (8 tensors, gradients and both moments resident):
// fused (at::_fused_adamw_, PyTorch's fused=True kernel) and foreach (the torch._foreach_* calls
// of PyTorch's foreach=True AdamW, torch/optim/adamw.py _multi_tensor_adam, with a fixed step).
void measure_adamw(const Bench& b, const CalibrateOptions& o, CalibrationResult& r) {
  for (Bytes bytes : o.mem_bytes) {
    const long n = std::max<long>(1, std::lround(bytes / 4 / 8));
    std::vector<at::Tensor> p, gr, m, v, steps;
    for (int i = 0; i < 8; ++i) {
      p.push_back(torch::zeros({n}, b.to32));
      gr.push_back(torch::randn({n}, b.to32));
      m.push_back(torch::zeros({n}, b.to32));
      v.push_back(torch::zeros({n}, b.to32));
      steps.push_back(torch::ones({}, b.to32));
    }
    const double lr = 1e-4, b1 = 0.9, b2 = 0.999, wd = 0.01, eps = 1e-8;
    const Bytes pbytes = 8.0 * n * 4;
    try {
      r.memory.push_back({"adamw_fused", pbytes,
                          b.timed([&] { at::_fused_adamw_(p, gr, m, v, {}, steps, lr, b1, b2, wd, eps, false, false); }),
                          0});
    } catch (const c10::Error& e) {
      r.notes.push_back(
          fmt::format("adamw_fused not measured: {}", std::string(e.what_without_backtrace()).substr(0, 120)));
    }
    const double bc1 = 1 - b1, bc2_sqrt = std::sqrt(1 - b2);  // bias corrections at step 1
    r.memory.push_back({"adamw_foreach", pbytes, b.timed([&] {
                          at::_foreach_mul_(p, 1 - lr * wd);
                          at::_foreach_lerp_(m, gr, 1 - b1);
                          at::_foreach_mul_(v, b2);
                          at::_foreach_addcmul_(v, gr, gr, 1 - b2);
                          auto denom = at::_foreach_sqrt(v);
                          at::_foreach_div_(denom, bc2_sqrt);
                          at::_foreach_add_(denom, eps);
                          at::_foreach_addcdiv_(p, m, denom, -lr / bc1);
                        }),
                        0});
  }
}

// Framework cost of a small matmul in training: autograd forward + backward vs one bare kernel.
void measure_autograd_matmul(const Bench& b, CalibrationResult& r) {
  const long m = b.cuda ? 4096 : 128, k = b.cuda ? 1024 : 64, n = b.cuda ? 1024 : 64;
  r.autograd_m = static_cast<int>(m);
  r.autograd_n = static_cast<int>(n);
  r.autograd_k = static_cast<int>(k);
  auto x = torch::randn({m, k}, b.to).requires_grad_(true), w = torch::randn({k, n}, b.to).requires_grad_(true);
  auto g = torch::ones({m, n}, b.to), c = torch::empty({m, n}, b.to);
  r.autograd_matmul = b.timed([&] {
    x.mutable_grad() = at::Tensor();
    w.mutable_grad() = at::Tensor();
    torch::mm(x, w).backward(g);
  });
  auto xd = x.detach(), wd = w.detach();
  r.bare_matmul = b.timed([&] { at::mm_out(c, xd, wd); });
}

// Host time per kernel as a training step issues them: a chain of L square linear layers
// (y = y W_i) forward and backward through autograd, timed back to back for two depths. Each
// layer past the first adds three kernels (forward, input gradient, weight gradient) whose GPU
// time is a few microseconds at this size, so the time is the host's: the slope over depth is
// the framework's cost per kernel (a software profile's host.per_kernel_us), and what is left at
// depth 0 the fixed cost of one forward + backward() call (autograd engine start-up, loss seed),
// which a single-matmul figure would spread over its three kernels.
void measure_host_chain(const Bench& b, const CalibrateOptions& o, CalibrationResult& r) {
  const long d = b.cuda ? 256 : 32;
  const int shallow = 2, deep = 2 + o.host_chain_layers;
  std::vector<torch::Tensor> ws;
  for (int i = 0; i < deep; ++i) ws.push_back(torch::randn({d, d}, b.to).mul_(1.0 / std::sqrt(d)).requires_grad_(true));
  auto x = torch::randn({d, d}, b.to);
  auto chain = [&](int layers) {
    return [&, layers] {
      for (int i = 0; i < layers; ++i) ws[i].mutable_grad() = at::Tensor();
      auto y = x;
      for (int i = 0; i < layers; ++i) y = torch::mm(y, ws[i]);
      y.sum().backward();
    };
  };
  const Seconds t_shallow = b.timed(chain(shallow)), t_deep = b.timed(chain(deep));
  r.host_chain_layers = {shallow, deep};
  r.host_chain_dim = static_cast<int>(d);
  r.host_per_kernel = std::max(0.0, (t_deep - t_shallow) / (3.0 * (deep - shallow)));
  r.backward_call_overhead = std::max(0.0, t_shallow - (3.0 * shallow - 1) * r.host_per_kernel);
}

}  // namespace

std::vector<CalibrateOptions::Shape> layer_gemm_shapes(const LayerGraph& graph, int tp, const std::vector<int>& tokens) {
  const ModelSpec& model = graph.model();
  std::vector<const OpSpec*> ops;
  for (const auto& op : graph.layer_ops()) ops.push_back(&op);
  for (const auto& op : graph.post_ops()) ops.push_back(&op);
  std::vector<CalibrateOptions::Shape> out;
  for (const OpSpec* op : ops) {
    if (!op->matmul || op->kind == OpKind::attention) continue;
    // Input width of the op: the hidden size, except MLP down (the MLP inner size) and the
    // attention output projection (heads x head_dim, layer_graph.cpp).
    const double k = op->kind == OpKind::mlp_down   ? static_cast<double>(model.ffn_hidden)
                     : op->kind == OpKind::out_proj ? static_cast<double>(model.q_width())
                                                    : static_cast<double>(model.hidden);
    const double n = op->flops_per_token / (2 * k);
    const bool row_parallel = op->kind == OpKind::out_proj || op->kind == OpKind::mlp_down;
    const int nn = static_cast<int>(std::lround(row_parallel ? n : n / tp));
    const int kk = static_cast<int>(std::lround(row_parallel ? k / tp : k));
    const std::string kind = to_string(op->kind);
    for (int m : tokens) {
      out.push_back({m, std::max(1, nn), std::max(1, kk), fmt::format("{} {} tp{}", model.name, kind, tp)});
    }
  }
  return out;
}

CalibrationResult calibrate(const CalibrateOptions& opts) {
  const bool cuda = opts.device == "cuda";
  if (opts.device != "cpu" && !cuda) throw InputError(fmt::format("--device {}: must be cpu or cuda", opts.device));
  const CalibrateOptions o = with_defaults(opts);
  CalibrationResult r;
  r.torch_version = TORCH_VERSION;
  r.warmup = o.warmup;
  r.repeats = o.repeats;
  r.timing = cuda ? "CUDA events" : "wall clock";
  // The link test forks first, before this process runs any LibTorch work.
  if (o.link_ranks >= 2) {
    r.link = link_benchmark(o);
  } else {
    r.link.note = "not measured (--link-ranks < 2)";
  }

  if (!cuda) torch::set_num_threads(std::max(1, o.threads));
  if (cuda && !torch::cuda::is_available()) throw InputError("--device cuda: no CUDA device is visible");
  r.threads = cuda ? 0 : torch::get_num_threads();
  r.dtype = cuda ? "bf16" : "fp32";
  const Bench b(cuda, o.warmup, o.repeats);
  r.device_name = cuda ? "cuda" : cpu_model_name();
  torch::manual_seed(0);
  { auto warm = torch::ones({8, 8}, b.to).sum().item<double>(); (void)warm; }
  r.baseline_rss = cuda ? 0 : resident_bytes();

  measure_kernel_floor(b, o, r);
  measure_gemms(b, o, r);
  measure_misaligned_gemm(b, r);
  measure_copy(b, o, r);
  measure_attention(b, o, r);
  measure_memory_kernels(b, o, r);
  measure_adamw(b, o, r);
  std::stable_sort(r.memory.begin(), r.memory.end(), [](const MemPoint& x, const MemPoint& y) {
    return std::tie(x.kernel, x.bytes) < std::tie(y.kernel, y.bytes);
  });
  measure_autograd_matmul(b, r);
  measure_host_chain(b, o, r);
  return r;
}

}  // namespace trainplan::exec
