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
};

double ring_ar_steps(int n) { return 2.0 * (n - 1); }
double ring_ar_factor(int n) { return 2.0 * (n - 1) / n; }
double tree_ar_steps(int n) { return 2.0 * std::bit_width(static_cast<unsigned>(n - 1)); }  // 2 ceil(log2 n)
double tree_ar_factor(int) { return 2.0; }
double ring_half_steps(int n) { return n - 1.0; }
double ring_half_factor(int n) { return (n - 1.0) / n; }
double one(int) { return 1.0; }

// The table: each collective's algorithms.
constexpr Algorithm kAllReduce[] = {{ring_ar_steps, ring_ar_factor}, {tree_ar_steps, tree_ar_factor}};
constexpr Algorithm kHalf[] = {{ring_half_steps, ring_half_factor}};
constexpr Algorithm kSendRecv[] = {{one, one}};

template <std::size_t N>
Seconds cheapest(const Algorithm (&algos)[N], int n, Bytes m, const Link& l) {
  Seconds best = std::numeric_limits<double>::infinity();
  for (const auto& a : algos) best = std::min(best, a.steps(n) * l.latency + a.bus_factor(n) * m / l.bandwidth);
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
  return {tier->latency, bw};
}

GroupLink group_of(const Cluster& c, int size, int stride) {
  return {size, stride, group_link(c, size, stride), c.collectives.call_overhead};
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
