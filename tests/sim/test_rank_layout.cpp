#include <gtest/gtest.h>

#include "sim/rank_layout.hpp"

namespace trainplan {
namespace {

Strategy sizes(int tp, int cp, int dp, int pp) {
  Strategy s;
  s.tp = tp;
  s.cp = cp;
  s.dp = dp;
  s.pp = pp;
  return s;
}

TEST(RankLayout, DefaultOrderEquation) {
  // rank = tp + T*(cp + C*(dp + D*pp)) with T=2, C=2, D=3, P=2.
  RankLayout l(sizes(2, 2, 3, 2));
  EXPECT_EQ(l.world(), 24);
  EXPECT_EQ(l.rank({.tp = 1, .cp = 0, .dp = 0, .pp = 0}), 1);
  EXPECT_EQ(l.rank({.tp = 0, .cp = 1, .dp = 0, .pp = 0}), 2);
  EXPECT_EQ(l.rank({.tp = 0, .cp = 0, .dp = 1, .pp = 0}), 4);
  EXPECT_EQ(l.rank({.tp = 1, .cp = 1, .dp = 2, .pp = 1}), 1 + 2 * (1 + 2 * (2 + 3 * 1)));
  for (int r = 0; r < l.world(); ++r) EXPECT_EQ(l.rank(l.coord(r)), r);
}

TEST(RankLayout, Groups) {
  RankLayout l(sizes(2, 1, 2, 2));  // 8 ranks
  EXPECT_EQ(l.group(5, {Dim::tp}), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.group(5, {Dim::dp}), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.group(5, {Dim::pp}), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.group(0, {Dim::dp, Dim::cp}), (std::vector<int>{0, 2}));
  auto tp_groups = l.all_groups({Dim::tp});
  ASSERT_EQ(tp_groups.size(), 4u);
  EXPECT_EQ(tp_groups[3], (std::vector<int>{6, 7}));
}

TEST(RankLayout, CustomOrderPutsDpFastest) {
  Strategy s = sizes(2, 1, 4, 1);
  s.order = {Dim::dp, Dim::tp, Dim::cp, Dim::pp};
  RankLayout l(s);
  EXPECT_EQ(l.stride(Dim::dp), 1);
  EXPECT_EQ(l.stride(Dim::tp), 4);
  EXPECT_EQ(l.group(0, {Dim::tp}), (std::vector<int>{0, 4}));
}

TEST(RankLayout, EveryRankInExactlyOneGroupPerDim) {
  RankLayout l(sizes(2, 2, 2, 2));
  for (Dim d : {Dim::tp, Dim::cp, Dim::dp, Dim::pp}) {
    std::vector<int> seen(l.world(), 0);
    for (const auto& g : l.all_groups({d})) {
      EXPECT_EQ(static_cast<int>(g.size()), l.size(d));
      for (int r : g) ++seen[r];
    }
    for (int c : seen) EXPECT_EQ(c, 1);
  }
}

// Parameter-server roles. Dedicated: 4 workers (dp 4) + 3 servers on ranks 4, 5, 6.
// Colocated: 3 servers on workers floor(k * 4 / 3) = 0, 1, 2 of 4.
TEST(RankLayout, ParameterServerRoles) {
  Strategy s = sizes(1, 1, 4, 1);
  s.dp_algorithm = DpAlgorithm::ps;
  s.ps_servers = 3;
  s.ps_placement = PsPlacement::dedicated;
  const RankLayout d(s);
  EXPECT_EQ(d.world(), 4);
  EXPECT_EQ(d.servers(), 3);
  EXPECT_EQ(d.job_ranks(), 7);
  EXPECT_EQ(d.server_rank(0), 4);
  EXPECT_EQ(d.server_rank(2), 6);
  EXPECT_EQ(d.server_index(5), 1);
  EXPECT_EQ(d.server_index(3), -1);
  EXPECT_TRUE(d.is_worker(3));
  EXPECT_FALSE(d.is_worker(4));

  s.ps_placement = PsPlacement::colocated;
  const RankLayout c(s);
  EXPECT_EQ(c.job_ranks(), 4);
  EXPECT_EQ(c.server_rank(0), 0);
  EXPECT_EQ(c.server_rank(1), 1);
  EXPECT_EQ(c.server_rank(2), 2);
  EXPECT_EQ(c.server_index(3), -1);
  s.ps_servers = 2;  // spread: workers 0 and 2
  EXPECT_EQ(RankLayout(s).server_rank(1), 2);

  const RankLayout none(sizes(1, 1, 4, 1));  // all-reduce: no servers
  EXPECT_EQ(none.servers(), 0);
  EXPECT_EQ(none.job_ranks(), 4);
  EXPECT_EQ(none.server_index(0), -1);
}

}  // namespace
}  // namespace trainplan

namespace trainplan {
namespace {

// DeepSeek-V3's layout as published: 64-way EP over 8 nodes of 8, no TP, pp 16 (here pp 2):
// rank = etp + ETP*(ep + EP*(edp + EDP*pp)) with ETP 1, EP 64, EDP 1, so an EP group is 64
// consecutive ranks and the pipeline groups are the dense ones.
TEST(RankLayoutExperts, DefaultOrderEquationAndIdenticalPipelineGroups) {
  Strategy s = sizes(1, 1, 64, 2);
  s.ep = 64;
  const RankLayout l(s);
  EXPECT_EQ(l.size(ExpertDim::edp), 1);
  EXPECT_EQ(l.stride(ExpertDim::ep), 1);
  EXPECT_EQ(l.stride(ExpertDim::pp), 64);
  EXPECT_EQ(l.group(70, {ExpertDim::ep}).front(), 64);
  EXPECT_EQ(l.group(70, {ExpertDim::ep}).size(), 64u);
  for (int r = 0; r < l.world(); ++r) {
    EXPECT_EQ(l.rank(l.expert_coord(r)), r);
    EXPECT_EQ(l.group(r, {ExpertDim::pp}), l.group(r, {Dim::pp}));
  }
}

// Folding over TP: tp 2, dp 4 (8 dense ranks a stage), etp 1, ep 4, edp 2. Expert ranks
// etp + 1*(ep + 4*(edp + 2*pp)): the EP group of rank 5 is {4, 5, 6, 7}, its EDP group {1, 5}; the
// EP group mixes TP ranks (ranks 4, 5 are one TP pair), as Megatron-core's folding does.
TEST(RankLayoutExperts, FoldsOverTheTensorParallelRanks) {
  Strategy s = sizes(2, 1, 4, 2);
  s.ep = 4;
  const RankLayout l(s);
  EXPECT_EQ(l.size(ExpertDim::edp), 2);
  EXPECT_EQ(l.group(5, {ExpertDim::ep}), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(l.group(5, {ExpertDim::edp}), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.group(5, {Dim::tp}), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.all_groups({ExpertDim::ep}).size(), 4u);  // 2 per stage, 2 stages
  const ExpertCoord c = l.expert_coord(13);              // 13 = 1 + 4 * (1 + 2 * 1)
  EXPECT_EQ(c, (ExpertCoord{.etp = 0, .ep = 1, .edp = 1, .pp = 1}));
  // etp 2: the two ranks of a TP pair hold halves of the same experts.
  s.etp = 2, s.ep = 2;
  const RankLayout t(s);
  EXPECT_EQ(t.group(5, {ExpertDim::etp}), (std::vector<int>{4, 5}));
  EXPECT_EQ(t.group(5, {ExpertDim::ep}), (std::vector<int>{5, 7}));
  EXPECT_EQ(t.group(5, {ExpertDim::edp}), (std::vector<int>{1, 5}));
}

}  // namespace
}  // namespace trainplan
