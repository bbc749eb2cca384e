// The profiler's clock on the CUDA backend (exec/backend.h OpTiming): a pair of
// events per interval recorded on the backend's stream, nothing synchronised
// until end_step(), which records the step's last event, waits for it and
// reads every interval with cudaEventElapsedTime from the step's first event.
// Events come from a pool that grows to the largest step and is reused.
// begin_on / end_on record on another stream (the NCCL collectives'), timed
// from the same first event: the trace's collectives lane.
//
//   auto t = make_event_timing(stream);
//   t->begin_step(); t->begin(); ...kernels on stream...; t->end(); ...
//   StepTiming s = t->end_step();          // s.intervals[i].start_s from the step's first event
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "exec/backend.h"

namespace rackstep::exec::cuda {

std::unique_ptr<OpTiming> make_event_timing(cudaStream_t stream);

}  // namespace rackstep::exec::cuda
