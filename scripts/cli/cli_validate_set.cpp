// `rackstep validate [--dir D] [--calibration F] [--json]`: the public validation
// set (tests/validation/*.json): published measured runs predicted under their
// own training stack, the fitted rows and the validation rows in separate tables,
// each with the median and largest step-time error and the memory verdicts, for
// all rows and apart for rows whose source was checked (verified) or not; the
// goal line is computed on the verified validation rows.
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
// every memory verdict right. Judged on the rows whose figures were checked
// against their published source; the unverified rows are reported beside it.
constexpr double kGoalMedian = 0.08, kGoalMax = 0.20;

bool goal_met(const ValidationSummary& s) {
  return s.runs > 0 && s.with_step > 0 && s.median_abs_step_error <= kGoalMedian &&
         s.max_abs_step_error <= kGoalMax && s.verdicts_right == s.runs;
}

std::string verdict_text(const ValidationRun& v) {
  const std::string predicted = v.fits ? "fits" : "does not fit";
  if (v.verdict_right()) return predicted + " (right)";
  return predicted + (v.measured_ran ? " (WRONG: it ran)" : " (WRONG: it did not fit)");
}

void print_summary_line(const char* label, const ValidationSummary& s) {
  std::printf("  %-16s %2d runs, %2d with a step time: median |step error| %.1f%%, max %.1f%%; "
              "memory verdicts right %d/%d\n",
              label, s.runs, s.with_step, 100.0 * s.median_abs_step_error, 100.0 * s.max_abs_step_error,
              s.verdicts_right, s.runs);
}

void print_table(const std::vector<ValidationRun>& runs, const std::string& role) {
  std::printf("\n%s rows (source: ok = figures checked against the publication, unv = not yet)\n", role.c_str());
  std::printf("%-36s %-3s %-16s %9s %9s %8s %7s %7s  %-16s %s\n", "run", "src", "stack", "meas s", "pred s",
              "error", "MFU m", "MFU p", "memory", "verdict");
  for (const ValidationRun& v : runs) {
    if (v.role != role) continue;
    const char* src = v.verified ? "ok" : "unv";
    if (!v.ok) {
      std::printf("%-36s %-3s %-16s  cannot predict: %s\n", v.id.c_str(), src, v.stack.c_str(),
                  v.error_text.c_str());
      continue;
    }
    char meas[32] = "-", err[32] = "-", mfu_m[32] = "-", mem[48];
    if (v.measured_step_time_s > 0) {
      std::snprintf(meas, sizeof meas, "%.2f", v.measured_step_time_s);
      std::snprintf(err, sizeof err, "%+.1f%%", 100.0 * v.step_error());
    }
    if (v.measured_mfu > 0) std::snprintf(mfu_m, sizeof mfu_m, "%.1f%%", 100.0 * v.measured_mfu);
    std::snprintf(mem, sizeof mem, "%.1f/%.1f GiB", v.memory_gib, v.capacity_gib);
    std::printf("%-36s %-3s %-16s %9s %9.2f %8s %7s %6.1f%%  %-16s %s\n", v.id.c_str(), src, v.stack.c_str(),
                meas, v.step_time_s, err, mfu_m, 100.0 * v.mfu, mem, verdict_text(v).c_str());
  }
  std::printf("%s:\n", role.c_str());
  print_summary_line("all rows", summarize(runs, role));
  print_summary_line("verified rows", summarize(runs, role, SourceCheck::kVerified));
  print_summary_line("unverified rows", summarize(runs, role, SourceCheck::kUnverified));
}

nlohmann::json summary_json(const ValidationSummary& s) {
  return {{"runs", s.runs},
          {"with_step_time", s.with_step},
          {"median_abs_step_error", s.median_abs_step_error},
          {"max_abs_step_error", s.max_abs_step_error},
          {"verdicts_right", s.verdicts_right}};
}

nlohmann::json run_json(const ValidationRun& v) {
  nlohmann::json r{{"id", v.id},           {"role", v.role},          {"stack", v.stack},
                   {"model", v.model_path}, {"cluster", v.cluster_path}, {"layout", v.layout_desc},
                   {"citation", v.citation}, {"verified", v.verified},  {"verification", v.verification},
                   {"predicted", v.ok}};
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
    r["capacity_bytes"] = v.capacity_gib * 1024.0 * 1024.0 * 1024.0;
    r["verdict_right"] = v.verdict_right();
    r["prediction"] = v.prediction;
  }
  r["notes"] = v.notes;
  return r;
}

int run_validate_set(const ValidateSetArgs& a) {
  std::vector<ValidationRun> runs = load_validation_set(a.dir.empty() ? default_validation_dir() : a.dir);
  run_validation(runs, a.calibration_path);
  const ValidationSummary goal = summarize(runs, "validation", SourceCheck::kVerified);
  if (a.json) {
    nlohmann::json j;
    j["runs"] = nlohmann::json::array();
    for (const ValidationRun& v : runs) j["runs"].push_back(run_json(v));
    for (const char* role : {"fitted", "validation"}) {
      nlohmann::json s = summary_json(summarize(runs, role));
      s["verified"] = summary_json(summarize(runs, role, SourceCheck::kVerified));
      s["unverified"] = summary_json(summarize(runs, role, SourceCheck::kUnverified));
      j["summary"][role] = s;
    }
    j["goal"] = summary_json(goal);
    j["goal"]["rows"] = "validation rows with verified sources";
    j["goal"]["max_median_abs_step_error"] = kGoalMedian;
    j["goal"]["max_max_abs_step_error"] = kGoalMax;
    j["goal"]["met"] = goal_met(goal);
    j["goal_met"] = goal_met(goal);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  print_table(runs, "fitted");
  print_table(runs, "validation");
  std::printf("\ngoal on the verified validation rows (median <= %.0f%%, max <= %.0f%%, every verdict right): "
              "%d runs, median |step error| %.1f%%, max %.1f%%, verdicts right %d/%d: %s\n",
              100.0 * kGoalMedian, 100.0 * kGoalMax, goal.runs, 100.0 * goal.median_abs_step_error,
              100.0 * goal.max_abs_step_error, goal.verdicts_right, goal.runs, goal_met(goal) ? "met" : "NOT met");
  std::printf("\nwhere each measurement comes from:\n");
  for (const ValidationRun& v : runs) {
    std::printf("  %s: %s\n    %s: %s\n    %s\n", v.id.c_str(), v.citation.c_str(),
                v.verified ? "verified" : "unverified", v.verification.c_str(), v.layout_desc.c_str());
    for (const std::string& n : v.notes) std::printf("    note: %s\n", n.c_str());
  }
  return 0;
}

rackstep::cli::Registration reg{
    "validate",
    "Published measured runs (tests/validation/*.json) predicted under their training stacks: fitted and "
    "validation rows apart, step-time error, MFU and memory verdicts; rows whose figures were checked against the "
    "publication (verified) and not (unverified) summarised apart, the goal line on the verified validation rows",
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
