// Parameter servers: the push/pull time formulas worked by hand, predict's DP time and memory with
// servers, async staleness, and the simulator's server stream.
#include <gtest/gtest.h>

#include <sstream>

#include "default_software.hpp"
#include "reports/chrome_trace.hpp"
#include "sim/model_spec.hpp"
#include "sim/param_server.hpp"
#include "sim/predict.hpp"
#include "sim/schedule.hpp"
#include "sim/search.hpp"
#include "sim/simulate.hpp"

namespace {

using namespace trainplan;

// Two tiers: an 8-GPU node (NVLink 400 GB/s) and a network of 10 GB/s per GPU, efficiency 1,
// no latency or call overhead, so the hand figures are bandwidth only.
Cluster two_tier() {
  Cluster c = load_cluster("dgx-h100", TRAINPLAN_SOURCE_DIR);
  c.gpus_per_node = 8;
  c.node = {"nvlink", 8, 400e9, 0, 1};
  c.network = {{"net", 1024, 10e9, 0, 1}};
  c.collectives.call_overhead = 0;
  return c;
}

Strategy ps_strategy(int gpus, int servers, PsPlacement where, DpAlgorithm a = DpAlgorithm::ps) {
  Strategy s;
  s.dp = gpus;
  s.global_batch = gpus;
  s.seq_len = 1024;
  s.dp_algorithm = a;
  s.ps_servers = servers;
  s.ps_placement = where;
  return s;
}

TEST(ParamServer, DedicatedServerNicIsTheBottleneckUntilThereAreEnoughServers) {
  // 32 data-parallel workers on N = 4 nodes hold M = 1 GB of gradients and parameters each. The
  // L = 8 replicas on a node reduce-scatter over NVLink (7/8 x 1 GB / 400 GB/s = 2.19 ms, hidden
  // under the network part), then each GPU pushes and pulls M / 8 = 125 MB over b = 10 GB/s:
  // 12.5 ms on a worker's NIC. One server node (g = 8 NICs) receives 4 nodes x 1 GB over
  // 80 GB/s: 50 ms, i.e. max(1, N w / (S g)) = 4 times the worker's time. S >= 4: the workers' 12.5 ms.
  const Cluster c = two_tier();
  const Bytes M = 1e9;
  const PsNetwork one = ps_network(c, ps_strategy(32, 1, PsPlacement::dedicated));
  EXPECT_EQ(one.local_replicas, 8);
  EXPECT_EQ(one.nodes, 4);
  EXPECT_NEAR(ps_transfer_time(one, M, M), 0.05, 1e-12);
  EXPECT_NEAR(ps_transfer_time(ps_network(c, ps_strategy(32, 2, PsPlacement::dedicated)), M, M), 0.025, 1e-12);
  EXPECT_NEAR(ps_transfer_time(ps_network(c, ps_strategy(32, 4, PsPlacement::dedicated)), M, M), 0.0125, 1e-12);
  EXPECT_NEAR(ps_transfer_time(ps_network(c, ps_strategy(32, 8, PsPlacement::dedicated)), M, M), 0.0125, 1e-12);
  // Push and pull go opposite ways on full-duplex links: the larger one sets the time.
  EXPECT_NEAR(ps_transfer_time(ps_network(c, ps_strategy(32, 4, PsPlacement::dedicated)), M, 2 * M), 0.025, 1e-12);
  // No replicas share a node (tp 8 fills it): no pre-reduction, each GPU pushes all of M.
  Strategy tp8 = ps_strategy(32, 4, PsPlacement::dedicated);
  tp8.dp = 4, tp8.tp = 8;
  const PsNetwork wide = ps_network(c, tp8);
  EXPECT_EQ(wide.local_replicas, 1);
  EXPECT_NEAR(ps_transfer_time(wide, M, M), 0.1, 1e-12);
}

TEST(ParamServer, ColocatedServersOnEveryNodeMoveWhatARingAllReduceMoves) {
  // N = S = 4 nodes, per-GPU shares m = M / 8 after the node's pre-reduction: a server node
  // receives 3 of 4 shares of the other nodes' pushes and its own workers' pulls from 3 other
  // servers: (3 m + 3 m) / 4 = 1.5 m = 187.5 MB per GPU -> 18.75 ms, the hierarchical all-reduce's
  // 2 (N-1)/N M / (8 b).
  const Cluster c = two_tier();
  const Bytes M = 1e9;
  EXPECT_NEAR(ps_transfer_time(ps_network(c, ps_strategy(32, 4, PsPlacement::colocated)), M, M), 0.01875, 1e-12);
  // One colocated server: its node takes the pushes of the other 3 nodes: 3 m -> 37.5 ms.
  EXPECT_NEAR(ps_transfer_time(ps_network(c, ps_strategy(32, 1, PsPlacement::colocated)), M, M), 0.0375, 1e-12);
  // One node: the servers are its 8 GPUs over NVLink (400 GB/s): 2 x 7/8 M / 400e9.
  EXPECT_NEAR(ps_transfer_time(ps_network(c, ps_strategy(8, 1, PsPlacement::colocated)), M, M), 2 * 7.0 / 8 * M / 400e9,
              1e-15);
}

TEST(ParamServer, PredictChargesTheServerBottleneckAsTheDpTime) {
  // gpt2 on 16 GPUs (N = 2 nodes), pp = tp = 1: each GPU holds P x 2 bytes of bf16 gradients and
  // of bf16 parameters, and after the node's pre-reduction pushes and pulls 2P / 8 bytes. One
  // dedicated server: max(1, 2 x 8 / 8) = 2, so the step's DP time is 2 x (2P / 8) / 10 GB/s plus
  // 2 message latencies (0 here); two servers: (2P / 8) / b.
  const Cluster c = two_tier();
  const LayerGraph g(load_model("gpt2", TRAINPLAN_SOURCE_DIR), 1024);
  const double P = g.total_params();
  const Software sw = trainplan::testing::default_software();
  const Estimate one = predict(g, c, sw, ps_strategy(16, 1, PsPlacement::dedicated));
  ASSERT_TRUE(one.feasible);
  EXPECT_NEAR(one.time.dp_comm, 2 * (2 * P / 8) / 10e9, 1e-9);
  const Estimate two = predict(g, c, sw, ps_strategy(16, 2, PsPlacement::dedicated));
  EXPECT_NEAR(two.time.dp_comm, (2 * P / 8) / 10e9, 1e-9);
  // Workers keep no optimizer states with servers; the all-reduce plan keeps 12 B per parameter.
  Strategy ar = ps_strategy(16, 1, PsPlacement::dedicated);
  ar.dp_algorithm = DpAlgorithm::allreduce;
  const Estimate allreduce = predict(g, c, sw, ar);
  EXPECT_EQ(one.per_stage[0].optimizer, 0.0);
  EXPECT_NEAR(allreduce.per_stage[0].optimizer, 12 * P, 1.0);
  EXPECT_EQ(one.ps.staleness, 0.0);
  EXPECT_NEAR(one.ps.updates_per_s, 1 / one.time.step, 1e-12);
}

TEST(ParamServer, DedicatedServerNodesArePaidFor) {
  // 16 worker GPUs and 2 dedicated server nodes of 8 GPUs' worth each: 32 GPUs billed, so the
  // cost objective is price x 32 x step / 3600. Colocated servers add nothing.
  const Cluster c = two_tier();
  const LayerGraph g(load_model("gpt2", TRAINPLAN_SOURCE_DIR), 1024);
  const Strategy s = ps_strategy(16, 2, PsPlacement::dedicated);
  EXPECT_EQ(billed_gpus(s, c), 32);
  EXPECT_EQ(billed_gpus(ps_strategy(16, 2, PsPlacement::colocated), c), 16);
  const Estimate e = predict(g, c, trainplan::testing::default_software(), s);
  EXPECT_NEAR(objective_value(Objective::cost, e, c), c.price_per_gpu_hour * 32 * e.time.step / 3600, 1e-12);
}

TEST(ParamServer, AsyncWorkersRunTheSyncStepAndApplyStaleUpdates) {
  // Identical workers: no barrier to wait at, so the per-worker step equals the synchronous one;
  // every one of W = 16 workers applies its own update (16 updates per step time), each stale by
  // the W - 1 = 15 updates the others applied since its pull.
  const Cluster c = two_tier();
  const LayerGraph g(load_model("gpt2", TRAINPLAN_SOURCE_DIR), 1024);
  const Software sw = trainplan::testing::default_software();
  const Estimate sync = predict(g, c, sw, ps_strategy(16, 2, PsPlacement::dedicated));
  const Estimate async = predict(g, c, sw, ps_strategy(16, 2, PsPlacement::dedicated, DpAlgorithm::ps_async));
  ASSERT_TRUE(async.feasible);
  EXPECT_DOUBLE_EQ(async.time.step, sync.time.step);
  EXPECT_EQ(async.ps.workers, 16);
  EXPECT_EQ(async.ps.staleness, 15.0);
  EXPECT_NEAR(async.ps.updates_per_s, 16 / async.time.step, 1e-9);
  EXPECT_EQ(ps_async_staleness(1), 0.0);
}

TEST(ParamServer, DedicatedServersMustFitOnTheCluster) {
  Cluster c = two_tier();
  c.network[0].span_gpus = 32;  // 4 nodes
  const LayerGraph g(load_model("gpt2", TRAINPLAN_SOURCE_DIR), 1024);
  const Estimate e = predict(g, c, trainplan::testing::default_software(), ps_strategy(24, 2, PsPlacement::dedicated));
  ASSERT_FALSE(e.feasible);
  EXPECT_NE(e.infeasible[0].detail.find("--ps-servers 2"), std::string::npos) << e.infeasible[0].detail;
}

TEST(ParamServer, SimulatorShowsPushPullAndTheServersUpdate) {
  const Cluster c = two_tier();
  const LayerGraph g(load_model("gpt2", TRAINPLAN_SOURCE_DIR), 1024);
  Strategy s = ps_strategy(16, 2, PsPlacement::dedicated);
  s.dp = 8, s.pp = 2, s.global_batch = 32;
  const StepCosts costs = step_costs(g, c, trainplan::testing::default_software(), s);
  const Timeline t = simulate(costs, schedule_for(s));
  EXPECT_EQ(t.ps_servers, 2);
  int push_pull = 0, updates = 0;
  for (const Event& e : t.events) {
    push_pull += e.kind == EventKind::ps_push_pull && e.stream == Stream::dp;
    updates += e.kind == EventKind::ps_update && e.stream == Stream::ps_server;
  }
  EXPECT_GT(push_pull, 0);
  EXPECT_EQ(updates, 2);  // one per stage
  std::ostringstream trace;
  write_chrome_trace(trace, t, replica_stage_ranks(s), "ps");
  EXPECT_NE(trace.str().find("parameter server 1"), std::string::npos);
  EXPECT_NE(trace.str().find("ps update"), std::string::npos);
}

TEST(ParamServer, SearchPicksServersWhenTheyWinAndOnlyWhenAskedTo) {
  // A slow network (1 GB/s per GPU) and data parallelism only (dp 16 over 2 nodes): the
  // all-reduce moves 2 (n-1)/n M per GPU's worth of NIC bandwidth, while with S >= N dedicated
  // servers push and pull share the full-duplex NICs (max(P, Q) = M): BytePS's up-to-2x. The
  // default space never lists servers.
  Cluster c = two_tier();
  c.network[0].bandwidth = 1e9;
  const LayerGraph g(load_model("gpt2", TRAINPLAN_SOURCE_DIR), 1024);
  const Software sw = trainplan::testing::default_software();
  SearchSpace space = default_space(c, 16, 64, 1024);
  space.exact_gpus = true;
  space.max_tp = space.max_pp = space.max_cp = 1;
  SearchOptions o;
  o.threads = 1;
  const SearchResult plain = search(g, c, sw, space, o);
  ASSERT_FALSE(plain.top.empty());
  EXPECT_FALSE(plain.top[0].strategy.uses_ps());
  const auto count = enumerate_space(g, c, space).size();
  space.dp_algorithms = {DpAlgorithm::allreduce, DpAlgorithm::ps};
  space.ps_servers = 4;
  EXPECT_GT(enumerate_space(g, c, space).size(), count);  // PS candidates (ZeRO 0 only) added
  const SearchResult with_ps = search(g, c, sw, space, o);
  ASSERT_FALSE(with_ps.top.empty());
  EXPECT_TRUE(with_ps.top[0].strategy.uses_ps()) << describe(with_ps.top[0].strategy);
  EXPECT_EQ(with_ps.top[0].strategy.ps_servers, 4);
  EXPECT_LT(with_ps.top[0].time.step, plain.top[0].time.step);
  // Pruning stays exact with servers in the space: the same best as a brute-force search.
  o.prune = false;
  const SearchResult brute = search(g, c, sw, space, o);
  EXPECT_EQ(describe(brute.top[0].strategy), describe(with_ps.top[0].strategy));
  EXPECT_DOUBLE_EQ(brute.top[0].time.step, with_ps.top[0].time.step);
}

}  // namespace
