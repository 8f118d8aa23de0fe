// capacity: which cluster kind and size to buy. For each cluster kind and GPU count (whole nodes,
// a power of two of them), the fastest layout found by search(), and from it the time to train a
// token budget, GPU-hours, cost and energy; then the cheapest option meeting a deadline and the
// fastest one within a budget. With a Reliability (goodput.hpp), each option also gets its
// checkpoint interval, goodput and failure-aware time/cost/energy; with `elastic`, the fastest
// layout after losing one node (a re-search on GPUs - gpus_per_node) and the time to resume.
#pragma once
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sim/cluster.hpp"
#include "sim/software.hpp"
#include "sim/estimate.hpp"
#include "sim/goodput.hpp"
#include "sim/layer_graph.hpp"
#include "sim/search.hpp"

namespace trainplan {

struct CapacityRequest {
  std::vector<Cluster> clusters;
  // USD per GPU-hour given for a cluster (by name) over its file's price (--price NAME=USD).
  std::map<std::string, double> prices;
  Software software;              // the training stack costed on every cluster
  int gpus_lo = 0, gpus_hi = 0;   // GPU counts considered; 0: one node .. the cluster's size
  double tokens = 0;              // tokens to train on
  int global_batch = 1;           // sequences per step
  std::optional<double> deadline_days;
  std::optional<double> budget_usd;
  Dtype dtype = Dtype::bf16;      // the rest of the space is default_space() of each cluster
  Attention attention = Attention::flash;
  CudaGraphs cuda_graphs = CudaGraphs::none;
  unsigned cuda_graph_modules = 0;  // Strategy::cuda_graph_modules of every candidate
  int threads = 0;
  std::optional<Reliability> reliability;  // failures and checkpoints; none: failure-free figures only
  bool elastic = false;                    // also re-search each option without one node
  // The data-parallel part of each search space (search.hpp; default: all-reduce, no compression).
  std::vector<DpAlgorithm> dp_algorithms{DpAlgorithm::allreduce};
  std::vector<GradCompression> grad_compressions{GradCompression{}};
  int ps_servers = 1;
  PsPlacement ps_placement = PsPlacement::dedicated;
  bool fp32_grad_accum = false;
  ExpertSpace experts;  // the expert part of each search space (models with experts)
};

// The option after losing one node (CapacityRequest::elastic).
struct ElasticOption {
  int gpus = 0;                   // GPUs left: the option's - gpus_per_node (0: none left)
  bool feasible = false;
  std::string why;                // when infeasible
  Estimate best;                  // fastest layout on at most the GPUs left (any whole-node count)
  double throughput_share = 0;    // its tokens/s / the option's
  Seconds resume = 0;             // restart + reading the checkpoint on the GPUs left
};

struct CapacityOption {
  std::string cluster;
  int gpus = 0;
  bool feasible = false;
  std::string why;                // when infeasible: the most common reason, or "no valid layout"
  Estimate best;                  // fastest layout (when feasible)
  double days = 0, hours = 0, gpu_hours = 0, cost_usd = 0, energy_kwh = 0;
  double price_per_gpu_hour = 0, power_per_gpu_w = 0;  // inputs of the figures, from the cluster file
  bool price_given = false;       // the price is the request's (--price), not the cluster file's
  SearchStats stats;
  // With a Reliability: goodput and the figures above divided by it (feasible options only).
  bool with_failures = false;
  Goodput goodput;
  double days_with_failures = 0, gpu_hours_with_failures = 0, cost_usd_with_failures = 0,
         energy_kwh_with_failures = 0;
  std::optional<ElasticOption> elastic;
};

// How the buyer's comparison picks each cluster's option and orders them. With a deadline: its
// cheapest option finishing in time (and within the budget, when one is given), by cost; with a
// budget only: its fastest option within it, by time; with neither: its cheapest option, by cost.
// Failure-aware figures where failures are costed; ties go to the faster, then the earlier option.
enum class RankingRule { cheapest_in_deadline, fastest_in_budget, cheapest };
const char* describe(RankingRule r);

struct CapacityResult {
  std::vector<CapacityOption> options;            // by cluster (as given), then GPU count
  std::optional<std::size_t> cheapest_in_deadline;  // index into options
  std::optional<std::size_t> fastest_in_budget;     // index into options
  std::vector<std::size_t> pareto;                // feasible options not beaten on both cost and time, by time
  // The buyer's comparison: one option per cluster, best first, picked and ranked by
  // `ranking_rule` (rank_clusters); clusters without such an option are left out.
  std::vector<std::size_t> ranking;
  RankingRule ranking_rule = RankingRule::cheapest;
  std::optional<Reliability> reliability;         // the request's, when failures were costed
  double elapsed_s = 0;
};

// GPU counts tried on `c`: gpus_per_node x 2^k within [lo, hi] (0 = defaults) and the cluster's size.
std::vector<int> capacity_gpu_counts(const Cluster& c, int lo, int hi);

CapacityResult plan_capacity(const LayerGraph& graph, const CapacityRequest& request);

}  // namespace trainplan
