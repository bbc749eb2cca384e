// Residual stream and elementwise activations (SwiGLU).
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

}  // namespace rackstep::exec
