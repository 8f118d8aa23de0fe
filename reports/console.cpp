#include "reports/console.hpp"

#include "reports/infeasible.hpp"
#include "sim/search.hpp"
#include "sim/check.hpp"

#include <fmt/format.h>

#include <cmath>

namespace trainplan {

std::string format_bytes(double b) {
  const double a = std::fabs(b);  // differences (compare) may be negative
  if (a >= 1e9) return fmt::format("{:.1f} GB", b / 1e9);
  if (a >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  if (a >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{:.0f} B", b);
}

std::string format_seconds(double s) {
  const double a = std::fabs(s);
  if (a == 0) return "0 s";  // as trainplan compare prints it, not "0.0 us"
  if (a >= 1) return fmt::format("{:.3f} s", s);
  if (a >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

std::string format_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string format_usd(double usd) {
  if (usd >= 100) return fmt::format("${:.0f}", usd);
  if (usd >= 1) return fmt::format("${:.2f}", usd);
  return fmt::format("${:.3g}", usd);
}

void print_cost(std::ostream& os, const Estimate& e, const Cluster& cluster) {
  if (!(e.time.step > 0)) return;
  if (cluster.price_per_gpu_hour <= 0) {
    os << fmt::format("cost: unknown (cluster {} gives no price_per_gpu_hour_usd)\n", printable(cluster.name));
    return;
  }
  os << fmt::format("cost: {} per step ({} GPUs x ${:.2f} per GPU-hour x {}; price_per_gpu_hour_usd of cluster file {})\n",
                    format_usd(objective_value(Objective::cost, e, cluster)), e.strategy.gpus(),
                    cluster.price_per_gpu_hour, format_seconds(e.time.step), printable(cluster.name));
}

// A chunk of one layer kind is named by its range ("layers 3-60", with the kind unless it is plain
// dense full attention); a chunk mixing kinds gives each kind's count within the chunk's range
// ("18 moe sliding in 0-35"), as the layers of a kind need not be contiguous.
std::string layer_row_name(const LayerRow& r) {
  switch (r.kind) {
    case LayerRow::Kind::embedding: return "embedding";
    case LayerRow::Kind::head: return r.mtp_layers > 0 ? fmt::format("LM head + {} MTP", r.mtp_layers) : "LM head";
    case LayerRow::Kind::layers: break;
  }
  const int last = r.first_layer + r.chunk_layers - 1;
  if (r.count < r.chunk_layers) return fmt::format("{} {} in {}-{}", r.count, to_string(r.layer_kind), r.first_layer, last);
  const std::string kind = r.layer_kind == LayerKind{} ? "" : fmt::format(" {}", to_string(r.layer_kind));
  if (r.count == 1) return fmt::format("layer {}{}", r.first_layer, kind);
  return fmt::format("layers {}-{}{}", r.first_layer, last, kind);
}

void print_layer_detail(std::ostream& os, const std::vector<StageDetail>& stages) {
  os << "\nper layer (times per micro-batch on one rank; a layer range gives the figures of EACH of its layers;\n"
        "activations are what the layer holds at the stage's peak):\n";
  std::size_t w = 16;  // the name column: as wide as the longest row name
  for (const StageDetail& d : stages)
    for (const LayerRow& r : d.rows) w = std::max(w, layer_row_name(r).size());
  const auto head = fmt::format("  {:<{}} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>11}\n",
                                "", w, "forward", "backward", "recompute", "TP comm", "CP comm", "params", "weights",
                                "gradients", "optimizer", "w.copies", "activations");
  for (const StageDetail& d : stages) {
    os << fmt::format("\nstage {} ({} micro-batch chunk{} in flight at its peak):\n", d.stage, d.chunks_in_flight,
                      d.chunks_in_flight == 1 ? "" : "s");
    os << head;
    for (const LayerRow& r : d.rows) {
      os << fmt::format("  {:<{}} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>11}\n",
                        layer_row_name(r), w, format_seconds(r.forward), format_seconds(r.backward),
                        format_seconds(r.recompute), format_seconds(r.tp_comm), format_seconds(r.cp_comm),
                        format_count(r.params), format_bytes(r.weights), format_bytes(r.gradients),
                        format_bytes(r.optimizer), format_bytes(r.weight_copies), format_bytes(r.activations));
    }
    os << fmt::format("  {:<{}} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "stage total", w, format_seconds(d.forward),
                      format_seconds(d.backward), format_seconds(d.recompute), format_seconds(d.tp_comm),
                      format_seconds(d.cp_comm));
    if (d.working_layer > 0) {
      os << fmt::format("  (full recomputation rebuilds one layer at a time: {} more activations at the peak)\n",
                        format_bytes(d.working_layer));
    }
  }
}

namespace {

// Out of memory: which part fills the fullest stage that does not fit, and the flags that shrink
// that part (those the layout does not already use), so a reader knows where to start; search
// ranks the layouts that fit.
std::string memory_hint(const Estimate& e) {
  const Infeasible* oom = nullptr;
  for (const Infeasible& why : e.infeasible)
    if (why.reason == InfeasibleReason::out_of_memory && (!oom || why.needed > oom->needed)) oom = &why;
  if (!oom || oom->stage < 0 || static_cast<std::size_t>(oom->stage) >= e.per_stage.size()) return "";
  const StageMemory& m = e.per_stage[static_cast<std::size_t>(oom->stage)];
  const Strategy& s = e.strategy;
  const Bytes states = m.weights + m.gradients + m.weight_copies;
  std::vector<std::string> fixes;
  std::string part;
  if (m.activations >= states && m.activations >= m.optimizer) {
    part = fmt::format("activations ({})", format_bytes(m.activations));
    if (s.recompute != Recompute::full) fixes.push_back("--recompute selective or full");
    if (s.micro_batch > 1) fixes.push_back("a smaller --micro-batch");
    if (s.tp > 1 && !s.sequence_parallel) fixes.push_back("--sequence-parallel on");
    fixes.push_back("more --tp, --pp or --cp");
  } else if (m.optimizer >= states) {
    part = fmt::format("optimizer states ({})", format_bytes(m.optimizer));
    if (s.zero == 0 && s.dp > 1) fixes.push_back(fmt::format("--zero 1 (shards them over the {} data-parallel ranks)", s.dp));
    fixes.push_back(s.zero > 0 ? "more --dp, --tp or --pp" : "more --tp or --pp");
  } else {
    part = fmt::format("weights and gradients ({})", format_bytes(states));
    if (s.zero < 3 && s.dp > 1) fixes.push_back(s.zero < 2 ? "--zero 2 (gradients) or 3 (weights too)" : "--zero 3");
    fixes.push_back("more --tp or --pp");
  }
  std::string list;
  for (const std::string& f : fixes) list += (list.empty() ? "" : "; ") + f;
  return fmt::format("hint: the largest part of stage {} is its {}; to reduce that part: {}. `trainplan search` with the "
                     "same model, cluster and batch ranks the layouts that fit\n", oom->stage, part, list);
}

// Memory per stage, part by part, under the peak of the fullest stage.
void print_memory_table(std::ostream& os, const Estimate& e) {
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
}

// The step time and its parts, each with its share of the step.
void print_step_time(std::ostream& os, const TimeBreakdown& t) {
  auto row = [&](const char* name, double v) {
    os << fmt::format("  {:<26} {:>12} {:>6.1f}%\n", name, format_seconds(v), t.step > 0 ? 100 * v / t.step : 0.0);
  };
  os << fmt::format("\nstep time {} (busiest pipeline stage):\n", format_seconds(t.step));
  row("compute (fwd+bwd)", t.compute);
  row("recompute", t.recompute);
  row("tensor-parallel comm", t.tp_comm);
  row("context-parallel comm", t.cp_comm);
  if (t.ep_comm > 0) row("expert all-to-all", t.ep_comm);
  row("pipeline send/recv", t.pp_comm);
  row("pipeline bubble", t.bubble);
  row("data-parallel comm exposed", t.dp_comm_exposed);
  row("optimizer", t.optimizer);
  os << fmt::format("  (data-parallel comm total {}, the rest overlapped with backward)\n", format_seconds(t.dp_comm));
}

// Tokens per second, and TFLOP/s, MFU and HFU per GPU.
void print_throughput(std::ostream& os, const Throughput& p) {
  os << fmt::format("\nthroughput: {:.0f} tokens/s ({:.1f} tokens/s/GPU)\n", p.tokens_per_s, p.tokens_per_s_per_gpu);
  os << fmt::format("per GPU: {:.1f} model TFLOP/s, {:.1f} hardware TFLOP/s; MFU {:.1f}%, HFU {:.1f}%\n",
                    p.model_tflops_per_gpu, p.hardware_tflops_per_gpu, 100 * p.mfu, 100 * p.hfu);
  os << fmt::format("  (causal attention as computed, half the score matrix; counting full attention as Megatron-LM "
                    "and NeMo publish MFU: MFU {:.1f}%)\n",
                    100 * p.mfu_full_attention);
  if (p.mfu > 1 || p.hfu > 1) {
    os << "  (above 100%: against a peak that is a measured matmul rate, as `trainplan calibrate` writes for a "
          "CPU unless given --peak-tflops, a step can run faster than that rate)\n";
  }
}

// The parameter servers and the gradient compression, where the layout uses them.
void print_gradient_exchange(std::ostream& os, const Estimate& e) {
  const Strategy& s = e.strategy;
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

}  // namespace

void print_prediction(std::ostream& os, const Estimate& e, const std::string& title) {
  const Strategy& s = e.strategy;
  os << printable(title) << "\n";
  os << fmt::format("layout: {}  ({} GPU{}, {} micro-batch{} of {} x {} tokens per replica, {}, {} attention)\n",
                    describe(s), s.gpus(), s.gpus() == 1 ? "" : "s", s.micro_batches(),
                    s.micro_batches() == 1 ? "" : "es", s.micro_batch, s.seq_len, to_string(s.dtype),
                    to_string(s.attention));
  if (!e.feasible) {
    os << "INFEASIBLE:\n";
    for (const auto& r : infeasible_reasons(e)) os << "  - " << printable(r) << "\n";
    os << memory_hint(e);
    if (e.per_stage.empty()) return;
  }
  print_memory_table(os, e);
  print_step_time(os, e.time);
  print_throughput(os, e.throughput);
  print_gradient_exchange(os, e);
}

}  // namespace trainplan
