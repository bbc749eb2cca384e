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

#include <nlohmann/json.hpp>

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

// The public validation set (tests/validation/*.json): published measured training
// runs, each with its citation, model, cluster, layout, training stack and
// measurement, marked "fitted" (used to set a calibration value) or "validation"
// (never fitted). `rackstep validate` prints the two groups separately. Each row
// also says whether its figures were checked against the published source
// ("verified", with where) or are still as typed ("unverified"); the goal is
// judged on the verified validation rows.
//
//   std::vector<ValidationRun> runs = load_validation_set();   // tests/validation/*.json
//   run_validation(runs);                                        // fills the predictions
//   ValidationSummary v = summarize(runs, "validation");
namespace rackstep::sim {

struct ValidationRun {
  std::string id;
  std::string role;              // "fitted" or "validation"
  std::string file;              // the set file it came from
  std::string citation;          // where the measurement was published
  bool verified = false;         // figures checked against the source (verification says where)
  std::string verification;      // how they were checked, or why they could not be
  std::string model_path, cluster_path, stack, layout_desc;
  int64_t domains = 0;
  int64_t gpus_per_domain = 0;   // 0 = the whole domain (a run on part of one node sets it)
  nlohmann::json layout_json;    // sim/layout.h JSON
  // Measured (0 / absent = not published).
  double measured_step_time_s = 0;
  double measured_mfu = 0;       // fraction, the run's own MFU convention (noted in the citation)
  bool measured_ran = true;      // the run fit in memory (it ran)
  // Predicted.
  bool ok = false;               // predicted without error
  std::string error_text;        // why not
  double step_time_s = 0, mfu = 0;
  bool fits = false;
  double memory_gib = 0, capacity_gib = 0;
  std::vector<std::string> notes;    // stack issues, calibration warnings
  nlohmann::json prediction;         // prediction_to_json of the run (breakdown, memory, timings)
  double step_error() const { return measured_step_time_s > 0 ? step_time_s / measured_step_time_s - 1.0 : 0.0; }
  bool verdict_right() const { return fits == measured_ran; }
};

// Which rows a summary counts: all, or only those whose source was (not) checked.
enum class SourceCheck { kAny, kVerified, kUnverified };

struct ValidationSummary {
  int runs = 0, with_step = 0;
  double median_abs_step_error = 0, max_abs_step_error = 0;
  int verdicts_right = 0;
};

std::string default_validation_dir();   // <source dir>/tests/validation
std::vector<ValidationRun> load_validation_set(const std::string& dir = default_validation_dir());
void run_validation(std::vector<ValidationRun>& runs, const std::string& calibration_path = "");
ValidationSummary summarize(const std::vector<ValidationRun>& runs, const std::string& role,
                            SourceCheck check = SourceCheck::kAny);

}  // namespace rackstep::sim
