// Predicted vs measured for every row of spec/calibration.md (and the measured
// collectives of spec/hardware.md) that the predictor covers.
//
// Each row names the quantity, the measurement, the prediction, the relative
// (or, for percentages, absolute) error, and how the prediction was made: the
// model, cluster and layout (sim/layouts/*.json) it ran. Measurements are only
// compared against here; they never feed the prediction.
//
//   for (const ValidationRow& r : validate_calibration(default_calibration())) ...
//   `rackstep validate-calibration [--json]`
#pragma once

#include <string>
#include <vector>

#include "sim/calibration.h"

namespace rackstep::sim {

struct ValidationRow {
  std::string quantity;
  std::string unit;              // "s", "%", "GiB", "GB/s", ...
  double measured = 0;
  double predicted = 0;
  double error = 0;              // relative for quantities, absolute points for "%"
  std::string how;               // what was run
};

std::vector<ValidationRow> validate_calibration(const Calibration& cal);

}  // namespace rackstep::sim
