// The schedule runner: one rank's training steps. It sets the rank up (rendezvous, process
// groups, model chunks), walks the shared Schedule's slots (forward/backward, send/recv between
// pipeline stages), and hands the data-parallel work to the DpReducer, the figures to the
// StepRecorder, the data to the TokenSource, and calls the test faults' hooks (faults.hpp) at named
// points of the step.
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
#include <ATen/autocast_mode.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#ifdef TRAINPLAN_EXEC_CUDA
#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/cuda.h>
#endif

#include "exec/exec.hpp"
#include "exec/faults.hpp"
#include "exec/grad_sync.hpp"
#include "exec/memory_probe.hpp"
#include "exec/model.hpp"
#include "exec/param_server.hpp"
#include "exec/parallel.hpp"
#include "exec/recorder.hpp"
#include "exec/reducer.hpp"
#include "exec/tokens.hpp"
#include "sim/atomic_file.hpp"
#include "sim/model_spec.hpp"
#include "sim/rank_layout.hpp"
#include "sim/schedule.hpp"
#include "sim/zero_policy.hpp"

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
  p.cp_comm = x[int(Ph::cp_comm)];
  p.pp_comm = x[int(Ph::pp_comm)];
  p.dp_comm_exposed = x[int(Ph::dp_comm)];
  p.dp_comm = std::max(dp_in_flight, p.dp_comm_exposed);
  p.bubble = x[int(Ph::bubble)];
  p.optimizer = x[int(Ph::optimizer)];
  p.ep_comm = x[int(Ph::ep_comm)];
  p.other = x[int(Ph::other)];
  return p;
}

#ifdef TRAINPLAN_EXEC_CUDA
// The CUDA caching allocator's settings for a run: the user's PYTORCH_ALLOC_CONF (or the older
// PYTORCH_CUDA_ALLOC_CONF) when set, else expandable segments. With them the allocator grows a
// segment by mapping more physical memory instead of caching fixed blocks, so memory freed by one
// phase (the optimizer's, the logits') can be reused by another: without them gpt2-xl with
// micro-batch 12 on one 80 GB GPU ran out of memory with 40 GB reserved but unallocated. Returns
// the note the measurement records.
std::string configure_cuda_allocator(bool apply) {
  for (const char* name : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"})
    if (const char* v = std::getenv(name); v && *v) return fmt::format("{}={} (from the environment)", name, v);
  if (apply) c10::CachingAllocator::setAllocatorSettings("expandable_segments:True");
  return "expandable_segments:True (trainplan's default; PYTORCH_ALLOC_CONF overrides it)";
}
#endif

struct Stash {
  at::Tensor input;   // received activation (leaf) or undefined on the first virtual stage
  at::Tensor output;  // activation sent on, or the loss
};

// One step's state while the runner walks the schedule's slots.
struct StepState {
  int index = 0;
  std::map<std::pair<int, int>, Stash> stash;  // (micro-batch, chunk) -> what its backward needs
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> sends;  // in flight, with their buffers
  // Sum of the last stage's micro-batch losses, kept on the device: reading each one on the host
  // would synchronise the device once per micro-batch.
  at::Tensor loss_sum;
  double loss_scale = 1;  // the last stage's backward starts from loss * loss_scale
};

class ScheduleRunner {
 public:
  ScheduleRunner(const ExecPlan& plan, const ExecOptions& opt, const RankEnv& env, at::Device device, bool on_gpu)
      : plan_(plan), s_(plan.strategy), opt_(opt), env_(env), device_(device), on_gpu_(on_gpu),
        layout_(plan.strategy), coord_(layout_.is_worker(env.rank) ? layout_.coord(env.rank) : RankCoord{}), clock_(on_gpu),
        tokens_(opt.seed, opt.data_file, plan.model.vocab, plan.strategy.seq_len),
        schedule_(schedule_for(s_)),
        faults_(make_fault_injector(opt.faults, env.rank, s_.micro_batches(), s_.dp)) {}

  std::optional<Measurement> run();

 private:
  // bf16/fp16 run as such (autocast over fp32 master weights): on GPUs, and on the CPU with
  // --cpu-autocast on; else the CPU computes fp32.
  bool mixed_precision() const {
    return (s_.dtype == Dtype::bf16 || s_.dtype == Dtype::fp16) && (on_gpu_ || opt_.cpu_autocast);
  }
  at::ScalarType compute_dtype() const {
    return !mixed_precision() ? at::kFloat : s_.dtype == Dtype::bf16 ? at::kBFloat16 : at::kHalf;
  }
  bool sequence_parallel() const { return s_.sequence_parallel && s_.tp > 1; }
  void setup();
  void rendezvous();
  ModelSettings model_settings() const;
  std::unique_ptr<GradSync> grad_sync(const AdamWSettings& adam);
  bool moe() const { return plan_.model.moe.on(); }
  ModelSettings expert_settings(const ModelSettings& dense) const;
  std::unique_ptr<GradSync> expert_grad_sync();
  void build_worker(const ModelSettings& ms, const AdamWSettings& adam);
  void step(int index, bool measured);
  void traced_step(int index);  // one more step under the profiler (--trace), not measured
  void forward_slot(StepState& st, const Slot& slot);
  void backward_slot(StepState& st, const Slot& slot);
  void reduce_and_update(StepState& st);
  void serve(int index, bool measured);  // a dedicated parameter server's step
  void finish_step(at::Tensor loss, Clock::time_point t0, double bytes0, bool measured);
  double dp_bytes_sent() const;          // so far, by this rank's DP (or parameter-server) group
  at::Tensor activation_buffer() const;
  int tag(int mb, int vstage, bool backward) const {
    return ((mb * schedule_.virtual_stages() + vstage) << 1) | (backward ? 1 : 0);
  }
  // Debug dumps, one line per parameter: name, full shape, shard dim, TP index, TP size, values.
  void dump(const std::string& prefix, bool grads);
  MemoryFigures peak_memory() const;
  RunFailure failure(const std::string& error) const;  // this rank, step, phase and memory now
  RankFailure reported(RankFailure f) const;            // sent to the launcher, if there is one
  void enter(std::string phase);  // what the rank does now, for failure reports
  Measurement collect();
  nlohmann::json environment() const;
  nlohmann::json model_states();
  nlohmann::json expert_parallel();  // MoE models: each rank's all-to-all bytes and time per measured step
  nlohmann::json memory_accounting();

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
  std::unique_ptr<FaultInjector> faults_;  // test faults' hooks; they do nothing unless --fault-* asks
  c10::intrusive_ptr<c10d::Store> store_;
  Groups g_;
  // What ZeRO does over this rank's DP group: the plan's stage, or with one replica (or parameter
  // servers) stage 0, as there is nothing to shard over.
  ZeroPolicy zero_;
  ZeroPolicy expert_zero_;  // the same over the expert-data-parallel group (MoE models)
  std::vector<std::unique_ptr<ModelChunk>> chunks_;  // this rank's model chunks, in chunk order
  std::vector<std::unique_ptr<ModelChunk>> expert_chunks_;  // MoE models: each chunk's routed experts
  ExpertTraffic traffic_;              // the experts' all-to-all bytes so far
  ExpertTraffic traffic_measured_;     // ...in the measured steps
  double ep_seconds_measured_ = 0;     // the measured steps' ep_comm phase
  std::vector<int> vstage_;                           // virtual stage of each chunk
  std::vector<int> backward_left_;                    // per chunk: backward slots left this step
  std::unique_ptr<DpReducer> reducer_;   // null on a dedicated parameter server
  std::unique_ptr<ParamServer> server_;  // a dedicated parameter server's only part
  StepRecorder recorder_;
  // --memory-accounting on: the allocator's reporter for this rank and the step's figures from it.
  std::shared_ptr<MemoryProbe> probe_;
  std::unique_ptr<MemoryAccount> account_;
  int current_step_ = -1;
  std::string phase_ = "setting up";
};

void ScheduleRunner::enter(std::string phase) {
  phase_ = std::move(phase);
  if (env_.status_fd >= 0) report_rank_progress(env_.status_fd, env_.rank, current_step_, phase_);
}

// Rendezvous through c10d's TCPStore (rank 0 serves it unless the local spawner does), then this
// rank's process groups.
void ScheduleRunner::rendezvous() {
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
  g_ = make_groups(layout_, env_.rank, store_, gs, clock_, moe());
}

ModelSettings ScheduleRunner::model_settings() const {
  ModelSettings ms;
  ms.spec = plan_.model;
  ms.seq_len = s_.seq_len;
  ms.tp = s_.tp;
  ms.tp_rank = coord_.tp;
  ms.cp = s_.cp;
  ms.cp_rank = coord_.cp;
  ms.sequence_parallel = sequence_parallel();
  ms.recompute = s_.recompute;
  ms.seed = opt_.seed;
  ms.pad_to = g_.dp->size();  // replicas of the same parameters (the dp x cp ranks) shard the buffers
  ms.grad_buffer = !zero_.shards_grads;  // sharded gradients are reduced bucket by bucket instead
  ms.unit_buffers = zero_.shards_params;  // sharded parameters are gathered unit by unit
  ms.unit_dtype = compute_dtype();        // ...in the compute dtype (16-bit under mixed precision)
  ms.device = device_;
  ms.fuse_composites = opt_.fused_kernels != FusedKernels::off;
  ms.fuse_library_ops = opt_.fused_kernels == FusedKernels::on;
  if (layout_.is_worker(env_.rank)) ms.ep_rank = layout_.expert_coord(env_.rank).ep;
  ms.ep = s_.ep;
  ms.capacity_factor = s_.capacity_factor;
  return ms;
}

// The routed experts' chunks: whole experts (etp 1: no tensor split), their buffers padded and
// ZeRO-sharded over the expert-data-parallel replicas, which reduce their gradients.
ModelSettings ScheduleRunner::expert_settings(const ModelSettings& dense) const {
  ModelSettings ms = dense;
  ms.tp = 1;
  ms.tp_rank = 0;
  ms.sequence_parallel = false;
  ms.pad_to = g_.edp->size();
  ms.grad_buffer = !expert_zero_.shards_grads;
  ms.unit_buffers = false;  // exec refuses ZeRO-3 for MoE models (cli/cmd_exec.cpp)
  return ms;
}

// The routed experts' scheme over the EDP group: as the dense one but never sequence-parallel
// (whole experts see only the tokens sent to them) and never compressed (refused for MoE).
std::unique_ptr<GradSync> ScheduleRunner::expert_grad_sync() {
  const int64_t bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(opt_.bucket_bytes / 4));  // fp32
  if (expert_zero_.shards_optimizer)
    return sharded_optimizer(*g_.edp, *g_.etp, clock_, expert_zero_, false, bucket_elems);
  return replicated_all_reduce(*g_.edp, *g_.etp, clock_, false, bucket_elems);
}

// The data-parallel scheme of this rank (grad_sync.hpp), one function per scheme: parameter
// servers, else what ZeRO does over the DP group, the all-reduce compressed where asked.
std::unique_ptr<GradSync> ScheduleRunner::grad_sync(const AdamWSettings& adam) {
  const int64_t bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(opt_.bucket_bytes / 4));  // fp32
  if (s_.uses_ps()) return parameter_server(layout_, env_.rank, *g_.ps, clock_, adam);
  if (zero_.shards_optimizer)
    return sharded_optimizer(*g_.dp, *g_.tp, clock_, zero_, sequence_parallel(), bucket_elems);
  if (s_.grad_compression.kind != CompressionKind::none && g_.dp->size() > 1)
    return compressed_all_reduce(*g_.dp, *g_.tp, clock_, sequence_parallel(), s_.grad_compression, opt_.seed);
  return replicated_all_reduce(*g_.dp, *g_.tp, clock_, sequence_parallel(), bucket_elems);
}

void ScheduleRunner::setup() {
  rendezvous();
  zero_ = ZeroPolicy::of(g_.dp->size() > 1 && !s_.uses_ps() ? s_.zero : 0);
  expert_zero_ = ZeroPolicy::of(g_.edp->size() > 1 ? s_.zero : 0);
  ModelSettings ms = model_settings();
  AdamWSettings adam;
  adam.lr = opt_.lr;
  if (!layout_.is_worker(env_.rank)) {
    // A dedicated parameter server trains no model: it builds the whole one (PS runs with one
    // stage and no TP/CP) only to take its shard's initial values, padded as the workers pad.
    ms.pad_to = s_.dp * s_.cp;
    ModelChunk whole(ms, ChunkPlacement{plan_.first_layer[0], plan_.layers[0], true, true}, *g_.tp, *g_.cp, clock_);
    server_ = std::make_unique<ParamServer>(layout_, env_.rank, *g_.ps, clock_, adam, whole);
    return;
  }
  build_worker(ms, adam);
}

// A worker's model chunks (one per virtual stage it runs) and its DP side.
void ScheduleRunner::build_worker(const ModelSettings& ms, const AdamWSettings& adam) {
  LossScaling scaling;
  scaling.enabled = s_.dtype == Dtype::fp16;
  scaling.scale = opt_.loss_scale;
  scaling.growth_interval = opt_.loss_scale_window;
  reducer_ = std::make_unique<DpReducer>(grad_sync(adam), g_, clock_, adam, scaling,
                                         moe() ? expert_grad_sync() : nullptr);
  const int V = schedule_.virtual_stages();
  for (int c = 0; c < s_.vp; ++c) {
    const int vs = schedule_.virtual_stage(coord_.pp, c);
    ChunkPlacement place{plan_.first_layer[vs], plan_.layers[vs], vs == 0, vs == V - 1};
    chunks_.push_back(std::make_unique<ModelChunk>(ms, place, *g_.tp, *g_.cp, clock_));
    vstage_.push_back(vs);
    if (!moe()) continue;
    ChunkPlacement experts{plan_.first_layer[vs], plan_.layers[vs], false, false, true};
    expert_chunks_.push_back(std::make_unique<ModelChunk>(expert_settings(ms), experts, *g_.etp, *g_.cp, clock_));
    chunks_.back()->set_experts(*expert_chunks_.back(), *g_.ep, traffic_);
  }
  backward_left_.assign(chunks_.size(), 0);
  for (auto& chunk : chunks_) {
    const ChunkPlacement& place = chunk->placement();
    const bool tied_copy = plan_.model.tied_embeddings && V > 1 && (place.has_embedding || place.has_head);
    reducer_->add_chunk(*chunk, tied_copy, moe() ? expert_chunks_[&chunk - &chunks_[0]].get() : nullptr);
  }
}

// The data-parallel traffic: the DP group's, the routed experts' over the EDP group (a dense
// model's rank is alone in it), the parameter servers'.
double ScheduleRunner::dp_bytes_sent() const {
  return g_.dp->bytes_sent() + g_.edp->bytes_sent() + (g_.ps ? g_.ps->bytes_sent() : 0.0);
}

void ScheduleRunner::serve(int index, bool measured) {
  current_step_ = index;
  enter("parameter server: receive pushes, update, send pulls");
  const auto t0 = Clock::now();
  const double bytes0 = dp_bytes_sent();
  clock_.start();
  const bool dump_grads = index == 0 && !opt_.dump_grads.empty();
  server_->exchange(dump_grads);
  if (dump_grads) dump(opt_.dump_grads, true);  // empty: a server holds no whole parameter
  enter("end of step (loss all-reduce)");
  at::Tensor l = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device_));  // a server has no loss
  finish_step(l, t0, bytes0, measured);
}

// Every rank ends its step here: the loss all-reduced (the last stage of each replica contributes
// its share, every other rank zero), the clock stopped, the step recorded. A loss that is not
// finite stops the run: each rank holds the same all-reduced value, so all of them stop in the
// same step, and the job fails with that message instead of timing steps that train nothing.
// fp16's dynamic loss scaling skips a step whose gradients are not finite before they reach the
// parameters (the loss stays finite); bf16 and fp32 have no such guard.
void ScheduleRunner::finish_step(at::Tensor loss, Clock::time_point t0, double bytes0, bool measured) {
  g_.world->all_reduce(loss);
  const auto phases = clock_.stop();
  const double wall = seconds_since(t0);
  const double value = loss.cpu().item<double>();
  if (measured) {
    recorder_.record(wall, phase_times(phases, clock_.dp_in_flight), value, dp_bytes_sent() - bytes0);
    ep_seconds_measured_ += phases[int(Ph::ep_comm)];
  }
  if (!std::isfinite(value)) {
    throw std::runtime_error(fmt::format("the loss is {} (training diverged: a non-finite value reached the "
                                         "parameters; --dtype fp16 with dynamic loss scaling skips such steps)",
                                         value));
  }
}

at::Tensor ScheduleRunner::activation_buffer() const {
  const int64_t s = sequence_parallel() ? s_.seq_len / s_.cp / s_.tp : s_.seq_len / s_.cp;
  return at::empty({s, s_.micro_batch, plan_.model.hidden}, at::TensorOptions().dtype(at::kFloat).device(device_));
}

void ScheduleRunner::step(int index, bool measured) {
  if (!reducer_) return serve(index, measured);
  current_step_ = index;
  enter("start of step");
  const auto t0 = Clock::now();
  const double bytes0 = dp_bytes_sent();
  const ExpertTraffic traffic0 = traffic_;
  clock_.start();
  const int m = s_.micro_batches();
  reducer_->begin_step();
  std::fill(backward_left_.begin(), backward_left_.end(), m);
  if (account_) account_->begin_step();
  StepState st;
  st.index = index;
  st.loss_sum = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device_));
  // Mean over the global batch (m micro-batches on each of dp replicas), times the fp16 loss scale.
  st.loss_scale = reducer_->loss_scale() / (double(m) * s_.dp);
  for (const Slot& slot : schedule_.per_stage[coord_.pp]) {
    enter(fmt::format("{} (micro-batch {}, chunk {})", slot.phase == Phase::forward ? "forward" : "backward",
                      slot.micro_batch, slot.chunk));
    if (slot.phase == Phase::forward)
      forward_slot(st, slot);
    else
      backward_slot(st, slot);
  }
  reduce_and_update(st);
  if (measured) {
    traffic_measured_.token_bytes += traffic_.token_bytes - traffic0.token_bytes;
    traffic_measured_.count_bytes += traffic_.count_bytes - traffic0.count_bytes;
  }
  if (account_) account_->end_step(measured);
  enter("end of step (loss all-reduce)");
  // The step's loss: mean over the global batch, from the last stage's TP rank 0 of each replica.
  const bool reports = vstage_.back() == schedule_.virtual_stages() - 1 && coord_.tp == 0 && coord_.cp == 0;
  at::Tensor l = reports ? st.loss_sum.mul_(1.0 / (double(m) * s_.dp)) : st.loss_sum.zero_();
  finish_step(l, t0, bytes0, measured);
}

void ScheduleRunner::forward_slot(StepState& st, const Slot& slot) {
  ModelChunk& model = *chunks_[slot.chunk];
  const int vs = vstage_[slot.chunk];
  const bool first = vs == 0, last = vs == schedule_.virtual_stages() - 1;
  Stash stash;
  at::Tensor input, targets;
  if (first || last) {
    at::Tensor all = tokens_.micro_batch(st.index, slot.micro_batch, coord_.dp, s_.dp, s_.micro_batch, s_.global_batch);
    // From pinned memory the copy is asynchronous (a pageable one can wait for the stream).
    all = on_gpu_ ? all.pin_memory().to(device_, /*non_blocking=*/true) : all.to(device_);
    if (first) input = all.narrow(1, 0, s_.seq_len);
    targets = all.narrow(1, 1, s_.seq_len);
  }
  if (!first) {
    const int prev = (coord_.pp - 1 + s_.pp) % s_.pp;
    at::Tensor buf = activation_buffer();
    auto w = g_.pp->recv(buf, prev, tag(slot.micro_batch, vs, false));
    g_.pp->wait(w, Ph::bubble);
    input = buf.requires_grad_(true);
    stash.input = input;
  }
  if (account_) account_->before_forward();
  {
    PhaseScope f(clock_, Ph::forward);
    stash.output = model.forward(input, targets);
  }
  if (account_) account_->after_forward();
  if (last) {
    st.loss_sum.add_(stash.output.detach());
  } else {
    const int next = (coord_.pp + 1) % s_.pp;
    at::Tensor out = stash.output.detach().to(at::kFloat).contiguous();
    st.sends.emplace_back(g_.pp->send(out, next, tag(slot.micro_batch, vs + 1, false)), out);
  }
  faults_->after_forward(st.index, stash.output);
  st.stash.emplace(std::make_pair(slot.micro_batch, slot.chunk), std::move(stash));
}

void ScheduleRunner::backward_slot(StepState& st, const Slot& slot) {
  const int vs = vstage_[slot.chunk];
  const bool first = vs == 0, last = vs == schedule_.virtual_stages() - 1;
  auto it = st.stash.find({slot.micro_batch, slot.chunk});
  TORCH_CHECK(it != st.stash.end(), "backward before forward for ", to_string(slot));
  Stash stash = std::move(it->second);
  st.stash.erase(it);
  reducer_->begin_backward(slot.chunk, backward_left_[slot.chunk] == 1);
  if (last) {
    PhaseScope b(clock_, Ph::backward);
    at::Tensor objective = stash.output * st.loss_scale;
    faults_->before_backward(st.index, objective);
    objective.backward();
  } else {
    const int next = (coord_.pp + 1) % s_.pp;
    at::Tensor grad = activation_buffer();
    auto w = g_.pp->recv(grad, next, tag(slot.micro_batch, vs, true));
    g_.pp->wait(w, Ph::bubble);
    PhaseScope b(clock_, Ph::backward);
    torch::autograd::backward({stash.output}, {grad});
  }
  if (!first) {
    const int prev = (coord_.pp - 1 + s_.pp) % s_.pp;
    at::Tensor gin = stash.input.grad().to(at::kFloat).contiguous();
    st.sends.emplace_back(g_.pp->send(gin, prev, tag(slot.micro_batch, vs - 1, true)), gin);
  }
  reducer_->after_backward(slot.chunk);
  faults_->after_backward(st.index, slot.chunk);
  if (--backward_left_[slot.chunk] == 0) reducer_->backward_done(slot.chunk);
}

// After the schedule: the rest of the DP reduction, the pipeline sends waited for, the optimizer.
void ScheduleRunner::reduce_and_update(StepState& st) {
  // The bf16 copies of the weights, cast once at their first use this step and shared by every
  // micro-batch (autocast's cache), are not needed past the last backward: free them before the
  // optimizer.
  if (account_) account_->before_cache_clear();
  if (mixed_precision()) at::autocast::clear_cache();
  if (account_) account_->after_cache_clear();
  enter("data-parallel reduction and optimizer");
  reducer_->reduce_tied();
  for (auto& [w, t] : st.sends) g_.pp->wait(w, Ph::pp_comm);
  st.sends.clear();
  const bool dump_grads = st.index == 0 && !opt_.dump_grads.empty();
  reducer_->finish_reduction(dump_grads);
  if (dump_grads) dump(opt_.dump_grads, true);
  faults_->before_update(st.index, *reducer_);
  reducer_->update(st.index);
  if (account_) account_->after_update();
}

void ScheduleRunner::dump(const std::string& prefix, bool grads) {
  // Per chunk (then per expert chunk): the reduced gradient (grads) or the fp32 parameters.
  std::vector<at::Tensor> flat;
  std::vector<const ModelChunk*> of;
  for (bool experts : {false, true}) {
    for (size_t c = 0; c < (experts ? expert_chunks_ : chunks_).size(); ++c) {
      const int i = static_cast<int>(c);
      flat.push_back(grads ? reducer_->reduced_grad(i, experts) : reducer_->parameters(i, experts));
      of.push_back((experts ? expert_chunks_ : chunks_)[c].get());
    }
  }
  std::ofstream f(fmt::format("{}.rank{}", prefix, env_.rank));
  for (size_t c = 0; c < of.size(); ++c) {
    // The unfused model's tensors (a fused q/k/v or gate/up parameter as its parts), so that dumps
    // keep one layout whatever the fusion. Routed experts are whole (shard dim -1).
    for (const auto& p : of[c]->tensors()) {
      at::Tensor t = flat[c].narrow(0, p.offset, p.numel).detach();
      at::Tensor v = t.to(at::kCPU).to(at::kDouble).contiguous().reshape({-1});
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
  // The dtype run: fp32 on CPU (unless --cpu-autocast), the requested one kept beside it.
  set_run_strategy(m, s_, on_gpu_ || mixed_precision());
  m.model = plan_.model.name;
  m.cluster = plan_.cluster;
  m.software = "trainplan-exec";  // software/trainplan-exec.json describes what this runner launches
  m.executor = kExecutorFingerprint;  // ...as long as its describes_executor names this
  m.backend = opt_.backend;
  m.device = on_gpu_ ? "cuda" : "cpu";
  m.warmup = opt_.warmup;
  m.seed = opt_.seed;
  m.environment = environment();
  m.environment["model_states"] = model_states();
  if (moe()) m.environment["expert_parallel"] = expert_parallel();
  if (opt_.memory_accounting) m.environment["memory_accounting"] = memory_accounting();
  m.throughput.model_flops_per_step = plan_.model_flops_per_step;
  return recorder_.build(std::move(m), rows);
}

// The measurement's `environment`: what ran, and how it was timed.
nlohmann::json ScheduleRunner::environment() const {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const std::string device = on_gpu_ ? "cuda" : "cpu";
  nlohmann::json e = {{"torch_version", TORCH_VERSION},
                      {"backend", opt_.backend},
                      {"device", device},
                      {"ranks", env_.world},
                      {"hostname", host},
                      {"intra_op_threads", at::get_num_threads()},
                      {"compute_dtype", !mixed_precision()         ? "fp32"
                                        : s_.dtype == Dtype::bf16 ? "bf16 (autocast, fp32 master)"
                                                                  : "fp16 (autocast, fp32 master)"},
                      {"data", opt_.data_file.empty() ? "synthetic" : opt_.data_file},
                      {"fused_kernels", to_string(opt_.fused_kernels)},
                      {"vocab_padding",
                       {{"vocab", plan_.model.vocab},
                        {"padded_vocab", padded_vocab(plan_.model.vocab, s_.tp)},
                        {"note", "embedding and LM head rows padded to a multiple of 128*tp (Megatron); padding "
                                 "rows are not in the layer graph's parameter count and get no logit"}}},
                      {"phase_notes",
                       std::string(on_gpu_ ? "CUDA events on each rank's compute stream (device time between phase "
                                             "switches, no synchronisation per switch)"
                                           : "steady clock per rank") +
                           "; bubble = waiting to receive from a pipeline neighbour; "
                           "dp_comm = data-parallel collectives from launch to completion"}};
  if (reducer_ && reducer_->loss_scaling().enabled) {
    const LossScaling& ls = reducer_->loss_scaling();
    e["loss_scaling"] = {{"initial_scale", opt_.loss_scale},
                         {"growth_interval", ls.growth_interval},
                         {"growth", ls.growth},
                         {"backoff", ls.backoff},
                         {"final_scale", ls.scale},
                         {"skipped_steps", ls.skipped}};
  }
#ifdef TRAINPLAN_EXEC_CUDA
  if (on_gpu_) {
    e["allocator_settings"] = configure_cuda_allocator(false);
    e["allocator_expandable_segments"] = c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments();
  }
#endif
  return e;
}

// Model states each rank held, counted from the reducer's tensors (the figures memory_model
// predicts per stage as weights, gradients and optimizer), gathered from every rank. A dedicated
// parameter server has no reducer: it holds no model states of a worker.
nlohmann::json ScheduleRunner::model_states() {
  const DpReducer::HeldBytes held = reducer_ ? reducer_->held_bytes() : DpReducer::HeldBytes{};
  at::Tensor hb = at::tensor(std::vector<double>{double(env_.rank), double(coord_.pp), held.weights, held.gathered,
                                                 held.gradients, held.optimizer, held.buffers_peak},
                             at::TensorOptions().dtype(at::kDouble))
                      .to(device_);
  at::Tensor hall = g_.world->all_gather_dim0(hb).cpu().contiguous().view({env_.world, 7});
  nlohmann::json states = nlohmann::json::array();
  for (int k = 0; k < env_.world; ++k) {
    auto r = hall[k];
    states.push_back({{"rank", int(r[0].item<double>())},
                      {"stage", int(r[1].item<double>())},
                      {"weights", r[2].item<double>()},
                      {"gathered_weights", r[3].item<double>()},
                      {"gradients", r[4].item<double>()},
                      {"optimizer", r[5].item<double>()},
                      {"bucket_buffers_peak", r[6].item<double>()}});
  }
  return {{"bucket_bytes", opt_.bucket_bytes},
          {"note", "bytes of the tensors the DP reducer holds per rank (fp32): weights between steps (ZeRO-3: the "
                   "master shard), ZeRO-3's gathered parameters during the step (in the compute dtype: 16-bit "
                   "under mixed precision), the gradient buffer (ZeRO-2/3: the shard), AdamW's moments, and the "
                   "peak of ZeRO-2/3's bucket buffers in flight"},
          {"per_rank", states}};
}

// Per rank, per measured step: the bytes handed to the tokens' all-to-alls (dispatch and combine,
// forward and backward, recomputation included), those of the count exchanges, and the time in
// them (the ep_comm phase). Gathered from every rank.
nlohmann::json ScheduleRunner::expert_parallel() {
  const double steps = std::max(1, opt_.steps);
  at::Tensor mine = at::tensor(std::vector<double>{double(env_.rank), traffic_measured_.token_bytes / steps,
                                                   traffic_measured_.count_bytes / steps, ep_seconds_measured_ / steps},
                               at::TensorOptions().dtype(at::kDouble))
                        .to(device_);
  at::Tensor all = g_.world->all_gather_dim0(mine).cpu().contiguous().view({env_.world, 4});
  nlohmann::json per_rank = nlohmann::json::array();
  for (int k = 0; k < env_.world; ++k) {
    auto r = all[k];
    per_rank.push_back({{"rank", int(r[0].item<double>())},
                        {"token_bytes_per_step", r[1].item<double>()},
                        {"count_bytes_per_step", r[2].item<double>()},
                        {"ep_comm_seconds_per_step", r[3].item<double>()}});
  }
  return {{"ep", s_.ep},
          {"etp", s_.etp},
          {"edp", layout_.size(ExpertDim::edp)},
          {"capacity_factor", s_.capacity_factor},
          {"note", "token_bytes: the routed copies' all-to-alls (dispatch and combine, forward and backward), "
                   "each counted at its whole input size, the rows a rank keeps included; count_bytes: the exchanges "
                   "of copies per expert before a dropless dispatch; ep_comm: the time in them (the phases' ep_comm_s is the busiest rank's)"},
          {"per_rank", per_rank}};
}

// --memory-accounting on: each rank's step figures (memory_probe.hpp) beside its model states,
// gathered from every rank; the tests compare them with predict's per-stage terms.
nlohmann::json ScheduleRunner::memory_accounting() {
  const MemoryAccountFigures f = account_ ? account_->figures() : MemoryAccountFigures{};
  const DpReducer::HeldBytes held = reducer_ ? reducer_->held_bytes() : DpReducer::HeldBytes{};
  const std::vector<double> mine{double(env_.rank),  double(coord_.pp), held.weights,      held.gradients,
                                 held.optimizer,     f.weight_copies,   f.saved,           f.activations,
                                 f.optimizer_temporaries, f.step_start};
  const int64_t k = static_cast<int64_t>(mine.size());
  at::Tensor t = at::tensor(mine, at::TensorOptions().dtype(at::kDouble)).to(device_);
  at::Tensor all = g_.world->all_gather_dim0(t).cpu().contiguous().view({env_.world, k});
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < env_.world; ++r) {
    auto v = [&all, r](int i) { return all[r][i].item<double>(); };
    ranks.push_back({{"rank", int(v(0))}, {"stage", int(v(1))}, {"weights", v(2)}, {"gradients", v(3)},
                     {"optimizer", v(4)}, {"weight_copies", v(5)}, {"saved", v(6)}, {"activations", v(7)},
                     {"optimizer_temporaries", v(8)}, {"step_start", v(9)}});
  }
  return {{"note", "bytes by what they hold, per rank, the largest over the measured steps (exec/memory_probe.hpp): "
                   "model states as the reducer holds them; weight_copies: autocast's 16-bit weight cache; saved: "
                   "the most one micro-batch's forward leaves for its backward; activations: the forward/backward "
                   "peak above the bytes held at the step's start, less the weight copies; optimizer_temporaries: "
                   "the DP reduction's and optimizer's peak above the bytes held after the last backward; "
                   "step_start: bytes held when a step starts"},
          {"per_rank", ranks}};
}

std::optional<Measurement> ScheduleRunner::run() {
  const int total = opt_.warmup + opt_.steps;
  auto where = [this] { return current_step_ < 0 ? std::string("while setting up") : fmt::format("in step {}", current_step_); };
  // The probe sees the rank's allocations from before its model is built until the run ends.
  std::optional<c10::DebugInfoGuard> probing;
  if (opt_.memory_accounting) {
    probe_ = std::make_shared<MemoryProbe>(device_.type());
    account_ = std::make_unique<MemoryAccount>(*probe_);
    probing.emplace(c10::DebugInfoKind::PROFILER_STATE, probe_);
  }
  try {
    setup();
    if (mixed_precision()) {
      const at::DeviceType dev = on_gpu_ ? at::kCUDA : at::kCPU;
      at::autocast::set_autocast_enabled(dev, true);
      at::autocast::set_autocast_dtype(dev, compute_dtype());
      // ZeRO-3 gathers each unit in the compute dtype already (ModelSettings::unit_dtype): the
      // cache of 16-bit casts of fp32 parameters has nothing of them to keep.
      if (zero_.shards_params) at::autocast::set_autocast_cache_enabled(false);
    }
    for (int i = 0; i < total; ++i) step(i, i >= opt_.warmup);
    enter("after the last step (dumps, measurement gather)");
    if (!opt_.dump_params.empty()) dump(opt_.dump_params, false);
    Measurement m = collect();
    if (!opt_.trace.empty()) traced_step(total);
    if (env_.rank == 0) return m;
    return std::nullopt;
  } catch (const c10::Error& e) {
    const std::string error = first_line(e.what_without_backtrace());
    throw reported(RankFailure(fmt::format("rank {} failed {}: {}", env_.rank, where(), error), failure(error)));
  } catch (const RankFailure& e) {
    throw reported(RankFailure(e.what(), failure(e.detail.error)));
  } catch (const std::exception& e) {
    const std::string error = first_line(e.what());
    throw reported(RankFailure(fmt::format("rank {} failed {}: {}", env_.rank, where(), error), failure(error)));
  }
}

// A step under the PyTorch profiler (Kineto: the operators on the host; on a GPU, every kernel
// and copy), after the measured ones so that its overhead is in no measured figure. Each rank
// writes its chrome trace (Perfetto, chrome://tracing, tests/gpu/step_profile.py --summarize) to
// <trace>.rank<R>.json, whole, through OutputSet as every other output.
void ScheduleRunner::traced_step(int index) {
  namespace prof = torch::autograd::profiler;
  enter("tracing a step (--trace)");
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (on_gpu_) activities.insert(prof::ActivityType::CUDA);
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  std::unique_ptr<prof::ProfilerResult> result;
  try {
    step(index, false);
#ifdef TRAINPLAN_EXEC_CUDA
    if (on_gpu_) torch::cuda::synchronize(device_.index());  // the step's last kernels in the trace
#endif
    result = prof::disableProfiler();
  } catch (...) {
    prof::disableProfiler();
    throw;
  }
  const std::string path = fmt::format("{}.rank{}.json", opt_.trace, env_.rank);
  OutputSet out;  // a hidden temporary, flushed, then renamed; removed if the save fails
  out.stage_by_path(path, "--trace " + path, [&](const std::filesystem::path& tmp) { result->save(tmp.string()); });
  out.commit();
}

RankFailure ScheduleRunner::reported(RankFailure f) const {
  // Tell the launcher now, while this rank's process groups are still open: once they close,
  // its peers fail too ("connection closed by peer"), and the launcher must hear this rank first.
  if (env_.status_fd >= 0) {
    report_rank_failure(env_.status_fd, f.detail);
    f.reported = true;
  }
  return f;
}

RunFailure ScheduleRunner::failure(const std::string& error) const {
  RunFailure f;
  f.rank = env_.rank;
  f.step = current_step_;
  f.phase = phase_;
  f.error = error;
#ifdef TRAINPLAN_EXEC_CUDA
  if (on_gpu_) {
    const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    f.allocated = static_cast<double>(st.allocated_bytes[0].current);
    f.reserved = static_cast<double>(st.reserved_bytes[0].current);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) f.capacity = static_cast<double>(total_b);
  }
#endif
  if (!on_gpu_) f.capacity = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (FILE* statm = std::fopen("/proc/self/statm", "r")) {
    long size = 0, resident = 0;
    if (std::fscanf(statm, "%ld %ld", &size, &resident) == 2)
      f.rss = static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
    std::fclose(statm);
  }
  return f;
}

}  // namespace

std::optional<Measurement> run_rank(const ExecPlan& plan, const ExecOptions& opt, const RankEnv& env) {
  // --device cuda runs NCCL ranks one per GPU, or Gloo ranks several to a GPU (correctness checks).
  const bool on_gpu = opt.device.empty() ? opt.backend == "nccl" : opt.device == "cuda";
  at::Device device = at::kCPU;
#ifdef TRAINPLAN_EXEC_CUDA
  if (on_gpu) {
    configure_cuda_allocator(true);  // before the first CUDA allocation
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
  ScheduleRunner r(plan, opt, env, device, on_gpu);
  return r.run();
}

}  // namespace trainplan::exec
