#include "sim/param_server.hpp"

#include <algorithm>

#include "sim/collectives.hpp"
#include "sim/plan_shape.hpp"

namespace trainplan {

PsNetwork ps_network(const Cluster& c, const Strategy& s, const GroupLink& dp) {
  PsNetwork n;
  n.placement = s.ps_placement;
  n.servers = s.ps_servers;
  n.nodes = job_nodes(s, c);
  n.workers_per_node = std::min(s.gpus(), c.gpus_per_node);
  n.server_nics = c.gpus_per_node;
  n.call_overhead = c.collectives.call_overhead;
  n.node_bandwidth = c.node.bandwidth * c.node.efficiency;
  // Replicas of one shard on a node: the DP (and CP) group's members within gpus_per_node ranks.
  n.local_replicas = std::clamp(c.gpus_per_node / std::max(dp.stride, 1), 1, dp.size);
  if (n.nodes == 1 && n.placement == PsPlacement::colocated) {
    // One node: the servers are spread over its GPUs, traffic stays on the node link.
    n.gpu_bandwidth = c.node.bandwidth * c.node.efficiency;
    n.latency = c.node.latency;
    return n;
  }
  // The job's nodes and, dedicated, the servers' beyond them.
  const long long extent = (n.nodes + (n.placement == PsPlacement::dedicated ? n.servers : 0LL)) * c.gpus_per_node;
  const LinkTier* tier = spanning_tier(c, extent);
  if (!tier) {  // a single-node cluster: its "network" is the node link
    n.gpu_bandwidth = c.node.bandwidth * c.node.efficiency;
    n.latency = c.node.latency;
    return n;
  }
  n.gpu_bandwidth = tier->bandwidth * tier->efficiency;
  n.latency = tier->latency;
  return n;
}

PsNetwork ps_network(const Cluster& c, const Strategy& s) { return ps_network(c, s, parallel_groups(c, s).dp); }

Seconds ps_transfer_time(const PsNetwork& n, Bytes push, Bytes pull) {
  if (n.gpu_bandwidth <= 0 || (push <= 0 && pull <= 0)) return 0;
  const double b = n.gpu_bandwidth, S = n.servers;
  if (n.nodes == 1 && n.placement == PsPlacement::colocated) {
    // One node: the units are its GPUs, each a server of 1/w of the shard, over the node link.
    const double w = n.workers_per_node;
    return std::max((push + pull) * (w - 1) / w, 0.0) / b;
  }
  // Intra-node pre-reduction and gather, then each GPU's 1/L share over the network.
  const double L = n.local_replicas;
  const Seconds local = L > 1 && n.node_bandwidth > 0 ? (L - 1) / L * std::max(push, pull) / n.node_bandwidth : 0.0;
  push /= L;
  pull /= L;
  if (n.placement == PsPlacement::dedicated) {
    const double fan_in = static_cast<double>(n.nodes) * n.workers_per_node / (S * n.server_nics);
    return std::max(local, std::max(push, pull) / b * std::max(1.0, fan_in));
  }
  const double N = n.nodes;
  const double in = (push * (N - 1) + pull * (S - 1)) / S;
  const double out = (pull * (N - 1) + push * (S - 1)) / S;
  const double plain = S < N ? std::max(push, pull) : 0.0;
  return std::max(local, std::max({in, out, plain}) / b);
}

Seconds ps_push_pull_time(const PsNetwork& n, int rounds, Bytes push, Bytes pull) {
  return rounds * (n.call_overhead + 2 * n.latency) + ps_transfer_time(n, push, pull);
}

double ps_params_per_server_gpu(double total_params, const PsNetwork& n) {
  return total_params / (static_cast<double>(n.servers) * n.server_nics);
}

int billed_gpus(const Strategy& s, const Cluster& c) {
  const bool dedicated = s.uses_ps() && s.ps_placement == PsPlacement::dedicated;
  return s.gpus() + (dedicated ? s.ps_servers * c.gpus_per_node : 0);
}

double ps_async_staleness(int workers) { return std::max(0, workers - 1); }

void set_parameter_server_figures(Estimate& e) {
  const Strategy& s = e.strategy;
  if (!s.uses_ps() || e.time.step <= 0) return;
  const bool async = s.dp_algorithm == DpAlgorithm::ps_async;
  e.ps.workers = s.dp;
  e.ps.staleness = async ? ps_async_staleness(s.dp) : 0.0;
  e.ps.updates_per_s = (async ? s.dp : 1) / e.time.step;
}

}  // namespace trainplan
