// Timeline -> Chrome trace event format (the JSON that Perfetto and chrome://tracing open).
// Formatting only: every figure comes from the Timeline. (The timeline as trainplan/prediction/v1's
// "simulation" object, timeline_summary_json and timeline_events_json, is
// reports/simulation_json.hpp.)
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

#include "reports/simulation_json.hpp"
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

}  // namespace trainplan
