// Console summary of a measurement (see measurement_console.hpp).
#include "reports/measurement_console.hpp"

#include <fmt/format.h>

#include "reports/console.hpp"

namespace trainplan {

std::string run_dtype(const Measurement& m) {
  // What the runner really computed in (exec writes environment.compute_dtype: CPU runs fp32
  // whatever the plan asks); the plan's dtype where an older file does not say.
  const auto it = m.environment.find("compute_dtype");
  const std::string planned = m.requested_dtype.empty() ? to_string(m.strategy.dtype) : m.requested_dtype;
  if (it == m.environment.end() || !it->is_string()) return planned;
  const std::string ran = it->get<std::string>();
  if (ran.rfind(planned, 0) == 0) return ran;
  return fmt::format("{} (the plan asked for {})", ran, planned);
}

void print_measurement(std::ostream& os, const Measurement& m) {
  const bool cpu = m.device == "cpu";
  const int n = m.strategy.gpus();
  const std::string ranks = fmt::format("{} {}{}", n, cpu ? "CPU rank" : "GPU", n == 1 ? "" : "s");
  os << fmt::format("trainplan exec: {} · {} · {} · backend {} on {} · dtype {}\n", m.model, describe(m.strategy),
                    ranks, m.backend, m.device, run_dtype(m));
  os << fmt::format("{:>6} {:>12} {:>12}\n", "step", "loss", "wall");
  // Measured steps numbered from 1 (the warm-up steps before them are not shown).
  for (std::size_t i = 0; i < m.per_step.size(); ++i) {
    os << fmt::format("{:>6} {:>12.6f} {:>12}\n", i + 1, m.per_step[i].loss, format_seconds(m.per_step[i].wall));
  }
  os << fmt::format("step time: median {}, mean {}, stdev {} over {} measured step{} ({} warm-up discarded)\n",
                    format_seconds(m.step_time.median), format_seconds(m.step_time.mean),
                    format_seconds(m.step_time.stdev), m.steps, m.steps == 1 ? "" : "s", m.warmup);
  const PhaseTimes& b = m.breakdown;
  os << fmt::format(
      "phases (busiest rank, median): forward {}  backward {}  recompute {}  tp {}  pp {}  dp {} (exposed {})  "
      "bubble {}  optimizer {}  other {}\n",
      format_seconds(b.forward), format_seconds(b.backward), format_seconds(b.recompute), format_seconds(b.tp_comm),
      format_seconds(b.pp_comm), format_seconds(b.dp_comm), format_seconds(b.dp_comm_exposed), format_seconds(b.bubble),
      format_seconds(b.optimizer), format_seconds(b.other));
  for (const auto& st : m.per_stage) os << fmt::format("peak memory, stage {}: {}\n", st.stage, format_bytes(st.peak));
  os << fmt::format("throughput: {:.0f} tokens/s ({:.0f} per {})\n", m.throughput.tokens_per_s,
                    m.throughput.tokens_per_s_per_gpu, cpu ? "CPU rank" : "GPU");
}

}  // namespace trainplan
