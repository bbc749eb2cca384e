// Routed-expert kernels (exec/cuda/moe.h): one thread per token for the router,
// one per (expert) for the QB bias, element-parallel gathers, one warp per
// (token, choice) for the combine backward's dot products, CUB for grouping.
#include <cub/device/device_radix_sort.cuh>

#include <vector>

#include "exec/cuda/check.h"
#include "exec/cuda/detail.h"
#include "exec/cuda/element_access.cuh"
#include "exec/cuda/element_math.h"
#include "exec/cuda/moe.h"
#include "exec/cuda/ops.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per token (exec/cuda/element_math.h, router_token).
__global__ void router_forward_kernel(int32_t* expert, float* weight, float* threshold, const float* logits,
                                      const float* bias, int N, int E, int k, bool softmax, float weight_sum) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  router_token(logits + size_t(t) * E, bias, E, k, softmax, weight_sum, expert + size_t(t) * k,
               weight + size_t(t) * k, threshold + t);
}

__global__ void router_backward_kernel(float* dlogits, const float* dweight, const float* weight,
                                       const int32_t* expert, const float* logits, int N, int E, int k, bool softmax,
                                       float weight_sum) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  float* dl = dlogits + size_t(t) * E;
  for (int e = 0; e < E; ++e) dl[e] = 0.0f;
  const float* w = weight + size_t(t) * k;
  const float* dw = dweight + size_t(t) * k;
  double wdw = 0.0;
  for (int j = 0; j < k; ++j) wdw += double(w[j]) * dw[j];
  const float mean = static_cast<float>(wdw / weight_sum);
  if (softmax) {
    for (int j = 0; j < k; ++j) dl[expert[size_t(t) * k + j]] = w[j] * (dw[j] - mean);
    return;
  }
  double z = 0.0;
  for (int j = 0; j < k; ++j) z += sigmoid(logits[size_t(t) * E + expert[size_t(t) * k + j]]);
  for (int j = 0; j < k; ++j) {
    const int e = expert[size_t(t) * k + j];
    const float s = sigmoid(logits[size_t(t) * E + e]);
    const float du = static_cast<float>((weight_sum * (dw[j] - mean)) / z);
    dl[e] = du * s * (1.0f - s);
  }
}

__global__ void qb_histogram_kernel(unsigned long long* counts, const float* logits, int N, int E, int n_bins,
                                    float lo, double per_unit) {
  RS_GRID_STRIDE(i, size_t(N) * E) {
    const int e = static_cast<int>(i % E);
    atomicAdd(&counts[size_t(e) * n_bins + qb_bin(logits[i], lo, per_unit, n_bins)], 1ull);
  }
}

__global__ void qb_bias_kernel(float* bias, const int64_t* counts, int E, int k, int n_bins, float lo, double width) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < E) bias[e] = qb_bias(counts + size_t(e) * n_bins, n_bins, k, E, lo, width);
}

// Per token: lse of the logits (max in float, sum in double, as exec/cpu/moe.cpp), z = lse².
__global__ void router_z_rows_kernel(double* z, const float* logits, int N, int E) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const float* l = logits + size_t(t) * E;
  float mx = l[0];
  for (int e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
  double sum = 0.0;
  for (int e = 0; e < E; ++e) sum += exp(static_cast<double>(l[e]) - mx);
  const double lse = mx + log(sum);
  z[t] = lse * lse;
}

// Σ of n doubles by one thread in order (the CPU's serial sum); out[0].
__global__ void ordered_sum_kernel(double* out, const double* x, int n) {
  double acc = 0.0;
  for (int i = 0; i < n; ++i) acc += x[i];
  out[0] = acc;
}

__global__ void router_z_backward_kernel(float* dlogits, const float* logits, int N, int E, float weight) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const float* l = logits + size_t(t) * E;
  double mx = l[0];
  for (int e = 1; e < E; ++e) mx = fmax(mx, static_cast<double>(l[e]));
  double sum = 0.0;
  for (int e = 0; e < E; ++e) sum += exp(l[e] - mx);
  const double lse = mx + log(sum);
  const double c = static_cast<double>(weight) * 2.0 * lse / N;
  float* d = dlogits + size_t(t) * E;
  for (int e = 0; e < E; ++e) d[e] += static_cast<float>(c * exp(l[e] - mx) / sum);
}

// f (E): assignments per expert / (N k). Integer-valued double adds are exact in any order.
__global__ void assignment_counts_kernel(double* f, const int32_t* expert, int A) {
  RS_GRID_STRIDE(a, size_t(A)) { atomicAdd(&f[expert[a]], 1.0); }
}

__global__ void divide_doubles_kernel(double* x, int n, double divisor) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] /= divisor;
}

__global__ void fractions_from_counts_kernel(double* f, const int64_t* counts, int E, double divisor) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < E) f[e] = static_cast<double>(counts[e]) / divisor;
}

// One token's row of E logits: its max (softmax) and S = Σ_e affinity.
__device__ void router_affinity_row(const float* l, int E, bool softmax, double* mx_out, double* S_out) {
  double mx = l[0];
  for (int e = 1; e < E; ++e) mx = fmax(mx, static_cast<double>(l[e]));
  double S = 0.0;
  for (int e = 0; e < E; ++e) S += router_affinity(l[e], mx, softmax);
  *mx_out = mx;
  *S_out = S;
}

__global__ void router_affinity_rows_kernel(double* row_max, double* row_sum, const float* logits, int N, int E,
                                            bool softmax) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  router_affinity_row(logits + size_t(t) * E, E, softmax, &row_max[t], &row_sum[t]);
}

// P_e · N = Σ_t p_te, a thread per expert walking the tokens in order.
__global__ void expert_prob_sums_kernel(double* p_sum, const float* logits, const double* row_max,
                                        const double* row_sum, int N, int E, bool softmax) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  double acc = 0.0;
  for (int t = 0; t < N; ++t) acc += router_affinity(logits[size_t(t) * E + e], row_max[t], softmax) / row_sum[t];
  p_sum[e] = acc;
}

__global__ void aux_backward_kernel(float* dlogits, const float* logits, const double* f, int N, int E, bool softmax,
                                    double c) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const float* l = logits + size_t(t) * E;
  double mx = 0.0, S = 0.0;
  router_affinity_row(l, E, softmax, &mx, &S);
  double fp = 0.0;
  for (int e = 0; e < E; ++e) fp += f[e] * (router_affinity(l[e], mx, softmax) / S);
  float* d = dlogits + size_t(t) * E;
  for (int j = 0; j < E; ++j) d[j] += aux_loss_dlogit(router_affinity(l[j], mx, softmax), S, f[j], fp, c, softmax);
}

__global__ void iota_kernel(int32_t* x, int n) {
  RS_GRID_STRIDE(i, size_t(n)) { x[i] = static_cast<int32_t>(i); }
}

__global__ void count_kernel(int32_t* counts, const int32_t* expert, int A) {
  RS_GRID_STRIDE(a, size_t(A)) { atomicAdd(&counts[expert[a] + 1], 1); }
}

__global__ void prefix_kernel(int32_t* offsets, int E) {
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
}

__global__ void scatter_rank_kernel(int32_t* sorted_pos, const int32_t* order, int A) {
  RS_GRID_STRIDE(r, size_t(A)) { sorted_pos[order[r]] = static_cast<int32_t>(r); }
}

__global__ void gather_forward_kernel(float* xs, const float* x, const int32_t* sorted_pos, int N, int k, int L) {
  RS_GRID_STRIDE(i, size_t(N) * k * L) {
    const size_t a = i / L, c = i % L;
    xs[size_t(sorted_pos[a]) * L + c] = x[(a / k) * L + c];
  }
}

__global__ void gather_backward_kernel(float* dx, const float* dxs, const int32_t* sorted_pos, int N, int k, int L) {
  RS_GRID_STRIDE(i, size_t(N) * L) {
    const size_t t = i / L, c = i % L;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += dxs[size_t(sorted_pos[t * k + j]) * L + c];
    dx[i] = acc;
  }
}

__global__ void zero_dropped_kernel(float* dst, const float* src, const uint8_t* keep, int A, int L) {
  RS_GRID_STRIDE(i, size_t(A) * L) { dst[i] = keep[i / L] ? src[i] : 0.0f; }
}

__global__ void combine_forward_kernel(float* y, const float* ys, const float* weight, const int32_t* sorted_pos,
                                       int N, int k, int L) {
  RS_GRID_STRIDE(i, size_t(N) * L) {
    const size_t t = i / L, c = i % L;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += weight[t * k + j] * ys[size_t(sorted_pos[t * k + j]) * L + c];
    y[i] = acc;
  }
}

// One warp per (token, choice): dys row = w · dy, dweight = dy · ys (double).
// Warp-stride: grid_blocks caps the grid (65535·8 blocks of 8 warps), and
// N·k may be more pairs than that; a whole warp takes the same pairs, so the
// full-mask shuffle always has its 32 lanes.
__global__ void combine_backward_kernel(float* dys, float* dweight, const float* dy, const float* ys,
                                        const float* weight, const int32_t* sorted_pos, int N, int k, int L) {
  const int lane = threadIdx.x % 32;
  const size_t warps = size_t(gridDim.x) * blockDim.x / 32;
  for (size_t pair = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; pair < size_t(N) * k; pair += warps) {
    const size_t t = pair / k, row = sorted_pos[pair];
    const float w = weight[pair];
    double dot = 0.0;
    for (int c = lane; c < L; c += 32) {
      dot += double(dy[t * L + c]) * ys[row * L + c];
      dys[row * L + c] = w * dy[t * L + c];
    }
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (lane == 0) dweight[pair] = static_cast<float>(dot);
  }
}

}  // namespace

void router_forward(int32_t* expert, float* weight, float* threshold, const float* logits, const float* bias, int N,
                    int E, int k, RouterKind kind, float weight_sum, cudaStream_t stream) {
  RS_CHECK(k >= 1 && k <= E && k <= kMaxTopK, "cuda router: need 1 <= k <= min(E, 31)");
  if (N == 0) return;
  router_forward_kernel<<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      expert, weight, threshold, logits, bias, N, E, k, kind == RouterKind::kSoftmax, weight_sum);
  RS_CUDA_CHECK(cudaGetLastError());
}

void router_backward(float* dlogits, const float* dweight, const float* weight, const int32_t* expert,
                     const float* logits, int N, int E, int k, RouterKind kind, float weight_sum,
                     cudaStream_t stream) {
  if (N == 0) return;
  router_backward_kernel<<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      dlogits, dweight, weight, expert, logits, N, E, k, kind == RouterKind::kSoftmax, weight_sum);
  RS_CUDA_CHECK(cudaGetLastError());
}

void qb_histogram(int64_t* counts, const float* logits, int N, int E, int n_bins, float lo, float hi,
                  cudaStream_t stream) {
  RS_CHECK(n_bins >= 1 && hi > lo, "qb_histogram: need n_bins >= 1 and hi > lo");
  static_assert(sizeof(int64_t) == sizeof(unsigned long long), "counts are 64-bit");
  const size_t n = size_t(N) * E;
  if (n == 0) return;
  qb_histogram_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(
      reinterpret_cast<unsigned long long*>(counts), logits, N, E, n_bins, lo, n_bins / (double(hi) - lo));
  RS_CUDA_CHECK(cudaGetLastError());
}

void qb_bias_from_histogram(float* bias, const int64_t* counts, int E, int k, int n_bins, float lo, float hi,
                            cudaStream_t stream) {
  RS_CHECK(k >= 1 && k <= E, "qb: need 1 <= k <= E");
  qb_bias_kernel<<<(E + kThreads - 1) / kThreads, kThreads, 0, stream>>>(bias, counts, E, k, n_bins, lo,
                                                                       (double(hi) - lo) / n_bins);
  RS_CUDA_CHECK(cudaGetLastError());
}

double router_z_loss(const float* logits, int N, int E, double* work, cudaStream_t stream) {
  if (N == 0) return 0.0;
  router_z_rows_kernel<<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(work, logits, N, E);
  RS_CUDA_CHECK(cudaGetLastError());
  ordered_sum_kernel<<<1, 1, 0, stream>>>(work + N, work, N);
  RS_CUDA_CHECK(cudaGetLastError());
  double total = 0.0;
  RS_CUDA_CHECK(cudaMemcpyAsync(&total, work + N, sizeof(double), cudaMemcpyDeviceToHost, stream));
  RS_CUDA_CHECK(cudaStreamSynchronize(stream));
  return total / N;
}

void router_z_loss_backward(float* dlogits, const float* logits, int N, int E, float weight, cudaStream_t stream) {
  RS_CHECK(N > 0 && E > 0, "router_z_loss_backward: bad shape");
  router_z_backward_kernel<<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dlogits, logits, N, E, weight);
  RS_CUDA_CHECK(cudaGetLastError());
}

// Work layout: f (E), Σ_t p (E), row max (N), row sum (N); router_z_loss uses N + 1.
size_t router_loss_work_doubles(int N, int E) { return 2 * size_t(E) + 2 * size_t(N) + 1; }

namespace {

// f_e = assignments to e / (N k) into work[0, E); with the global batch's counts, counts_e / (n_total k).
void assignment_fractions(double* f, const int32_t* expert, int N, int E, int k, const int64_t* counts,
                          int64_t n_total, cudaStream_t stream) {
  if (counts) {
    fractions_from_counts_kernel<<<(E + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        f, counts, E, static_cast<double>(n_total) * k);
    RS_CUDA_CHECK(cudaGetLastError());
    return;
  }
  RS_CUDA_CHECK(cudaMemsetAsync(f, 0, sizeof(double) * E, stream));
  const int A = N * k;
  assignment_counts_kernel<<<grid_blocks(A, kThreads), kThreads, 0, stream>>>(f, expert, A);
  RS_CUDA_CHECK(cudaGetLastError());
  divide_doubles_kernel<<<(E + kThreads - 1) / kThreads, kThreads, 0, stream>>>(f, E, double(N) * k);
  RS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

double aux_loss_forward(const float* logits, const int32_t* expert, int N, int E, int k, RouterKind kind, float weight,
                        double* work, cudaStream_t stream, const int64_t* counts, int64_t n_total) {
  RS_CHECK(N > 0 && E > 0 && k > 0 && (!counts || n_total >= N), "aux_loss_forward: bad shape");
  const bool softmax = kind == RouterKind::kSoftmax;
  double* f = work;
  double* p_sum = f + E;
  double* row_max = p_sum + E;
  double* row_sum = row_max + N;
  assignment_fractions(f, expert, N, E, k, counts, n_total, stream);
  router_affinity_rows_kernel<<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(row_max, row_sum, logits, N, E,
                                                                                      softmax);
  RS_CUDA_CHECK(cudaGetLastError());
  expert_prob_sums_kernel<<<(E + kThreads - 1) / kThreads, kThreads, 0, stream>>>(p_sum, logits, row_max, row_sum, N,
                                                                                  E, softmax);
  RS_CUDA_CHECK(cudaGetLastError());
  std::vector<double> host(2 * size_t(E));
  RS_CUDA_CHECK(cudaMemcpyAsync(host.data(), f, sizeof(double) * host.size(), cudaMemcpyDeviceToHost, stream));
  RS_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double n_mean = counts ? static_cast<double>(n_total) : N;
  double loss = 0.0;
  for (int e = 0; e < E; ++e) loss += host[size_t(e)] * host[size_t(E + e)] / n_mean;  // as exec/cpu/balancing.cpp
  return static_cast<double>(weight) * E * loss;
}

void aux_loss_backward(float* dlogits, const float* logits, const int32_t* expert, int N, int E, int k,
                       RouterKind kind, float weight, double* work, cudaStream_t stream, const int64_t* counts,
                       int64_t n_total) {
  RS_CHECK(N > 0 && E > 0 && k > 0 && (!counts || n_total >= N), "aux_loss_backward: bad shape");
  assignment_fractions(work, expert, N, E, k, counts, n_total, stream);
  const double c = counts ? static_cast<double>(weight) * E / static_cast<double>(n_total)
                          : static_cast<double>(weight) * E / N;
  aux_backward_kernel<<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      dlogits, logits, work, N, E, kind == RouterKind::kSoftmax, c);
  RS_CUDA_CHECK(cudaGetLastError());
}

// Scratch layout: keys out (A), order in (A), order out (A), then CUB's temp storage.
size_t group_by_expert_scratch_bytes(int A) {
  size_t cub_bytes = 0;
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), A));
  return 3 * sizeof(int32_t) * size_t(A) + cub_bytes;
}

void group_by_expert(int32_t* sorted_pos, int32_t* offsets, const int32_t* expert, int A, int E, void* scratch,
                     cudaStream_t stream) {
  RS_CUDA_CHECK(cudaMemsetAsync(offsets, 0, sizeof(int32_t) * (E + 1), stream));
  if (A == 0) return;
  auto* keys_out = static_cast<int32_t*>(scratch);
  int32_t* order_in = keys_out + A;
  int32_t* order_out = order_in + A;
  void* cub_temp = order_out + A;
  size_t cub_bytes = group_by_expert_scratch_bytes(A) - 3 * sizeof(int32_t) * size_t(A);
  iota_kernel<<<grid_blocks(A, kThreads), kThreads, 0, stream>>>(order_in, A);
  RS_CUDA_CHECK(cudaGetLastError());
  // Radix sort is stable: within an expert, assignments keep token order (as the CPU's counting sort).
  RS_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(cub_temp, cub_bytes, expert, keys_out, order_in, order_out, A, 0,
                                                32, stream));
  scatter_rank_kernel<<<grid_blocks(A, kThreads), kThreads, 0, stream>>>(sorted_pos, order_out, A);
  RS_CUDA_CHECK(cudaGetLastError());
  count_kernel<<<grid_blocks(A, kThreads), kThreads, 0, stream>>>(offsets, expert, A);
  RS_CUDA_CHECK(cudaGetLastError());
  prefix_kernel<<<1, 1, 0, stream>>>(offsets, E);
  RS_CUDA_CHECK(cudaGetLastError());
}

void gather_forward(float* xs, const float* x, const int32_t* sorted_pos, int N, int k, int L, cudaStream_t stream) {
  const size_t n = size_t(N) * k * L;
  if (n == 0) return;
  gather_forward_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(xs, x, sorted_pos, N, k, L);
  RS_CUDA_CHECK(cudaGetLastError());
}

void gather_backward(float* dx, const float* dxs, const int32_t* sorted_pos, int N, int k, int L,
                     cudaStream_t stream) {
  const size_t n = size_t(N) * L;
  if (n == 0) return;
  gather_backward_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(dx, dxs, sorted_pos, N, k, L);
  RS_CUDA_CHECK(cudaGetLastError());
}

void combine_forward(float* y, const float* ys, const float* weight, const int32_t* sorted_pos, int N, int k, int L,
                     cudaStream_t stream) {
  const size_t n = size_t(N) * L;
  if (n == 0) return;
  combine_forward_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(y, ys, weight, sorted_pos, N, k, L);
  RS_CUDA_CHECK(cudaGetLastError());
}

void combine_backward(float* dys, float* dweight, const float* dy, const float* ys, const float* weight,
                      const int32_t* sorted_pos, int N, int k, int L, cudaStream_t stream) {
  const size_t warps = size_t(N) * k;
  if (warps == 0) return;
  combine_backward_kernel<<<grid_blocks(warps * 32, kThreads), kThreads, 0, stream>>>(dys, dweight, dy, ys, weight,
                                                                                     sorted_pos, N, k, L);
  RS_CUDA_CHECK(cudaGetLastError());
}

namespace {

__global__ void swiglu_variant_forward_kernel(float* h, const float* a1, const float* a3, size_t n, float alpha,
                                              float limit, float offset) {
  RS_GRID_STRIDE(i, n) { h[i] = swiglu_variant(a1[i], a3[i], alpha, limit, offset); }
}

__global__ void swiglu_variant_backward_kernel(float* da1, float* da3, const float* dh, const float* a1,
                                               const float* a3, size_t n, float alpha, float limit, float offset) {
  RS_GRID_STRIDE(i, n) { swiglu_variant_grad(dh[i], a1[i], a3[i], alpha, limit, offset, &da1[i], &da3[i]); }
}

__global__ void add_bias_rows_kernel(float* y, const float* bias, int rows, int width) {
  const size_t n = size_t(rows) * width;
  RS_GRID_STRIDE(i, n) { y[i] += bias[i % width]; }
}

// One thread per column walks the rows in order, in double (as the CPU's
// reduce_rows): deterministic, no atomics.
__global__ void bias_grad_rows_kernel(float* db, const float* dy, int rows, int width) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  double sum = 0.0;
  for (int r = 0; r < rows; ++r) sum += dy[size_t(r) * width + c];
  db[c] += static_cast<float>(sum);
}

}  // namespace

namespace detail {

void swiglu_variant_forward(float* h, const float* a1, const float* a3, size_t n, const SwiGluVariant& v,
                            cudaStream_t stream) {
  if (n == 0) return;
  swiglu_variant_forward_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(h, a1, a3, n, v.alpha, v.limit,
                                                                                   v.linear_offset);
  RS_CUDA_CHECK(cudaGetLastError());
}

void swiglu_variant_backward(float* da1, float* da3, const float* dh, const float* a1, const float* a3, size_t n,
                             const SwiGluVariant& v, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_variant_backward_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(da1, da3, dh, a1, a3, n, v.alpha,
                                                                                    v.limit, v.linear_offset);
  RS_CUDA_CHECK(cudaGetLastError());
}

void add_bias_rows(float* y, const float* bias, int rows, int width, cudaStream_t stream) {
  const size_t n = size_t(rows) * width;
  if (n == 0) return;
  add_bias_rows_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(y, bias, rows, width);
  RS_CUDA_CHECK(cudaGetLastError());
}

void bias_grad_rows(float* db, const float* dy, int rows, int width, cudaStream_t stream) {
  if (rows == 0 || width == 0) return;
  bias_grad_rows_kernel<<<grid_blocks(size_t(width), kThreads), kThreads, 0, stream>>>(db, dy, rows, width);
  RS_CUDA_CHECK(cudaGetLastError());
}

void zero_dropped_rows(float* dst, const float* src, const uint8_t* keep, int rows, int L, cudaStream_t stream) {
  const size_t n = size_t(rows) * L;
  if (n == 0) return;
  zero_dropped_kernel<<<grid_blocks(n, kThreads), kThreads, 0, stream>>>(dst, src, keep, rows, L);
  RS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace detail
}  // namespace rackstep::exec::cuda
