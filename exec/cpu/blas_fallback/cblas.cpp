#include "cblas.h"

#include <algorithm>
#include <vector>

namespace {

// Element (i, j) of a row-major matrix with leading dimension ld, transposed or not.
inline float at(const float* x, int ld, bool trans, int i, int j) { return trans ? x[j * ld + i] : x[i * ld + j]; }

}  // namespace

extern "C" void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE trans_a, CBLAS_TRANSPOSE trans_b, int m, int n,
                            int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                            float* c, int ldc) {
  // Column-major C = op(A) op(B) is row-major Cᵀ = op(B)ᵀ op(A)ᵀ.
  if (order == CblasColMajor) {
    cblas_sgemm(CblasRowMajor, trans_b, trans_a, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
    return;
  }
  const bool ta = trans_a != CblasNoTrans, tb = trans_b != CblasNoTrans;
#pragma omp parallel for schedule(static)
  for (int i = 0; i < m; ++i) {
    std::vector<float> row(n, 0.0f);
    for (int p = 0; p < k; ++p) {
      const float aip = at(a, lda, ta, i, p);
      if (aip == 0.0f) continue;
      if (!tb) {
        const float* brow = b + static_cast<long>(p) * ldb;
        for (int j = 0; j < n; ++j) row[j] += aip * brow[j];
      } else {
        for (int j = 0; j < n; ++j) row[j] += aip * b[static_cast<long>(j) * ldb + p];
      }
    }
    float* crow = c + static_cast<long>(i) * ldc;
    for (int j = 0; j < n; ++j) crow[j] = alpha * row[j] + (beta == 0.0f ? 0.0f : beta * crow[j]);
  }
}

extern "C" void openblas_set_num_threads(int) {}
