// trainplan/measurement/v1: what `trainplan exec --json` writes and `trainplan compare` reads.
// Bytes and seconds throughout; time and throughput keys match trainplan/prediction/v1.
//
// {"schema": "trainplan/measurement/v1", "status": "ok",
//  "strategy": {...same object as the prediction's, its dtype the one run...}, "model", "cluster",
//  "software" (the profile describing the run, where known), "executor" (trainplan exec's
//  memory-behaviour fingerprint, exec/exec.hpp; absent in files written before it),
//  "run": {"backend", "device", "warmup_steps", "measured_steps", "seed",
//          "requested_dtype" (only where the plan asked for another dtype: CPU runs compute fp32)},
//  "environment": {...free-form: devices, backend, torch version, hostname...},
//  "steps": [{"step", "wall_s", "loss", "phases": PHASES}],
//  "step_time": {"median_s", "mean_s", "stdev_s", "min_s", "max_s", "count"},
//  "time": {"step_s" (= step_time.median_s), PHASES...},
//  "memory": {"peak_bytes", "per_stage": [{"stage", "peak_bytes"}],
//             "per_rank": [{"rank", "coords": {"tp", "cp", "dp", "pp"}, "peak_allocated_bytes",
//                           "peak_reserved_bytes", "max_rss_bytes", "peak_bytes",
//                           "dp_bytes_sent_per_step", "phases": PHASES}]},
//  "throughput": {"tokens_per_s", "tokens_per_s_per_gpu", "model_flops_per_step",
//                 "model_tflops_per_gpu"},
//  "dp_bytes_sent_per_step" (the largest per_rank figure)}
// PHASES = {"compute_s" (= forward_s + backward_s), "forward_s", "backward_s", "recompute_s",
//           "tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s", "dp_comm_exposed_s", "bubble_s",
//           "optimizer_s", "other_s"}
//
// A failed run writes {"schema", "status": "failed", "strategy", "model", "cluster", "executor", "run":
// {"backend", "device", "warmup_steps", "seed", "requested_dtype" (as above)}, "environment",
// "failure": {"rank", "step", "phase", "error", "memory": {"allocated_bytes", "reserved_bytes",
// "capacity_bytes", "rss_bytes"}}}; rank, step and the memory figures are null where not known.
// A successful run's steps are numbered from warmup_steps on, step_time.count is measured_steps,
// per_rank lists the ranks in order (coords inside the strategy's sizes), per_stage one entry per
// pipeline stage in order (the largest peak of its ranks) and memory.peak_bytes the largest of them.
// Files written before "status" existed are successful runs; before per-rank DP traffic was
// recorded they lack "dp_bytes_sent_per_step" (read as 0).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "sim/measurement.hpp"

namespace trainplan {

inline constexpr const char* kMeasurementSchema = "trainplan/measurement/v1";

// One measurement document: a run's figures, or (status "failed") its description and failure.
struct MeasurementDoc {
  Measurement measurement;            // failed: strategy, names, run and environment only
  std::optional<RunFailure> failure;  // unknown figures of it are -1
};

nlohmann::json measurement_to_json(const Measurement& m);

// The failed run's document: the run's description from `run` (strategy, model, cluster,
// backend, device, warmup, seed, environment; its figures are ignored) and the failure.
nlohmann::json failed_measurement_to_json(const Measurement& run, const RunFailure& f);

// Strict reader of either status: every key known, required keys present, types and ranges
// checked, derived figures consistent (compute_s = forward_s + backward_s, time.step_s =
// step_time.median_s). Throws InputError naming `file` and the field.
MeasurementDoc measurement_doc_from_json(const nlohmann::json& j, const std::string& file);

// The figures of a successful run (what compare needs); a failed run is refused, naming its error.
Measurement measurement_from_json(const nlohmann::json& j, const std::string& file);

}  // namespace trainplan
