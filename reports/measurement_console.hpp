// Human-readable console summary of a `trainplan exec` measurement (formatting only).
#pragma once
#include <ostream>

#include "sim/measurement.hpp"

namespace trainplan {

// The run's layout, the loss and wall time of each measured step, the step-time spread, the
// phase breakdown (busiest rank, median), peak memory per pipeline stage and throughput.
void print_measurement(std::ostream& os, const Measurement& m);

}  // namespace trainplan
