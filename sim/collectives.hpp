// Collective communication cost: a table of (collective x algorithm) -> latency * steps + bytes /
// bus bandwidth, with latency and bandwidth taken from the cluster tier that a group spans.
// Ring costs (n ranks, message M bytes, per-step latency a, bus bandwidth B), as in NCCL and
// nccl-tests PERFORMANCE.md:
//   all-reduce      ring: 2(n-1) a + 2(n-1)/n M/B     tree: 2 ceil(log2 n) a + 2 M/B
//   reduce-scatter  ring: (n-1) a + (n-1)/n M/B
//   all-gather      ring: (n-1) a + (n-1)/n M/B
//   send/recv       one step: a + M/B
// M is the full (unsharded) buffer: the all-reduced tensor, or the gathered/scattered whole.
#pragma once
#include "sim/cluster.hpp"
#include "sim/units.hpp"

namespace trainplan {

enum class Collective { all_reduce, reduce_scatter, all_gather, send_recv };

struct Link {
  Seconds latency = 0;            // per algorithm step
  BytesPerSecond bandwidth = 0;   // achieved bus bandwidth per rank (0: no communication)
};

// The link a group of `size` ranks uses when its members are `stride` ranks apart (ranks are
// placed on nodes in order). Inside one node: the node link. Across nodes: the innermost network
// tier spanning the group, with its per-GPU bandwidth times the group members sharing a node
// (each GPU has its own NIC), capped by the node link.
Link group_link(const Cluster& c, int size, int stride);

// Time of one collective over `n` ranks: the cheapest algorithm in the table.
Seconds collective_time(Collective kind, int n, Bytes message, const Link& link);

}  // namespace trainplan
