#include "sim/rank_layout.hpp"

#include <algorithm>

#include "sim/check.hpp"

namespace trainplan {

int& RankCoord::operator[](Dim d) {
  switch (d) {
    case Dim::tp: return tp;
    case Dim::cp: return cp;
    case Dim::dp: return dp;
    case Dim::pp: return pp;
  }
  return tp;
}
int RankCoord::operator[](Dim d) const { return const_cast<RankCoord&>(*this)[d]; }

int& ExpertCoord::operator[](ExpertDim d) {
  switch (d) {
    case ExpertDim::etp: return etp;
    case ExpertDim::ep: return ep;
    case ExpertDim::edp: return edp;
    case ExpertDim::pp: return pp;
  }
  return etp;
}
int ExpertCoord::operator[](ExpertDim d) const { return const_cast<ExpertCoord&>(*this)[d]; }

namespace {

constexpr ExpertDim kExpertDims[] = {ExpertDim::etp, ExpertDim::ep, ExpertDim::edp, ExpertDim::pp};

// Ranks that differ from `base` only along `dims`, each dim stepping `size` times by `stride`.
template <class SizeOf, class StrideOf, class D>
std::vector<int> span_group(int base, std::initializer_list<D> dims, SizeOf size, StrideOf stride) {
  std::vector<int> out{base};
  for (D d : dims) {
    std::vector<int> next;
    for (int r : out)
      for (int k = 0; k < size(d); ++k) next.push_back(r + k * stride(d));
    out = std::move(next);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

RankLayout::RankLayout(const Strategy& s) {
  int stride = 1;
  for (Dim d : s.order) {
    int i = static_cast<int>(d);
    size_[i] = s.size(d);
    TRAINPLAN_CHECK(size_[i] >= 1, "parallel sizes must be >= 1");
    stride_[i] = stride;
    stride *= size_[i];
  }
  world_ = stride;
  // The expert numbering over the same ranks (see the header).
  expert_size_ = {s.etp, s.ep, s.etp * s.ep > 0 ? s.tp * s.cp * s.dp / (s.etp * s.ep) : 1, s.pp};
  TRAINPLAN_CHECK(static_cast<long long>(s.etp) * s.ep * expert_size_[2] == static_cast<long long>(s.tp) * s.cp * s.dp,
                  "etp x ep must divide tp x cp x dp");
  int expert_stride = 1;
  for (Dim d : s.order) {
    auto place = [&](ExpertDim e) {
      expert_stride_[static_cast<int>(e)] = expert_stride;
      expert_stride *= expert_size_[static_cast<int>(e)];
    };
    if (d == Dim::tp) place(ExpertDim::etp);
    if (d == Dim::dp) place(ExpertDim::ep), place(ExpertDim::edp);
    if (d == Dim::pp) place(ExpertDim::pp);
  }
  if (s.uses_ps()) {
    servers_ = s.ps_servers;
    dedicated_ = s.ps_placement == PsPlacement::dedicated;
    TRAINPLAN_CHECK(servers_ >= 1, "ps_servers must be >= 1");  // validate(): colocated also S <= nodes <= W
  }
}

int RankLayout::server_rank(int k) const {
  TRAINPLAN_CHECK(k >= 0 && k < servers_, "server index out of range");
  return dedicated_ ? world_ + k : static_cast<int>(static_cast<long long>(k) * world_ / servers_);
}

int RankLayout::server_index(int rank) const {
  for (int k = 0; k < servers_; ++k)
    if (server_rank(k) == rank) return k;
  return -1;
}

namespace {

constexpr Dim kDims[] = {Dim::tp, Dim::cp, Dim::dp, Dim::pp};

// The dense and the expert numberings are the same arithmetic over their own dimension lists:
// coordinate d = (rank / stride(d)) % size(d), rank = sum of coordinate x stride.
template <class Coord, class D, std::size_t N>
Coord coord_in(const RankLayout& l, const D (&dims)[N], int rank) {
  TRAINPLAN_CHECK(rank >= 0 && rank < l.world(), "rank out of range");
  Coord c;
  for (D d : dims) c[d] = (rank / l.stride(d)) % l.size(d);
  return c;
}

template <class Coord, class D, std::size_t N>
int rank_in(const RankLayout& l, const D (&dims)[N], const Coord& c) {
  int r = 0;
  for (D d : dims) {
    TRAINPLAN_CHECK(c[d] >= 0 && c[d] < l.size(d), "coordinate out of range");
    r += c[d] * l.stride(d);
  }
  return r;
}

// The group of `rank` along `dims`: its coordinates there set to 0, then spanned.
template <class Coord, class D, std::size_t N>
std::vector<int> group_in(const RankLayout& l, const D (&all)[N], int rank, std::initializer_list<D> dims) {
  Coord base = coord_in<Coord>(l, all, rank);
  for (D d : dims) base[d] = 0;
  return span_group(rank_in(l, all, base), dims, [&l](D d) { return l.size(d); }, [&l](D d) { return l.stride(d); });
}

// Every group along `dims`, each once, ordered by its lowest rank.
template <class D>
std::vector<std::vector<int>> all_groups_in(const RankLayout& l, std::initializer_list<D> dims) {
  std::vector<std::vector<int>> out;
  std::vector<bool> covered(static_cast<std::size_t>(l.world()), false);
  for (int r = 0; r < l.world(); ++r) {
    if (covered[static_cast<std::size_t>(r)]) continue;
    out.push_back(l.group(r, dims));
    for (int m : out.back()) covered[static_cast<std::size_t>(m)] = true;
  }
  return out;
}

}  // namespace

RankCoord RankLayout::coord(int rank) const { return coord_in<RankCoord>(*this, kDims, rank); }
int RankLayout::rank(const RankCoord& c) const { return rank_in(*this, kDims, c); }
std::vector<int> RankLayout::group(int rank, std::initializer_list<Dim> dims) const {
  return group_in<RankCoord>(*this, kDims, rank, dims);
}
std::vector<std::vector<int>> RankLayout::all_groups(std::initializer_list<Dim> dims) const {
  return all_groups_in(*this, dims);
}

ExpertCoord RankLayout::expert_coord(int rank) const { return coord_in<ExpertCoord>(*this, kExpertDims, rank); }
int RankLayout::rank(const ExpertCoord& c) const { return rank_in(*this, kExpertDims, c); }
std::vector<int> RankLayout::group(int rank, std::initializer_list<ExpertDim> dims) const {
  return group_in<ExpertCoord>(*this, kExpertDims, rank, dims);
}
std::vector<std::vector<int>> RankLayout::all_groups(std::initializer_list<ExpertDim> dims) const {
  return all_groups_in(*this, dims);
}

}  // namespace trainplan
