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

// A link across nodes: 8 us per step between them, 2 us inside, 8 ranks per node, 100 GB/s.
Link spanning_link() {
  Link l{8e-6, 100e9};
  l.ranks_per_node = 8;
  l.intra_latency = 2e-6;
  return l;
}

// NCCL's ring splits its steps by where they go (src/graph/tuning.cc, nInterSteps): of the n - 1
// steps of a reduce-scatter, N - 1 cross between the N nodes and n - N stay on a node link.
TEST(Collectives, RingStepsInsideANodeTakeTheNodeLinkLatency) {
  // 64 ranks, 8 per node (8 nodes), 8 us between nodes, 2 us inside: 56 x 2 + 7 x 8 us.
  const Link l = spanning_link();
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
  Link l = spanning_link();
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
  const Link l = spanning_link();
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

// A node that measured its all-reduces (here dgx-a100-80g given three points of the nccl-tests
// curve of an 8 x A100 node, stas00/ml-engineering network/README.md) gives its groups' rings
// their time from the curve, f M / B(M): 32 MiB over 8 ranks at the measured 138.49 GB/s is
// 1.75 x 33554432 / 138.49e9 = 424.0 us, nccl-tests' own time, where latency x steps + bytes /
// (300 GB/s x 0.8) gives 2 x 7 x 3 us + 244.7 us = 286.7 us. Four ranks move 1.5 M at the same
// bus bandwidth; all-gather half of an all-reduce; sends and groups across nodes keep the table.
TEST(Collectives, MeasuredNodeCurveGivesTheRingItsTime) {
  Cluster c = testing::builtin_cluster("dgx-a100-80g");
  const double m = 33554432;
  EXPECT_NEAR(collective_time(Collective::all_reduce, 8, m, group_link(c, 8, 1)), 42e-6 + 1.75 * m / 240e9, 1e-12);
  c.node_all_reduce.bytes = {16777216, 33554432, 67108864};
  c.node_all_reduce.bus_bandwidth = {106.16e9, 138.49e9, 171.54e9};
  EXPECT_NEAR(collective_time(Collective::all_reduce, 8, m, group_link(c, 8, 1)), 1.75 * m / 138.49e9, 1e-12);
  EXPECT_NEAR(collective_time(Collective::all_reduce, 4, m, group_link(c, 4, 1)), 1.5 * m / 138.49e9, 1e-12);
  EXPECT_NEAR(collective_time(Collective::all_gather, 8, m, group_link(c, 8, 1)), 0.875 * m / 138.49e9, 1e-12);
  EXPECT_NEAR(collective_time(Collective::send_recv, 2, m, group_link(c, 2, 1)), 3e-6 + m / 240e9, 1e-12);
  EXPECT_EQ(group_link(c, 16, 1).measured, nullptr);
  // A cap (a stack's own bound on its collectives) still binds: 1.75 M / 50 GB/s.
  EXPECT_NEAR(collective_time(Collective::all_reduce, 8, m, capped(group_link(c, 8, 1), 50e9)), 1.75 * m / 50e9, 1e-12);
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

// An NVL72 rack: trays of 4 GPUs, one NVLink 5 domain of 72 (900 GB/s each way per GPU, ring
// efficiency 0.77, NVLink SHARP at 0.6), one 400 Gb/s NIC (50 GB/s, 0.85 on the leaf) per GPU.
// A TP=16 all-reduce of 256 MB stays on NVLink and takes NVLS, by hand:
//   ring: 2 x 15 x 3 us + 2 x 15/16 x 256e6 / (900e9 x 0.77) = 90 us + 692.7 us = 782.7 us
//   NVLS: 2 x 3 us + 17/16 x 256e6 / (900e9 x 0.6)         =  6 us + 503.7 us = 509.7 us
// Without the domain (4 GPUs per node as the only NVLink) the 16 ranks would span 4 trays: 4
// members per tray drive 4 NICs, 4 x 50 GB/s x 0.85 = 170 GB/s, ring at 5 us a step: 2.975 ms.
TEST(Collectives, Nvl72TensorParallelAllReduceStaysOnNvlinkWithInSwitchReduction) {
  const Cluster c = testing::builtin_cluster("gb200-nvl72");
  ASSERT_EQ(c.gpus_per_node, 4);
  ASSERT_EQ(c.scale_up_gpus, 72);
  EXPECT_EQ(spanning_tier(c, 16), nullptr);
  EXPECT_EQ(spanning_tier(c, 72), nullptr);
  EXPECT_EQ(spanning_tier(c, 73), &c.network[0]);
  const Link l = group_link(c, 16, 1);
  EXPECT_DOUBLE_EQ(l.latency, 3e-6);
  EXPECT_DOUBLE_EQ(l.bandwidth, 900e9 * 0.77);
  EXPECT_DOUBLE_EQ(l.in_switch_bandwidth, 900e9 * 0.6);
  EXPECT_NEAR(collective_time(Collective::all_reduce, 16, 256e6, l), 6e-6 + 17.0 / 16 * 256e6 / 540e9, 1e-12);
  EXPECT_NEAR(collective_time(Collective::all_reduce, 16, 256e6, l), 509.7e-6, 0.1e-6);
  // All-gather and reduce-scatter gain nothing from the switch: the ring over NVLink.
  EXPECT_NEAR(collective_time(Collective::all_gather, 16, 256e6, l), 15 * 3e-6 + 15.0 / 16 * 256e6 / 693e9, 1e-12);
  // Small messages: NVLS's two steps beat the tree's 2 log2(16) = 8.
  EXPECT_NEAR(collective_time(Collective::all_reduce, 16, 1e3, l), 6e-6 + 17.0 / 16 * 1e3 / 540e9, 1e-15);
  // The same ranks with the domain ending at the tray: the leaf network, as the file said before.
  Cluster trays = c;
  trays.scale_up_gpus = 4;
  const Link ib = group_link(trays, 16, 1);
  EXPECT_DOUBLE_EQ(ib.bandwidth, 4 * 50e9 * 0.85);
  EXPECT_EQ(ib.in_switch_bandwidth, 0);
  // Its ring takes 3 of its 15 steps between the four trays (5 us) and 12 inside them (3 us).
  EXPECT_NEAR(collective_time(Collective::all_reduce, 16, 256e6, ib), 2 * (12 * 3e-6 + 3 * 5e-6) + 1.875 * 256e6 / 170e9, 1e-12);
  // Past the rack: per-domain NICs. DP 8 one rack apart (stride 72) has one member per domain.
  EXPECT_DOUBLE_EQ(group_link(c, 8, 72).bandwidth, 50e9 * 0.85);
  EXPECT_DOUBLE_EQ(group_link(c, 8, 72).in_switch_bandwidth, 0);
}

// A full-mesh node (MI300X: one 64 GB/s xGMI link per GPU pair, efficiency 0.75): a group of n
// GPUs of the node reaches n - 1 links; a pipeline send between two GPUs gets one link.
TEST(Collectives, FullMeshNodeGivesAGroupItsPeerLinks) {
  const Cluster c = testing::builtin_cluster("mi300x");
  EXPECT_DOUBLE_EQ(group_link(c, 8, 1).bandwidth, 7 * 64e9 * 0.75);
  EXPECT_DOUBLE_EQ(group_link(c, 4, 2).bandwidth, 3 * 64e9 * 0.75);
  EXPECT_DOUBLE_EQ(group_link(c, 2, 1).bandwidth, 64e9 * 0.75);
  EXPECT_EQ(group_link(c, 8, 1).in_switch_bandwidth, 0);  // no switch
  // A switched node (DGX H100) gives any group the whole per-GPU NVLink bandwidth.
  const Cluster h = testing::builtin_cluster("dgx-h100");
  EXPECT_DOUBLE_EQ(group_link(h, 2, 1).bandwidth, group_link(h, 8, 1).bandwidth);
}

// An all-to-all's members that share a scale-up domain exchange over its link: on an NVL72 rack that
// is the 72-GPU NVLink domain, not the 4-GPU compute tray.
TEST(Collectives, AllToAllSharesTheScaleUpDomainNotTheTray) {
  const Cluster c = testing::builtin_cluster("gb200-nvl72");
  // EP 64 two ranks apart (tp 2) covers 128 ranks: two racks, 36 members in each.
  const AllToAllLink a = all_to_all_link(c, 64, 2);
  EXPECT_EQ(a.per_node, 36);
  EXPECT_DOUBLE_EQ(a.node.bandwidth, 900e9 * 0.77);
  EXPECT_DOUBLE_EQ(a.network.bandwidth, 50e9 * 0.85);
  // (64 - 1) steps at the network latency; 35/64 of M over NVLink and 28/64 over the NIC at once.
  EXPECT_NEAR(all_to_all_time(64, 1e9, a), 63 * 5e-6 + 28.0 / 64 * 1e9 / 42.5e9, 1e-12);
  // Inside one rack the whole group stays on NVLink.
  EXPECT_EQ(all_to_all_link(c, 64, 1).per_node, 64);
  EXPECT_EQ(all_to_all_link(c, 64, 1).network.bandwidth, 0);
  // One member per rack: everything crosses the network.
  EXPECT_EQ(all_to_all_link(c, 4, 72).per_node, 1);
  // A full-mesh node: 4 members of an MI300X node reach each other over 3 links.
  EXPECT_DOUBLE_EQ(all_to_all_link(testing::builtin_cluster("mi300x"), 4, 1).node.bandwidth, 3 * 64e9 * 0.75);
}

}  // namespace
}  // namespace trainplan
