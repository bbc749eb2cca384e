// The operand alignment the CUDA backend's GEMM engine (exec/cuda/gemm.h)
// tells cuBLASLt's heuristic. The heuristic assumes 256-byte aligned operands
// unless told otherwise (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default
// 256: cuBLASLt's documentation of cublasLtMatmulPreferenceAttributes_t); an
// algorithm picked for aligned operands then refuses (CUBLAS_STATUS_NOT_SUPPORTED)
// or faults on an operand that starts mid-buffer, as the experts' per-expert
// rows (xs + r0 * L) and the bf16 mode's second operand do. So the alignment
// of each operand is part of the algorithm cache's key. Host code, no CUDA
// headers: tests/cuda_host_review.cpp checks it on the CPU.
//
//   gemm_alignment_bytes(reinterpret_cast<uintptr_t>(ptr));  // 4 for a float at an odd row
#pragma once

#include <cstdint>

namespace rackstep::exec::cuda {

// The largest power of two up to 256 that divides `address` (256 for 0).
constexpr uint32_t gemm_alignment_bytes(uintptr_t address) {
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace rackstep::exec::cuda
