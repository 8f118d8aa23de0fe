// Spearman's rank correlation, as the ranking validations compare predicted with measured step
// times: a planner sells the order of the layouts it compares.
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace trainplan::testing {

// Ranks (1-based) of v's values; tied values share their mean rank.
inline std::vector<double> ranks(const std::vector<double>& v) {
  std::vector<std::size_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    for (std::size_t k = i; k <= j; ++k) r[order[k]] = (i + j) / 2.0 + 1;
    i = j + 1;
  }
  return r;
}

// Spearman's rho: the Pearson correlation of the two samples' ranks.
inline double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(a.size());
  const double ma = std::accumulate(ra.begin(), ra.end(), 0.0) / n, mb = std::accumulate(rb.begin(), rb.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

// What a planner's user acts on: its first `top` layouts. Among the runs `eligible` (empty: all;
// a planner drops those it predicts out of memory), the `top` fastest predicted; their best
// measured step against the fastest measured run, minus one (0: the fastest is among them).
inline double top_regret(const std::vector<double>& predicted, const std::vector<double>& measured, std::size_t top,
                         const std::vector<bool>& eligible = {}) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < predicted.size(); ++i)
    if (eligible.empty() || eligible[i]) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return predicted[a] < predicted[b]; });
  double picked = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < std::min(top, order.size()); ++k) picked = std::min(picked, measured[order[k]]);
  return picked / *std::min_element(measured.begin(), measured.end()) - 1;
}

}  // namespace trainplan::testing
