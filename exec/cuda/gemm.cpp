// Row-major GEMM on column-major cuBLASLt: a row-major (r, c) matrix is a
// column-major (c, r) one, so C = op(A)·op(B) in row-major is Cᵀ = op(B)ᵀ·op(A)ᵀ
// in column-major: cuBLASLt's first operand is our B, its second our A, m and
// n swap, and each operand keeps its own transpose flag.
#include "exec/cuda/gemm.h"

#include <string>

#include "exec/cuda/check.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (= our B), B (= our A), C
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

Gemm::Gemm(cudaStream_t stream, size_t workspace_bytes) : stream_(stream), workspace_bytes_(workspace_bytes) {
  RS_CUBLAS_CHECK(cublasLtCreate(&handle_));
  RS_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Gemm::~Gemm() {
  for (auto& [key, plan] : plans_) delete plan;
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

const Gemm::Plan& Gemm::plan_for(const GemmShape& s, DType type) {
  const auto key = std::tuple_cat(s.key(), std::make_tuple(static_cast<int>(type)));
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;

  RS_CHECK(s.m > 0 && s.n > 0 && s.k > 0, "gemm: every dimension must be positive");
  const cudaDataType_t data = type == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  // fp32 compute either way; CUBLAS_COMPUTE_32F never uses TF32 (the parity mode needs that).
  auto* plan = new Plan;
  RS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's first operand is our B, used transposed when ours is.
  const cublasOperation_t op_first = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  RS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  RS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  // Column-major layouts (rows, cols, leading dimension) of the stored matrices:
  // our B stored row-major (k, n) is column-major (n, k); transposed, (k, n) is stored (n, k) row-major → (k, n).
  const uint64_t first_rows = s.trans_b ? s.k : s.n, first_cols = s.trans_b ? s.n : s.k;
  const uint64_t second_rows = s.trans_a ? s.m : s.k, second_cols = s.trans_a ? s.k : s.m;
  RS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, data, first_rows, first_cols, first_rows));
  RS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, data, second_rows, second_cols, second_rows));
  RS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, data, s.n, s.m, s.n));

  cublasLtMatmulPreference_t pref = nullptr;
  RS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  RS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes_, sizeof(workspace_bytes_)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  RS_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1,
                                                 &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  RS_CHECK(found > 0, "gemm: cuBLASLt has no algorithm for this shape and type");
  plan->algo = result.algo;
  plans_.emplace(key, plan);
  return *plan;
}

void Gemm::run(const GemmShape& s, DType type, void* c, const void* a, const void* b) {
  const Plan& plan = plan_for(s, type);
  RS_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.op, &s.alpha, b, plan.a, a, plan.b, &s.beta, c, plan.c, c, plan.c,
                                 &plan.algo, workspace_, workspace_bytes_, stream_));
}

}  // namespace rackstep::exec::cuda
