// Short causal depthwise conv: identity init, document masking, gradients.
#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::check_gradient;
using rackstep::exec::testing::dot;
using rackstep::exec::testing::randn;

TEST_CASE("sconv identity init passes the input through", "[exec][kernels][sconv]") {
  const int B = 2, T = 6, C = 3, K = 4;
  auto x = randn(B * T * C, 1);
  std::vector<float> w(C * K), y(x.size());
  sconv_init_identity(w.data(), C, K);
  sconv_forward(y.data(), x.data(), w.data(), nullptr, B, T, C, K);
  CHECK(y == x);
}

TEST_CASE("sconv taps: causal sum, masked at sequence start and document boundary", "[exec][kernels][sconv]") {
  const int B = 1, T = 6, C = 1, K = 4;
  std::vector<float> x{1, 10, 100, 1000, 10000, 100000};
  std::vector<float> w{0.1f, 0.2f, 0.3f, 1.0f};  // taps t-3, t-2, t-1, t
  std::vector<int32_t> doc{0, 0, 0, 1, 1, 1};    // document 1 starts at t = 3
  std::vector<float> y(T);
  sconv_forward(y.data(), x.data(), w.data(), doc.data(), B, T, C, K);
  CHECK(y[0] == Approx(1.0));
  CHECK(y[1] == Approx(10 + 0.3 * 1));
  CHECK(y[2] == Approx(100 + 0.3 * 10 + 0.2 * 1));
  CHECK(y[3] == Approx(1000));                      // nothing from document 0
  CHECK(y[4] == Approx(10000 + 0.3 * 1000));
  CHECK(y[5] == Approx(100000 + 0.3 * 10000 + 0.2 * 1000));
  sconv_forward(y.data(), x.data(), w.data(), nullptr, B, T, C, K);
  CHECK(y[3] == Approx(1000 + 0.3 * 100 + 0.2 * 10 + 0.1 * 1));  // no doc ids: all taps live
}

TEST_CASE("sconv gradients match finite differences", "[exec][kernels][sconv]") {
  const int B = 2, T = 7, C = 3, K = 4;
  auto x = randn(B * T * C, 2), w = randn(C * K, 3), r = randn(B * T * C, 4);
  std::vector<int32_t> doc{0, 0, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3, 3, 3};
  std::vector<float> y(x.size());
  auto loss = [&] {
    sconv_forward(y.data(), x.data(), w.data(), doc.data(), B, T, C, K);
    return dot(y, r);
  };
  std::vector<float> dx(x.size()), dw(C * K, 0.0f);
  sconv_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), doc.data(), B, T, C, K);
  check_gradient("dx", x, dx, loss);
  check_gradient("dw", w, dw, loss);
}
