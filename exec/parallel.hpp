// Process groups of one rank, the phase clock that times them, and the autograd functions that
// move activations between tensor-parallel ranks. Groups come from RankLayout (sim/) and are
// passed explicitly; nothing here is global.
#pragma once
#include <torch/torch.h>

#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "sim/rank_layout.hpp"

namespace trainplan::exec {

// Exclusive phases of a rank's step: at any moment the rank is in exactly one, so they add up to
// the step's wall time. Communication inside forward/backward is taken out of them (ep_comm: the
// experts' token all-to-alls).
enum class Ph { forward, backward, recompute, tp_comm, cp_comm, pp_comm, dp_comm, bubble, optimizer, other, ep_comm, count };
inline constexpr int kPhases = static_cast<int>(Ph::count);

// Phase accounting. On the CPU a steady clock. With `device_timing` (CUDA) a CUDA event is
// recorded on the current stream at each phase switch and stop() waits for the last one: the time
// between consecutive events is attributed to the phase in between, so the phases are the
// stream's own time (kernels, waits on other streams, idle gaps while the host catches up) and no
// phase switch synchronises the device.
class PhaseClock {
 public:
  explicit PhaseClock(bool device_timing);
  ~PhaseClock();
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;
  void start();                      // zero the accumulators; phase = other
  Ph enter(Ph p);                    // switch to `p`, returns the phase left
  std::array<double, kPhases> stop();  // seconds per phase since start() (waits for the device)
  // Time data-parallel collectives were in flight (launch to completion), not exclusive.
  double dp_in_flight = 0;

 private:
  using Clock = std::chrono::steady_clock;
  struct Events;                     // the step's CUDA events (CUDA builds, device_timing only)
  std::unique_ptr<Events> events_;
  Ph current_ = Ph::other;
  Clock::time_point since_{};
  std::array<double, kPhases> acc_{};
};

// Switches the clock to a phase for a scope, then back.
class PhaseScope {
 public:
  PhaseScope(PhaseClock& c, Ph p) : clock_(c), prev_(c.enter(p)) {}
  ~PhaseScope() { clock_.enter(prev_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseClock& clock_;
  Ph prev_;
};

// One process group: a c10d backend over `ranks` (global ranks, ascending), timed into `phase`.
// With one rank every collective is the identity and no backend exists.
// Gloo has no CUDA send/recv/reduce-scatter, so with `stage_cuda` (Gloo ranks on a GPU, for
// correctness checks on one device) CUDA tensors are copied to the host, moved by Gloo and copied
// back when the work is waited for.
class Comm {
 public:
  Comm(c10::intrusive_ptr<c10d::Backend> pg, std::vector<int> ranks, int index, PhaseClock* clock, Ph phase,
       std::string name, bool stage_cuda = false);
  int size() const { return static_cast<int>(ranks_.size()); }
  int index() const { return index_; }  // this rank's position in ranks()
  const std::vector<int>& ranks() const { return ranks_; }
  const std::string& name() const { return name_; }

  void all_reduce(at::Tensor& t, c10d::ReduceOp op = c10d::ReduceOp::SUM);  // in place, waits
  c10::intrusive_ptr<c10d::Work> all_reduce_async(at::Tensor& t);
  at::Tensor all_gather_dim0(const at::Tensor& t);     // concatenation along dim 0, waits
  at::Tensor reduce_scatter_dim0(const at::Tensor& t);  // sum over ranks, then this rank's dim-0 slice
  // All-to-all along dim 0 with variable splits: rows [sum of in_splits[<j], + in_splits[j]) of
  // `in` go to member j, and `out` (returned) holds out_splits[i] rows from each member i in
  // member order; waits. Counts `in` whole (the rows kept on this rank included).
  at::Tensor all_to_all_dim0(const at::Tensor& in, const std::vector<int64_t>& out_splits,
                             const std::vector<int64_t>& in_splits);
  // Flat 1-D buffers: `full` has size() * shard.numel() elements.
  c10::intrusive_ptr<c10d::Work> all_gather_flat_async(at::Tensor& full, at::Tensor& shard);
  c10::intrusive_ptr<c10d::Work> reduce_scatter_flat_async(at::Tensor& shard, at::Tensor& full);
  // Sum over the group into member `root`'s `t` (in place; other members' `t` is left undefined).
  c10::intrusive_ptr<c10d::Work> reduce_async(at::Tensor& t, int root);
  // Member `root`'s `t` into every member's `t` (in place).
  c10::intrusive_ptr<c10d::Work> broadcast_async(at::Tensor& t, int root);
  c10::intrusive_ptr<c10d::Work> send(at::Tensor& t, int dst_index, int tag);
  c10::intrusive_ptr<c10d::Work> recv(at::Tensor& t, int src_index, int tag);
  // A ring shift: sends `out` to member `dst` while receiving `in` from member `src`. Even members
  // post the send first and odd ones the receive, so two members that exchange with each other
  // over one NCCL stream never both start with a receive. Wait for the returned works.
  std::vector<c10::intrusive_ptr<c10d::Work>> exchange_async(at::Tensor& out, int dst, at::Tensor& in, int src,
                                                             int tag);
  // Waits for `w` inside this group's phase.
  void wait(const c10::intrusive_ptr<c10d::Work>& w, Ph phase);

  PhaseClock& clock() const { return *clock_; }
  // Bytes this rank has handed to the group's collectives and sends so far: the input tensors'
  // sizes (an all-reduce's or all-gather's input, a reduce-scatter's full input, a send's
  // tensor), not what a given algorithm puts on each link (a ring all-reduce sends 2(W-1)/W of
  // its input). Nothing is counted in a group of one.
  double bytes_sent() const { return bytes_sent_; }

 private:
  c10::intrusive_ptr<c10d::Backend> pg_;
  std::vector<int> ranks_;
  int index_ = 0;
  PhaseClock* clock_;
  Ph phase_;
  std::string name_;
  bool stage_cuda_ = false;
  double bytes_sent_ = 0;
  void count(const at::Tensor& t) { bytes_sent_ += static_cast<double>(t.numel()) * static_cast<double>(t.element_size()); }
  bool staged(const at::Tensor& t) const { return stage_cuda_ && t.is_cuda(); }
};

// Every group one rank belongs to. `dp` holds the ranks with replicas of the same parameters,
// i.e. the dp x cp ranks (context-parallel ranks see different tokens of the same sequences, so
// their gradients are summed with the data-parallel ones, as Megatron's dp-cp group does); the
// data itself is split by the dp coordinate alone.
struct Groups {
  std::unique_ptr<Comm> world, tp, cp, dp, pp;
  std::unique_ptr<Comm> embed;  // first and last pipeline stage (tied embeddings), else size 1
  // Experts (RankLayout's expert numbering; a rank alone in each for a dense model): the
  // expert-parallel group the tokens' all-to-all runs over (timed as ep_comm), the expert-tensor
  // group, and the expert-data-parallel group that reduces (and ZeRO shards) the routed experts'
  // gradients (timed as dp_comm).
  std::unique_ptr<Comm> ep, etp, edp;
  // Parameter servers (RankLayout::servers() > 0): every rank of the job, workers and servers,
  // for the push/pull sends (timed as dp_comm); null without them. `world` then also holds the
  // dedicated servers, which are alone in each of tp, cp, dp, pp and embed.
  std::unique_ptr<Comm> ps;
};

struct GroupSettings {
  std::string backend;           // "gloo" | "nccl"
  std::chrono::milliseconds timeout{30000};
  std::string gloo_host;         // address Gloo binds to; empty: the host's own name
  bool stage_cuda = false;       // Gloo with CUDA tensors: stage them through host memory
};

// Creates this rank's groups. Every rank walks RankLayout::all_groups in the same order and joins
// the groups that hold it (a group's members rendezvous under their own store prefix). `experts`:
// the model has routed experts, so the expert groups are real ones (else each rank is alone in them).
Groups make_groups(const RankLayout& layout, int rank, const c10::intrusive_ptr<c10d::Store>& store,
                   const GroupSettings& settings, PhaseClock& clock, bool experts = false);

// Autograd-aware tensor-parallel transfers (Megatron-style f/g operators), all along dim 0 for
// the sequence-parallel pair.
at::Tensor copy_to_tp(const at::Tensor& x, Comm& tp);        // fwd identity, bwd all-reduce
at::Tensor reduce_from_tp(const at::Tensor& x, Comm& tp);    // fwd all-reduce, bwd identity
at::Tensor gather_from_sp(const at::Tensor& x, Comm& tp);    // fwd all-gather, bwd reduce-scatter
at::Tensor scatter_to_sp(const at::Tensor& x, Comm& tp);     // fwd reduce-scatter, bwd all-gather

// Runs fn(inputs) without keeping its activations; re-runs it (timed as recompute) when the
// backward reaches it. `fn` must outlive the backward pass and be deterministic.
using CheckpointFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
at::Tensor checkpoint(const CheckpointFn* fn, const std::vector<at::Tensor>& inputs, PhaseClock& clock);

}  // namespace trainplan::exec
