#include "sim/capacity.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>

#include "sim/check.hpp"
#include "sim/param_server.hpp"

namespace trainplan {

std::vector<int> capacity_gpu_counts(const Cluster& c, int lo, int hi) {
  const int top = hi > 0 ? std::min(hi, c.max_gpus()) : c.max_gpus();
  const int bottom = lo > 0 ? lo : c.gpus_per_node;
  std::vector<int> out;
  for (long long g = c.gpus_per_node; g <= top; g *= 2) {
    if (g >= bottom) out.push_back(static_cast<int>(g));
  }
  return out;
}

namespace {

SearchSpace option_space(const LayerGraph& graph, const CapacityRequest& req, const Cluster& c, int gpus) {
  SearchSpace space = default_space(c, gpus, req.global_batch, graph.seq_len(), req.attention);
  space.exact_gpus = true;
  space.dtype = req.dtype;
  space.dp_algorithms = req.dp_algorithms;
  space.grad_compressions = req.grad_compressions;
  space.ps_servers = req.ps_servers;
  space.ps_placement = req.ps_placement;
  space.fp32_grad_accum = req.fp32_grad_accum;
  space.cuda_graphs = req.cuda_graphs;
  space.cuda_graph_modules = req.cuda_graph_modules;
  space.experts = req.experts;
  return space;
}

SearchOptions option_search(const CapacityRequest& req) {
  SearchOptions opt;
  opt.objective = Objective::time;
  opt.top_k = 1;
  opt.keep_infeasible = 0;
  opt.pareto_window = 1;  // no front needed; prune as hard as the bounds allow
  opt.threads = req.threads;
  return opt;
}

// The most frequent reason no layout fits; ties go to the alphabetically first name.
std::string no_layout_reason(const SearchResult& r) {
  std::string why = "no valid layout";
  std::int64_t most = 0;
  for (const auto& [reason, n] : r.stats.infeasible_by_reason) {
    const std::string key = reason_key(reason);
    if (n > most || (n == most && n > 0 && key < why)) most = n, why = key;
  }
  if (r.stats.pruned_out_of_memory > most) why = "out of memory";
  return why;
}

// Goodput and failure-aware figures of a feasible option; the elastic re-search.
void add_failures(CapacityOption& o, const LayerGraph& graph, const CapacityRequest& req, const Cluster& c) {
  const Reliability& rel = *req.reliability;
  o.with_failures = true;
  o.goodput = goodput(rel, o.gpus, checkpoint_bytes(graph, o.best.strategy), o.best.time.step);
  if (o.goodput.goodput > 0) {
    o.days_with_failures = o.days / o.goodput.goodput;
    o.gpu_hours_with_failures = o.gpu_hours / o.goodput.goodput;
    o.cost_usd_with_failures = o.cost_usd / o.goodput.goodput;
    o.energy_kwh_with_failures = o.energy_kwh / o.goodput.goodput;
  }
  if (!req.elastic) return;
  ElasticOption e;
  e.gpus = o.gpus - c.gpus_per_node;
  if (e.gpus < 1) {
    e.why = "no node left";
  } else {
    // Any GPU count up to those left (whole nodes): N - one node rarely factors into a layout of
    // the same global batch (1016 = 8 x 127), so the job restarts on the best count that does.
    SearchSpace space = option_space(graph, req, c, e.gpus);
    space.exact_gpus = false;
    SearchResult r = search(graph, c, req.software, space, option_search(req));
    if (r.top.empty()) {
      e.why = no_layout_reason(r);
    } else {
      e.feasible = true;
      e.best = std::move(r.top.front());
      e.throughput_share = e.best.throughput.tokens_per_s / o.best.throughput.tokens_per_s;
      e.resume = rel.restart + checkpoint_bytes(graph, e.best.strategy) / (rel.checkpoint_per_gpu * e.gpus);
    }
  }
  o.elastic = std::move(e);
}

// Selection reads the failure-aware figures when there are any (an option whose goodput is 0
// never finishes and is not selectable).
double days_of(const CapacityOption& o) { return o.with_failures ? o.days_with_failures : o.days; }
double cost_of(const CapacityOption& o) { return o.with_failures ? o.cost_usd_with_failures : o.cost_usd; }
bool usable(const CapacityOption& o) { return o.feasible && (!o.with_failures || o.goodput.goodput > 0); }

// The buyer's comparison (RankingRule): each cluster's pick, then the picks in order.
void rank_clusters(CapacityResult& out, const CapacityRequest& req) {
  out.ranking_rule = req.deadline_days ? RankingRule::cheapest_in_deadline
                     : req.budget_usd  ? RankingRule::fastest_in_budget
                                       : RankingRule::cheapest;
  const bool by_time = out.ranking_rule == RankingRule::fastest_in_budget;
  // a before b: the rule's figure, then the other one (ties: the earlier option).
  auto better = [&](std::size_t a, std::size_t b) {
    const CapacityOption &x = out.options[a], &y = out.options[b];
    const double xa = by_time ? days_of(x) : cost_of(x), ya = by_time ? days_of(y) : cost_of(y);
    if (xa != ya) return xa < ya;
    const double xb = by_time ? cost_of(x) : days_of(x), yb = by_time ? cost_of(y) : days_of(y);
    return xb != yb ? xb < yb : a < b;
  };
  std::map<std::string, std::size_t> pick;
  for (std::size_t i = 0; i < out.options.size(); ++i) {
    const CapacityOption& o = out.options[i];
    if (!usable(o) || (req.deadline_days && days_of(o) > *req.deadline_days) ||
        (req.budget_usd && cost_of(o) > *req.budget_usd)) {
      continue;
    }
    auto [it, added] = pick.emplace(o.cluster, i);
    if (!added && better(i, it->second)) it->second = i;
  }
  for (const auto& [cluster, i] : pick) out.ranking.push_back(i);
  std::sort(out.ranking.begin(), out.ranking.end(), better);
}


// One cluster and GPU count: its fastest layout and the time, cost and energy to train the tokens.
CapacityOption evaluate_option(const LayerGraph& graph, const CapacityRequest& req, const Cluster& c, int gpus,
                               bool price_given) {
  CapacityOption o;
  o.cluster = c.name;
  o.gpus = gpus;
  o.price_per_gpu_hour = c.price_per_gpu_hour;
  o.price_given = price_given;
  o.power_per_gpu_w = c.power_per_gpu;
  const SearchSpace space = option_space(graph, req, c, gpus);
  if (c.gpu.peak(space.dtype) <= 0) {
    o.why = fmt::format("unsupported dtype ({} has no {} peak)", c.gpu.name, to_string(space.dtype));
    return o;
  }
  SearchResult r = search(graph, c, req.software, space, option_search(req));
  o.stats = r.stats;
  if (r.top.empty()) {
    o.why = no_layout_reason(r);
    return o;
  }
  o.feasible = true;
  o.best = std::move(r.top.front());
  // Time to train = tokens / (tokens/s); GPU-hours = GPUs x hours; cost = GPU-hours x price;
  // energy (kWh) = power per GPU (W) x GPUs x hours / 1000.
  o.hours = req.tokens / o.best.throughput.tokens_per_s / 3600.0;
  o.days = o.hours / 24.0;
  // Dedicated parameter-server nodes are paid for and powered too (param_server.hpp).
  const int billed = billed_gpus(o.best.strategy, c);
  o.gpu_hours = billed * o.hours;
  o.cost_usd = o.gpu_hours * c.price_per_gpu_hour;
  o.energy_kwh = c.power_per_gpu * billed * o.hours / 1000.0;
  if (req.reliability) add_failures(o, graph, req, c);
  return o;
}

// The cheapest option meeting the deadline and the fastest within the budget (ties: the earlier
// option), and the cost/time Pareto front: sorted by time, each option cheaper than all faster ones.
void pick_options(CapacityResult& out, const CapacityRequest& req) {
  for (std::size_t i = 0; i < out.options.size(); ++i) {
    const CapacityOption& o = out.options[i];
    if (!usable(o)) continue;
    if (req.deadline_days && days_of(o) <= *req.deadline_days &&
        (!out.cheapest_in_deadline || cost_of(o) < cost_of(out.options[*out.cheapest_in_deadline]))) {
      out.cheapest_in_deadline = i;
    }
    if (req.budget_usd && cost_of(o) <= *req.budget_usd &&
        (!out.fastest_in_budget || days_of(o) < days_of(out.options[*out.fastest_in_budget]))) {
      out.fastest_in_budget = i;
    }
  }
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < out.options.size(); ++i)
    if (usable(out.options[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = out.options[a];
    const auto& y = out.options[b];
    return days_of(x) != days_of(y) ? days_of(x) < days_of(y) : cost_of(x) < cost_of(y);
  });
  double cheapest = std::numeric_limits<double>::infinity();
  for (std::size_t i : order) {
    if (cost_of(out.options[i]) < cheapest) {
      out.pareto.push_back(i);
      cheapest = cost_of(out.options[i]);
    }
  }
}

}  // namespace

const char* describe(RankingRule r) {
  switch (r) {
    case RankingRule::cheapest_in_deadline: return "cheapest option within the deadline, by cost";
    case RankingRule::fastest_in_budget: return "fastest option within the budget, by time";
    case RankingRule::cheapest: return "cheapest option, by cost";
  }
  return "?";
}

CapacityResult plan_capacity(const LayerGraph& graph, const CapacityRequest& req) {
  const auto start = std::chrono::steady_clock::now();
  if (req.clusters.empty()) throw InputError("--clusters: must name at least one cluster");
  if (!(req.tokens > 0)) throw InputError(fmt::format("--tokens {}: must be > 0", req.tokens));
  for (const auto& price : req.prices) {  // (a named pair, not a structured binding: clang's lambdas)
    const std::string& name = price.first;
    if (std::none_of(req.clusters.begin(), req.clusters.end(), [&](const Cluster& c) { return c.name == name; })) {
      throw InputError(fmt::format("--price {}={:g}: {} is not one of the clusters compared", name, price.second, name));
    }
  }
  CapacityResult out;
  out.reliability = req.reliability;
  for (Cluster c : req.clusters) {
    const auto given = req.prices.find(c.name);
    if (given != req.prices.end()) c.price_per_gpu_hour = given->second;
    for (int gpus : capacity_gpu_counts(c, req.gpus_lo, req.gpus_hi)) {
      out.options.push_back(evaluate_option(graph, req, c, gpus, given != req.prices.end()));
    }
  }
  pick_options(out, req);
  rank_clusters(out, req);
  out.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace trainplan
