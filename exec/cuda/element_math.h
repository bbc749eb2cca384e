// The CUDA backend's per-element and per-row formulas, as __host__ __device__
// functions: the kernels in exec/cuda/*.cu call them on the GPU, and
// tests/exec_cuda_math.cpp calls them on the CPU against the reference kernels
// of exec/cpu/, so the formulas are proven equal in CI where no GPU exists.
// Arithmetic follows exec/cpu/ (fp32 values, double where the CPU kernel sums
// or computes angles in double) so fp32 parity holds to rounding.
//
//   float h = swiglu(a1, a3);                     // silu(a1) * a3
//   float h = swiglu_variant(a1, a3, 1.702f, 7.f, 1.f);  // gpt-oss's clamped experts
//   float h = gelu(a), da = gelu_grad(dh, a);    // GPT-2's MLP (tanh form)
//   float h = relu2(a), da = relu2_grad(dh, a);  // ReLU² (Primer)
//   float r = rms_rstd(sum_sq, d, eps);           // 1/sqrt(mean(x²)+eps)
//   rope_rotate(x1, x2, rope_angle(pos, i, rot, theta), +1.f, &y1, &y2);
//   rope_rotate(x1, x2, rope_angle_yarn(pos, i, rot, theta, s, lo, hi), +1.f, &y1, &y2, yarn_scale(s));
//   float s = alibi_score(scale * qk, slope_h, i, j);  // ALiBi's linear bias
//   router_token(l, bias, E, k, softmax, 1.f, expert, weight, &threshold);  // one token's top-k
//   ++counts[e * n_bins + qb_bin(l_e, lo, n_bins / (hi - lo), n_bins)];  bias[e] = qb_bias(counts + e * n_bins, ...);
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define RS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define RS_HOST_DEVICE inline
#endif

namespace rackstep::exec::cuda {

RS_HOST_DEVICE float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
RS_HOST_DEVICE float silu(float x) { return x * sigmoid(x); }
// d silu / dx = σ(x) (1 + x (1 − σ(x))).
RS_HOST_DEVICE float silu_grad(float x) {
  const float s = sigmoid(x);
  return s * (1.0f + x * (1.0f - s));
}

// SwiGLU (Shazeer 2020): h = silu(a1) · a3.
RS_HOST_DEVICE float swiglu(float a1, float a3) { return silu(a1) * a3; }
// da1 = dh · a3 · silu'(a1), da3 = dh · silu(a1).
RS_HOST_DEVICE void swiglu_grad(float dh, float a1, float a3, float* da1, float* da3) {
  *da3 = dh * silu(a1);
  *da1 = dh * a3 * silu_grad(a1);
}

// The routed experts' SwiGLU variant (exec/kernels.h SwiGluVariant; gpt-oss
// alpha 1.702, limit 7, offset 1): g = min(a1, limit), u = clamp(a3, ±limit)
// (limit 0: no clamp), h = g σ(alpha g) (u + offset).
// The clamps keep a NaN (as std::min / std::clamp and torch.clamp; fminf would drop it).
RS_HOST_DEVICE float clamp_max(float x, float hi) { return x > hi ? hi : x; }
RS_HOST_DEVICE float clamp_range(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }
RS_HOST_DEVICE float swiglu_variant(float a1, float a3, float alpha, float limit, float offset) {
  const float g = limit > 0.0f ? clamp_max(a1, limit) : a1;
  const float u = limit > 0.0f ? clamp_range(a3, -limit, limit) : a3;
  return g * sigmoid(alpha * g) * (u + offset);
}
// da1 = dh (u + offset) (σ + α g σ (1 − σ)) where a1 <= limit, else 0;
// da3 = dh g σ where −limit <= a3 <= limit, else 0 (torch.clamp's backward).
RS_HOST_DEVICE void swiglu_variant_grad(float dh, float a1, float a3, float alpha, float limit, float offset,
                                        float* da1, float* da3) {
  const bool clamp = limit > 0.0f;
  const float g = clamp ? clamp_max(a1, limit) : a1;
  const float u = clamp ? clamp_range(a3, -limit, limit) : a3;
  const float s = sigmoid(alpha * g);
  *da3 = !clamp || (a3 >= -limit && a3 <= limit) ? dh * (g * s) : 0.0f;
  *da1 = !clamp || a1 <= limit ? dh * (u + offset) * (s + alpha * g * s * (1.0f - s)) : 0.0f;
}

// GeLU, tanh approximation (Hendrycks & Gimpel 2016, eq. in §2; GPT-2 and
// llm.c's gelu_forward): h = ½ x (1 + tanh(c (x + 0.044715 x³))), c = √(2/π).
// Written as exec/cpu/activations.cpp writes it (same constants, same
// association), so the host result is bitwise the CPU kernel's; on the device
// tanhf is CUDA's (≤ 2 ulp, CUDA Programming Guide, "Mathematical Functions").
constexpr float kGeluC = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluCubic = 0.044715f;
RS_HOST_DEVICE float gelu(float x) { return 0.5f * x * (1.0f + tanhf(kGeluC * (x + kGeluCubic * x * x * x))); }
// da = dh · gelu'(x), gelu'(x) = ½ (1 + t) + ½ x (1 − t²) c (1 + 3·0.044715 x²),
// t = tanh(c (x + 0.044715 x³)).
RS_HOST_DEVICE float gelu_grad(float dh, float x) {
  const float t = tanhf(kGeluC * (x + kGeluCubic * x * x * x));
  const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluCubic * x * x);
  return dh * grad;
}

// ReLU² (So et al. 2021, Primer): h = max(x, 0)²; a NaN input gives 0, as the
// CPU kernel's `x > 0 ? x : 0` does.
RS_HOST_DEVICE float relu2(float x) {
  const float r = x > 0.0f ? x : 0.0f;
  return r * r;
}
// da = 2 x dh where x > 0, else 0 (associated as the CPU kernel: (2 x) dh).
RS_HOST_DEVICE float relu2_grad(float dh, float x) { return x > 0.0f ? 2.0f * x * dh : 0.0f; }

// RMSNorm's saved statistic from the row's sum of squares (summed in double).
RS_HOST_DEVICE float rms_rstd(double sum_sq, int d, float eps) {
  return static_cast<float>(1.0 / sqrt(sum_sq / d + eps));
}
// Backward of y_i = x_i r c_i: dx_i = r c_i dy_i − x_i k, with k = r³/d Σ_j dy_j c_j x_j
// (dot = that sum, in double).
RS_HOST_DEVICE float rms_backward_k(double dot, float rstd, int d) {
  return static_cast<float>(dot) * rstd * rstd * rstd / d;
}

// LayerNorm (exec/cpu/layernorm.cpp), with xc = x − mean (mean rounded to
// float, as the CPU kernel does) and r = rms_rstd(Σ (x − mean)², d, eps):
// y = xc r g; backward dx = r (dy g − a − xc r b), a = mean(dy g), b = mean(dy g xc r).
RS_HOST_DEVICE float layernorm_y(float xc, float r, float gain) { return xc * r * gain; }
RS_HOST_DEVICE float layernorm_dx(float dy, float gain, float xc, float r, float a, float b) {
  return r * (dy * gain - a - xc * r * b);
}

// Gated norm (exec/kernels.h, gated_norm_*): g = σ(b), y = x g; backward
// db = dy x g (1 − g) (the gate's pre-activation), dx = dy g (the direct path).
RS_HOST_DEVICE void gated_norm_grad(float dy, float x, float g, float* db, float* dx) {
  *db = dy * x * g * (1.0f - g);
  *dx = dy * g;
}

// A router's unnormalised affinity of one expert (exec/cpu/balancing.cpp):
// exp(l − max) for softmax, σ(l) for sigmoid, in double; p_e = s_e / Σ s.
RS_HOST_DEVICE double router_affinity(float l, double row_max, bool softmax) {
  return softmax ? exp(static_cast<double>(l) - row_max) : 1.0 / (1.0 + exp(-static_cast<double>(l)));
}
// d(aux loss)/d l_j = c dp (f_j − Σ_e f_e p_e), c = weight E / N, with
// dp = p_j (softmax) or s_j (1 − s_j) / S (sigmoid).
RS_HOST_DEVICE float aux_loss_dlogit(double s, double S, double f, double fp, double c, bool softmax) {
  const double dp = softmax ? s / S : s * (1.0 - s) / S;
  return static_cast<float>(c * dp * (f - fp));
}

// The router's choices per token: k + 1 of them (the k experts and the threshold's) kept in registers.
constexpr int kMaxTopK = 31;

// One token's routing (exec/cpu/moe.cpp, router_forward): the k experts of the
// best biased scores l_e + bias_e, best first, ties to the lower id; the
// threshold, the (k+1)-th best biased score (−∞ when k = E); the weights from
// the unbiased logits, σ(l) or exp(l − the best chosen l), scaled to sum to
// weight_sum. A repeated arg-max over min(k + 1, E) choices (strict >: the
// lower id wins a tie), which orders them as the CPU's partial sort does.
// Needs 1 ≤ k ≤ min(E, kMaxTopK); l, bias: (E); expert, weight: (k).
RS_HOST_DEVICE void router_token(const float* l, const float* bias, int E, int k, bool softmax, float weight_sum,
                                 int32_t* expert, float* weight, float* threshold) {
  const int pick = k + 1 < E ? k + 1 : E;
  int chosen[kMaxTopK + 1];
  for (int j = 0; j < pick; ++j) {
    int best = -1;
    float best_score = 0.0f;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int m = 0; m < j; ++m) taken |= chosen[m] == e;
      if (taken) continue;
      const float s = l[e] + (bias ? bias[e] : 0.0f);
      if (best < 0 || s > best_score) {
        best = e;
        best_score = s;
      }
    }
    chosen[j] = best;
  }
  *threshold = k < E ? l[chosen[k]] + (bias ? bias[chosen[k]] : 0.0f) : -INFINITY;
  const float shift = softmax ? l[chosen[0]] : 0.0f;
  double sum = 0.0;
  for (int j = 0; j < k; ++j) {
    const float lj = l[chosen[j]];
    const float u = softmax ? expf(lj - shift) : sigmoid(lj);
    weight[j] = u;
    sum += u;
  }
  const float norm = static_cast<float>(weight_sum / sum);
  for (int j = 0; j < k; ++j) {
    weight[j] *= norm;
    expert[j] = chosen[j];
  }
}

// Quantile balancing (exec/cpu/moe.cpp, qb_histogram / qb_bias_from_histogram).
// A logit's bin among n_bins of 1/per_unit from lo, the edge bins taking what lies beyond.
RS_HOST_DEVICE int qb_bin(float logit, float lo, double per_unit, int n_bins) {
  const double pos = (logit - lo) * per_unit;
  const long bin = static_cast<long>(floor(pos));
  return static_cast<int>(bin < 0 ? 0 : (bin > n_bins - 1 ? n_bins - 1 : bin));
}
// One expert's selection bias from its histogram ce (n_bins bins of `width` from lo): minus the
// logit below which a fraction 1 − k/E of its counts lie, linear inside its bin; 0 for an empty one.
RS_HOST_DEVICE float qb_bias(const int64_t* ce, int n_bins, int k, int E, float lo, double width) {
  const double level = 1.0 - static_cast<double>(k) / E;
  int64_t total = 0;
  for (int b = 0; b < n_bins; ++b) total += ce[b];
  if (total == 0) return 0.0f;
  const double target = level * static_cast<double>(total);
  double below = 0.0;
  int b = 0;
  while (b < n_bins - 1 && below + static_cast<double>(ce[b]) < target) below += static_cast<double>(ce[b++]);
  const double frac = ce[b] > 0 ? (target - below) / static_cast<double>(ce[b]) : 0.0;
  const double q = lo + (b + (frac < 0.0 ? 0.0 : (frac > 1.0 ? 1.0 : frac))) * width;
  return static_cast<float>(-q);
}

// Partial RoPE, NeoX pairing: pair i < rot/2 of a head rotates by pos · θ^(−2i/rot).
// The angle is formed in double: at 16k positions a float angle is off by ~1e-3 rad.
RS_HOST_DEVICE double rope_angle(int pos, int i, int rot_dims, float theta) {
  return static_cast<double>(pos) * pow(static_cast<double>(theta), -2.0 * i / rot_dims);
}
// YaRN (Peng et al. 2023; HF transformers _compute_yarn_parameters), as
// exec/cpu/rope.cpp: the pair index at which a frequency turns `rotations` times
// over L positions, d ln(L / (2π rotations)) / (2 ln θ).
RS_HOST_DEVICE double yarn_correction_dim(double rotations, int rot_dims, float theta, double L) {
  return rot_dims * log(L / (rotations * 2.0 * M_PI)) / (2.0 * log(static_cast<double>(theta)));
}
// The ramp's ends (low from beta_fast, high from beta_slow), clamped to the pairs.
RS_HOST_DEVICE void yarn_ramp_ends(int rot_dims, float theta, double L, double beta_fast, double beta_slow,
                                   bool truncate, double* low, double* high) {
  double lo = yarn_correction_dim(beta_fast, rot_dims, theta, L);
  double hi = yarn_correction_dim(beta_slow, rot_dims, theta, L);
  if (truncate) {
    lo = floor(lo);
    hi = ceil(hi);
  }
  lo = lo > 0.0 ? lo : 0.0;
  hi = hi < rot_dims - 1.0 ? hi : rot_dims - 1.0;
  if (lo == hi) hi += 0.001;  // HF's guard against a zero-width ramp
  *low = lo;
  *high = hi;
}
// Pair i's angle under YaRN: θ^(−2i/d) kept below low, divided by factor above high,
// blended linearly between.
RS_HOST_DEVICE double rope_angle_yarn(int pos, int i, int rot_dims, float theta, double factor, double low,
                                      double high) {
  const double inv_freq = pow(static_cast<double>(theta), -2.0 * i / rot_dims);
  double ramp = (static_cast<double>(i) - low) / (high - low);
  ramp = ramp < 0.0 ? 0.0 : (ramp > 1.0 ? 1.0 : ramp);
  return static_cast<double>(pos) * (inv_freq / factor * ramp + inv_freq * (1.0 - ramp));
}
// YaRN's attention factor on cos and sin, 0.1 ln(factor) + 1 (HF get_mscale; 1 at factor 1).
RS_HOST_DEVICE double yarn_scale(double factor) { return factor > 1.0 ? 0.1 * log(factor) + 1.0 : 1.0; }

// sign +1 rotates forward, −1 applies Rᵀ (the backward); cos and sin times scale (YaRN).
RS_HOST_DEVICE void rope_rotate(float x1, float x2, double angle, float sign, float* y1, float* y2,
                                double scale = 1.0) {
  const float c = static_cast<float>(scale * cos(angle));
  const float s = sign * static_cast<float>(scale * sin(angle));
  *y1 = x1 * c - x2 * s;
  *y2 = x2 * c + x1 * s;
}

// Attention visibility (exec/kernels.h, attention_forward): key j is visible to
// query i of the same sequence iff j ≤ i, i − window < j when window > 0, and
// both tokens are in one document when documents are given (doc_i == doc_j).
RS_HOST_DEVICE bool attention_visible(int i, int j, int window, int doc_i, int doc_j) {
  return j <= i && (window <= 0 || i - window < j) && doc_i == doc_j;
}
// The kv head query head h reads: GQA groups of H / kv_used query heads.
RS_HOST_DEVICE int kv_head_of(int h, int H, int kv_used) { return h / (H / kv_used); }

// ALiBi (Press et al. 2022, "Train Short, Test Long", §3): the score of query i
// against key j (positions in the sequence, j ≤ i) is the scaled q·k minus the
// head's slope times their distance; the slope is models::alibi_slopes(H)[h]
// rounded to float. Written as exec/cpu/attention.cpp writes it (the distance
// converted to float, then one product and one subtraction), forward and backward.
RS_HOST_DEVICE float alibi_score(float scaled_qk, float slope, int i, int j) {
  return scaled_qk - slope * static_cast<float>(i - j);
}

// Online softmax (Milakov & Gimelshein 2018, "Online normalizer calculation
// for softmax") of one attention query row, as exec/cuda/attention.cu runs it:
// the running max *m (−∞ before the first score) and sum *l take score s.
// Returns s's weight exp(s − new max); *corr = exp(old max − new max) rescales
// what was accumulated before. A sink logit (gpt-oss) is one more score with no value.
RS_HOST_DEVICE float online_softmax_add(float s, float* m, float* l, float* corr) {
  const float m_new = fmaxf(*m, s);
  *corr = expf(*m - m_new);
  const float p = expf(s - m_new);
  *l = *l * *corr + p;
  *m = m_new;
  return p;
}
// One query row's share of its head's sink gradient: −P_sink δ = −exp(sink − lse) δ,
// δ = dO·O (exec/cpu/attention.cpp, attention_backward).
RS_HOST_DEVICE double sink_grad_term(float sink, float lse, float delta) {
  return -static_cast<double>(expf(sink - lse)) * delta;
}

// Adam moments of one element (exec/optim.cpp): m ← β1 m + (1−β1) g, v ← β2 v + (1−β2) g².
RS_HOST_DEVICE void adam_moments(float g, float b1, float b2, float* m, float* v) {
  *m = b1 * *m + (1 - b1) * g;
  *v = b2 * *v + (1 - b2) * g * g;
}
// The bias-corrected Adam direction; c1, c2 = 1/(1 − β^t).
RS_HOST_DEVICE float adam_direction(float m, float v, float c1, float c2, float eps) {
  return (m * c1) / (sqrtf(v * c2) + eps);
}
// Plain Adam's new weight, associated as exec/optim.cpp writes it (lr·(m c1)
// first, then the division), so fp32 results agree bitwise.
RS_HOST_DEVICE float adam_weight(float w, float m, float v, float lr, float c1, float c2, float eps, float decay) {
  return w - (lr * (m * c1) / (sqrtf(v * c2) + eps) + decay * w);
}
// Muon momentum with Nesterov look-ahead: m ← β1 m + (1−β1) g; returns u = (1−β1) g + β1 m.
RS_HOST_DEVICE float muon_momentum(float g, float b1, float* m) {
  *m = b1 * *m + (1 - b1) * g;
  return (1 - b1) * g + b1 * *m;
}

}  // namespace rackstep::exec::cuda
