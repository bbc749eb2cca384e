// RMSNorm (with gain, and the non-parametric QK-norm variant with a fixed
// multiplier) and the gated norm x * sigmoid(silu(x·W_down)·W_up).
#include <cmath>
#include <vector>

#include "exec/cpu/kernel_util.h"
#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {
namespace {

// y = x * rstd * (gain ? gain : 1) * multiplier, one row per iteration.
void rmsnorm_rows(float* y, float* rstd, const float* x, const float* gain, float multiplier,
                  float eps, long rows, int d) {
#pragma omp parallel for schedule(static)
  for (long n = 0; n < rows; ++n) {
    const float* xr = x + n * d;
    double ss = 0.0;
    for (int i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    rstd[n] = r;
    float* yr = y + n * d;
    const float s = r * multiplier;
    for (int i = 0; i < d; ++i) yr[i] = xr[i] * s * (gain ? gain[i] : 1.0f);
  }
}

// y_i = x_i r c_i with r = (mean x² + eps)^-1/2 and c = gain * multiplier:
// dx_i = r c_i dy_i - x_i r³/d Σ_j dy_j c_j x_j.
void rmsnorm_rows_backward(float* dx, const float* dy, const float* x, const float* rstd,
                           const float* gain, float multiplier, long rows, int d) {
#pragma omp parallel for schedule(static)
  for (long n = 0; n < rows; ++n) {
    const float* xr = x + n * d;
    const float* dyr = dy + n * d;
    const float r = rstd[n];
    double dot = 0.0;
    for (int i = 0; i < d; ++i)
      dot += static_cast<double>(dyr[i]) * (gain ? gain[i] : 1.0f) * multiplier * xr[i];
    const float k = static_cast<float>(dot) * r * r * r / d;
    float* dxr = dx + n * d;
    for (int i = 0; i < d; ++i)
      dxr[i] = r * (gain ? gain[i] : 1.0f) * multiplier * dyr[i] - xr[i] * k;
  }
}

}  // namespace

void rmsnorm_forward(float* y, float* rstd, const float* x, const float* gain, float eps,
                     int N, int d) {
  RS_CHECK(gain != nullptr, "rmsnorm_forward: gain required (use rmsnorm_noparam_forward)");
  rmsnorm_rows(y, rstd, x, gain, 1.0f, eps, N, d);
}

void rmsnorm_backward(float* dx, float* dgain, const float* dy, const float* x,
                      const float* rstd, const float* gain, int N, int d) {
  RS_CHECK(dx != x, "rmsnorm_backward: dx must not alias x");
  // dgain first, so that dx may alias dy.
  detail::reduce_rows(dgain, static_cast<size_t>(d), N, [&](double* acc, long n) {
    const float* xr = x + n * d;
    const float* dyr = dy + n * d;
    const float r = rstd[n];
    for (int i = 0; i < d; ++i) acc[i] += static_cast<double>(dyr[i]) * xr[i] * r;
  });
  rmsnorm_rows_backward(dx, dy, x, rstd, gain, 1.0f, N, d);
}

void rmsnorm_noparam_forward(float* y, float* rstd, const float* x, float multiplier, float eps,
                             int rows, int d) {
  rmsnorm_rows(y, rstd, x, nullptr, multiplier, eps, rows, d);
}

void rmsnorm_noparam_backward(float* dx, const float* dy, const float* x, const float* rstd,
                              float multiplier, int rows, int d) {
  RS_CHECK(dx != x, "rmsnorm_noparam_backward: dx must not alias x");
  rmsnorm_rows_backward(dx, dy, x, rstd, nullptr, multiplier, rows, d);
}

void gated_norm_forward(float* y, float* a, float* g, const float* x, const float* w_down,
                        const float* w_up, int N, int d, int r) {
  const size_t nd = static_cast<size_t>(N) * d;
  const size_t nr = static_cast<size_t>(N) * r;
  linear_forward(a, x, w_down, nullptr, N, d, r);
  std::vector<float> s(nr);  // (N, r) silu(a), not kept: backward recomputes it
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < nr; ++i) s[i] = detail::siluf(a[i]);
  linear_forward(g, s.data(), w_up, nullptr, N, r, d);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < nd; ++i) {
    g[i] = detail::sigmoidf(g[i]);
    y[i] = x[i] * g[i];
  }
}

size_t gated_norm_scratch_floats(int N, int d, int r) {
  return static_cast<size_t>(N) * d + 2 * static_cast<size_t>(N) * r;
}

void gated_norm_backward(float* dx, float* dw_down, float* dw_up, const float* dy,
                         const float* x, const float* a, const float* g, const float* w_down,
                         const float* w_up, float* scratch, int N, int d, int r) {
  const size_t nd = static_cast<size_t>(N) * d;
  const size_t nr = static_cast<size_t>(N) * r;
  float* db = scratch;        // (N, d) grad of the gate pre-activation b = s·W_up
  float* s = db + nd;         // (N, r) silu(a)
  float* ds = s + nr;         // (N, r) grad of s, then of a
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < nd; ++i) {
    db[i] = dy[i] * x[i] * g[i] * (1.0f - g[i]);
    dx[i] = dy[i] * g[i];  // the direct path y = x * g
  }
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < nr; ++i) s[i] = detail::siluf(a[i]);
  linear_backward(ds, dw_up, nullptr, db, s, w_up, N, r, d);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < nr; ++i) ds[i] *= detail::silu_gradf(a[i]);
  linear_backward(dx, dw_down, nullptr, ds, x, w_down, N, d, r, /*accumulate_dx=*/true);
}

}  // namespace rackstep::exec
