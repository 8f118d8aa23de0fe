// One rank's training loop: runs the shared Schedule's slots with send/recv between pipeline
// stages, reduces gradients over the data-parallel group (ZeRO 0-3), steps AdamW, and measures.
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <map>
#include <thread>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
#ifdef TRAINPLAN_EXEC_CUDA
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>
#endif

#include "exec/exec.hpp"
#include "exec/model.hpp"
#include "exec/parallel.hpp"
#include "sim/rank_layout.hpp"
#include "sim/schedule.hpp"

namespace trainplan::exec {

bool cuda_available() {
#ifdef TRAINPLAN_EXEC_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string first_line(const std::string& s) {
  auto n = s.find('\n');
  return n == std::string::npos ? s : s.substr(0, n);
}

// Token source: a seeded synthetic stream (each next token a fixed affine map of the previous
// plus small noise, so the loss can fall), or windows of a uint16 token file.
class TokenSource {
 public:
  TokenSource(const ExecOptions& o, int vocab, int seq) : seed_(o.seed), vocab_(vocab), seq_(seq) {
    if (!o.data_file.empty()) {
      file_.open(o.data_file, std::ios::binary | std::ios::ate);
      if (!file_) throw RankFailure(fmt::format("--data {}: cannot open", o.data_file));
      n_tokens_ = static_cast<int64_t>(file_.tellg()) / 2;
      if (n_tokens_ < seq + 2) throw RankFailure(fmt::format("--data {}: fewer than {} tokens", o.data_file, seq + 2));
    }
  }
  // Sequence number `index` of the job's stream, seq + 1 tokens.
  at::Tensor sequence(int64_t index) {
    at::Tensor t = at::empty({seq_ + 1}, at::kLong);
    auto a = t.accessor<int64_t, 1>();
    if (file_.is_open()) {
      const int64_t start = (index * (seq_ + 1)) % (n_tokens_ - seq_ - 1);
      std::vector<uint16_t> buf(seq_ + 1);
      file_.seekg(start * 2);
      file_.read(reinterpret_cast<char*>(buf.data()), 2 * (seq_ + 1));
      for (int i = 0; i <= seq_; ++i) {
        if (buf[i] >= vocab_) throw RankFailure(fmt::format("data file token {} >= vocab {}", buf[i], vocab_));
        a[i] = buf[i];
      }
      return t;
    }
    auto gen = at::make_generator<at::CPUGeneratorImpl>(
        (static_cast<uint64_t>(seed_) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(index) * 0xBF58476D1CE4E5B9ull) >> 2);
    at::Tensor noise = at::randint(0, 4, {seq_ + 1}, gen, at::kLong);
    auto na = noise.accessor<int64_t, 1>();
    a[0] = na[0] * 61 % vocab_;
    for (int i = 1; i <= seq_; ++i) a[i] = (a[i - 1] * 5 + 1 + na[i]) % vocab_;
    return t;
  }

 private:
  long long seed_;
  int vocab_, seq_;
  std::ifstream file_;
  int64_t n_tokens_ = 0;
};

// A contiguous range of a chunk's flat gradient, all-reduced over DP as one message.
struct Bucket {
  int64_t begin = 0, end = 0;  // element range in the flat gradient
  int params = 0;              // parameters whose gradients lie in it
  int ready = 0;               // of those, accumulated in the chunk's last backward so far
  bool launched = false;
};

// Runs `fn` after autograd has accumulated a parameter's gradient into .grad.
struct AfterAccumulate : torch::autograd::PostAccumulateGradHook {
  explicit AfterAccumulate(std::function<void()> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
  std::function<void()> fn;
};

// A model chunk with its flat buffers and optimizer state (ZeRO-sharded over DP when zero >= 1).
struct ChunkState {
  std::unique_ptr<ModelChunk> model;
  int vstage = 0;
  int64_t shard = 0, shard_offset = 0;  // this DP rank's slice of the flat buffers
  at::Tensor master;      // parameters the optimizer updates (full, a slice view, or a ZeRO-3 copy)
  at::Tensor grad;        // gradients it reads (full, or the reduce-scattered slice)
  at::Tensor exp_avg, exp_avg_sq, decay;
  int backward_left = 0;
  bool tied_copy = false;  // holds a tied-embedding copy whose twin is on another rank
  bool gathered = false;   // ZeRO-3: full parameters present for this step
  // Overlap (ZeRO 0, DP > 1): buckets in the order the backward produces them (last layers
  // first); during the chunk's last backward each bucket's all-reduce starts as soon as its
  // gradients are complete, in bucket order on every replica.
  std::vector<Bucket> buckets;
  bool armed = false;
  size_t next_bucket = 0;
};

struct PendingDp {
  c10::intrusive_ptr<c10d::Work> work;
  Clock::time_point launched;
  std::shared_ptr<std::atomic<double>> done_after;  // seconds from launch to completion
};

struct Stash {
  at::Tensor input;   // received activation (leaf) or undefined on the first virtual stage
  at::Tensor output;  // activation sent on, or the loss
};

class Trainer {
 public:
  Trainer(const ExecPlan& plan, const ExecOptions& opt, const RankEnv& env, at::Device device, bool on_gpu)
      : plan_(plan), s_(plan.strategy), opt_(opt), env_(env), device_(device), on_gpu_(on_gpu),
        layout_(plan.strategy), coord_(layout_.coord(env.rank)), clock_(on_gpu),
        tokens_(opt, plan.model.vocab, plan.strategy.seq_len),
        schedule_(make_schedule(s_.schedule, s_.pp, s_.micro_batches(), s_.vp)) {}

  std::optional<Measurement> run();

 private:
  void setup();
  void step(int index, bool measured);
  void finish_chunk(ChunkState& c);
  void launch_dp(ChunkState& c);
  void setup_buckets(ChunkState& c);
  void launch_ready_buckets(ChunkState& c, bool all);
  void push_pending(c10::intrusive_ptr<c10d::Work> w);
  void optimizer_step();
  void gather_params(ChunkState& c);  // ZeRO-3: full parameters from the DP shards
  std::pair<at::Tensor, at::Tensor> micro_batch_tokens(int step, int mb);
  at::Tensor activation_buffer() const;
  int tag(int mb, int vstage, bool backward) const {
    return ((mb * schedule_.virtual_stages() + vstage) << 1) | (backward ? 1 : 0);
  }
  void dump_params();
  void record(int index, double wall, double loss);
  Measurement collect();

  const ExecPlan& plan_;
  const Strategy& s_;
  const ExecOptions& opt_;
  const RankEnv& env_;
  at::Device device_;
  bool on_gpu_;
  RankLayout layout_;
  RankCoord coord_;
  PhaseClock clock_;
  TokenSource tokens_;
  Schedule schedule_;
  c10::intrusive_ptr<c10d::Store> store_;
  Groups g_;
  std::vector<ChunkState> chunks_;
  std::vector<PendingDp> pending_;
  int adam_step_ = 0;
  int current_step_ = -1;
  std::vector<double> samples_;  // per measured step: wall, kPhases exclusive phases, dp in flight
  std::vector<double> losses_;
};

void Trainer::setup() {
  // Rendezvous through c10d's TCPStore: rank 0 serves it unless the local spawner does.
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env_.master_port);
  so.isServer = env_.rank == 0 && !env_.store_server_external;
  so.numWorkers = std::nullopt;
  so.waitWorkers = false;
  so.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt_.timeout_s * 1000));
  try {
    store_ = c10::make_intrusive<c10d::TCPStore>(env_.master_addr, so);
  } catch (const std::exception& e) {
    throw RankFailure(fmt::format("rank {}: cannot {} the rendezvous store at {}:{} ({}){}", env_.rank,
                                  so.isServer ? "listen on" : "reach", env_.master_addr, env_.master_port,
                                  first_line(e.what()),
                                  so.isServer ? "; is MASTER_PORT busy? pick another one" : ""));
  }
  GroupSettings gs;
  gs.backend = opt_.backend;
  gs.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt_.timeout_s * 1000));
  const std::string& a = env_.master_addr;
  if (a == "127.0.0.1" || a == "localhost" || a == "::1") gs.gloo_host = "127.0.0.1";
  gs.stage_cuda = on_gpu_;
  g_ = make_groups(layout_, env_.rank, store_, gs, clock_);
  // Replicas of the same parameters (gradients summed, ZeRO shards): the dp x cp ranks.
  const int replicas = g_.dp->size();

  ModelSettings ms;
  ms.spec = plan_.model;
  ms.seq_len = s_.seq_len;
  ms.tp = s_.tp;
  ms.tp_rank = coord_.tp;
  ms.cp = s_.cp;
  ms.cp_rank = coord_.cp;
  ms.sequence_parallel = s_.sequence_parallel && s_.tp > 1;
  ms.recompute = s_.recompute;
  ms.seed = opt_.seed;
  ms.pad_to = replicas;
  ms.device = device_;
  const int V = schedule_.virtual_stages();
  chunks_.resize(s_.vp);
  for (int c = 0; c < s_.vp; ++c) {
    ChunkState& cs = chunks_[c];
    cs.vstage = schedule_.virtual_stage(coord_.pp, c);
    ChunkPlacement place{plan_.first_layer[cs.vstage], plan_.layers[cs.vstage], cs.vstage == 0, cs.vstage == V - 1};
    cs.model = std::make_unique<ModelChunk>(ms, place, *g_.tp, *g_.cp, clock_);
    cs.tied_copy = plan_.model.tied_embeddings && V > 1 && (place.has_embedding || place.has_head);
    at::Tensor& flat = cs.model->flat();
    const int64_t n = flat.numel();
    if (s_.zero == 0) {
      cs.shard = n;
      cs.master = flat;
      cs.grad = cs.model->flat_grad();
      cs.decay = cs.model->decay_mask();
    } else {
      cs.shard = n / replicas;
      cs.shard_offset = cs.shard * g_.dp->index();
      // ZeRO-3 keeps its own copy of the shard (the flat buffer is refilled by all-gathers);
      // ZeRO-1/2 update their slice of the flat buffer in place. With one replica: in place.
      cs.master = s_.zero == 3 && replicas > 1 ? flat.narrow(0, cs.shard_offset, cs.shard).clone()
                                            : flat.narrow(0, cs.shard_offset, cs.shard);
      cs.grad = at::zeros({cs.shard}, flat.options());
      cs.decay = cs.model->decay_mask().narrow(0, cs.shard_offset, cs.shard);
    }
    cs.exp_avg = at::zeros({cs.shard}, flat.options());
    cs.exp_avg_sq = at::zeros({cs.shard}, flat.options());
  }
  for (auto& cs : chunks_) setup_buckets(cs);
}

void Trainer::setup_buckets(ChunkState& c) {
  // Not with ZeRO (one reduce-scatter per chunk), sequence parallelism (TP-replicated gradients
  // are summed over TP first) or a tied-embedding copy (summed with its twin first).
  if (s_.zero != 0 || g_.dp->size() == 1 || (s_.sequence_parallel && s_.tp > 1) || c.tied_copy) return;
  constexpr int64_t kBucket = int64_t(1) << 22;  // elements (16 MiB in fp32)
  auto& params = c.model->params();
  std::vector<int> bucket_of(params.size());
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const ParamInfo& p = params[i];
    if (c.buckets.empty() || c.buckets.back().end - c.buckets.back().begin >= kBucket) {
      Bucket b;
      b.end = p.offset + p.numel;
      c.buckets.push_back(b);
    }
    c.buckets.back().begin = p.offset;
    c.buckets.back().params += 1;
    bucket_of[i] = static_cast<int>(c.buckets.size()) - 1;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    ChunkState* cp = &c;
    const int b = bucket_of[i];
    torch::autograd::impl::set_post_acc_grad_hooks(
        params[i].param, std::make_unique<AfterAccumulate>([this, cp, b] {
          if (!cp->armed) return;
          cp->buckets[b].ready += 1;
          launch_ready_buckets(*cp, false);
        }));
  }
}

void Trainer::push_pending(c10::intrusive_ptr<c10d::Work> w) {
  PendingDp p;
  p.launched = Clock::now();
  p.done_after = std::make_shared<std::atomic<double>>(-1.0);
  p.work = std::move(w);
  auto done = p.done_after;
  auto launched = p.launched;
  try {  // completion time, where the backend's work has a future (else measured at the wait)
    p.work->getFuture()->addCallback(
        [done, launched](c10::ivalue::Future&) { done->store(seconds_since(launched)); });
  } catch (const c10::Error&) {
  }
  pending_.push_back(std::move(p));
}

void Trainer::launch_ready_buckets(ChunkState& c, bool all) {
  while (c.next_bucket < c.buckets.size()) {
    Bucket& b = c.buckets[c.next_bucket];
    if (!all && b.ready < b.params) return;
    at::Tensor slice = c.model->flat_grad().narrow(0, b.begin, b.end - b.begin);
    push_pending(g_.dp->all_reduce_async(slice));
    b.launched = true;
    ++c.next_bucket;
  }
}

std::pair<at::Tensor, at::Tensor> Trainer::micro_batch_tokens(int step, int mb) {
  // Sequence numbers of one step are step*G .. step*G + G-1 whatever the layout; replica d's
  // micro-batch mb holds sequences (mb*dp + d)*micro_batch + j.
  std::vector<at::Tensor> rows;
  for (int j = 0; j < s_.micro_batch; ++j) {
    const int64_t index = int64_t(step) * s_.global_batch + (int64_t(mb) * s_.dp + coord_.dp) * s_.micro_batch + j;
    rows.push_back(tokens_.sequence(index));
  }
  at::Tensor all = at::stack(rows).to(device_);
  return {all.narrow(1, 0, s_.seq_len), all.narrow(1, 1, s_.seq_len)};
}

at::Tensor Trainer::activation_buffer() const {
  const int64_t s = (s_.sequence_parallel && s_.tp > 1) ? s_.seq_len / s_.cp / s_.tp : s_.seq_len / s_.cp;
  return at::empty({s, s_.micro_batch, plan_.model.hidden}, at::TensorOptions().dtype(at::kFloat).device(device_));
}

void Trainer::gather_params(ChunkState& c) {
  // Parameters do not change within a step, so the chunk is gathered at its first slot and kept
  // until the optimizer (re-gathering would also bump the version of tensors autograd saved).
  if (s_.zero != 3 || g_.dp->size() == 1 || c.gathered) return;
  c.gathered = true;
  const auto t0 = Clock::now();
  auto w = g_.dp->all_gather_flat_async(c.model->flat(), c.master);
  g_.dp->wait(w, Ph::dp_comm);
  clock_.dp_in_flight += seconds_since(t0);
}

void Trainer::launch_dp(ChunkState& c) {
  if (g_.dp->size() == 1) {
    if (s_.zero >= 1) c.grad.copy_(c.model->flat_grad());
    return;
  }
  PhaseScope sc(clock_, Ph::dp_comm);
  if (!c.buckets.empty()) {  // overlapped: start whatever the backward hooks have not started
    c.armed = false;
    launch_ready_buckets(c, true);
    return;
  }
  // ZeRO 0 without overlap: all-reduce in buckets; ZeRO >= 1: one reduce-scatter of the
  // chunk's flat gradient into this rank's shard.
  constexpr int64_t kBucket = int64_t(1) << 22;
  at::Tensor& full = c.model->flat_grad();
  const int64_t n = full.numel();
  if (s_.zero >= 1) {
    push_pending(g_.dp->reduce_scatter_flat_async(c.grad, full));
    return;
  }
  for (int64_t off = 0; off < n; off += kBucket) {
    at::Tensor bucket = full.narrow(0, off, std::min(kBucket, n - off));
    push_pending(g_.dp->all_reduce_async(bucket));
  }
}

void Trainer::finish_chunk(ChunkState& c) {
  // Sequence parallelism: TP-replicated parameters saw only this rank's sequence slice.
  if (s_.sequence_parallel && s_.tp > 1) {
    auto parts = c.model->tp_partial_grads();
    if (!parts.empty()) {
      std::vector<at::Tensor> flat_parts;
      for (auto& p : parts) flat_parts.push_back(p.reshape({-1}));
      at::Tensor buf = at::cat(flat_parts);
      g_.tp->all_reduce(buf);
      int64_t off = 0;
      torch::NoGradGuard ng;
      for (auto& p : parts) {
        p.copy_(buf.narrow(0, off, p.numel()).view(p.sizes()));
        off += p.numel();
      }
    }
  }
  if (!c.tied_copy) launch_dp(c);  // tied copies are summed with their twin after the schedule
}

void Trainer::optimizer_step() {
  PhaseScope sc(clock_, Ph::optimizer);
  torch::NoGradGuard ng;
  ++adam_step_;
  // AdamW (Loshchilov & Hutter 2019) with decoupled weight decay on matrices only.
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, lr = opt_.lr;
  const double bc1 = 1 - std::pow(b1, adam_step_), bc2 = 1 - std::pow(b2, adam_step_);
  for (auto& c : chunks_) {
    c.exp_avg.mul_(b1).add_(c.grad, 1 - b1);
    c.exp_avg_sq.mul_(b2).addcmul_(c.grad, c.grad, 1 - b2);
    c.master.sub_(c.master * c.decay * (lr * wd));
    auto denom = (c.exp_avg_sq / bc2).sqrt_().add_(eps);
    c.master.addcdiv_(c.exp_avg, denom, -lr / bc1);
  }
}

void Trainer::step(int index, bool measured) {
  current_step_ = index;
  if (env_.status_fd >= 0) dprintf(env_.status_fd, "%d %d\n", env_.rank, index);
  const auto t0 = Clock::now();
  clock_.start();
  const int m = s_.micro_batches();
  const int V = schedule_.virtual_stages();
  const int stage = coord_.pp, prev = (stage - 1 + s_.pp) % s_.pp, next = (stage + 1) % s_.pp;
  for (auto& c : chunks_) {
    c.model->flat_grad().zero_();
    c.backward_left = m;
    c.gathered = false;
    c.armed = false;
    c.next_bucket = 0;
    for (auto& b : c.buckets) {
      b.ready = 0;
      b.launched = false;
    }
  }
  std::map<std::pair<int, int>, Stash> stash;
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> sends;
  double loss_sum = 0;
  bool forward_seen = false;
  const double loss_scale = 1.0 / (double(m) * s_.dp);

  for (const Slot& slot : schedule_.per_stage[stage]) {
    ChunkState& c = chunks_[slot.chunk];
    const int vs = c.vstage;
    const bool first = vs == 0, last = vs == V - 1;
    gather_params(c);
    if (slot.phase == Phase::forward) {
      Stash st;
      at::Tensor input, targets;
      if (first || last) {
        auto [in, tg] = micro_batch_tokens(index, slot.micro_batch);
        if (first) input = in;
        targets = tg;
      }
      if (!first) {
        at::Tensor buf = activation_buffer();
        auto w = g_.pp->recv(buf, prev, tag(slot.micro_batch, vs, false));
        g_.pp->wait(w, Ph::bubble);
        input = buf.requires_grad_(true);
        st.input = input;
      }
      {
        PhaseScope f(clock_, Ph::forward);
        st.output = c.model->forward(input, targets);
      }
      if (last) {
        loss_sum += st.output.item<double>();
      } else {
        at::Tensor out = st.output.detach().to(at::kFloat).contiguous();
        sends.emplace_back(g_.pp->send(out, next, tag(slot.micro_batch, vs + 1, false)), out);
      }
      stash.emplace(std::make_pair(slot.micro_batch, slot.chunk), std::move(st));
      if (!forward_seen && index == opt_.fault_step) {
        if (env_.rank == opt_.fault_kill_rank) ::kill(::getpid(), SIGKILL);
        if (env_.rank == opt_.fault_hang_rank)
          for (;;) ::pause();
      }
      forward_seen = true;
    } else {
      auto it = stash.find({slot.micro_batch, slot.chunk});
      TORCH_CHECK(it != stash.end(), "backward before forward for ", to_string(slot));
      Stash st = std::move(it->second);
      stash.erase(it);
      c.armed = c.backward_left == 1 && !c.buckets.empty();  // the chunk's last backward
      if (last) {
        PhaseScope b(clock_, Ph::backward);
        (st.output * loss_scale).backward();
      } else {
        at::Tensor grad = activation_buffer();
        auto w = g_.pp->recv(grad, next, tag(slot.micro_batch, vs, true));
        g_.pp->wait(w, Ph::bubble);
        PhaseScope b(clock_, Ph::backward);
        torch::autograd::backward({st.output}, {grad});
      }
      if (!first) {
        at::Tensor gin = st.input.grad().to(at::kFloat).contiguous();
        sends.emplace_back(g_.pp->send(gin, prev, tag(slot.micro_batch, vs - 1, true)), gin);
      }
      if (--c.backward_left == 0) finish_chunk(c);
    }
  }
  // Tied word embedding: sum the gradients of the first and last stages' copies.
  for (auto& c : chunks_) {
    if (!c.tied_copy) continue;
    at::Tensor g = c.model->tied_embedding_grad();
    g_.embed->all_reduce(g);
    launch_dp(c);
  }
  for (auto& [w, t] : sends) g_.pp->wait(w, Ph::pp_comm);
  sends.clear();
  for (auto& p : pending_) {
    g_.dp->wait(p.work, Ph::dp_comm);
    const double d = p.done_after->load();
    clock_.dp_in_flight += d >= 0 ? d : seconds_since(p.launched);
  }
  pending_.clear();
  optimizer_step();
  if (s_.zero == 1 || s_.zero == 2) {
    for (auto& c : chunks_) {
      if (g_.dp->size() == 1) break;
      const auto tg = Clock::now();
      at::Tensor mine = c.master.clone();
      auto w = g_.dp->all_gather_flat_async(c.model->flat(), mine);
      g_.dp->wait(w, Ph::dp_comm);
      clock_.dp_in_flight += seconds_since(tg);
    }
  }
  // The step's loss: mean over the global batch, from the last stage's TP rank 0 of each replica.
  const bool reports = chunks_.back().vstage == V - 1 && coord_.tp == 0 && coord_.cp == 0;
  at::Tensor l = at::full({1}, reports ? loss_sum / (double(m) * s_.dp) : 0.0,
                          at::TensorOptions().dtype(at::kDouble).device(device_));
  g_.world->all_reduce(l);
#ifdef TRAINPLAN_EXEC_CUDA
  if (on_gpu_) at::autocast::clear_cache();
#endif
  const auto phases = clock_.stop();
  const double wall = seconds_since(t0);
  if (measured) {
    samples_.push_back(wall);
    for (double p : phases) samples_.push_back(p);
    samples_.push_back(clock_.dp_in_flight);
    losses_.push_back(l.cpu().item<double>());
  }
}

void Trainer::dump_params() {
  for (auto& c : chunks_) {
    c.gathered = false;
    gather_params(c);
  }
  std::ofstream f(fmt::format("{}.rank{}", opt_.dump_params, env_.rank));
  for (auto& c : chunks_) {
    for (auto& p : c.model->params()) {
      at::Tensor v = p.param.detach().to(at::kCPU).to(at::kDouble).contiguous().reshape({-1});
      f << p.name << ' ' << p.full_shape.size();
      for (auto d : p.full_shape) f << ' ' << d;
      f << ' ' << p.shard_dim << ' ' << coord_.tp << ' ' << s_.tp << ' ' << v.numel();
      const double* d = v.data_ptr<double>();
      for (int64_t i = 0; i < v.numel(); ++i) f << ' ' << fmt::format("{:.9g}", d[i]);
      f << '\n';
    }
  }
}

Measurement Trainer::collect() {
  // Every rank's samples and peak memory, gathered to every rank (rank 0 reports).
  const int per_step = 2 + kPhases;
  std::vector<double> mine = samples_;
  double alloc = 0, reserved = 0;
#ifdef TRAINPLAN_EXEC_CUDA
  if (on_gpu_) {
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    alloc = static_cast<double>(st.allocated_bytes[0].peak);
    reserved = static_cast<double>(st.reserved_bytes[0].peak);
  }
#endif
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  mine.push_back(alloc);
  mine.push_back(reserved);
  mine.push_back(static_cast<double>(ru.ru_maxrss) * 1024.0);
  at::Tensor t = at::tensor(mine, at::TensorOptions().dtype(at::kDouble)).to(device_);
  at::Tensor all = g_.world->all_gather_dim0(t).cpu().contiguous();
  const int64_t K = static_cast<int64_t>(mine.size());
  const double* d = all.data_ptr<double>();
  const int steps = static_cast<int>(losses_.size());

  Measurement m;
  m.strategy = s_;
  m.model = plan_.model.name;
  m.cluster = plan_.cluster;
  m.backend = opt_.backend;
  m.device = on_gpu_ ? "cuda" : "cpu";
  m.warmup = opt_.warmup;
  m.seed = opt_.seed;
  auto phase_times = [&](const double* x) {
    PhaseTimes p;
    p.forward = x[int(Ph::forward)];
    p.backward = x[int(Ph::backward)];
    p.recompute = x[int(Ph::recompute)];
    p.tp_comm = x[int(Ph::tp_comm)];
    p.cp_comm = x[int(Ph::cp_comm)];
    p.pp_comm = x[int(Ph::pp_comm)];
    p.dp_comm_exposed = x[int(Ph::dp_comm)];
    p.dp_comm = std::max(x[kPhases], p.dp_comm_exposed);
    p.bubble = x[int(Ph::bubble)];
    p.optimizer = x[int(Ph::optimizer)];
    p.other = x[int(Ph::other)];
    return p;
  };
  const int world = env_.world;
  for (int i = 0; i < steps; ++i) {
    StepRecord r;
    r.step = opt_.warmup + i;
    r.loss = losses_[i];
    double busiest = -1;
    for (int k = 0; k < world; ++k) {
      const double* x = d + k * K + i * per_step;
      r.wall = std::max(r.wall, x[0]);
      PhaseTimes p = phase_times(x + 1);
      if (p.compute() > busiest) {
        busiest = p.compute();
        r.phases = p;
      }
    }
    m.per_step.push_back(r);
  }
  for (int k = 0; k < world; ++k) {
    RankMeasurement rm;
    rm.rank = k;
    rm.coords = layout_.coord(k);
    const double* x = d + k * K;
    std::vector<PhaseTimes> ps;
    for (int i = 0; i < steps; ++i) ps.push_back(phase_times(x + i * per_step + 1));
    rm.phases = phase_medians(ps);
    rm.peak_allocated = x[K - 3];
    rm.peak_reserved = x[K - 2];
    rm.max_rss = x[K - 1];
    m.ranks.push_back(rm);
  }
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  m.environment = {{"torch_version", TORCH_VERSION},
                   {"backend", opt_.backend},
                   {"device", m.device},
                   {"ranks", world},
                   {"hostname", host},
                   {"intra_op_threads", at::get_num_threads()},
                   {"compute_dtype", on_gpu_ && s_.dtype == Dtype::bf16 ? "bf16 (autocast, fp32 master)" : "fp32"},
                   {"data", opt_.data_file.empty() ? "synthetic" : opt_.data_file},
                   {"vocab_padding",
                    {{"vocab", plan_.model.vocab},
                     {"padded_vocab", padded_vocab(plan_.model.vocab, s_.tp)},
                     {"note", "embedding and LM head rows padded to a multiple of 128*tp (Megatron); padding "
                              "rows are not in the layer graph's parameter count and get no logit"}}},
                   {"phase_notes",
                    "steady clock per rank; bubble = waiting to receive from a pipeline neighbour; "
                    "dp_comm = data-parallel collectives from launch to completion"}};
  m.throughput.model_flops_per_step = plan_.model_flops_per_step;
  summarize(m);
  return m;
}

std::optional<Measurement> Trainer::run() {
  const int total = opt_.warmup + opt_.steps;
  auto where = [this] { return current_step_ < 0 ? std::string("while setting up") : fmt::format("in step {}", current_step_); };
  try {
    setup();
#ifdef TRAINPLAN_EXEC_CUDA
    if (on_gpu_ && s_.dtype == Dtype::bf16) {
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    }
#endif
    for (int i = 0; i < total; ++i) step(i, i >= opt_.warmup);
    if (!opt_.dump_params.empty()) dump_params();
    Measurement m = collect();
    if (env_.rank == 0) return m;
    return std::nullopt;
  } catch (const c10::Error& e) {
    throw RankFailure(fmt::format("rank {} failed {}: {}", env_.rank, where(), first_line(e.what_without_backtrace())));
  } catch (const RankFailure&) {
    throw;
  } catch (const std::exception& e) {
    throw RankFailure(fmt::format("rank {} failed {}: {}", env_.rank, where(), first_line(e.what())));
  }
}

}  // namespace

std::optional<Measurement> run_rank(const ExecPlan& plan, const ExecOptions& opt, const RankEnv& env) {
  // --device cuda runs NCCL ranks one per GPU, or Gloo ranks several to a GPU (correctness checks).
  const bool on_gpu = opt.device.empty() ? opt.backend == "nccl" : opt.device == "cuda";
  at::Device device = at::kCPU;
#ifdef TRAINPLAN_EXEC_CUDA
  if (on_gpu) {
    const int gpus = std::max<int>(1, c10::cuda::device_count());
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank % gpus));
    c10::cuda::set_device(device.index());
  }
#endif
  // CPU ranks on one machine share its cores: give each its share of intra-op threads.
  if (!on_gpu) {
    const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
    const int n = local_world ? std::atoi(local_world) : 1;
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    if (n > 1 && cores > 0) at::set_num_threads(std::max(1, cores / n));
  }
  torch::manual_seed(static_cast<uint64_t>(opt.seed));
  Trainer t(plan, opt, env, device, on_gpu);
  return t.run();
}

}  // namespace trainplan::exec
