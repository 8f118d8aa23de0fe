#include "reports/console.hpp"

#include "reports/infeasible.hpp"

#include <fmt/format.h>

#include <cmath>

namespace trainplan {

std::string format_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.1f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{:.0f} B", b);
}

std::string format_seconds(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

void print_prediction(std::ostream& os, const Estimate& e, const std::string& title) {
  const Strategy& s = e.strategy;
  os << title << "\n";
  os << fmt::format("layout: {}  ({} GPUs, {} micro-batches of {} x {} tokens per replica, {}, {} attention)\n",
                    describe(s), s.gpus(), s.micro_batches(), s.micro_batch, s.seq_len, to_string(s.dtype),
                    to_string(s.attention));
  if (!e.feasible) {
    os << "INFEASIBLE:\n";
    for (const auto& r : infeasible_reasons(e)) os << "  - " << r << "\n";
    if (e.per_stage.empty()) return;
  }
  os << fmt::format("\nmemory per GPU (peak {} of {}):\n", format_bytes(e.peak_memory), format_bytes(e.capacity));
  os << fmt::format("  {:>5} {:>6} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "stage",
                    "layers", "weights", "gradients", "optimizer", "activations", "w.copies", "temporary",
                    "other", "allocator", "runtime", "total");
  for (std::size_t i = 0; i < e.per_stage.size(); ++i) {
    const StageMemory& m = e.per_stage[i];
    os << fmt::format("  {:>5} {:>6} {:>10} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
                      m.stage, i < e.stage_layers.size() ? e.stage_layers[i] : 0, format_bytes(m.weights),
                      format_bytes(m.gradients), format_bytes(m.optimizer), format_bytes(m.activations),
                      format_bytes(m.weight_copies), format_bytes(m.temporaries), format_bytes(m.other),
                      format_bytes(m.allocator), format_bytes(m.runtime), format_bytes(m.total()));
  }
  const TimeBreakdown& t = e.time;
  auto row = [&](const char* name, double v) {
    os << fmt::format("  {:<26} {:>12} {:>6.1f}%\n", name, format_seconds(v), t.step > 0 ? 100 * v / t.step : 0.0);
  };
  os << fmt::format("\nstep time {} (busiest pipeline stage):\n", format_seconds(t.step));
  row("compute (fwd+bwd)", t.compute);
  row("recompute", t.recompute);
  row("tensor-parallel comm", t.tp_comm);
  row("context-parallel comm", t.cp_comm);
  row("pipeline send/recv", t.pp_comm);
  row("pipeline bubble", t.bubble);
  row("data-parallel comm exposed", t.dp_comm_exposed);
  row("optimizer", t.optimizer);
  os << fmt::format("  (data-parallel comm total {}, the rest overlapped with backward)\n", format_seconds(t.dp_comm));
  const Throughput& p = e.throughput;
  os << fmt::format("\nthroughput: {:.0f} tokens/s ({:.1f} tokens/s/GPU)\n", p.tokens_per_s, p.tokens_per_s_per_gpu);
  os << fmt::format("per GPU: {:.1f} model TFLOP/s, {:.1f} hardware TFLOP/s; MFU {:.1f}%, HFU {:.1f}%\n",
                    p.model_tflops_per_gpu, p.hardware_tflops_per_gpu, 100 * p.mfu, 100 * p.hfu);
  if (s.uses_ps()) {
    os << fmt::format("parameter servers: {} {} ({}), {} workers; {:.2f} updates/s, expected staleness {:g} updates\n",
                      s.ps_servers, s.ps_placement == PsPlacement::dedicated ? "dedicated" : "colocated",
                      s.dp_algorithm == DpAlgorithm::ps_async ? "asynchronous" : "synchronous", e.ps.workers,
                      e.ps.updates_per_s, e.ps.staleness);
  }
  if (s.grad_compression.kind != CompressionKind::none) {
    os << fmt::format("gradient compression: {} (its kernels are in the optimizer row)\n", to_string(s.grad_compression));
  }
}

}  // namespace trainplan
