// The two OpenBLAS entry points exec/ uses, for machines without OpenBLAS (the
// GPU machine's image has no Debian packages). Only CMake's BLAS-not-found path
// puts this folder on the include path; everywhere else <cblas.h> is OpenBLAS's.
// Correct and OpenMP-parallel, but far slower than OpenBLAS: for the CPU
// reference side of the CUDA parity tests, not for training.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
typedef enum CBLAS_ORDER CBLAS_LAYOUT;
typedef int blasint;  // OpenBLAS's index type (32-bit in Debian's build)

// C = alpha op(A) op(B) + beta C, BLAS semantics (beta = 0 ignores C's contents).
void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE trans_a, enum CBLAS_TRANSPOSE trans_b, int m, int n,
                 int k, float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc);
void openblas_set_num_threads(int threads);

#ifdef __cplusplus
}
#endif
