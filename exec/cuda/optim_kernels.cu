// Element kernels of the GPU optimizer (exec/cuda/optim.h) and the small
// helpers its host orchestration (exec/cuda/optim.cpp) strings together.
#include "exec/cuda/check.h"
#include "exec/cuda/element_access.cuh"
#include "exec/cuda/element_math.h"
#include "exec/cuda/optim.h"
#include "exec/cuda/detail.h"

namespace rackstep::exec::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSumBlocks = 256;  // fixed: the partials' order, hence the sum, never changes

int blocks_for(size_t n) { return grid_blocks(n, kThreads); }


__global__ void adam_update_kernel(float* w, const float* g, float* m, float* v, size_t n, AdamScalars s) {
  RS_GRID_STRIDE(i, n) {
    adam_moments(g[i], s.b1, s.b2, &m[i], &v[i]);
    w[i] = adam_weight(w[i], m[i], v[i], s.lr, s.c1, s.c2, s.eps, s.decay);
  }
}

__global__ void adam_direction_kernel(float* u, const float* g, float* m, float* v, size_t n, AdamScalars s) {
  RS_GRID_STRIDE(i, n) {
    adam_moments(g[i], s.b1, s.b2, &m[i], &v[i]);
    u[i] = adam_direction(m[i], v[i], s.c1, s.c2, s.eps);
  }
}

__global__ void muon_momentum_kernel(float* u, const float* g, float* m, size_t n, float b1) {
  RS_GRID_STRIDE(i, n) { u[i] = muon_momentum(g[i], b1, &m[i]); }
}

__global__ void scale_kernel(float* x, size_t n, float s) {
  RS_GRID_STRIDE(i, n) { x[i] *= s; }
}

__global__ void axpy_kernel(float* y, const float* x, size_t n, float a) {
  RS_GRID_STRIDE(i, n) { y[i] += a * x[i]; }
}

__global__ void transpose_kernel(float* out, const float* in, int64_t rows, int64_t cols) {
  RS_GRID_STRIDE(idx, size_t(rows) * cols) {
    const int64_t i = int64_t(idx) / cols, j = int64_t(idx) % cols;
    out[j * rows + i] = in[idx];
  }
}

__global__ void sum_squares_partials(double* partial, const float* x, size_t n) {
  __shared__ double sums[kThreads];
  double acc = 0.0;
  RS_GRID_STRIDE(i, n) { acc += double(x[i]) * x[i]; }
  sums[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
}

__global__ void sum_partials(double* total, const double* partial) {
  double acc = 0.0;
  for (int b = 0; b < kSumBlocks; ++b) acc += partial[b];
  *total = acc;
}

}  // namespace

void adam_update(float* w, const float* g, float* m, float* v, size_t n, const AdamScalars& s, cudaStream_t stream) {
  if (n == 0) return;
  adam_update_kernel<<<blocks_for(n), kThreads, 0, stream>>>(w, g, m, v, n, s);
  RS_CUDA_CHECK(cudaGetLastError());
}

void adam_direction(float* u, const float* g, float* m, float* v, size_t n, const AdamScalars& s,
                    cudaStream_t stream) {
  if (n == 0) return;
  adam_direction_kernel<<<blocks_for(n), kThreads, 0, stream>>>(u, g, m, v, n, s);
  RS_CUDA_CHECK(cudaGetLastError());
}

void muon_momentum(float* u, const float* g, float* m, size_t n, float b1, cudaStream_t stream) {
  if (n == 0) return;
  muon_momentum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(u, g, m, n, b1);
  RS_CUDA_CHECK(cudaGetLastError());
}

size_t sum_squares_work_doubles() { return kSumBlocks + 1; }

void sum_squares_async(double* total, const float* x, size_t n, double* partials, cudaStream_t stream) {
  sum_squares_partials<<<kSumBlocks, kThreads, 0, stream>>>(partials, x, n);
  RS_CUDA_CHECK(cudaGetLastError());
  sum_partials<<<1, 1, 0, stream>>>(total, partials);
  RS_CUDA_CHECK(cudaGetLastError());
}

double sum_squares(const float* x, size_t n, double* work, cudaStream_t stream) {
  sum_squares_async(work + kSumBlocks, x, n, work, stream);
  double total = 0.0;
  RS_CUDA_CHECK(cudaMemcpyAsync(&total, work + kSumBlocks, sizeof(double), cudaMemcpyDeviceToHost, stream));
  RS_CUDA_CHECK(cudaStreamSynchronize(stream));
  return total;
}

namespace detail {

void scale(float* x, size_t n, float s, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, s);
  RS_CUDA_CHECK(cudaGetLastError());
}

void axpy(float* y, const float* x, size_t n, float a, cudaStream_t stream) {
  if (n == 0) return;
  axpy_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, n, a);
  RS_CUDA_CHECK(cudaGetLastError());
}

void transpose(float* out, const float* in, int64_t rows, int64_t cols, cudaStream_t stream) {
  const size_t n = size_t(rows) * cols;
  if (n == 0) return;
  transpose_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, in, rows, cols);
  RS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace rackstep::exec::cuda
