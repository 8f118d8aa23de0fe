#include "reports/thin.hpp"

#include <utility>

#include "reports/svg.hpp"
#include "sim/check.hpp"

namespace trainplan {

bool thin_drawn_points(std::vector<double>& xs, std::vector<double>& ys, std::size_t max_points) {
  TRAINPLAN_CHECK(xs.size() == ys.size(), "a scatter needs as many y as x values");
  if (xs.size() <= max_points) return false;
  std::vector<std::pair<double, double>> points(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) points[i] = {xs[i], ys[i]};
  const std::vector<std::size_t> kept = svg::thin_points(points, max_points);
  std::vector<double> kx, ky;
  kx.reserve(kept.size());
  ky.reserve(kept.size());
  for (std::size_t i : kept) {
    kx.push_back(xs[i]);
    ky.push_back(ys[i]);
  }
  xs = std::move(kx);
  ys = std::move(ky);
  return true;
}

}  // namespace trainplan
