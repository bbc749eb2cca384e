// LayerNorm with a gain (no bias): the norm of models with norm.kind "layernorm".
#include <cmath>

#include "exec/cpu/kernel_util.h"
#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {

void layernorm_forward(float* y, float* rstd, const float* x, const float* gain, float eps, int N, int d) {
  RS_CHECK(gain != nullptr && N >= 0 && d > 0, "layernorm_forward: bad arguments");
#pragma omp parallel for schedule(static)
  for (long n = 0; n < N; ++n) {
    const float* xr = x + n * d;
    double sum = 0.0;
    for (int i = 0; i < d; ++i) sum += xr[i];
    const double mean = sum / d;
    double ss = 0.0;
    for (int i = 0; i < d; ++i) ss += (xr[i] - mean) * (xr[i] - mean);
    const float r = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    rstd[n] = r;
    const auto m = static_cast<float>(mean);
    float* yr = y + n * d;
    for (int i = 0; i < d; ++i) yr[i] = (xr[i] - m) * r * gain[i];
  }
}

// xhat = (x - mean) r, y = xhat g:
// dx = r (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) with dxhat = dy g.
void layernorm_backward(float* dx, float* dgain, const float* dy, const float* x, const float* rstd,
                        const float* gain, int N, int d) {
  RS_CHECK(dx != x, "layernorm_backward: dx must not alias x");
  auto row_mean = [d](const float* xr) {
    double sum = 0.0;
    for (int i = 0; i < d; ++i) sum += xr[i];
    return static_cast<float>(sum / d);
  };
  // dgain first, so that dx may alias dy.
  detail::reduce_rows(dgain, static_cast<size_t>(d), N, [&](double* acc, long n) {
    const float* xr = x + n * d;
    const float* dyr = dy + n * d;
    const float m = row_mean(xr), r = rstd[n];
    for (int i = 0; i < d; ++i) acc[i] += static_cast<double>(dyr[i]) * (xr[i] - m) * r;
  });
#pragma omp parallel for schedule(static)
  for (long n = 0; n < N; ++n) {
    const float* xr = x + n * d;
    const float* dyr = dy + n * d;
    const float m = row_mean(xr), r = rstd[n];
    double s1 = 0.0, s2 = 0.0;
    for (int i = 0; i < d; ++i) {
      const double g = static_cast<double>(dyr[i]) * gain[i];
      s1 += g;
      s2 += g * (xr[i] - m) * r;
    }
    const auto a = static_cast<float>(s1 / d), b = static_cast<float>(s2 / d);
    float* dxr = dx + n * d;
    for (int i = 0; i < d; ++i) dxr[i] = r * (dyr[i] * gain[i] - a - (xr[i] - m) * r * b);
  }
}

}  // namespace rackstep::exec
