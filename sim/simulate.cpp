#include "sim/simulate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "sim/check.hpp"
#include "sim/rank_layout.hpp"

namespace trainplan {

const char* to_string(Stream s) {
  switch (s) {
    case Stream::compute: return "compute";
    case Stream::pp_forward: return "pp send activations";
    case Stream::pp_backward: return "pp send gradients";
    case Stream::dp: return "dp collectives";
    case Stream::ep: return "ep all-to-all";
    case Stream::ps_server: return "parameter server";
  }
  return "?";
}

const char* to_string(EventKind k) {
  switch (k) {
    case EventKind::forward: return "forward";
    case EventKind::recompute: return "recompute";
    case EventKind::backward: return "backward";
    case EventKind::backward_weight: return "weight gradient";
    case EventKind::optimizer: return "optimizer";
    case EventKind::send_activation: return "send activation";
    case EventKind::send_gradient: return "send gradient";
    case EventKind::grad_reduce: return "gradient reduce";
    case EventKind::zero3_gather: return "zero3 gather";
    case EventKind::param_gather: return "parameter all-gather";
    case EventKind::ps_push_pull: return "ps push/pull";
    case EventKind::ps_update: return "ps update";
    case EventKind::dispatch: return "dispatch";
    case EventKind::combine: return "combine";
  }
  return "?";
}

namespace {

constexpr Seconds kUnknown = -1;

// Share of the backward kernels that compute weight gradients: the backward of a matmul is two
// matmuls of the forward's size, one for the input and one for the weight gradient (predict.cpp
// op_time; Qi et al. 2024, Sec. 2 take T_B = T_W likewise).
constexpr double kWeightGradShare = 0.5;

// When a slot's output was produced (end of its compute) and when it arrived at the consumer.
struct Handoff {
  Seconds produced = kUnknown;
  Seconds arrived = kUnknown;
  int send_stage = -1;             // stage whose events hold the send, if one was emitted
  std::ptrdiff_t send_event = -1;  // its index there
};

// A slot's first compute event (stage-local index) and the send that delivered its input.
struct InputLink {
  std::size_t event;
  int send_stage;
  std::ptrdiff_t send_event;
};

// A collective on the dp stream and the compute time it costs per second it overlaps compute
// (StepCosts::overlap_cost_rate of the stack's overlap share for its kind).
struct DpSpan {
  Seconds start, end;
  double rate;
};

// One pipeline stage's progress through its slots.
struct StageState {
  bool record = true;      // keep events (Record::events)
  std::size_t cursor = 0;  // next slot of schedule.per_stage[stage]
  bool finished = false;
  Seconds compute_free = 0, fwd_send_free = 0, bwd_send_free = 0, dp_free = 0;
  Seconds gather_done = 0;      // ZeRO-3: the gather of the slot running now ends
  Seconds params_ready = 0;     // ZeRO-1/2: the previous step's parameter all-gather ends
  std::vector<DpSpan> dp_spans; // dp-stream collectives in issue (= time) order
  std::size_t dp_scan = 0;      // first span that may still overlap the next compute slot
  std::vector<int> backwards;   // backwards run so far, per chunk
  std::ptrdiff_t last_dp_event = -1;
  std::vector<Event> events;
  std::vector<InputLink> links;  // resolved to Event::input_send once all stages are done
  StageUsage usage;
};

// The state of one simulation run: inputs plus per-stage state and the hand-offs between
// virtual stages (forward outputs and input gradients, indexed [virtual_stage * m + mb]).
struct Run {
  const StepCosts& costs;
  const Schedule& schedule;
  bool zero3 = false;
  double reduce_rate = 1, zero3_rate = 1, param_gather_rate = 1;  // overlap_cost_rate per dp kind
  double send_rate = 1;  // compute time a p2p send takes from its sender, per second of transfer
  std::vector<StageState> stages;
  std::vector<Handoff> activations;  // forward output of virtual stage k, at stage k+1
  std::vector<Handoff> gradients;    // input gradient of virtual stage k, at stage k-1
};

void emit(StageState& st, Event e) {
  if (st.record && e.end > e.start) st.events.push_back(e);
}

// Queues `duration` of work on the stage's dp stream at `issue`; returns when it ends. Gradient
// buckets of the same (micro-batch, chunk) that follow each other without a gap become one event.
Seconds dp_issue(StageState& st, int stage, Seconds issue, Seconds duration, double rate, EventKind kind, int mb,
                 int chunk) {
  const Seconds start = std::max(issue, st.dp_free);
  const Seconds end = start + duration;
  st.dp_free = end;
  st.usage.dp_busy += duration;
  if (duration <= 0) return end;
  st.dp_spans.push_back({start, end, rate});
  if (!st.record) return end;
  if (st.last_dp_event >= 0) {
    Event& last = st.events[static_cast<std::size_t>(st.last_dp_event)];
    if (last.kind == kind && (kind == EventKind::grad_reduce || kind == EventKind::ps_push_pull) &&
        last.micro_batch == mb && last.chunk == chunk &&
        last.end == start) {
      last.end = end;
      return end;
    }
  }
  st.last_dp_event = static_cast<std::ptrdiff_t>(st.events.size());
  st.events.push_back({stage, Stream::dp, kind, mb, chunk, start, end});
  return end;
}

// The input a slot waits for, or nullptr when it has none (first forward, last backward).
const Handoff* input_of(const Run& r, const Slot& slot, int vstage) {
  if (slot.phase == Phase::backward_weight) return nullptr;  // needs only this stage's own backward
  const int m = r.schedule.micro_batches;
  const int last = r.schedule.virtual_stages() - 1;
  if (slot.phase == Phase::forward) return vstage == 0 ? nullptr : &r.activations[(vstage - 1) * m + slot.micro_batch];
  return vstage == last ? nullptr : &r.gradients[(vstage + 1) * m + slot.micro_batch];
}

// Sends a slot's output to the stage that consumes it; returns that stage (or -1: no consumer).
int send_output(Run& r, int stage, const Slot& slot, int vstage, Seconds produced) {
  const int p = r.schedule.stages, m = r.schedule.micro_batches;
  if (slot.phase == Phase::backward_weight) return -1;
  const bool fwd = slot.phase == Phase::forward;
  const int target = fwd ? vstage + 1 : vstage - 1;
  if (target < 0 || target >= r.schedule.virtual_stages()) return -1;
  Handoff& h = (fwd ? r.activations : r.gradients)[vstage * m + slot.micro_batch];
  h.produced = produced;
  const int target_stage = target % p;
  if (target_stage == stage) {  // next chunk on the same GPU: no transfer
    h.arrived = produced;
    return target_stage;
  }
  StageState& st = r.stages[stage];
  Seconds& free = fwd ? st.fwd_send_free : st.bwd_send_free;
  const Seconds start = std::max(produced, free);
  free = start + r.costs.p2p;
  h.arrived = free;
  st.usage.pp_busy += r.costs.p2p;
  const std::size_t before = st.events.size();
  emit(st, {stage, fwd ? Stream::pp_forward : Stream::pp_backward,
            fwd ? EventKind::send_activation : EventKind::send_gradient, slot.micro_batch, slot.chunk, start, free});
  if (st.events.size() > before) {
    h.send_stage = stage;
    h.send_event = static_cast<std::ptrdiff_t>(before);
  }
  return target_stage;
}

// Gradient reduction of the chunk of the slot that produces weight gradients (the backward, or
// the weight-gradient slot of a split backward): per micro-batch (ZeRO 2/3) or after the chunk's
// last one (ZeRO 0/1), in per-layer buckets that become ready evenly over the slot. A once-a-step
// reduction the stack does not overlap at all (rate 1: Megatron-LM 2021's all-reduce after the
// last backward) starts when the slot has ended, so it holds up neither the slot's kernels nor the
// gradient it sends down the pipeline; compose charges it in full either way.
void reduce_gradients(Run& r, int stage, const Slot& slot, const ChunkCost& c, Seconds start, Seconds end) {
  StageState& st = r.stages[stage];
  const int done = ++st.backwards[slot.chunk];
  if (!r.costs.zero.reduce_each_micro_batch && done < r.schedule.micro_batches) return;
  if (c.dp_reduce <= 0) return;
  const int buckets = std::max(1, c.layers);
  const bool after_slot = !r.costs.zero.reduce_each_micro_batch && r.reduce_rate >= 1;
  for (int j = 0; j < buckets; ++j) {
    const Seconds ready = after_slot ? end : start + (end - start) * (j + 1) / buckets;
    dp_issue(st, stage, ready, c.dp_reduce / buckets, r.reduce_rate,
             r.costs.ps_servers > 0 ? EventKind::ps_push_pull : EventKind::grad_reduce, slot.micro_batch, slot.chunk);
  }
}

// ZeRO-3: issues, at `start`, the parameter gather of `slot` (chunk costs `c`). A slot gathers its
// own chunk's parameters as it starts, layer by layer ahead of the kernels that use them (FSDP
// prefetches the next unit), so the gather overlaps the slot it serves, which cannot end before
// it: compose's exposed_comm(gather, forward or backward).
void issue_gather(Run& r, int stage, const Slot& slot, const ChunkCost& c, Seconds start) {
  if (!r.zero3) return;
  // A weight gradient needs the layer inputs and output gradients, not the parameters.
  const double gathers = slot.phase == Phase::backward_weight ? 0.0
                         : slot.phase == Phase::backward      ? r.costs.zero3_backward_gathers
                                                              : 1.0;
  const Seconds gather = gathers * c.zero3_gather;
  StageState& st = r.stages[stage];
  st.gather_done = dp_issue(st, stage, start, gather, r.zero3_rate, EventKind::zero3_gather, slot.micro_batch, slot.chunk);
}

// After the last slot: wait for the reductions, then the optimizer step. (The ZeRO-1/2 all-gather
// of the updated parameters runs at the start of the next step: see simulate().)
void finish_stage(Run& r, int stage) {
  StageState& st = r.stages[stage];
  const Seconds opt_start = std::max(st.compute_free, st.dp_free);
  st.usage.wait_dp += opt_start - st.compute_free;
  st.compute_free = opt_start + r.costs.optimizer;
  st.usage.optimizer += r.costs.optimizer;
  if (r.costs.ps_servers > 0) {
    const Seconds update_start = opt_start + r.costs.compression;
    emit(st, {stage, Stream::compute, EventKind::optimizer, -1, -1, opt_start, update_start});
    emit(st, {stage, Stream::ps_server, EventKind::ps_update, -1, -1, update_start, st.compute_free});
  } else {
    emit(st, {stage, Stream::compute, EventKind::optimizer, -1, -1, opt_start, st.compute_free});
  }
  st.usage.end = std::max(st.dp_free, st.compute_free);
  st.usage.after_optimizer = st.usage.end - st.compute_free;
  st.finished = true;
}

// When `work` seconds of kernels started at `start` end, given the dp-stream collectives in
// flight: while a collective runs the compute stream advances at 1 - rate (rate 1, a stack that
// overlaps nothing: it waits for the collective), at full speed otherwise. The same model as
// exposed_comm (predict.hpp), so the engines agree: a collective of C seconds over W seconds of
// kernels costs rate x C, or C - W where the collective outlasts the kernels.
Seconds finish_under_dp(StageState& st, Seconds start, Seconds work) {
  while (st.dp_scan < st.dp_spans.size() && st.dp_spans[st.dp_scan].end <= start) ++st.dp_scan;
  Seconds t = start, left = work;
  for (std::size_t k = st.dp_scan; k < st.dp_spans.size() && left > 0; ++k) {
    const DpSpan& d = st.dp_spans[k];
    if (d.start >= t + left) break;  // the kernels end before this collective starts
    if (d.start > t) {
      left -= d.start - t;
      t = d.start;
    }
    const double speed = 1 - d.rate;
    const Seconds span = std::max(0.0, d.end - t);
    if (speed > 0 && speed * span >= left) return t + left / speed;
    left -= speed * span;
    t += span;
  }
  return t + left;
}

// A pass of compute (TP and CP inside) from `start` to `compute_end` with the chunk's expert part
// `experts` and exposed all-to-all `ep`: the work before the experts, the dispatch (or, backward,
// the combine's gradient) on the ep stream, the experts, then the other all-to-all; the compute
// stream waits for each. Returns the end; emits the events as `kind` on the compute stream.
Seconds run_pass(StageState& st, int stage, const Slot& slot, EventKind kind, Seconds start, Seconds compute_end,
                 Seconds experts, Seconds ep) {
  if (ep <= 0) {
    emit(st, {stage, Stream::compute, kind, slot.micro_batch, slot.chunk, start, compute_end});
    return compute_end;
  }
  const Seconds work = compute_end - start;
  const bool fwd = kind == EventKind::forward;
  const Seconds before = std::max(0.0, work - experts), half = 0.5 * ep;
  Seconds t = start + before;
  emit(st, {stage, Stream::compute, kind, slot.micro_batch, slot.chunk, start, t});
  emit(st, {stage, Stream::ep, fwd ? EventKind::dispatch : EventKind::combine, slot.micro_batch, slot.chunk, t, t + half});
  t += half;
  emit(st, {stage, Stream::compute, kind, slot.micro_batch, slot.chunk, t, t + (work - before)});
  t += work - before;
  emit(st, {stage, Stream::ep, fwd ? EventKind::combine : EventKind::dispatch, slot.micro_batch, slot.chunk, t, t + half});
  return t + half;
}

// Puts the slot's work on the compute stream from `start`; returns its end.
Seconds run_slot(Run& r, int stage, const Slot& slot, const ChunkCost& c, Seconds start) {
  StageState& st = r.stages[stage];
  StageUsage& u = st.usage;
  const bool split = r.schedule.split_backward;
  const Seconds weight_part = split ? kWeightGradShare * c.backward : 0.0;
  Seconds end = start;
  switch (slot.phase) {
    case Phase::forward:
      end = run_pass(st, stage, slot, EventKind::forward, start, start + c.forward + c.tp_forward + c.cp_forward,
                     c.expert_forward, c.ep_forward);
      u.compute += c.forward;
      u.tp += c.tp_forward;
      u.cp += c.cp_forward;
      u.ep += c.ep_forward;
      break;
    case Phase::backward: {
      const Seconds bwd_start = start + c.recompute;
      u.recompute += c.recompute;
      u.compute += c.backward - weight_part;
      u.tp += c.tp_backward;
      u.cp += c.cp_backward;
      u.ep += c.ep_backward;
      emit(st, {stage, Stream::compute, EventKind::recompute, slot.micro_batch, slot.chunk, start, bwd_start});
      end = run_pass(st, stage, slot, EventKind::backward, bwd_start,
                     bwd_start + (c.backward - weight_part) + c.tp_backward + c.cp_backward,
                     (1 - (split ? kWeightGradShare : 0.0)) * c.expert_backward, c.ep_backward);
      if (!split) reduce_gradients(r, stage, slot, c, start, end);
      break;
    }
    case Phase::backward_weight:
      TRAINPLAN_CHECK(split, "weight-gradient slot in a schedule without split backward");
      end = start + weight_part;
      u.compute += weight_part;
      emit(st, {stage, Stream::compute, EventKind::backward_weight, slot.micro_batch, slot.chunk, start, end});
      reduce_gradients(r, stage, slot, c, start, end);
      break;
  }
  return end;
}

struct Advance {
  bool advanced = false;
  int wake = -1;  // stage whose next slot may now be ready
};

// The slot's compute ends at `end` rather than when its kernels did: its last compute event is
// stretched to it (events from `first_event` on are the slot's).
void stretch_slot(StageState& st, std::size_t first_event, Seconds end) {
  for (std::size_t k = st.events.size(); k-- > first_event;) {
    if (st.events[k].stream == Stream::compute) {
      st.events[k].end = end;
      return;
    }
  }
}

// Links the slot's first compute event (a gather may have been queued before it; dp events are
// skipped) to the send that delivered its input.
void link_input(StageState& st, std::size_t first_event, const Handoff& in) {
  for (std::size_t k = first_event; k < st.events.size(); ++k) {
    if (st.events[k].stream == Stream::compute) {
      st.links.push_back({k, in.send_stage, in.send_event});
      return;
    }
  }
}

// Runs `slot` (chunk costs `c`) from `start` and returns when it ends: its kernels, slowed by the
// collectives overlapping it (the share the stack cannot hide, plus contention), and not before
// the parameters it uses are there: the previous step's ZeRO-1/2 all-gather for a forward, its
// own ZeRO-3 gather (none for a weight-gradient slot).
Seconds run_and_wait(Run& r, int stage, const Slot& slot, const ChunkCost& c, Seconds start) {
  StageState& st = r.stages[stage];
  issue_gather(r, stage, slot, c, start);
  const std::size_t first_event = st.events.size();
  const Seconds kernels_end = run_slot(r, stage, slot, c, start);
  const Seconds slowed = finish_under_dp(st, start, kernels_end - start);
  Seconds end = slot.phase == Phase::forward ? std::max(slowed, st.params_ready) : slowed;
  if (r.zero3) end = std::max(end, st.gather_done);
  st.usage.dp_interference += slowed - kernels_end;
  st.usage.wait_dp += end - slowed;
  if (end > kernels_end) stretch_slot(st, first_event, end);
  return end;
}

// Runs the stage's next slot if its input is there (or finishes the stage after its last slot).
Advance advance(Run& r, int stage) {
  StageState& st = r.stages[stage];
  const auto& slots = r.schedule.per_stage[stage];
  if (st.finished) return {};
  if (st.cursor == slots.size()) {
    finish_stage(r, stage);
    return {true, -1};
  }
  const Slot& slot = slots[st.cursor];
  const int vstage = r.schedule.virtual_stage(stage, slot.chunk);
  const Handoff* in = input_of(r, slot, vstage);
  if (in && in->arrived == kUnknown) return {};

  // Attribute the compute stream's idle time before the slot: waiting for the producer's
  // compute (bubble), then for the transfer (pp). (Waiting for parameters comes at its end: dp.)
  const Seconds free = st.compute_free;
  const Seconds t1 = in ? std::max(free, in->produced) : free;
  const Seconds start = in ? std::max(t1, in->arrived) : t1;
  st.usage.wait_bubble += t1 - free;
  st.usage.wait_pp += start - t1;
  const std::size_t first_event = st.events.size();
  const Seconds end = run_and_wait(r, stage, slot, r.costs.chunks[vstage], start);
  st.compute_free = end;
  if (in && in->send_event >= 0) link_input(st, first_event, *in);
  ++st.cursor;
  const int target = send_output(r, stage, slot, vstage, end);
  if (target >= 0 && target != stage) {
    // The share of the send the stack does not overlap holds the sender's compute stream.
    const Seconds held = r.send_rate * r.costs.p2p;
    st.compute_free += held;
    st.usage.wait_pp += held;
  }
  return {true, target};
}

void check_inputs(const StepCosts& costs, const Schedule& schedule) {
  TRAINPLAN_CHECK(static_cast<int>(schedule.per_stage.size()) == schedule.stages, "schedule has one slot list per stage");
  TRAINPLAN_CHECK(static_cast<int>(costs.chunks.size()) == schedule.virtual_stages(),
                  "step costs need one chunk per virtual stage of the schedule");
  for (int k = 0; k < schedule.virtual_stages(); ++k) {
    const ChunkCost& c = costs.chunks[k];
    TRAINPLAN_CHECK(c.stage == k % schedule.stages && c.chunk == k / schedule.stages,
                    "step costs must be ordered by virtual stage (chunks[chunk * pp + stage])");
  }
  for (const auto& slots : schedule.per_stage) {
    for (const Slot& s : slots) {
      TRAINPLAN_CHECK(s.micro_batch >= 0 && s.micro_batch < schedule.micro_batches && s.chunk >= 0 &&
                          s.chunk < schedule.chunks,
                      "schedule slot out of range");
    }
  }
}

}  // namespace

namespace {

// A run's initial state: every stage idle at 0 with its schedule's chunk counts, the overlap rate
// of each kind of dp collective, and the previous step's ZeRO-1/2 all-gather of the updated
// parameters already issued: in steady state it runs under this step's first forward (Megatron
// --overlap-param-gather), at the stack's overlap share.
Run start_run(const StepCosts& costs, const Schedule& schedule, Record record) {
  const int p = schedule.stages;
  const std::size_t handoffs = static_cast<std::size_t>(schedule.virtual_stages()) * schedule.micro_batches;
  Run r{costs, schedule, false, 1, 1, 1, 1, std::vector<StageState>(p), std::vector<Handoff>(handoffs),
        std::vector<Handoff>(handoffs)};
  r.zero3 = std::any_of(costs.chunks.begin(), costs.chunks.end(), [](const ChunkCost& c) { return c.zero3_gather > 0; });
  r.zero3_rate = costs.overlap_cost_rate(costs.overlap.zero3);
  r.reduce_rate = r.zero3 ? r.zero3_rate : costs.overlap_cost_rate(costs.overlap.dp);
  r.param_gather_rate = costs.overlap_cost_rate(costs.overlap.param_gather);
  r.send_rate = costs.overlap_cost_rate(costs.pp_overlap);
  for (int i = 0; i < p; ++i) {
    StageState& st = r.stages[i];
    st.backwards.assign(schedule.chunks, 0);
    st.usage.stage = i;
    st.record = record == Record::events;
    if (st.record) st.events.reserve(schedule.per_stage[i].size() * 3 + 8);
    st.params_ready = dp_issue(st, i, 0.0, costs.dp_param_gather, r.param_gather_rate, EventKind::param_gather, -1, -1);
  }
  return r;
}

// Advances the stages until none can. A work list of stages that may be able to advance: each
// stage only uses its own streams, so the result does not depend on the order stages are visited;
// every visit either runs a slot or stops, and a stage is only re-queued when a slot it waits for
// may have finished: O(slots).
void run_stages(Run& r) {
  const int p = r.schedule.stages;
  std::vector<int> work(p);
  std::vector<char> queued(p, 1);
  for (int i = 0; i < p; ++i) work[i] = p - 1 - i;
  while (!work.empty()) {
    const int s = work.back();
    work.pop_back();
    queued[s] = 0;
    for (Advance a = advance(r, s); a.advanced; a = advance(r, s)) {
      if (a.wake >= 0 && a.wake != s && !queued[a.wake]) {
        queued[a.wake] = 1;
        work.push_back(a.wake);
      }
    }
  }
}

// The timeline of a finished run: the stages' events in stage order, their usage, the step (the
// latest end), and each slot's input send as an index into the merged events.
Timeline collect(Run& r) {
  const int p = r.schedule.stages;
  Timeline t;
  t.ps_servers = r.costs.ps_servers;
  std::size_t total = 0;
  for (const auto& st : r.stages) total += st.events.size();
  t.events.reserve(total);
  std::vector<std::ptrdiff_t> offset(p, 0);
  for (int i = 0; i < p; ++i) {
    StageState& st = r.stages[i];
    TRAINPLAN_CHECK(st.finished, "pipeline schedule deadlocks: a slot waits for an input that is never produced");
    offset[i] = static_cast<std::ptrdiff_t>(t.events.size());
    t.events.insert(t.events.end(), st.events.begin(), st.events.end());
    t.stages.push_back(st.usage);
    t.step = std::max(t.step, st.usage.end);
  }
  for (int i = 0; i < p; ++i) {
    for (const InputLink& l : r.stages[i].links) {
      t.events[static_cast<std::size_t>(offset[i]) + l.event].input_send = offset[l.send_stage] + l.send_event;
    }
  }
  return t;
}

}  // namespace

Timeline simulate(const StepCosts& costs, const Schedule& schedule, Record record) {
  check_inputs(costs, schedule);
  Run r = start_run(costs, schedule, record);
  run_stages(r);
  return collect(r);
}

std::vector<std::vector<int>> replica_stage_ranks(const Strategy& s) {
  const RankLayout layout(s);
  std::vector<std::vector<int>> out(s.pp);
  for (int i = 0; i < s.pp; ++i) {
    RankCoord c;
    c.pp = i;
    out[i] = layout.group(layout.rank(c), {Dim::tp, Dim::cp});
  }
  return out;
}

TimeBreakdown simulated_breakdown(const Timeline& t) {
  TRAINPLAN_CHECK(!t.stages.empty(), "timeline without stages");
  const auto busiest = std::max_element(t.stages.begin(), t.stages.end(),
                                        [](const StageUsage& a, const StageUsage& b) { return a.busy() < b.busy(); });
  const StageUsage& u = *busiest;
  TimeBreakdown b;
  b.step = t.step;
  b.compute = u.compute;
  b.recompute = u.recompute;
  b.tp_comm = u.tp;
  b.cp_comm = u.cp;
  b.ep_comm = u.ep;
  b.pp_comm = u.wait_pp;
  b.optimizer = u.optimizer;
  b.dp_comm_exposed = u.wait_dp + u.after_optimizer + u.dp_interference;
  for (const auto& s : t.stages) b.dp_comm = std::max(b.dp_comm, s.dp_busy);
  b.bubble = t.step - (b.compute + b.recompute + b.tp_comm + b.cp_comm + b.pp_comm + b.optimizer + b.dp_comm_exposed);
  if (b.ep_comm > 0) b.bubble -= b.ep_comm;  // (apart: a dense model's figures keep their bits)
  // The busiest stage can finish last with no wait at all; then the difference above is rounding.
  TRAINPLAN_CHECK(b.bubble > -1e-9 * t.step, "simulated stage work exceeds the step");
  if (b.bubble < 1e-12 * t.step) b.bubble = 0;
  return b;
}

Estimate refine_with_simulation(const Estimate& analytic, const Timeline& timeline) {
  Estimate e = analytic;
  const Seconds old_step = analytic.time.step;
  e.time = simulated_breakdown(timeline);
  if (old_step > 0 && e.time.step > 0) {
    // Same tokens and FLOPs per step, so every rate scales with 1 / step.
    const double f = old_step / e.time.step;
    Throughput& tp = e.throughput;
    tp.tokens_per_s *= f;
    tp.tokens_per_s_per_gpu *= f;
    tp.model_tflops_per_gpu *= f;
    tp.hardware_tflops_per_gpu *= f;
    tp.mfu *= f;
    tp.mfu_full_attention *= f;
    tp.hfu *= f;
    e.ps.updates_per_s *= f;
  }
  return e;
}

Estimate refine_with_simulation(const Estimate& analytic, const StepCosts& costs, const Schedule& schedule) {
  if (!(analytic.time.step > 0) || !std::isfinite(analytic.time.step)) return analytic;
  return refine_with_simulation(analytic, simulate(costs, schedule, Record::usage));
}

long long simulated_slots(const Strategy& s) {
  // slots = 2 x pp x vp x micro-batches, in 64 bits (each factor fits an int, the product may not).
  if (s.dp < 1 || s.micro_batch < 1) return 0;  // an invalid strategy; validate() names it
  return 2LL * s.pp * s.vp * (s.global_batch / (static_cast<long long>(s.dp) * s.micro_batch));
}

std::optional<std::string> simulation_size_error(const Strategy& s) {
  const long long slots = simulated_slots(s);
  if (slots <= kMaxSimulatedSlots) return std::nullopt;
  return fmt::format(
      "--global-batch {}: the step simulator would run {} schedule slots (2 x pp x vp x micro-batches = 2 x {} x {} x "
      "{}), more than its bound of {}; lower --global-batch or raise --micro-batch / --dp, or use the closed form "
      "(predict --engine analytic, search --refine off)",
      s.global_batch, slots, s.pp, s.vp, s.global_batch / (static_cast<long long>(s.dp) * s.micro_batch),
      kMaxSimulatedSlots);
}

Estimate predict_with_simulation(const LayerGraph& graph, const Cluster& cluster, const Software& software,
                                 const Strategy& strategy) {
  if (auto too_large = simulation_size_error(strategy)) throw InputError(*too_large);
  if (cannot_cost(graph, cluster, strategy)) return predict(graph, cluster, software, strategy);
  const PlanShape shape(graph.model(), cluster, software, strategy);
  StepCosts costs;
  step_costs(graph, cluster, software, shape, layer_costs(graph, cluster, software, shape), costs);
  const Estimate analytic = compose(costs, graph, cluster, strategy);
  if (!(analytic.time.step > 0) || !std::isfinite(analytic.time.step)) return analytic;
  return refine_with_simulation(analytic, costs, schedule_for(strategy));
}

}  // namespace trainplan
