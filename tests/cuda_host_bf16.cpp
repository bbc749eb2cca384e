// The bf16 mode's rounding (exec/cuda/bf16_math.h) on the CPU, in CI: the
// function the GPU's cast kernel runs. Round to nearest even on exact
// halfway cases, carries into the exponent, Inf and NaN, the 2⁻⁸ relative
// bound, and monotonicity over a sweep of fp32 bit patterns.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "exec/cuda/bf16_math.h"

using namespace rackstep::exec::cuda;

TEST_CASE("bf16 rounding: exact values stay, halfway cases go to even", "[cuda_host][bf16]") {
  for (float x : {0.0f, 1.0f, -2.0f, 0.5f, 3.0f, 1.0078125f /* 1 + 2^-7 */, 65536.0f}) CHECK(bf16_round(x) == x);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0, mantissa ...0).
  CHECK(bf16_round(1.00390625f) == 1.0f);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  CHECK(bf16_round(1.01171875f) == 1.015625f);
  // Just above halfway rounds up, just below rounds down.
  CHECK(bf16_round(std::nextafter(1.00390625f, 2.0f)) == 1.0078125f);
  CHECK(bf16_round(std::nextafter(1.00390625f, 0.0f)) == 1.0f);
  CHECK(bf16_bits(-0.0f) == 0x8000u);
  CHECK(bf16_bits(1.0f) == 0x3F80u);
}

TEST_CASE("bf16 rounding: carries into the exponent, Inf and NaN", "[cuda_host][bf16]") {
  // The largest float below 2 rounds to 2 (mantissa carry into the exponent).
  CHECK(bf16_round(std::nextafter(2.0f, 0.0f)) == 2.0f);
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(bf16_round(inf) == inf);
  CHECK(bf16_round(-inf) == -inf);
  CHECK(bf16_round(std::numeric_limits<float>::max()) == inf);  // beyond bf16's largest (≈ 3.39e38)
  CHECK(bf16_bits(std::numeric_limits<float>::max()) == 0x7F80u);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(bf16_round(nan)));
  // A signalling NaN whose payload sits in the dropped bits must not become Inf.
  CHECK(std::isnan(bf16_round(bits_float(0x7F800001u))));
  CHECK(std::isnan(bf16_round(bits_float(0xFF800001u))));
}

TEST_CASE("bf16 rounding: relative error at most 2^-8, monotone, nearest", "[cuda_host][bf16]") {
  float worst = 0.0f;
  float previous = -std::numeric_limits<float>::infinity();
  // A sweep of positive normal floats in increasing bit order (hence increasing value).
  for (uint32_t u = 0x00800000u; u < 0x7F000000u; u += 0x00001357u) {
    const float x = bits_float(u);
    const float r = bf16_round(x);
    REQUIRE(r >= previous);
    previous = r;
    worst = std::max(worst, std::fabs(r - x) / x);
    // Nearest: no bf16 neighbour of r is closer to x.
    const uint16_t b = bf16_bits(x);
    const float up = bf16_value(static_cast<uint16_t>(b + 1)), down = bf16_value(static_cast<uint16_t>(b - 1));
    REQUIRE(std::fabs(r - x) <= std::fabs(up - x));
    REQUIRE(std::fabs(r - x) <= std::fabs(down - x));
    const float neg = -x;  // symmetric
    REQUIRE(bf16_round(neg) == -r);
  }
  CHECK(worst <= kBf16RelativeRounding);
  CHECK(worst > kBf16RelativeRounding * 0.99f);  // the bound is attained: the sweep reaches halfway cases
}
