// Cross-entropy with z-loss (one block per token row), the embedding lookup and learned positions.
#include <cuda_bf16.h>

#include "exec/cuda/check.h"
#include "exec/cuda/memory.h"
#include "exec/cuda/element_access.cuh"
#include "exec/cuda/ops.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {
namespace {

constexpr int kThreads = 256;

// Reduction over the block in a fixed order (deterministic); every thread gets the result.
template <typename V, typename Op>
__device__ V block_reduce(V v, Op op) {
  __shared__ V partial[kThreads];
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] = op(partial[threadIdx.x], partial[threadIdx.x + stride]);
    __syncthreads();
  }
  const V total = partial[0];
  __syncthreads();
  return total;
}

template <typename T>
__global__ void ce_forward_kernel(float* lse, double* ce, double* z, const T* logits, const int32_t* targets, int V) {
  const size_t t = blockIdx.x;
  const T* row = logits + t * V;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < V; i += kThreads) mx = fmaxf(mx, load(row, i));
  mx = block_reduce(mx, [](float a, float b) { return fmaxf(a, b); });
  double sum = 0.0;
  for (int i = threadIdx.x; i < V; i += kThreads) sum += exp(double(load(row, i)) - mx);
  sum = block_reduce(sum, [](double a, double b) { return a + b; });
  if (threadIdx.x != 0) return;
  const double l = mx + log(sum);
  lse[t] = static_cast<float>(l);
  const int y = targets[t];
  ce[t] = y < 0 ? 0.0 : l - load(row, y);
  z[t] = y < 0 ? 0.0 : l * l;
}

// Row terms summed in row order by one thread, as the CPU does.
__global__ void ce_sum_kernel(double* out, const double* ce, const double* z, int N) {
  double a = 0.0, b = 0.0;
  for (int t = 0; t < N; ++t) {
    a += ce[t];
    b += z[t];
  }
  out[0] = a;
  out[1] = b;
}

template <typename T>
__global__ void ce_backward_kernel(T* dlogits, const T* logits, const float* lse, const int32_t* targets, int V,
                                   float z_weight, float inv) {
  const size_t t = blockIdx.x;
  const T* row = logits + t * V;
  T* drow = dlogits + t * V;
  const int y = targets[t];
  if (y < 0) {
    for (int i = threadIdx.x; i < V; i += kThreads) store(drow, i, 0.0f);
    return;
  }
  const float l = lse[t], zf = 1.0f + 2.0f * z_weight * l;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float g = expf(load(row, i) - l) * zf * inv;
    store(drow, i, i == y ? g - inv : g);
  }
}

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const float* table, int N, int d) {
  RS_GRID_STRIDE(i, size_t(N) * d) {
    const size_t t = i / d;
    store(out, i, table[size_t(tokens[t]) * d + i % d]);
  }
}

template <typename T>
__global__ void position_embedding_forward_kernel(T* out, const int32_t* pos, const float* table, int N, int d) {
  RS_GRID_STRIDE(i, size_t(N) * d) {
    const size_t t = i / d;
    store(out, i, load(out, i) + table[size_t(pos[t]) * d + i % d]);
  }
}

template <typename T>
__global__ void embedding_backward_kernel(float* dtable, const T* dout, const int32_t* tokens, int N, int d) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= d) return;
  for (int t = 0; t < N; ++t) dtable[size_t(tokens[t]) * d + c] += load(dout, size_t(t) * d + c);
}

}  // namespace

template <typename T>
CrossEntropySums cross_entropy_forward(float* lse, double* row_terms, const T* logits, const int32_t* targets, int N,
                                       int V, float z_weight, int64_t n_total, cudaStream_t stream) {
  RS_CHECK(n_total > 0, "cross_entropy: n_total must count at least one token");
  CrossEntropySums r;
  if (N == 0) return r;
  ce_forward_kernel<<<N, kThreads, 0, stream>>>(lse, row_terms, row_terms + N, logits, targets, V);
  RS_CUDA_CHECK(cudaGetLastError());
  double* sums = nullptr;  // two doubles after the row terms would need 2N+2; a small buffer instead
  device_malloc_async(&sums, 2 * sizeof(double), stream);
  ce_sum_kernel<<<1, 1, 0, stream>>>(sums, row_terms, row_terms + N, N);
  RS_CUDA_CHECK(cudaGetLastError());
  double host[2];
  RS_CUDA_CHECK(cudaMemcpyAsync(host, sums, sizeof(host), cudaMemcpyDeviceToHost, stream));
  device_free_async(sums, stream);
  RS_CUDA_CHECK(cudaStreamSynchronize(stream));
  r.ce = host[0] / static_cast<double>(n_total);
  r.z_loss = host[1] * static_cast<double>(z_weight) / static_cast<double>(n_total);
  return r;
}

template <typename T>
void cross_entropy_backward(T* dlogits, const T* logits, const float* lse, const int32_t* targets, int N, int V,
                            float z_weight, int64_t n_total, cudaStream_t stream) {
  if (N == 0) return;
  ce_backward_kernel<<<N, kThreads, 0, stream>>>(dlogits, logits, lse, targets, V, z_weight,
                                                 1.0f / static_cast<float>(n_total));
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const float* table, int N, int d, cudaStream_t stream) {
  const size_t n = size_t(N) * d;
  if (n == 0) return;
  embedding_forward_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(out, tokens, table, N, d);
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void position_embedding_forward(T* out, const int32_t* pos, const float* table, int N, int d, cudaStream_t stream) {
  const size_t n = size_t(N) * d;
  if (n == 0) return;
  position_embedding_forward_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(out, pos, table, N, d);
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void embedding_backward(float* dtable, const T* dout, const int32_t* tokens, int N, int d, cudaStream_t stream) {
  if (N == 0 || d == 0) return;
  embedding_backward_kernel<<<(d + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dtable, dout, tokens, N, d);
  RS_CUDA_CHECK(cudaGetLastError());
}

#define RS_INSTANTIATE(T)                                                                                          \
  template CrossEntropySums cross_entropy_forward<T>(float*, double*, const T*, const int32_t*, int, int, float,    \
                                                     int64_t, cudaStream_t);                                      \
  template void cross_entropy_backward<T>(T*, const T*, const float*, const int32_t*, int, int, float, int64_t,    \
                                          cudaStream_t);                                                          \
  template void embedding_forward<T>(T*, const int32_t*, const float*, int, int, cudaStream_t);                    \
  template void position_embedding_forward<T>(T*, const int32_t*, const float*, int, int, cudaStream_t);           \
  template void embedding_backward<T>(float*, const T*, const int32_t*, int, int, cudaStream_t);
RS_INSTANTIATE(float)
RS_INSTANTIATE(__nv_bfloat16)
#undef RS_INSTANTIATE

}  // namespace rackstep::exec::cuda
