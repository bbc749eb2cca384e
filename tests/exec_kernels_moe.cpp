// MoE: router selection/threshold/weights, quantile balancing, grouping,
// grouped experts with drops, combine; gradients by finite differences.
#include <algorithm>
#include <numeric>

#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::check_gradient;
using rackstep::exec::testing::dot;
using rackstep::exec::testing::randn;

namespace {
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace

TEST_CASE("router picks top-k on biased scores, reports the (k+1)-th as threshold, weights sum to 2.5",
          "[exec][kernels][router]") {
  const int N = 7, E = 8, k = 3;
  auto logits = randn(N * E, 1, 2.0f), bias = randn(E, 2);
  for (RouterKind kind : {RouterKind::kSigmoid, RouterKind::kSoftmax}) {
    std::vector<int32_t> expert(N * k);
    std::vector<float> weight(N * k), threshold(N);
    router_forward(expert.data(), weight.data(), threshold.data(), logits.data(), bias.data(), N,
                   E, k, kind, 2.5f);
    for (int t = 0; t < N; ++t) {
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      auto biased = [&](int e) { return logits[t * E + e] + bias[e]; };
      std::sort(order.begin(), order.end(), [&](int a, int b) { return biased(a) > biased(b); });
      double sum = 0.0, z = 0.0;
      for (int j = 0; j < k; ++j) {
        CHECK(expert[t * k + j] == order[j]);
        z += kind == RouterKind::kSigmoid ? sigmoid(logits[t * E + order[j]])
                                          : std::exp(static_cast<double>(logits[t * E + order[j]]));
        sum += weight[t * k + j];
      }
      CHECK(threshold[t] == Approx(biased(order[k])));
      CHECK(sum == Approx(2.5));
      // Weights come from the unbiased logits of the chosen experts.
      const double u0 = kind == RouterKind::kSigmoid ? sigmoid(logits[t * E + order[0]])
                                                      : std::exp(static_cast<double>(logits[t * E + order[0]]));
      CHECK(weight[t * k] == Approx(2.5 * u0 / z));
    }
  }
}

TEST_CASE("router: k == E has no threshold; a large bias forces an expert in", "[exec][kernels][router]") {
  const int N = 3, E = 4;
  auto logits = randn(N * E, 3);
  std::vector<int32_t> expert(N * E);
  std::vector<float> weight(N * E), threshold(N);
  router_forward(expert.data(), weight.data(), threshold.data(), logits.data(), nullptr, N, E, E,
                 RouterKind::kSigmoid, 2.5f);
  for (float th : threshold) CHECK(std::isinf(th));
  std::vector<float> bias{0, 0, 100, 0};
  router_forward(expert.data(), weight.data(), threshold.data(), logits.data(), bias.data(), N, E,
                 1, RouterKind::kSigmoid, 2.5f);
  for (int t = 0; t < N; ++t) {
    CHECK(expert[t] == 2);
    CHECK(weight[t] == Approx(2.5));  // a single chosen expert carries the whole sum
  }
}

TEST_CASE("router backward matches finite differences", "[exec][kernels][router]") {
  const int N = 6, E = 8, k = 3;
  auto logits = randn(N * E, 4, 2.0f), bias = randn(E, 5, 0.5f), r = randn(N * k, 6);
  for (RouterKind kind : {RouterKind::kSigmoid, RouterKind::kSoftmax}) {
    std::vector<int32_t> expert(N * k);
    std::vector<float> weight(N * k), threshold(N);
    auto loss = [&] {
      router_forward(expert.data(), weight.data(), threshold.data(), logits.data(), bias.data(),
                     N, E, k, kind, 2.5f);
      return dot(weight, r);
    };
    loss();
    std::vector<float> dlogits(N * E);
    router_backward(dlogits.data(), r.data(), weight.data(), expert.data(), logits.data(), N, E,
                    k, kind, 2.5f);
    check_gradient(kind == RouterKind::kSigmoid ? "dlogits sigmoid" : "dlogits softmax", logits,
                   dlogits, loss, 1e-3);
  }
}

TEST_CASE("quantile balancing: histogram quantile by hand", "[exec][kernels][qb]") {
  const int E = 2, bins = 10;
  std::vector<int64_t> counts(E * bins, 0);
  for (int b = 0; b < bins; ++b) counts[b] = 10;  // expert 0: uniform on [0, 10)
  counts[bins + 9] = 5;                            // expert 1: all in the top bin
  std::vector<float> bias(E);
  qb_bias_from_histogram(bias.data(), counts.data(), E, 1, bins, 0.0f, 10.0f);
  CHECK(bias[0] == Approx(-5.0));  // median
  CHECK(bias[1] == Approx(-9.5));  // halfway through the top bin

  std::vector<float> logits{-100.0f, 0.5f, 3.2f, 100.0f};  // (2 tokens, 2 experts)
  std::vector<int64_t> c2(E * bins, 0);
  qb_histogram(c2.data(), logits.data(), 2, E, bins, 0.0f, 10.0f);
  CHECK(c2[0] == 1);             // -100 clamps into the first bin
  CHECK(c2[3] == 1);             // 3.2
  CHECK(c2[bins + 0] == 1);      // 0.5
  CHECK(c2[bins + 9] == 1);      // 100 clamps into the last bin
}

TEST_CASE("quantile balancing evens out a skewed router on the next step", "[exec][kernels][qb]") {
  const int N = 4000, E = 8, k = 2, bins = 10000;
  auto skewed = [&](uint32_t seed) {
    auto l = randn(static_cast<size_t>(N) * E, seed);
    for (int t = 0; t < N; ++t)
      for (int e = 0; e < E; ++e) l[t * E + e] += 0.4f * e;  // later experts are favoured
    return l;
  };
  auto loads = [&](const std::vector<float>& l, const float* bias) {
    std::vector<int32_t> expert(N * k);
    std::vector<float> weight(N * k), threshold(N);
    router_forward(expert.data(), weight.data(), threshold.data(), l.data(), bias, N, E, k,
                   RouterKind::kSigmoid, 2.5f);
    std::vector<int> load(E, 0);
    for (int32_t e : expert) ++load[e];
    return load;
  };
  const double mean = static_cast<double>(N) * k / E;
  auto step1 = skewed(7), step2 = skewed(8);
  auto before = loads(step2, nullptr);
  CHECK(*std::max_element(before.begin(), before.end()) > 1.8 * mean);  // the test has teeth

  std::vector<int64_t> counts(static_cast<size_t>(E) * bins, 0);
  qb_histogram(counts.data(), step1.data(), N, E, bins, -16.0f, 16.0f);
  std::vector<float> bias(E);
  qb_bias_from_histogram(bias.data(), counts.data(), E, k, bins, -16.0f, 16.0f);
  auto after = loads(step2, bias.data());
  for (int e = 0; e < E; ++e) {
    INFO("expert " << e << " load " << after[e] << " mean " << mean);
    CHECK(after[e] > 0.8 * mean);
    CHECK(after[e] < 1.2 * mean);
  }
}

TEST_CASE("group by expert is a stable counting sort", "[exec][kernels][moe]") {
  std::vector<int32_t> expert{2, 0, 2, 1, 0, 2};  // N = 3, k = 2
  std::vector<int32_t> pos(6), offsets(4);
  moe_group_by_expert(pos.data(), offsets.data(), expert.data(), 6, 3);
  CHECK(offsets == std::vector<int32_t>{0, 2, 3, 6});
  CHECK(pos == std::vector<int32_t>{3, 0, 4, 2, 1, 5});
}

TEST_CASE("experts: dropped assignments give zero and no gradient; FD gradients", "[exec][kernels][experts]") {
  const int E = 3, L = 4, F = 5;
  std::vector<int32_t> offsets{0, 3, 3, 7};  // expert 1 receives nothing
  const int A = 7;
  std::vector<uint8_t> keep{1, 0, 1, 1, 1, 1, 0};
  auto xs = randn(A * L, 1), w1 = randn(E * L * F, 2, 0.6f), w3 = randn(E * L * F, 3, 0.6f),
       w2 = randn(E * F * L, 4, 0.6f), r = randn(A * L, 5);
  std::vector<float> ys(A * L), a1(A * F), a3(A * F), h(A * F);
  auto loss = [&] {
    experts_forward(ys.data(), a1.data(), a3.data(), h.data(), xs.data(), offsets.data(),
                    keep.data(), w1.data(), w3.data(), w2.data(), A, E, L, F);
    return dot(ys, r);
  };
  loss();
  for (int row : {1, 6})
    for (int c = 0; c < L; ++c) CHECK(ys[row * L + c] == 0.0f);
  // A kept row equals the dense SwiGLU of its expert.
  {
    std::vector<float> y1(L), b1(F), b3(F), hh(F);
    dense_swiglu_forward(y1.data(), b1.data(), b3.data(), hh.data(), xs.data() + 4 * L,
                         w1.data() + 2 * L * F, w3.data() + 2 * L * F, w2.data() + 2 * F * L, 1, L, F);
    for (int c = 0; c < L; ++c) CHECK(ys[4 * L + c] == Approx(y1[c]).margin(1e-5));
  }
  std::vector<float> dxs(A * L, 9.0f), dw1(E * L * F, 0.0f), dw3(E * L * F, 0.0f),
      dw2(E * F * L, 0.0f), scratch(experts_scratch_floats(A, L, F));
  experts_backward(dxs.data(), dw1.data(), dw3.data(), dw2.data(), r.data(), xs.data(), a1.data(),
                   a3.data(), h.data(), offsets.data(), keep.data(), w1.data(), w3.data(),
                   w2.data(), scratch.data(), A, E, L, F);
  for (int row : {1, 6})
    for (int c = 0; c < L; ++c) CHECK(dxs[row * L + c] == 0.0f);
  for (int i = 0; i < L * F; ++i) CHECK(dw1[L * F + i] == 0.0f);  // the idle expert
  check_gradient("dxs", xs, dxs, loss);
  check_gradient("dw1", w1, dw1, loss);
  check_gradient("dw3", w3, dw3, loss);
  check_gradient("dw2", w2, dw2, loss);
}

TEST_CASE("gather and combine gradients match finite differences", "[exec][kernels][moe]") {
  const int N = 4, k = 2, L = 3, E = 3;
  std::vector<int32_t> expert{0, 2, 1, 2, 2, 0, 1, 0};
  std::vector<int32_t> pos(N * k), offsets(E + 1);
  moe_group_by_expert(pos.data(), offsets.data(), expert.data(), N * k, E);
  auto x = randn(N * L, 1), r = randn(N * k * L, 2);
  std::vector<float> xs(N * k * L);
  auto gather_loss = [&] {
    moe_gather_forward(xs.data(), x.data(), pos.data(), N, k, L);
    return dot(xs, r);
  };
  std::vector<float> dx(N * L);
  moe_gather_backward(dx.data(), r.data(), pos.data(), N, k, L);
  check_gradient("gather dx", x, dx, gather_loss);

  auto ys = randn(N * k * L, 3), weight = randn(N * k, 4), ry = randn(N * L, 5);
  std::vector<float> y(N * L);
  auto combine_loss = [&] {
    moe_combine_forward(y.data(), ys.data(), weight.data(), pos.data(), N, k, L);
    return dot(y, ry);
  };
  std::vector<float> dys(N * k * L), dweight(N * k);
  moe_combine_backward(dys.data(), dweight.data(), ry.data(), ys.data(), weight.data(), pos.data(), N, k, L);
  check_gradient("combine dys", ys, dys, combine_loss);
  check_gradient("combine dweight", weight, dweight, combine_loss);
}

TEST_CASE("whole routed MoE chain: gradients to x and W_router match finite differences",
          "[exec][kernels][moe]") {
  // x -> logits = x·Wr -> router -> group -> gather -> experts -> combine.
  const int N = 5, L = 4, E = 4, k = 2, F = 6, A = N * k;
  auto x = randn(N * L, 1), wr = randn(L * E, 2), w1 = randn(E * L * F, 3, 0.6f),
       w3 = randn(E * L * F, 4, 0.6f), w2 = randn(E * F * L, 5, 0.6f), r = randn(N * L, 6);
  std::vector<float> logits(N * E), weight(A), threshold(N), xs(A * L), ys(A * L), a1(A * F),
      a3(A * F), h(A * F), y(N * L);
  std::vector<int32_t> expert(A), pos(A), offsets(E + 1);
  auto loss = [&] {
    linear_forward(logits.data(), x.data(), wr.data(), nullptr, N, L, E);
    router_forward(expert.data(), weight.data(), threshold.data(), logits.data(), nullptr, N, E, k,
                   RouterKind::kSigmoid, 2.5f);
    moe_group_by_expert(pos.data(), offsets.data(), expert.data(), A, E);
    moe_gather_forward(xs.data(), x.data(), pos.data(), N, k, L);
    experts_forward(ys.data(), a1.data(), a3.data(), h.data(), xs.data(), offsets.data(), nullptr,
                    w1.data(), w3.data(), w2.data(), A, E, L, F);
    moe_combine_forward(y.data(), ys.data(), weight.data(), pos.data(), N, k, L);
    return dot(y, r);
  };
  loss();
  std::vector<float> dys(A * L), dweight(A), dxs(A * L), dw1(E * L * F, 0.0f), dw3(E * L * F, 0.0f),
      dw2(E * F * L, 0.0f), scratch(experts_scratch_floats(A, L, F)), dlogits(N * E), dx(N * L),
      dwr(L * E, 0.0f);
  moe_combine_backward(dys.data(), dweight.data(), r.data(), ys.data(), weight.data(), pos.data(), N, k, L);
  experts_backward(dxs.data(), dw1.data(), dw3.data(), dw2.data(), dys.data(), xs.data(), a1.data(),
                   a3.data(), h.data(), offsets.data(), nullptr, w1.data(), w3.data(), w2.data(),
                   scratch.data(), A, E, L, F);
  moe_gather_backward(dx.data(), dxs.data(), pos.data(), N, k, L);
  router_backward(dlogits.data(), dweight.data(), weight.data(), expert.data(), logits.data(), N, E,
                  k, RouterKind::kSigmoid, 2.5f);
  linear_backward(dx.data(), dwr.data(), nullptr, dlogits.data(), x.data(), wr.data(), N, L, E, true);
  check_gradient("dx", x, dx, loss, 1e-3);
  check_gradient("dw_router", wr, dwr, loss, 1e-3);
  check_gradient("dw2", w2, dw2, loss, 1e-3);
}

TEST_CASE("router z-loss is the mean squared logsumexp", "[exec][kernels][router]") {
  std::vector<float> logits{0, 0, 0, 0, 1, 2, 3, 4};  // (2 tokens, 4 experts)
  const double a = std::log(4.0);
  const double b = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(4.0));
  CHECK(router_z_loss(logits.data(), 2, 4) == Approx((a * a + b * b) / 2));
}

// gpt-oss's expert activation (openai/gpt-oss gpt_oss/torch/model.py `swiglu`):
// x_glu clamped to at most 7, x_linear to [-7, 7], x_glu σ(1.702 x_glu) (x_linear + 1).
TEST_CASE("clamped SwiGLU variant: gpt-oss's formula, clamps cut the gradient, FD gradients",
          "[exec][kernels][experts]") {
  const SwiGluVariant oss{.alpha = 1.702f, .limit = 7.0f, .linear_offset = 1.0f};
  auto ref = [](double g, double u) {
    g = std::min(g, 7.0);
    u = std::clamp(u, -7.0, 7.0);
    return g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
  };
  const std::vector<float> a1{-3.0f, 0.5f, 6.5f, 9.0f, 12.0f, -0.25f}, a3{0.3f, -8.0f, 2.0f, 9.5f, -1.0f, 7.5f};
  std::vector<float> h(a1.size()), da1(a1.size()), da3(a1.size()), dh(a1.size(), 1.0f);
  swiglu_variant_forward(h.data(), a1.data(), a3.data(), h.size(), oss);
  for (size_t i = 0; i < h.size(); ++i) CHECK(h[i] == Approx(ref(a1[i], a3[i])).epsilon(1e-6));
  swiglu_variant_backward(da1.data(), da3.data(), dh.data(), a1.data(), a3.data(), h.size(), oss);
  CHECK(da1[3] == 0.0f);  // a1 above the limit: the clamp passes nothing
  CHECK(da1[4] == 0.0f);
  CHECK(da3[1] == 0.0f);  // a3 below -limit
  CHECK(da3[3] == 0.0f);  // and above +limit
  CHECK(da3[5] == 0.0f);
  CHECK(da1[0] != 0.0f);
  CHECK(da3[2] != 0.0f);

  // FD on values away from the clamps' kinks (|x ∓ limit| > h), some of them clamped.
  const SwiGluVariant tight{.alpha = 1.702f, .limit = 1.5f, .linear_offset = 1.0f};
  auto x1 = randn(64, 21, 1.5f), x3 = randn(64, 22, 1.5f), r = randn(64, 23);
  for (auto* v : {&x1, &x3})
    for (float& x : *v)
      if (std::abs(std::abs(x) - tight.limit) < 0.05f) x += 0.1f;
  int clamped = 0;
  for (size_t i = 0; i < x1.size(); ++i) clamped += x1[i] > tight.limit || std::abs(x3[i]) > tight.limit;
  CHECK(clamped > 5);  // the test has teeth
  std::vector<float> hh(64), d1(64), d3(64);
  auto loss = [&] {
    swiglu_variant_forward(hh.data(), x1.data(), x3.data(), hh.size(), tight);
    return dot(hh, r);
  };
  swiglu_variant_backward(d1.data(), d3.data(), r.data(), x1.data(), x3.data(), hh.size(), tight);
  check_gradient("da1", x1, d1, loss);
  check_gradient("da3", x3, d3, loss);
  // No clamp (limit 0), another alpha and offset.
  const SwiGluVariant unclamped{.alpha = 0.7f, .limit = 0.0f, .linear_offset = -0.5f};
  auto loss_free = [&] {
    swiglu_variant_forward(hh.data(), x1.data(), x3.data(), hh.size(), unclamped);
    return dot(hh, r);
  };
  swiglu_variant_backward(d1.data(), d3.data(), r.data(), x1.data(), x3.data(), hh.size(), unclamped);
  check_gradient("da1 (no clamp)", x1, d1, loss_free);
  check_gradient("da3 (no clamp)", x3, d3, loss_free);

  // The default variant is the plain SwiGLU, bitwise.
  std::vector<float> plain(64), variant(64);
  swiglu_forward(plain.data(), x1.data(), x3.data(), 64);
  swiglu_variant_forward(variant.data(), x1.data(), x3.data(), 64, SwiGluVariant{});
  CHECK(plain == variant);
}

TEST_CASE("experts with biases and the clamped SwiGLU: drops, idle expert, FD gradients of every tensor",
          "[exec][kernels][experts]") {
  const int E = 3, L = 4, F = 5;
  std::vector<int32_t> offsets{0, 3, 3, 7};  // expert 1 receives nothing
  const int A = 7;
  std::vector<uint8_t> keep{1, 0, 1, 1, 1, 1, 0};
  auto xs = randn(A * L, 31), w1 = randn(E * L * F, 32, 0.6f), w3 = randn(E * L * F, 33, 0.6f),
       w2 = randn(E * F * L, 34, 0.6f), b1 = randn(E * F, 35, 0.5f), b3 = randn(E * F, 36, 0.5f),
       b2 = randn(E * L, 37, 0.5f), r = randn(A * L, 38);
  ExpertOptions opt;
  opt.act = SwiGluVariant{.alpha = 1.702f, .limit = 1.2f, .linear_offset = 1.0f};  // a limit the rows cross
  opt.b1 = b1.data();
  opt.b3 = b3.data();
  opt.b2 = b2.data();
  std::vector<float> ys(A * L), a1(A * F), a3(A * F), h(A * F);
  auto loss = [&] {
    experts_forward(ys.data(), a1.data(), a3.data(), h.data(), xs.data(), offsets.data(), keep.data(), w1.data(),
                    w3.data(), w2.data(), A, E, L, F, opt);
    return dot(ys, r);
  };
  loss();
  for (int row : {1, 6})
    for (int c = 0; c < L; ++c) CHECK(ys[row * L + c] == 0.0f);
  // A kept row of expert 2, by hand: (g σ(αg) (u + 1))·W2 + b2 with the pre-activations biased.
  {
    const int row = 4, e = 2;
    int clamped = 0;
    std::vector<double> hr(F);
    for (int f = 0; f < F; ++f) {
      double p1 = b1[e * F + f], p3 = b3[e * F + f];
      for (int i = 0; i < L; ++i) {
        p1 += double(xs[row * L + i]) * w1[e * L * F + i * F + f];
        p3 += double(xs[row * L + i]) * w3[e * L * F + i * F + f];
      }
      clamped += p1 > 1.2 || std::abs(p3) > 1.2;
      const double g = std::min(p1, 1.2), u = std::clamp(p3, -1.2, 1.2);
      hr[f] = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
    }
    for (int c = 0; c < L; ++c) {
      double y = b2[e * L + c];
      for (int f = 0; f < F; ++f) y += hr[f] * w2[e * F * L + f * L + c];
      CHECK(ys[row * L + c] == Approx(y).margin(1e-5));
    }
    INFO("clamped elements in the row: " << clamped);
  }
  std::vector<float> dxs(A * L, 9.0f), dw1(E * L * F, 0.0f), dw3(E * L * F, 0.0f), dw2(E * F * L, 0.0f),
      db1(E * F, 0.0f), db3(E * F, 0.0f), db2(E * L, 0.0f), scratch(experts_scratch_floats(A, L, F));
  opt.db1 = db1.data();
  opt.db3 = db3.data();
  opt.db2 = db2.data();
  experts_backward(dxs.data(), dw1.data(), dw3.data(), dw2.data(), r.data(), xs.data(), a1.data(), a3.data(),
                   h.data(), offsets.data(), keep.data(), w1.data(), w3.data(), w2.data(), scratch.data(), A, E, L, F,
                   opt);
  for (int row : {1, 6})
    for (int c = 0; c < L; ++c) CHECK(dxs[row * L + c] == 0.0f);
  for (int f = 0; f < F; ++f) CHECK(db1[1 * F + f] == 0.0f);  // the idle expert's biases
  for (int c = 0; c < L; ++c) CHECK(db2[1 * L + c] == 0.0f);
  // db2 of expert 0 is the sum of its kept rows' output gradients (rows 0 and 2; row 1 dropped).
  for (int c = 0; c < L; ++c) CHECK(db2[c] == Approx(double(r[0 * L + c]) + r[2 * L + c]).margin(1e-6));
  check_gradient("dxs", xs, dxs, loss);
  check_gradient("dw1", w1, dw1, loss);
  check_gradient("dw3", w3, dw3, loss);
  check_gradient("dw2", w2, dw2, loss);
  check_gradient("db1", b1, db1, loss);
  check_gradient("db3", b3, db3, loss);
  check_gradient("db2", b2, db2, loss);
}
