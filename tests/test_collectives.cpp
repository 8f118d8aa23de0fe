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
