// Exact attention forward and backward, one warp per row (exec/cuda/ops.h).
// Each lane holds hd/32 elements of the row's vectors in registers; dot
// products are warp sums (xor shuffles, every lane gets the total); the
// forward keeps an online softmax (running max m, sum l; element_math.h,
// online_softmax_add) as flash attention does, so nothing of size T×T exists. The backward recomputes probabilities
// from the saved lse: dq per query row, dk/dv per key row, no atomics.
// Attention sinks (gpt-oss, exec/kernels.h AttentionExtras): a per-head logit
// in every row's denominator (the online softmax takes it last) and its
// gradient -Σ_rows exp(s_h - lse) delta.
// ALiBi: the per-head linear bias -slope_h (i - j) on every score (Dims::score,
// element_math.h alibi_score); the backward recomputes the same biased scores.
#include <cuda_bf16.h>

#include "exec/cuda/check.h"
#include "exec/cuda/element_access.cuh"
#include "exec/cuda/element_math.h"
#include "exec/cuda/ops.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxPerLane = 8;  // hd ≤ 256


__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The row's vector into registers: lane holds elements lane, lane + 32, ...
template <typename T>
__device__ __forceinline__ void load_row(float (&r)[kMaxPerLane], const T* base, int hd, int lane) {
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    r[e] = d < hd ? load(base, d) : 0.0f;
  }
}

template <typename T>
__device__ __forceinline__ float dot_row(const float (&r)[kMaxPerLane], const T* base, int hd, int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < hd) acc += r[e] * load(base, d);
  }
  return warp_sum(acc);
}

struct Dims {
  int B, T, H, kv_stored, kv_used, hd, window;
  float scale;
  const float* alibi_slopes;  // (H) ALiBi slopes, or nullptr
  // The logit of query i against key j in head h from their dot product qk.
  __device__ float score(float qk, int h, int i, int j) const {
    const float s = scale * qk;
    return alibi_slopes ? alibi_score(s, alibi_slopes[h], i, j) : s;
  }
  __device__ size_t q_index(int b, int t, int h) const { return ((size_t(b) * T + t) * H + h) * hd; }
  __device__ size_t kv_index(int b, int t, int g) const { return ((size_t(b) * T + t) * kv_stored + g) * hd; }
  __device__ size_t row_index(int b, int h, int t) const { return (size_t(b) * H + h) * T + t; }
  __device__ int doc_of(const int32_t* doc, int b, int t) const { return doc ? doc[size_t(b) * T + t] : 0; }
};

template <typename T>
__global__ void forward_kernel(T* o, float* lse, const T* q, const T* k, const T* v, const int32_t* doc,
                               const float* sinks, Dims dm) {
  const int lane = threadIdx.x % 32;
  const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;  // (b, h, t)
  if (row >= size_t(dm.B) * dm.H * dm.T) return;
  const int t = static_cast<int>(row % dm.T), h = static_cast<int>(row / dm.T % dm.H),
            b = static_cast<int>(row / dm.T / dm.H);
  const int g = kv_head_of(h, dm.H, dm.kv_used);
  float qr[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(qr, q + dm.q_index(b, t, h), dm.hd, lane);
  const int doc_t = dm.doc_of(doc, b, t);
  const int lo = dm.window > 0 ? max(0, t - dm.window + 1) : 0;
  float m = -INFINITY, l = 0.0f;
  for (int j = lo; j <= t; ++j) {
    if (!attention_visible(t, j, dm.window, doc_t, dm.doc_of(doc, b, j))) continue;
    float corr;
    const float p = online_softmax_add(dm.score(dot_row(qr, k + dm.kv_index(b, j, g), dm.hd, lane), h, t, j), &m, &l,
                                       &corr);
    const T* vj = v + dm.kv_index(b, j, g);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      acc[e] = acc[e] * corr + (d < dm.hd ? p * load(vj, d) : 0.0f);
    }
  }
  if (sinks) {  // the head's sink logit joins the denominator and has no value (gpt-oss)
    float corr;
    online_softmax_add(sinks[h], &m, &l, &corr);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) acc[e] *= corr;
  }
  T* orow = o + dm.q_index(b, t, h);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < dm.hd) store(orow, d, acc[e] / l);
  }
  if (lane == 0) lse[row] = m + logf(l);
}

// delta[b, h, t] = Σ_d dout · o (the softmax backward's row term).
template <typename T>
__global__ void delta_kernel(float* delta, const T* dout, const T* o, Dims dm) {
  const int lane = threadIdx.x % 32;
  const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= size_t(dm.B) * dm.H * dm.T) return;
  const int t = static_cast<int>(row % dm.T), h = static_cast<int>(row / dm.T % dm.H),
            b = static_cast<int>(row / dm.T / dm.H);
  float r[kMaxPerLane];
  load_row(r, dout + dm.q_index(b, t, h), dm.hd, lane);
  const float s = dot_row(r, o + dm.q_index(b, t, h), dm.hd, lane);
  if (lane == 0) delta[row] = s;
}

// dsinks[h] += -Σ_{b,t} exp(s_h - lse) delta: one thread per head walks its
// rows in order, in double (deterministic; B·T exponentials per head).
__global__ void sink_grad_kernel(float* dsinks, const float* sinks, const float* lse, const float* delta, Dims dm) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= dm.H) return;
  double sum = 0.0;
  for (int b = 0; b < dm.B; ++b) {
    for (int t = 0; t < dm.T; ++t) {
      const size_t r = dm.row_index(b, h, t);
      sum += sink_grad_term(sinks[h], lse[r], delta[r]);
    }
  }
  dsinks[h] += static_cast<float>(sum);
}

template <typename T>
__global__ void dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                          const float* delta, const int32_t* doc, Dims dm) {
  const int lane = threadIdx.x % 32;
  const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= size_t(dm.B) * dm.H * dm.T) return;
  const int t = static_cast<int>(row % dm.T), h = static_cast<int>(row / dm.T % dm.H),
            b = static_cast<int>(row / dm.T / dm.H);
  const int g = kv_head_of(h, dm.H, dm.kv_used);
  float qr[kMaxPerLane], dor[kMaxPerLane], acc[kMaxPerLane] = {};
  load_row(qr, q + dm.q_index(b, t, h), dm.hd, lane);
  load_row(dor, dout + dm.q_index(b, t, h), dm.hd, lane);
  const float lse_t = lse[row], delta_t = delta[row];
  const int doc_t = dm.doc_of(doc, b, t);
  const int lo = dm.window > 0 ? max(0, t - dm.window + 1) : 0;
  for (int j = lo; j <= t; ++j) {
    if (!attention_visible(t, j, dm.window, doc_t, dm.doc_of(doc, b, j))) continue;
    const T* kj = k + dm.kv_index(b, j, g);
    const float p = expf(dm.score(dot_row(qr, kj, dm.hd, lane), h, t, j) - lse_t);
    const float ds = p * (dot_row(dor, v + dm.kv_index(b, j, g), dm.hd, lane) - delta_t);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < dm.hd) acc[e] += dm.scale * ds * load(kj, d);
    }
  }
  T* out = dq + dm.q_index(b, t, h);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < dm.hd) store(out, d, acc[e]);
  }
}

// One warp per key row (b, j, g): sums over the query heads of group g and the
// queries that see key j.
template <typename T>
__global__ void dkv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                           const float* delta, const int32_t* doc, Dims dm, bool accumulate) {
  const int lane = threadIdx.x % 32;
  const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;  // (b, j, g)
  if (row >= size_t(dm.B) * dm.T * dm.kv_stored) return;
  const int g = static_cast<int>(row % dm.kv_stored), j = static_cast<int>(row / dm.kv_stored % dm.T),
            b = static_cast<int>(row / dm.kv_stored / dm.T);
  float dk_acc[kMaxPerLane] = {}, dv_acc[kMaxPerLane] = {};
  if (g < dm.kv_used) {
    float kr[kMaxPerLane], vr[kMaxPerLane];
    load_row(kr, k + dm.kv_index(b, j, g), dm.hd, lane);
    load_row(vr, v + dm.kv_index(b, j, g), dm.hd, lane);
    const int group = dm.H / dm.kv_used;
    const int doc_j = dm.doc_of(doc, b, j);
    const int hi = dm.window > 0 ? min(dm.T - 1, j + dm.window - 1) : dm.T - 1;
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int i = j; i <= hi; ++i) {
        if (!attention_visible(i, j, dm.window, dm.doc_of(doc, b, i), doc_j)) continue;
        const T* qi = q + dm.q_index(b, i, h);
        const T* doi = dout + dm.q_index(b, i, h);
        const size_t r = dm.row_index(b, h, i);
        const float p = expf(dm.score(dot_row(kr, qi, dm.hd, lane), h, i, j) - lse[r]);
        const float ds = p * (dot_row(vr, doi, dm.hd, lane) - delta[r]);
#pragma unroll
        for (int e = 0; e < kMaxPerLane; ++e) {
          const int d = lane + 32 * e;
          if (d < dm.hd) {
            dv_acc[e] += p * load(doi, d);
            dk_acc[e] += dm.scale * ds * load(qi, d);
          }
        }
      }
    }
  } else if (accumulate) {
    return;  // unread heads keep what they have
  }
  T* dk_row = dk + dm.kv_index(b, j, g);
  T* dv_row = dv + dm.kv_index(b, j, g);
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d >= dm.hd) continue;
    store(dk_row, d, dk_acc[e] + (accumulate ? load(dk_row, d) : 0.0f));
    store(dv_row, d, dv_acc[e] + (accumulate ? load(dv_row, d) : 0.0f));
  }
}

Dims make_dims(int B, int T, int H, int kv_stored, int kv_used, int hd, int window, float scale,
               const float* alibi_slopes) {
  RS_CHECK(hd > 0 && hd <= 32 * kMaxPerLane, "cuda attention: head dim must be in 1..256");
  RS_CHECK(kv_used > 0 && kv_used <= kv_stored && H % kv_used == 0, "cuda attention: GQA groups must be whole");
  return Dims{B, T, H, kv_stored, kv_used, hd, window, scale, alibi_slopes};
}

int blocks_for_rows(size_t rows) { return static_cast<int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

template <typename T>
void attention_forward(T* o, float* lse, const T* q, const T* k, const T* v, const int32_t* doc, int B, int T_,
                       int H, int kv_stored, int kv_used, int hd, int window, float scale, cudaStream_t stream,
                       const float* sinks, const float* alibi_slopes) {
  const Dims dm = make_dims(B, T_, H, kv_stored, kv_used, hd, window, scale, alibi_slopes);
  const size_t rows = size_t(B) * H * T_;
  if (rows == 0) return;
  forward_kernel<<<blocks_for_rows(rows), 32 * kWarpsPerBlock, 0, stream>>>(o, lse, q, k, v, doc, sinks, dm);
  RS_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* o,
                        const float* lse, const int32_t* doc, float* delta, int B, int T_, int H, int kv_stored,
                        int kv_used, int hd, int window, float scale, bool accumulate_dkv, cudaStream_t stream,
                        const float* sinks, float* dsinks, const float* alibi_slopes) {
  RS_CHECK(!sinks || dsinks, "cuda attention_backward: sinks need their gradient buffer");
  const Dims dm = make_dims(B, T_, H, kv_stored, kv_used, hd, window, scale, alibi_slopes);
  const size_t rows = size_t(B) * H * T_;
  if (rows == 0) return;
  const int threads = 32 * kWarpsPerBlock;
  delta_kernel<<<blocks_for_rows(rows), threads, 0, stream>>>(delta, dout, o, dm);
  RS_CUDA_CHECK(cudaGetLastError());
  if (sinks) {  // the probabilities (dq, dk, dv) already include the sink through the saved lse
    sink_grad_kernel<<<(H + threads - 1) / threads, threads, 0, stream>>>(dsinks, sinks, lse, delta, dm);
    RS_CUDA_CHECK(cudaGetLastError());
  }
  dq_kernel<<<blocks_for_rows(rows), threads, 0, stream>>>(dq, dout, q, k, v, lse, delta, doc, dm);
  RS_CUDA_CHECK(cudaGetLastError());
  const size_t kv_rows = size_t(B) * T_ * kv_stored;
  dkv_kernel<<<blocks_for_rows(kv_rows), threads, 0, stream>>>(dk, dv, dout, q, k, v, lse, delta, doc, dm,
                                                               accumulate_dkv);
  RS_CUDA_CHECK(cudaGetLastError());
}

#define RS_INSTANTIATE(T)                                                                                      \
  template void attention_forward<T>(T*, float*, const T*, const T*, const T*, const int32_t*, int, int, int, \
                                     int, int, int, int, float, cudaStream_t, const float*, const float*);   \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,            \
                                      const float*, const int32_t*, float*, int, int, int, int, int, int, int, \
                                      float, bool, cudaStream_t, const float*, float*, const float*);
RS_INSTANTIATE(float)
RS_INSTANTIATE(__nv_bfloat16)
#undef RS_INSTANTIATE

}  // namespace rackstep::exec::cuda
