// Attention core (causal, sliding window, GQA with kv_used < kv_stored,
// document masking), XSA and the per-head gate.
#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

using namespace rackstep::exec;
using rackstep::exec::testing::check_gradient;
using rackstep::exec::testing::dot;
using rackstep::exec::testing::randn;

namespace {

struct Shape {
  int B = 2, T = 9, H = 4, kv_stored = 3, kv_used = 2, hd = 4, window = 4;
  size_t q_size() const { return static_cast<size_t>(B) * T * H * hd; }
  size_t kv_size() const { return static_cast<size_t>(B) * T * kv_stored * hd; }
};

// Plain double-precision attention with an explicit visibility rule.
std::vector<double> reference_attention(const Shape& s, const std::vector<float>& q,
                                        const std::vector<float>& k, const std::vector<float>& v,
                                        const std::vector<int32_t>* doc, float scale) {
  std::vector<double> o(s.q_size(), 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const int g = h / (s.H / s.kv_used);
      for (int i = 0; i < s.T; ++i) {
        std::vector<double> p(s.T, 0.0);
        double mx = -1e300, sum = 0.0;
        auto seen = [&](int j) {
          if (j > i) return false;
          if (s.window > 0 && j <= i - s.window) return false;
          return !doc || (*doc)[b * s.T + j] == (*doc)[b * s.T + i];
        };
        for (int j = 0; j < s.T; ++j) {
          if (!seen(j)) continue;
          double sc = 0.0;
          for (int c = 0; c < s.hd; ++c)
            sc += static_cast<double>(q[((b * s.T + i) * s.H + h) * s.hd + c]) *
                  k[((b * s.T + j) * s.kv_stored + g) * s.hd + c];
          p[j] = sc * scale;
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j < s.T; ++j)
          if (seen(j)) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j < s.T; ++j) {
          if (!seen(j)) continue;
          for (int c = 0; c < s.hd; ++c)
            o[((b * s.T + i) * s.H + h) * s.hd + c] +=
                p[j] / sum * v[((b * s.T + j) * s.kv_stored + g) * s.hd + c];
        }
      }
    }
  return o;
}

}  // namespace

TEST_CASE("attention forward matches a double reference (window, docs, GQA)", "[exec][kernels][attention]") {
  for (int window : {0, 1, 4}) {
    for (bool with_doc : {false, true}) {
      Shape s;
      s.window = window;
      auto q = randn(s.q_size(), 1), k = randn(s.kv_size(), 2), v = randn(s.kv_size(), 3);
      std::vector<int32_t> doc{0, 0, 0, 1, 1, 1, 1, 2, 2, 5, 5, 6, 6, 6, 6, 6, 7, 7};
      const float scale = 0.5f;
      std::vector<float> o(s.q_size()), lse(s.B * s.H * s.T);
      attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(),
                        with_doc ? doc.data() : nullptr, s.B, s.T, s.H, s.kv_stored, s.kv_used,
                        s.hd, s.window, scale);
      auto ref = reference_attention(s, q, k, v, with_doc ? &doc : nullptr, scale);
      INFO("window " << window << " doc " << with_doc);
      for (size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == Approx(ref[i]).margin(1e-5));
    }
  }
}

TEST_CASE("attention masks: keys outside the window or document do not matter", "[exec][kernels][attention]") {
  Shape s;
  s.B = 1;
  s.window = 3;
  auto q = randn(s.q_size(), 4), k = randn(s.kv_size(), 5), v = randn(s.kv_size(), 6);
  std::vector<int32_t> doc{0, 0, 0, 0, 1, 1, 1, 1, 1};  // document 1 starts at t = 4
  std::vector<float> o1(s.q_size()), o2(s.q_size()), lse(s.H * s.T);
  auto run = [&](std::vector<float>& o) {
    attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), doc.data(), s.B, s.T,
                      s.H, s.kv_stored, s.kv_used, s.hd, s.window, 0.5f);
  };
  run(o1);
  // Change key/value 4 (first token of document 1): queries 0..3 (earlier
  // document, causal) and 7, 8 (window 3 sees 5..7 and 6..8) must not move.
  for (int g = 0; g < s.kv_stored; ++g)
    for (int c = 0; c < s.hd; ++c) {
      k[(4 * s.kv_stored + g) * s.hd + c] += 3.0f;
      v[(4 * s.kv_stored + g) * s.hd + c] -= 5.0f;
    }
  run(o2);
  for (int t = 0; t < s.T; ++t) {
    double diff = 0.0;
    for (int i = 0; i < s.H * s.hd; ++i) diff += std::abs(o1[t * s.H * s.hd + i] - o2[t * s.H * s.hd + i]);
    INFO("query " << t);
    if (t < 4 || t >= 7) CHECK(diff == 0.0);
    else CHECK(diff > 1e-3);
  }
  // Query 4 starts a document and sees only itself: its output is its own v.
  for (int h = 0; h < s.H; ++h)
    for (int c = 0; c < s.hd; ++c)
      CHECK(o2[(4 * s.H + h) * s.hd + c] ==
            Approx(v[(4 * s.kv_stored + h / (s.H / s.kv_used)) * s.hd + c]));
}

TEST_CASE("attention backward matches finite differences", "[exec][kernels][attention]") {
  for (int window : {0, 3}) {
    Shape s;
    s.window = window;
    auto q = randn(s.q_size(), 7), k = randn(s.kv_size(), 8), v = randn(s.kv_size(), 9),
         r = randn(s.q_size(), 10);
    std::vector<int32_t> doc{0, 0, 0, 1, 1, 1, 1, 2, 2, 5, 5, 6, 6, 6, 6, 6, 7, 7};
    std::vector<float> o(s.q_size()), lse(s.B * s.H * s.T);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
    auto loss = [&] {
      attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), doc.data(), s.B, s.T,
                        s.H, s.kv_stored, s.kv_used, s.hd, s.window, scale);
      return dot(o, r);
    };
    loss();
    std::vector<float> dq(s.q_size()), dk(s.kv_size(), 7.0f), dv(s.kv_size(), 7.0f);
    attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(),
                       o.data(), lse.data(), doc.data(), s.B, s.T, s.H, s.kv_stored, s.kv_used,
                       s.hd, s.window, scale);
    INFO("window " << window);
    check_gradient("dq", q, dq, loss);
    check_gradient("dk", k, dk, loss, 1e-2, 2e-2, 2e-3, 72);
    check_gradient("dv", v, dv, loss, 1e-2, 2e-2, 2e-3, 72);
    // The stored kv head the layer does not use gets exactly zero.
    for (int t = 0; t < s.B * s.T; ++t)
      for (int c = 0; c < s.hd; ++c) {
        CHECK(dk[(t * s.kv_stored + 2) * s.hd + c] == 0.0f);
        CHECK(dv[(t * s.kv_stored + 2) * s.hd + c] == 0.0f);
      }
    // accumulate_dkv adds onto what is there; reruns are bitwise identical.
    auto dk2 = dk, dv2 = dv;
    std::vector<float> dq2(s.q_size());
    attention_backward(dq2.data(), dk2.data(), dv2.data(), r.data(), q.data(), k.data(), v.data(),
                       o.data(), lse.data(), doc.data(), s.B, s.T, s.H, s.kv_stored, s.kv_used,
                       s.hd, s.window, scale, true);
    CHECK(dq2 == dq);
    for (size_t i = 0; i < dk.size(); ++i) CHECK(dk2[i] == Approx(2 * dk[i]).margin(1e-6));
  }
}

TEST_CASE("XSA output is orthogonal to the token's own value vector", "[exec][kernels][xsa]") {
  const int N = 5, H = 4, kv_stored = 3, kv_used = 2, hd = 8;
  auto o = randn(N * H * hd, 11), v = randn(N * kv_stored * hd, 12);
  std::vector<float> y(o.size());
  xsa_forward(y.data(), o.data(), v.data(), N, H, kv_stored, kv_used, hd, 1e-6f);
  for (int n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) {
      const float* yh = &y[(n * H + h) * hd];
      const float* vg = &v[(n * kv_stored + h / 2) * hd];
      double yv = 0.0, yy = 0.0, vv = 0.0;
      for (int i = 0; i < hd; ++i) {
        yv += yh[i] * vg[i];
        yy += yh[i] * yh[i];
        vv += vg[i] * vg[i];
      }
      CHECK(std::abs(yv) <= 1e-5 * std::sqrt(yy * vv));
    }
}

TEST_CASE("XSA gradients match finite differences", "[exec][kernels][xsa]") {
  const int N = 3, H = 4, kv_stored = 3, kv_used = 2, hd = 5;
  auto o = randn(N * H * hd, 13), v = randn(N * kv_stored * hd, 14), r = randn(N * H * hd, 15);
  std::vector<float> y(o.size());
  auto loss = [&] {
    xsa_forward(y.data(), o.data(), v.data(), N, H, kv_stored, kv_used, hd, 1e-6f);
    return dot(y, r);
  };
  std::vector<float> d_o(o.size()), dv(v.size(), 0.0f);
  xsa_backward(d_o.data(), dv.data(), r.data(), o.data(), v.data(), N, H, kv_stored, kv_used, hd, 1e-6f);
  check_gradient("do", o, d_o, loss, 1e-3);
  check_gradient("dv", v, dv, loss, 1e-3);
}

TEST_CASE("attention gate: g in (0, 2) and gradients match finite differences", "[exec][kernels][gate]") {
  const int N = 4, d = 6, H = 3, hd = 5;
  auto o = randn(N * H * hd, 16), x = randn(N * d, 17), wg = randn(d * H, 18), r = randn(N * H * hd, 19);
  std::vector<float> y(o.size()), g(N * H);
  auto loss = [&] {
    attn_gate_forward(y.data(), g.data(), o.data(), x.data(), wg.data(), N, d, H, hd);
    return dot(y, r);
  };
  loss();
  for (float gv : g) CHECK((gv > 0.0f && gv < 2.0f));
  std::vector<float> zero_w(d * H, 0.0f), g0(N * H), y0(o.size());
  attn_gate_forward(y0.data(), g0.data(), o.data(), x.data(), zero_w.data(), N, d, H, hd);
  for (size_t i = 0; i < o.size(); ++i) CHECK(y0[i] == Approx(o[i]));  // 2σ(0) = 1
  std::vector<float> d_o(o.size()), dx(N * d), dwg(d * H, 0.0f), scratch(N * H);
  attn_gate_backward(d_o.data(), dx.data(), dwg.data(), r.data(), o.data(), x.data(), g.data(),
                     wg.data(), scratch.data(), N, d, H, hd);
  check_gradient("do", o, d_o, loss, 1e-3);
  check_gradient("dx", x, dx, loss, 1e-3);
  check_gradient("dw_gate", wg, dwg, loss, 1e-3);
}

// Sequences longer than one query tile (128 rows, or the window's height):
// several tiles, a last partial tile, keys shared across tile boundaries.
TEST_CASE("attention over several query tiles matches the reference and finite differences",
          "[exec][kernels][attention]") {
  for (int window : {0, 40, 100}) {
    Shape s;
    s.B = 1;
    s.T = 300;
    s.H = 2;
    s.kv_stored = 1;
    s.kv_used = 1;
    s.window = window;
    auto q = randn(s.q_size(), 21), k = randn(s.kv_size(), 22), v = randn(s.kv_size(), 23),
         r = randn(s.q_size(), 24);
    std::vector<int32_t> doc(static_cast<size_t>(s.T));
    for (int t = 0; t < s.T; ++t) doc[t] = t < 170 ? 0 : (t < 181 ? 1 : 2);  // documents across tiles
    const float scale = 0.5f;
    std::vector<float> o(s.q_size()), lse(s.B * s.H * s.T);
    auto loss = [&] {
      attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), doc.data(), s.B, s.T,
                        s.H, s.kv_stored, s.kv_used, s.hd, s.window, scale);
      return dot(o, r);
    };
    loss();
    const auto ref = reference_attention(s, q, k, v, &doc, scale);
    INFO("window " << window);
    for (size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == Approx(ref[i]).margin(1e-5));
    std::vector<float> dq(s.q_size()), dk(s.kv_size()), dv(s.kv_size());
    attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(),
                       o.data(), lse.data(), doc.data(), s.B, s.T, s.H, s.kv_stored, s.kv_used,
                       s.hd, s.window, scale);
    check_gradient("dq", q, dq, loss, 1e-2, 2e-2, 2e-3, 64);
    check_gradient("dk", k, dk, loss, 1e-2, 2e-2, 2e-3, 64);
    check_gradient("dv", v, dv, loss, 1e-2, 2e-2, 2e-3, 64);
  }
}
