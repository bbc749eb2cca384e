// Memory-bound kernels of the CUDA backend (exec/cuda/ops.h): one thread per
// element (grid-stride) for SwiGLU, residual and RoPE; one block per row for
// RMSNorm forward/backward with a warp-shuffle + shared-memory reduction.
#include <cuda_bf16.h>

#include "exec/cuda/check.h"
#include "exec/cuda/element_access.cuh"
#include "exec/cuda/element_math.h"
#include "exec/cuda/ops.h"

namespace rackstep::exec::cuda {
namespace {

constexpr int kThreads = 256;


int blocks_for(size_t n) { return grid_blocks(n, kThreads); }

template <typename T>
__global__ void swiglu_forward_kernel(T* h, const T* a1, const T* a3, size_t n) {
  RS_GRID_STRIDE(i, n)
    store(h, i, swiglu(load(a1, i), load(a3, i)));
}

template <typename T>
__global__ void swiglu_backward_kernel(T* da1, T* da3, const T* dh, const T* a1, const T* a3, size_t n) {
  RS_GRID_STRIDE(i, n) {
    float g1, g3;
    swiglu_grad(load(dh, i), load(a1, i), load(a3, i), &g1, &g3);
    store(da1, i, g1);
    store(da3, i, g3);
  }
}

template <typename T>
__global__ void residual_forward_kernel(T* y, const T* a, const T* b, size_t n) {
  RS_GRID_STRIDE(i, n)
    store(y, i, load(a, i) + load(b, i));
}

// Sum of a double over the block; every thread gets the total.
__device__ double block_sum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];  // fixed order: deterministic
  __syncthreads();
  return total;
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T* y, float* rstd, const T* x, const float* gain, float multiplier,
                                       float eps, int d) {
  const size_t row = blockIdx.x;
  const T* xr = x + row * d;
  double ss = 0.0;
  for (int i = threadIdx.x; i < d; i += kThreads) {
    const float v = load(xr, i);
    ss += double(v) * v;
  }
  const float r = rms_rstd(block_sum(ss), d, eps);
  if (threadIdx.x == 0) rstd[row] = r;
  const float s = r * multiplier;
  T* yr = y + row * d;
  for (int i = threadIdx.x; i < d; i += kThreads) store(yr, i, load(xr, i) * s * (gain ? gain[i] : 1.0f));
}

template <typename T>
__global__ void rmsnorm_backward_kernel(T* dx, const T* dy, const T* x, const float* rstd, const float* gain,
                                        float multiplier, int d) {
  const size_t row = blockIdx.x;
  const T* xr = x + row * d;
  const T* dyr = dy + row * d;
  const float r = rstd[row];
  double dot = 0.0;
  for (int i = threadIdx.x; i < d; i += kThreads)
    dot += double(load(dyr, i)) * (gain ? gain[i] : 1.0f) * multiplier * load(xr, i);
  const float k = rms_backward_k(block_sum(dot), r, d);
  T* dxr = dx + row * d;
  for (int i = threadIdx.x; i < d; i += kThreads)
    store(dxr, i, r * (gain ? gain[i] : 1.0f) * multiplier * load(dyr, i) - load(xr, i) * k);
}

// dgain[i] += Σ_rows dy·x·rstd: one thread per column walks every row in
// order (coalesced across the warp), so the sum is the same on every run.
template <typename T>
__global__ void rmsnorm_dgain_kernel(float* dgain, const T* dy, const T* x, const float* rstd, int rows, int d) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= d) return;
  double acc = 0.0;
  for (int n = 0; n < rows; ++n) acc += double(load(dy, size_t(n) * d + i)) * load(x, size_t(n) * d + i) * rstd[n];
  dgain[i] += static_cast<float>(acc);
}

template <typename T>
__global__ void rope_kernel(T* y, const T* x, const int32_t* pos, int N, int heads, int hd, int rot_dims,
                            float theta, float sign) {
  const int half = rot_dims / 2;
  const size_t pairs = size_t(N) * heads * half;
  RS_GRID_STRIDE(p, pairs) {
    const int i = static_cast<int>(p % half);
    const size_t row = p / half;                     // (token, head)
    const int token = static_cast<int>(row / heads);
    const size_t base = row * hd;
    float y1, y2;
    rope_rotate(load(x, base + i), load(x, base + i + half), rope_angle(pos[token], i, rot_dims, theta), sign,
                &y1, &y2);
    store(y, base + i, y1);
    store(y, base + i + half, y2);
  }
}

template <typename T>
__global__ void copy_tail_kernel(T* y, const T* x, size_t rows, int hd, int from) {
  const int width = hd - from;
  const size_t n = rows * width;
  RS_GRID_STRIDE(j, n) {
    const size_t idx = (j / width) * hd + from + j % width;
    y[idx] = x[idx];
  }
}

}  // namespace

template <typename T>
void swiglu_forward(T* h, const T* a1, const T* a3, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(h, a1, a3, n);
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void swiglu_backward(T* da1, T* da3, const T* dh, const T* a1, const T* a3, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(da1, da3, dh, a1, a3, n);
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void residual_forward(T* y, const T* a, const T* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  residual_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, a, b, n);
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void rmsnorm_forward(T* y, float* rstd, const T* x, const float* gain, float multiplier, float eps, int rows, int d,
                     cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_forward_kernel<<<rows, kThreads, 0, stream>>>(y, rstd, x, gain, multiplier, eps, d);
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void rmsnorm_backward(T* dx, float* dgain, const T* dy, const T* x, const float* rstd, const float* gain,
                      float multiplier, int rows, int d, cudaStream_t stream) {
  if (rows == 0) return;
  // dgain first, so that dx may alias dy (as on the CPU).
  if (dgain) {
    rmsnorm_dgain_kernel<<<(d + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dgain, dy, x, rstd, rows, d);
    RS_CUDA_CHECK(cudaGetLastError());
  }
  rmsnorm_backward_kernel<<<rows, kThreads, 0, stream>>>(dx, dy, x, rstd, gain, multiplier, d);
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void rope_apply(T* y, const T* x, const int32_t* pos, int N, int heads, int hd, int rot_dims, float theta, float sign,
                cudaStream_t stream) {
  const size_t pairs = size_t(N) * heads * (rot_dims / 2);
  if (pairs > 0) {
    rope_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(y, x, pos, N, heads, hd, rot_dims, theta, sign);
    RS_CUDA_CHECK(cudaGetLastError());
  }
  const size_t tail = size_t(N) * heads * (hd - rot_dims);
  if (y != x && tail > 0) {
    copy_tail_kernel<<<blocks_for(tail), kThreads, 0, stream>>>(y, x, size_t(N) * heads, hd, rot_dims);
    RS_CUDA_CHECK(cudaGetLastError());
  }
}

#define RS_INSTANTIATE(T)                                                                                        \
  template void swiglu_forward<T>(T*, const T*, const T*, size_t, cudaStream_t);                                \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, size_t, cudaStream_t);                 \
  template void residual_forward<T>(T*, const T*, const T*, size_t, cudaStream_t);                              \
  template void rmsnorm_forward<T>(T*, float*, const T*, const float*, float, float, int, int, cudaStream_t);   \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const float*, const float*, float, int, int, \
                                    cudaStream_t);                                                              \
  template void rope_apply<T>(T*, const T*, const int32_t*, int, int, int, int, float, float, cudaStream_t);
RS_INSTANTIATE(float)
RS_INSTANTIATE(__nv_bfloat16)
#undef RS_INSTANTIATE

}  // namespace rackstep::exec::cuda
