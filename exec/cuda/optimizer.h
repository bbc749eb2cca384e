// The trainer's optimizer on the GPU (exec/backend.h, BackendOptimizer):
// parameters, gradients, momentum and second moment all in device memory, so
// a training step copies no arena between host and device (the host sees them
// at checkpoints: save_state / the driver's params()). exec::Optimizer's groups,
// schedule and order of operations (exec/optim.cpp), step by step with the
// kernels of exec/cuda/optim.h: Adam (+ decoupled decay); AdamH's direction,
// then the hyperball step; Muon's Nesterov momentum and Newton–Schulz through
// cuBLASLt, per expert matrix for (E, in, out) stacks, then the hyperball step
// (MuonH) or the shape-scaled step (Muon). fp32 states, fp32 results agree
// with the host's to the rounding of the GEMMs' summation order.
//
// Gradient norms: one deterministic Σ x² per tensor queued on the stream, one
// copy of the per-tensor sums to the host, summed per group in tensor order.
//
//   auto opt = cuda::make_device_optimizer(stream, config, params.layout_ptr());  // the backend's stream
//   opt->load_state(state);                       // moments and ||W0|| from the host (init or resume)
//   GroupNorms n = opt->grad_norms(grads_dev);
//   opt->step(params_dev, grads_dev, state.step++);
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "exec/arena.h"
#include "exec/backend.h"
#include "exec/optim.h"

namespace rackstep::exec::cuda {

// Every GEMM (its own fp32 cuBLASLt engine, whatever the backend's precision)
// and kernel on `stream` (the backend's, which outlives the optimizer).
std::unique_ptr<BackendOptimizer> make_device_optimizer(cudaStream_t stream, const OptimizerConfig& config,
                                                        std::shared_ptr<const ArenaLayout> layout);

}  // namespace rackstep::exec::cuda
