// Partial rotary position embedding (RoFormer, Su et al. 2021), NeoX pairing.
#include <cmath>
#include <cstring>
#include <vector>

#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {
namespace {

// sign = +1 rotates by +angle (forward), -1 by -angle (backward = Rᵀ).
void rotate(float* y, const float* x, const int32_t* pos, int N, int heads, int hd,
            int rot_dims, float theta, float sign) {
  RS_CHECK(rot_dims >= 0 && rot_dims <= hd && rot_dims % 2 == 0,
           "rope: rot_dims must be even and at most head_dim");
  const int half = rot_dims / 2;
  std::vector<double> inv_freq(half);  // theta^(-2i/rot_dims), NeoX partial rotary
  for (int i = 0; i < half; ++i)
    inv_freq[i] = std::pow(static_cast<double>(theta), -2.0 * i / rot_dims);
#pragma omp parallel for schedule(static)
  for (long n = 0; n < N; ++n) {
    std::vector<float> c(half), s(half);
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos[n]) * inv_freq[i];
      c[i] = static_cast<float>(std::cos(angle));
      s[i] = sign * static_cast<float>(std::sin(angle));
    }
    for (int h = 0; h < heads; ++h) {
      const float* xr = x + (n * heads + h) * hd;
      float* yr = y + (n * heads + h) * hd;
      for (int i = 0; i < half; ++i) {
        const float x1 = xr[i];
        const float x2 = xr[i + half];
        yr[i] = x1 * c[i] - x2 * s[i];
        yr[i + half] = x2 * c[i] + x1 * s[i];
      }
      if (yr != xr) std::memcpy(yr + rot_dims, xr + rot_dims, sizeof(float) * (hd - rot_dims));
    }
  }
}

}  // namespace

void rope_forward(float* y, const float* x, const int32_t* pos, int N, int heads, int hd,
                  int rot_dims, float theta) {
  rotate(y, x, pos, N, heads, hd, rot_dims, theta, 1.0f);
}

void rope_backward(float* dx, const float* dy, const int32_t* pos, int N, int heads, int hd,
                   int rot_dims, float theta) {
  rotate(dx, dy, pos, N, heads, hd, rot_dims, theta, -1.0f);
}

}  // namespace rackstep::exec
