// trainplan/capacity/v1: what `trainplan capacity --json` writes and `trainplan report` reads. One
// schema: a CapacityResult (sim/capacity.hpp) with its CapacityContext, written by
// capacity_to_json and read back by capacity_from_json.
//
// {"schema", "model", "tokens", "global_batch", "seq_len", "deadline_days", "budget_usd" (null when
//  not asked), "elapsed_s",
//  "options": [{"cluster", "gpus", "feasible", "price_per_gpu_hour_usd", "price_source" ("cluster
//               file" or "--price"), "power_per_gpu_w",
//               "search": SEARCH_STATS (reports/search_json.hpp),
//               feasible: "days", "hours", "gpu_hours", "cost_usd", "energy_kwh", "layout", "mfu",
//                         "tokens_per_s" (of "best"), "best": prediction/v1,
//                         with failures: "failures": {"job_mtbf_hours", "checkpoint_bytes",
//                           "checkpoint_write_s", "checkpoint_interval_s", "checkpoint_interval_steps",
//                           "restart_s", "failures_per_day", "lost_work_hours_per_day",
//                           "restart_hours_per_day", "checkpoint_hours_per_day", "goodput",
//                           "days", "gpu_hours", "cost_usd", "energy_kwh"},
//                         with --elastic: "elastic": {"gpus", "feasible", and "gpus_used", "layout",
//                           "tokens_per_s", "throughput_share", "resume_s", "best" | "why"},
//               infeasible: "why"}],
//  "cheapest_within_deadline", "fastest_within_budget" (an index into options, null for none),
//  "pareto": [option indices],
//  "ranking": {"rule": "cheapest_within_deadline" | "fastest_within_budget" | "cheapest",
//              "options": [option indices, one per cluster, best first]} (sim/capacity.hpp),
// ("price_source" and "ranking" are always written; a file without them, from before they
// existed, reads as prices from the cluster files and no ranking.)
//  "reliability" (when failures were costed): {"source", "mtbf_gpu_hours",
//                                              "checkpoint_gbps_per_gpu", "restart_minutes"}}
// A failure-aware days, gpu_hours, cost_usd or energy_kwh is null exactly when the option never
// finishes: goodput 0 (restarts and lost work exceed the job's MTBF).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "sim/capacity.hpp"

namespace trainplan {

inline constexpr const char* kCapacitySchema = "trainplan/capacity/v1";

// What was planned, for titles and the JSON header.
struct CapacityContext {
  std::string model;
  double tokens = 0;
  int global_batch = 0, seq_len = 0;
  std::optional<double> deadline_days, budget_usd;
};

struct CapacityDoc {
  CapacityContext context;
  CapacityResult result;
};

nlohmann::json capacity_to_json(const CapacityResult& r, const CapacityContext& ctx);
// Throws InputError naming `file` and the field (an option's layout as "<file>: options[2].best: <field>").
CapacityDoc capacity_from_json(const nlohmann::json& j, const std::string& file);

}  // namespace trainplan
