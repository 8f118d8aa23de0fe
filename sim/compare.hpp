// Predicted vs measured: the one place where `trainplan compare` does arithmetic (the % errors).
// reports/compare.* only reads the files and formats what compare() returns.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "sim/estimate.hpp"
#include "sim/measurement.hpp"

namespace trainplan {

// One compared figure. A side is absent when that side has no such figure (e.g. the prediction
// has no "other" time; a measurement without model FLOPs has no TFLOP/s).
struct ComparedFigure {
  std::string key;                  // JSON key, e.g. "step_s", "peak_bytes", "stage0_peak_bytes"
  std::string label;                // human label, e.g. "step", "stage 0 peak"
  std::string unit;                 // "s", "B", "tokens/s", "TFLOP/s"
  std::optional<double> predicted;
  std::optional<double> measured;
  // error_pct = 100 * (predicted - measured) / measured: positive means the prediction is too
  // high. 0 when both are 0; absent when either side is absent or exactly one of them is 0 (a
  // predicted 0 against a measured time or size means the model does not predict that figure,
  // not that it is 100% off).
  std::optional<double> error_pct;
  // The prediction has 0 where the run measured something (see error_pct).
  bool not_predicted() const { return predicted && measured && *predicted == 0 && *measured != 0; }
};

struct Comparison {
  std::string predicted_model, measured_model;      // "" when the prediction names none
  std::string predicted_cluster, measured_cluster;
  bool predicted_feasible = true;
  bool strategies_match = true;
  std::vector<std::string> strategy_differences;    // "dp: predicted 2, measured 1"
  std::vector<std::string> warnings;                // every mismatch worth telling the user
  Strategy strategy;                                // the prediction's
  Spread measured_step_time;                        // spread of the measured steps
  int warmup = 0;                                   // measured run's warm-up steps
  std::vector<ComparedFigure> time;                 // step, compute, each phase
  std::vector<ComparedFigure> memory;               // peak, per stage, per rank: against a GPU run's
                                                    // allocator-reserved peak the predicted reserved
                                                    // bytes (no runtime reserve), else the total
  std::vector<ComparedFigure> throughput;           // tokens/s, per GPU, model TFLOP/s per GPU
};

// The % error of one figure (see ComparedFigure::error_pct).
std::optional<double> percent_error(std::optional<double> predicted, std::optional<double> measured);

// One line when the measurement came from a trainplan exec whose memory behaviour is not the one
// the prediction's software profile describes (Software::describes_executor against
// Measurement::executor, for a measurement described by the same profile `software`), or where only
// one side names an executor; "" otherwise. A profile describing another executor predicts another
// program: its figures say nothing about this run's.
std::string executor_mismatch(const std::string& software, const std::string& software_executor,
                              const Measurement& measured);

// `predicted_model`/`predicted_cluster` come from the prediction file's top level ("" if absent).
Comparison compare(const Estimate& predicted, const std::string& predicted_model,
                   const std::string& predicted_cluster, const Measurement& measured);

}  // namespace trainplan
