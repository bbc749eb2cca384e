// `rackstep validate-calibration [--calibration F] [--json]`: predicted vs
// measured for every row of spec/calibration.md the predictor covers.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "scripts/cli/command.h"
#include "sim/validate.h"

namespace rackstep::sim {
namespace {

struct ValidateArgs {
  std::string calibration_path;
  bool json = false;
};

int run_validate(const ValidateArgs& a) {
  const Calibration cal = a.calibration_path.empty() ? default_calibration() : load_calibration(a.calibration_path);
  const std::vector<ValidationRow> rows = validate_calibration(cal);
  if (a.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : rows) {
      j.push_back({{"quantity", r.quantity}, {"unit", r.unit}, {"measured", r.measured},
                   {"predicted", r.predicted}, {"error", r.error}, {"how", r.how}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%-64s %12s %12s %10s  %s\n", "quantity", "measured", "predicted", "error", "unit");
  for (const auto& r : rows) {
    char err[32];
    if (r.unit == "%") {
      std::snprintf(err, sizeof err, "%+.2f pt", r.error);
    } else {
      std::snprintf(err, sizeof err, "%+.1f%%", 100.0 * r.error);
    }
    std::printf("%-64s %12.4g %12.4g %10s  %s\n", r.quantity.c_str(), r.measured, r.predicted, err, r.unit.c_str());
  }
  std::printf("\nhow each row was predicted:\n");
  for (const auto& r : rows) std::printf("  %s: %s\n", r.quantity.c_str(), r.how.c_str());
  return 0;
}

rackstep::cli::Registration reg{
    "validate-calibration", "Predicted vs measured for the calibration runs (spec/calibration.md)",
    [](CLI::App& app) {
      auto a = std::make_shared<ValidateArgs>();
      app.add_option("--calibration", a->calibration_path, "calibration JSON (default sim/calibration.json)");
      app.add_flag("--json", a->json, "print JSON");
      return [a] { return run_validate(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
