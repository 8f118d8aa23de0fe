#include "sim/capacity.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "sim/check.hpp"

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

CapacityResult plan_capacity(const LayerGraph& graph, const CapacityRequest& req) {
  const auto start = std::chrono::steady_clock::now();
  if (req.clusters.empty()) throw InputError("--clusters: must name at least one cluster");
  if (!(req.tokens > 0)) throw InputError(fmt::format("--tokens {}: must be > 0", req.tokens));
  CapacityResult out;
  for (const Cluster& c : req.clusters) {
    for (int gpus : capacity_gpu_counts(c, req.gpus_lo, req.gpus_hi)) {
      SearchSpace space = default_space(c, gpus, req.global_batch, graph.seq_len(), req.attention);
      space.exact_gpus = true;
      space.dtype = req.dtype;
      if (c.gpu.peak(space.dtype) <= 0) {
        CapacityOption o;
        o.cluster = c.name;
        o.gpus = gpus;
        o.price_per_gpu_hour = c.price_per_gpu_hour;
        o.power_per_gpu_w = c.power_per_gpu;
        o.why = fmt::format("unsupported dtype ({} has no {} peak)", c.gpu.name, to_string(space.dtype));
        out.options.push_back(std::move(o));
        continue;
      }
      SearchOptions opt;
      opt.objective = Objective::time;
      opt.top_k = 1;
      opt.keep_infeasible = 0;
      opt.pareto_window = 1;  // no front needed; prune as hard as the bounds allow
      opt.threads = req.threads;
      SearchResult r = search(graph, c, req.software, space, opt);

      CapacityOption o;
      o.cluster = c.name;
      o.gpus = gpus;
      o.price_per_gpu_hour = c.price_per_gpu_hour;
      o.power_per_gpu_w = c.power_per_gpu;
      o.stats = r.stats;
      if (r.top.empty()) {
        o.why = "no valid layout";
        // The most frequent reason; ties go to the alphabetically first name.
        std::int64_t most = 0;
        for (const auto& [reason, n] : r.stats.infeasible_by_reason) {
          const std::string key = reason_key(reason);
          if (n > most || (n == most && n > 0 && key < o.why)) most = n, o.why = key;
        }
        if (r.stats.pruned_out_of_memory > most) o.why = "out of memory";
      } else {
        o.feasible = true;
        o.best = std::move(r.top.front());
        // Time to train = tokens / (tokens/s); GPU-hours = GPUs x hours; cost = GPU-hours x price;
        // energy (kWh) = power per GPU (W) x GPUs x hours / 1000.
        o.hours = req.tokens / o.best.throughput.tokens_per_s / 3600.0;
        o.days = o.hours / 24.0;
        o.gpu_hours = gpus * o.hours;
        o.cost_usd = o.gpu_hours * c.price_per_gpu_hour;
        o.energy_kwh = c.power_per_gpu * gpus * o.hours / 1000.0;
      }
      out.options.push_back(std::move(o));
    }
  }
  // Cheapest meeting the deadline; fastest within the budget (ties: the earlier option).
  for (std::size_t i = 0; i < out.options.size(); ++i) {
    const CapacityOption& o = out.options[i];
    if (!o.feasible) continue;
    if (req.deadline_days && o.days <= *req.deadline_days &&
        (!out.cheapest_in_deadline || o.cost_usd < out.options[*out.cheapest_in_deadline].cost_usd)) {
      out.cheapest_in_deadline = i;
    }
    if (req.budget_usd && o.cost_usd <= *req.budget_usd &&
        (!out.fastest_in_budget || o.days < out.options[*out.fastest_in_budget].days)) {
      out.fastest_in_budget = i;
    }
  }
  // Pareto front over (cost, time): sorted by time, keep each option cheaper than all faster ones.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < out.options.size(); ++i)
    if (out.options[i].feasible) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = out.options[a];
    const auto& y = out.options[b];
    return x.days != y.days ? x.days < y.days : x.cost_usd < y.cost_usd;
  });
  double cheapest = std::numeric_limits<double>::infinity();
  for (std::size_t i : order) {
    if (out.options[i].cost_usd < cheapest) {
      out.pareto.push_back(i);
      cheapest = out.options[i].cost_usd;
    }
  }
  out.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace trainplan
