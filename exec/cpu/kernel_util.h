// Helpers shared by the CPU kernels in exec/cpu/ (not part of the public API).
//
// The one rule that makes the kernels deterministic for a fixed thread count
// lives here: a sum over rows into a parameter gradient is split into static
// row chunks, one per thread slot, each summed into its own partial buffer,
// and the partials are added in slot order.
#pragma once

#include <omp.h>

#include <cmath>
#include <cstddef>
#include <vector>

namespace rackstep::exec::detail {

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
