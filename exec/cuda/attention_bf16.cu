// The cuDNN attention's way back from bf16 (exec/cuda/cudnn_attention.h): its
// bf16 outputs into the backend's fp32 buffers, assigned or added; and its
// ragged Stats to and from the own kernel's lse layout.
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

// One thread per (token, head); i indexes (B·T, H).
__global__ void lse_layout_kernel(float* y, const float* x, int B, int T, int H, bool to_bht) {
  const size_t n = size_t(B) * size_t(T) * size_t(H);
  RS_GRID_STRIDE(i, n) {
    const size_t bht = lse_bht_of_thd(i, T, H);
    if (to_bht) {
      y[bht] = x[i];
    } else {
      y[i] = x[bht];
    }
  }
}

}  // namespace

void lse_layout(float* y, const float* x, int B, int T, int H, bool to_bht, cudaStream_t stream) {
  const size_t n = size_t(B) * size_t(T) * size_t(H);
  if (n == 0) return;
  lse_layout_kernel<<<grid_blocks(n, 256), 256, 0, stream>>>(y, x, B, T, H, to_bht);
  RS_CUDA_CHECK(cudaGetLastError());
}

void bf16_to_float(float* y, const __nv_bfloat16* x, size_t n, bool accumulate, cudaStream_t stream) {
  if (n == 0) return;
  bf16_to_float_kernel<<<grid_blocks(n, 256), 256, 0, stream>>>(y, x, n, accumulate);
  RS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace rackstep::exec::cuda
