#include <gtest/gtest.h>

#include "sim/collectives.hpp"
#include "test_helpers.hpp"

namespace trainplan {
namespace {

TEST(Collectives, RingAllReduceForLargeMessages) {
  const Link l{10e-6, 100e9};
  // ring: 2(n-1) a + 2(n-1)/n M/B = 14 * 10us + 1.75 * 10 ms; tree: 6 * 10us + 2 * 10 ms.
  EXPECT_NEAR(collective_time(Collective::all_reduce, 8, 1e9, l), 14 * 10e-6 + 1.75 * 0.01, 1e-12);
}

TEST(Collectives, TreeAllReduceForSmallMessages) {
  const Link l{10e-6, 100e9};
  // 1 kB over 64 ranks: ring 126 steps of latency, tree 2 * 6.
  EXPECT_NEAR(collective_time(Collective::all_reduce, 64, 1e3, l), 12 * 10e-6 + 2 * 1e3 / 100e9, 1e-15);
}

TEST(Collectives, ReduceScatterAndAllGatherAreHalfARing) {
  const Link l{5e-6, 50e9};
  const double expect = 3 * 5e-6 + 0.75 * 2e9 / 50e9;
  EXPECT_NEAR(collective_time(Collective::reduce_scatter, 4, 2e9, l), expect, 1e-12);
  EXPECT_NEAR(collective_time(Collective::all_gather, 4, 2e9, l), expect, 1e-12);
  EXPECT_NEAR(collective_time(Collective::send_recv, 2, 2e9, l), 5e-6 + 2e9 / 50e9, 1e-12);
  EXPECT_EQ(collective_time(Collective::all_reduce, 1, 2e9, l), 0);
}

// NCCL's ring splits its steps by where they go (src/graph/tuning.cc, nInterSteps): of the n - 1
// steps of a reduce-scatter, N - 1 cross between the N nodes and n - N stay on a node link.
TEST(Collectives, RingStepsInsideANodeTakeTheNodeLinkLatency) {
  // 64 ranks, 8 per node (8 nodes), 8 us between nodes, 2 us inside: 56 x 2 + 7 x 8 us.
  const Link l{8e-6, 100e9, 8, 2e-6};
  EXPECT_NEAR(collective_time(Collective::reduce_scatter, 64, 1e3, l), 56 * 2e-6 + 7 * 8e-6 + 63.0 / 64 * 1e3 / 100e9, 1e-15);
  // All-reduce: ring 2 x (56 x 2 + 7 x 8) = 336 us, tree 2 x (7 x 2 + 3 x 8) = 76 us (a chain of 8
  // on each node, a binary tree over 8 nodes): the tree for a small message.
  EXPECT_NEAR(collective_time(Collective::all_reduce, 64, 1e3, l), 2 * (7 * 2e-6 + 3 * 8e-6) + 2 * 1e3 / 100e9, 1e-15);
  // A large one goes round the ring: 2 x 63/64 of it against the tree's 2.
  EXPECT_NEAR(collective_time(Collective::all_reduce, 64, 1e10, l), 2 * (56 * 2e-6 + 7 * 8e-6) + 2 * 63.0 / 64 * 0.1, 1e-12);
}

// A tier that reduces in its switches (SHARP) lets an all-reduce send each byte up once and get the
// result once: M / B instead of the ring's 2(n-1)/n M / B, at one network trip and a node-local
// reduce-scatter and all-gather of latency.
TEST(Collectives, InNetworkReductionHalvesALargeAllReduce) {
  Link l{8e-6, 100e9, 8, 2e-6};
  const double ring = collective_time(Collective::all_reduce, 64, 1e10, l);
  l.in_network_reduction = true;
  EXPECT_NEAR(collective_time(Collective::all_reduce, 64, 1e10, l), 2 * 7 * 2e-6 + 8e-6 + 1e10 / 100e9, 1e-12);
  EXPECT_LT(collective_time(Collective::all_reduce, 64, 1e10, l), 0.55 * ring);
  // Reduce-scatter and all-gather move the same bytes either way: the ring.
  EXPECT_NEAR(collective_time(Collective::reduce_scatter, 64, 1e10, l), 56 * 2e-6 + 7 * 8e-6 + 63.0 / 64 * 0.1, 1e-12);
  // A group on one node never reaches the switches: its ring (all 7 steps over the node link).
  EXPECT_NEAR(collective_time(Collective::all_reduce, 8, 1e10, l), 14 * 2e-6 + 1.75 * 0.1, 1e-12);
}

TEST(Collectives, CappedLinkKeepsTheLowerBandwidth) {
  const Link l{8e-6, 100e9, 8, 2e-6};
  EXPECT_DOUBLE_EQ(capped(l, 20e9).bandwidth, 20e9);
  EXPECT_DOUBLE_EQ(capped(l, 200e9).bandwidth, 100e9);
  EXPECT_DOUBLE_EQ(capped(l, 0).bandwidth, 100e9);  // 0: no cap
  EXPECT_DOUBLE_EQ(capped(l, 20e9).latency, l.latency);
}

TEST(Collectives, GroupLinkPicksTheTier) {
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  const double nvlink = c.node.bandwidth * c.node.efficiency;
  const double nic = c.network[0].bandwidth * c.network[0].efficiency;
  // TP 8 on consecutive ranks: inside a node.
  EXPECT_DOUBLE_EQ(group_link(c, 8, 1).bandwidth, nvlink);
  EXPECT_DOUBLE_EQ(group_link(c, 8, 1).latency, c.node.latency);
  // One member per node: that GPU's own NIC.
  EXPECT_DOUBLE_EQ(group_link(c, 4, 8).bandwidth, nic);
  // Two members per node (stride 4) share two NICs' worth.
  EXPECT_DOUBLE_EQ(group_link(c, 4, 4).bandwidth, 2 * nic);
  // Beyond the leaf tier's span the spine tier applies.
  EXPECT_DOUBLE_EQ(group_link(c, 64, 8).latency, c.network[1].latency);
  // Members that share a node step to each other over the node link.
  EXPECT_EQ(group_link(c, 64, 1).ranks_per_node, 8);
  EXPECT_DOUBLE_EQ(group_link(c, 64, 1).intra_latency, c.node.latency);
  EXPECT_EQ(group_link(c, 4, 4).ranks_per_node, 2);
  EXPECT_EQ(group_link(c, 4, 8).ranks_per_node, 1);
  EXPECT_FALSE(group_link(c, 64, 1).in_network_reduction);  // no shipped tier declares it
  EXPECT_EQ(group_link(c, 1, 1).bandwidth, 0);
}

TEST(Collectives, SpanningTierIsTheInnermostThatCoversTheRanks) {
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");  // 8 per node; leaf 256, spine 8192
  EXPECT_EQ(spanning_tier(c, 8), nullptr);  // one node: the node link
  EXPECT_EQ(spanning_tier(c, 9), &c.network[0]);
  EXPECT_EQ(spanning_tier(c, 256), &c.network[0]);
  EXPECT_EQ(spanning_tier(c, 257), &c.network[1]);
  EXPECT_EQ(spanning_tier(c, 1LL << 40), &c.network.back());  // beyond every span: the outermost
  Cluster single = c;
  single.network.clear();
  EXPECT_EQ(spanning_tier(single, 64), nullptr);
}

TEST(Collectives, AGroupCallPaysTheOverheadOnce) {
  // 4 ranks, 5 us per step, 50 GB/s, 10 us per call: each method is one call's table cost + 10 us.
  const GroupLink g{4, 1, {5e-6, 50e9}, 10e-6};
  EXPECT_NEAR(g.all_gather(2e9), 3 * 5e-6 + 0.75 * 2e9 / 50e9 + 10e-6, 1e-15);
  EXPECT_NEAR(g.reduce_scatter(2e9), 3 * 5e-6 + 0.75 * 2e9 / 50e9 + 10e-6, 1e-15);
  EXPECT_NEAR(g.all_reduce(2e9), 6 * 5e-6 + 1.5 * 2e9 / 50e9 + 10e-6, 1e-15);  // ring
  EXPECT_NEAR(g.send_recv(2e9), 5e-6 + 2e9 / 50e9 + 10e-6, 1e-15);               // one step to a neighbour
  // A group of one communicates nothing: no call, no overhead.
  const GroupLink one{1, 1, {5e-6, 50e9}, 10e-6};
  EXPECT_EQ(one.all_reduce(2e9), 0);
  EXPECT_EQ(one.send_recv(2e9), 0);
  // group_of: the cluster's link for the group and its overhead.
  const Cluster c = testing::builtin_cluster("dgx-a100-80g");
  const GroupLink dp = group_of(c, 4, 8);
  EXPECT_EQ(dp.size, 4);
  EXPECT_EQ(dp.stride, 8);
  EXPECT_DOUBLE_EQ(dp.link.bandwidth, group_link(c, 4, 8).bandwidth);
  EXPECT_DOUBLE_EQ(dp.call_overhead, c.collectives.call_overhead);
}

}  // namespace
}  // namespace trainplan
