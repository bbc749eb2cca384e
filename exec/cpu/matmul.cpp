// Linear layers through OpenBLAS: y = x·W (+ b) and its backward.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "exec/cpu/kernel_util.h"
#include "exec/kernels.h"
#include "sim/base/check.h"

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

double measure_sgemm_flops_per_s(int n, double min_seconds) {
  RS_CHECK(n > 0 && min_seconds >= 0, "measure_sgemm_flops_per_s: bad arguments");
  const size_t nn = static_cast<size_t>(n) * n;
  std::vector<float> x(nn), w(nn), y(nn);  // (n, n) each
  for (size_t i = 0; i < nn; ++i) {
    // Any finite values will do; a fixed pattern keeps the run reproducible.
    x[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
    w[i] = static_cast<float>((i * 104729) % 1000) * 1e-3f - 0.5f;
  }
  using clock = std::chrono::steady_clock;
  linear_forward(y.data(), x.data(), w.data(), nullptr, n, n, n);  // warm-up: threads, caches
  double best_s = 1e300, total_s = 0.0;
  do {
    const auto t0 = clock::now();
    linear_forward(y.data(), x.data(), w.data(), nullptr, n, n, n);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    best_s = std::min(best_s, s);
    total_s += s;
  } while (total_s < min_seconds);
  return 2.0 * n * static_cast<double>(n) * n / best_s;
}

}  // namespace rackstep::exec

namespace rackstep::exec {

void linear_t_forward(float* y, const float* x, const float* w, int N, int in, int out) {
  RS_CHECK(N >= 0 && in > 0 && out > 0, "linear_t_forward: bad shape");
  if (N == 0) return;
  // y (N, out) = x (N, in) · Wᵀ (in, out)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void linear_t_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int N, int in,
                       int out, bool accumulate_dx) {
  RS_CHECK(N >= 0 && in > 0 && out > 0, "linear_t_backward: bad shape");
  if (N == 0) return;
  if (dx) {
    // dx (N, in) = dy (N, out) · W (out, in)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, 1.0f, dy, out, w, in,
                accumulate_dx ? 1.0f : 0.0f, dx, in);
  }
  if (dw) {
    // dW (out, in) += dyᵀ (out, N) · x (N, in)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, N, 1.0f, dy, out, x, in, 1.0f, dw, in);
  }
}

}  // namespace rackstep::exec
