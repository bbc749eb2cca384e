// Predicted beside measured: two traces of one training step on one time
// axis, aligned at step start, and where their time goes per op class and per
// op — the view the calibration loop needs.
//
// Input is either the combined file `rackstep compare` writes (predicted
// events with pid < 1000000, measured with pid + 1000000, process names
// starting "predicted: " / "measured: ", both starting at ts 0; see
// /work/prompts/owners.md "The compare-trace format") or two traces opened
// together (a `rackstep timeline` trace and a `rackstep train --profile` one),
// which merge_traces() turns into the same shape.
//
//   TraceModel both = merge_traces(load_trace_json("pred.json"), load_trace_json("run/trace.json"), ...);
//   CompareSummary c = compare_summary(both);
//   for (const auto& k : c.classes) printf("%s %.3g %.3g\n", k.name.c_str(), k.predicted_us, k.measured_us);
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gui/trace_model.h"

namespace rackstep::gui {

inline constexpr int64_t kMeasuredPidOffset = 1000000;

// True for a trace in the compare format (otherData.rackstep_compare, or
// processes named "predicted: ..." and "measured: ...").
bool is_compare_trace(const TraceModel& m);
// True when row `r` belongs to the measured side.
bool is_measured_row(const TraceRow& r);

// One document in the compare format from two Chrome traces: each side's
// events shifted to start at ts 0, the measured pids moved up by
// kMeasuredPidOffset, process names prefixed. Throws rackstep::UserError.
nlohmann::ordered_json merge_traces(const nlohmann::ordered_json& predicted, const std::string& predicted_path,
                                    const nlohmann::ordered_json& measured, const std::string& measured_path);

// Time per op class (args.op_class when both sides carry it, else the
// slice's category) and per op (args.op, else the slice name), each side's
// top-level slice time divided by its GPU count (GPU processes weighted by
// their "(xN)" copies) and by its number of steps (distinct args.step values,
// or "stepN." slice names; 1 when none), so a profile of several steps
// compares per step with a one-step prediction.
struct CompareLine {
  std::string name;
  std::string op_class;        // for ops: their class
  int op_class_index = -1;     // TraceModel::op_classes index; -1 when the class is a category
  double predicted_us = 0, measured_us = 0;
  double error() const;        // (predicted - measured) / measured; NAN when nothing was measured
};
struct CompareSummary {
  std::vector<CompareLine> classes;  // by measured + predicted time, largest first
  std::vector<CompareLine> ops;      // by |predicted - measured|, largest first
  double predicted_gpus = 0, measured_gpus = 0;
  int predicted_steps = 1, measured_steps = 1;  // distinct step numbers seen; times are per step
  double predicted_span_us = 0, measured_span_us = 0;  // step length each side
  // A `rackstep compare` file's de-load factor for the measured step (otherData.rackstep_compare):
  // measured times here are multiplied by it, so they equal the CLI table's de-loaded column.
  double measured_scale = 1;
};
CompareSummary compare_summary(const TraceModel& m);

// The slices of one class (as compare_summary names it), longest first, at most `limit`.
struct SliceRef {
  int row = -1, event = -1;
};
std::vector<SliceRef> slices_of_class(const TraceModel& m, const std::string& op_class, size_t limit);

}  // namespace rackstep::gui
