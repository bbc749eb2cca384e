// Linear layers, the residual stream and SwiGLU: forward against a naive
// reference, gradients by central differences, the gradient rule (+= / =).
#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::check_gradient;
using rackstep::exec::testing::dot;
using rackstep::exec::testing::randn;

TEST_CASE("linear forward matches a naive matmul with bias", "[exec][kernels][linear]") {
  const int N = 5, in = 7, out = 4;
  auto x = randn(N * in, 1), w = randn(in * out, 2), b = randn(out, 3);
  std::vector<float> y(N * out);
  linear_forward(y.data(), x.data(), w.data(), b.data(), N, in, out);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      double ref = b[o];
      for (int i = 0; i < in; ++i) ref += static_cast<double>(x[n * in + i]) * w[i * out + o];
      CHECK(y[n * out + o] == Approx(ref).margin(1e-5));
    }
}

TEST_CASE("linear backward matches finite differences and accumulates dW", "[exec][kernels][linear]") {
  const int N = 6, in = 5, out = 3;
  auto x = randn(N * in, 4), w = randn(in * out, 5), b = randn(out, 6), r = randn(N * out, 7);
  std::vector<float> y(N * out);
  auto loss = [&] {
    linear_forward(y.data(), x.data(), w.data(), b.data(), N, in, out);
    return dot(y, r);
  };
  std::vector<float> dx(N * in, 99.0f), dw(in * out, 0.0f), db(out, 0.0f);
  linear_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, in, out);
  check_gradient("dx", x, dx, loss);
  check_gradient("dw", w, dw, loss);
  check_gradient("db", b, db, loss);

  // Parameter gradients accumulate; activation gradients overwrite unless asked.
  std::vector<float> dw2 = dw, db2 = db, dx2(N * in, 99.0f);
  linear_backward(dx2.data(), dw2.data(), db2.data(), r.data(), x.data(), w.data(), N, in, out);
  for (size_t i = 0; i < dw.size(); ++i) CHECK(dw2[i] == Approx(2 * dw[i]).margin(1e-5));
  for (size_t i = 0; i < db.size(); ++i) CHECK(db2[i] == Approx(2 * db[i]).margin(1e-5));
  for (size_t i = 0; i < dx.size(); ++i) CHECK(dx2[i] == Approx(dx[i]).margin(1e-6));
  linear_backward(dx2.data(), nullptr, nullptr, r.data(), x.data(), w.data(), N, in, out, true);
  for (size_t i = 0; i < dx.size(); ++i) CHECK(dx2[i] == Approx(2 * dx[i]).margin(1e-5));
}

TEST_CASE("residual add: forward sums, backward adds into both inputs", "[exec][kernels][residual]") {
  std::vector<float> a{1, 2, 3}, b{10, 20, 30}, y(3), da{1, 1, 1}, db{0, 0, 0}, dy{0.5f, -1, 2};
  residual_forward(y.data(), a.data(), b.data(), 3);
  CHECK(y == std::vector<float>{11, 22, 33});
  residual_backward(da.data(), db.data(), dy.data(), 3);
  CHECK(da == std::vector<float>{1.5f, 0, 3});
  CHECK(db == dy);
}

TEST_CASE("swiglu elementwise gradients match finite differences", "[exec][kernels][swiglu]") {
  const size_t n = 40;
  auto a1 = randn(n, 8, 2.0f), a3 = randn(n, 9), r = randn(n, 10);
  std::vector<float> h(n), da1(n), da3(n);
  auto loss = [&] {
    swiglu_forward(h.data(), a1.data(), a3.data(), n);
    return dot(h, r);
  };
  swiglu_backward(da1.data(), da3.data(), r.data(), a1.data(), a3.data(), n);
  check_gradient("da1", a1, da1, loss, 1e-3);
  check_gradient("da3", a3, da3, loss, 1e-3);
}

TEST_CASE("dense swiglu (shared experts) gradients match finite differences", "[exec][kernels][swiglu]") {
  const int N = 5, d = 6, F = 8;
  auto x = randn(N * d, 11), w1 = randn(d * F, 12, 0.5f), w3 = randn(d * F, 13, 0.5f),
       w2 = randn(F * d, 14, 0.5f), r = randn(N * d, 15);
  std::vector<float> y(N * d), a1(N * F), a3(N * F), h(N * F);
  auto loss = [&] {
    dense_swiglu_forward(y.data(), a1.data(), a3.data(), h.data(), x.data(), w1.data(), w3.data(),
                         w2.data(), N, d, F);
    return dot(y, r);
  };
  loss();
  std::vector<float> dx(N * d), dw1(d * F, 0.0f), dw3(d * F, 0.0f), dw2(F * d, 0.0f),
      scratch(3 * N * F);
  dense_swiglu_backward(dx.data(), dw1.data(), dw3.data(), dw2.data(), r.data(), x.data(),
                        a1.data(), a3.data(), h.data(), w1.data(), w3.data(), w2.data(),
                        scratch.data(), N, d, F);
  check_gradient("dx", x, dx, loss);
  check_gradient("dw1", w1, dw1, loss);
  check_gradient("dw3", w3, dw3, loss);
  check_gradient("dw2", w2, dw2, loss);
}
