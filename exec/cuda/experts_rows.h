// The row gather of the GPU expert-parallel transport (exec/cuda/experts.h);
// its own header so the kernel's translation unit needs no host-side headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rackstep::exec::cuda {

// dst (rows, L) = src (·, L) row index[r], or zeros where index[r] < 0; index (rows) on the device.
void gather_rows(float* dst, const float* src, const int32_t* index, int64_t rows, int L, cudaStream_t stream);

}  // namespace rackstep::exec::cuda
