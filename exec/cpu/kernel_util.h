// Helpers shared by the CPU kernels in exec/cpu/ (not part of the public API).
//
// The one rule that makes the kernels deterministic for a fixed thread count
// lives here: a sum over rows into a parameter gradient is split into static
// row chunks, one per thread slot, each summed into its own partial buffer,
// and the partials are added in slot order.
#pragma once

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rackstep::exec::detail {

// e^x in plain float arithmetic, so that loops over it vectorise (std::exp does
// not without -ffast-math): Cephes expf, x = n ln2 + r with |r| <= ln2/2 (ln2
// split in two for an exact reduction), e^r by its degree-7 minimax polynomial,
// 2^n from the exponent bits; within 2 ulp of e^x (Moshier, Cephes "expf.c").
// Arguments are clamped to [-87.3, 88.3]: e^-87.3 ~ 1e-38 stands for 0, which
// callers that need an exact 0 (masked softmax entries) select themselves.
inline float expf_fast(float x) {
  x = std::min(std::max(x, -87.33654f), 88.3762626647949f);
  // Round x·log2(e) to the nearest integer by the 1.5·2^23 trick (SSE2 has no round).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 127]
  return er * std::bit_cast<float>(bits);
}

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float siluf(float x) { return x * sigmoidf(x); }
// d silu / dx = σ(x) (1 + x (1 - σ(x))).
inline float silu_gradf(float x) {
  const float s = sigmoidf(x);
  return s * (1.0f + x * (1.0f - s));
}

// out[0..len) += Σ_rows contribution(row): add_row(acc, row) adds one row's
// contribution into acc (a double buffer of len). Deterministic for a fixed
// omp_get_max_threads().
template <class AddRow>
void reduce_rows(float* out, size_t len, long rows, AddRow&& add_row) {
  const int slots = omp_get_max_threads();
  std::vector<double> partial(static_cast<size_t>(slots) * len, 0.0);
#pragma omp parallel num_threads(slots)
  {
    const int nt = omp_get_num_threads();
    for (int s = omp_get_thread_num(); s < slots; s += nt) {
      const long begin = rows * s / slots;
      const long end = rows * (s + 1) / slots;
      double* acc = partial.data() + static_cast<size_t>(s) * len;
      for (long r = begin; r < end; ++r) add_row(acc, r);
    }
  }
  for (size_t i = 0; i < len; ++i) {
    double sum = 0.0;
    for (int s = 0; s < slots; ++s) sum += partial[static_cast<size_t>(s) * len + i];
    out[i] += static_cast<float>(sum);
  }
}

}  // namespace rackstep::exec::detail
