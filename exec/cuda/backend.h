// The CUDA backend: the op set of exec/backend.h on the kernels of exec/cuda/
// (cuBLASLt GEMMs, the kernels of ops.h, moe.h, layers.h), in device memory,
// every op on one stream. This is the fp32 parity mode: fp32 storage and
// compute, cuBLASLt with CUBLAS_COMPUTE_32F (no TF32), the same formulas as
// the CPU kernels (exec/cuda/element_math.h), so a step agrees with the CPU
// backend to rounding (tests/exec_parity.cpp enumerates both where a device
// exists). The bf16 training mode (bf16 activations and GEMMs, fp32 master
// weights) is the next mode; the kernels are already templated on it.
//
// exec/cuda/backend.cpp holds one forward and one backward function per
// OpKind, mirroring exec/cpu/backend.cpp call for call. Scratch (kernel
// workspaces and the "=" -> "+=" staging of input gradients) is owned by the
// backend and grows on demand, stream-ordered.
//
//   register_cuda_backend();                          // once, before make_backend
//   std::unique_ptr<Backend> be = make_backend("cuda");  // UserError without a device
#pragma once

#include <memory>
#include <string>

#include "exec/backend.h"

namespace rackstep::exec::cuda {

// What the CUDA backend lacks to run `op` of model `m`, as the model file's
// setting that asks for it (json_path empty: it runs the op). The op set grows
// per backend (exec/cpu/ first): an op this backend cannot run (today: an op
// with more parameters than its case binds) is refused at its first forward with
// one UserError line (file, JSON path, expected, found), never run without them.
struct Unsupported {
  std::string json_path;  // the model file's setting ("/" where no one setting names it)
  std::string expected;   // what the CUDA backend runs
  std::string found;      // the model's setting
};
Unsupported unsupported(const models::Op& op, const models::ModelConfig& m);

// The CUDA backend on device 0, or nullptr where no CUDA device is present.
std::unique_ptr<Backend> make_cuda_backend();
// Registers "cuda" in exec/backend.h's registry (idempotent).
void register_cuda_backend();

}  // namespace rackstep::exec::cuda
