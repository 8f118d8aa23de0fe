#include "exec/parallel.hpp"

#include <numeric>

#include <fmt/format.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#ifdef TRAINPLAN_EXEC_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainplan::exec {

// ---------------------------------------------------------------- PhaseClock

#ifdef TRAINPLAN_EXEC_CUDA
// Events of one step, reused from step to step: event i marks where phase[i] begins on the stream.
struct PhaseClock::Events {
  std::vector<c10::cuda::CUDAEvent> pool;
  std::vector<Ph> phase;
  size_t used = 0;
  void record(Ph p) {
    if (used == pool.size()) {
      pool.emplace_back(cudaEventDefault);  // timing enabled (CUDAEvent's default disables it)
      phase.push_back(p);
    }
    pool[used].record(c10::cuda::getCurrentCUDAStream());
    phase[used] = p;
    ++used;
  }
};
#else
struct PhaseClock::Events {};
#endif

PhaseClock::PhaseClock(bool device_timing) {
#ifdef TRAINPLAN_EXEC_CUDA
  if (device_timing) events_ = std::make_unique<Events>();
#else
  (void)device_timing;
#endif
}

PhaseClock::~PhaseClock() = default;

void PhaseClock::start() {
  acc_.fill(0);
  dp_in_flight = 0;
  current_ = Ph::other;
#ifdef TRAINPLAN_EXEC_CUDA
  if (events_) {
    events_->used = 0;
    events_->record(Ph::other);
  }
#endif
  since_ = Clock::now();
}

Ph PhaseClock::enter(Ph p) {
  const Ph prev = current_;
  current_ = p;
#ifdef TRAINPLAN_EXEC_CUDA
  if (events_) {
    events_->record(p);
    return prev;
  }
#endif
  const auto now = Clock::now();
  acc_[static_cast<int>(prev)] += std::chrono::duration<double>(now - since_).count();
  since_ = now;
  return prev;
}

std::array<double, kPhases> PhaseClock::stop() {
  enter(Ph::other);
#ifdef TRAINPLAN_EXEC_CUDA
  if (events_) {
    Events& e = *events_;
    e.pool[e.used - 1].synchronize();
    for (size_t i = 0; i + 1 < e.used; ++i)
      acc_[static_cast<int>(e.phase[i])] += e.pool[i].elapsed_time(e.pool[i + 1]) / 1e3;  // ms -> s
  }
#endif
  return acc_;
}

// ---------------------------------------------------------------- Comm

namespace {

// A Gloo work on host copies of CUDA tensors: waiting for it copies the result back.
class StagedWork : public c10d::Work {
 public:
  StagedWork(c10::intrusive_ptr<c10d::Work> inner, at::Tensor host, at::Tensor device)
      : inner_(std::move(inner)), host_(std::move(host)), device_(std::move(device)) {}
  bool wait(std::chrono::milliseconds timeout) override {
    inner_->wait(timeout);
    if (device_.defined() && !copied_) device_.copy_(host_);
    copied_ = true;
    return true;
  }
  bool isCompleted() override { return inner_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  at::Tensor host_, device_;  // device_ undefined: nothing to copy back (a send)
  bool copied_ = false;
};

c10::intrusive_ptr<c10d::Work> staged_work(c10::intrusive_ptr<c10d::Work> inner, at::Tensor host, at::Tensor device = {}) {
  return c10::make_intrusive<StagedWork>(std::move(inner), std::move(host), std::move(device));
}

}  // namespace

Comm::Comm(c10::intrusive_ptr<c10d::Backend> pg, std::vector<int> ranks, int index, PhaseClock* clock, Ph phase,
           std::string name, bool stage_cuda)
    : pg_(std::move(pg)), ranks_(std::move(ranks)), index_(index), clock_(clock), phase_(phase), name_(std::move(name)),
      stage_cuda_(stage_cuda) {}

void Comm::wait(const c10::intrusive_ptr<c10d::Work>& w, Ph phase) {
  if (!w) return;
  PhaseScope s(*clock_, phase);
  w->wait();
}

void Comm::all_reduce(at::Tensor& t, c10d::ReduceOp op) {
  if (size() == 1) return;
  PhaseScope s(*clock_, phase_);
  c10d::AllreduceOptions o;
  o.reduceOp = op;
  count(t);
  std::vector<at::Tensor> v{staged(t) ? t.cpu() : t};
  pg_->allreduce(v, o)->wait();
  if (staged(t)) t.copy_(v[0]);
}

c10::intrusive_ptr<c10d::Work> Comm::all_reduce_async(at::Tensor& t) {
  if (size() == 1) return {};
  count(t);
  std::vector<at::Tensor> v{staged(t) ? t.cpu() : t};
  auto w = pg_->allreduce(v);
  return staged(t) ? staged_work(w, v[0], t) : w;
}

at::Tensor Comm::all_gather_dim0(const at::Tensor& t) {
  if (size() == 1) return t;
  PhaseScope s(*clock_, phase_);
  at::Tensor in = staged(t) ? t.cpu().contiguous() : t.contiguous();
  count(in);
  auto shape = in.sizes().vec();
  shape[0] *= size();
  at::Tensor out = at::empty(shape, in.options());
  pg_->_allgather_base(out, in)->wait();
  return staged(t) ? out.to(t.device()) : out;
}

at::Tensor Comm::reduce_scatter_dim0(const at::Tensor& t) {
  if (size() == 1) return t;
  PhaseScope s(*clock_, phase_);
  at::Tensor in = staged(t) ? t.cpu().contiguous() : t.contiguous();
  TORCH_CHECK(in.size(0) % size() == 0, "reduce_scatter: dim 0 not divisible by group size");
  count(in);
  auto shape = in.sizes().vec();
  shape[0] /= size();
  at::Tensor out = at::empty(shape, in.options());
  pg_->_reduce_scatter_base(out, in)->wait();
  return staged(t) ? out.to(t.device()) : out;
}

at::Tensor Comm::all_to_all_dim0(const at::Tensor& t, const std::vector<int64_t>& out_splits,
                                 const std::vector<int64_t>& in_splits) {
  TORCH_CHECK(static_cast<int>(out_splits.size()) == size() && static_cast<int>(in_splits.size()) == size(),
              "all_to_all: one split per member");
  if (size() == 1) return t;
  PhaseScope s(*clock_, phase_);
  at::Tensor in = staged(t) ? t.cpu().contiguous() : t.contiguous();
  count(in);
  auto shape = in.sizes().vec();
  shape[0] = std::accumulate(out_splits.begin(), out_splits.end(), int64_t(0));
  at::Tensor out = at::empty(shape, in.options());
  std::vector<int64_t> o = out_splits, i = in_splits;  // c10d takes them by non-const reference
  pg_->alltoall_base(out, in, o, i)->wait();
  return staged(t) ? out.to(t.device()) : out;
}

c10::intrusive_ptr<c10d::Work> Comm::all_gather_flat_async(at::Tensor& full, at::Tensor& shard) {
  if (size() == 1) {
    if (full.data_ptr() != shard.data_ptr()) full.copy_(shard);
    return {};
  }
  count(shard);
  if (!staged(full)) return pg_->_allgather_base(full, shard);
  at::Tensor host_full = at::empty(full.sizes(), full.options().device(at::kCPU)), host_shard = shard.cpu();
  return staged_work(pg_->_allgather_base(host_full, host_shard), host_full, full);
}

c10::intrusive_ptr<c10d::Work> Comm::reduce_scatter_flat_async(at::Tensor& shard, at::Tensor& full) {
  if (size() == 1) {
    if (full.data_ptr() != shard.data_ptr()) shard.copy_(full);
    return {};
  }
  count(full);
  if (!staged(full)) return pg_->_reduce_scatter_base(shard, full);
  at::Tensor host_full = full.cpu(), host_shard = at::empty(shard.sizes(), shard.options().device(at::kCPU));
  return staged_work(pg_->_reduce_scatter_base(host_shard, host_full), host_shard, shard);
}

c10::intrusive_ptr<c10d::Work> Comm::reduce_async(at::Tensor& t, int root) {
  if (size() == 1) return {};
  c10d::ReduceOptions o;
  o.rootRank = root;
  std::vector<at::Tensor> v{staged(t) ? t.cpu() : t};
  auto w = pg_->reduce(v, o);
  return staged(t) ? staged_work(w, v[0], index_ == root ? t : at::Tensor()) : w;
}

c10::intrusive_ptr<c10d::Work> Comm::broadcast_async(at::Tensor& t, int root) {
  if (size() == 1) return {};
  if (index_ == root) count(t);
  c10d::BroadcastOptions o;
  o.rootRank = root;
  std::vector<at::Tensor> v{staged(t) ? t.cpu() : t};
  auto w = pg_->broadcast(v, o);
  return staged(t) ? staged_work(w, v[0], index_ == root ? at::Tensor() : t) : w;
}

c10::intrusive_ptr<c10d::Work> Comm::send(at::Tensor& t, int dst_index, int tag) {
  PhaseScope s(*clock_, phase_);
  count(t);
  std::vector<at::Tensor> v{staged(t) ? t.cpu() : t};
  auto w = pg_->send(v, dst_index, tag);
  return staged(t) ? staged_work(w, v[0]) : w;  // the host copy lives until the send is waited for
}

c10::intrusive_ptr<c10d::Work> Comm::recv(at::Tensor& t, int src_index, int tag) {
  PhaseScope s(*clock_, phase_);
  std::vector<at::Tensor> v{staged(t) ? at::empty(t.sizes(), t.options().device(at::kCPU)) : t};
  auto w = pg_->recv(v, src_index, tag);
  return staged(t) ? staged_work(w, v[0], t) : w;
}

std::vector<c10::intrusive_ptr<c10d::Work>> Comm::exchange_async(at::Tensor& out, int dst, at::Tensor& in, int src,
                                                                 int tag) {
  if (index_ % 2 == 0) {
    auto s = send(out, dst, tag);
    return {s, recv(in, src, tag)};
  }
  auto r = recv(in, src, tag);
  return {r, send(out, dst, tag)};
}

// ---------------------------------------------------------------- groups

namespace {

c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store, int index, int size,
                                               const GroupSettings& s) {
  if (s.backend == "gloo") {
    auto opts = c10d::ProcessGroupGloo::Options::create(s.timeout);
    opts->devices.push_back(s.gloo_host.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                                : c10d::ProcessGroupGloo::createDeviceForHostname(s.gloo_host));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, index, size, opts);
  }
#ifdef USE_C10D_NCCL
  if (s.backend == "nccl") {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = s.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, index, size, opts);
  }
#endif
  throw std::runtime_error(fmt::format("backend '{}' is not available in this build", s.backend));
}

std::unique_ptr<Comm> join(const std::vector<std::vector<int>>& groups, int rank, const std::string& name,
                           const c10::intrusive_ptr<c10d::Store>& store, const GroupSettings& s, PhaseClock& clock,
                           Ph phase) {
  std::unique_ptr<Comm> mine;
  for (const auto& g : groups) {
    auto it = std::find(g.begin(), g.end(), rank);
    if (it == g.end()) continue;
    const int index = static_cast<int>(it - g.begin());
    c10::intrusive_ptr<c10d::Backend> pg;
    if (g.size() > 1) {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(fmt::format("pg/{}/{}", name, g.front()), store);
      pg = make_backend(prefixed, index, static_cast<int>(g.size()), s);
    }
    mine = std::make_unique<Comm>(pg, g, index, &clock, phase, name, s.stage_cuda && s.backend == "gloo");
  }
  TORCH_CHECK(mine, "rank ", rank, " is in no ", name, " group");
  return mine;
}

}  // namespace

Groups make_groups(const RankLayout& layout, int rank, const c10::intrusive_ptr<c10d::Store>& store,
                   const GroupSettings& settings, PhaseClock& clock, bool experts) {
  Groups g;
  std::vector<int> job(layout.job_ranks());
  std::iota(job.begin(), job.end(), 0);
  g.world = join({job}, rank, "world", store, settings, clock, Ph::other);
  if (!layout.is_worker(rank)) {  // a dedicated parameter server
    for (auto [comm, name] : {std::pair{&g.tp, "tp"}, {&g.cp, "cp"}, {&g.dp, "dp"}, {&g.pp, "pp"}, {&g.embed, "embed"},
                              {&g.ep, "ep"}, {&g.etp, "etp"}, {&g.edp, "edp"}})
      *comm = join({{rank}}, rank, name, store, settings, clock, Ph::other);
    g.ps = join({job}, rank, "ps", store, settings, clock, Ph::dp_comm);
    return g;
  }
  g.tp = join(layout.all_groups({Dim::tp}), rank, "tp", store, settings, clock, Ph::tp_comm);
  g.cp = join(layout.all_groups({Dim::cp}), rank, "cp", store, settings, clock, Ph::cp_comm);
  g.dp = join(layout.all_groups({Dim::dp, Dim::cp}), rank, "dp", store, settings, clock, Ph::dp_comm);
  g.pp = join(layout.all_groups({Dim::pp}), rank, "pp", store, settings, clock, Ph::pp_comm);
  // Tied embeddings: the first and last pipeline stages hold copies of the word embedding.
  std::vector<std::vector<int>> embed;
  for (const auto& pp : layout.all_groups({Dim::pp})) {
    if (pp.size() > 1) embed.push_back({pp.front(), pp.back()});
    for (size_t i = 1; i + 1 < pp.size(); ++i) embed.push_back({pp[i]});
    if (pp.size() == 1) embed.push_back(pp);
  }
  std::sort(embed.begin(), embed.end());
  g.embed = join(embed, rank, "embed", store, settings, clock, Ph::pp_comm);
  // Expert groups only for a model with experts: a dense model's would be a needless backend.
  auto expert_group = [&](ExpertDim d, const char* name, Ph phase) {
    return experts ? join(layout.all_groups({d}), rank, name, store, settings, clock, phase)
                   : join({{rank}}, rank, name, store, settings, clock, phase);
  };
  g.ep = expert_group(ExpertDim::ep, "ep", Ph::ep_comm);
  g.etp = expert_group(ExpertDim::etp, "etp", Ph::tp_comm);
  g.edp = expert_group(ExpertDim::edp, "edp", Ph::dp_comm);
  if (layout.servers() > 0) g.ps = join({job}, rank, "ps", store, settings, clock, Ph::dp_comm);
  return g;
}

// ---------------------------------------------------------------- autograd transfers

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

Comm& comm_of(AutogradContext* ctx) { return *reinterpret_cast<Comm*>(ctx->saved_data["comm"].toInt()); }

struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    at::Tensor grad = g[0].contiguous().clone();
    comm_of(ctx).all_reduce(grad);
    return {grad, at::Tensor()};
  }
};

struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    (void)ctx;
    at::Tensor out = x.contiguous().clone();
    reinterpret_cast<Comm*>(comm)->all_reduce(out);
    return out;
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor()}; }
};

struct GatherFromSp : torch::autograd::Function<GatherFromSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return reinterpret_cast<Comm*>(comm)->all_gather_dim0(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {comm_of(ctx).reduce_scatter_dim0(g[0]), at::Tensor()};
  }
};

struct ScatterToSp : torch::autograd::Function<ScatterToSp> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return reinterpret_cast<Comm*>(comm)->reduce_scatter_dim0(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {comm_of(ctx).all_gather_dim0(g[0]), at::Tensor()};
  }
};

struct CheckpointOp : torch::autograd::Function<CheckpointOp> {
  // Inputs as a TensorList: autograd treats each element as an input (a std::vector would not be).
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs, int64_t fn, int64_t clock) {
    ctx->saved_data["fn"] = fn;
    ctx->saved_data["clock"] = clock;
    std::vector<at::Tensor> in(inputs.begin(), inputs.end());
    ctx->save_for_backward(in);
    return (*reinterpret_cast<const CheckpointFn*>(fn))(in);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto& fn = *reinterpret_cast<const CheckpointFn*>(ctx->saved_data["fn"].toInt());
    auto& clock = *reinterpret_cast<PhaseClock*>(ctx->saved_data["clock"].toInt());
    std::vector<at::Tensor> inputs;
    for (const auto& t : ctx->get_saved_variables()) inputs.push_back(t.detach().requires_grad_(true));
    at::Tensor out;
    {
      PhaseScope s(clock, Ph::recompute);
      torch::AutoGradMode grad_on(true);
      out = fn(inputs);
    }
    torch::autograd::backward({out}, {g[0]});
    variable_list res;
    for (auto& t : inputs) res.push_back(t.grad());
    res.emplace_back();
    res.emplace_back();
    return res;
  }
};

int64_t ptr(const void* p) { return reinterpret_cast<int64_t>(p); }

}  // namespace

at::Tensor copy_to_tp(const at::Tensor& x, Comm& tp) { return tp.size() == 1 ? x : CopyToTp::apply(x, ptr(&tp)); }
at::Tensor reduce_from_tp(const at::Tensor& x, Comm& tp) {
  return tp.size() == 1 ? x : ReduceFromTp::apply(x, ptr(&tp));
}
at::Tensor gather_from_sp(const at::Tensor& x, Comm& tp) {
  return tp.size() == 1 ? x : GatherFromSp::apply(x, ptr(&tp));
}
at::Tensor scatter_to_sp(const at::Tensor& x, Comm& tp) {
  return tp.size() == 1 ? x : ScatterToSp::apply(x, ptr(&tp));
}

at::Tensor checkpoint(const CheckpointFn* fn, const std::vector<at::Tensor>& inputs, PhaseClock& clock) {
  return CheckpointOp::apply(at::TensorList(inputs), ptr(fn), ptr(&clock));
}

}  // namespace trainplan::exec
