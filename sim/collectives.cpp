#include "sim/collectives.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace trainplan {

namespace {

// Where a group's ranks sit: n ranks, N nodes, r = ceil(n / N) per node.
struct Span {
  double n, nodes, per_node;
};

Span span_of(int n, const Link& l) {
  const int r = std::clamp(l.ranks_per_node, 1, n);
  return {static_cast<double>(n), static_cast<double>((n + r - 1) / r), static_cast<double>(r)};
}

double ceil_log2(double x) { return x <= 1 ? 0.0 : std::bit_width(static_cast<unsigned>(x - 1)); }

// One line per algorithm: its latency for a group at `l`, and the bytes it moves per rank as a
// multiple of M (the bus-bandwidth factor). An algorithm a tier cannot run costs infinity.
struct Algorithm {
  Seconds (*latency)(const Span& s, const Link& l);
  double (*bus_factor)(const Span& s);
  bool (*runs_on)(const Span& s, const Link& l);
};

// Ring all-reduce: a reduce-scatter and an all-gather round the ring.
Seconds ring_ar_latency(const Span& s, const Link& l) {
  return 2 * ((s.n - s.nodes) * l.intra_latency + (s.nodes - 1) * l.latency);
}
double ring_ar_factor(const Span& s) { return 2 * (s.n - 1) / s.n; }
// Tree all-reduce: up and down a chain inside each node and a binary tree between the nodes.
Seconds tree_ar_latency(const Span& s, const Link& l) {
  return 2 * ((s.per_node - 1) * l.intra_latency + ceil_log2(s.nodes) * l.latency);
}
double tree_ar_factor(const Span&) { return 2; }
// In-network all-reduce: inside each node a reduce-scatter and all-gather over the node link, one
// trip through the switches between nodes.
Seconds in_network_latency(const Span& s, const Link& l) { return 2 * (s.per_node - 1) * l.intra_latency + l.latency; }
double in_network_factor(const Span&) { return 1; }
bool in_network_runs(const Span& s, const Link& l) { return l.in_network_reduction && s.nodes > 1; }
// Ring reduce-scatter or all-gather: half a ring all-reduce.
Seconds ring_half_latency(const Span& s, const Link& l) {
  return (s.n - s.nodes) * l.intra_latency + (s.nodes - 1) * l.latency;
}
double ring_half_factor(const Span& s) { return (s.n - 1) / s.n; }
Seconds one_step(const Span&, const Link& l) { return l.latency; }
double one(const Span&) { return 1; }
bool always(const Span&, const Link&) { return true; }

// The table: each collective's algorithms.
constexpr Algorithm kAllReduce[] = {{ring_ar_latency, ring_ar_factor, always},
                                    {tree_ar_latency, tree_ar_factor, always},
                                    {in_network_latency, in_network_factor, in_network_runs}};
constexpr Algorithm kHalf[] = {{ring_half_latency, ring_half_factor, always}};
constexpr Algorithm kSendRecv[] = {{one_step, one, always}};

template <std::size_t N>
Seconds cheapest(const Algorithm (&algos)[N], int n, Bytes m, const Link& l) {
  const Span s = span_of(n, l);
  Seconds best = std::numeric_limits<double>::infinity();
  for (const auto& a : algos) {
    if (a.runs_on(s, l)) best = std::min(best, a.latency(s, l) + a.bus_factor(s) * m / l.bandwidth);
  }
  return best;
}

}  // namespace

const LinkTier* spanning_tier(const Cluster& c, long long extent) {
  if (extent <= c.gpus_per_node || c.network.empty()) return nullptr;
  for (const auto& t : c.network) {
    if (extent <= t.span_gpus) return &t;
  }
  return &c.network.back();
}

Link group_link(const Cluster& c, int size, int stride) {
  if (size <= 1) return {};
  const int gpn = c.gpus_per_node;
  const BytesPerSecond node_bw = c.node.bandwidth * c.node.efficiency;
  const LinkTier* tier = spanning_tier(c, static_cast<long long>(stride) * size);  // ranks the group covers
  if (!tier) return {c.node.latency, node_bw};
  const int per_node = std::clamp(gpn / std::max(stride, 1), 1, size);
  const BytesPerSecond bw = std::min(node_bw, per_node * tier->bandwidth * tier->efficiency);
  return {tier->latency, bw, per_node, c.node.latency, tier->in_network_reduction};
}

GroupLink group_of(const Cluster& c, int size, int stride) {
  return {size, stride, group_link(c, size, stride), c.collectives.call_overhead};
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
    case Collective::send_recv: return cheapest(kSendRecv, n, message, link);
  }
  return 0;
}

}  // namespace trainplan
