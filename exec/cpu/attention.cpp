// Causal softmax attention (sliding window or full, GQA, document masking),
// exact backward from the saved logsumexp; XSA; the per-head output gate.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "exec/cpu/kernel_util.h"
#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {
namespace {

struct AttnShape {
  int B, T, H, kv_stored, kv_used, hd, window;
  int group() const { return H / kv_used; }
  // Offsets into (B, T, heads, hd) buffers.
  long q_at(int b, int t, int h) const { return ((static_cast<long>(b) * T + t) * H + h) * hd; }
  long kv_at(int b, int t, int g) const {
    return ((static_cast<long>(b) * T + t) * kv_stored + g) * hd;
  }
  // First key a query at t may see under the window (document checked per key).
  int first_key(int t) const { return window > 0 ? std::max(0, t - window + 1) : 0; }
};

void check_shape(const AttnShape& s) {
  RS_CHECK(s.kv_used > 0 && s.kv_used <= s.kv_stored, "attention: kv_used must be in [1, kv_stored]");
  RS_CHECK(s.H % s.kv_used == 0, "attention: kv_used must divide the query heads");
  RS_CHECK(s.window >= 0, "attention: window must be >= 0 (0 = full causal)");
}

bool visible(const int32_t* doc_row, int i, int j) { return !doc_row || doc_row[i] == doc_row[j]; }

// The simd reduction lets the compiler vectorise (a fixed lane order, so the
// result is still the same on every run).
float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

// Both passes walk query tiles of tile_rows() rows per (batch, head): the tile's
// scores against the keys it can reach (the window bounds them) come from one
// sgemm, the masked softmax runs row-parallel, the products with V (and in the
// backward dO, K, Q) are sgemms again. Masked pairs get probability 0, so the
// GEMMs may cover them without changing the result.
namespace {

constexpr int kTileRows = 128;

// Query rows per tile: a sliding window reaches window + rows - 1 keys, so
// tiles as tall as the window (at least 32 rows, to keep the GEMMs efficient)
// waste less of the score GEMM on masked pairs than full 128-row tiles.
int tile_rows(const AttnShape& s) { return s.window > 0 ? std::clamp(s.window, 32, kTileRows) : kTileRows; }

// Key range [j0, j1) the query tile [i0, i0 + rows) can reach.
void tile_keys(const AttnShape& s, int i0, int rows, int* j0, int* j1) {
  *j0 = s.first_key(i0);
  *j1 = i0 + rows;
}

// p (rows, span) = scale * Q_tile · K_spanᵀ, then masked: invisible pairs
// become -inf. Q and K rows sit `ldq`, `ldk` floats apart.
void tile_scores(float* p, const float* qt, int ldq, const float* ks, int ldk, int rows, int span,
                 int hd, float scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, span, hd, scale, qt, ldq, ks, ldk,
              0.0f, p, span);
}

// Query i's candidate keys in tile coordinates (key j0 + jj): [lo, hi), the
// causal window; the document rule is checked per key inside.
void visible_keys(const AttnShape& s, int i, int j0, int* lo, int* hi) {
  *lo = std::max(j0, s.first_key(i)) - j0;
  *hi = i + 1 - j0;
}

// Masked softmax of one row of scores pr (span) in place, for query i whose
// keys start at j0; invisible entries become exactly 0. Returns the row's
// logsumexp. Only visible keys pay for an exponential (a 64-token window reads
// a third of the tile's span).
// With ALiBi (slopes != nullptr) the row's scores first get -slope (i - j);
// with a sink, its logit joins the denominator (and the logsumexp).
float softmax_row(float* pr, const AttnShape& s, const int32_t* doc_row, int i, int j0, int span,
                  const float* slope, const float* sink) {
  int lo, hi;
  visible_keys(s, i, j0, &lo, &hi);
  std::fill(pr, pr + lo, 0.0f);
  std::fill(pr + hi, pr + span, 0.0f);
  float mx = -INFINITY;
  for (int jj = lo; jj < hi; ++jj) {
    if (!visible(doc_row, i, j0 + jj)) {
      pr[jj] = -INFINITY;
    } else if (slope) {
      pr[jj] -= *slope * static_cast<float>(i - j0 - jj);
    }
    mx = std::max(mx, pr[jj]);
  }
  if (sink) mx = std::max(mx, *sink);
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int jj = lo; jj < hi; ++jj) {
    const float e = pr[jj] == -INFINITY ? 0.0f : detail::expf_fast(pr[jj] - mx);
    pr[jj] = e;
    sum += e;
  }
  if (sink) sum += detail::expf_fast(*sink - mx);
  const float inv = static_cast<float>(1.0 / sum);
#pragma omp simd
  for (int jj = lo; jj < hi; ++jj) pr[jj] *= inv;
  return mx + static_cast<float>(std::log(sum));
}

}  // namespace

// The query heads that share a KV head (a GQA group) run as one stacked tile:
// their rows are gathered into one (group * rows, hd) block, row m = head
// offset m / rows, query i0 + m % rows, so each GEMM against the group's K/V
// span is one call that packs K or V once instead of once per head.
namespace {

// dst (group * rows, hd) <- the group's heads of rows [i0, i0 + rows) of x (B, T, H, hd).
void gather_group(float* dst, const float* x, const AttnShape& s, int b, int g, int i0, int rows) {
  const int group = s.group();
  for (int hh = 0; hh < group; ++hh)
    for (int r = 0; r < rows; ++r)
      std::memcpy(dst + (static_cast<long>(hh) * rows + r) * s.hd, x + s.q_at(b, i0 + r, g * group + hh),
                  sizeof(float) * s.hd);
}

// The inverse of gather_group: x's group heads of rows [i0, i0 + rows) <- src.
void scatter_group(float* x, const float* src, const AttnShape& s, int b, int g, int i0, int rows) {
  const int group = s.group();
  for (int hh = 0; hh < group; ++hh)
    for (int r = 0; r < rows; ++r)
      std::memcpy(x + s.q_at(b, i0 + r, g * group + hh), src + (static_cast<long>(hh) * rows + r) * s.hd,
                  sizeof(float) * s.hd);
}

}  // namespace

void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc, int B, int T, int H, int kv_stored, int kv_used,
                       int hd, int window, float scale, const AttentionExtras& extras) {
  const AttnShape s{B, T, H, kv_stored, kv_used, hd, window};
  check_shape(s);
  const int ldk = kv_stored * hd, tile = tile_rows(s), group = s.group();
  const size_t most = static_cast<size_t>(group) * kTileRows;  // stacked rows of one tile
  std::vector<float> p(most * T);   // (group * rows, span) scores, then probabilities
  std::vector<float> qs(most * hd);  // (group * rows, hd) stacked queries
  std::vector<float> os(most * hd);  // (group * rows, hd) stacked outputs
  for (int b = 0; b < B; ++b) {
    const int32_t* doc_row = doc ? doc + static_cast<long>(b) * T : nullptr;
    for (int g = 0; g < kv_used; ++g) {
      for (int i0 = 0; i0 < T; i0 += tile) {
        const int rows = std::min(tile, T - i0), M = group * rows;
        int j0, j1;
        tile_keys(s, i0, rows, &j0, &j1);
        const int span = j1 - j0;
        gather_group(qs.data(), q, s, b, g, i0, rows);
        tile_scores(p.data(), qs.data(), hd, k + s.kv_at(b, j0, g), ldk, M, span, hd, scale);
#pragma omp parallel for schedule(static)
        for (int m = 0; m < M; ++m) {
          const int h = g * group + m / rows, i = i0 + m % rows;
          lse[(static_cast<long>(b) * H + h) * T + i] =
              softmax_row(p.data() + static_cast<long>(m) * span, s, doc_row, i, j0, span,
                          extras.alibi_slopes ? extras.alibi_slopes + h : nullptr,
                          extras.sinks ? extras.sinks + h : nullptr);
        }
        // O (M, hd) = P (M, span) · V_span (span, hd)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, span, 1.0f, p.data(), span,
                    v + s.kv_at(b, j0, g), ldk, 0.0f, os.data(), hd);
        scatter_group(o, os.data(), s, b, g, i0, rows);
      }
    }
  }
}

// Standard softmax-attention backward (as in FlashAttention-2, Dao 2023):
// D_i = dO_i·O_i, dS_ij = P_ij (dO_i·v_j - D_i), dq_i = scale Σ_j dS_ij k_j,
// dk_j = scale Σ_i dS_ij q_i, dv_j = Σ_i P_ij dO_i. Tiles run in a fixed order,
// so the sums into dk/dv are the same on every run. A sink has no value, so
// O_i = Σ_j P_ij v_j still and D_i is unchanged; its own gradient is
// -Σ_i P_sink,i D_i, summed per head in row order (deterministic).
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* o, const float* lse,
                        const int32_t* doc, int B, int T, int H, int kv_stored, int kv_used,
                        int hd, int window, float scale, bool accumulate_dkv,
                        const AttentionExtras& extras) {
  const AttnShape s{B, T, H, kv_stored, kv_used, hd, window};
  check_shape(s);
  RS_CHECK(!extras.sinks || extras.dsinks, "attention_backward: sinks need their gradient buffer");
  std::vector<double> dsink(extras.sinks ? static_cast<size_t>(H) : 0, 0.0);  // (H) this call's sums
  if (!accumulate_dkv) {
    const size_t n = static_cast<size_t>(B) * T * kv_stored * hd;
    std::memset(dk, 0, n * sizeof(float));
    std::memset(dv, 0, n * sizeof(float));
  }
  const int ldk = kv_stored * hd, tile = tile_rows(s), group = s.group();
  const size_t most = static_cast<size_t>(group) * kTileRows;
  std::vector<float> p(most * T);     // (group * rows, span) probabilities
  std::vector<float> ds(most * T);    // (group * rows, span) dP, then dS
  std::vector<float> qs(most * hd);   // (group * rows, hd) stacked queries
  std::vector<float> dos(most * hd);  // (group * rows, hd) stacked output gradients
  std::vector<float> dqs(most * hd);  // (group * rows, hd) stacked query gradients
  std::vector<float> dsink_rows(extras.sinks ? most : 0);  // (group * rows) each row's sink gradient
  for (int b = 0; b < B; ++b) {
    const int32_t* doc_row = doc ? doc + static_cast<long>(b) * T : nullptr;
    for (int g = 0; g < kv_used; ++g) {
      for (int i0 = 0; i0 < T; i0 += tile) {
        const int rows = std::min(tile, T - i0), M = group * rows;
        int j0, j1;
        tile_keys(s, i0, rows, &j0, &j1);
        const int span = j1 - j0;
        const float* ks = k + s.kv_at(b, j0, g);
        const float* vs = v + s.kv_at(b, j0, g);
        gather_group(qs.data(), q, s, b, g, i0, rows);
        gather_group(dos.data(), dout, s, b, g, i0, rows);
        tile_scores(p.data(), qs.data(), hd, ks, ldk, M, span, hd, scale);
        // dP (M, span) = dO · V_spanᵀ
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, span, hd, 1.0f, dos.data(), hd, vs, ldk,
                    0.0f, ds.data(), span);
#pragma omp parallel for schedule(static)
        for (int m = 0; m < M; ++m) {
          const int h = g * group + m / rows, i = i0 + m % rows;
          float* pr = p.data() + static_cast<long>(m) * span;
          float* dsr = ds.data() + static_cast<long>(m) * span;
          const float Di = dot(dos.data() + static_cast<long>(m) * hd, o + s.q_at(b, i, h), hd);
          const float li = lse[(static_cast<long>(b) * H + h) * T + i];
          int lo, hi;
          visible_keys(s, i, j0, &lo, &hi);
          std::fill(pr, pr + lo, 0.0f);
          std::fill(dsr, dsr + lo, 0.0f);
          const float slope = extras.alibi_slopes ? extras.alibi_slopes[h] : 0.0f;
#pragma omp simd
          for (int jj = lo; jj < hi; ++jj) {
            const bool seen = !doc_row || doc_row[j0 + jj] == doc_row[i];
            const float score = extras.alibi_slopes ? pr[jj] - slope * static_cast<float>(i - j0 - jj) : pr[jj];
            const float pij = seen ? detail::expf_fast(score - li) : 0.0f;
            pr[jj] = pij;
            dsr[jj] = pij * (dsr[jj] - Di) * scale;
          }
          std::fill(pr + hi, pr + span, 0.0f);
          std::fill(dsr + hi, dsr + span, 0.0f);
          if (extras.sinks) dsink_rows[m] = -detail::expf_fast(extras.sinks[h] - li) * Di;
        }
        if (extras.sinks) {
          for (int m = 0; m < M; ++m) dsink[static_cast<size_t>(g * group + m / rows)] += dsink_rows[m];
        }
        // dQ = dS · K_span;  dK_span += dSᵀ · Q;  dV_span += Pᵀ · dO (the group's heads summed)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, hd, span, 1.0f, ds.data(), span, ks, ldk,
                    0.0f, dqs.data(), hd);
        scatter_group(dq, dqs.data(), s, b, g, i0, rows);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, span, hd, M, 1.0f, ds.data(), span, qs.data(), hd,
                    1.0f, dk + s.kv_at(b, j0, g), ldk);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, span, hd, M, 1.0f, p.data(), span, dos.data(), hd,
                    1.0f, dv + s.kv_at(b, j0, g), ldk);
      }
    }
  }
  for (size_t h = 0; h < dsink.size(); ++h) extras.dsinks[h] += static_cast<float>(dsink[h]);
}

void xsa_forward(float* y, const float* o, const float* v, int N, int H, int kv_stored,
                 int kv_used, int hd, float eps) {
  RS_CHECK(kv_used > 0 && kv_used <= kv_stored && H % kv_used == 0, "xsa: bad kv heads");
  const int group = H / kv_used;
#pragma omp parallel for schedule(static)
  for (long n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      const float* oh = o + (n * H + h) * hd;
      const float* vg = v + (n * kv_stored + h / group) * hd;
      float* yh = y + (n * H + h) * hd;
      const float c = dot(oh, vg, hd) / (dot(vg, vg, hd) + eps);
      for (int i = 0; i < hd; ++i) yh[i] = oh[i] - c * vg[i];
    }
  }
}

// y = o - c v, c = (o·v)/nv, nv = v·v + eps:
// do = dy - (dy·v)/nv v;  dv = -c dy - (dy·v)(o - 2c v)/nv.
void xsa_backward(float* d_o, float* dv, const float* dy, const float* o, const float* v, int N,
                  int H, int kv_stored, int kv_used, int hd, float eps) {
  RS_CHECK(kv_used > 0 && kv_used <= kv_stored && H % kv_used == 0, "xsa: bad kv heads");
  const int group = H / kv_used;
#pragma omp parallel for schedule(static)
  for (long n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      const float* oh = o + (n * H + h) * hd;
      const float* dyh = dy + (n * H + h) * hd;
      const float* vg = v + (n * kv_stored + h / group) * hd;
      float* dvg = dv + (n * kv_stored + h / group) * hd;
      float* doh = d_o + (n * H + h) * hd;
      const float nv = dot(vg, vg, hd) + eps;
      const float c = dot(oh, vg, hd) / nv;
      const float dyv = dot(dyh, vg, hd);
      for (int i = 0; i < hd; ++i) {
        dvg[i] += -c * dyh[i] - dyv * (oh[i] - 2.0f * c * vg[i]) / nv;
        doh[i] = dyh[i] - dyv / nv * vg[i];
      }
    }
  }
}

void attn_gate_forward(float* y, float* g, const float* o, const float* x, const float* w_gate,
                       int N, int d, int H, int hd) {
  linear_forward(g, x, w_gate, nullptr, N, d, H);
#pragma omp parallel for schedule(static)
  for (long n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      const float gh = 2.0f * detail::sigmoidf(g[n * H + h]);
      g[n * H + h] = gh;
      const float* oh = o + (n * H + h) * hd;
      float* yh = y + (n * H + h) * hd;
      for (int i = 0; i < hd; ++i) yh[i] = gh * oh[i];
    }
  }
}

// g = 2σ(z): dg/dz = 2σ(1-σ) = g (1 - g/2).
void attn_gate_backward(float* d_o, float* dx, float* dw_gate, const float* dy, const float* o,
                        const float* x, const float* g, const float* w_gate, float* scratch,
                        int N, int d, int H, int hd, bool accumulate_dx) {
  float* dz = scratch;  // (N, H)
#pragma omp parallel for schedule(static)
  for (long n = 0; n < N; ++n) {
    for (int h = 0; h < H; ++h) {
      const float* oh = o + (n * H + h) * hd;
      const float* dyh = dy + (n * H + h) * hd;
      float* doh = d_o + (n * H + h) * hd;
      const float gh = g[n * H + h];
      const float dg = dot(dyh, oh, hd);
      for (int i = 0; i < hd; ++i) doh[i] = gh * dyh[i];
      dz[n * H + h] = dg * gh * (1.0f - 0.5f * gh);
    }
  }
  linear_backward(dx, dw_gate, nullptr, dz, x, w_gate, N, d, H, accumulate_dx);
}

}  // namespace rackstep::exec
