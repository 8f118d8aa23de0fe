#include "sim/compare.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace trainplan {

std::optional<double> percent_error(std::optional<double> predicted, std::optional<double> measured) {
  if (!predicted || !measured) return std::nullopt;
  if (*measured == 0) return *predicted == 0 ? std::optional<double>(0.0) : std::nullopt;
  if (*predicted == 0) return std::nullopt;  // not predicted (ComparedFigure::error_pct)
  // As a ratio, so that figures near the double range (1e308) give their true error, not inf.
  const double pct = 100.0 * (*predicted / *measured - 1.0);
  return std::isfinite(pct) ? std::optional<double>(pct) : std::nullopt;
}

namespace {

ComparedFigure figure(std::string key, std::string label, std::string unit, std::optional<double> predicted,
                      std::optional<double> measured) {
  ComparedFigure f{std::move(key), std::move(label), std::move(unit), predicted, measured, std::nullopt};
  f.error_pct = percent_error(predicted, measured);
  return f;
}

// Every strategy field whose value differs, as "field: predicted X, measured Y".
std::vector<std::string> strategy_differences(const Strategy& predicted, const Strategy& measured) {
  const nlohmann::json p = to_json(predicted), m = to_json(measured);
  std::vector<std::string> out;
  for (auto it = p.begin(); it != p.end(); ++it) {
    const auto other = m.find(it.key());
    if (other == m.end()) {
      out.push_back(fmt::format("{}: predicted {}, measured (absent)", it.key(), it.value().dump()));
    } else if (*other != it.value()) {
      out.push_back(fmt::format("{}: predicted {}, measured {}", it.key(), it.value().dump(), other->dump()));
    }
  }
  return out;
}

const StageMemory* stage_of(const Estimate& e, int stage) {
  for (const StageMemory& s : e.per_stage)
    if (s.stage == stage) return &s;
  return nullptr;
}

}  // namespace

std::string executor_mismatch(const std::string& software, const std::string& software_executor,
                              const Measurement& measured) {
  if (software.empty() || software != measured.software || software_executor == measured.executor) return "";
  if (measured.executor.empty()) {
    return fmt::format("the measurement names no executor (written before trainplan exec recorded one); the profile "
                       "'{}' describes executor '{}', whose memory and time it predicts",
                       software, software_executor);
  }
  if (software_executor.empty()) {
    return fmt::format("the prediction's profile '{}' names no executor (predicted before profiles recorded one); the "
                       "measurement came from executor '{}'",
                       software, measured.executor);
  }
  return fmt::format("the measurement came from executor '{}', the profile '{}' describes executor '{}': its figures "
                     "predict another program (refit the profile to this executor)",
                     measured.executor, software, software_executor);
}

namespace {

// The strategy differences, and a warning for each way the two sides are not like for like: other
// layouts, models or clusters, or a prediction that says the plan is infeasible.
void note_mismatches(Comparison& c, const Estimate& predicted, const Measurement& measured) {
  c.strategy_differences = strategy_differences(predicted.strategy, measured.strategy);
  c.strategies_match = c.strategy_differences.empty();
  if (!c.strategies_match) {
    c.warnings.push_back(fmt::format("the strategies differ ({}); the figures compare different layouts",
                                     fmt::join(c.strategy_differences, "; ")));
  }
  if (!c.predicted_model.empty() && c.predicted_model != measured.model) {
    c.warnings.push_back(
        fmt::format("the models differ: predicted '{}', measured '{}'", c.predicted_model, measured.model));
  }
  if (!c.predicted_cluster.empty() && c.predicted_cluster != measured.cluster) {
    c.warnings.push_back(
        fmt::format("the clusters differ: predicted '{}', measured '{}'", c.predicted_cluster, measured.cluster));
  }
  if (!predicted.feasible) c.warnings.push_back("the prediction says this plan is infeasible");
}

// The step and each phase of it, predicted against measured.
std::vector<ComparedFigure> time_figures(const TimeBreakdown& t, const Measurement& measured) {
  const PhaseTimes& b = measured.breakdown;
  std::vector<ComparedFigure> out = {
      figure("step_s", "step (median)", "s", t.step, measured.step_time.median),
      figure("compute_s", "compute (fwd+bwd)", "s", t.compute, b.compute()),
      figure("recompute_s", "recompute", "s", t.recompute, b.recompute),
      figure("tp_comm_s", "TP comm", "s", t.tp_comm, b.tp_comm),
      figure("cp_comm_s", "CP comm", "s", t.cp_comm, b.cp_comm),
      figure("pp_comm_s", "PP comm", "s", t.pp_comm, b.pp_comm),
  };
  // Runs with experts: the token all-to-alls' exposed time beside the other communication.
  if (t.ep_comm > 0 || b.ep_comm > 0) out.push_back(figure("ep_comm_s", "EP all-to-all", "s", t.ep_comm, b.ep_comm));
  out.insert(out.end(), {
      figure("dp_comm_s", "DP comm", "s", t.dp_comm, b.dp_comm),
      figure("dp_comm_exposed_s", "DP comm exposed", "s", t.dp_comm_exposed, b.dp_comm_exposed),
      figure("bubble_s", "bubble / idle", "s", t.bubble, b.bubble),
      figure("optimizer_s", "optimizer", "s", t.optimizer, b.optimizer),
      figure("other_s", "other (unattributed)", "s", std::nullopt, b.other),
  });
  return out;
}

// Peak memory predicted against measured: the largest, then per stage (every stage either side
// has), then per measured rank.
// A GPU rank's measured peak is what the CUDA caching allocator reserved, which leaves out the
// runtime reserve (CUDA context, communication buffers): the prediction's reserved bytes are its
// counterpart. A CPU rank's is the process's resident set: the prediction's total.
std::vector<ComparedFigure> memory_figures(const Estimate& predicted, const Measurement& measured) {
  const bool allocator = measured.device == "cuda";
  const char* what = allocator ? " reserved" : "";
  auto held = [allocator](const StageMemory& s) { return allocator ? s.reserved() : s.total(); };
  double peak = allocator ? 0.0 : predicted.peak_memory;
  if (allocator)
    for (const StageMemory& s : predicted.per_stage) peak = std::max(peak, held(s));
  std::vector<ComparedFigure> out;
  out.push_back(figure("peak_bytes", allocator ? "reserved peak (largest)" : "peak (largest rank)", "B", peak,
                       measured.peak_memory));
  for (const StagePeak& s : measured.per_stage) {
    const StageMemory* p = stage_of(predicted, s.stage);
    out.push_back(figure(fmt::format("stage{}_peak_bytes", s.stage), fmt::format("stage {}{}", s.stage, what), "B",
                         p ? std::optional<double>(held(*p)) : std::nullopt, s.peak));
  }
  for (const StageMemory& p : predicted.per_stage) {
    bool seen = false;
    for (const StagePeak& s : measured.per_stage) seen = seen || s.stage == p.stage;
    if (!seen) {
      out.push_back(figure(fmt::format("stage{}_peak_bytes", p.stage), fmt::format("stage {}{}", p.stage, what), "B",
                           held(p), std::nullopt));
    }
  }
  for (const RankMeasurement& r : measured.ranks) {
    const StageMemory* p = stage_of(predicted, r.coords.pp);
    out.push_back(figure(fmt::format("rank{}_peak_bytes", r.rank),
                         fmt::format("rank {} (stage {}){}", r.rank, r.coords.pp, what), "B",
                         p ? std::optional<double>(held(*p)) : std::nullopt, r.peak_bytes()));
  }
  return out;
}

// Tokens/s in all and per GPU, and model TFLOP/s per GPU where the measurement counts model FLOPs.
std::vector<ComparedFigure> throughput_figures(const Throughput& pt, const MeasuredThroughput& mt) {
  const bool have_flops = mt.model_flops_per_step > 0;
  return {
      figure("tokens_per_s", "tokens/s", "tokens/s", pt.tokens_per_s, mt.tokens_per_s),
      figure("tokens_per_s_per_gpu", "tokens/s per GPU", "tokens/s", pt.tokens_per_s_per_gpu, mt.tokens_per_s_per_gpu),
      figure("model_tflops_per_gpu", "model TFLOP/s per GPU", "TFLOP/s", pt.model_tflops_per_gpu,
             have_flops ? std::optional<double>(mt.model_tflops_per_gpu) : std::nullopt),
  };
}

}  // namespace

Comparison compare(const Estimate& predicted, const std::string& predicted_model, const std::string& predicted_cluster,
                   const Measurement& measured) {
  Comparison c;
  c.predicted_model = predicted_model;
  c.measured_model = measured.model;
  c.predicted_cluster = predicted_cluster;
  c.measured_cluster = measured.cluster;
  c.predicted_feasible = predicted.feasible;
  c.strategy = predicted.strategy;
  c.measured_step_time = measured.step_time;
  c.warmup = measured.warmup;
  note_mismatches(c, predicted, measured);
  c.time = time_figures(predicted.time, measured);
  c.memory = memory_figures(predicted, measured);
  c.throughput = throughput_figures(predicted.throughput, measured.throughput);
  return c;
}

}  // namespace trainplan
