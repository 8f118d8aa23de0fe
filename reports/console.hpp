// Human-readable console output of a prediction (formatting only).
#pragma once
#include <ostream>
#include <string>

#include "sim/estimate.hpp"

namespace trainplan {

// Prints the layout, memory per stage and the time breakdown with units.
// `title` is a first line such as "llama3-70b on 64 x dgx-h100".
void print_prediction(std::ostream& os, const Estimate& e, const std::string& title);

// "12.3 GB", "512 MB" (decimal units, as GPU datasheets use).
std::string format_bytes(double bytes);
// "1.23 s", "45.6 ms", "789 us"; "0 s" for zero.
std::string format_seconds(double seconds);
// A parameter count: "175.22B", "124.4M", "52.3K", "830" (a tiny model is not "0.00B").
std::string format_count(double n);

}  // namespace trainplan
