// Row-major GEMM on column-major cuBLASLt: C = op(A)·op(B) in row-major is
// Cᵀ = op(B)ᵀ·op(A)ᵀ in column-major (exec/cuda/gemm_layout.h, proven on the CPU).
#include "exec/cuda/gemm.h"

#include <cuda_bf16.h>

#include <string>
#include <utility>

#include "exec/cuda/check.h"
#include "exec/cuda/gemm_align.h"
#include "exec/cuda/gemm_layout.h"
#include "exec/cuda/memory.h"
#include "exec/cuda/ops.h"
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
  device_malloc(&workspace_, workspace_bytes_);
}

Gemm::~Gemm() {
  for (auto& [key, plan] : plans_) delete plan;
  device_free(pointers_);
  device_free(operands16_);
  if (blas_) cublasDestroy(blas_);
  device_free(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

const Gemm::Plan& Gemm::plan_for(const GemmShape& s, DType type, const uint32_t (&align)[3]) {
  const auto key = std::tuple_cat(s.key(), std::make_tuple(static_cast<int>(type), align[0], align[1], align[2]));
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;

  RS_CHECK(s.m > 0 && s.n > 0 && s.k > 0, "gemm: every dimension must be positive");
  const cudaDataType_t data = type == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;   // A and B
  const cudaDataType_t out = type == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;   // C
  // fp32 compute either way; CUBLAS_COMPUTE_32F never uses TF32 (the parity mode needs that).
  auto* plan = new Plan;
  RS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's first operand is our B, its second our A (exec/cuda/gemm_layout.h).
  const ColumnMajorGemm g = column_major_gemm(s.m, s.n, s.k, s.trans_a, s.trans_b);
  const cublasOperation_t op_first = g.first.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.second.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  RS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  RS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  const auto layout = [](cublasLtMatrixLayout_t* l, cudaDataType_t element, int64_t rows, int64_t cols, int64_t ld) {
    RS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(l, element, uint64_t(rows), uint64_t(cols), ld));
  };
  layout(&plan->a, data, g.first.rows, g.first.cols, g.first.ld);
  layout(&plan->b, data, g.second.rows, g.second.cols, g.second.ld);
  layout(&plan->c, out, g.m, g.n, g.ldc);

  cublasLtMatmulPreference_t pref = nullptr;
  RS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  RS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes_, sizeof(workspace_bytes_)));
  // The operands' alignments (cuBLASLt's A is our B, its B our A; C is D): the default
  // assumes 256 bytes, and an operand that starts mid-buffer is not (exec/cuda/gemm_align.h).
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[1]},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[0]},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]}};
  for (const auto& [attribute, bytes] : alignments) {
    RS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof(bytes)));
  }
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
  if (bf16_operands_ && type == DType::kF32) {  // the bf16 mode: round A and B, keep C fp32
    const size_t na = size_t(s.m) * size_t(s.k), nb = size_t(s.k) * size_t(s.n);
    // B's copy starts on a 256-byte boundary (128 bf16): at A's end it could be 2-byte aligned, which
    // leaves cuBLASLt only its slowest kernels (exec/cuda/gemm_align.h).
    const size_t b_at = (na + 127) / 128 * 128;
    const size_t bytes = (b_at + nb) * sizeof(__nv_bfloat16);
    if (bytes > operands16_bytes_) {
      device_free_async(operands16_, stream_);
      device_malloc_async(&operands16_, bytes, stream_);
      operands16_bytes_ = bytes;
    }
    auto* a16 = static_cast<__nv_bfloat16*>(operands16_);
    __nv_bfloat16* b16 = a16 + b_at;
    to_bf16(a16, static_cast<const float*>(a), na, stream_);
    to_bf16(b16, static_cast<const float*>(b), nb, stream_);
    a = a16;
    b = b16;
    type = DType::kBF16F32;
  }
  const uint32_t align[3] = {gemm_alignment_bytes(reinterpret_cast<uintptr_t>(a)),
                             gemm_alignment_bytes(reinterpret_cast<uintptr_t>(b)),
                             gemm_alignment_bytes(reinterpret_cast<uintptr_t>(c))};
  const Plan& plan = plan_for(s, type, align);
  RS_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.op, &s.alpha, b, plan.a, a, plan.b, &s.beta, c, plan.c, c, plan.c,
                                 &plan.algo, workspace_, workspace_bytes_, stream_));
}

// The same row-major → column-major swap as run() (exec/cuda/gemm_layout.h):
// cuBLAS's A is our B (m and n swapped), each with its own transpose flag and
// the leading dimension of its stored row-major rows.
void Gemm::run_grouped(const std::vector<GemmItem>& items, bool trans_a, bool trans_b, float alpha, float beta,
                       DType type) {
  if (bf16_operands_ && type == DType::kF32) {  // each item through run()'s rounding
    for (const GemmItem& it : items) {
      if (it.m == 0) continue;
      run({.m = it.m, .n = it.n, .k = it.k, .trans_a = trans_a, .trans_b = trans_b, .alpha = alpha, .beta = beta},
          type, it.c, it.a, it.b);
    }
    return;
  }
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<const void*> a_ptr, b_ptr;
  std::vector<void*> c_ptr;
  for (const GemmItem& it : items) {
    if (it.m == 0) continue;
    RS_CHECK(it.m > 0 && it.n > 0 && it.k > 0, "gemm: every dimension must be positive");
    const ColumnMajorGemm g = column_major_gemm(it.m, it.n, it.k, trans_a, trans_b);
    m.push_back(static_cast<int>(g.m));
    n.push_back(static_cast<int>(g.n));
    k.push_back(static_cast<int>(g.k));
    lda.push_back(static_cast<int>(g.first.ld));  // our B
    ldb.push_back(static_cast<int>(g.second.ld));  // our A
    ldc.push_back(static_cast<int>(g.ldc));
    size.push_back(1);
    a_ptr.push_back(it.b);
    b_ptr.push_back(it.a);
    c_ptr.push_back(it.c);
  }
  const size_t groups = m.size();
  if (groups == 0) return;
  if (!blas_) {
    RS_CUBLAS_CHECK(cublasCreate(&blas_));
    RS_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    RS_CUBLAS_CHECK(cublasSetWorkspace(blas_, workspace_, workspace_bytes_));
  }
  if (groups > pointer_capacity_) {
    device_free_async(pointers_, stream_);
    device_malloc_async(&pointers_, 3 * groups * sizeof(void*), stream_);
    pointer_capacity_ = groups;
  }
  // Pageable host → device copies are staged before cudaMemcpyAsync returns: the vectors may go.
  RS_CUDA_CHECK(cudaMemcpyAsync(pointers_, a_ptr.data(), groups * sizeof(void*), cudaMemcpyHostToDevice, stream_));
  RS_CUDA_CHECK(cudaMemcpyAsync(pointers_ + groups, b_ptr.data(), groups * sizeof(void*), cudaMemcpyHostToDevice,
                                stream_));
  RS_CUDA_CHECK(cudaMemcpyAsync(pointers_ + 2 * groups, c_ptr.data(), groups * sizeof(void*), cudaMemcpyHostToDevice,
                                stream_));
  const std::vector<cublasOperation_t> op_a(groups, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N),
      op_b(groups, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
  const std::vector<float> alphas(groups, alpha), betas(groups, beta);
  const cudaDataType_t data = type == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  const cudaDataType_t out = type == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  RS_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
      blas_, op_a.data(), op_b.data(), m.data(), n.data(), k.data(), alphas.data(),
      const_cast<const void* const*>(pointers_), data, lda.data(), const_cast<const void* const*>(pointers_ + groups),
      data, ldb.data(), betas.data(), pointers_ + 2 * groups, out, ldc.data(), static_cast<int>(groups), size.data(),
      CUBLAS_COMPUTE_32F));
}

}  // namespace rackstep::exec::cuda
