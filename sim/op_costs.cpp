// Op cost tables: parsing the "ops" object of a cluster file and the lookups (see op_costs.hpp).
//
// File format (trainplan/cluster/v2, "ops"; times in microseconds, sizes in elements or bytes):
//   "ops": {
//     "source": "where the figures were measured",
//     "measured_on": {"gpu": "H100-SXM5-80GB", "peak_tflops": 989.5, "hbm_bandwidth_gbps": 3350},
//                                       // the GPU measured: name, dense peak in "dtype", HBM GB/s
//     "dtype": "bf16",                  // dtype of the GEMM and attention measurements
//     "kernel_floor_us": 6.6,           // tiny kernels issued back to back: time per kernel
//     "gemm": [{"m": 2048, "n": 1024, "k": 1024, "fwd_us": .., "dgrad_us": .., "wgrad_us": ..}, ..],
//     "attention": [{"seq": 1024, "head_dim": 64, "batch_heads": 400, "fwd_us": .., "fwd_bwd_us": ..}, ..],
//     "attention_kernels": {           // optional: other attention kernels on this GPU, by name
//       "flash2": {"source": "where the figures come from", "points": [same as "attention"]}},
//     "memory_bound": {"add": [{"bytes": 33554432, "fwd_us": .., "fwd_bwd_us": ..}, ..], ..}
//   }
// "add" is required (it also times every elementwise stream); the other families are optional and
// fall back to streaming their traffic (kTraffic below) at the add kernel's bandwidth.
#include "sim/op_costs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "sim/check.hpp"
#include "sim/json_reader.hpp"

namespace trainplan {

namespace {

constexpr const char* kMemNames[kMemKernels] = {"layer_norm", "rms_norm", "gelu", "swiglu", "add",
                                                "cross_entropy_fp32", "adamw_fused", "adamw_foreach"};

// Bytes each family moves per byte of its input tensor, forward and backward (used only when the
// family was not measured on this GPU). Counted from the kernels' reads and writes:
//   layer_norm/rms_norm: fwd read x, write y (2); bwd read x, dy, write dx (3).
//   gelu: fwd 2; bwd read x, dy, write dx (3).   swiglu (input = gate+up, 2f): fwd read 2f, write
//   f (1.5); bwd read 2f + f, write 2f (2.5).    add: fwd read 2, write 1 (3); bwd dy passed on (2).
//   cross_entropy_fp32 (input = 16-bit logits): cast to fp32 (1 + 2), log-softmax (2 + 2), loss
//   read (2) -> 9; bwd softmax grad read/write fp32 (4) + cast to 16-bit (2 + 1) -> 7.
//   adamw_fused (input = fp32 params): read p, g, m, v and write p, m, v -> 7; foreach: about 3x
//   (separate passes for each update term; PyTorch's measured ratio on H100 is 2.7-2.8x).
constexpr double kTraffic[kMemKernels][2] = {{2, 3}, {2, 3}, {2, 3}, {1.5, 2.5}, {3, 2}, {9, 7}, {7, 0}, {21, 0}};

double log2v(double x) { return std::log2(std::max(x, 1e-300)); }

// Refuses a table too large to interpolate (kMaxOpTableWork), naming its key; returns its work.
template <std::size_t D>
double check_table_size(const JsonObject& parent, const std::string& key, const std::vector<std::array<double, D>>& points) {
  const double work = op_table_work(points);
  if (work > kMaxOpTableWork) {
    throw parent.error(key, fmt::format("holds {} points whose distinct coordinates make an interpolation grid of {:.3g} "
                                        "nodes; nodes x points ({:.3g}) must be at most {:.3g} (measure fewer shapes, "
                                        "or shapes that share their sizes)",
                                        points.size(), work / static_cast<double>(points.size()), work,
                                        kMaxOpTableWork));
  }
  return work;
}

}  // namespace

const char* to_string(MemKernel k) { return kMemNames[static_cast<int>(k)]; }

bool parse_mem_kernel(const std::string& s, MemKernel& out) {
  for (int i = 0; i < kMemKernels; ++i) {
    if (s == kMemNames[i]) {
      out = static_cast<MemKernel>(i);
      return true;
    }
  }
  return false;
}

// ---- LogGrid -----------------------------------------------------------------------------------

template <int D>
void LogGrid<D>::build(const std::vector<std::array<double, D>>& coords, const std::vector<double>& values) {
  TRAINPLAN_CHECK(!coords.empty() && coords.size() == values.size(), "LogGrid needs matching points");
  std::size_t total = 1;
  for (int d = 0; d < D; ++d) {
    std::vector<double> measured;
    for (const auto& c : coords) measured.push_back(c[d]);
    std::sort(measured.begin(), measured.end());
    measured.erase(std::unique(measured.begin(), measured.end(), [](double x, double y) { return y - x < 1e-9; }),
                   measured.end());
    axis_[d] = measured;
    const auto& ax = axis_[d];
    total *= ax.size();
  }
  values_.assign(total, 0);
  for (std::size_t flat = 0; flat < total; ++flat) {
    std::array<double, D> x{};
    std::size_t rest = flat;
    for (int d = D - 1; d >= 0; --d) {
      x[d] = axis_[d][rest % axis_[d].size()];
      rest /= axis_[d].size();
    }
    // Inverse-distance weighting (Shepard 1968), power 3, distances in octaves; a node on measured
    // shapes takes their mean.
    double wsum = 0, vsum = 0, exact_sum = 0;
    int exact = 0;
    for (std::size_t i = 0; i < coords.size(); ++i) {
      double d2 = 0;
      for (int d = 0; d < D; ++d) d2 += (coords[i][d] - x[d]) * (coords[i][d] - x[d]);
      if (d2 < 1e-12) {
        exact_sum += values[i];
        ++exact;
        continue;
      }
      const double w = 1.0 / (d2 * std::sqrt(d2));
      wsum += w;
      vsum += w * values[i];
    }
    values_[flat] = exact > 0 ? exact_sum / exact : vsum / wsum;
  }
}

template <int D>
double LogGrid<D>::at(const std::array<double, D>& q) const {
  TRAINPLAN_CHECK(!values_.empty(), "LogGrid used before build()");
  std::array<std::size_t, D> i0{};
  std::array<double, D> t{};
  std::array<double, D> below{};  // octaves below the smallest measured coordinate
  for (int d = 0; d < D; ++d) {
    const auto& ax = axis_[d];
    if (q[d] < ax.front()) below[d] = ax.front() - q[d];
    if (ax.size() == 1 || q[d] <= ax.front()) {
      i0[d] = 0;
      t[d] = 0;
    } else if (q[d] >= ax.back()) {
      i0[d] = ax.size() - 2;
      t[d] = 1;
    } else {
      const std::size_t hi = static_cast<std::size_t>(std::upper_bound(ax.begin(), ax.end(), q[d]) - ax.begin());
      i0[d] = hi - 1;
      t[d] = (q[d] - ax[hi - 1]) / (ax[hi] - ax[hi - 1]);
    }
  }
  double out = 0;
  for (int corner = 0; corner < (1 << D); ++corner) {
    double w = 1;
    std::size_t flat = 0;
    for (int d = 0; d < D; ++d) {
      const int bit = (corner >> d) & 1;
      const double wd = bit ? t[d] : 1 - t[d];
      if (wd == 0) {
        w = 0;
        break;
      }
      w *= wd;
      flat = flat * axis_[d].size() + i0[d] + bit;
    }
    if (w != 0) out += w * values_[flat];
  }
  // Below the measured range the rate keeps falling as it did over the first measured step of that
  // axis (at the nearest measured shape), rate ~ size^p with p clamped to [0, 1]: never rising as
  // kernels shrink, and never so fast that a smaller kernel would take longer. Above the range the
  // edge rate is held.
  for (int d = 0; d < D; ++d) {
    if (below[d] <= 0 || axis_[d].size() < 2) continue;
    std::array<double, D> at_edge = q;
    at_edge[d] = axis_[d][0];
    std::array<double, D> next = q;
    next[d] = axis_[d][1];
    const double slope = (at(next) - at(at_edge)) / (axis_[d][1] - axis_[d][0]);  // ln(rate) per octave
    out -= below[d] * std::clamp(slope, 0.0, std::log(2.0));
  }
  return out;
}

template <int D>
double LogGrid<D>::max_value() const {
  return values_.empty() ? -std::numeric_limits<double>::infinity() : *std::max_element(values_.begin(), values_.end());
}

template class LogGrid<1>;
template class LogGrid<2>;
template class LogGrid<3>;

// ---- tables ------------------------------------------------------------------------------------

Flops causal_attention_fwd_flops(double seq, double head_dim, double batch_heads) {
  return 2.0 * seq * seq * head_dim * batch_heads;
}

void OpCostTables::prepare() {
  TRAINPLAN_CHECK(!gemm.empty() && !attention.empty() && has(MemKernel::add), "op tables need gemm, attention, add");
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<std::array<double, 3>> xs;
    std::vector<double> ys;
    auto time_of = [pass](const GemmMeasure& p) { return pass == 0 ? p.fwd : pass == 1 ? p.dgrad : p.wgrad; };
    for (const auto& p : gemm) {
      // A GEMM does not take longer than one at least as large in every dimension: a measured time
      // above such a larger shape's is a glitch of that measurement (e.g. on H100 2048x6144x2048
      // dgrad 447 us, where 2048x8192x2048 took 153 us), and the larger shape's time bounds it.
      Seconds t = time_of(p);
      for (const auto& q : gemm) {
        if (q.m >= p.m && q.n >= p.n && q.k >= p.k) t = std::min(t, time_of(q));
      }
      xs.push_back({log2v(p.m), log2v(p.n), log2v(p.k)});
      ys.push_back(std::log(2 * p.m * p.n * p.k / t));
    }
    gemm_grid_[pass].build(xs, ys);
  }
  attention_grid_.assign(1 + attention_kernels.size(), {});
  for (std::size_t table = 0; table < attention_grid_.size(); ++table) {
    const auto& points = table == 0 ? attention : attention_kernels[table - 1].points;
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<std::array<double, 2>> xs;
      std::vector<double> ys;
      for (const auto& p : points) {
        const Flops f = causal_attention_fwd_flops(p.seq, p.head_dim, p.batch_heads);
        xs.push_back({log2v(p.seq), log2v(p.head_dim)});
        ys.push_back(pass == 0 ? std::log(f / p.fwd)
                                : std::log(causal_attention_bwd_flops(p.seq, p.head_dim, p.batch_heads) /
                                           (p.fwd_bwd - p.fwd)));
      }
      attention_grid_[table][pass].build(xs, ys);
    }
  }
  for (int k = 0; k < kMemKernels; ++k) {
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<std::array<double, 1>> xs;
      std::vector<double> ys;
      for (const auto& p : memory[k]) {
        const Seconds t = pass == 0 ? p.fwd : p.fwd_bwd - p.fwd;
        if (t <= 0) continue;
        xs.push_back({log2v(p.bytes)});
        ys.push_back(std::log(p.bytes / t));  // input bytes per second
      }
      if (!xs.empty()) memory_grid_[k][pass].build(xs, ys);
    }
  }
}

Seconds OpCostTables::gemm_time(double m, double n, double k, GemmPass pass) const {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const double rate = std::exp(gemm_grid_[static_cast<int>(pass)].at(
      {log2v(m * derivation.gemm_m_scale), log2v(n), log2v(k * derivation.gemm_k_scale)}));
  return 2 * m * n * k / rate;
}

int OpCostTables::attention_kernel(const std::string& name) const {
  for (std::size_t i = 0; i < attention_kernels.size(); ++i) {
    if (attention_kernels[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

Seconds OpCostTables::attention_fwd(double seq, double head_dim, double batch_heads, int kernel) const {
  if (seq <= 0 || batch_heads <= 0) return 0;
  const auto& grid = attention_grid_[static_cast<std::size_t>(kernel + 1)][0];
  return causal_attention_fwd_flops(seq, head_dim, batch_heads) / std::exp(grid.at({log2v(seq), log2v(head_dim)}));
}

Seconds OpCostTables::attention_bwd(double seq, double head_dim, double batch_heads, int kernel) const {
  if (seq <= 0 || batch_heads <= 0) return 0;
  const auto& grid = attention_grid_[static_cast<std::size_t>(kernel + 1)][1];
  return causal_attention_bwd_flops(seq, head_dim, batch_heads) / std::exp(grid.at({log2v(seq), log2v(head_dim)}));
}

Seconds OpCostTables::stream(Bytes bytes_moved) const {
  // The add kernel moves 3x its input bytes (two reads, one write).
  return bytes_moved <= 0 ? 0 : memory_fwd(MemKernel::add, bytes_moved / 3);
}

Seconds OpCostTables::memory_fwd(MemKernel k, Bytes bytes) const {
  if (bytes <= 0) return 0;
  const auto& g = memory_grid_[static_cast<int>(k)][0];
  if (g.empty()) return stream(bytes * kTraffic[static_cast<int>(k)][0]);
  return bytes / std::exp(g.at({log2v(bytes)}));
}

Seconds OpCostTables::memory_bwd(MemKernel k, Bytes bytes) const {
  if (bytes <= 0) return 0;
  const auto& g = memory_grid_[static_cast<int>(k)][1];
  if (g.empty()) return stream(bytes * kTraffic[static_cast<int>(k)][1]);
  return bytes / std::exp(g.at({log2v(bytes)}));
}

FlopsPerSecond OpCostTables::best_gemm_rate() const {
  double best = 0;
  for (const auto& g : gemm_grid_) best = std::max(best, std::exp(g.max_value()));
  return best;
}

FlopsPerSecond OpCostTables::best_attention_rate() const {
  double best = 0;
  for (const auto& table : attention_grid_) {
    for (const auto& g : table) best = std::max(best, std::exp(g.max_value()));
  }
  return best;
}

namespace {

// A measured time in microseconds, converted to seconds. Shapes are at least 1 element and
// measured times at least 1 ns: a positive 1e-300 would pass "> 0" yet make the interpolated rate,
// and so every step figure, overflow.
Seconds time_us(const JsonObject& p, const char* key) { return p.number(key, 1e-3, 1e12) * kMicro; }

// The "gemm" table: one point per measured M x N x K shape.
void parse_gemm_table(const JsonObject& o, OpCostTables& t) {
  std::vector<std::array<double, 3>> gemm_shapes;
  for (const auto& p : o.objects("gemm", 1)) {
    GemmMeasure g;
    g.m = p.number("m", 1, 1e9);
    g.n = p.number("n", 1, 1e9);
    g.k = p.number("k", 1, 1e9);
    g.fwd = time_us(p, "fwd_us");
    g.dgrad = time_us(p, "dgrad_us");
    g.wgrad = time_us(p, "wgrad_us");
    p.finish();
    t.gemm.push_back(g);
    gemm_shapes.push_back({g.m, g.n, g.k});
  }
  check_table_size(o, "gemm", gemm_shapes);
}

// An attention table (`key` of `parent`); `work`, when given, sums the tables' interpolation work
// (the attention kernels are bounded in all).
std::vector<AttentionMeasure> attention_points(const JsonObject& parent, const char* key, double* work = nullptr) {
  std::vector<AttentionMeasure> points;
  for (const auto& p : parent.objects(key, 1)) {
    AttentionMeasure a;
    a.seq = p.number("seq", 1, 1e9);
    a.head_dim = p.number("head_dim", 1, 1e6);
    a.batch_heads = p.number("batch_heads", 1, 1e9);
    a.fwd = time_us(p, "fwd_us");
    a.fwd_bwd = time_us(p, "fwd_bwd_us");
    if (a.fwd_bwd <= a.fwd) throw p.error("fwd_bwd_us", "must exceed fwd_us (it includes the forward)");
    p.finish();
    points.push_back(a);
  }
  std::vector<std::array<double, 2>> shapes;
  for (const auto& a : points) shapes.push_back({a.seq, a.head_dim});
  const double table_work = check_table_size(parent, key, shapes);
  if (work) *work += table_work;
  return points;
}

// The optional "attention_kernels": one named table per kernel a stack may run.
void parse_attention_kernels(const JsonObject& o, OpCostTables& t) {
  if (!o.has("attention_kernels")) return;
  double kernels_work = 0;
  JsonObject kernels = o.object("attention_kernels");
  for (const std::string& name : kernels.keys()) {
    if (name == OpCostTables::kCalibratedAttention) {
      throw kernels.error(name, "names the \"attention\" table; give this kernel another name");
    }
    JsonObject k = kernels.object(name);
    t.attention_kernels.push_back({name, k.string("source"), attention_points(k, "points", &kernels_work)});
    k.finish();
  }
  kernels.finish();
  // Each table is bounded above; so is their sum (thousands of bounded kernels ran as long).
  if (kernels_work > kMaxOpTableWork) {
    throw o.error("attention_kernels", fmt::format("{} kernels whose interpolation grids need nodes x points = {:.3g} in "
                                                   "all, must be at most {:.3g}",
                                                   t.attention_kernels.size(), kernels_work, kMaxOpTableWork));
  }
}

// The "memory_bound" tables: one per kernel family ("add" required), the optimizers' by step time.
void parse_memory_bound(const JsonObject& o, OpCostTables& t) {
  JsonObject mb = o.object("memory_bound");
  for (int k = 0; k < kMemKernels; ++k) {
    const std::string name = kMemNames[k];
    const bool optimizer = k == static_cast<int>(MemKernel::adamw_fused) || k == static_cast<int>(MemKernel::adamw_foreach);
    if (name != "add" && !mb.has(name)) continue;
    for (const auto& p : mb.objects(name, 1)) {
      MemMeasure m;
      m.bytes = p.number("bytes", 1, 1e15);
      m.fwd = time_us(p, optimizer ? "step_us" : "fwd_us");
      if (!optimizer) {
        m.fwd_bwd = time_us(p, "fwd_bwd_us");
        if (m.fwd_bwd <= m.fwd) throw p.error("fwd_bwd_us", "must exceed fwd_us (it includes the forward)");
      }
      p.finish();
      t.memory[k].push_back(m);
    }
    std::vector<std::array<double, 1>> sizes;
    for (const auto& m : t.memory[k]) sizes.push_back({m.bytes});
    check_table_size(mb, name, sizes);
  }
  mb.finish();
}

}  // namespace

namespace {

// The measured table's rate for the reference of one achieved figure (derive_op_costs); a GEMM
// shape is read where `shape` (the derived table's scales) maps it.
FlopsPerSecond table_rate(const OpCostTables& t, const AchievedRate& a, const OpDerivation& shape) {
  switch (a.kernel) {
    case ReferenceKernel::gemm: {
      if (a.best) return t.best_gemm_rate();
      const double m = a.m * shape.gemm_m_scale, k = a.k * shape.gemm_k_scale;
      return 2 * m * a.n * k / t.gemm_time(m, a.n, k, GemmPass::fwd);
    }
    case ReferenceKernel::attention_fwd:
      return causal_attention_fwd_flops(a.seq, a.head_dim, 1) / t.attention_fwd(a.seq, a.head_dim, 1);
    case ReferenceKernel::attention_bwd:
      return causal_attention_bwd_flops(a.seq, a.head_dim, 1) / t.attention_bwd(a.seq, a.head_dim, 1);
  }
  return 0;
}

// Geometric mean of the figures' achieved rates over the measured table's rates for the same
// reference, over the figures of `kernel` in the table dtype; `peak_ratio` (and achieved false)
// where there are none.
double achieved_ratio(const OpCostTables& t, const std::vector<AchievedRate>& rates, ReferenceKernel kernel,
                      const OpDerivation& shape, double peak_ratio, bool& achieved) {
  double log_sum = 0;
  int n = 0;
  for (const AchievedRate& a : rates) {
    if (a.kernel != kernel || a.dtype != t.dtype) continue;
    log_sum += std::log(a.rate / table_rate(t, a, shape));
    ++n;
  }
  achieved = n > 0;
  return achieved ? std::exp(log_sum / n) : peak_ratio;
}

// Geometric mean over a quantized format's GEMM figures of its rate over the table-dtype figure of
// the same reference on the same GPU; 0 where the format has no figure. The loader has checked
// that every format figure has such a partner.
double format_speedup(const std::vector<AchievedRate>& rates, Dtype format, Dtype table_dtype) {
  double log_sum = 0;
  int n = 0;
  for (const AchievedRate& a : rates) {
    if (a.kernel != ReferenceKernel::gemm || a.dtype != format) continue;
    for (const AchievedRate& b : rates) {
      if (b.dtype == table_dtype && b.same_reference(a)) {
        log_sum += std::log(a.rate / b.rate);
        ++n;
        break;
      }
    }
  }
  return n > 0 ? std::exp(log_sum / n) : 0;
}

}  // namespace

OpCostTables derive_op_costs(const OpCostTables& measured, const DerivationInputs& in) {
  TRAINPLAN_CHECK(measured.derivation.from.empty(), "op tables are derived from measured ones only");
  TRAINPLAN_CHECK(in.peak > 0 && in.hbm_bandwidth > 0 && measured.measured_on.peak > 0 &&
                      measured.measured_on.hbm_bandwidth > 0,
                  "derive_op_costs needs positive peaks and bandwidths");
  for (const AchievedRate& a : in.achieved) TRAINPLAN_CHECK(a.rate > 0, "achieved rates are positive");
  OpCostTables t = measured;
  OpDerivation& d = t.derivation;
  d.from = in.from;
  const double peak_ratio = in.peak / measured.measured_on.peak;
  if (in.sm_count > 0 && in.measured_sm_count > 0) {
    const double sm_ratio = static_cast<double>(in.sm_count) / in.measured_sm_count;
    d.gemm_m_scale = 1 / sm_ratio;
    d.gemm_k_scale = sm_ratio / peak_ratio;  // measured peak per SM / this GPU's
  }
  d.gemm_ratio = achieved_ratio(measured, in.achieved, ReferenceKernel::gemm, d, peak_ratio, d.gemm_achieved);
  d.attention_fwd_ratio =
      achieved_ratio(measured, in.achieved, ReferenceKernel::attention_fwd, d, peak_ratio, d.attention_fwd_achieved);
  d.attention_bwd_ratio =
      achieved_ratio(measured, in.achieved, ReferenceKernel::attention_bwd, d, peak_ratio, d.attention_bwd_achieved);
  d.memory_ratio = in.hbm_bandwidth / measured.measured_on.hbm_bandwidth;
  d.fp8_speedup = format_speedup(in.achieved, Dtype::fp8, measured.dtype);
  d.mxfp8_speedup = format_speedup(in.achieved, Dtype::mxfp8, measured.dtype);
  d.nvfp4_speedup = format_speedup(in.achieved, Dtype::nvfp4, measured.dtype);
  for (const FormatRatio& f : in.format_ratios) {
    double& target = f.format == Dtype::mxfp8 ? d.mxfp8_speedup : d.nvfp4_speedup;
    const double over = d.format_speedup(f.over) > 0 ? d.format_speedup(f.over) : f.over_peak_speedup;
    TRAINPLAN_CHECK(over > 0 && f.ratio > 0, "a format ratio needs the other format's speed-up");
    if (target == 0) target = over * f.ratio;
  }
  for (GemmMeasure& g : t.gemm) {
    g.fwd /= d.gemm_ratio;
    g.dgrad /= d.gemm_ratio;
    g.wgrad /= d.gemm_ratio;
  }
  // fwd_bwd holds both passes: each is scaled by its own ratio.
  auto scale_attention = [&d](std::vector<AttentionMeasure>& points) {
    for (AttentionMeasure& a : points) {
      const Seconds bwd = a.fwd_bwd - a.fwd;
      a.fwd /= d.attention_fwd_ratio;
      a.fwd_bwd = a.fwd + bwd / d.attention_bwd_ratio;
    }
  };
  scale_attention(t.attention);
  if (!in.keep_attention_kernels) t.attention_kernels.clear();
  for (auto& k : t.attention_kernels) scale_attention(k.points);
  for (auto& family : t.memory) {
    for (MemMeasure& m : family) {
      m.fwd /= d.memory_ratio;
      m.fwd_bwd /= d.memory_ratio;
    }
  }
  t.prepare();
  return t;
}

OpCostTables parse_op_costs(const JsonObject& o) {
  OpCostTables t;
  (void)o.string("source");
  const std::string dtype = o.choice("dtype", {"bf16", "fp16", "fp8", "fp32"});
  t.dtype = dtype == "bf16" ? Dtype::bf16 : dtype == "fp16" ? Dtype::fp16 : dtype == "fp8" ? Dtype::fp8 : Dtype::fp32;
  {
    // The same bounds as the cluster's gpu figures (cluster.cpp).
    const JsonObject m = o.object("measured_on");
    t.measured_on.gpu = m.string("gpu");
    t.measured_on.peak = m.number("peak_tflops", 1e-3, 1e6) * kTera;
    t.measured_on.hbm_bandwidth = m.number("hbm_bandwidth_gbps", 1e-3, 1e6) * kGB;
    m.finish();
  }
  t.kernel_floor = o.number("kernel_floor_us", 0, 1e6) * kMicro;
  t.misaligned_gemm_slowdown = o.has("misaligned_gemm_slowdown") ? o.number("misaligned_gemm_slowdown", 1, 100) : 1;
  if (o.has("fp8_gemm_speedup")) {
    throw o.error("fp8_gemm_speedup", "was removed: FP8 GEMMs are costed from the 16-bit table with the reduction "
                                      "dimension shortened by the GPU's fp8/bf16 peak ratio; delete the key");
  }
  parse_gemm_table(o, t);
  t.attention = attention_points(o, "attention");
  parse_attention_kernels(o, t);
  parse_memory_bound(o, t);
  o.finish();
  t.prepare();
  return t;
}

}  // namespace trainplan
