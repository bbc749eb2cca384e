// The CUDA side of `rackstep calibrate` (exec/microbench.h): an OpBackend whose
// GEMMs are the backend's cuBLASLt path (fp32, no TF32), whose stream rate is
// the residual add on the device, and whose model profile is the one model
// driver on the CUDA backend (exec/cuda/backend.h) with its per-op timer (the
// driver synchronises the device around each op, so an op's time is its
// kernels' wall time). GPU times are not de-loaded: cpu_share = 1.
//
//   std::unique_ptr<OpBackend> b = cuda::make_cuda_op_backend();   // nullptr without a device
//   nlohmann::json m = run_microbenchmarks(*b, make_plan({"models/zoo/tiny-moe.json"}, 60), progress);
#pragma once

#include <memory>

#include "exec/microbench.h"

namespace rackstep::exec::cuda {

std::unique_ptr<OpBackend> make_cuda_op_backend();

}  // namespace rackstep::exec::cuda
