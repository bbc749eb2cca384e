// RMSNorm with gain, non-parametric RMSNorm (QK-norm, multiplier 1.3) and the
// gated norm: hand-checked forwards and finite-difference gradients.
#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::check_gradient;
using rackstep::exec::testing::dot;
using rackstep::exec::testing::randn;

TEST_CASE("rmsnorm forward: unit rms times gain", "[exec][kernels][norm]") {
  const int N = 3, d = 8;
  auto x = randn(N * d, 1, 3.0f);
  std::vector<float> gain(d, 2.0f), y(N * d), rstd(N);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), gain.data(), 1e-6f, N, d);
  for (int n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int i = 0; i < d; ++i) ss += y[n * d + i] * y[n * d + i];
    CHECK(std::sqrt(ss / d) == Approx(2.0).epsilon(1e-5));
  }
}

TEST_CASE("rmsnorm gradients match finite differences", "[exec][kernels][norm]") {
  const int N = 4, d = 6;
  auto x = randn(N * d, 2), gain = randn(d, 3), r = randn(N * d, 4);
  std::vector<float> y(N * d), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(y.data(), rstd.data(), x.data(), gain.data(), 1e-5f, N, d);
    return dot(y, r);
  };
  loss();
  std::vector<float> dx(N * d), dgain(d, 0.0f);
  rmsnorm_backward(dx.data(), dgain.data(), r.data(), x.data(), rstd.data(), gain.data(), N, d);
  check_gradient("dx", x, dx, loss, 1e-3);
  check_gradient("dgain", gain, dgain, loss, 1e-3);
}

TEST_CASE("QK-norm: non-parametric rmsnorm then the fixed multiplier", "[exec][kernels][norm]") {
  const int rows = 6, d = 8;  // e.g. 3 tokens x 2 heads of width 8
  auto x = randn(rows * d, 5, 2.0f), r = randn(rows * d, 6);
  std::vector<float> y(rows * d), rstd(rows);
  auto loss = [&] {
    rmsnorm_noparam_forward(y.data(), rstd.data(), x.data(), 1.3f, 1e-6f, rows, d);
    return dot(y, r);
  };
  loss();
  for (int n = 0; n < rows; ++n) {
    double ss = 0.0;
    for (int i = 0; i < d; ++i) ss += y[n * d + i] * y[n * d + i];
    CHECK(std::sqrt(ss / d) == Approx(1.3).epsilon(1e-5));
  }
  std::vector<float> dx(rows * d);
  rmsnorm_noparam_backward(dx.data(), r.data(), x.data(), rstd.data(), 1.3f, rows, d);
  check_gradient("dx", x, dx, loss, 1e-3);
}

TEST_CASE("gated norm forward and gradients", "[exec][kernels][norm][gated]") {
  const int N = 5, d = 6, r_ = 3;
  auto x = randn(N * d, 7), wd = randn(d * r_, 8, 0.7f), wu = randn(r_ * d, 9, 0.7f),
       r = randn(N * d, 10);
  std::vector<float> y(N * d), a(N * r_), g(N * d);
  auto loss = [&] {
    gated_norm_forward(y.data(), a.data(), g.data(), x.data(), wd.data(), wu.data(), N, d, r_);
    return dot(y, r);
  };
  loss();
  // Hand check of one element: y = x * sigmoid(silu(x·Wd)·Wu).
  {
    const int n = 2, c = 4;
    double b = 0.0;
    for (int j = 0; j < r_; ++j) {
      double av = 0.0;
      for (int i = 0; i < d; ++i) av += x[n * d + i] * wd[i * r_ + j];
      b += av / (1.0 + std::exp(-av)) * wu[j * d + c];
    }
    CHECK(y[n * d + c] == Approx(x[n * d + c] / (1.0 + std::exp(-b))).margin(1e-5));
  }
  std::vector<float> dx(N * d), dwd(d * r_, 0.0f), dwu(r_ * d, 0.0f),
      scratch(gated_norm_scratch_floats(N, d, r_));
  gated_norm_backward(dx.data(), dwd.data(), dwu.data(), r.data(), x.data(), a.data(), g.data(),
                      wd.data(), wu.data(), scratch.data(), N, d, r_);
  check_gradient("dx", x, dx, loss, 1e-3);
  check_gradient("dw_down", wd, dwd, loss, 1e-3);
  check_gradient("dw_up", wu, dwu, loss, 1e-3);
}
