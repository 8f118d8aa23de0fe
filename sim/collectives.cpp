#include "sim/collectives.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace trainplan {

namespace {

struct Algorithm {
  double (*steps)(int n);       // latency steps
  double (*bus_factor)(int n);  // bytes moved per rank, as a multiple of M
  bool in_switch = false;       // runs at the link's in-switch bandwidth (none: not available)
};

double ring_ar_steps(int n) { return 2.0 * (n - 1); }
double ring_ar_factor(int n) { return 2.0 * (n - 1) / n; }
double tree_ar_steps(int n) { return 2.0 * std::bit_width(static_cast<unsigned>(n - 1)); }  // 2 ceil(log2 n)
double tree_ar_factor(int) { return 2.0; }
double ring_half_steps(int n) { return n - 1.0; }
double ring_half_factor(int n) { return (n - 1.0) / n; }
double one(int) { return 1.0; }
// In-switch all-reduce (NVLink SHARP, NCCL's NVLS): each rank sends its M bytes into the switch,
// which reduces and multicasts them back: n + 1 sends and receives of M/n per rank instead of the
// ring's 2(n - 1) (github NVIDIA/nccl-tests issue #238), in two steps (reduce, multicast).
double two(int) { return 2.0; }
double in_switch_factor(int n) { return (n + 1.0) / n; }

// The table: each collective's algorithms. NVLS gives all-gather and reduce-scatter no bandwidth
// gain (each rank still receives or sends (n - 1)/n M; NVIDIA/nccl issue #1506), so only the
// all-reduce has it.
constexpr Algorithm kAllReduce[] = {
    {ring_ar_steps, ring_ar_factor}, {tree_ar_steps, tree_ar_factor}, {two, in_switch_factor, true}};
constexpr Algorithm kHalf[] = {{ring_half_steps, ring_half_factor}};
constexpr Algorithm kSendRecv[] = {{one, one}};

template <std::size_t N>
Seconds cheapest(const Algorithm (&algos)[N], int n, Bytes m, const Link& l) {
  Seconds best = std::numeric_limits<double>::infinity();
  for (const auto& a : algos) {
    const BytesPerSecond bw = a.in_switch ? l.in_switch_bandwidth : l.bandwidth;
    if (bw > 0) best = std::min(best, a.steps(n) * l.latency + a.bus_factor(n) * m / bw);
  }
  return best;
}

}  // namespace

const LinkTier* spanning_tier(const Cluster& c, long long extent) {
  if (extent <= c.scale_up_gpus || c.network.empty()) return nullptr;
  for (const auto& t : c.network) {
    if (extent <= t.span_gpus) return &t;
  }
  return &c.network.back();
}

Link group_link(const Cluster& c, int size, int stride) {
  if (size <= 1) return {};
  const BytesPerSecond node_bw = c.node.bandwidth * c.node.efficiency;
  const LinkTier* tier = spanning_tier(c, static_cast<long long>(stride) * size);  // ranks the group covers
  if (!tier) {
    // Inside the scale-up domain. A full-mesh node (no switch) gives a group of n of its GPUs
    // the n - 1 links to the others; a switched domain gives every group the whole per-GPU link,
    // and its switch may reduce in-network.
    Link l{c.node.latency, node_bw, 0};
    if (c.peer_link_bandwidth > 0) l.bandwidth = std::min(node_bw, (size - 1) * c.peer_link_bandwidth * c.node.efficiency);
    l.in_switch_bandwidth = c.node.bandwidth * c.in_switch_reduction.efficiency;
    return l;
  }
  // Across domains: the group's members inside one domain each drive their own NIC.
  const int per_domain = std::clamp(c.scale_up_gpus / std::max(stride, 1), 1, size);
  const BytesPerSecond bw = std::min(node_bw, per_domain * tier->bandwidth * tier->efficiency);
  return {tier->latency, bw, 0};
}

AllToAllLink all_to_all_link(const Cluster& c, int size, int stride) {
  AllToAllLink a;
  if (size <= 1) return a;
  a.per_node = std::clamp(c.gpus_per_node / std::max(stride, 1), 1, size);
  a.node = {c.node.latency, c.node.bandwidth * c.node.efficiency};
  if (const LinkTier* tier = spanning_tier(c, static_cast<long long>(stride) * size)) {
    a.network = {tier->latency, tier->bandwidth * tier->efficiency};
  } else {
    a.per_node = size;
  }
  return a;
}

Seconds all_to_all_time(int n, Bytes m, const AllToAllLink& l) {
  if (n <= 1 || m <= 0) return 0;
  const double steps = n - 1.0;
  if (l.per_node >= n || l.network.bandwidth <= 0) return steps * l.node.latency + steps / n * m / l.node.bandwidth;
  const double q = l.per_node;
  return steps * l.network.latency + std::max((q - 1) / n * m / l.node.bandwidth, (n - q) / n * m / l.network.bandwidth);
}

Seconds forwarded_all_to_all_time(int n, Bytes network, Bytes node, const AllToAllLink& l) {
  if (n <= 1) return 0;
  if (l.per_node >= n || l.network.bandwidth <= 0) return (n - 1.0) * l.node.latency + node / l.node.bandwidth;
  const double nodes = std::ceil(static_cast<double>(n) / l.per_node);
  return (nodes - 1) * l.network.latency + std::max(network / l.network.bandwidth, node / l.node.bandwidth);
}

GroupLink group_of(const Cluster& c, int size, int stride) {
  return {size, stride, group_link(c, size, stride), c.collectives.call_overhead, all_to_all_link(c, size, stride)};
}

Seconds collective_time(Collective kind, int n, Bytes message, const Link& link) {
  if (n <= 1 || message <= 0) return 0;
  switch (kind) {
    case Collective::all_reduce: return cheapest(kAllReduce, n, message, link);
    case Collective::reduce_scatter:
    case Collective::all_gather: return cheapest(kHalf, n, message, link);
    case Collective::send_recv: return cheapest(kSendRecv, n, message, link);
    case Collective::all_to_all: return cheapest(kHalf, n, message, link);  // pairwise exchange, one link
  }
  return 0;
}

}  // namespace trainplan
