// The schedule runner: one rank's training steps. It sets the rank up (rendezvous, process
// groups, model chunks), walks the shared Schedule's slots (forward/backward, send/recv between
// pipeline stages), and hands the data-parallel work to the DpReducer, the figures to the
// StepRecorder, the test faults to faults.hpp and the data to the TokenSource.
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <map>
#include <thread>

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
#include "exec/recorder.hpp"
#include "exec/reducer.hpp"
#include "exec/tokens.hpp"
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

// The phase clock's exclusive phases (and the DP time in flight) as the measurement's PhaseTimes.
PhaseTimes phase_times(const std::array<double, kPhases>& x, double dp_in_flight) {
  PhaseTimes p;
  p.forward = x[int(Ph::forward)];
  p.backward = x[int(Ph::backward)];
  p.recompute = x[int(Ph::recompute)];
  p.tp_comm = x[int(Ph::tp_comm)];
  p.pp_comm = x[int(Ph::pp_comm)];
  p.dp_comm_exposed = x[int(Ph::dp_comm)];
  p.dp_comm = std::max(dp_in_flight, p.dp_comm_exposed);
  p.bubble = x[int(Ph::bubble)];
  p.optimizer = x[int(Ph::optimizer)];
  p.other = x[int(Ph::other)];
  return p;
}

struct Stash {
  at::Tensor input;   // received activation (leaf) or undefined on the first virtual stage
  at::Tensor output;  // activation sent on, or the loss
};

class ScheduleRunner {
 public:
  ScheduleRunner(const ExecPlan& plan, const ExecOptions& opt, const RankEnv& env, at::Device device, bool on_gpu)
      : plan_(plan), s_(plan.strategy), opt_(opt), env_(env), device_(device), on_gpu_(on_gpu),
        layout_(plan.strategy), coord_(layout_.coord(env.rank)), clock_(on_gpu),
        tokens_(opt.seed, opt.data_file, plan.model.vocab, plan.strategy.seq_len),
        schedule_(schedule_for(s_)) {}

  std::optional<Measurement> run();

 private:
  void setup();
  void step(int index, bool measured);
  at::Tensor activation_buffer() const;
  int tag(int mb, int vstage, bool backward) const {
    return ((mb * schedule_.virtual_stages() + vstage) << 1) | (backward ? 1 : 0);
  }
  void dump_params();
  MemoryFigures peak_memory() const;
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
  std::vector<std::unique_ptr<ModelChunk>> chunks_;  // this rank's model chunks, in chunk order
  std::vector<int> vstage_;                           // virtual stage of each chunk
  std::vector<int> backward_left_;                    // per chunk: backward slots left this step
  std::unique_ptr<DpReducer> reducer_;
  StepRecorder recorder_;
  int current_step_ = -1;
};

void ScheduleRunner::setup() {
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
  g_ = make_groups(layout_, env_.rank, store_, gs, clock_);

  ModelSettings ms;
  ms.spec = plan_.model;
  ms.seq_len = s_.seq_len;
  ms.tp = s_.tp;
  ms.tp_rank = coord_.tp;
  ms.sequence_parallel = s_.sequence_parallel && s_.tp > 1;
  ms.recompute = s_.recompute;
  ms.seed = opt_.seed;
  ms.pad_to = s_.dp;
  ms.device = device_;
  AdamWSettings adam;
  adam.lr = opt_.lr;
  reducer_ = std::make_unique<DpReducer>(s_, coord_.dp, g_, clock_, adam);
  const int V = schedule_.virtual_stages();
  for (int c = 0; c < s_.vp; ++c) {
    const int vs = schedule_.virtual_stage(coord_.pp, c);
    ChunkPlacement place{plan_.first_layer[vs], plan_.layers[vs], vs == 0, vs == V - 1};
    chunks_.push_back(std::make_unique<ModelChunk>(ms, place, *g_.tp, clock_));
    vstage_.push_back(vs);
  }
  backward_left_.assign(chunks_.size(), 0);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const ChunkPlacement& place = chunks_[c]->placement();
    const bool tied_copy = plan_.model.tied_embeddings && V > 1 && (place.has_embedding || place.has_head);
    reducer_->add_chunk(*chunks_[c], tied_copy);
  }
}

at::Tensor ScheduleRunner::activation_buffer() const {
  const int64_t s = (s_.sequence_parallel && s_.tp > 1) ? s_.seq_len / s_.tp : s_.seq_len;
  return at::empty({s, s_.micro_batch, plan_.model.hidden}, at::TensorOptions().dtype(at::kFloat).device(device_));
}

void ScheduleRunner::step(int index, bool measured) {
  current_step_ = index;
  if (env_.status_fd >= 0) dprintf(env_.status_fd, "%d %d\n", env_.rank, index);
  const auto t0 = Clock::now();
  clock_.start();
  const int m = s_.micro_batches();
  const int V = schedule_.virtual_stages();
  const int stage = coord_.pp, prev = (stage - 1 + s_.pp) % s_.pp, next = (stage + 1) % s_.pp;
  reducer_->begin_step();
  std::fill(backward_left_.begin(), backward_left_.end(), m);
  std::map<std::pair<int, int>, Stash> stash;
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> sends;
  double loss_sum = 0;
  bool forward_seen = false;
  const double loss_scale = 1.0 / (double(m) * s_.dp);

  for (const Slot& slot : schedule_.per_stage[stage]) {
    ModelChunk& model = *chunks_[slot.chunk];
    const int vs = vstage_[slot.chunk];
    const bool first = vs == 0, last = vs == V - 1;
    reducer_->before_use(slot.chunk);
    if (slot.phase == Phase::forward) {
      Stash st;
      at::Tensor input, targets;
      if (first || last) {
        at::Tensor all =
            tokens_.micro_batch(index, slot.micro_batch, coord_.dp, s_.dp, s_.micro_batch, s_.global_batch).to(device_);
        if (first) input = all.narrow(1, 0, s_.seq_len);
        targets = all.narrow(1, 1, s_.seq_len);
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
        st.output = model.forward(input, targets);
      }
      if (last) {
        loss_sum += st.output.item<double>();
      } else {
        at::Tensor out = st.output.detach().to(at::kFloat).contiguous();
        sends.emplace_back(g_.pp->send(out, next, tag(slot.micro_batch, vs + 1, false)), out);
      }
      stash.emplace(std::make_pair(slot.micro_batch, slot.chunk), std::move(st));
      inject_after_forward(opt_.faults, env_.rank, index, !forward_seen);
      forward_seen = true;
    } else {
      auto it = stash.find({slot.micro_batch, slot.chunk});
      TORCH_CHECK(it != stash.end(), "backward before forward for ", to_string(slot));
      Stash st = std::move(it->second);
      stash.erase(it);
      reducer_->set_last_backward(slot.chunk, backward_left_[slot.chunk] == 1);
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
      if (--backward_left_[slot.chunk] == 0) reducer_->backward_done(slot.chunk);
    }
  }
  reducer_->reduce_tied();
  for (auto& [w, t] : sends) g_.pp->wait(w, Ph::pp_comm);
  sends.clear();
  reducer_->finish_step();
  // The step's loss: mean over the global batch, from the last stage's TP rank 0 of each replica.
  const bool reports = vstage_.back() == V - 1 && coord_.tp == 0;
  at::Tensor l = at::full({1}, reports ? loss_sum / (double(m) * s_.dp) : 0.0,
                          at::TensorOptions().dtype(at::kDouble).device(device_));
  g_.world->all_reduce(l);
#ifdef TRAINPLAN_EXEC_CUDA
  if (on_gpu_) at::autocast::clear_cache();
#endif
  const auto phases = clock_.stop();
  const double wall = seconds_since(t0);
  if (measured) recorder_.record(wall, phase_times(phases, clock_.dp_in_flight), l.cpu().item<double>());
}

void ScheduleRunner::dump_params() {
  reducer_->gather_all();
  std::ofstream f(fmt::format("{}.rank{}", opt_.dump_params, env_.rank));
  for (auto& c : chunks_) {
    for (auto& p : c->params()) {
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

MemoryFigures ScheduleRunner::peak_memory() const {
  MemoryFigures mem;
#ifdef TRAINPLAN_EXEC_CUDA
  if (on_gpu_) {
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    mem.allocated = static_cast<double>(st.allocated_bytes[0].peak);
    mem.reserved = static_cast<double>(st.reserved_bytes[0].peak);
  }
#endif
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  mem.max_rss = static_cast<double>(ru.ru_maxrss) * 1024.0;
  return mem;
}

Measurement ScheduleRunner::collect() {
  // Every rank's row (steps and peak memory), gathered to every rank; rank 0 reports.
  const std::vector<double> mine = recorder_.pack(peak_memory());
  at::Tensor t = at::tensor(mine, at::TensorOptions().dtype(at::kDouble)).to(device_);
  at::Tensor all = g_.world->all_gather_dim0(t).cpu().contiguous();
  const size_t K = mine.size();
  const double* d = all.data_ptr<double>();
  std::vector<std::vector<double>> rows;
  for (int k = 0; k < env_.world; ++k) rows.emplace_back(d + k * K, d + (k + 1) * K);

  Measurement m;
  m.strategy = s_;
  m.model = plan_.model.name;
  m.cluster = plan_.cluster;
  m.software = "trainplan-exec";  // software/trainplan-exec.json describes what this runner launches
  m.backend = opt_.backend;
  m.device = on_gpu_ ? "cuda" : "cpu";
  m.warmup = opt_.warmup;
  m.seed = opt_.seed;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  m.environment = {{"torch_version", TORCH_VERSION},
                   {"backend", opt_.backend},
                   {"device", m.device},
                   {"ranks", env_.world},
                   {"hostname", host},
                   {"intra_op_threads", at::get_num_threads()},
                   {"compute_dtype", on_gpu_ && s_.dtype == Dtype::bf16 ? "bf16 (autocast, fp32 master)" : "fp32"},
                   {"data", opt_.data_file.empty() ? "synthetic" : opt_.data_file},
                   {"phase_notes",
                    "steady clock per rank; bubble = waiting to receive from a pipeline neighbour; "
                    "dp_comm = data-parallel collectives from launch to completion"}};
  m.throughput.model_flops_per_step = plan_.model_flops_per_step;
  return recorder_.build(std::move(m), rows);
}

std::optional<Measurement> ScheduleRunner::run() {
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
  const bool on_gpu = opt.backend == "nccl";
  at::Device device = at::kCPU;
#ifdef TRAINPLAN_EXEC_CUDA
  if (on_gpu) {
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
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
  ScheduleRunner r(plan, opt, env, device, on_gpu);
  return r.run();
}

}  // namespace trainplan::exec
