// What follows attention in a Marin block: XSA (exclusive self attention) and
// the per-head gate's elementwise part; plus the short causal convolution.
// One warp per (token, head) row for the dot products.
#include "exec/cuda/check.h"
#include "exec/cuda/detail.h"
#include "exec/cuda/element_access.cuh"
#include "exec/cuda/element_math.h"
#include "exec/cuda/ops.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float warp_dot(const float* a, const float* b, int n, int lane) {
  float acc = 0.0f;
  for (int i = lane; i < n; i += 32) acc += a[i] * b[i];
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}

__global__ void xsa_forward_kernel(float* y, const float* o, const float* v, int N, int H, int kv_stored, int group,
                                   int hd, float eps) {
  const size_t row = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // (n, h)
  const int lane = threadIdx.x % 32;
  if (row >= size_t(N) * H) return;
  const size_t n = row / H;
  const int h = static_cast<int>(row % H);
  const float* oh = o + row * hd;
  const float* vg = v + (n * kv_stored + h / group) * hd;
  const float c = warp_dot(oh, vg, hd, lane) / (warp_dot(vg, vg, hd, lane) + eps);
  for (int i = lane; i < hd; i += 32) y[row * hd + i] = oh[i] - c * vg[i];
}

// One warp per (n, kv head g): d_o for the group's heads, dv summed over them in head order.
__global__ void xsa_backward_kernel(float* d_o, float* dv, const float* dy, const float* o, const float* v, int N,
                                    int H, int kv_stored, int kv_used, int hd, float eps) {
  const size_t row = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // (n, g)
  const int lane = threadIdx.x % 32;
  if (row >= size_t(N) * kv_used) return;
  const size_t n = row / kv_used;
  const int g = static_cast<int>(row % kv_used), group = H / kv_used;
  const float* vg = v + (n * kv_stored + g) * hd;
  float* dvg = dv + (n * kv_stored + g) * hd;
  const float nv = warp_dot(vg, vg, hd, lane) + eps;
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const float* oh = o + (n * H + h) * hd;
    const float* dyh = dy + (n * H + h) * hd;
    const float c = warp_dot(oh, vg, hd, lane) / nv;
    const float dyv = warp_dot(dyh, vg, hd, lane);
    for (int i = lane; i < hd; i += 32) {
      dvg[i] += -c * dyh[i] - dyv * (oh[i] - 2.0f * c * vg[i]) / nv;
      d_o[(n * H + h) * hd + i] = dyh[i] - dyv / nv * vg[i];
    }
  }
}

__global__ void gate_apply_kernel(float* y, float* g, const float* o, int N, int H, int hd) {
  const size_t row = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= size_t(N) * H) return;
  const float gh = 2.0f * sigmoid(g[row]);
  __syncwarp();
  if (lane == 0) g[row] = gh;
  for (int i = lane; i < hd; i += 32) y[row * hd + i] = gh * o[row * hd + i];
}

__global__ void gate_grad_kernel(float* d_o, float* dz, const float* dy, const float* o, const float* g, int N, int H,
                                 int hd) {
  const size_t row = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= size_t(N) * H) return;
  const float gh = g[row];
  const float dg = warp_dot(dy + row * hd, o + row * hd, hd, lane);
  for (int i = lane; i < hd; i += 32) d_o[row * hd + i] = gh * dy[row * hd + i];
  if (lane == 0) dz[row] = dg * gh * (1.0f - 0.5f * gh);
}

__device__ __forceinline__ bool tap_live(const int32_t* doc_row, int t, int src) {
  return src >= 0 && (!doc_row || doc_row[src] == doc_row[t]);
}

// Element i of a (B, T, C) tensor as (b, t, c), and its sequence's document row.
struct ConvPos {
  int b, t, c;
  const int32_t* doc_row;
  __device__ ConvPos(size_t i, const int32_t* doc, int T, int C)
      : b(static_cast<int>(i / C / T)), t(static_cast<int>(i / C % T)), c(static_cast<int>(i % C)),
        doc_row(doc ? doc + size_t(b) * T : nullptr) {}
};

__global__ void sconv_forward_kernel(float* y, const float* x, const float* w, const int32_t* doc, int B, int T, int C,
                                     int K) {
  RS_GRID_STRIDE(i, size_t(B) * T * C) {
    const auto [b, t, c, doc_row] = ConvPos(i, doc, T, C);
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
      const int src = t - (K - 1 - j);
      if (tap_live(doc_row, t, src)) acc += w[size_t(c) * K + j] * x[(size_t(b) * T + src) * C + c];
    }
    y[i] = acc;
  }
}

__global__ void sconv_dx_kernel(float* dx, const float* dy, const float* w, const int32_t* doc, int B, int T, int C,
                                int K) {
  RS_GRID_STRIDE(i, size_t(B) * T * C) {
    const auto [b, t, c, doc_row] = ConvPos(i, doc, T, C);
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
      const int out = t + (K - 1 - j);
      if (out < T && tap_live(doc_row, out, t)) acc += w[size_t(c) * K + j] * dy[(size_t(b) * T + out) * C + c];
    }
    dx[i] = acc;
  }
}

__global__ void sconv_dw_kernel(float* dw, const float* dy, const float* x, const int32_t* doc, int B, int T, int C,
                                int K) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;  // (c, j), c fastest for coalesced reads
  if (idx >= C * K) return;
  const int c = idx % C, j = idx / C;
  double acc = 0.0;
  for (int b = 0; b < B; ++b) {
    const int32_t* doc_row = doc ? doc + size_t(b) * T : nullptr;
    for (int t = 0; t < T; ++t) {
      const int src = t - (K - 1 - j);
      if (tap_live(doc_row, t, src)) acc += double(dy[(size_t(b) * T + t) * C + c]) * x[(size_t(b) * T + src) * C + c];
    }
  }
  dw[size_t(c) * K + j] += static_cast<float>(acc);
}

int warp_blocks(size_t warps) { return static_cast<int>((warps * 32 + kThreads - 1) / kThreads); }

}  // namespace

void xsa_forward(float* y, const float* o, const float* v, int N, int H, int kv_stored, int kv_used, int hd, float eps,
                 cudaStream_t stream) {
  RS_CHECK(kv_used > 0 && kv_used <= kv_stored && H % kv_used == 0, "xsa: bad kv heads");
  if (N == 0) return;
  xsa_forward_kernel<<<warp_blocks(size_t(N) * H), kThreads, 0, stream>>>(y, o, v, N, H, kv_stored, H / kv_used, hd,
                                                                          eps);
  RS_CUDA_CHECK(cudaGetLastError());
}

void xsa_backward(float* d_o, float* dv, const float* dy, const float* o, const float* v, int N, int H, int kv_stored,
                  int kv_used, int hd, float eps, cudaStream_t stream) {
  RS_CHECK(kv_used > 0 && kv_used <= kv_stored && H % kv_used == 0, "xsa: bad kv heads");
  if (N == 0) return;
  xsa_backward_kernel<<<warp_blocks(size_t(N) * kv_used), kThreads, 0, stream>>>(d_o, dv, dy, o, v, N, H, kv_stored,
                                                                                 kv_used, hd, eps);
  RS_CUDA_CHECK(cudaGetLastError());
}

void sconv_forward(float* y, const float* x, const float* w, const int32_t* doc, int B, int T, int C, int K,
                   cudaStream_t stream) {
  RS_CHECK(K >= 1, "sconv: kernel size must be >= 1");
  const size_t n = size_t(B) * T * C;
  if (n == 0) return;
  sconv_forward_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(y, x, w, doc, B, T, C, K);
  RS_CUDA_CHECK(cudaGetLastError());
}

void sconv_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const int32_t* doc, int B,
                    int T, int C, int K, cudaStream_t stream) {
  RS_CHECK(K >= 1, "sconv: kernel size must be >= 1");
  const size_t n = size_t(B) * T * C;
  if (n == 0) return;
  sconv_dx_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(dx, dy, w, doc, B, T, C, K);
  RS_CUDA_CHECK(cudaGetLastError());
  sconv_dw_kernel<<<(C * K + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dw, dy, x, doc, B, T, C, K);
  RS_CUDA_CHECK(cudaGetLastError());
}

namespace detail {

void attn_gate_apply(float* y, float* g, const float* o, int N, int H, int hd, cudaStream_t stream) {
  if (N == 0) return;
  gate_apply_kernel<<<warp_blocks(size_t(N) * H), kThreads, 0, stream>>>(y, g, o, N, H, hd);
  RS_CUDA_CHECK(cudaGetLastError());
}

void attn_gate_grad(float* d_o, float* dz, const float* dy, const float* o, const float* g, int N, int H, int hd,
                    cudaStream_t stream) {
  if (N == 0) return;
  gate_grad_kernel<<<warp_blocks(size_t(N) * H), kThreads, 0, stream>>>(d_o, dz, dy, o, g, N, H, hd);
  RS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace rackstep::exec::cuda
