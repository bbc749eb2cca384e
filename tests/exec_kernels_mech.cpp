// The kernels of the layer-graph mechanisms beyond the Marin block: GeLU and
// ReLU² MLPs with biases, learned positions, ALiBi and attention sinks. Each
// forward against a plain double reference, each backward by central
// differences (tests/exec_kernels_testutil.h).
#include <cmath>

#include "exec/kernels.h"
#include "models/layer_graph.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::check_gradient;
using rackstep::exec::testing::dot;
using rackstep::exec::testing::randn;

TEST_CASE("GeLU (tanh form) and ReLU² match their formulas and central differences", "[exec][kernels][mech]") {
  const size_t n = 64;
  auto a = randn(n, 1, 2.0f);
  std::vector<float> h(n), da(n);
  gelu_forward(h.data(), a.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i];
    const double want = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    REQUIRE(h[i] == Approx(want).margin(1e-6));
  }
  relu2_forward(h.data(), a.data(), n);
  for (size_t i = 0; i < n; ++i) REQUIRE(h[i] == Approx(a[i] > 0 ? double(a[i]) * a[i] : 0.0).margin(1e-6));

  const auto r = randn(n, 2);
  for (int act = 0; act < 2; ++act) {
    auto fwd = [&] {
      act == 0 ? gelu_forward(h.data(), a.data(), n) : relu2_forward(h.data(), a.data(), n);
      return dot(r, h);
    };
    act == 0 ? gelu_backward(da.data(), r.data(), a.data(), n) : relu2_backward(da.data(), r.data(), a.data(), n);
    check_gradient(act == 0 ? "gelu da" : "relu2 da", a, da, fwd, 1e-3);
  }
}

TEST_CASE("learned positions add the table row of each token's position", "[exec][kernels][mech]") {
  const int N = 6, d = 5, P = 4;
  const std::vector<int32_t> pos{0, 1, 2, 3, 0, 1};
  auto table = randn(static_cast<size_t>(P) * d, 3);
  auto base = randn(static_cast<size_t>(N) * d, 4);
  std::vector<float> out = base;
  position_embedding_forward(out.data(), pos.data(), table.data(), N, d, P);
  for (int t = 0; t < N; ++t)
    for (int c = 0; c < d; ++c) REQUIRE(out[t * d + c] == base[t * d + c] + table[pos[t] * d + c]);
  const auto r = randn(out.size(), 5);
  std::vector<float> dtable(table.size(), 0.0f);
  embedding_backward(dtable.data(), r.data(), pos.data(), N, d, P);
  check_gradient("dpositions", table, dtable, [&] {
    out = base;
    position_embedding_forward(out.data(), pos.data(), table.data(), N, d, P);
    return dot(r, out);
  });
}

TEST_CASE("dense MLP: every activation, with and without biases, by central differences", "[exec][kernels][mech]") {
  const int N = 5, d = 6, F = 8;
  for (MlpActivation act : {MlpActivation::kSwiGlu, MlpActivation::kGelu, MlpActivation::kRelu2}) {
    for (bool bias : {false, true}) {
      const bool gated = act == MlpActivation::kSwiGlu;
      INFO("activation " << static_cast<int>(act) << " bias " << bias);
      auto x = randn(static_cast<size_t>(N) * d, 10);
      auto w1 = randn(static_cast<size_t>(d) * F, 11, 0.5f), w3 = randn(static_cast<size_t>(d) * F, 12, 0.5f);
      auto w2 = randn(static_cast<size_t>(F) * d, 13, 0.5f);
      auto b1 = randn(F, 14, 0.5f), b3 = randn(F, 15, 0.5f), b2 = randn(d, 16, 0.5f);
      std::vector<float> y(static_cast<size_t>(N) * d), a1(static_cast<size_t>(N) * F), a3(a1.size()), h(a1.size());
      auto weights = [&] {
        MlpWeights w;
        w.w1 = w1.data();
        w.w3 = gated ? w3.data() : nullptr;
        w.w2 = w2.data();
        if (bias) {
          w.b1 = b1.data();
          w.b3 = gated ? b3.data() : nullptr;
          w.b2 = b2.data();
        }
        return w;
      };
      auto fwd = [&] {
        dense_mlp_forward(y.data(), a1.data(), gated ? a3.data() : nullptr, h.data(), x.data(), weights(), act, N, d, F);
        return y;
      };
      fwd();
      // Forward against the formula, one output.
      double want = bias ? b2[0] : 0.0;
      for (int f = 0; f < F; ++f) {
        double z1 = bias ? b1[f] : 0.0, z3 = bias ? b3[f] : 0.0;
        for (int c = 0; c < d; ++c) {
          z1 += double(x[c]) * w1[c * F + f];
          z3 += double(x[c]) * w3[c * F + f];
        }
        double hv = 0.0;
        if (act == MlpActivation::kSwiGlu) hv = z1 / (1.0 + std::exp(-z1)) * z3;
        if (act == MlpActivation::kGelu) hv = 0.5 * z1 * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (z1 + 0.044715 * z1 * z1 * z1)));
        if (act == MlpActivation::kRelu2) hv = z1 > 0 ? z1 * z1 : 0.0;
        want += hv * w2[f * d + 0];
      }
      REQUIRE(y[0] == Approx(want).margin(1e-4));

      const auto r = randn(y.size(), 17);
      std::vector<float> dx(x.size()), dw1(w1.size(), 0.f), dw3(w3.size(), 0.f), dw2(w2.size(), 0.f);
      std::vector<float> db1(b1.size(), 0.f), db3(b3.size(), 0.f), db2(b2.size(), 0.f);
      std::vector<float> scratch(dense_mlp_scratch_floats(N, F));
      MlpGrads g;
      g.dw1 = dw1.data();
      g.dw3 = gated ? dw3.data() : nullptr;
      g.dw2 = dw2.data();
      if (bias) {
        g.db1 = db1.data();
        g.db3 = gated ? db3.data() : nullptr;
        g.db2 = db2.data();
      }
      dense_mlp_backward(dx.data(), g, r.data(), x.data(), a1.data(), gated ? a3.data() : nullptr, h.data(), weights(),
                         act, scratch.data(), N, d, F);
      auto loss = [&] { return dot(r, fwd()); };
      check_gradient("dx", x, dx, loss, 1e-2);
      check_gradient("dw1", w1, dw1, loss, 1e-2);
      check_gradient("dw2", w2, dw2, loss, 1e-2);
      if (gated) check_gradient("dw3", w3, dw3, loss, 1e-2);
      if (bias) {
        check_gradient("db1", b1, db1, loss, 1e-2);
        check_gradient("db2", b2, db2, loss, 1e-2);
        if (gated) check_gradient("db3", b3, db3, loss, 1e-2);
      }
    }
  }
}

TEST_CASE("dense MLP with SwiGLU and no biases is dense_swiglu bit for bit", "[exec][kernels][mech]") {
  const int N = 7, d = 6, F = 10;
  auto x = randn(static_cast<size_t>(N) * d, 20);
  auto w1 = randn(static_cast<size_t>(d) * F, 21), w3 = randn(static_cast<size_t>(d) * F, 22);
  auto w2 = randn(static_cast<size_t>(F) * d, 23);
  const size_t nf = static_cast<size_t>(N) * F, nd = static_cast<size_t>(N) * d;
  std::vector<float> y1(nd), y2(nd), a1(nf), a3(nf), h(nf), b1(nf), b3(nf), hh(nf);
  dense_swiglu_forward(y1.data(), a1.data(), a3.data(), h.data(), x.data(), w1.data(), w3.data(), w2.data(), N, d, F);
  MlpWeights w;
  w.w1 = w1.data();
  w.w3 = w3.data();
  w.w2 = w2.data();
  dense_mlp_forward(y2.data(), b1.data(), b3.data(), hh.data(), x.data(), w, MlpActivation::kSwiGlu, N, d, F);
  REQUIRE(y1 == y2);
  const auto r = randn(nd, 24);
  std::vector<float> dx1(nd), dx2(nd), g1(w1.size() * 3, 0.f), g2(w1.size() * 3, 0.f), s(3 * nf);
  dense_swiglu_backward(dx1.data(), g1.data(), g1.data() + w1.size(), g1.data() + 2 * w1.size(), r.data(), x.data(),
                        a1.data(), a3.data(), h.data(), w1.data(), w3.data(), w2.data(), s.data(), N, d, F);
  MlpGrads g;
  g.dw1 = g2.data();
  g.dw3 = g2.data() + w1.size();
  g.dw2 = g2.data() + 2 * w1.size();
  dense_mlp_backward(dx2.data(), g, r.data(), x.data(), a1.data(), a3.data(), h.data(), w, MlpActivation::kSwiGlu,
                     s.data(), N, d, F);
  REQUIRE(dx1 == dx2);
  REQUIRE(g1 == g2);
}

namespace {

struct AttnCase {
  int B = 2, T = 9, H = 4, kv_stored = 2, kv_used = 2, hd = 4, window = 0;
  size_t q_size() const { return static_cast<size_t>(B) * T * H * hd; }
  size_t kv_size() const { return static_cast<size_t>(B) * T * kv_stored * hd; }
};

// Double attention with ALiBi and sinks written from their definitions.
std::vector<double> reference(const AttnCase& s, const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, const std::vector<int32_t>& doc,
                              const std::vector<double>& slopes, const std::vector<float>* sinks, float scale) {
  std::vector<double> o(s.q_size(), 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const int g = h / (s.H / s.kv_used);
      for (int i = 0; i < s.T; ++i) {
        std::vector<double> l(s.T, -INFINITY);
        auto seen = [&](int j) {
          return j <= i && (s.window == 0 || j > i - s.window) && doc[b * s.T + j] == doc[b * s.T + i];
        };
        double den = sinks ? std::exp(double((*sinks)[h])) : 0.0;
        for (int j = 0; j < s.T; ++j) {
          if (!seen(j)) continue;
          double sc = 0.0;
          for (int c = 0; c < s.hd; ++c)
            sc += double(q[((b * s.T + i) * s.H + h) * s.hd + c]) * k[((b * s.T + j) * s.kv_stored + g) * s.hd + c];
          l[j] = sc * scale - (slopes.empty() ? 0.0 : slopes[h] * (i - j));
          den += std::exp(l[j]);
        }
        for (int j = 0; j < s.T; ++j) {
          if (!seen(j)) continue;
          for (int c = 0; c < s.hd; ++c)
            o[((b * s.T + i) * s.H + h) * s.hd + c] +=
                std::exp(l[j]) / den * v[((b * s.T + j) * s.kv_stored + g) * s.hd + c];
        }
      }
    }
  return o;
}

}  // namespace

TEST_CASE("ALiBi slopes follow Press et al.'s get_slopes", "[exec][kernels][mech]") {
  const auto s8 = rackstep::models::alibi_slopes(8);
  for (int h = 0; h < 8; ++h) CHECK(s8[h] == std::exp2(-(h + 1)));
  // 6 heads: the 4-head slopes, then every other 8-head slope (the 1st and the 3rd).
  const auto s6 = rackstep::models::alibi_slopes(6);
  const std::vector<double> want{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  CHECK(s6 == want);
}

TEST_CASE("attention with ALiBi and sinks matches a double reference and central differences",
          "[exec][kernels][mech][attention]") {
  for (int window : {0, 3}) {
    for (int variant = 0; variant < 3; ++variant) {  // ALiBi, sinks, both
      AttnCase s;
      s.window = window;
      const bool alibi = variant != 1, sink = variant != 0;
      INFO("window " << window << " alibi " << alibi << " sinks " << sink);
      auto q = randn(s.q_size(), 31), k = randn(s.kv_size(), 32), v = randn(s.kv_size(), 33);
      auto sinks = randn(s.H, 34);
      const std::vector<int32_t> doc{0, 0, 0, 0, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4, 4, 4, 4, 4};
      std::vector<double> slopes_d = alibi ? rackstep::models::alibi_slopes(s.H) : std::vector<double>{};
      std::vector<float> slopes(slopes_d.begin(), slopes_d.end());
      const float scale = 0.5f;
      AttentionExtras ex;
      ex.alibi_slopes = alibi ? slopes.data() : nullptr;
      ex.sinks = sink ? sinks.data() : nullptr;
      std::vector<float> o(s.q_size()), lse(static_cast<size_t>(s.B) * s.H * s.T);
      auto fwd = [&] {
        attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), doc.data(), s.B, s.T, s.H, s.kv_stored,
                          s.kv_used, s.hd, s.window, scale, ex);
        return o;
      };
      fwd();
      const auto ref = reference(s, q, k, v, doc, slopes_d, sink ? &sinks : nullptr, scale);
      for (size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == Approx(ref[i]).margin(2e-5));

      const auto r = randn(o.size(), 35);
      std::vector<float> dq(q.size()), dk(k.size()), dv(v.size()), dsinks(s.H, 0.0f);
      AttentionExtras bx = ex;
      bx.dsinks = sink ? dsinks.data() : nullptr;
      attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), o.data(), lse.data(),
                         doc.data(), s.B, s.T, s.H, s.kv_stored, s.kv_used, s.hd, s.window, scale, false, bx);
      auto loss = [&] { return dot(r, fwd()); };
      check_gradient("dq", q, dq, loss);
      check_gradient("dk", k, dk, loss);
      check_gradient("dv", v, dv, loss);
      if (sink) check_gradient("dsinks", sinks, dsinks, loss);
    }
  }
}
