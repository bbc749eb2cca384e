// Helpers shared by exec/cuda/optim_kernels.cu and exec/cuda/optim.cpp (not public).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace rackstep::exec::cuda::detail {

void scale(float* x, size_t n, float s, cudaStream_t stream);                          // x *= s
void axpy(float* y, const float* x, size_t n, float a, cudaStream_t stream);           // y += a x
void transpose(float* out, const float* in, int64_t rows, int64_t cols, cudaStream_t stream);  // (rows, cols) -> (cols, rows)

}  // namespace rackstep::exec::cuda::detail
