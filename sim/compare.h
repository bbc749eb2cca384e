// Predicted vs measured training steps: `rackstep compare`.
//
// The measured side is a profiled run (`rackstep train --profile --out RUN`:
// RUN/run.json, RUN/trace.json, RUN/log.jsonl); the predicted side is the
// predictor's op times (Predictor::op_timings) for the same model, batch,
// sequence and process layout on a calibrated cluster (`rackstep calibrate`
// output). One function names a slice on both sides (sim/slice_name.h), so the
// simulator's and the engine's slices map one to one: the layer-graph op name
// plus the pass, e.g. "layers.3.attn.q_proj.fwd".
//
// Output: a table per op class (predicted and measured seconds of one step,
// forward + backward, the measured also de-loaded: x CPU time / (threads x
// wall) of the step, as `rackstep calibrate` times its measurements) and per
// logged step, and one Chrome trace with both
// timelines of the same step aligned at 0: predicted pids < 1000000, measured
// pids + 1000000, process names "predicted: ..." / "measured: ...", every
// slice with cat = pass and args {op, op_class}, otherData.rackstep_compare.
//
//   CompareInputs in{.run_dir = "runs/p", .cluster = "cal/topology.json", .calibration = "cal/calibration.json"};
//   Comparison c = compare_run(in);
//   write c.trace; print format_comparison(c) or c.table.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "models/layer_graph.h"
#include "sim/slice_name.h"

namespace rackstep::sim {

inline constexpr int64_t kMeasuredPidOffset = 1000000;

struct CompareInputs {
  std::string run_dir;
  std::string predicted;     // recorded as otherData.rackstep_compare.predicted
  std::string cluster;       // topology JSON (a calibrate output's topology.json)
  std::string calibration;   // calibration JSON
  int64_t step = -1;         // measured step to show (-1: the last profiled step)
  bool deload = false;       // scale the measured slices by the step's CPU / (threads x wall)
};

struct Comparison {
  nlohmann::json table;      // {"by_class": [...], "steps": [...], "step": {...}}
  nlohmann::json trace;      // Chrome trace object
};

Comparison compare_run(const CompareInputs& in);
std::string format_comparison(const Comparison& c);

}  // namespace rackstep::sim
