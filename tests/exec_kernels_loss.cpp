// Cross-entropy with logit z-loss: hand values, chunking, gradients.
#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::check_gradient;
using rackstep::exec::testing::randn;

TEST_CASE("cross-entropy of uniform logits is log V; z-loss is weight * lse²", "[exec][kernels][loss]") {
  const int N = 3, V = 8;
  std::vector<float> logits(N * V, 2.0f), lse(N);
  std::vector<int32_t> targets{1, 7, 0};
  auto r = cross_entropy_forward(lse.data(), logits.data(), targets.data(), N, V, 1e-4f, N);
  CHECK(r.ce == Approx(std::log(8.0)));
  const double l = 2.0 + std::log(8.0);
  CHECK(lse[0] == Approx(l));
  CHECK(r.z_loss == Approx(1e-4 * l * l));
}

TEST_CASE("cross-entropy chunks add up and ignored targets do not count", "[exec][kernels][loss]") {
  const int N = 6, V = 11;
  auto logits = randn(N * V, 1, 2.0f);
  std::vector<int32_t> targets{3, -1, 10, 0, 5, -1};
  std::vector<float> lse(N);
  auto whole = cross_entropy_forward(lse.data(), logits.data(), targets.data(), N, V, 1e-2f, 4);
  auto a = cross_entropy_forward(lse.data(), logits.data(), targets.data(), 2, V, 1e-2f, 4);
  auto b = cross_entropy_forward(lse.data() + 2, logits.data() + 2 * V, targets.data() + 2, 4, V, 1e-2f, 4);
  CHECK(a.ce + b.ce == Approx(whole.ce));
  CHECK(a.z_loss + b.z_loss == Approx(whole.z_loss));
  double ce = 0.0;
  for (int t = 0; t < N; ++t) {
    if (targets[t] < 0) continue;
    double s = 0.0;
    for (int i = 0; i < V; ++i) s += std::exp(static_cast<double>(logits[t * V + i]));
    ce += std::log(s) - logits[t * V + targets[t]];
  }
  CHECK(whole.ce == Approx(ce / 4));
}

TEST_CASE("cross-entropy + z-loss gradient matches finite differences, in place", "[exec][kernels][loss]") {
  const int N = 5, V = 9;
  auto logits = randn(N * V, 2, 3.0f);
  std::vector<int32_t> targets{0, 8, -1, 4, 4};
  std::vector<float> lse(N);
  const float zw = 0.05f;  // large enough for the z term to matter in the check
  auto loss = [&] {
    auto r = cross_entropy_forward(lse.data(), logits.data(), targets.data(), N, V, zw, 4);
    return r.ce + r.z_loss;
  };
  loss();
  std::vector<float> dlogits = logits;
  cross_entropy_backward(dlogits.data(), dlogits.data(), lse.data(), targets.data(), N, V, zw, 4);
  for (int i = 0; i < V; ++i) CHECK(dlogits[2 * V + i] == 0.0f);  // ignored row
  check_gradient("dlogits", logits, dlogits, loss, 1e-3, 2e-2, 1e-3, 45);
}
