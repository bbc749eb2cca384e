// The row gather of the GPU expert-parallel transport (exec/cuda/experts.h):
// every copy between the grouped rows, the send and receive buffers and the
// local experts' rows is one gather by a host-planned index.
#include <cstdint>

#include "exec/cuda/check.h"
#include "exec/cuda/element_access.cuh"
#include "exec/cuda/experts_rows.h"

namespace rackstep::exec::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void gather_rows_kernel(float* dst, const float* src, const int32_t* index, int64_t rows, int L) {
  RS_GRID_STRIDE(i, size_t(rows) * L) {
    const int32_t r = index[i / L];
    dst[i] = r >= 0 ? src[size_t(r) * L + i % L] : 0.0f;
  }
}

}  // namespace

void gather_rows(float* dst, const float* src, const int32_t* index, int64_t rows, int L, cudaStream_t stream) {
  const size_t n = size_t(rows) * size_t(L);
  if (n == 0) return;
  gather_rows_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(dst, src, index, rows, L);
  RS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace rackstep::exec::cuda
