// The "simulation" object of a simulated prediction (trainplan simulate --json, the
// trainplan/prediction/v1 document with "engine": "des"): how each pipeline stage of one
// data-parallel replica spent the simulated step, and with "timeline" every event of it. One
// schema: SimulationDoc, written by simulation_to_json and read back by simulation_from_json.
//
// {"step_s", "events" (count), "stages": [{"stage", "ranks", "busy_s", "idle_s", "busy_share",
//  "compute_s", "recompute_s", "tp_s", "cp_s", "optimizer_s", "wait_bubble_s", "wait_pp_s",
//  "wait_dp_s", "pp_busy_s", "dp_busy_s", "end_s"}],
//  "timeline" (optional): {"stages": [{"stage", "ranks", "stream": [...], "kind": [...],
//                          "micro_batch": [...], "chunk": [...], "start_s": [...], "end_s": [...]}]}}
// The timeline holds, per stage, one column per event field: stream and kind as to_string()
// spells them, micro_batch and chunk -1 where the event has none, 0 <= start_s <= end_s. Every rank
// of "ranks" runs these events.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/json_reader.hpp"
#include "sim/simulate.hpp"

namespace trainplan {

// One stage's use of its compute stream over the step (Timeline::stages, with the derived
// figures busy = StageUsage::busy(), idle = Timeline::idle(), busy_share = Timeline::busy_share()).
struct SimulatedStage {
  int stage = 0;
  std::vector<int> ranks;
  Seconds busy = 0, idle = 0;
  double busy_share = 0;
  Seconds compute = 0, recompute = 0, tp = 0, cp = 0, optimizer = 0;
  Seconds wait_bubble = 0, wait_pp = 0, wait_dp = 0, pp_busy = 0, dp_busy = 0, end = 0;
  Seconds ep = 0;  // exposed expert all-to-all ("ep_s", written where a stage has any)
};

// One stage's events (Event::input_send is not written: -1 when read back).
struct TimelineStage {
  int stage = 0;
  std::vector<int> ranks;
  std::vector<Event> events;
};

struct SimulationDoc {
  Seconds step = 0;
  std::int64_t events = 0;  // events of the whole timeline
  std::vector<SimulatedStage> stages;
  std::optional<std::vector<TimelineStage>> timeline;
};

// `stage_ranks[i]`: the ranks of pipeline stage i (replica_stage_ranks); empty: the stage index.
// With `with_events` every event of `t` goes into the timeline (large: what report's Gantt chart draws).
SimulationDoc simulation_doc(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks, bool with_events);
nlohmann::json simulation_to_json(const SimulationDoc& d);
// Reads the object `o` (a prediction's "simulation"); throws InputError naming file and field.
SimulationDoc simulation_from_json(const JsonObject& o);

// The ranks of each stage: `stage_ranks` when given, else the stage index itself (one process per stage).
std::vector<std::vector<int>> ranks_or_stages(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks);

// The summary part ({"step_s", "stages", "events"}) and the timeline part ({"stages"}) alone.
nlohmann::json timeline_summary_json(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks);
nlohmann::json timeline_events_json(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks);

}  // namespace trainplan
