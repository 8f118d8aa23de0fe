// Collective communication cost: a table of (collective x algorithm) -> latency x steps + bytes /
// bus bandwidth, with latency and bandwidth taken from the cluster tier that a group spans; each
// call takes the cheapest algorithm of its collective, as NCCL's tuner does (src/graph/tuning.cc:
// ncclTopoTuneModel and ncclTopoGetAlgoTime, time = latency + bytes / algorithm bandwidth).
//
// n ranks on N scale-up domains (nodes, or e.g. 72-GPU NVLink racks), r = n / N of them per domain
// (Link::ranks_per_node), message M bytes, bus bandwidth B, a per step over the network (the
// tier's latency), a_i per step over the node link. NCCL's model counts a ring's steps by where
// they go: of a ring's n - 1 steps, N - 1 cross between domains and n - N stay inside one
// (tuning.cc: nInterSteps; nccl-tests PERFORMANCE.md for the bus-bandwidth factors):
//   all-reduce  ring:        2(n-N) a_i + 2(N-1) a  + 2(n-1)/n M/B
//               tree:        2((r-1) a_i + ceil(log2 N) a) + 2 M/B   (double binary tree between
//                            domains, a chain inside each; NCCL 2.4+)
//               in-network:  2(r-1) a_i + a + M/B   (CollNet/SHARP, only on a network tier that
//                            declares in_network_reduction: the switches reduce, so each byte goes
//                            up once and the result comes down once instead of 2(n-1)/n times)
//               in-switch:   2 a + (n+1)/n M/B_s, B_s = the node link x in_switch_reduction.efficiency
//                            (NVLink SHARP, NCCL's NVLS, inside a scale-up domain whose cluster has it)
//   reduce-scatter, all-gather  ring: (n-N) a_i + (N-1) a + (n-1)/n M/B
//   send/recv   one step: a + M/B
//   all-to-all      pairwise exchange (Thakur, Rabenseifner & Gropp 2005, "Optimization of
//                   Collective Communication Operations in MPICH", Sec. 3.5; NCCL's alltoall, whose
//                   bus bandwidth nccl-tests PERFORMANCE.md counts as (n-1)/n of the algorithm's):
//                   (n-1) a + (n-1)/n M/B, M the bytes one rank sends in all (its own share included)
// M is the full (unsharded) buffer: the all-reduced tensor, or the gathered/scattered whole.
// Inside one domain (N = 1) every step is a node-link step and a = the node link's latency.
// Where the cluster measured its node's all-reduces (Cluster::node_all_reduce, nccl-tests on the
// whole node), a collective inside one node takes its time from that curve instead of the table:
// f M / B(M), f the ring's bus-bandwidth factor, B(M) the measured bus bandwidth at M (what NCCL
// reached with the algorithm it chose; nccl-tests defines bus bandwidth so that it does not
// depend on n, and its curve holds the latency too).
// Checked against nccl-tests on 8 GPUs (github NVIDIA/nccl issue #2140, large messages): H100 ring
// busbw 370 GB/s of 450 (efficiency 0.82; algbw 211 = 370 / (2 x 7/8)), NVLS algbw 275 GB/s
// (= 309 GB/s of link x 8/9: efficiency 0.69); B300 ring 695 of 900, NVLS algbw 483 (0.60).
// An all-to-all over a group spanning nodes sends (q-1)/n of M over the node link and (n-q)/n over
// each GPU's own network link at once (q members per node): GroupLink::all_to_all. NCCL's alltoall
// cannot aggregate several NICs: each GPU's inter-node share goes through its own (NCCL maintainer,
// github NVIDIA/nccl-tests issue #267).
#pragma once
#include "sim/cluster.hpp"
#include "sim/units.hpp"

namespace trainplan {

enum class Collective { all_reduce, reduce_scatter, all_gather, send_recv, all_to_all };

struct Link {
  Seconds latency = 0;            // per algorithm step between domains (inside one: the node link's)
  BytesPerSecond bandwidth = 0;   // achieved bus bandwidth per rank (0: no communication)
  BytesPerSecond in_switch_bandwidth = 0;  // achieved link bandwidth under in-switch reduction (0: none)
  int ranks_per_node = 1;         // group members in one scale-up domain; steps among them take intra_latency
  Seconds intra_latency = 0;      // per step over the node link, where ranks_per_node > 1
  bool in_network_reduction = false;  // the network tier reduces in its switches (LinkTier)
  // A group inside one node of a cluster that measured its node's all-reduces: its ring
  // collectives take the bus bandwidth at their message size from this curve (capped at
  // `bandwidth`), the curve's time standing for latency and bandwidth both. The Cluster owns it.
  const BusBandwidthCurve* measured = nullptr;
};

// The network tier that traffic among `extent` consecutive ranks takes (ranks are placed on
// nodes in order): the innermost tier whose span covers them, the outermost where none does;
// nullptr where they fit in one scale-up domain (one node, or e.g. a 72-GPU NVLink rack) or the
// cluster has no network (the node link carries it). A group of at most a domain's ranks is
// assumed to be placed inside one domain (schedulers allocate racks in aligned blocks).
// The one tier lookup: group links (below) and parameter servers (param_server.hpp) both use it.
const LinkTier* spanning_tier(const Cluster& c, long long extent);

// The link a group of `size` ranks uses when its members are `stride` ranks apart. Inside one
// scale-up domain: the node link (on a full-mesh node, size - 1 of its peer links), with the
// domain's in-switch reduction where it has one. Across domains: spanning_tier(size x stride),
// with its per-GPU bandwidth times the group members inside one domain (each GPU has its own NIC),
// capped by the node link; the members sharing a domain step to each other over the node link.
Link group_link(const Cluster& c, int size, int stride);

// Time of one collective over `n` ranks: the cheapest algorithm in the table.
Seconds collective_time(Collective kind, int n, Bytes message, const Link& link);

// How an all-to-all over a group crosses the cluster: the members sharing a node exchange over the
// node link, the others over each GPU's own link on the tier spanning the group, both at once.
struct AllToAllLink {
  int per_node = 1;  // members of the group in one scale-up domain (its size where it fits in one)
  Link node;         // the node link (bandwidth x efficiency)
  Link network;      // one GPU's link on the spanning tier (its NIC: bandwidth x efficiency); zero
                     // where the group fits in one node
};
// The all-to-all link of a group of `size` ranks `stride` apart (the tiers as group_link's).
AllToAllLink all_to_all_link(const Cluster& c, int size, int stride);
// One all-to-all over `n` ranks of which one sends `message` bytes in all (pairwise exchange):
//   inside a node     (n-1) a_node + (n-1)/n M / B_node
//   across nodes      (n-1) a_net + max((q-1)/n M / B_node, (n-q)/n M / B_net)
Seconds all_to_all_time(int n, Bytes message, const AllToAllLink& link);
// An all-to-all that crosses the network once per destination node and forwards over the node link
// there (DeepEP's normal kernels, NVIDIA HybridEP: Megatron-core's "flex" dispatcher), in which one
// member sends `network` bytes over its NIC and `node` bytes over the node link, both at once:
//   (nodes - 1) a_net + max(network / B_net, node / B_node), or inside a node (n-1) a_node + node / B_node.
Seconds forwarded_all_to_all_time(int n, Bytes network, Bytes node, const AllToAllLink& link);
// `link` with its bandwidth capped at `cap` bytes/s (0: no cap): a stack whose own copies and
// synchronisation around each call bound how fast its collectives move data (Software::zero3).
Link capped(Link link, BytesPerSecond cap);

// One parallel group as its collectives see it. Every method is the cost of ONE call on the
// group: the table's latency x steps + bytes / bus bandwidth, plus the cluster's fixed per-call
// overhead (CollectiveCosts::call_overhead: launch, proxy, synchronisation); a group of one rank
// communicates nothing and costs 0. Callers multiply by the number of calls they make.
struct GroupLink {
  int size = 1;               // ranks in the group
  int stride = 1;             // rank distance between neighbouring members (RankLayout::stride)
  Link link;                  // the link its traffic takes (group_link, or see PlanShape's pp group)
  Seconds call_overhead = 0;  // the cluster's per-call overhead
  AllToAllLink a2a;           // how an all-to-all crosses the cluster (all_to_all_link)

  Seconds all_reduce(Bytes message) const { return call(Collective::all_reduce, size, message); }
  Seconds reduce_scatter(Bytes message) const { return call(Collective::reduce_scatter, size, message); }
  Seconds all_gather(Bytes message) const { return call(Collective::all_gather, size, message); }
  // A send from one member to its neighbour (a ring or pipeline step: two ranks).
  Seconds send_recv(Bytes message) const { return call(Collective::send_recv, 2, message); }
  // An all-to-all in which each member sends `message` bytes in all (experts' token dispatch).
  Seconds all_to_all(Bytes message) const {
    return size > 1 && message > 0 ? all_to_all_time(size, message, a2a) + call_overhead : 0.0;
  }
  Seconds forwarded_all_to_all(Bytes network, Bytes node) const {
    return size > 1 && network + node > 0 ? forwarded_all_to_all_time(size, network, node, a2a) + call_overhead : 0.0;
  }

 private:
  Seconds call(Collective kind, int n, Bytes message) const {
    return size > 1 ? collective_time(kind, n, message, link) + call_overhead : 0.0;
  }
};

// The group of `size` ranks `stride` apart on cluster `c`: group_link's link, the cluster's
// per-call overhead.
GroupLink group_of(const Cluster& c, int size, int stride);

}  // namespace trainplan
