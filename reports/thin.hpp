// How many points a chart draws: a scatter of a document's points (trainplan report reading a
// search file) is thinned before it is drawn, so that its memory and the page's size do not grow
// with the document (3.4 M candidate points, legal in a 61 MB file, ran a report out of 2 GiB).
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace trainplan {

// The most points of one scatter series a page draws, and what `search --json` keeps of its
// candidates (reports/search_json.cpp), so a search's own file is drawn whole.
inline constexpr std::size_t kMaxDrawnPoints = 2000;

// Keeps at most `max_points` of the (x, y) points -- the lower-left front whole, the others one
// per grid cell (svg::thin_points), in their order -- and returns whether any was left out.
bool thin_drawn_points(std::vector<std::pair<double, double>>& points, std::size_t max_points = kMaxDrawnPoints);

}  // namespace trainplan
