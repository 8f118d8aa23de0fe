// Human-readable console output of a prediction (formatting only).
#pragma once
#include <ostream>
#include <string>

#include <vector>

#include "sim/cluster.hpp"
#include "sim/estimate.hpp"
#include "sim/layer_detail.hpp"

namespace trainplan {

// Prints the layout, memory per stage and the time breakdown with units.
// `title` is a first line such as "llama3-70b on 64 x dgx-h100".
void print_prediction(std::ostream& os, const Estimate& e, const std::string& title);

// predict --detail layers: per pipeline stage, the time (per micro-batch) and memory of the
// embedding, each chunk's transformer layers (figures of one layer) and the LM head.
void print_layer_detail(std::ostream& os, const std::vector<StageDetail>& stages);

// Row name of a layer_detail row: "embedding", "layers 0-19", "layer 7", "LM head".
std::string layer_row_name(const LayerRow& r);

// The plan's cost per step, one line: USD per step (search's cost objective, objective_value) from
// the cluster file's price per GPU-hour; says so where the file gives no price.
void print_cost(std::ostream& os, const Estimate& e, const Cluster& cluster);

// "$1,234" style is avoided: "$1234", "$12.35", "$0.0123" (3 significant digits below $1).
std::string format_usd(double usd);

// The one rule for bytes and times on every console (predict, compare, search, simulate, capacity,
// exec) and in the HTML report: one decimal in the largest decimal unit that fits, "12.3 GB",
// "512.0 MB" (decimal units, as GPU datasheets use); negative values (differences) keep their sign.
std::string format_bytes(double bytes);
// "1.234 s", "45.60 ms", "789.0 us" (a fixed number of decimals per unit: ms resolution in
// seconds, 10 us in ms, 0.1 us in us); "0 s" for zero.
std::string format_seconds(double seconds);
// A parameter count: "175.22B", "124.4M", "52.3K", "830" (a tiny model is not "0.00B").
std::string format_count(double n);

}  // namespace trainplan
