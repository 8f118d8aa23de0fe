// Parameter servers (Li et al., "Scaling Distributed Machine Learning with the Parameter Server",
// OSDI 2014; BytePS, Jiang et al. OSDI 2020, Sec. 3 for the colocated/dedicated traffic analysis):
// every worker GPU pushes its gradients to S server shards and pulls the updated parameters back.
// Server s holds 1/S of the parameters (of every TP/PP shard). Assumptions, stated:
//   - the L data-parallel replicas of a shard that share a node first reduce-scatter their
//     gradients over the node link, each GPU pushes its 1/L of the node's sum and pulls its 1/L
//     of the parameters, then the node all-gathers them (BytePS, Sec. 4.1); L = 1 when a node
//     holds no two replicas of one shard. Traffic is spread evenly over the shards;
//   - links are full-duplex and push/pull are pipelined over gradient buckets, so a step's
//     transfer takes the busiest (link, direction)'s bytes / bandwidth, the node-link part
//     (L-1)/L max(P, Q) / node bandwidth included in that maximum;
//   - a server node has the same NICs as a worker node (gpus_per_node x the tier's per-GPU
//     bandwidth x efficiency) and applies the optimizer to its shard at a worker GPU's rate on each
//     of its GPUs.
// Network: the innermost network tier spanning the job's nodes (plus the dedicated servers').
// With b the per-GPU NIC bandwidth, w worker GPUs per node, N job nodes, g GPUs (NICs) per server
// node, P and Q = the bytes one GPU's gradient and parameter shards hold / L:
//   dedicated:  t = max(P, Q) / b x max(1, N w / (S g))          (workers' NIC vs servers' NIC)
//   colocated:  a server node receives pushes of the N-1 other nodes and its own workers' pulls
//               from the S-1 other servers (and sends the converse):
//               t = max( (P (N-1) + Q (S-1)) / S, (Q (N-1) + P (S-1)) / S, S < N ? max(P, Q) : 0 ) / b
//               On one node (N = 1) the servers are the node's w GPUs (S = w) over the node link
//               (b = the node link's per-GPU bandwidth); with S = N and P = Q = M it is the ring
//               all-reduce's 2 (N-1)/N M / b.
// Latency: each bucket's push and pull are two messages on the tier (2 x latency per bucket).
// Async PS (ps_async): no barrier; with identical workers the per-worker step time is the
// synchronous one (the model has no speed variance for the barrier to cost), every worker applies
// its own update (dp updates per step time), and an update is stale by the updates the other
// workers applied since its pull: W - 1 under round-robin arrival (Li et al. 2014, Sec. 4.2's
// bounded delay; Dean et al. 2012 Downpour SGD).
#pragma once
#include "sim/cluster.hpp"
#include "sim/collectives.hpp"
#include "sim/estimate.hpp"
#include "sim/strategy.hpp"
#include "sim/units.hpp"

namespace trainplan {

struct PsNetwork {
  PsPlacement placement = PsPlacement::dedicated;
  int servers = 1;            // S
  int nodes = 1;              // N: nodes the job's workers occupy
  int workers_per_node = 1;   // w
  int server_nics = 1;        // g: GPUs (NICs) of a dedicated server node
  int local_replicas = 1;     // L: data-parallel replicas of one shard on a node (pre-reduction)
  BytesPerSecond node_bandwidth = 0;  // the node link per GPU, for the pre-reduction
  BytesPerSecond gpu_bandwidth = 0;  // b
  Seconds latency = 0;        // per message
  Seconds call_overhead = 0;  // the cluster's fixed cost of one push/pull call (collectives.call_overhead)
};

// The network the strategy's parameter servers use on cluster `c`, whose data-parallel group (the
// dp x cp replicas of each parameter shard, PlanShape's groups.dp) is `dp`. PlanShape holds it.
PsNetwork ps_network(const Cluster& c, const Strategy& s, const GroupLink& dp);
// The same with the strategy's data-parallel group placed by RankLayout (parallel_groups()).
PsNetwork ps_network(const Cluster& c, const Strategy& s);

// Seconds for every worker GPU to push `push` bytes and pull `pull` bytes (bandwidth only; see the
// formulas above).
Seconds ps_transfer_time(const PsNetwork& n, Bytes push, Bytes pull);

// Seconds for every worker to push `push` and pull `pull` bytes in `rounds` rounds (PowerSGD
// sends two): per round one call and a message each way, rounds x (call_overhead + 2 latency),
// plus the transfer (ps_transfer_time).
Seconds ps_push_pull_time(const PsNetwork& n, int rounds, Bytes push, Bytes pull);

// Parameters each server GPU updates per step: total / (S x GPUs per server node).
double ps_params_per_server_gpu(double total_params, const PsNetwork& n);

// GPUs a plan occupies and pays for: its own plus, with dedicated parameter servers, the S server
// nodes' (S x gpus_per_node; a server node is costed and powered as a node of the cluster).
int billed_gpus(const Strategy& s, const Cluster& c);

// Expected staleness of an asynchronous update, in updates: W - 1 for W workers (replicas).
double ps_async_staleness(int workers);

// Fills e.ps from e.strategy and e.time.step (nothing without parameter servers).
void set_parameter_server_figures(Estimate& e);

}  // namespace trainplan
