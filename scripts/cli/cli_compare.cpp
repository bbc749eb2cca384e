// `rackstep compare --predicted CAL --measured RUN [-o compare.json] [--json]`:
// predicted vs measured per op class and per step, and one Chrome trace of both
// timelines (sim/compare.h). CAL is a `rackstep calibrate` output directory
// (calibration.json + topology.json, or topology-npP.json for a run of P
// processes); --cluster / --calibration name the files instead.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "scripts/cli/command.h"
#include "sim/compare.h"

namespace rackstep::sim {
namespace {

namespace fs = std::filesystem;

struct CompareArgs {
  std::string predicted, measured, cluster, calibration, out;
  int64_t step = -1;
  bool json = false;
  bool deload = false;
};

int run_compare(CompareArgs a) {
  CompareInputs in;
  in.run_dir = a.measured;
  in.step = a.step;
  in.deload = a.deload;
  in.cluster = a.cluster;
  in.calibration = a.calibration;
  if (!a.predicted.empty() && fs::is_directory(a.predicted)) {
    int64_t procs = 1;
    const fs::path run_json = fs::path(a.measured) / "run.json";
    if (fs::exists(run_json)) procs = load_json_file(run_json.string()).value("processes", int64_t{1});
    const fs::path topo = fs::path(a.predicted) / (procs > 1 ? "topology-np" + std::to_string(procs) + ".json" : "topology.json");
    if (in.cluster.empty()) in.cluster = topo.string();
    const fs::path cal_np = fs::path(a.predicted) / ("calibration-np" + std::to_string(procs) + ".json");
    if (in.calibration.empty()) {
      in.calibration = (procs > 1 && fs::exists(cal_np) ? cal_np : fs::path(a.predicted) / "calibration.json").string();
    }
    in.predicted = in.calibration;
  } else if (!a.predicted.empty()) {
    in.predicted = a.predicted;
    if (in.calibration.empty()) in.calibration = a.predicted;
  }
  if (in.cluster.empty()) throw UserError("compare: expected --predicted CAL_DIR or --cluster TOPOLOGY, found neither");
  if (!fs::exists(in.cluster)) throw UserError(in.cluster, "", "a topology file (rackstep calibrate --out DIR writes one)", "no such file");
  if (in.predicted.empty()) in.predicted = in.cluster;
  const Comparison c = compare_run(in);
  if (!a.out.empty()) write_json_file_atomic(a.out, c.trace);
  if (a.json) {
    nlohmann::json j = c.table;
    if (!a.out.empty()) j["trace"] = a.out;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s", format_comparison(c).c_str());
  if (!a.out.empty()) std::printf("trace: %s (Perfetto or rackstep-gui)\n", a.out.c_str());
  return 0;
}

rackstep::cli::Registration reg{
    "compare", "Predicted vs measured training step per op class, and one Chrome trace of both timelines",
    [](CLI::App& app) {
      auto a = std::make_shared<CompareArgs>();
      app.add_option("--predicted", a->predicted,
                     "a `rackstep calibrate` output directory (or a calibration JSON with --cluster)");
      app.add_option("--measured", a->measured, "a profiled run directory (rackstep train --profile --out RUN)")
          ->required();
      app.add_option("--cluster", a->cluster, "topology JSON (default: CAL/topology.json or CAL/topology-npP.json)");
      app.add_option("--calibration", a->calibration, "calibration JSON (default: CAL/calibration.json)");
      app.add_option("--step", a->step, "measured step shown in the trace (default: the last profiled one)");
      app.add_option("-o,--out", a->out, "write the Chrome trace of both timelines here");
      app.add_flag("--deload", a->deload,
                   "scale the measured timeline by its step's CPU / (threads x wall): the step on an idle machine");
      app.add_flag("--json", a->json, "print the table as JSON");
      return [a] { return run_compare(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
