// Causal softmax attention (sliding window or full, GQA, document masking),
// exact backward from the saved logsumexp; XSA; the per-head output gate.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "exec/cpu/kernel_util.h"
#include "exec/kernels.h"
#include "models/check.h"

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

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* doc, int B, int T, int H, int kv_stored, int kv_used,
                       int hd, int window, float scale) {
  const AttnShape s{B, T, H, kv_stored, kv_used, hd, window};
  check_shape(s);
#pragma omp parallel
  {
    std::vector<float> p(T);  // (T) scores, then probabilities of one query row
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        const int g = h / s.group();
        const int32_t* doc_row = doc ? doc + static_cast<long>(b) * T : nullptr;
        for (int i = 0; i < T; ++i) {
          const float* qi = q + s.q_at(b, i, h);
          const int j0 = s.first_key(i);
          float mx = -INFINITY;
          for (int j = j0; j <= i; ++j) {
            if (!visible(doc_row, i, j)) continue;
            p[j] = scale * dot(qi, k + s.kv_at(b, j, g), hd);
            mx = std::max(mx, p[j]);
          }
          double sum = 0.0;
          for (int j = j0; j <= i; ++j) {
            if (!visible(doc_row, i, j)) continue;
            p[j] = std::exp(p[j] - mx);
            sum += p[j];
          }
          const float inv = static_cast<float>(1.0 / sum);
          float* oi = o + s.q_at(b, i, h);
          std::fill(oi, oi + hd, 0.0f);
          for (int j = j0; j <= i; ++j) {
            if (!visible(doc_row, i, j)) continue;
            const float pj = p[j] * inv;
            const float* vj = v + s.kv_at(b, j, g);
            for (int c = 0; c < hd; ++c) oi[c] += pj * vj[c];
          }
          lse[(static_cast<long>(b) * H + h) * T + i] = mx + static_cast<float>(std::log(sum));
        }
      }
    }
  }
}

// Standard softmax-attention backward (as in FlashAttention-2, Dao 2023):
// D_i = dO_i·O_i, dS_ij = P_ij (dO_i·v_j - D_i), dq_i = scale Σ_j dS_ij k_j,
// dk_j = scale Σ_i dS_ij q_i, dv_j = Σ_i P_ij dO_i.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* o, const float* lse,
                        const int32_t* doc, int B, int T, int H, int kv_stored, int kv_used,
                        int hd, int window, float scale, bool accumulate_dkv) {
  const AttnShape s{B, T, H, kv_stored, kv_used, hd, window};
  check_shape(s);
  if (!accumulate_dkv) {
    const size_t n = static_cast<size_t>(B) * T * kv_stored * hd;
    std::memset(dk, 0, n * sizeof(float));
    std::memset(dv, 0, n * sizeof(float));
  }
  // One thread owns one (b, kv head): it visits every query head of the group,
  // so dk/dv of that kv head are summed in a fixed order without atomics.
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int g = 0; g < kv_used; ++g) {
      const int32_t* doc_row = doc ? doc + static_cast<long>(b) * T : nullptr;
      for (int h = g * s.group(); h < (g + 1) * s.group(); ++h) {
        for (int i = 0; i < T; ++i) {
          const float* qi = q + s.q_at(b, i, h);
          const float* doi = dout + s.q_at(b, i, h);
          const float Di = dot(doi, o + s.q_at(b, i, h), hd);
          const float li = lse[(static_cast<long>(b) * H + h) * T + i];
          float* dqi = dq + s.q_at(b, i, h);
          std::fill(dqi, dqi + hd, 0.0f);
          for (int j = s.first_key(i); j <= i; ++j) {
            if (!visible(doc_row, i, j)) continue;
            const float* kj = k + s.kv_at(b, j, g);
            const float* vj = v + s.kv_at(b, j, g);
            const float pij = std::exp(scale * dot(qi, kj, hd) - li);
            const float dsij = pij * (dot(doi, vj, hd) - Di) * scale;
            float* dkj = dk + s.kv_at(b, j, g);
            float* dvj = dv + s.kv_at(b, j, g);
            for (int c = 0; c < hd; ++c) {
              dqi[c] += dsij * kj[c];
              dkj[c] += dsij * qi[c];
              dvj[c] += pij * doi[c];
            }
          }
        }
      }
    }
  }
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
