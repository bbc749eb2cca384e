// Residual stream and elementwise activations (SwiGLU, GeLU, ReLU²).
#include <algorithm>
#include <cmath>

#include "exec/cpu/kernel_util.h"
#include "exec/kernels.h"

namespace rackstep::exec {

void residual_forward(float* y, const float* a, const float* b, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dy, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    da[i] += dy[i];
    db[i] += dy[i];
  }
}

void add_inplace(float* dst, const float* src, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

size_t first_nonfinite(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return n;
}

void swiglu_forward(float* h, const float* a1, const float* a3, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) h[i] = detail::siluf(a1[i]) * a3[i];
}

void swiglu_backward(float* da1, float* da3, const float* dh, const float* a1,
                     const float* a3, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float g = dh[i];
    const float x = a1[i];
    da3[i] = g * detail::siluf(x);
    da1[i] = g * a3[i] * detail::silu_gradf(x);
  }
}

void swiglu_variant_forward(float* h, const float* a1, const float* a3, size_t n, const SwiGluVariant& v) {
  if (v.plain()) {
    swiglu_forward(h, a1, a3, n);
    return;
  }
  const float lim = v.limit, alpha = v.alpha, off = v.linear_offset;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float g = lim > 0.0f ? std::min(a1[i], lim) : a1[i];
    const float u = lim > 0.0f ? std::clamp(a3[i], -lim, lim) : a3[i];
    h[i] = g * detail::sigmoidf(alpha * g) * (u + off);
  }
}

// d[g σ(αg)]/dg = σ(αg) + α g σ(αg) (1 − σ(αg)).
void swiglu_variant_backward(float* da1, float* da3, const float* dh, const float* a1, const float* a3, size_t n,
                             const SwiGluVariant& v) {
  if (v.plain()) {
    swiglu_backward(da1, da3, dh, a1, a3, n);
    return;
  }
  const float lim = v.limit, alpha = v.alpha, off = v.linear_offset;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const bool clamp = lim > 0.0f;
    const float g = clamp ? std::min(a1[i], lim) : a1[i];
    const float u = clamp ? std::clamp(a3[i], -lim, lim) : a3[i];
    const float s = detail::sigmoidf(alpha * g);
    const bool g_pass = !clamp || a1[i] <= lim;
    const bool u_pass = !clamp || (a3[i] >= -lim && a3[i] <= lim);
    da3[i] = u_pass ? dh[i] * (g * s) : 0.0f;
    da1[i] = g_pass ? dh[i] * (u + off) * (s + alpha * g * s * (1.0f - s)) : 0.0f;
  }
}

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // √(2/π)
constexpr float kGeluCubic = 0.044715f;

}  // namespace

void gelu_forward(float* h, const float* a, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float x = a[i];
    h[i] = 0.5f * x * (1.0f + std::tanh(kGeluC * (x + kGeluCubic * x * x * x)));
  }
}

// gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t²) c (1 + 3·0.044715 x²), t = tanh(c (x + 0.044715 x³)).
void gelu_backward(float* da, const float* dh, const float* a, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float x = a[i];
    const float t = std::tanh(kGeluC * (x + kGeluCubic * x * x * x));
    const float grad = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluCubic * x * x);
    da[i] = dh[i] * grad;
  }
}

void relu2_forward(float* h, const float* a, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float r = a[i] > 0.0f ? a[i] : 0.0f;
    h[i] = r * r;
  }
}

void relu2_backward(float* da, const float* dh, const float* a, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) da[i] = a[i] > 0.0f ? 2.0f * a[i] * dh[i] : 0.0f;
}

}  // namespace rackstep::exec
