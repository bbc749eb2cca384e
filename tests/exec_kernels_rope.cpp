// Partial RoPE, NoPE and YaRN: rotation properties and the backward as Rᵀ.
#include <algorithm>
#include <cmath>

#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::check_gradient;
using rackstep::exec::testing::dot;
using rackstep::exec::testing::randn;

TEST_CASE("partial rope rotates only the first rot_dims and keeps norms", "[exec][kernels][rope]") {
  const int N = 4, heads = 2, hd = 8, rot = 4;
  auto x = randn(N * heads * hd, 1);
  std::vector<int32_t> pos{0, 1, 7, 100};
  std::vector<float> y(x.size());
  rope_forward(y.data(), x.data(), pos.data(), N, heads, hd, rot, 10000.0f);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < heads; ++h) {
      const int base = (n * heads + h) * hd;
      for (int i = rot; i < hd; ++i) CHECK(y[base + i] == x[base + i]);  // untouched dims
      for (int i = 0; i < rot / 2; ++i) {  // each rotated pair keeps its length
        const double before = x[base + i] * x[base + i] + x[base + i + rot / 2] * x[base + i + rot / 2];
        const double after = y[base + i] * y[base + i] + y[base + i + rot / 2] * y[base + i + rot / 2];
        CHECK(after == Approx(before).epsilon(1e-5));
      }
      if (pos[n] == 0)
        for (int i = 0; i < hd; ++i) CHECK(y[base + i] == Approx(x[base + i]));
    }
  // Pair 0 turns by exactly pos radians (frequency theta^0 = 1).
  const int base = (2 * heads) * hd;
  CHECK(y[base] == Approx(x[base] * std::cos(7.0) - x[base + 2] * std::sin(7.0)).margin(1e-5));
}

TEST_CASE("NoPE (rot_dims 0) is the identity, in place too", "[exec][kernels][rope]") {
  auto x = randn(3 * 2 * 4, 2);
  auto y = x;
  std::vector<int32_t> pos{5, 6, 7};
  rope_forward(y.data(), y.data(), pos.data(), 3, 2, 4, 0, 10000.0f);
  CHECK(y == x);
}

TEST_CASE("rope scores depend only on the position difference", "[exec][kernels][rope]") {
  const int hd = 8;
  auto q = randn(hd, 3), k = randn(hd, 4);
  std::vector<float> qr(hd), kr(hd);
  auto score = [&](int pq, int pk) {
    rope_forward(qr.data(), q.data(), &pq, 1, 1, hd, hd, 100.0f);
    rope_forward(kr.data(), k.data(), &pk, 1, 1, hd, hd, 100.0f);
    return dot(qr, kr);
  };
  CHECK(score(10, 7) == Approx(score(3, 0)).epsilon(1e-4));
  CHECK(score(50, 20) == Approx(score(31, 1)).epsilon(1e-4));
}

TEST_CASE("rope backward matches finite differences (in place allowed)", "[exec][kernels][rope]") {
  const int N = 3, heads = 2, hd = 6, rot = 4;
  auto x = randn(N * heads * hd, 5), r = randn(N * heads * hd, 6);
  std::vector<int32_t> pos{2, 9, 33};
  std::vector<float> y(x.size());
  auto loss = [&] {
    rope_forward(y.data(), x.data(), pos.data(), N, heads, hd, rot, 500.0f);
    return dot(y, r);
  };
  std::vector<float> dx = r;
  rope_backward(dx.data(), dx.data(), pos.data(), N, heads, hd, rot, 500.0f);
  check_gradient("dx", x, dx, loss);
}

// gpt-oss's YaRN (openai/gpt-oss torch/model.py RotaryEmbedding
// _compute_concentration_and_inv_freq), written out here apart from the kernel:
// NTK by parts between low and high, concentration 0.1 ln(s) + 1 on cos and sin.
static double gpt_oss_inv_freq(int i, int hd, double base, double s, double L, double alpha, double beta) {
  const double d_half = hd / 2.0;
  const double low = d_half * std::log(L / (beta * 2 * M_PI)) / std::log(base);
  const double high = d_half * std::log(L / (alpha * 2 * M_PI)) / std::log(base);
  const double freq = std::pow(base, 2.0 * i / hd);
  const double mask = 1.0 - std::clamp((i - low) / (high - low), 0.0, 1.0);
  return 1.0 / (s * freq) * (1.0 - mask) + 1.0 / freq * mask;
}

TEST_CASE("YaRN rope equals gpt-oss's frequencies and concentration (truncate off)", "[exec][kernels][rope]") {
  const int N = 3, heads = 2, hd = 64;
  const RopeYarn yarn{.factor = 32.0, .original_positions = 4096.0, .beta_fast = 32.0, .beta_slow = 1.0,
                      .truncate = false};
  auto x = randn(N * heads * hd, 7);
  std::vector<int32_t> pos{1, 517, 20000};
  std::vector<float> y(x.size()), plain(x.size());
  rope_forward(y.data(), x.data(), pos.data(), N, heads, hd, hd, 150000.0f, &yarn);
  rope_forward(plain.data(), x.data(), pos.data(), N, heads, hd, hd, 150000.0f);
  const double conc = 0.1 * std::log(32.0) + 1.0;
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < hd / 2; ++i) {
      const int b = n * heads * hd;
      const double a = pos[n] * gpt_oss_inv_freq(i, hd, 150000.0, 32.0, 4096.0, 1.0, 32.0);
      const double want = conc * (x[b + i] * std::cos(a) - x[b + i + hd / 2] * std::sin(a));
      CHECK(y[b + i] == Approx(want).margin(2e-5));
    }
  // Pair 0 keeps its frequency (extrapolated), the last pair's is divided by 32 (interpolated).
  const int last = hd / 2 - 1;
  CHECK(gpt_oss_inv_freq(0, hd, 150000.0, 32.0, 4096.0, 1.0, 32.0) == Approx(1.0));
  CHECK(gpt_oss_inv_freq(last, hd, 150000.0, 32.0, 4096.0, 1.0, 32.0) ==
        Approx(std::pow(150000.0, -2.0 * last / hd) / 32.0));
  CHECK(y != plain);
}

TEST_CASE("YaRN at factor 1 is plain rope; truncate moves the ramp's ends", "[exec][kernels][rope]") {
  const int N = 2, heads = 1, hd = 32;
  auto x = randn(N * heads * hd, 8);
  std::vector<int32_t> pos{3, 300};
  std::vector<float> plain(x.size()), one(x.size()), cut(x.size()), smooth(x.size());
  const RopeYarn unit{.factor = 1.0, .original_positions = 64.0};
  RopeYarn on{.factor = 8.0, .original_positions = 64.0, .beta_fast = 8.0, .beta_slow = 1.0, .truncate = true};
  RopeYarn off = on;
  off.truncate = false;
  rope_forward(plain.data(), x.data(), pos.data(), N, heads, hd, hd, 10000.0f);
  rope_forward(one.data(), x.data(), pos.data(), N, heads, hd, hd, 10000.0f, &unit);
  rope_forward(cut.data(), x.data(), pos.data(), N, heads, hd, hd, 10000.0f, &on);
  rope_forward(smooth.data(), x.data(), pos.data(), N, heads, hd, hd, 10000.0f, &off);
  CHECK(one == plain);
  CHECK(cut != smooth);
}

TEST_CASE("YaRN rope backward (scale times Rᵀ) matches finite differences", "[exec][kernels][rope]") {
  const int N = 3, heads = 2, hd = 16, rot = 12;
  const RopeYarn yarn{.factor = 16.0, .original_positions = 32.0, .beta_fast = 16.0, .beta_slow = 1.0,
                      .truncate = false};
  auto x = randn(N * heads * hd, 9), r = randn(N * heads * hd, 10);
  std::vector<int32_t> pos{2, 9, 133};
  std::vector<float> y(x.size());
  auto loss = [&] {
    rope_forward(y.data(), x.data(), pos.data(), N, heads, hd, rot, 500.0f, &yarn);
    return dot(y, r);
  };
  std::vector<float> dx = r;
  rope_backward(dx.data(), dx.data(), pos.data(), N, heads, hd, rot, 500.0f, &yarn);
  check_gradient("dx", x, dx, loss);
}
