// The CUDA backend's GEMM mapping (exec/cuda/gemm_layout.h) on the CPU: a
// column-major GEMM that reads its operands exactly as cuBLAS is told to
// (layouts as stored, leading dimensions, transposes, m and n swapped) must
// give the row-major product exec/cuda/gemm.h promises, in every orientation
// the backend runs (y = x·W, dx = dy·Wᵀ, dW += xᵀ·dy, Newton–Schulz's X·Xᵀ).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "exec/cuda/gemm_layout.h"

using namespace rackstep::exec::cuda;

namespace {

// op(X)(i, l) of a column-major operand as stored.
double element(const ColumnMajorOperand& x, const std::vector<double>& data, int64_t i, int64_t l) {
  const int64_t r = x.trans ? l : i, c = x.trans ? i : l;
  REQUIRE(r < x.rows);
  REQUIRE(c < x.cols);
  return data[size_t(r + c * x.ld)];
}

// C (m, n) = α op(first)·op(second) + β C, column-major, as cuBLAS defines it.
void column_major_product(const ColumnMajorGemm& g, const std::vector<double>& first,
                          const std::vector<double>& second, std::vector<double>& c, double alpha, double beta) {
  for (int64_t i = 0; i < g.m; ++i)
    for (int64_t j = 0; j < g.n; ++j) {
      double sum = 0.0;
      for (int64_t l = 0; l < g.k; ++l) sum += element(g.first, first, i, l) * element(g.second, second, l, j);
      double& cij = c[size_t(i + j * g.ldc)];
      cij = alpha * sum + beta * cij;
    }
}

// Small integers: every product and sum is exact.
std::vector<double> values(size_t n, int seed) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = double(int((i * 7 + size_t(seed) * 13) % 11) - 5);
  return v;
}

}  // namespace

TEST_CASE("gemm layout: cuBLAS's column-major problem is the row-major GEMM in every orientation",
          "[cuda_host][gemm]") {
  const int64_t m = 5, n = 3, k = 4;  // all different: a swapped dimension or leading dimension shows
  for (const bool trans_a : {false, true})
  for (const bool trans_b : {false, true}) {
    INFO("trans_a " << trans_a << ", trans_b " << trans_b);
    // Row-major storage: A (m, k) or (k, m), B (k, n) or (n, k), C (m, n).
    const auto a = values(size_t(m * k), 1), b = values(size_t(k * n), 2), c0 = values(size_t(m * n), 3);
    const auto A = [&](int64_t i, int64_t l) { return trans_a ? a[size_t(l * m + i)] : a[size_t(i * k + l)]; };
    const auto B = [&](int64_t l, int64_t j) { return trans_b ? b[size_t(j * k + l)] : b[size_t(l * n + j)]; };
    const double alpha = 2.0, beta = 1.0;  // Newton–Schulz's scalars and the weight gradients' "+="
    std::vector<double> want = c0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0.0;
        for (int64_t l = 0; l < k; ++l) sum += A(i, l) * B(l, j);
        want[size_t(i * n + j)] = alpha * sum + beta * c0[size_t(i * n + j)];
      }

    const ColumnMajorGemm g = column_major_gemm(m, n, k, trans_a, trans_b);
    // Each stored operand is exactly its buffer: rows · cols elements, dense columns.
    CHECK(g.first.rows * g.first.cols == k * n);
    CHECK(g.second.rows * g.second.cols == m * k);
    CHECK(g.first.ld == g.first.rows);
    CHECK(g.second.ld == g.second.rows);
    CHECK(g.m * g.n == m * n);
    CHECK(g.ldc == g.m);
    std::vector<double> got = c0;
    column_major_product(g, b, a, got, alpha, beta);  // cuBLAS's first operand is our B
    CHECK(got == want);
  }
}
