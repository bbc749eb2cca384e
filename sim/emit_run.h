// A chosen candidate as a directory that launches it: `rackstep sweep
// --emit-run DIR` and `rackstep size --emit-run DIR` (issue 12, "launching a
// calibrated run").
//
// DIR holds model.json, layout.json, cluster.json and calibration.json (what
// the prediction used), prediction.json, and two launch scripts that run the
// layout with `rackstep train --layout` and then feed its profile back:
//   launch-mpirun.sh   DATA=... [THREADS=1] [STEPS=20] [RUN=run] bash DIR/launch-mpirun.sh
//   launch-slurm.sbatch  sbatch --export=DATA=... DIR/launch-slurm.sbatch (srun, one task per data rank)
// Both end with `rackstep calibrate --from-run` and `rackstep compare`, so the
// run's measurements refit the next prediction.
//
//   emit_run("out/run1", {.model = m, .cluster = c, .calibration = cal}, layout, prediction);   // files
//   emit_run_docs("out/run2", size_candidate_docs(scenario, winner), winner.layout, winner.prediction);
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "sim/layout.h"
#include "sim/predict.h"
#include "sim/scenario.h"
#include "sim/size.h"

namespace rackstep::sim {

struct EmitRunInputs {
  std::string model;        // model JSON path
  std::string cluster;      // cluster / topology JSON path
  std::string calibration;  // calibration JSON path ("" = the default)
};

// The same as documents: what size has for a candidate that may not be a file.
struct EmitRunDocs {
  nlohmann::json model;        // a model JSON (models/zoo format)
  nlohmann::json cluster;      // a system JSON, with "domains" when more than one (load_cluster reads it)
  nlohmann::json calibration;  // sim/calibration.json format, a stack's overrides merged in
  nlohmann::json sources;      // {"model": "...", "cluster": "...", "calibration": "..."}: where each came from
  std::string written_by = "rackstep sweep --emit-run";
};

void emit_run(const std::string& dir, const EmitRunInputs& in, const Layout& layout, const Prediction& prediction);
void emit_run_docs(const std::string& dir, const EmitRunDocs& docs, const Layout& layout, const Prediction& prediction);

// The documents of a sized candidate: its model file (or the scenario's inline
// config), the scenario's cluster as one system file with its domain count, and
// the calibration of the scenario's stack. UserError for a candidate generated
// from size targets (it has no model JSON to launch).
EmitRunDocs size_candidate_docs(const Scenario& s, const CandidateResult& c);

}  // namespace rackstep::sim
