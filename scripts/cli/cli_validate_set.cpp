// `rackstep validate [--dir D] [--calibration F] [--json]`: the public validation
// set (tests/validation/*.json): published measured runs predicted under their
// own training stack, the fitted rows and the validation rows in separate tables,
// each with the median and largest step-time error and the memory verdicts.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "scripts/cli/command.h"
#include "sim/validate.h"

namespace rackstep::sim {
namespace {

struct ValidateSetArgs {
  std::string dir, calibration_path;
  bool json = false;
};

// Goal on the validation rows (issue 13): median |step error| <= 8%, max <= 20%,
// every memory verdict right.
constexpr double kGoalMedian = 0.08, kGoalMax = 0.20;

void print_table(const std::vector<ValidationRun>& runs, const std::string& role) {
  std::printf("\n%s rows\n", role.c_str());
  std::printf("%-34s %-14s %9s %9s %8s %7s %7s  %-16s %s\n", "run", "stack", "meas s", "pred s", "error",
              "MFU m", "MFU p", "memory", "verdict");
  for (const ValidationRun& v : runs) {
    if (v.role != role) continue;
    if (!v.ok) {
      std::printf("%-34s %-14s  cannot predict: %s\n", v.id.c_str(), v.stack.c_str(), v.error_text.c_str());
      continue;
    }
    char meas[32] = "-", err[32] = "-", mfu_m[32] = "-", mem[48];
    if (v.measured_step_time_s > 0) {
      std::snprintf(meas, sizeof meas, "%.2f", v.measured_step_time_s);
      std::snprintf(err, sizeof err, "%+.1f%%", 100.0 * v.step_error());
    }
    if (v.measured_mfu > 0) std::snprintf(mfu_m, sizeof mfu_m, "%.1f%%", 100.0 * v.measured_mfu);
    std::snprintf(mem, sizeof mem, "%.1f/%.1f GiB", v.memory_gib, v.capacity_gib);
    std::printf("%-34s %-14s %9s %9.2f %8s %7s %6.1f%%  %-16s %s (%s)\n", v.id.c_str(), v.stack.c_str(), meas,
                v.step_time_s, err, mfu_m, 100.0 * v.mfu, mem, v.fits ? "fits" : "does not fit",
                v.verdict_right() ? "right" : "WRONG: it ran");
  }
  const ValidationSummary s = summarize(runs, role);
  std::printf("%s: %d runs, %d with a step time: median |step error| %.1f%%, max %.1f%%; memory verdicts right %d/%d\n",
              role.c_str(), s.runs, s.with_step, 100.0 * s.median_abs_step_error, 100.0 * s.max_abs_step_error,
              s.verdicts_right, s.runs);
}

int run_validate_set(const ValidateSetArgs& a) {
  std::vector<ValidationRun> runs = load_validation_set(a.dir.empty() ? default_validation_dir() : a.dir);
  run_validation(runs, a.calibration_path);
  const ValidationSummary val = summarize(runs, "validation");
  const bool goal = val.with_step > 0 && val.median_abs_step_error <= kGoalMedian &&
                    val.max_abs_step_error <= kGoalMax && val.verdicts_right == val.runs;
  if (a.json) {
    nlohmann::json j;
    nlohmann::json rows = nlohmann::json::array();
    for (const ValidationRun& v : runs) {
      nlohmann::json r{{"id", v.id},           {"role", v.role},       {"stack", v.stack},
                       {"model", v.model_path}, {"cluster", v.cluster_path}, {"layout", v.layout_desc},
                       {"citation", v.citation}, {"predicted", v.ok}};
      if (!v.ok) r["error"] = v.error_text;
      if (v.measured_step_time_s > 0) r["measured_step_time_s"] = v.measured_step_time_s;
      if (v.measured_mfu > 0) r["measured_mfu"] = v.measured_mfu;
      r["measured_ran"] = v.measured_ran;
      if (v.ok) {
        r["step_time_s"] = v.step_time_s;
        r["mfu"] = v.mfu;
        if (v.measured_step_time_s > 0) r["step_error"] = v.step_error();
        r["fits"] = v.fits;
        r["memory_bytes"] = v.memory_gib * 1024.0 * 1024.0 * 1024.0;
        r["verdict_right"] = v.verdict_right();
      }
      r["notes"] = v.notes;
      rows.push_back(r);
    }
    j["runs"] = rows;
    for (const char* role : {"fitted", "validation"}) {
      const ValidationSummary s = summarize(runs, role);
      j["summary"][role] = {{"runs", s.runs},
                            {"with_step_time", s.with_step},
                            {"median_abs_step_error", s.median_abs_step_error},
                            {"max_abs_step_error", s.max_abs_step_error},
                            {"verdicts_right", s.verdicts_right}};
    }
    j["goal_met"] = goal;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  print_table(runs, "fitted");
  print_table(runs, "validation");
  std::printf("\ngoal on the validation rows (median <= %.0f%%, max <= %.0f%%, every verdict right): %s\n",
              100.0 * kGoalMedian, 100.0 * kGoalMax, goal ? "met" : "NOT met");
  std::printf("\nwhere each measurement comes from:\n");
  for (const ValidationRun& v : runs) {
    std::printf("  %s: %s\n    %s\n", v.id.c_str(), v.citation.c_str(), v.layout_desc.c_str());
    for (const std::string& n : v.notes) std::printf("    note: %s\n", n.c_str());
  }
  return 0;
}

rackstep::cli::Registration reg{
    "validate",
    "Published measured runs (tests/validation/*.json) predicted under their training stacks: fitted and "
    "validation rows apart, step-time error, MFU and memory verdicts",
    [](CLI::App& app) {
      auto a = std::make_shared<ValidateSetArgs>();
      app.add_option("--dir", a->dir, "folder of validation-set JSON files (default tests/validation)");
      app.add_option("--calibration", a->calibration_path,
                     "calibration JSON each run's stack overrides are merged over (default sim/calibration.json)");
      app.add_flag("--json", a->json, "print JSON");
      return [a] { return run_validate_set(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
