// Schedule: the order of work of every pipeline stage in one training step, as data.
// The simulator walks it to time a step; the executor (exec/) runs exactly the same slots, so
// predicted and executed steps perform the same work in the same order.
//
// A slot is (phase, micro-batch, chunk). `chunk` is the model chunk held by the stage: with v
// chunks per stage on p stages, chunk c of stage i is virtual stage c*p + i (interleaved 1F1B,
// Narayanan et al. 2021 Sec. 2.2); without interleaving chunk is always 0.
// A forward of (mb, c) on virtual stage k needs the forward output of (mb) from virtual stage k-1;
// a backward needs the input gradient from virtual stage k+1 (the last virtual stage starts it
// from the loss).
#pragma once
#include <string>
#include <vector>

#include "sim/strategy.hpp"

namespace trainplan {

// backward_weight appears only in schedules with split_backward (make_zero_bubble_schedule); there
// `backward` computes the input gradient only and backward_weight the weight gradient of the same
// (micro-batch, chunk). The schedules an executor gets from make_schedule never contain it.
enum class Phase { forward, backward, backward_weight };

struct Slot {
  Phase phase = Phase::forward;
  int micro_batch = 0;
  int chunk = 0;
  bool operator==(const Slot&) const = default;
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int stages = 1;         // p
  int micro_batches = 1;  // m
  int chunks = 1;         // v
  std::vector<std::vector<Slot>> per_stage;  // per_stage[i]: stage i's slots in execution order
  bool split_backward = false;  // zero-bubble: backwards split into input and weight gradients

  int virtual_stages() const { return stages * chunks; }
  // Virtual stage that chunk `c` of pipeline stage `stage` holds.
  int virtual_stage(int stage, int chunk) const { return chunk * stages + stage; }
  // Most micro-batches whose activations stage `stage` holds at once (forwards without backward;
  // with split_backward, without weight-gradient pass: its inputs stay until then).
  int peak_in_flight(int stage) const;
};

// GPipe: all forwards, then all backwards. 1F1B (PipeDream-Flush): stage i runs min(p-i-1, m)
// warm-up forwards, then alternates one forward and one backward, then drains the backwards.
// Interleaved 1F1B: Megatron's order with (p-i-1)*2 + (v-1)*p warm-up forwards; needs m % p == 0.
// Throws std::logic_error on sizes the kind does not support (callers validate first).
Schedule make_schedule(ScheduleKind kind, int stages, int micro_batches, int chunks = 1);

// ZB-H1 of Qi et al. 2024 ("Zero Bubble Pipeline Parallelism", ICLR, Sec. 3.1, Fig. 3 top;
// sail-sg/zero-bubble-pipeline-parallelism, quick ZB-H1 branch): 1F1B's order with each backward
// split into B (input gradient, on the critical path) and W (weight gradient). Stage i runs the
// warm-up forwards of 1F1B, then F, B and W per steady step, but holds back its first i W passes
// and runs them (oldest first) after later Bs and at the end, filling the drain bubble. A stage
// keeps a micro-batch's activations until its W, so every stage holds up to p micro-batches (the
// peak of 1F1B's first stage). With T_F = T_B = T_W the bubble is (p-1)(T_F + T_B - T_W), a third
// of 1F1B's. Returned with kind one_f_one_b, chunks 1 and split_backward set. Not reachable
// through ScheduleKind yet: predict's memory and the executor assume unsplit backwards.
Schedule make_zero_bubble_schedule(int stages, int micro_batches);

// The schedule a strategy runs: make_schedule(s.schedule, s.pp, s.micro_batches(), s.vp). The one
// place sim (simulate) and exec (the trainer) turn a Strategy into its Schedule.
Schedule schedule_for(const Strategy& s);

std::string to_string(const Slot& s);  // e.g. "F3.1" (forward, micro-batch 3, chunk 1); B, W

}  // namespace trainplan
