// Console summary of a measurement (see measurement_console.hpp).
#include "reports/measurement_console.hpp"

#include <fmt/format.h>

namespace trainplan {

void print_measurement(std::ostream& os, const Measurement& m) {
  os << fmt::format("trainplan exec: {} · {} · {} ranks · backend {} on {}\n", m.model, describe(m.strategy),
                    m.strategy.gpus(), m.backend, m.device);
  os << fmt::format("{:>6} {:>12} {:>12}\n", "step", "loss", "wall_ms");
  for (const auto& s : m.per_step) os << fmt::format("{:>6} {:>12.6f} {:>12.3f}\n", s.step, s.loss, s.wall * 1e3);
  os << fmt::format("step time: median {:.3f} ms, mean {:.3f} ms, stdev {:.3f} ms over {} steps ({} warm-up discarded)\n",
                    m.step_time.median * 1e3, m.step_time.mean * 1e3, m.step_time.stdev * 1e3, m.steps, m.warmup);
  const PhaseTimes& b = m.breakdown;
  os << fmt::format(
      "phases (ms, busiest rank, median): forward {:.2f}  backward {:.2f}  recompute {:.2f}  tp {:.2f}  pp {:.2f}  "
      "dp {:.2f} (exposed {:.2f})  bubble {:.2f}  optimizer {:.2f}  other {:.2f}\n",
      b.forward * 1e3, b.backward * 1e3, b.recompute * 1e3, b.tp_comm * 1e3, b.pp_comm * 1e3, b.dp_comm * 1e3,
      b.dp_comm_exposed * 1e3, b.bubble * 1e3, b.optimizer * 1e3, b.other * 1e3);
  for (const auto& st : m.per_stage) os << fmt::format("peak memory, stage {}: {:.1f} MiB\n", st.stage, st.peak / 1048576.0);
  os << fmt::format("throughput: {:.0f} tokens/s ({:.0f} per rank)\n", m.throughput.tokens_per_s,
                    m.throughput.tokens_per_s_per_gpu);
}

}  // namespace trainplan
