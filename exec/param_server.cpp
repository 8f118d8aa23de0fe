// Synchronous parameter server: push, update, pull (see param_server.hpp).
#include "exec/param_server.hpp"

#include <chrono>

#include "exec/grad_sync.hpp"

namespace trainplan::exec {

namespace {
enum Kind { kPush = 0, kPull = 1, kGrad = 2 };  // message kinds, part of each tag
}

// The shard a server holds: its master weights, optimizer state and the pushes it receives.
struct ParamServer::Shard {
  int k = 0;
  int64_t lo = 0, len = 0;
  at::Tensor master, grad, exp_avg, exp_avg_sq;
  std::vector<at::Tensor> pushes;  // per worker
  ShardAdamW adam;
  explicit Shard(AdamWSettings a) : adam(a) {}
};

ParamServer::ParamServer(const RankLayout& layout, int rank, Comm& ps, PhaseClock& clock, AdamWSettings adam,
                         ModelChunk& chunk)
    : layout_(layout), rank_(rank), ps_(ps), clock_(clock), n_(chunk.flat().numel()) {
  TORCH_CHECK(layout.servers() >= 1, "ParamServer: the layout has no parameter servers");
  TORCH_CHECK(ps.size() == layout.job_ranks() && ps.index() == rank, "ParamServer: ps must be the job's ranks");
  if (layout.is_worker(rank)) {
    flat_ = chunk.flat();
    flat_grad_ = chunk.flat_grad();
  }
  const int k = layout.server_index(rank);
  if (k < 0) return;
  shard_ = std::make_unique<Shard>(adam);
  Shard& s = *shard_;
  s.k = k;
  s.lo = begin(k);
  s.len = length(k);
  torch::NoGradGuard ng;
  s.master = chunk.flat().narrow(0, s.lo, s.len).clone();  // the same initial values as every worker
  s.grad = at::zeros_like(s.master);
  s.exp_avg = at::zeros_like(s.master);
  s.exp_avg_sq = at::zeros_like(s.master);
  for (int w = 0; w < layout.world(); ++w) s.pushes.push_back(at::empty_like(s.master));
  // Parameter layout without the views (a dedicated server's chunk is dropped after this).
  std::vector<ParamInfo> params = chunk.params();
  for (ParamInfo& p : params) p.param = at::Tensor();
  s.adam.add(params, s.lo, s.master, s.grad, s.exp_avg, s.exp_avg_sq);
}

ParamServer::~ParamServer() = default;

int64_t ParamServer::begin(int k) const { return static_cast<int64_t>(k) * n_ / layout_.servers(); }
int64_t ParamServer::length(int k) const { return begin(k + 1) - begin(k); }

void ParamServer::exchange(bool with_grads) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  torch::NoGradGuard ng;
  const int S = layout_.servers(), W = layout_.world();
  const int tag = 3 * (exchanges_++ % (1 << 24));
  const bool worker = layout_.is_worker(rank_);
  std::vector<c10::intrusive_ptr<c10d::Work>> sends, pulls;
  if (worker && with_grads) summed_grad_ = at::zeros_like(flat_grad_);
  // Worker: push every remote shard, and post the receives of its pulls.
  if (worker) {
    for (int k = 0; k < S; ++k) {
      const int server = layout_.server_rank(k);
      if (server == rank_) continue;
      at::Tensor g = flat_grad_.narrow(0, begin(k), length(k));
      at::Tensor p = flat_.narrow(0, begin(k), length(k));
      sends.push_back(ps_.send(g, server, tag + kPush));
      pulls.push_back(ps_.recv(p, server, tag + kPull));
      if (with_grads) {
        at::Tensor sg = summed_grad_.narrow(0, begin(k), length(k));
        pulls.push_back(ps_.recv(sg, server, tag + kGrad));
      }
    }
  }
  // Server: receive the pushes, sum them in worker order, step AdamW, send the shard back.
  if (shard_) {
    Shard& s = *shard_;
    std::vector<c10::intrusive_ptr<c10d::Work>> pushes;
    for (int w = 0; w < W; ++w) {
      if (w == rank_) s.pushes[w].copy_(flat_grad_.narrow(0, s.lo, s.len));  // colocated: its own
      else pushes.push_back(ps_.recv(s.pushes[w], w, tag + kPush));
    }
    for (auto& p : pushes) ps_.wait(p, Ph::dp_comm);
    {
      PhaseScope sc(clock_, Ph::optimizer);
      s.grad.copy_(s.pushes[0]);
      for (int w = 1; w < W; ++w) s.grad.add_(s.pushes[w]);
      s.adam.step();
    }
    for (int w = 0; w < W; ++w) {
      if (w == rank_) {
        flat_.narrow(0, s.lo, s.len).copy_(s.master);
        if (with_grads) summed_grad_.narrow(0, s.lo, s.len).copy_(s.grad);
        continue;
      }
      sends.push_back(ps_.send(s.master, w, tag + kPull));
      if (with_grads) sends.push_back(ps_.send(s.grad, w, tag + kGrad));
    }
  }
  for (auto& w : pulls) ps_.wait(w, Ph::dp_comm);
  for (auto& w : sends) ps_.wait(w, Ph::dp_comm);
  clock_.dp_in_flight += std::chrono::duration<double>(Clock::now() - t0).count();
}

namespace {

// A worker of a job with parameter servers: it holds the whole chunk and steps none of it. The
// step's reduction is the exchange: the gradient pushed, the servers' AdamW, the parameters pulled
// (a barrier), all in finish(); the worker's own optimizer has no state and nothing to do.
class ParameterServerSync final : public GradSync {
 public:
  ParameterServerSync(const RankLayout& layout, int rank, Comm& ps, PhaseClock& clock, AdamWSettings adam)
      : layout_(layout), rank_(rank), ps_(ps), clock_(clock), adam_(adam) {}

  Shard add_chunk(ModelChunk& model, bool) override {
    TORCH_CHECK(!server_, "parameter_server: one model chunk per worker (no pipeline stages)");
    server_ = std::make_unique<ParamServer>(layout_, rank_, ps_, clock_, adam_, model);
    model_ = &model;
    Shard s;
    s.master = model.flat();
    s.grad = model.flat_grad();
    s.steps_here = false;
    return s;
  }
  void begin_step() override { model_->flat_grad().zero_(); }
  void reduce(int) override {}
  void finish(bool keep_grads) override {
    server_->exchange(keep_grads);
    torch::NoGradGuard ng;
    if (keep_grads) model_->flat_grad().copy_(server_->reduced_grad());
  }

 private:
  const RankLayout& layout_;
  int rank_;
  Comm& ps_;
  PhaseClock& clock_;
  AdamWSettings adam_;
  std::unique_ptr<ParamServer> server_;
  ModelChunk* model_ = nullptr;
};

}  // namespace

std::unique_ptr<GradSync> parameter_server(const RankLayout& layout, int rank, Comm& ps, PhaseClock& clock,
                                           AdamWSettings adam) {
  return std::make_unique<ParameterServerSync>(layout, rank, ps, clock, adam);
}

}  // namespace trainplan::exec
