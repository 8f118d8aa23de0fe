#include "reports/thin.hpp"

#include <utility>

#include "reports/svg.hpp"

namespace trainplan {

bool thin_drawn_points(std::vector<std::pair<double, double>>& points, std::size_t max_points) {
  if (points.size() <= max_points) return false;
  const std::vector<std::size_t> kept = svg::thin_points(points, max_points);
  if (kept.size() == points.size()) return false;
  std::vector<std::pair<double, double>> out;
  out.reserve(kept.size());
  for (std::size_t i : kept) out.push_back(points[i]);
  points = std::move(out);
  return true;
}

}  // namespace trainplan
