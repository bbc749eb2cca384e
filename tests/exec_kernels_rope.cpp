// Partial RoPE and NoPE: rotation properties and the backward as Rᵀ.
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
