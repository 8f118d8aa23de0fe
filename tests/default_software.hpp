// Tests and benchmarks that do not name a software profile cost the default one
// (kDefaultSoftware, software/megatron-core.json): these overloads add it to the library's calls.
#pragma once
#include "sim/predict.hpp"
#include "sim/search.hpp"
#include "sim/simulate.hpp"
#include "sim/software.hpp"

namespace trainplan {

namespace testing {
inline const Software& default_software() {
  static const Software s = load_software(kDefaultSoftware, TRAINPLAN_SOURCE_DIR);
  return s;
}
}  // namespace testing

inline Estimate predict(const LayerGraph& g, const Cluster& c, const Strategy& s) {
  return predict(g, c, testing::default_software(), s);
}
inline StepCosts step_costs(const LayerGraph& g, const Cluster& c, const Strategy& s) {
  return step_costs(g, c, testing::default_software(), s);
}
inline Estimate predict_with_simulation(const LayerGraph& g, const Cluster& c, const Strategy& s) {
  return predict_with_simulation(g, c, testing::default_software(), s);
}
inline SearchResult search(const LayerGraph& g, const Cluster& c, const SearchSpace& sp, const SearchOptions& o = {}) {
  return search(g, c, testing::default_software(), sp, o);
}
inline CandidateBounds candidate_bounds(const LayerGraph& g, const Cluster& c, const Strategy& s) {
  return candidate_bounds(g, c, testing::default_software(), s);
}
inline void refine_top_with_simulation(SearchResult& r, const LayerGraph& g, const Cluster& c, Objective o) {
  refine_top_with_simulation(r, g, c, testing::default_software(), o);
}

}  // namespace trainplan
