// Mixture of experts: router (sigmoid / softmax, top-(k+1) threshold),
// quantile balancing, grouping by expert, grouped SwiGLU experts with a keep
// mask (optionally with per-expert biases and gpt-oss's clamped SwiGLU), combine, and the dense SwiGLU of the shared experts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "exec/cpu/kernel_util.h"
#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {

void router_forward(int32_t* expert, float* weight, float* threshold, const float* logits,
                    const float* bias, int N, int E, int k, RouterKind kind, float weight_sum) {
  RS_CHECK(k >= 1 && k <= E, "router: need 1 <= k <= E");
  const int pick = std::min(k + 1, E);
#pragma omp parallel
  {
    std::vector<int> idx(E);
    std::vector<float> score(E);  // (E) biased score of one token
#pragma omp for schedule(static)
    for (long t = 0; t < N; ++t) {
      const float* l = logits + t * E;
      for (int e = 0; e < E; ++e) score[e] = l[e] + (bias ? bias[e] : 0.0f);
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + pick, idx.end(), [&](int a, int b) {
        return score[a] > score[b] || (score[a] == score[b] && a < b);
      });
      threshold[t] = k < E ? score[idx[k]] : -std::numeric_limits<float>::infinity();
      // Unnormalised weights from the unbiased logits; softmax is shifted by
      // the best chosen logit for range (the shift cancels in the ratio).
      const float shift = kind == RouterKind::kSoftmax ? l[idx[0]] : 0.0f;
      double sum = 0.0;
      for (int j = 0; j < k; ++j) {
        const float lj = l[idx[j]];
        const float u = kind == RouterKind::kSigmoid ? detail::sigmoidf(lj) : std::exp(lj - shift);
        weight[t * k + j] = u;
        sum += u;
      }
      const float norm = static_cast<float>(weight_sum / sum);
      for (int j = 0; j < k; ++j) {
        weight[t * k + j] *= norm;
        expert[t * k + j] = idx[j];
      }
    }
  }
}

// w_j = S u_j / Z with Z = Σ_chosen u: ∂w_m/∂u_j = (S δ_mj - w_m) / Z, so
// du_j = (S dw_j - Σ_m dw_m w_m) / Z. Sigmoid: dl = du σ(1-σ), u = σ.
// Softmax (u = e^l): dl_j = du_j u_j = w_j (dw_j - Σ_m dw_m w_m / S).
void router_backward(float* dlogits, const float* dweight, const float* weight,
                     const int32_t* expert, const float* logits, int N, int E, int k,
                     RouterKind kind, float weight_sum) {
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; ++t) {
    float* dl = dlogits + t * E;
    std::fill(dl, dl + E, 0.0f);
    const float* w = weight + t * k;
    const float* dw = dweight + t * k;
    double wdw = 0.0;
    for (int j = 0; j < k; ++j) wdw += static_cast<double>(w[j]) * dw[j];
    const float mean = static_cast<float>(wdw / weight_sum);
    if (kind == RouterKind::kSoftmax) {
      for (int j = 0; j < k; ++j) dl[expert[t * k + j]] = w[j] * (dw[j] - mean);
      continue;
    }
    double z = 0.0;  // Σ_chosen σ(l)
    for (int j = 0; j < k; ++j) z += detail::sigmoidf(logits[t * E + expert[t * k + j]]);
    for (int j = 0; j < k; ++j) {
      const int e = expert[t * k + j];
      const float s = detail::sigmoidf(logits[t * E + e]);
      const float du = static_cast<float>((weight_sum * (dw[j] - mean)) / z);
      dl[e] = du * s * (1.0f - s);
    }
  }
}

double router_z_loss(const float* logits, int N, int E) {
  std::vector<double> z(N);
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; ++t) {
    const float* l = logits + t * E;
    const float mx = *std::max_element(l, l + E);
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += std::exp(static_cast<double>(l[e]) - mx);
    const double lse = mx + std::log(sum);
    z[t] = lse * lse;
  }
  double total = 0.0;
  for (double v : z) total += v;
  return N > 0 ? total / N : 0.0;
}

void qb_histogram(int64_t* counts, const float* logits, int N, int E, int n_bins, float lo,
                  float hi) {
  RS_CHECK(n_bins >= 1 && hi > lo, "qb_histogram: need n_bins >= 1 and hi > lo");
  const double per_unit = n_bins / (static_cast<double>(hi) - lo);
  // Each thread owns whole experts' histograms: integer counts, no races.
#pragma omp parallel for schedule(static)
  for (int e = 0; e < E; ++e) {
    int64_t* ce = counts + static_cast<long>(e) * n_bins;
    for (long t = 0; t < N; ++t) {
      const double pos = (logits[t * E + e] - lo) * per_unit;
      const long bin = std::clamp(static_cast<long>(std::floor(pos)), 0L, static_cast<long>(n_bins - 1));
      ++ce[bin];
    }
  }
}

void qb_bias_from_histogram(float* bias, const int64_t* counts, int E, int k, int n_bins,
                            float lo, float hi) {
  RS_CHECK(k >= 1 && k <= E, "qb: need 1 <= k <= E");
  const double width = (static_cast<double>(hi) - lo) / n_bins;
  const double level = 1.0 - static_cast<double>(k) / E;  // quantile each expert must clear
  for (int e = 0; e < E; ++e) {
    const int64_t* ce = counts + static_cast<long>(e) * n_bins;
    int64_t total = 0;
    for (int b = 0; b < n_bins; ++b) total += ce[b];
    if (total == 0) {
      bias[e] = 0.0f;
      continue;
    }
    const double target = level * static_cast<double>(total);
    double below = 0.0;
    int b = 0;
    while (b < n_bins - 1 && below + static_cast<double>(ce[b]) < target) below += static_cast<double>(ce[b++]);
    const double frac = ce[b] > 0 ? (target - below) / static_cast<double>(ce[b]) : 0.0;
    const double q = lo + (b + std::clamp(frac, 0.0, 1.0)) * width;
    bias[e] = static_cast<float>(-q);
  }
}

void moe_group_by_expert(int32_t* sorted_pos, int32_t* offsets, const int32_t* expert, int A,
                         int E) {
  std::fill(offsets, offsets + E + 1, 0);
  for (int a = 0; a < A; ++a) {
    RS_CHECK(expert[a] >= 0 && expert[a] < E, "moe_group_by_expert: expert id out of range");
    ++offsets[expert[a] + 1];
  }
  for (int e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int32_t> cursor(offsets, offsets + E);
  for (int a = 0; a < A; ++a) sorted_pos[a] = cursor[expert[a]]++;
}

void moe_gather_forward(float* xs, const float* x, const int32_t* sorted_pos, int N, int k,
                        int L) {
  const long A = static_cast<long>(N) * k;
#pragma omp parallel for schedule(static)
  for (long a = 0; a < A; ++a)
    std::memcpy(xs + static_cast<long>(sorted_pos[a]) * L, x + (a / k) * L, sizeof(float) * L);
}

void moe_gather_backward(float* dx, const float* dxs, const int32_t* sorted_pos, int N, int k,
                         int L) {
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; ++t) {
    float* dxr = dx + t * L;
    std::fill(dxr, dxr + L, 0.0f);
    for (int j = 0; j < k; ++j) {
      const float* src = dxs + static_cast<long>(sorted_pos[t * k + j]) * L;
      for (int c = 0; c < L; ++c) dxr[c] += src[c];
    }
  }
}

namespace {

long expert_rows(const int32_t* offsets, int e) { return offsets[e + 1] - offsets[e]; }

// Expert e's row of a per-expert bias (E, width), or nullptr without one.
template <typename T>
T* at_row(T* bias, int e, int width) {
  return bias ? bias + static_cast<long>(e) * width : nullptr;
}

}  // namespace

void experts_forward(float* ys, float* a1, float* a3, float* h, const float* xs,
                     const int32_t* offsets, const uint8_t* keep, const float* w1,
                     const float* w3, const float* w2, int A, int E, int L, int F, const ExpertOptions& opt) {
  RS_CHECK(offsets[0] == 0 && offsets[E] == A, "experts: offsets must cover the A rows");
  const long LF = static_cast<long>(L) * F;
  // One expert at a time; OpenBLAS parallelises inside each GEMM.
  for (int e = 0; e < E; ++e) {
    const long n = expert_rows(offsets, e);
    if (n == 0) continue;
    const long r0 = offsets[e];
    linear_forward(a1 + r0 * F, xs + r0 * L, w1 + e * LF, at_row(opt.b1, e, F), static_cast<int>(n), L, F);
    linear_forward(a3 + r0 * F, xs + r0 * L, w3 + e * LF, at_row(opt.b3, e, F), static_cast<int>(n), L, F);
    swiglu_variant_forward(h + r0 * F, a1 + r0 * F, a3 + r0 * F, static_cast<size_t>(n * F), opt.act);
    linear_forward(ys + r0 * L, h + r0 * F, w2 + e * LF, at_row(opt.b2, e, L), static_cast<int>(n), F, L);
  }
  if (!keep) return;
  // A dropped assignment never reached its expert: its output row is zero.
#pragma omp parallel for schedule(static)
  for (long r = 0; r < A; ++r)
    if (!keep[r]) std::fill(ys + r * L, ys + (r + 1) * L, 0.0f);
}

size_t experts_scratch_floats(int A, int L, int F) {
  return static_cast<size_t>(A) * L + 3 * static_cast<size_t>(A) * F;
}

void experts_backward(float* dxs, float* dw1, float* dw3, float* dw2, const float* dys,
                      const float* xs, const float* a1, const float* a3, const float* h,
                      const int32_t* offsets, const uint8_t* keep, const float* w1,
                      const float* w3, const float* w2, float* scratch, int A, int E, int L,
                      int F, const ExpertOptions& opt) {
  RS_CHECK(offsets[0] == 0 && offsets[E] == A, "experts: offsets must cover the A rows");
  const long LF = static_cast<long>(L) * F;
  float* dy_kept = scratch;                          // (A, L) dys with dropped rows zeroed
  float* dh = dy_kept + static_cast<long>(A) * L;    // (A, F)
  float* da1 = dh + static_cast<long>(A) * F;        // (A, F)
  float* da3 = da1 + static_cast<long>(A) * F;       // (A, F)
#pragma omp parallel for schedule(static)
  for (long r = 0; r < A; ++r) {
    const bool kept = !keep || keep[r];
    for (int c = 0; c < L; ++c) dy_kept[r * L + c] = kept ? dys[r * L + c] : 0.0f;
  }
  for (int e = 0; e < E; ++e) {
    const int n = static_cast<int>(expert_rows(offsets, e));
    if (n == 0) continue;
    const long r0 = offsets[e];
    linear_backward(dh + r0 * F, dw2 + e * LF, at_row(opt.db2, e, L), dy_kept + r0 * L, h + r0 * F,
                    w2 + e * LF, n, F, L);
    swiglu_variant_backward(da1 + r0 * F, da3 + r0 * F, dh + r0 * F, a1 + r0 * F, a3 + r0 * F,
                            static_cast<size_t>(n) * F, opt.act);
    linear_backward(dxs + r0 * L, dw1 + e * LF, at_row(opt.db1, e, F), da1 + r0 * F, xs + r0 * L,
                    w1 + e * LF, n, L, F);
    linear_backward(dxs + r0 * L, dw3 + e * LF, at_row(opt.db3, e, F), da3 + r0 * F, xs + r0 * L,
                    w3 + e * LF, n, L, F, /*accumulate_dx=*/true);
  }
}

void moe_combine_forward(float* y, const float* ys, const float* weight,
                         const int32_t* sorted_pos, int N, int k, int L) {
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; ++t) {
    float* yr = y + t * L;
    std::fill(yr, yr + L, 0.0f);
    for (int j = 0; j < k; ++j) {
      const float w = weight[t * k + j];
      const float* src = ys + static_cast<long>(sorted_pos[t * k + j]) * L;
      for (int c = 0; c < L; ++c) yr[c] += w * src[c];
    }
  }
}

void moe_combine_backward(float* dys, float* dweight, const float* dy, const float* ys,
                          const float* weight, const int32_t* sorted_pos, int N, int k, int L) {
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; ++t) {
    const float* dyr = dy + t * L;
    for (int j = 0; j < k; ++j) {
      const long row = sorted_pos[t * k + j];
      const float w = weight[t * k + j];
      const float* ysr = ys + row * L;
      float* dysr = dys + row * L;
      double dot = 0.0;
      for (int c = 0; c < L; ++c) {
        dot += static_cast<double>(dyr[c]) * ysr[c];
        dysr[c] = w * dyr[c];
      }
      dweight[t * k + j] = static_cast<float>(dot);
    }
  }
}

void dense_swiglu_forward(float* y, float* a1, float* a3, float* h, const float* x,
                          const float* w1, const float* w3, const float* w2, int N, int d,
                          int F) {
  linear_forward(a1, x, w1, nullptr, N, d, F);
  linear_forward(a3, x, w3, nullptr, N, d, F);
  swiglu_forward(h, a1, a3, static_cast<size_t>(N) * F);
  linear_forward(y, h, w2, nullptr, N, F, d);
}

void dense_swiglu_backward(float* dx, float* dw1, float* dw3, float* dw2, const float* dy,
                           const float* x, const float* a1, const float* a3, const float* h,
                           const float* w1, const float* w3, const float* w2, float* scratch,
                           int N, int d, int F, bool accumulate_dx) {
  const size_t nf = static_cast<size_t>(N) * F;
  float* dh = scratch;      // (N, F)
  float* da1 = dh + nf;     // (N, F)
  float* da3 = da1 + nf;    // (N, F)
  linear_backward(dh, dw2, nullptr, dy, h, w2, N, F, d);
  swiglu_backward(da1, da3, dh, a1, a3, nf);
  linear_backward(dx, dw1, nullptr, da1, x, w1, N, d, F, accumulate_dx);
  linear_backward(dx, dw3, nullptr, da3, x, w3, N, d, F, /*accumulate_dx=*/true);
}

}  // namespace rackstep::exec
