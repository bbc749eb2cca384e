// bf16 rounding of the CUDA backend's bf16 mode, as a __host__ __device__
// function: the cast kernel (exec/cuda/elementwise.cu, to_bf16) runs it on
// the GPU and tests/cuda_host_bf16.cpp proves it on the CPU in CI, so the
// one rounding rule of the mode is tested without a device. It is
// __float2bfloat16_rn's: round to nearest, ties to even, on the fp32 bits;
// ±Inf stay, NaN stays a (quiet) NaN, finite values beyond bf16's largest
// round to ±Inf as IEEE says.
//
// bf16 keeps fp32's 8 exponent bits and 7 of its 23 mantissa bits: the
// relative rounding error is at most 2⁻⁸ (half a unit in the last place of
// 8 significant bits), the bound the bf16 parity tolerances rest on.
//
//   uint16_t b = bf16_bits(x);          // what __float2bfloat16(x) stores
//   float y = bf16_value(b);            // exact: bf16 ⊂ fp32
//   float r = bf16_round(x);            // bf16_value(bf16_bits(x))
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RS_BF16_FN __host__ __device__ __forceinline__
#else
#define RS_BF16_FN inline
#endif

namespace rackstep::exec::cuda {

// The largest relative error of one rounding to bf16 (normal range).
constexpr float kBf16RelativeRounding = 1.0f / 256.0f;  // 2⁻⁸

RS_BF16_FN uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

RS_BF16_FN float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// Round to nearest even on the 16 dropped bits: add 0x7FFF plus the kept
// part's lowest bit, then truncate (a carry into the exponent is the correct
// rounding up, to the next binade or to Inf).
RS_BF16_FN uint16_t bf16_bits(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN: keep sign and payload's top, force quiet
  }
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

RS_BF16_FN float bf16_value(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

RS_BF16_FN float bf16_round(float x) { return bf16_value(bf16_bits(x)); }

}  // namespace rackstep::exec::cuda
