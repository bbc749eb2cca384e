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

// "" when the CUDA backend runs `op`, else what it lacks. The op set grows
// per backend (exec/cpu/ first): an op whose parameters this backend does not
// know (a linear's bias, learned positions, attention sinks, a non-SwiGLU MLP)
// is refused with a UserError at its first forward, never run without them.
std::string unsupported(const models::Op& op);

// The CUDA backend on device 0, or nullptr where no CUDA device is present.
std::unique_ptr<Backend> make_cuda_backend();
// Registers "cuda" in exec/backend.h's registry (idempotent).
void register_cuda_backend();

}  // namespace rackstep::exec::cuda
