#include "sim/collectives.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace trainplan {

namespace {

// Where a group's ranks sit: n ranks, N scale-up domains, r = ceil(n / N) per domain.
struct Span {
  double n, nodes, per_node;
};

Span span_of(int n, const Link& l) {
  const int r = std::clamp(l.ranks_per_node, 1, n);
  return {static_cast<double>(n), static_cast<double>((n + r - 1) / r), static_cast<double>(r)};
}

double ceil_log2(double x) { return x <= 1 ? 0.0 : std::bit_width(static_cast<unsigned>(x - 1)); }

// One line per algorithm: its latency for a group at `l`, the bytes it moves per rank as a
// multiple of M (the bus-bandwidth factor), and the bandwidth it runs at (0: the link cannot run it).
struct Algorithm {
  Seconds (*latency)(const Span& s, const Link& l);
  double (*bus_factor)(const Span& s);
  BytesPerSecond (*bandwidth)(const Span& s, const Link& l);
  bool ring = false;  // a ring, whose time a measured node curve gives (Link::measured)
};

BytesPerSecond link_bandwidth(const Span&, const Link& l) { return l.bandwidth; }

// Ring all-reduce: a reduce-scatter and an all-gather round the ring.
Seconds ring_ar_latency(const Span& s, const Link& l) {
  return 2 * ((s.n - s.nodes) * l.intra_latency + (s.nodes - 1) * l.latency);
}
double ring_ar_factor(const Span& s) { return 2 * (s.n - 1) / s.n; }
// Tree all-reduce: up and down a chain inside each domain and a binary tree between the domains.
Seconds tree_ar_latency(const Span& s, const Link& l) {
  return 2 * ((s.per_node - 1) * l.intra_latency + ceil_log2(s.nodes) * l.latency);
}
double tree_ar_factor(const Span&) { return 2; }
// In-network all-reduce (SHARP on the network tier): inside each domain a reduce-scatter and an
// all-gather over the node link, one trip through the switches between domains.
Seconds in_network_latency(const Span& s, const Link& l) { return 2 * (s.per_node - 1) * l.intra_latency + l.latency; }
double in_network_factor(const Span&) { return 1; }
BytesPerSecond in_network_bandwidth(const Span& s, const Link& l) {
  return l.in_network_reduction && s.nodes > 1 ? l.bandwidth : 0.0;
}
// In-switch all-reduce (NVLink SHARP, NCCL's NVLS): each rank sends its M bytes into the switch,
// which reduces and multicasts them back: n + 1 sends and receives of M/n per rank instead of the
// ring's 2(n - 1) (github NVIDIA/nccl-tests issue #238), in two steps (reduce, multicast).
Seconds two_steps(const Span&, const Link& l) { return 2 * l.latency; }
double in_switch_factor(const Span& s) { return (s.n + 1) / s.n; }
BytesPerSecond in_switch_bandwidth(const Span&, const Link& l) { return l.in_switch_bandwidth; }
// Ring reduce-scatter or all-gather: half a ring all-reduce.
Seconds ring_half_latency(const Span& s, const Link& l) {
  return (s.n - s.nodes) * l.intra_latency + (s.nodes - 1) * l.latency;
}
double ring_half_factor(const Span& s) { return (s.n - 1) / s.n; }
Seconds one_step(const Span&, const Link& l) { return l.latency; }
double one(const Span&) { return 1; }

// The table: each collective's algorithms. NVLS and SHARP give all-gather and reduce-scatter no
// bandwidth gain (each rank still receives or sends (n - 1)/n M; NVIDIA/nccl issue #1506), so only
// the all-reduce has them.
constexpr Algorithm kAllReduce[] = {{ring_ar_latency, ring_ar_factor, link_bandwidth, true},
                                    {tree_ar_latency, tree_ar_factor, link_bandwidth},
                                    {in_network_latency, in_network_factor, in_network_bandwidth},
                                    {two_steps, in_switch_factor, in_switch_bandwidth}};
constexpr Algorithm kHalf[] = {{ring_half_latency, ring_half_factor, link_bandwidth, true}};
constexpr Algorithm kSendRecv[] = {{one_step, one, link_bandwidth}};

// The cheapest algorithm's time; on a link with a measured curve, the curve's (it is what NCCL
// reached, whichever algorithm it chose), with the ring's bus-bandwidth factor.
// Sends and all-to-alls are not what the curve measured: they keep the table (curve false).
template <std::size_t N>
Seconds cheapest(const Algorithm (&algos)[N], int n, Bytes m, const Link& l, bool curve = true) {
  const Span s = span_of(n, l);
  const bool measured = curve && l.measured;
  Seconds best = std::numeric_limits<double>::infinity();
  for (const auto& a : algos) {
    const BytesPerSecond bw = a.bandwidth(s, l);
    if (bw <= 0 || (measured && !a.ring)) continue;
    const Seconds t = measured ? a.bus_factor(s) * m / std::min(l.measured->at(m), bw)
                               : a.latency(s, l) + a.bus_factor(s) * m / bw;
    best = std::min(best, t);
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
    if (!c.node_all_reduce.empty() && c.scale_up_gpus == c.gpus_per_node) l.measured = &c.node_all_reduce;
    return l;
  }
  // Across domains: the group's members inside one domain each drive their own NIC and step to
  // each other over the node link.
  const int per_domain = std::clamp(c.scale_up_gpus / std::max(stride, 1), 1, size);
  const BytesPerSecond bw = std::min(node_bw, per_domain * tier->bandwidth * tier->efficiency);
  Link l{tier->latency, bw, 0};
  l.ranks_per_node = per_domain;
  l.intra_latency = c.node.latency;
  l.in_network_reduction = tier->in_network_reduction;
  return l;
}

AllToAllLink all_to_all_link(const Cluster& c, int size, int stride) {
  AllToAllLink a;
  if (size <= 1) return a;
  // The members sharing a scale-up domain (a node, or a 72-GPU NVLink rack) exchange over its link.
  a.per_node = std::clamp(c.scale_up_gpus / std::max(stride, 1), 1, size);
  a.node = {c.node.latency, c.node.bandwidth * c.node.efficiency};
  // A full-mesh node gives each member its links to the other members in the node only.
  if (c.peer_link_bandwidth > 0 && a.per_node > 1)
    a.node.bandwidth = std::min(a.node.bandwidth, (a.per_node - 1) * c.peer_link_bandwidth * c.node.efficiency);
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

Link capped(Link link, BytesPerSecond cap) {
  if (cap > 0) link.bandwidth = std::min(link.bandwidth, cap);
  return link;
}

Seconds collective_time(Collective kind, int n, Bytes message, const Link& link) {
  if (n <= 1 || message <= 0) return 0;
  switch (kind) {
    case Collective::all_reduce: return cheapest(kAllReduce, n, message, link);
    case Collective::reduce_scatter:
    case Collective::all_gather: return cheapest(kHalf, n, message, link);
    case Collective::send_recv: return cheapest(kSendRecv, n, message, link, false);
    case Collective::all_to_all: return cheapest(kHalf, n, message, link, false);  // pairwise exchange, one link
  }
  return 0;
}

}  // namespace trainplan
