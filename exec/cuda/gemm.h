// Dense GEMMs of the CUDA backend through cuBLASLt, in the row-major terms of
// exec/kernels.h: C (M, N) = op(A) · op(B) (+ C when beta = 1), A (M, K) or
// its transpose stored (K, M), B (K, N) or stored (N, K); C = alpha·op(A)·op(B)
// + beta·C in general (Newton–Schulz needs both scalars). One heuristic
// algorithm per distinct shape and type, asked once and cached (cuBLASLt's
// heuristic query costs more than a small GEMM); one workspace per handle.
//
// Types: kF32 is the parity mode (fp32 in and out, fp32 compute, TF32 off);
// kBF16 stores A, B and C in bf16 with fp32 accumulation (the hero's mix);
// kBF16F32 reads bf16 A and B and writes fp32 C (fp32 accumulation and
// output: a weight gradient accumulates into the fp32 master's arena).
//
// The bf16 mode (set_bf16_operands(true)): every fp32 run() rounds its A and
// B to bf16 first (exec/cuda/bf16_math.h, round to nearest even, into
// scratch) and multiplies them as kBF16F32, so the backend's fp32 buffers and
// call sites stay as they are; the grouped call runs per item then.
//
//   Gemm gemm(stream);
//   gemm.run({.m = N, .n = out, .k = in}, DType::kF32, y, x, w);             // y = x·W
//   gemm.run({.m = N, .n = in, .k = out, .trans_b = true}, DType::kF32, dx, dy, w);  // dx = dy·Wᵀ
//   gemm.run({.m = in, .n = out, .k = N, .trans_a = true, .beta = 1.0f},
//            DType::kF32, dw, x, dy);                                          // dW += xᵀ·dy
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace rackstep::exec::cuda {

enum class DType { kF32, kBF16, kBF16F32 };

struct GemmShape {
  int m = 0, n = 0, k = 0;   // C is (m, n); the contraction is k
  bool trans_a = false;      // A stored (k, m) and used transposed
  bool trans_b = false;      // B stored (n, k) and used transposed
  float alpha = 1.0f;        // scales op(A)·op(B)
  float beta = 0.0f;         // scales C's old contents (1: accumulate; 0: C's contents are ignored)
  // The algorithm depends on shape and transposes only; the scalars are run-time arguments.
  auto key() const { return std::make_tuple(m, n, k, trans_a, trans_b); }
};

// One GEMM of a grouped call: C (m, n) = op(A)·op(B), row-major as above.
struct GemmItem {
  int m = 0, n = 0, k = 0;
  void* c = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
};

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream, size_t workspace_bytes = size_t(32) << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // c, a, b are device pointers of `type` (float or __nv_bfloat16).
  void run(const GemmShape& shape, DType type, void* c, const void* a, const void* b);
  // Independent GEMMs of one type, transposes and scalars in one launch
  // (cublasGemmGroupedBatchedEx, one group per item): the routed experts,
  // whose shapes differ in m only. Items with m == 0 are skipped.
  void run_grouped(const std::vector<GemmItem>& items, bool trans_a, bool trans_b, float alpha, float beta,
                   DType type);
  // The bf16 mode: fp32 runs take bf16-rounded operands, accumulate and write fp32.
  void set_bf16_operands(bool on) { bf16_operands_ = on; }
  bool bf16_operands() const { return bf16_operands_; }
  // The stream every GEMM of this object is enqueued on.
  cudaStream_t stream() const { return stream_; }
  // How many distinct shapes (and operand alignments) have a cached algorithm (for tests and the profiler).
  size_t cached_plans() const { return plans_.size(); }

 private:
  struct Plan;
  // align: the operands' alignments (exec/cuda/gemm_align.h): our A, our B, C.
  const Plan& plan_for(const GemmShape& shape, DType type, const uint32_t (&align)[3]);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  // (m, n, k, trans_a, trans_b, type, alignment of A, B, C): an algorithm holds for its operands' alignment.
  std::map<std::tuple<int, int, int, bool, bool, int, uint32_t, uint32_t, uint32_t>, Plan*> plans_;
  cublasHandle_t blas_ = nullptr;  // the grouped path (created at its first use)
  void** pointers_ = nullptr;      // (3, capacity) device arrays of the grouped call's A, B, C
  size_t pointer_capacity_ = 0;
  bool bf16_operands_ = false;
  void* operands16_ = nullptr;     // the bf16 mode's rounded A then B (bf16), grown on demand
  size_t operands16_bytes_ = 0;
};

}  // namespace rackstep::exec::cuda
