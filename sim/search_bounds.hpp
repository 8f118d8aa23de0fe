// search_bounds: the floors search() prunes with (internal to search; search.hpp states the rules
// and candidate_bounds() exposes them to tests). Each is a lower bound of predict()'s figure for
// every candidate it is applied to; tests/sim/test_search.cpp checks them against predict.
#pragma once
#include "sim/predict.hpp"
#include "sim/search_space.hpp"

namespace trainplan::search_detail {

// A relative margin so that rounding never lifts a bound above the figure it bounds.
inline constexpr double kMargin = 1 - 1e-9;

// The bound constants of `p`; with `activation_table`, the stored activation bytes of every layer
// shape and variant too (what the search reads per layout; candidate_bounds computes one strategy's
// directly).
BoundConstants bound_constants(const Problem& p, bool activation_table);

// Floor of the work of all stages for one micro-batch (summed over stages): forward + backward
// (2x) of every matmul at the best matmul rate, plus the repeated forward of the layers under
// full recomputation. Routed experts: a rank computes at least its balanced share of the routed
// rows (all of them dropless, C of them under a capacity factor C < 1).
Seconds work_floor(const Problem& p, int tp, int cp, int mb, bool full_recompute);

// Model-state bytes summed over stages for a setting of kind `k`: every parameter is held by some
// stage, split at least tp ways, sharded as k.zero says over dp x cp (memory_model's
// model_state_bytes, as predict uses it); with parameter servers the workers hold no optimizer
// states. Routed experts' states: at least 1 / (tp x cp x dp) of each per rank, for any expert
// layout (ep x etp x edp = tp x cp x dp).
Bytes states_floor(const Problem& p, const Layout& l, const StateKind& k);

// Activation floor, summed over the stages, in units of one layer's stored activations.
double activation_floor_layers(const Problem& p, ScheduleKind kind, int pp, int m, int vp);

struct Bounds {
  Seconds step = 0;
  Bytes memory = 0;
};
// The floors of step time and peak memory of `s` (see search.hpp for the argument), from its
// layer's stored activation bytes and layer costs. Margins applied.
Bounds bounds(const Problem& p, const Strategy& s, Bytes per_layer_act, const LayerCosts& layer);

}  // namespace trainplan::search_detail
