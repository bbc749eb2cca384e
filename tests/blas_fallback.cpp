// exec/cpu/blas_fallback/ (the GEMM used where OpenBLAS is absent, as on the GPU
// machine) against OpenBLAS, for every transpose pair, both storage orders,
// padded leading dimensions and alpha/beta. The fallback is compiled here under
// another name (see tests/CMakeLists.txt) so both can live in one binary.
#include <catch2/catch.hpp>

#include <cblas.h>

#include <cmath>
#include <random>
#include <vector>

extern "C" void rackstep_fallback_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                                        const float* a, int lda, const float* b, int ldb, float beta, float* c,
                                        int ldc);

TEST_CASE("the portable GEMM equals OpenBLAS for every transpose, order and leading dimension", "[blas]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  const int m = 13, n = 17, k = 11, pad = 3;
  for (CBLAS_ORDER order : {CblasRowMajor, CblasColMajor})
    for (CBLAS_TRANSPOSE ta : {CblasNoTrans, CblasTrans})
      for (CBLAS_TRANSPOSE tb : {CblasNoTrans, CblasTrans}) {
        // Stored shapes in the storage order: rows x cols with ld = cols + pad (row-major).
        const bool row = order == CblasRowMajor;
        const int a_rows = (ta == CblasNoTrans) == row ? m : k, a_cols = (ta == CblasNoTrans) == row ? k : m;
        const int b_rows = (tb == CblasNoTrans) == row ? k : n, b_cols = (tb == CblasNoTrans) == row ? n : k;
        const int c_rows = row ? m : n, c_cols = row ? n : m;
        const int lda = a_cols + pad, ldb = b_cols + pad, ldc = c_cols + pad;
        std::vector<float> a(size_t(a_rows) * lda), b(size_t(b_rows) * ldb), c0(size_t(c_rows) * ldc);
        for (float& x : a) x = dist(rng);
        for (float& x : b) x = dist(rng);
        for (float& x : c0) x = dist(rng);
        for (float beta : {0.0f, 0.5f}) {
          std::vector<float> want = c0, got = c0;
          cblas_sgemm(order, ta, tb, m, n, k, 1.5f, a.data(), lda, b.data(), ldb, beta, want.data(), ldc);
          rackstep_fallback_sgemm(order, ta, tb, m, n, k, 1.5f, a.data(), lda, b.data(), ldb, beta, got.data(), ldc);
          for (int r = 0; r < c_rows; ++r)
            for (int col = 0; col < c_cols; ++col)
              REQUIRE(got[size_t(r) * ldc + col] == Approx(want[size_t(r) * ldc + col]).margin(1e-4).epsilon(1e-5));
        }
      }
}
