// Pipeline-parallel schedules: in which order each stage runs the forward and
// backward passes of its micro-batches and model chunks. 1F1B and interleaved
// 1F1B (Narayanan et al. 2021), zero-bubble ZB-H1 (Qi et al. 2024) and
// DualPipeV (DeepSeek-AI, DualPipe repository). sim/step_graph.h builds the
// tasks of a step from these orders; the analytic bubble of each schedule is
// sim/predict.cpp's pipeline_bubble.
//
//   for (const PipelineSlot& x : pipeline_order(PpSchedule::k1F1B, /*pp=*/4, 1, /*micro_batches=*/8, /*stage=*/0))
//     ...  // x.pass, x.chunk (model chunk on this stage), x.mb
#pragma once

#include <cstdint>
#include <vector>

#include "sim/layout.h"

namespace rackstep::sim {

// One entry of a pipeline stage's compute order: a pass of micro-batch `mb`
// through the stage's model chunk `chunk` (0..v-1 interleaved; 0 and 1 for
// DualPipeV's V). kBackward computes input and weight gradients; zero-bubble
// schedules split it into kInputGrad (B) and a later kWeightGrad (W).
enum class PipelinePass { kForward, kBackward, kInputGrad, kWeightGrad };
struct PipelineSlot {
  PipelinePass pass;
  int64_t chunk, mb;
};
// The order stage `stage` of `pp` runs its passes in, for `micro_batches`
// micro-batches (`virtual_stages` model chunks per stage when interleaved).
// `extra_warmup`: forwards the 1F1B and interleaved schedules run before their
// first backward beyond their own warm-up (Megatron-Core adds one when the
// merged-1F1B EP overlap is on, pipeline_parallel/schedules.py), so that every
// steady-state forward is followed by the backward it is merged with.
std::vector<PipelineSlot> pipeline_order(PpSchedule s, int64_t pp, int64_t virtual_stages, int64_t micro_batches,
                                         int64_t stage, int64_t extra_warmup = 0);
// The model chunk (0 .. chunks-1, in layer order) that stage `stage`'s chunk
// `chunk` holds: c*pp + stage, or for DualPipeV's V stage / 2pp-1-stage.
int64_t pipeline_model_chunk(PpSchedule s, int64_t pp, int64_t stage, int64_t chunk);

}  // namespace rackstep::sim
