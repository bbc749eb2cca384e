// Linear layers through OpenBLAS: y = x·W (+ b) and its backward.
#include <cblas.h>

#include "exec/cpu/kernel_util.h"
#include "exec/kernels.h"
#include "models/check.h"

namespace rackstep::exec {

void linear_forward(float* y, const float* x, const float* w, const float* bias, int N,
                    int in, int out) {
  RS_CHECK(N >= 0 && in > 0 && out > 0, "linear_forward: bad shape");
  if (N == 0) return;
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; ++n)
      for (int o = 0; o < out; ++o) y[n * out + o] = bias[o];
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, out, in, 1.0f, x, in, w, out,
              beta, y, out);
}

void linear_backward(float* dx, float* dw, float* dbias, const float* dy, const float* x,
                     const float* w, int N, int in, int out, bool accumulate_dx) {
  RS_CHECK(N >= 0 && in > 0 && out > 0, "linear_backward: bad shape");
  if (N == 0) return;
  if (dx) {
    // dx (N, in) = dy (N, out) · Wᵀ (out, in)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, in, out, 1.0f, dy, out, w, out,
                accumulate_dx ? 1.0f : 0.0f, dx, in);
  }
  if (dw) {
    // dW (in, out) += xᵀ (in, N) · dy (N, out)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, N, 1.0f, x, in, dy, out,
                1.0f, dw, out);
  }
  if (dbias) {
    detail::reduce_rows(dbias, static_cast<size_t>(out), N, [&](double* acc, long n) {
      const float* row = dy + n * out;
      for (int o = 0; o < out; ++o) acc[o] += row[o];
    });
  }
}

}  // namespace rackstep::exec
