// Shared helpers for the kernel tests (tests/exec_kernels_*.cpp): random
// tensors and a central-difference gradient check.
//
// The check works on a scalar probe loss L = Σ_i r_i y_i with a fixed random
// r: the analytic gradient is the kernel's backward with dy = r, the numeric
// one is (L(x + h e_c) - L(x - h e_c)) / 2h, L evaluated in double from the
// fp32 forward. Small shapes and h = 1e-2 keep fp32 rounding well below the
// tolerance while the O(h²) truncation error stays small.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace rackstep::exec::testing {

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ‖a − b‖∞ / ‖b‖∞: the backend-parity suites' normalised error, one number per tensor.
inline double normalised_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0.0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Compares analytic[c] with the central difference of loss() in x[c] for up
// to max_coords coordinates (all of them when x is small). x is restored.
inline void check_gradient(const std::string& what, std::vector<float>& x,
                           const std::vector<float>& analytic, const std::function<double()>& loss,
                           double h = 1e-2, double rtol = 2e-2, double atol = 2e-3,
                           size_t max_coords = 48) {
  REQUIRE(x.size() == analytic.size());
  std::vector<size_t> coords(x.size());
  for (size_t i = 0; i < coords.size(); ++i) coords[i] = i;
  if (coords.size() > max_coords) {
    std::mt19937 rng(12345);
    std::shuffle(coords.begin(), coords.end(), rng);
    coords.resize(max_coords);
  }
  double max_abs = 0.0;
  for (size_t c : coords) max_abs = std::max(max_abs, std::abs(static_cast<double>(analytic[c])));
  for (size_t c : coords) {
    const float saved = x[c];
    x[c] = saved + static_cast<float>(h);
    const double up = loss();
    x[c] = saved - static_cast<float>(h);
    const double down = loss();
    x[c] = saved;
    const double numeric = (up - down) / (2.0 * h);
    const double a = analytic[c];
    INFO(what << "[" << c << "]: analytic " << a << ", numeric " << numeric);
    CHECK(std::abs(a - numeric) <= rtol * std::max(std::abs(a), std::abs(numeric)) + atol * std::max(1.0, max_abs));
  }
  loss();
}

}  // namespace rackstep::exec::testing
