// The alignment the CUDA backend's GEMM engine tells cuBLASLt about each
// operand (exec/cuda/gemm_align.h), on the CPU: an operand one float into an
// allocation is 4-byte aligned, not the 256 bytes cuBLASLt's heuristic assumes
// by default, and the algorithm cache keys on it.
#include <catch2/catch.hpp>

#include <cstdint>

#include "exec/cuda/gemm_align.h"

using namespace rackstep::exec::cuda;

TEST_CASE("gemm alignment: the largest power of two up to 256 dividing the address", "[cuda_host][gemm]") {
  CHECK(gemm_alignment_bytes(0) == 256);
  CHECK(gemm_alignment_bytes(0x7f0000000000) == 256);   // a fresh cudaMalloc: 256-byte aligned or more
  CHECK(gemm_alignment_bytes(0x7f0000000000 + 4) == 4);  // one float in (the experts' rows at r0 · L)
  CHECK(gemm_alignment_bytes(0x7f0000000000 + 2) == 2);  // one bf16 in
  CHECK(gemm_alignment_bytes(0x7f0000000000 + 48) == 16);
  CHECK(gemm_alignment_bytes(0x7f0000000000 + 128) == 128);
  CHECK(gemm_alignment_bytes(0x7f0000000000 + 512) == 256);  // capped at cuBLASLt's default
  CHECK(gemm_alignment_bytes(1) == 1);
}

TEST_CASE("gemm alignment: rows of a row-major float buffer", "[cuda_host][gemm]") {
  // Expert e's rows start at r0 · width floats: the alignment falls with r0 · width · 4 bytes.
  const uintptr_t base = 0x7f0000000000;
  const int width = 40;  // 160 bytes a row
  CHECK(gemm_alignment_bytes(base + uintptr_t(17) * width * 4) == 32);  // 2720 = 85 · 32
  CHECK(gemm_alignment_bytes(base + uintptr_t(16) * width * 4) == 256);  // 2560 = 10 · 256
  CHECK(gemm_alignment_bytes(base + uintptr_t(1) * width * 4) == 32);
}
