// Memory-bound kernels of the CUDA backend (exec/cuda/ops.h): one thread per
// element (grid-stride) for SwiGLU, GeLU, ReLU², residual, RoPE, the gated norm's
// elementwise parts and the MLA column plumbing; one block per row for RMSNorm
// and LayerNorm forward/backward with a warp-shuffle + shared-memory reduction.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "exec/cuda/bf16_math.h"
#include "exec/cuda/check.h"
#include "exec/cuda/memory.h"
#include "exec/cuda/detail.h"
#include "exec/cuda/element_access.cuh"
#include "exec/cuda/element_math.h"
#include "exec/cuda/ops.h"

namespace rackstep::exec::cuda {
namespace {

constexpr int kThreads = 256;


int blocks_for(size_t n) { return grid_blocks(n, kThreads); }

// Launches an elementwise kernel over n elements on the stream (nothing for n = 0) and
// checks the launch.
template <typename... Params, typename... Args>
void launch_elementwise(void (*kernel)(Params...), size_t n, cudaStream_t stream, Args... args) {
  if (n == 0) return;
  kernel<<<blocks_for(n), kThreads, 0, stream>>>(args...);
  RS_CUDA_CHECK(cudaGetLastError());
}

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
__global__ void gelu_forward_kernel(T* h, const T* a, size_t n) {
  RS_GRID_STRIDE(i, n)
    store(h, i, gelu(load(a, i)));
}

template <typename T>
__global__ void gelu_backward_kernel(T* da, const T* dh, const T* a, size_t n) {
  RS_GRID_STRIDE(i, n)
    store(da, i, gelu_grad(load(dh, i), load(a, i)));
}

template <typename T>
__global__ void relu2_forward_kernel(T* h, const T* a, size_t n) {
  RS_GRID_STRIDE(i, n)
    store(h, i, relu2(load(a, i)));
}

template <typename T>
__global__ void relu2_backward_kernel(T* da, const T* dh, const T* a, size_t n) {
  RS_GRID_STRIDE(i, n)
    store(da, i, relu2_grad(load(dh, i), load(a, i)));
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
                            float theta, float sign, double yarn_factor, double yarn_low, double yarn_high) {
  const bool yarn = yarn_factor > 1.0;  // factor 1: YaRN's frequencies are the plain ones
  const double scale = yarn_scale(yarn_factor);
  const int half = rot_dims / 2;
  const size_t pairs = size_t(N) * heads * half;
  RS_GRID_STRIDE(p, pairs) {
    const int i = static_cast<int>(p % half);
    const size_t row = p / half;                     // (token, head)
    const int token = static_cast<int>(row / heads);
    const size_t base = row * hd;
    float y1, y2;
    const double angle = yarn ? rope_angle_yarn(pos[token], i, rot_dims, theta, yarn_factor, yarn_low, yarn_high)
                              : rope_angle(pos[token], i, rot_dims, theta);
    rope_rotate(load(x, base + i), load(x, base + i + half), angle, sign, &y1, &y2, scale);
    store(y, base + i, y1);
    store(y, base + i + half, y2);
  }
}

template <typename T>
__global__ void layernorm_forward_kernel(T* y, float* rstd, const T* x, const float* gain, float eps, int d) {
  const size_t row = blockIdx.x;
  const T* xr = x + row * d;
  double sum = 0.0;
  for (int i = threadIdx.x; i < d; i += kThreads) sum += load(xr, i);
  const double mean = block_sum(sum) / d;
  double ss = 0.0;
  for (int i = threadIdx.x; i < d; i += kThreads) ss += (load(xr, i) - mean) * (load(xr, i) - mean);
  const float r = rms_rstd(block_sum(ss), d, eps);
  if (threadIdx.x == 0) rstd[row] = r;
  const auto m = static_cast<float>(mean);
  T* yr = y + row * d;
  for (int i = threadIdx.x; i < d; i += kThreads) store(yr, i, layernorm_y(load(xr, i) - m, r, gain[i]));
}

template <typename T>
__global__ void row_mean_kernel(float* mean, const T* x, int d) {
  const size_t row = blockIdx.x;
  double sum = 0.0;
  for (int i = threadIdx.x; i < d; i += kThreads) sum += load(x + row * d, i);
  sum = block_sum(sum);
  if (threadIdx.x == 0) mean[row] = static_cast<float>(sum / d);
}

template <typename T>
__global__ void layernorm_dgain_kernel(float* dgain, const T* dy, const T* x, const float* mean, const float* rstd,
                                       int rows, int d) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= d) return;
  double acc = 0.0;
  for (int n = 0; n < rows; ++n)
    acc += double(load(dy, size_t(n) * d + i)) * (load(x, size_t(n) * d + i) - mean[n]) * rstd[n];
  dgain[i] += static_cast<float>(acc);
}

template <typename T>
__global__ void layernorm_backward_kernel(T* dx, const T* dy, const T* x, const float* mean, const float* rstd,
                                          const float* gain, int d) {
  const size_t row = blockIdx.x;
  const T* xr = x + row * d;
  const T* dyr = dy + row * d;
  const float m = mean[row], r = rstd[row];
  double s1 = 0.0, s2 = 0.0;
  for (int i = threadIdx.x; i < d; i += kThreads) {
    const double g = double(load(dyr, i)) * gain[i];
    s1 += g;
    s2 += g * (load(xr, i) - m) * r;
  }
  const auto a = static_cast<float>(block_sum(s1) / d);
  const auto b = static_cast<float>(block_sum(s2) / d);
  T* dxr = dx + row * d;
  for (int i = threadIdx.x; i < d; i += kThreads)
    store(dxr, i, layernorm_dx(load(dyr, i), gain[i], load(xr, i) - m, r, a, b));
}

__global__ void copy_columns_kernel(float* y, int64_t wy, const float* x, int64_t wx, int64_t rows,
                                    bool accumulate) {
  const int64_t n = accumulate ? (wx < wy ? wx : wy) : wy;  // columns written per row
  RS_GRID_STRIDE(i, size_t(rows) * n) {
    const int64_t r = i / n, j = i % n;
    float* yj = y + r * wy + j;
    if (accumulate) {
      *yj += x[r * wx + j];
      continue;
    }
    *yj = j < wx ? x[r * wx + j] : 0.0f;
  }
}

__global__ void assemble_key_kernel(float* k, const float* k_nope, const float* k_rope, int64_t N, int64_t H,
                                    int64_t hd, int64_t r) {
  const int64_t w = hd + r;
  RS_GRID_STRIDE(i, size_t(N) * H * w) {
    const int64_t row = i / w, j = i % w, n = row / H;  // row = (n, h)
    k[i] = j < hd ? k_nope[row * hd + j] : k_rope[n * r + (j - hd)];
  }
}

__global__ void split_key_nope_kernel(float* dk_nope, bool acc, const float* dk, int64_t N, int64_t H, int64_t hd,
                                      int64_t r) {
  RS_GRID_STRIDE(i, size_t(N) * H * hd) {
    const int64_t row = i / hd, j = i % hd;
    const float g = dk[row * (hd + r) + j];
    dk_nope[i] = acc ? dk_nope[i] + g : g;
  }
}

__global__ void split_key_rope_kernel(float* dk_rope, bool acc, const float* dk, int64_t N, int64_t H, int64_t hd,
                                      int64_t r) {
  RS_GRID_STRIDE(i, size_t(N) * r) {
    const int64_t n = i / r, j = i % r;
    float sum = acc ? dk_rope[i] : 0.0f;
    for (int64_t h = 0; h < H; ++h) sum += dk[(n * H + h) * (hd + r) + hd + j];  // heads in order, as the CPU
    dk_rope[i] = sum;
  }
}

__global__ void add_inplace_kernel(float* dst, const float* src, size_t n) {
  RS_GRID_STRIDE(i, n) { dst[i] += src[i]; }
}

__global__ void count_nonfinite_kernel(unsigned int* count, const float* x, size_t n) {
  RS_GRID_STRIDE(i, n) {
    if (!isfinite(x[i])) atomicAdd(count, 1u);
  }
}

__global__ void silu_kernel(float* s, const float* a, size_t n) {
  RS_GRID_STRIDE(i, n) { s[i] = silu(a[i]); }
}

__global__ void gate_sigmoid_mul_kernel(float* y, float* g, const float* x, size_t n) {
  RS_GRID_STRIDE(i, n) {
    g[i] = sigmoid(g[i]);
    y[i] = x[i] * g[i];
  }
}

__global__ void gated_norm_grad_kernel(float* db, float* dx, const float* dy, const float* x, const float* g,
                                       size_t n) {
  RS_GRID_STRIDE(i, n) { gated_norm_grad(dy[i], x[i], g[i], &db[i], &dx[i]); }
}

__global__ void mul_silu_grad_kernel(float* ds, const float* a, size_t n) {
  RS_GRID_STRIDE(i, n) { ds[i] *= silu_grad(a[i]); }
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

// The bf16 mode's cast: the bits exec/cuda/bf16_math.h computes (tested on the CPU).
__global__ void to_bf16_kernel(uint16_t* y, const float* x, size_t n) {
  RS_GRID_STRIDE(i, n) { y[i] = bf16_bits(x[i]); }
}

}  // namespace

template <typename T>
void swiglu_forward(T* h, const T* a1, const T* a3, size_t n, cudaStream_t stream) {
  launch_elementwise(swiglu_forward_kernel<T>, n, stream, h, a1, a3, n);
}

template <typename T>
void swiglu_backward(T* da1, T* da3, const T* dh, const T* a1, const T* a3, size_t n, cudaStream_t stream) {
  launch_elementwise(swiglu_backward_kernel<T>, n, stream, da1, da3, dh, a1, a3, n);
}

template <typename T>
void gelu_forward(T* h, const T* a, size_t n, cudaStream_t stream) {
  launch_elementwise(gelu_forward_kernel<T>, n, stream, h, a, n);
}

template <typename T>
void gelu_backward(T* da, const T* dh, const T* a, size_t n, cudaStream_t stream) {
  launch_elementwise(gelu_backward_kernel<T>, n, stream, da, dh, a, n);
}

template <typename T>
void relu2_forward(T* h, const T* a, size_t n, cudaStream_t stream) {
  launch_elementwise(relu2_forward_kernel<T>, n, stream, h, a, n);
}

template <typename T>
void relu2_backward(T* da, const T* dh, const T* a, size_t n, cudaStream_t stream) {
  launch_elementwise(relu2_backward_kernel<T>, n, stream, da, dh, a, n);
}

template <typename T>
void residual_forward(T* y, const T* a, const T* b, size_t n, cudaStream_t stream) {
  launch_elementwise(residual_forward_kernel<T>, n, stream, y, a, b, n);
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
                cudaStream_t stream, const RopeYarn* yarn) {
  const size_t pairs = size_t(N) * heads * (rot_dims / 2);
  double factor = 1.0, low = 0.0, high = 0.0;  // the ramp's ends, once per launch on the host
  if (yarn) {
    factor = yarn->factor;
    yarn_ramp_ends(rot_dims, theta, yarn->original_positions, yarn->beta_fast, yarn->beta_slow, yarn->truncate, &low,
                   &high);
  }
  if (pairs > 0) {
    rope_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(y, x, pos, N, heads, hd, rot_dims, theta, sign, factor,
                                                            low, high);
    RS_CUDA_CHECK(cudaGetLastError());
  }
  const size_t tail = size_t(N) * heads * (hd - rot_dims);
  if (y != x && tail > 0) {
    copy_tail_kernel<<<blocks_for(tail), kThreads, 0, stream>>>(y, x, size_t(N) * heads, hd, rot_dims);
    RS_CUDA_CHECK(cudaGetLastError());
  }
}

template <typename T>
void layernorm_forward(T* y, float* rstd, const T* x, const float* gain, float eps, int rows, int d,
                       cudaStream_t stream) {
  if (rows == 0) return;
  layernorm_forward_kernel<<<rows, kThreads, 0, stream>>>(y, rstd, x, gain, eps, d);
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void layernorm_backward(T* dx, float* dgain, const T* dy, const T* x, const float* rstd, const float* gain,
                        float* row_mean, int rows, int d, cudaStream_t stream) {
  if (rows == 0) return;
  row_mean_kernel<<<rows, kThreads, 0, stream>>>(row_mean, x, d);
  RS_CUDA_CHECK(cudaGetLastError());
  // dgain first, so that dx may alias dy (as on the CPU).
  layernorm_dgain_kernel<<<(d + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dgain, dy, x, row_mean, rstd, rows,
                                                                                 d);
  RS_CUDA_CHECK(cudaGetLastError());
  layernorm_backward_kernel<<<rows, kThreads, 0, stream>>>(dx, dy, x, row_mean, rstd, gain, d);
  RS_CUDA_CHECK(cudaGetLastError());
}

void copy_columns(float* y, int64_t wy, const float* x, int64_t wx, int64_t rows, bool accumulate,
                  cudaStream_t stream) {
  const size_t n = size_t(rows) * size_t(accumulate ? std::min(wx, wy) : wy);
  launch_elementwise(copy_columns_kernel, n, stream, y, wy, x, wx, rows, accumulate);
}

void assemble_key(float* k, const float* k_nope, const float* k_rope, int64_t N, int64_t H, int64_t hd, int64_t r,
                  cudaStream_t stream) {
  const size_t n = size_t(N) * H * (hd + r);
  launch_elementwise(assemble_key_kernel, n, stream, k, k_nope, k_rope, N, H, hd, r);
}

void split_key_grad(float* dk_nope, bool acc_nope, float* dk_rope, bool acc_rope, const float* dk, int64_t N,
                    int64_t H, int64_t hd, int64_t r, cudaStream_t stream) {
  if (N == 0) return;
  split_key_nope_kernel<<<blocks_for(size_t(N) * H * hd), kThreads, 0, stream>>>(dk_nope, acc_nope, dk, N, H, hd, r);
  RS_CUDA_CHECK(cudaGetLastError());
  split_key_rope_kernel<<<blocks_for(size_t(N) * r), kThreads, 0, stream>>>(dk_rope, acc_rope, dk, N, H, hd, r);
  RS_CUDA_CHECK(cudaGetLastError());
}

void add_inplace(float* dst, const float* src, size_t n, cudaStream_t stream) {
  launch_elementwise(add_inplace_kernel, n, stream, dst, src, n);
}

bool all_finite(const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return true;
  unsigned int* count = nullptr;
  device_malloc_async(&count, sizeof(unsigned int), stream);
  RS_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned int), stream));
  count_nonfinite_kernel<<<blocks_for(n), kThreads, 0, stream>>>(count, x, n);
  RS_CUDA_CHECK(cudaGetLastError());
  unsigned int host = 0;
  RS_CUDA_CHECK(cudaMemcpyAsync(&host, count, sizeof(host), cudaMemcpyDeviceToHost, stream));
  device_free_async(count, stream);
  RS_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host == 0;
}

void to_bf16(__nv_bfloat16* y, const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_blocks(n, 256), 256, 0, stream>>>(reinterpret_cast<uint16_t*>(y), x, n);
  RS_CUDA_CHECK(cudaGetLastError());
}

namespace detail {

void silu(float* s, const float* a, size_t n, cudaStream_t stream) {
  launch_elementwise(silu_kernel, n, stream, s, a, n);
}

void gate_sigmoid_mul(float* y, float* g, const float* x, size_t n, cudaStream_t stream) {
  launch_elementwise(gate_sigmoid_mul_kernel, n, stream, y, g, x, n);
}

void gated_norm_grad(float* db, float* dx, const float* dy, const float* x, const float* g, size_t n,
                     cudaStream_t stream) {
  launch_elementwise(gated_norm_grad_kernel, n, stream, db, dx, dy, x, g, n);
}

void mul_silu_grad(float* ds, const float* a, size_t n, cudaStream_t stream) {
  launch_elementwise(mul_silu_grad_kernel, n, stream, ds, a, n);
}

}  // namespace detail

#define RS_INSTANTIATE(T)                                                                                        \
  template void swiglu_forward<T>(T*, const T*, const T*, size_t, cudaStream_t);                                \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, size_t, cudaStream_t);                 \
  template void residual_forward<T>(T*, const T*, const T*, size_t, cudaStream_t);                              \
  template void gelu_forward<T>(T*, const T*, size_t, cudaStream_t);                                           \
  template void gelu_backward<T>(T*, const T*, const T*, size_t, cudaStream_t);                                 \
  template void relu2_forward<T>(T*, const T*, size_t, cudaStream_t);                                          \
  template void relu2_backward<T>(T*, const T*, const T*, size_t, cudaStream_t);                                \
  template void rmsnorm_forward<T>(T*, float*, const T*, const float*, float, float, int, int, cudaStream_t);   \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const float*, const float*, float, int, int, \
                                    cudaStream_t);                                                              \
  template void rope_apply<T>(T*, const T*, const int32_t*, int, int, int, int, float, float, cudaStream_t,     \
                              const RopeYarn*);                                                              \
  template void layernorm_forward<T>(T*, float*, const T*, const float*, float, int, int, cudaStream_t);       \
  template void layernorm_backward<T>(T*, float*, const T*, const T*, const float*, const float*, float*, int, \
                                      int, cudaStream_t);
RS_INSTANTIATE(float)
RS_INSTANTIATE(__nv_bfloat16)
#undef RS_INSTANTIATE

}  // namespace rackstep::exec::cuda
