#include "sim/search_space.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "sim/check.hpp"

namespace trainplan {

namespace search_detail {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; static_cast<long long>(i) * i <= n; ++i) {
    if (n % i) continue;
    d.push_back(i);
    if (i != n / i) d.push_back(n / i);
  }
  std::sort(d.begin(), d.end());
  return d;
}

int limit(int value, int fallback) { return value > 0 ? value : fallback; }

bool has(const std::vector<ScheduleKind>& v, ScheduleKind k) { return std::find(v.begin(), v.end(), k) != v.end(); }

// The expert fields of the space, checked against the model as validate() checks a strategy's:
// a dense model keeps every default, and the shared settings are in their ranges.
void check_expert_space(const ModelSpec& m, const ExpertSpace& x) {
  const MoeSpec& e = m.moe;
  if (!e.on()) {
    const char* rule = "needs a model with experts (the model is dense)";
    if (x.max_ep != 0) throw InputError(fmt::format("--max-ep {}: {}", x.max_ep, rule));
    if (!x.etp_one || !x.etp_tp) throw InputError(fmt::format("--etp {}: {}", x.etp_one ? "1" : "tp", rule));
    if (x.moe_imbalance != 1) throw InputError(fmt::format("--moe-imbalance {}: {}", x.moe_imbalance, rule));
    if (x.capacity_factor != 0) throw InputError(fmt::format("--capacity-factor {}: {}", x.capacity_factor, rule));
    if (x.dispatcher != Dispatcher::alltoall)
      throw InputError(fmt::format("--moe-dispatcher {}: {}", to_string(x.dispatcher), rule));
    if (x.moe_a2a_overlap) throw InputError(fmt::format("--moe-a2a-overlap on: {}", rule));
  }
  // Every module the space may recompute must apply to the model (module_unavailable, as validate()).
  for (RecomputeModule module : kRecomputeModuleList) {
    if (!(x.recompute_modules & module)) continue;
    if (const char* why = module_unavailable(m, module))
      throw InputError(fmt::format("--recompute-modules {}: {}", recompute_modules_string(module), why));
  }
  if (!x.etp_one && !x.etp_tp) throw InputError("--etp: must list 1, tp or both");
  if (x.max_ep < 0) throw InputError(fmt::format("--max-ep {}: must be >= 1", x.max_ep));
  if (!(x.moe_imbalance >= 1)) {
    throw InputError(
        fmt::format("--moe-imbalance {}: must be >= 1 (max / mean tokens per expert-parallel rank)", x.moe_imbalance));
  }
  const double max_capacity = e.on() ? static_cast<double>(e.experts) / e.top_k : 0;
  if (x.capacity_factor != 0 && !(x.capacity_factor > 0 && x.capacity_factor <= max_capacity)) {
    throw InputError(fmt::format("--capacity-factor {}: must be in (0, experts / top_k] = (0, {}] (0: dropless)",
                                 x.capacity_factor, max_capacity));
  }
}

// The space's CUDA graphs by the rules of a plan's (cuda_graphs_error); per-layer graphs need
// candidates without full recomputation (module_sets leaves those out).
void check_graph_space(const ModelSpec& m, const SearchSpace& sp) {
  if (auto rule = cuda_graphs_error(m, sp.cuda_graphs, sp.cuda_graph_modules, sp.experts.dispatcher,
                                    sp.experts.capacity_factor))
    throw InputError(*rule);
  if (sp.cuda_graph_modules && only_full_recompute(sp)) {
    throw InputError(fmt::format("--cuda-graph-modules {}: needs --recompute none or selective in the space (full "
                                 "recomputation runs only with --cuda-graphs full)",
                                 cuda_graph_modules_string(sp.cuda_graph_modules)));
  }
}

// The space's own checks (the settings' combinations are checked by add_settings).
void check_space(const LayerGraph& g, const Cluster& c, const SearchSpace& sp, const SearchOptions& o) {
  if (sp.gpus < 1) throw InputError(fmt::format("--gpus {}: must be >= 1", sp.gpus));
  if (sp.global_batch < 1) throw InputError(fmt::format("--global-batch {}: must be >= 1", sp.global_batch));
  if (static_cast<long long>(sp.global_batch) * sp.seq_len > kMaxTokensPerStep) {
    throw InputError(fmt::format("--global-batch {}: global batch x sequence length ({} x {}) must be at most 2^40 tokens "
                                 "per step",
                                 sp.global_batch, sp.global_batch, sp.seq_len));
  }
  if (sp.seq_len != g.seq_len()) {
    throw InputError(fmt::format("--seq {}: differs from the layer graph's sequence length {}", sp.seq_len, g.seq_len()));
  }
  if (c.gpu.peak(sp.dtype) <= 0) {
    throw InputError(fmt::format("--dtype {}: {} ({}) has no {} peak", to_string(sp.dtype), c.name, c.gpu.name,
                                 to_string(sp.dtype)));
  }
  if (sp.exact_gpus && sp.gpus > c.max_gpus()) {
    throw InputError(fmt::format("--gpus {}: {} has at most {} GPUs", sp.gpus, c.name, c.max_gpus()));
  }
  if (o.top_k < 1) throw InputError(fmt::format("--top {}: must be >= 1", o.top_k));
  if (sp.zero_stages.empty() || sp.recompute.empty() || sp.schedules.empty() || sp.sequence_parallel.empty() ||
      sp.dp_algorithms.empty() || sp.grad_compressions.empty()) {
    throw InputError(
        "search space: zero stages, recompute, schedules, sequence-parallel, dp-algorithm and compression lists must not be empty");
  }
  for (int z : sp.zero_stages) {
    if (!ZeroPolicy::valid_stage(z)) {
      throw InputError(fmt::format("search space: ZeRO stage {} must be 0..{}", z, ZeroPolicy::kMaxStage));
    }
  }
  check_expert_space(g.model(), sp.experts);
  check_graph_space(g.model(), sp);
  if (sp.experts.recompute_modules != 0 && only_full_recompute(sp)) {
    throw InputError(fmt::format("--recompute-modules {}: needs --recompute none or selective in the space (full "
                                 "recomputation already recomputes every module)",
                                 recompute_modules_string(sp.experts.recompute_modules)));
  }
}


// Whether validate() accepts the (ZeRO, DP algorithm, compression) combination: parameter servers
// hold the optimizer states, so ZeRO may not shard them; PowerSGD compresses an all-reduce, not
// ZeRO's reduce-scatter; bf16 compression casts fp32 gradients, so they must be fp32.
bool valid_combination(const SearchSpace& sp, const ZeroPolicy& z, DpAlgorithm a, const GradCompression& gc) {
  if (a != DpAlgorithm::allreduce && z.shards_optimizer) return false;
  if (gc.kind == CompressionKind::powersgd && z.reduce_scatters) return false;
  return !(gc.kind == CompressionKind::bf16 && sp.dtype != Dtype::fp32 && !sp.fp32_grad_accum);
}

}  // namespace

std::vector<unsigned> module_sets(const SearchSpace& sp, Recompute r) {
  // Full recomputation runs without per-layer CUDA graphs only (validate() refuses the pair).
  if (r == Recompute::full && sp.cuda_graph_modules != 0) return {};
  const unsigned allowed = r == Recompute::full ? 0u : sp.experts.recompute_modules;
  std::vector<unsigned> sets;
  for (unsigned m = 0; m < LayerVariant::kModuleSets; ++m)
    if ((m & allowed) == m) sets.push_back(m);
  return sets;
}

std::vector<LayerVariant> layer_variants(const SearchSpace& sp) {
  std::vector<LayerVariant> out;
  for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
    for (unsigned modules : module_sets(sp, r))
      for (bool on : {false, true}) out.push_back({r, on, modules});
  return out;
}

namespace {

// The settings, in enumeration order (ZeRO stage, recompute, recomputed modules, sp, DP algorithm,
// compression).
// Sequence parallelism is a setting only with tp > 1. Throws InputError when the flags leave no
// valid combination: that is bad input, not a search that found no layout.
void add_settings(Problem& p) {
  const SearchSpace& sp = p.space;
  for (int stage : sp.zero_stages) {
    const ZeroPolicy z = ZeroPolicy::of(stage);
    for (Recompute r : sp.recompute)
      for (unsigned modules : module_sets(sp, r))
        for (bool on : sp.sequence_parallel) {
          for (DpAlgorithm a : sp.dp_algorithms)
            for (const GradCompression& gc : sp.grad_compressions) {
              if (!valid_combination(sp, z, a, gc)) continue;
              const Setting st{z, LayerVariant{r, on, modules}, a, gc};
              if (!on) p.settings_tp1.push_back(st);
              // An MoE model with TP needs sequence parallelism (validate()).
              if (!on && p.graph.model().moe.on()) continue;
              p.settings_tp.push_back(st);
            }
        }
  }
  if (!p.settings_tp.empty() || !p.settings_tp1.empty()) return;
  auto list = [](const auto& items) {
    std::string out;
    for (const auto& x : items) out += (out.empty() ? "" : ",") + std::string(to_string(x));
    return out;
  };
  throw InputError(fmt::format("--dp-algorithms {}, --grad-compressions {} and --zero {} (--dtype {}, --fp32-grad-accum "
                               "{}): no combination is valid; parameter servers and PowerSGD need ZeRO 0, bf16 "
                               "compression needs fp32 gradients",
                               list(sp.dp_algorithms), list(sp.grad_compressions), fmt::join(sp.zero_stages, ","),
                               to_string(sp.dtype), sp.fp32_grad_accum ? "on" : "off"));
}

// The expert layouts (Problem::expert_layouts): {1, 1} for a dense model; for a model with experts every
// ep dividing them within max_ep and at least the routing imbalance (ep 1 is balanced; validate()
// keeps imbalance <= ep), none above 1 in fp16 (validate()), each with etp 1 and etp = each tp
// above 1 that divides the experts' width; make_layouts takes those the space's etp_one / etp_tp allow.
void add_experts(Problem& p) {
  const SearchSpace& sp = p.space;
  const MoeSpec& e = p.graph.model().moe;
  if (!e.on()) {
    p.expert_layouts.push_back({1, 1});
    return;
  }
  for (int ep : divisors(e.experts)) {
    if (ep > limit(sp.experts.max_ep, 1 << 30)) break;
    if (ep > 1 && (ep < sp.experts.moe_imbalance || sp.dtype == Dtype::fp16)) continue;
    p.expert_layouts.push_back({ep, 1});  // (make_layouts takes it for tp 1 or with etp_one)
    if (!sp.experts.etp_tp) continue;
    for (int tp : p.tps)
      if (tp > 1 && e.expert_ffn % tp == 0) p.expert_layouts.push_back({ep, tp});
  }
}

// Micro-batches (divisors of the global batch within the limit), and for each divisor dp of the
// global batch the micro-batches with dp x mb dividing it; tensor- and context-parallel sizes.
void add_lists(Problem& p) {
  const SearchSpace& sp = p.space;
  const ModelSpec& m = p.graph.model();
  for (int mb : divisors(sp.global_batch)) {
    if (sp.max_micro_batch <= 0 || mb <= sp.max_micro_batch) p.micro_batches.push_back(mb);
  }
  for (int dp : divisors(sp.global_batch)) {
    std::vector<std::size_t>& mis = p.mb_for_dp.emplace_back();
    for (std::size_t mi = 0; mi < p.micro_batches.size(); ++mi)
      if (sp.global_batch % (static_cast<long long>(dp) * p.micro_batches[mi]) == 0) mis.push_back(mi);
  }
  // tp divides the heads, the MLP's width and (models with shared experts) their summed width.
  int tp_widths = std::gcd(std::gcd(m.heads, m.kv_heads), m.ffn_hidden);
  if (m.moe.shared_experts > 0) tp_widths = std::gcd(tp_widths, m.moe.shared_experts * m.moe.shared_ffn);
  for (int tp : divisors(tp_widths)) {
    if (tp <= limit(sp.max_tp, 1 << 30)) p.tps.push_back(tp);
  }
  for (int cp : divisors(sp.seq_len)) {
    if (cp <= limit(sp.max_cp, 1 << 30) && (cp == 1 || sp.seq_len % (2 * cp) == 0)) p.cps.push_back(cp);
  }
  add_experts(p);
  p.gpipe = has(sp.schedules, ScheduleKind::gpipe);
  p.one_f_one_b = has(sp.schedules, ScheduleKind::one_f_one_b);
  p.interleaved = has(sp.schedules, ScheduleKind::interleaved);
}

}  // namespace

Problem make_problem(const LayerGraph& g, const Cluster& c, const Software& sw, const SearchSpace& space,
                     const SearchOptions& o) {
  check_space(g, c, space, o);
  Problem p{g, c, sw, space, o, {}, {}, {}, {}, {}, false, false, false, {}, {}, 1, {}};
  p.keep_top = static_cast<std::size_t>(o.refine ? std::max(o.top_k, kRefineWindow) : o.top_k);
  add_lists(p);
  add_settings(p);
  return p;
}

std::vector<Layout> make_layouts(const Problem& p) {
  const SearchSpace& sp = p.space;
  const Cluster& c = p.cluster;
  const int max_gpus = std::min(sp.gpus, c.max_gpus());
  const int gpn = c.gpus_per_node;
  std::vector<Layout> out;
  const int max_pp = std::min(p.graph.model().layers, limit(sp.max_pp, 1 << 30));
  const std::vector<int> dps = divisors(sp.global_batch);
  for (std::size_t ti = 0; ti < p.tps.size(); ++ti)
    for (std::size_t ci = 0; ci < p.cps.size(); ++ci)
      for (int pp = 1; pp <= max_pp; ++pp) {
        const long long mp = static_cast<long long>(p.tps[ti]) * p.cps[ci] * pp;
        if (mp > max_gpus) break;
        for (std::size_t di = 0; di < dps.size(); ++di) {
          const int dp = dps[di];
          const long long g = mp * dp;
          if (g > max_gpus || dp > limit(sp.max_dp, 1 << 30)) break;
          if (sp.exact_gpus ? g != sp.gpus : (g % gpn != 0 && gpn % g != 0)) continue;
          const long long stage = static_cast<long long>(p.tps[ti]) * p.cps[ci] * dp;
          for (std::size_t xi = 0; xi < p.expert_layouts.size(); ++xi) {
            const ExpertLayout& x = p.expert_layouts[xi];
            const bool etp_fits = (x.etp == 1 && sp.experts.etp_one) || (x.etp == p.tps[ti] && sp.experts.etp_tp);
            if (!etp_fits || stage % (static_cast<long long>(x.ep) * x.etp) != 0) continue;
            out.push_back({dp, p.tps[ti], pp, p.cps[ci], di, ti, ci, x.ep, x.etp, xi});
          }
        }
      }
  std::stable_sort(out.begin(), out.end(), [](const Layout& a, const Layout& b) { return a.gpus() > b.gpus(); });
  return out;
}

Strategy make_strategy(const Problem& p, const Layout& l, int mb, ScheduleKind k, int vp, const Setting& st) {
  Strategy s;
  s.dp = l.dp;
  s.tp = l.tp;
  s.pp = l.pp;
  s.cp = l.cp;
  s.vp = vp;
  s.zero = st.zero.stage;
  s.micro_batch = mb;
  s.global_batch = p.space.global_batch;
  s.seq_len = p.space.seq_len;
  s.recompute = st.variant.recompute;
  s.sequence_parallel = st.variant.sp;
  s.schedule = k;
  s.dtype = p.space.dtype;
  s.attention = p.space.attention;
  s.fp32_grad_accum = p.space.fp32_grad_accum;
  s.cuda_graphs = p.space.cuda_graphs;
  s.cuda_graph_modules = p.space.cuda_graph_modules;
  s.dp_algorithm = st.dpa;
  s.grad_compression = st.gc;
  s.ep = l.ep;
  s.etp = l.etp;
  if (static_cast<long long>(l.pp) * vp > p.graph.model().layers) s.pipeline_accounts = kAccountEmbedding | kAccountLoss;
  if (p.graph.model().moe.on()) {
    s.moe_imbalance = l.ep > 1 ? p.space.experts.moe_imbalance : 1.0;
    s.capacity_factor = p.space.experts.capacity_factor;
    s.dispatcher = p.space.experts.dispatcher;
    s.moe_a2a_overlap = l.ep > 1 && p.space.experts.moe_a2a_overlap;
  }
  s.recompute_modules = st.variant.modules;
  if (s.uses_ps()) {
    s.ps_servers = p.space.ps_servers;
    s.ps_placement = p.space.ps_placement;
  }
  return s;
}

int max_vp_for(const Problem& p, int pp) {
  int max_vp = p.graph.model().layers / pp;
  if (p.space.max_vp > 0) max_vp = std::min(max_vp, p.space.max_vp);
  return max_vp;
}

int accounted_vp_for(const Problem& p, int pp) {
  const int layers = p.graph.model().layers, vp = (layers + 2) / pp;
  const bool fits = (layers + 2) % pp == 0 && vp >= 2 && vp > layers / pp;
  return fits && (p.space.max_vp <= 0 || vp <= p.space.max_vp) ? vp : 0;
}

int count_schedules(const Problem& p, int pp, int m) {
  if (pp == 1) return p.one_f_one_b || p.gpipe ? 1 : 0;
  int n = (p.gpipe ? 1 : 0) + (p.one_f_one_b ? 1 : 0);
  if (p.interleaved && m % pp == 0) n += std::max(0, max_vp_for(p, pp) - 1) + (accounted_vp_for(p, pp) > 0 ? 1 : 0);
  return n;
}

}  // namespace search_detail

std::vector<Strategy> enumerate_space(const LayerGraph& graph, const Cluster& cluster, const SearchSpace& space) {
  using namespace search_detail;
  const SearchOptions options;
  const Software none;  // enumeration predicts nothing
  const Problem p = make_problem(graph, cluster, none, space, options);
  std::vector<Strategy> out;
  for (const Layout& l : make_layouts(p)) {
    for (std::size_t mi : p.mb_for_dp[l.dp_index]) {
      const int mb = p.micro_batches[mi];
      for_each_schedule(p, l.pp, p.micro_batches_per_replica(l, mi), [&](ScheduleKind kind, int vp) {
        for (const Setting& st : p.settings(l)) out.push_back(make_strategy(p, l, mb, kind, vp, st));
      });
    }
  }
  return out;
}

}  // namespace trainplan
