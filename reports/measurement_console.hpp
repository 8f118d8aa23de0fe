// Human-readable console summary of a `trainplan exec` measurement (formatting only).
#pragma once
#include <ostream>
#include <string>

#include "sim/measurement.hpp"

namespace trainplan {

// The run's layout, the loss and wall time of each measured step, the step-time spread, the
// phase breakdown (busiest rank, median), peak memory per pipeline stage and throughput.
// Measured steps are numbered from 1; CPU runs count "CPU ranks", GPU runs "GPUs"; bytes and
// times as every console prints them (console.hpp).
void print_measurement(std::ostream& os, const Measurement& m);

// The dtype the run computed in: environment.compute_dtype as exec recorded it ("fp32" on CPU,
// "bf16 (autocast, fp32 master)" on a GPU), with the plan's dtype where they differ; the plan's
// dtype alone where the file does not say.
std::string run_dtype(const Measurement& m);

}  // namespace trainplan
