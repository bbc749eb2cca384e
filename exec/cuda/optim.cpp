// Newton–Schulz and the hyperball step on the GPU, in the order of operations
// of exec/optim.cpp (same GEMMs, same scalars), so fp32 results agree to the
// rounding of the GEMMs' summation order.
#include "exec/cuda/optim.h"

#include <cmath>
#include <utility>

#include "exec/cuda/check.h"
#include "exec/cuda/detail.h"
#include "exec/optim.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {

size_t newton_schulz_work_floats(int64_t rows, int64_t cols) {
  const int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  return static_cast<size_t>(2 * r * c + 2 * r * r);
}

void newton_schulz(Gemm& gemm, const float* g, int64_t rows, int64_t cols, int steps, float* out, float* work,
                   double* sum_work) {
  const cudaStream_t stream = gemm.stream();
  RS_CHECK(rows > 0 && cols > 0, "newton_schulz: empty matrix");
  const bool transposed = rows > cols;
  const int64_t r = transposed ? cols : rows, c = transposed ? rows : cols;
  const size_t rc = static_cast<size_t>(r * c), rr = static_cast<size_t>(r * r);
  float* x = work;        // (r, c)
  float* y = x + rc;      // (r, c)
  float* a = y + rc;      // (r, r) X Xᵀ
  float* b = a + rr;      // (r, r) kNsB A + kNsC A A
  if (!transposed) {
    RS_CUDA_CHECK(cudaMemcpyAsync(x, g, sizeof(float) * rc, cudaMemcpyDeviceToDevice, stream));
  } else {
    detail::transpose(x, g, rows, cols, stream);
  }
  const auto scale = static_cast<float>(1.0 / (std::sqrt(sum_squares(x, rc, sum_work, stream)) + 1e-7));
  detail::scale(x, rc, scale, stream);
  const int ri = static_cast<int>(r), ci = static_cast<int>(c);
  for (int s = 0; s < steps; ++s) {
    gemm.run({.m = ri, .n = ri, .k = ci, .trans_b = true}, DType::kF32, a, x, x);
    gemm.run({.m = ri, .n = ri, .k = ri, .alpha = kNsC}, DType::kF32, b, a, a);
    detail::axpy(b, a, rr, kNsB, stream);
    RS_CUDA_CHECK(cudaMemcpyAsync(y, x, sizeof(float) * rc, cudaMemcpyDeviceToDevice, stream));
    gemm.run({.m = ri, .n = ci, .k = ri, .beta = kNsA}, DType::kF32, y, b, x);
    std::swap(x, y);
  }
  if (!transposed) {
    RS_CUDA_CHECK(cudaMemcpyAsync(out, x, sizeof(float) * rc, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  detail::transpose(out, x, r, c, stream);
}

void hyperball_update(float* w, const float* u, size_t n, double lr, double w0_norm, double* sum_work,
                      cudaStream_t stream) {
  const double u_norm = std::sqrt(sum_squares(u, n, sum_work, stream));
  if (u_norm > 0) detail::axpy(w, u, n, -static_cast<float>(lr * w0_norm / u_norm), stream);
  const double w_norm = std::sqrt(sum_squares(w, n, sum_work, stream));
  RS_CHECK(w_norm > 0, "hyperball step reached a zero matrix");
  detail::scale(w, n, static_cast<float>(w0_norm / w_norm), stream);
}

}  // namespace rackstep::exec::cuda
