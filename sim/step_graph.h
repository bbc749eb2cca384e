// The task graph of training steps, for the event engine (sim/des.h).
//
// Built from the layer graph, a layout and a cluster, priced with the
// predictor's per-layer costs (Predictor::layer_timings, op_timings and the
// per-step lines of its breakdown) so the DES and the analytic model share
// every cost and differ only in how the pieces overlap and wait:
//   - per micro-batch and layer: forward, (full or selective) recompute,
//     backward on the compute stream;
//   - FSDP parameter all-gathers on their own stream, prefetched one layer
//     ahead (a gather waits for the compute two layers back: a memory window);
//     gradient reduce-scatters on another stream after each layer's backward;
//   - EP dispatch and combine after each layer's forward, recompute and
//     backward (the compute waits for them: ragged transport is exposed);
//   - TP passes exposed; CP ring passes beside each layer's compute;
//   - pipeline stages with real 1F1B or interleaved-1F1B dependencies (virtual
//     stages as model chunks) and sends at every chunk boundary
//     (each stage's compute stream runs its schedule in order);
//   - per step: GC stall on one staggered rank (host CPU) that holds up the
//     gradient reduction across replicas, then the optimizer (compute,
//     Newton-Schulz gather / redistribute, host state streaming).
// Symmetry: one process per (stage, representative rank) stands for
// gpus / (pp x ranks_per_stage) GPUs, so a 704-GPU step is a few thousand tasks.
//
//   Predictor pred(graph, cluster);
//   StepGraph sg = build_step_graph(pred, layout, {});
//   RunResult r = sg.engine.run();   // r.makespan_s vs sg.prediction.step_time_s
#pragma once

#include <cstdint>
#include <vector>

#include "sim/des.h"
#include "sim/layout.h"
#include "sim/predict.h"

namespace rackstep::sim {

struct StepGraphOptions {
  int64_t steps = 1;
  int64_t ranks_per_stage = 1;  // explicit data ranks per stage (the rest by multiplicity)
  bool gc_stalls = true;
};

struct StepGraph {
  Engine engine;
  Prediction prediction;          // the analytic model on the same layout
  int64_t micro_batches = 0;
  int64_t stages = 0;
  int64_t layers_per_stage = 0;
  std::vector<TaskId> step_end;   // last task of each step
};

// Throws UserError for an invalid layout (with the predictor's reasons) or a
// pipeline schedule the DES does not build yet.
StepGraph build_step_graph(const Predictor& p, const Layout& l, const StepGraphOptions& o);

}  // namespace rackstep::sim
