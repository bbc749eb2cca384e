// The cuDNN attention's way back from bf16 (exec/cuda/cudnn_attention.h): its
// bf16 outputs into the backend's fp32 buffers, assigned or added.
#include <cuda_bf16.h>

#include "exec/cuda/check.h"
#include "exec/cuda/cudnn_attention.h"
#include "exec/cuda/element_access.cuh"

namespace rackstep::exec::cuda {
namespace {

__global__ void bf16_to_float_kernel(float* y, const __nv_bfloat16* x, size_t n, bool accumulate) {
  RS_GRID_STRIDE(i, n) {
    const float v = __bfloat162float(x[i]);
    y[i] = accumulate ? y[i] + v : v;
  }
}

}  // namespace

void bf16_to_float(float* y, const __nv_bfloat16* x, size_t n, bool accumulate, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_float_kernel<<<grid_blocks(n, 256), 256, 0, stream>>>(y, x, n, accumulate);
  RS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace rackstep::exec::cuda
