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

}  // namespace trainplan
