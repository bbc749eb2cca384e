// A chosen candidate as a directory that launches it: `rackstep sweep
// --emit-run DIR` (issue 12, "launching a calibrated run").
//
// DIR holds model.json, layout.json, cluster.json and calibration.json (copies
// of what the prediction used), prediction.json, and two launch scripts that
// run the layout with `rackstep train` and then feed its profile back:
//   launch-mpirun.sh   DATA=... [THREADS=1] [RUN=run] bash DIR/launch-mpirun.sh
//   launch-slurm.sbatch  sbatch --export=DATA=... DIR/launch-slurm.sbatch (srun, one task per data rank)
// Both end with `rackstep calibrate --from-run` and `rackstep compare`, so the
// run's measurements refit the next prediction.
//
//   emit_run("out/run1", {.model = m, .cluster = c, .calibration = cal}, layout, prediction);
#pragma once

#include <string>

#include "sim/layout.h"
#include "sim/predict.h"

namespace rackstep::sim {

struct EmitRunInputs {
  std::string model;        // model JSON path
  std::string cluster;      // cluster / topology JSON path
  std::string calibration;  // calibration JSON path ("" = the default)
};

void emit_run(const std::string& dir, const EmitRunInputs& in, const Layout& layout, const Prediction& prediction);

}  // namespace rackstep::sim
