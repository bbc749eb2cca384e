// fp32 / bf16 element loads and stores shared by the CUDA kernels: values are
// computed in fp32 whatever the storage type.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>

namespace rackstep::exec::cuda {

__device__ __forceinline__ float load(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store(__nv_bfloat16* p, size_t i, float v) { p[i] = __float2bfloat16(v); }

// Blocks for a grid-stride loop over n elements: enough to cover n, capped so
// very large tensors loop instead of exceeding the grid.
inline int grid_blocks(size_t n, int threads) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65535 * 8 ? b : 65535 * 8);
}

#define RS_GRID_STRIDE(i, n) \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

}  // namespace rackstep::exec::cuda
