// `trainplan calibrate`'s outputs (formatting only): the topology file built from what was
// measured (sim/calibration.hpp) plus a base topology, and the console table of the figures.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "sim/calibration.hpp"

namespace trainplan {

struct TopologyInputs {
  std::string name;
  std::string command;
  std::string device;
  int ranks_per_node = 4;
  std::optional<double> peak_tflops;
  std::optional<double> price_usd;  // CPU: per rank-hour, an assumption from the command line
  std::optional<double> power_w;    // CPU: per rank
  std::string cost_source;          // where those assumptions come from
  std::optional<nlohmann::json> base;  // raw base topology
  std::string base_name;
  std::string date;                 // when it was measured, e.g. "2026-11-22 22:30 UTC"
  Bytes host_memory = 0;            // CPU: the host's RAM (split over ranks_per_node)
};

// The topology file (topologies/*.json schema): the measured fields from `r`, the rest from the
// base (or, for a CPU without a base, from this machine and the command line: memory size, price
// and power). Every figure's origin is written into its "calibration" / "source" text.
nlohmann::json calibrated_topology(const CalibrationResult& r, const TopologyInputs& in);

// A software profile (software/*.json schema): `base` (the raw profile named `base_name`) with
// host.per_kernel_us replaced by the measured host time per kernel, renamed <name>-calibrated,
// and a sentence on where the figure came from appended to its "assumptions".
nlohmann::json calibrated_software(const nlohmann::json& base, const std::string& base_name, const CalibrationResult& r,
                                   const TopologyInputs& in);

// The measured figures as a table (matmul rates, copy bandwidth, SDPA, framework cost, link).
void print_calibration(std::ostream& os, const CalibrationResult& r);

}  // namespace trainplan
