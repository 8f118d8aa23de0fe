// What the validation tests of published Megatron-Bridge rows share: a row's layout as its data
// file writes it, in trainplan's flag spelling ("flags": {"tp", "pp", ..., "dtype"}), and the
// memory verdict such a row may get.
#pragma once
#include <nlohmann/json.hpp>

#include "sim/estimate.hpp"
#include "sim/strategy.hpp"

namespace trainplan::testing {

// The layout of `f`: every dense key required; the expert keys ("ep", "etp", "moe-dispatcher",
// "moe-a2a-overlap", "recompute-modules"), "pipeline-accounts", "cuda-graphs" and
// "cuda-graph-modules" where the row states them.
inline Strategy strategy_from_flags(const nlohmann::json& f) {
  Strategy s;
  s.tp = f.at("tp");
  s.pp = f.at("pp");
  s.dp = f.at("dp");
  s.cp = f.at("cp");
  s.vp = f.at("vp");
  s.zero = f.at("zero");
  s.micro_batch = f.at("micro-batch");
  s.global_batch = f.at("global-batch");
  s.seq_len = f.at("seq");
  s.recompute = *parse_recompute(f.at("recompute").get<std::string>());
  s.sequence_parallel = f.at("sequence-parallel") == "on";
  s.schedule = *parse_schedule(f.at("schedule").get<std::string>());
  s.dtype = *parse_dtype(f.at("dtype").get<std::string>());
  s.ep = f.value("ep", 1);
  s.etp = f.value("etp", 1);
  if (f.contains("moe-dispatcher")) s.dispatcher = *parse_dispatcher(f.at("moe-dispatcher").get<std::string>());
  s.moe_a2a_overlap = f.value("moe-a2a-overlap", "off") == "on";
  if (f.contains("recompute-modules"))
    s.recompute_modules = *parse_recompute_modules(f.at("recompute-modules").get<std::string>());
  if (f.contains("pipeline-accounts")) s.pipeline_accounts = *parse_pipeline_accounts(f.at("pipeline-accounts"));
  if (f.contains("cuda-graphs")) s.cuda_graphs = *parse_cuda_graphs(f.at("cuda-graphs").get<std::string>());
  if (f.contains("cuda-graph-modules"))
    s.cuda_graph_modules = parse_cuda_graph_modules(f.at("cuda-graph-modules").get<std::string>()).value();
  return s;
}

// Whether every reason the estimate is infeasible is memory.
inline bool only_out_of_memory(const Estimate& e) {
  for (const Infeasible& i : e.infeasible)
    if (i.reason != InfeasibleReason::out_of_memory) return false;
  return !e.infeasible.empty();
}

}  // namespace trainplan::testing
