// The CUDA backend's op micro-benchmarks for `rackstep calibrate --backend
// cuda` (exec/microbench.h is the interface and the CPU one): GEMMs through
// cuBLASLt in bf16 with fp32 accumulation (the engine's mix) timed with CUDA
// events, and device-to-device copy bandwidth. Layer-graph op profiles need the
// CUDA model driver (exec/backend.h, issue 10): until it exists the backend
// says it cannot profile, and the fit uses the GEMMs and bandwidth only.
//
//   std::unique_ptr<OpBackend> b = cuda::make_cuda_op_backend();  // UserError without a GPU
//   nlohmann::json m = run_microbenchmarks(*b, make_plan(models, budget_s), progress);
#pragma once

#include <memory>

#include "exec/microbench.h"

namespace rackstep::exec::cuda {

std::unique_ptr<OpBackend> make_cuda_op_backend();

}  // namespace rackstep::exec::cuda
