// Partial rotary position embedding (RoFormer, Su et al. 2021), NeoX pairing,
// with YaRN frequency scaling (Peng et al. 2023).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {
namespace {

// The pair index at which a frequency turns `rotations` times over L positions,
// d ln(L / (2π rotations)) / (2 ln θ) (HF transformers find_correction_dim).
double yarn_correction_dim(double rotations, int rot_dims, double theta, double L) {
  return rot_dims * std::log(L / (rotations * 2.0 * M_PI)) / (2.0 * std::log(theta));
}

// YaRN (Peng et al. 2023; HF transformers _compute_yarn_parameters): pair i keeps
// θ^(−2i/d) below the ramp's low end (beta_fast), is divided by the factor above
// its high end (beta_slow), and blends linearly between.
void yarn_inv_freq(std::vector<double>& inv_freq, int rot_dims, double theta, const RopeYarn& y) {
  double low = yarn_correction_dim(y.beta_fast, rot_dims, theta, y.original_positions);
  double high = yarn_correction_dim(y.beta_slow, rot_dims, theta, y.original_positions);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, rot_dims - 1.0);
  if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    inv_freq[i] = inv_freq[i] / y.factor * ramp + inv_freq[i] * (1.0 - ramp);
  }
}

// sign = +1 rotates by +angle (forward), -1 by -angle (backward = Rᵀ).
void rotate(float* y, const float* x, const int32_t* pos, int N, int heads, int hd,
            int rot_dims, float theta, const RopeYarn* yarn, float sign) {
  RS_CHECK(rot_dims >= 0 && rot_dims <= hd && rot_dims % 2 == 0,
           "rope: rot_dims must be even and at most head_dim");
  RS_CHECK(!yarn || (yarn->factor >= 1.0 && yarn->original_positions > 0.0 && yarn->beta_fast > yarn->beta_slow),
           "rope: YaRN needs factor >= 1, original positions > 0 and beta_fast > beta_slow");
  const int half = rot_dims / 2;
  std::vector<double> inv_freq(half);  // theta^(-2i/rot_dims), NeoX partial rotary
  for (int i = 0; i < half; ++i)
    inv_freq[i] = std::pow(static_cast<double>(theta), -2.0 * i / rot_dims);
  if (yarn && yarn->factor > 1.0) yarn_inv_freq(inv_freq, rot_dims, theta, *yarn);  // factor 1: the plain ones
  // YaRN's attention factor on cos and sin (HF get_mscale: 1 at factor 1).
  const double scale = yarn && yarn->factor > 1.0 ? 0.1 * std::log(yarn->factor) + 1.0 : 1.0;
#pragma omp parallel for schedule(static)
  for (long n = 0; n < N; ++n) {
    std::vector<float> c(half), s(half);
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos[n]) * inv_freq[i];
      c[i] = static_cast<float>(scale * std::cos(angle));
      s[i] = sign * static_cast<float>(scale * std::sin(angle));
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
                  int rot_dims, float theta, const RopeYarn* yarn) {
  rotate(y, x, pos, N, heads, hd, rot_dims, theta, yarn, 1.0f);
}

void rope_backward(float* dx, const float* dy, const int32_t* pos, int N, int heads, int hd,
                   int rot_dims, float theta, const RopeYarn* yarn) {
  rotate(dx, dy, pos, N, heads, hd, rot_dims, theta, yarn, -1.0f);
}

}  // namespace rackstep::exec
