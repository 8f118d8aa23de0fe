// `trainplan compare`'s console table of a Comparison (sim/compare.hpp). Formatting only: every
// figure printed comes from the two files or from compare(). The files are read by
// prediction_from_json and measurement_from_json; the result is written as
// trainplan/comparison/v1 (reports/comparison_json.hpp).
#pragma once
#include <ostream>
#include <string>

#include "reports/comparison_json.hpp"
#include "reports/prediction_json.hpp"
#include "sim/compare.hpp"

namespace trainplan {

void print_comparison(std::ostream& os, const Comparison& c, const std::string& prediction_file,
                      const std::string& measurement_file);

// A % error as the console and the report print it: "+12.3%", and past a million percent in
// exponent form ("+1.2e+105%") rather than a hundred digits.
std::string format_error_pct(double pct);

}  // namespace trainplan
