// RankLayout: the one mapping between global ranks and (tp, cp, dp, pp) coordinates, used by both
// the simulator (to place groups on nodes) and the executor (to build its process groups).
//
// With the rank order d0, d1, d2, d3 (fastest-varying first) and sizes n(d):
//   rank = c(d0) + n(d0) * (c(d1) + n(d1) * (c(d2) + n(d2) * c(d3)))
// Megatron's default order tp, cp, dp, pp gives rank = tp + T*(cp + C*(dp + D*pp)), which keeps a
// tensor-parallel group on consecutive ranks, i.e. inside one node.
// Ranks are placed on nodes in order: rank r runs on node r / gpus_per_node.
//
// Experts (Megatron-core's second RankGenerator, parallel_state.py, "MoE parallel folding"): the
// same ranks numbered again by (etp, ep, edp, pp), with sizes etp, ep, edp = tp cp dp / (etp ep)
// and pp, in the order the rank order gives: tp's place holds etp, cp's nothing, dp's ep then edp
// (ep faster), pp's pp. With Megatron's default order tp, cp, dp, pp:
//   rank = etp + ETP*(ep + EP*(edp + EDP*pp))
// and the expert groups fold over a stage's tp x cp x dp ranks. validate() requires the ranks
// before pp to number the same in both, so both numberings have the same pipeline groups.
//
// Parameter servers (Strategy::uses_ps(), S = ps_servers): the ranks above are the workers;
// server shard k (0 <= k < S) runs on
//   dedicated:  rank W + k, a process beyond the W = world() workers (the job has W + S ranks);
//   colocated:  worker rank floor(k * W / S), spread evenly over the workers (the job has W ranks).
#pragma once
#include <array>
#include <vector>

#include "sim/strategy.hpp"

namespace trainplan {

struct RankCoord {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  int& operator[](Dim d);
  int operator[](Dim d) const;
  bool operator==(const RankCoord&) const = default;
};

enum class ExpertDim { etp, ep, edp, pp };

struct ExpertCoord {
  int etp = 0, ep = 0, edp = 0, pp = 0;
  int& operator[](ExpertDim d);
  int operator[](ExpertDim d) const;
  bool operator==(const ExpertCoord&) const = default;
};

class RankLayout {
 public:
  explicit RankLayout(const Strategy& s);

  int world() const { return world_; }  // ranks of the parallel dims: the workers
  // Parameter-server roles (see the top): S, or 0 without parameter servers; the job's ranks
  // (W + S with dedicated servers, else W); the rank of server k; the server on `rank` (-1: none).
  int servers() const { return servers_; }
  int job_ranks() const { return world_ + (dedicated_ ? servers_ : 0); }
  int server_rank(int k) const;
  int server_index(int rank) const;
  bool is_worker(int rank) const { return rank >= 0 && rank < world_; }
  int size(Dim d) const { return size_[static_cast<int>(d)]; }
  // Distance in ranks between neighbours along `d`.
  int stride(Dim d) const { return stride_[static_cast<int>(d)]; }

  RankCoord coord(int rank) const;
  int rank(const RankCoord& c) const;

  // Ranks that share every coordinate with `rank` except those in `dims`, in ascending order.
  std::vector<int> group(int rank, std::initializer_list<Dim> dims) const;
  // Every such group, each once, ordered by its lowest rank. Each rank of a job creates process
  // groups in this same order (collective creation must match across ranks).
  std::vector<std::vector<int>> all_groups(std::initializer_list<Dim> dims) const;

  // The expert numbering (see the top); sizes 1 but pp for a dense model.
  int size(ExpertDim d) const { return expert_size_[static_cast<int>(d)]; }
  int stride(ExpertDim d) const { return expert_stride_[static_cast<int>(d)]; }
  ExpertCoord expert_coord(int rank) const;
  int rank(const ExpertCoord& c) const;
  // Ranks that share every expert coordinate with `rank` except those in `dims`, ascending: the
  // expert-parallel group {ep}, the expert-tensor group {etp}, the expert-data-parallel group {edp}.
  std::vector<int> group(int rank, std::initializer_list<ExpertDim> dims) const;
  std::vector<std::vector<int>> all_groups(std::initializer_list<ExpertDim> dims) const;

 private:
  std::array<int, 4> size_{};    // indexed by Dim
  std::array<int, 4> stride_{};  // indexed by Dim
  std::array<int, 4> expert_size_{};    // indexed by ExpertDim
  std::array<int, 4> expert_stride_{};  // indexed by ExpertDim
  int world_ = 1;
  int servers_ = 0;
  bool dedicated_ = false;
};

}  // namespace trainplan
