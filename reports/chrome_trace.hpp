// Timeline -> Chrome trace event format (the JSON that Perfetto and chrome://tracing open), and a
// small JSON summary of a timeline. Formatting only: every figure comes from the Timeline.
//
// Trace layout: one process per rank (pid = global rank), one thread per stream (tid = Stream
// index + 1), named by "process_name" / "thread_name" metadata events; each timeline event is a
// complete ("X") event with ts and dur in microseconds. All ranks of a pipeline stage (its TP/CP
// ranks) show the stage's events. Flow arrows ("s"/"f" events, cat "p2p") lead from each
// point-to-point send to the slot that waited for it. Format: "Trace Event Format", Google, 2016
// (docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).
#pragma once
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "sim/simulate.hpp"

namespace trainplan {

// Writes the trace to `os` as it goes (a step of a large job has millions of events, so no JSON
// document is built in memory). `stage_ranks[i]`: the ranks that run pipeline stage i (see
// replica_stage_ranks); empty means one process per stage with pid = stage. A rank of -1 is left
// out of the trace (simulate --trace-ranks), keeping the others' positions (flow arrows pair the
// j-th rank of one stage with the j-th of the next). `title` goes into
// the trace's otherData, with the step time.
void write_chrome_trace(std::ostream& os, const Timeline& t, const std::vector<std::vector<int>>& stage_ranks,
                        const std::string& title = "trainplan simulate");

// {"step_s", "stages": [{"stage", "ranks", "busy_s", "idle_s", "busy_share", "compute_s",
//  "recompute_s", "tp_s", "cp_s", "optimizer_s", "wait_bubble_s", "wait_pp_s", "wait_dp_s",
//  "pp_busy_s", "dp_busy_s", "end_s"}], "events"} (events: count).
nlohmann::json timeline_summary_json(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks);

// Every event of the timeline, per pipeline stage, as columns (for trainplan report's Gantt chart):
// {"stages": [{"stage", "ranks", "stream": [...], "kind": [...], "micro_batch": [...],
//  "chunk": [...], "start_s": [...], "end_s": [...]}]}; stream and kind as to_string() spells
// them, micro_batch and chunk -1 where the event has none. Every rank of "ranks" runs these events.
nlohmann::json timeline_events_json(const Timeline& t, const std::vector<std::vector<int>>& stage_ranks);

}  // namespace trainplan
