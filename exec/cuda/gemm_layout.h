// The column-major problem cuBLASLt (and cuBLAS's grouped call) is given for
// one row-major GEMM of the CUDA backend's engine (exec/cuda/gemm.h): C (m, n)
// = op(A)·op(B), A (m, k) or stored (k, m) when trans_a, B (k, n) or stored
// (n, k) when trans_b, all row-major and dense. A row-major (r, c) matrix is a
// column-major (c, r) one, so the engine asks for Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLAS's
// first operand is our B, its second our A, m and n swap, and each operand
// keeps its own transpose flag (cuBLAS's layouts describe a matrix as stored,
// before its transpose). Host code, no CUDA headers: tests/cuda_host_gemm_layout.cpp
// multiplies through this description on the CPU against row-major products.
//
//   const ColumnMajorGemm g = column_major_gemm(m, n, k, trans_a, trans_b);
//   cublasLtMatrixLayoutCreate(&first, type, g.first.rows, g.first.cols, g.first.ld);  // our B
#pragma once

#include <cstdint>

namespace rackstep::exec::cuda {

// One operand as stored, column-major: element (r, c) at r + c·ld.
struct ColumnMajorOperand {
  int64_t rows = 0, cols = 0, ld = 0;
  bool trans = false;  // cuBLAS applies op T to it
};

// cuBLAS's C (m, n) = op(first) (m, k) · op(second) (k, n), C's element (i, j) at i + j·ldc.
struct ColumnMajorGemm {
  int64_t m = 0, n = 0, k = 0;
  ColumnMajorOperand first;   // our B
  ColumnMajorOperand second;  // our A
  int64_t ldc = 0;
};

inline ColumnMajorGemm column_major_gemm(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  ColumnMajorGemm g;
  g.m = n;
  g.n = m;
  g.k = k;
  // Our B stored row-major (k, n) is column-major (n, k), ld n; stored (n, k) it is (k, n), ld k.
  g.first = {trans_b ? k : n, trans_b ? n : k, trans_b ? k : n, trans_b};
  // Our A stored row-major (m, k) is column-major (k, m), ld k; stored (k, m) it is (m, k), ld m.
  g.second = {trans_a ? m : k, trans_a ? k : m, trans_a ? m : k, trans_a};
  g.ldc = n;  // our C row-major (m, n) is column-major (n, m)
  return g;
}

}  // namespace rackstep::exec::cuda
