// The CUDA backend's formulas (exec/cuda/element_math.h), compiled for the CPU,
// against the CPU reference kernels: CI has no GPU, so this is where a formula
// of the CUDA kernels that drifts from exec/cpu/ is caught.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "exec/arena.h"
#include "exec/cuda/element_math.h"
#include "exec/kernels.h"
#include "exec/optim.h"
#include "models/layer_graph.h"
#include "tests/exec_kernels_testutil.h"

namespace {

using namespace rackstep::exec;

using testing::normalised_error;
using testing::randn;

// Largest |a − b| / (|b| + 1e-6) over the two buffers.
double max_rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (std::abs(double(b[i])) + 1e-6));
  return worst;
}

}  // namespace

TEST_CASE("cuda element math: SwiGLU forward and backward equal the CPU kernels", "[cuda][math]") {
  const size_t n = 4096;
  const auto a1 = randn(n, 1, 3.0f), a3 = randn(n, 2), dh = randn(n, 3);
  std::vector<float> h_cpu(n), da1_cpu(n), da3_cpu(n), h(n), da1(n), da3(n);
  swiglu_forward(h_cpu.data(), a1.data(), a3.data(), n);
  swiglu_backward(da1_cpu.data(), da3_cpu.data(), dh.data(), a1.data(), a3.data(), n);
  for (size_t i = 0; i < n; ++i) {
    h[i] = cuda::swiglu(a1[i], a3[i]);
    cuda::swiglu_grad(dh[i], a1[i], a3[i], &da1[i], &da3[i]);
  }
  CHECK(max_rel_error(h, h_cpu) == 0.0);
  CHECK(max_rel_error(da1, da1_cpu) == 0.0);
  CHECK(max_rel_error(da3, da3_cpu) == 0.0);
}

TEST_CASE("cuda element math: the experts' clamped SwiGLU (gpt-oss) equals the CPU kernel, clamps and NaN included",
          "[cuda][math]") {
  const size_t n = 4096;
  auto a1 = randn(n, 11, 4.0f), a3 = randn(n, 12, 4.0f);
  const auto dh = randn(n, 13);
  a1[0] = 7.0f;  // on the limits: the clamp passes the gradient (torch.clamp)
  a3[1] = -7.0f;
  a3[2] = 7.0f;
  a1[3] = std::nanf("");
  a3[4] = std::nanf("");
  for (const SwiGluVariant v : {SwiGluVariant{.alpha = 1.702f, .limit = 7.0f, .linear_offset = 1.0f},
                                SwiGluVariant{.alpha = 0.5f, .limit = 0.0f, .linear_offset = -1.0f}}) {
    std::vector<float> h_cpu(n), da1_cpu(n), da3_cpu(n), h(n), da1(n), da3(n);
    swiglu_variant_forward(h_cpu.data(), a1.data(), a3.data(), n, v);
    swiglu_variant_backward(da1_cpu.data(), da3_cpu.data(), dh.data(), a1.data(), a3.data(), n, v);
    for (size_t i = 0; i < n; ++i) {
      h[i] = cuda::swiglu_variant(a1[i], a3[i], v.alpha, v.limit, v.linear_offset);
      cuda::swiglu_variant_grad(dh[i], a1[i], a3[i], v.alpha, v.limit, v.linear_offset, &da1[i], &da3[i]);
    }
    for (size_t i = 0; i < n; ++i) {
      INFO("element " << i << " a1 " << a1[i] << " a3 " << a3[i]);
      CHECK(std::memcmp(&h[i], &h_cpu[i], sizeof(float)) == 0);  // bitwise, NaN too
      CHECK(std::memcmp(&da1[i], &da1_cpu[i], sizeof(float)) == 0);
      CHECK(std::memcmp(&da3[i], &da3_cpu[i], sizeof(float)) == 0);
    }
    CHECK(std::isnan(h[3]));  // a NaN is not clamped away
    CHECK(std::isnan(h[4]));
  }
}

TEST_CASE("cuda element math: GeLU and ReLU² forward and backward equal the CPU kernels bitwise", "[cuda][math]") {
  // The same float operations in the same order as exec/cpu/activations.cpp:
  // bitwise on the host. Edge values: 0 and −0, the tanh saturation (|x| ≥ 10),
  // GeLU's negative tail where 1 + tanh cancels, a cube past fp32's range, NaN.
  const size_t n = 4096;
  auto a = randn(n, 14, 3.0f);
  const auto dh = randn(n, 15);
  const float edges[] = {0.0f, -0.0f, 10.0f, -10.0f, -5.5f, 1e-20f, -1e-20f, 3e13f, -3e13f, std::nanf("")};
  std::copy(std::begin(edges), std::end(edges), a.begin());
  std::vector<float> h_cpu(n), da_cpu(n), h(n), da(n);

  gelu_forward(h_cpu.data(), a.data(), n);
  gelu_backward(da_cpu.data(), dh.data(), a.data(), n);
  for (size_t i = 0; i < n; ++i) {
    h[i] = cuda::gelu(a[i]);
    da[i] = cuda::gelu_grad(dh[i], a[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    INFO("GeLU, element " << i << " a " << a[i]);
    CHECK(std::memcmp(&h[i], &h_cpu[i], sizeof(float)) == 0);
    CHECK(std::memcmp(&da[i], &da_cpu[i], sizeof(float)) == 0);
  }
  CHECK(std::isnan(h[9]));

  relu2_forward(h_cpu.data(), a.data(), n);
  relu2_backward(da_cpu.data(), dh.data(), a.data(), n);
  for (size_t i = 0; i < n; ++i) {
    h[i] = cuda::relu2(a[i]);
    da[i] = cuda::relu2_grad(dh[i], a[i]);
  }
  for (size_t i = 0; i < n; ++i) {
    INFO("ReLU², element " << i << " a " << a[i]);
    CHECK(std::memcmp(&h[i], &h_cpu[i], sizeof(float)) == 0);
    CHECK(std::memcmp(&da[i], &da_cpu[i], sizeof(float)) == 0);
  }
  CHECK(h[9] == 0.0f);  // max(NaN, 0)² is 0 on both, as `x > 0 ? x : 0` gives
}

TEST_CASE("cuda element math: dense MLPs with biases, composed as exec/cuda/layers.cpp does, equal the CPU's",
          "[cuda][math]") {
  // The CUDA composition: bias-free GEMMs (CPU linear layers here), each bias
  // added to every row after its GEMM (detail::add_bias_rows; the CPU starts
  // the GEMM from the bias), the shared activation formulas, and bias
  // gradients as column sums in row order in double (detail::bias_grad_rows;
  // the CPU sums per-thread partials): equal to fp32 rounding.
  const int N = 13, d = 24, F = 40;
  const auto x = randn(size_t(N) * d, 50), dy = randn(size_t(N) * d, 51);
  const auto w1 = randn(size_t(d) * F, 52, 0.3f), w3 = randn(size_t(d) * F, 53, 0.3f),
             w2 = randn(size_t(F) * d, 54, 0.3f), b1 = randn(F, 55), b3 = randn(F, 56), b2 = randn(d, 57);
  const auto add_bias = [](std::vector<float>& y, const std::vector<float>& b) {
    for (size_t i = 0; i < y.size(); ++i) y[i] += b[i % b.size()];
  };
  const auto bias_grad = [](std::vector<float>& db, const std::vector<float>& g) {
    const size_t width = db.size(), rows = g.size() / width;
    for (size_t c = 0; c < width; ++c) {
      double sum = 0.0;
      for (size_t r = 0; r < rows; ++r) sum += g[r * width + c];
      db[c] += static_cast<float>(sum);
    }
  };
  for (const MlpActivation act : {MlpActivation::kGelu, MlpActivation::kRelu2, MlpActivation::kSwiGlu}) {
    const bool gated = act == MlpActivation::kSwiGlu;
    INFO("activation " << static_cast<int>(act));
    const MlpWeights w{.w1 = w1.data(), .w3 = gated ? w3.data() : nullptr, .w2 = w2.data(), .b1 = b1.data(),
                       .b3 = gated ? b3.data() : nullptr, .b2 = b2.data()};
    const size_t nf = size_t(N) * F;
    std::vector<float> y_cpu(x.size()), a1_cpu(nf), a3_cpu(nf), h_cpu(nf), dx_cpu(x.size());
    std::vector<float> dw1_cpu(w1.size(), 0.0f), dw3_cpu(w3.size(), 0.0f), dw2_cpu(w2.size(), 0.0f),
        db1_cpu(F, 0.0f), db3_cpu(F, 0.0f), db2_cpu(d, 0.0f), scratch(dense_mlp_scratch_floats(N, F));
    dense_mlp_forward(y_cpu.data(), a1_cpu.data(), gated ? a3_cpu.data() : nullptr, h_cpu.data(), x.data(), w, act, N,
                      d, F);
    const MlpGrads g_cpu{.dw1 = dw1_cpu.data(), .dw3 = gated ? dw3_cpu.data() : nullptr, .dw2 = dw2_cpu.data(),
                         .db1 = db1_cpu.data(), .db3 = gated ? db3_cpu.data() : nullptr, .db2 = db2_cpu.data()};
    dense_mlp_backward(dx_cpu.data(), g_cpu, dy.data(), x.data(), a1_cpu.data(), a3_cpu.data(), h_cpu.data(), w, act,
                       scratch.data(), N, d, F);

    std::vector<float> a1(nf), a3(nf), h(nf), y(x.size());
    linear_forward(a1.data(), x.data(), w1.data(), nullptr, N, d, F);
    add_bias(a1, b1);
    if (gated) {
      linear_forward(a3.data(), x.data(), w3.data(), nullptr, N, d, F);
      add_bias(a3, b3);
    }
    for (size_t i = 0; i < nf; ++i)
      h[i] = act == MlpActivation::kGelu ? cuda::gelu(a1[i])
             : act == MlpActivation::kRelu2 ? cuda::relu2(a1[i])
                                            : cuda::swiglu(a1[i], a3[i]);
    linear_forward(y.data(), h.data(), w2.data(), nullptr, N, F, d);
    add_bias(y, b2);
    CHECK(normalised_error(a1, a1_cpu) < 1e-6);
    CHECK(normalised_error(h, h_cpu) < 1e-6);
    CHECK(normalised_error(y, y_cpu) < 1e-6);

    std::vector<float> dh(nf), da1(nf), da3(nf), dx(x.size()), dw1(w1.size(), 0.0f), dw3(w3.size(), 0.0f),
        dw2(w2.size(), 0.0f), db1(F, 0.0f), db3(F, 0.0f), db2(d, 0.0f);
    bias_grad(db2, dy);
    linear_backward(dh.data(), dw2.data(), nullptr, dy.data(), h_cpu.data(), w2.data(), N, F, d);
    for (size_t i = 0; i < nf; ++i) {
      if (act == MlpActivation::kGelu) da1[i] = cuda::gelu_grad(dh[i], a1_cpu[i]);
      if (act == MlpActivation::kRelu2) da1[i] = cuda::relu2_grad(dh[i], a1_cpu[i]);
      if (gated) cuda::swiglu_grad(dh[i], a1_cpu[i], a3_cpu[i], &da1[i], &da3[i]);
    }
    bias_grad(db1, da1);
    linear_backward(dx.data(), dw1.data(), nullptr, da1.data(), x.data(), w1.data(), N, d, F);
    if (gated) {
      bias_grad(db3, da3);
      linear_backward(dx.data(), dw3.data(), nullptr, da3.data(), x.data(), w3.data(), N, d, F, true);
    }
    CHECK(normalised_error(dx, dx_cpu) < 1e-6);
    CHECK(normalised_error(dw1, dw1_cpu) < 1e-6);
    CHECK(normalised_error(dw2, dw2_cpu) < 1e-6);
    CHECK(normalised_error(db1, db1_cpu) < 1e-6);
    CHECK(normalised_error(db2, db2_cpu) < 1e-6);
    if (gated) {
      CHECK(normalised_error(dw3, dw3_cpu) < 1e-6);
      CHECK(normalised_error(db3, db3_cpu) < 1e-6);
    }
  }
}

TEST_CASE("cuda element math: learned positions added after the token row equal the CPU's bitwise", "[cuda][math]") {
  // exec/cuda/loss.cu: the token row stored, then out + table[pos] (one float
  // add, as the CPU's +=); the backward is the token table's scatter-add, over pos.
  const int N = 10, d = 16, V = 7, P = 12;
  const auto tok_table = randn(size_t(V) * d, 58), pos_table = randn(size_t(P) * d, 59);
  std::vector<int32_t> tokens(N), pos(N);
  for (int t = 0; t < N; ++t) {
    tokens[t] = (t * 3) % V;
    pos[t] = t % 6;  // two documents: positions restart
  }
  std::vector<float> out_cpu(size_t(N) * d), out(size_t(N) * d);
  embedding_forward(out_cpu.data(), tokens.data(), tok_table.data(), N, d, V);
  position_embedding_forward(out_cpu.data(), pos.data(), pos_table.data(), N, d, P);
  for (int t = 0; t < N; ++t)
    for (int c = 0; c < d; ++c) {
      const size_t i = size_t(t) * d + c;
      out[i] = tok_table[size_t(tokens[t]) * d + c];
      out[i] = out[i] + pos_table[size_t(pos[t]) * d + c];
    }
  CHECK(std::memcmp(out.data(), out_cpu.data(), sizeof(float) * out.size()) == 0);
}

TEST_CASE("cuda element math: RMSNorm statistics and backward coefficient equal the CPU kernel", "[cuda][math]") {
  const int rows = 7, d = 96;
  const auto x = randn(size_t(rows) * d, 4, 2.0f), gain = randn(d, 5), dy = randn(x.size(), 6);
  std::vector<float> y_cpu(x.size()), rstd_cpu(rows), dx_cpu(x.size()), dgain_cpu(d, 0.0f);
  rmsnorm_forward(y_cpu.data(), rstd_cpu.data(), x.data(), gain.data(), 1e-6f, rows, d);
  rmsnorm_backward(dx_cpu.data(), dgain_cpu.data(), dy.data(), x.data(), rstd_cpu.data(), gain.data(), rows, d);

  // The kernels' per-row arithmetic, serially: block_sum changes only the order of a double sum.
  std::vector<float> y(x.size()), dx(x.size());
  for (int n = 0; n < rows; ++n) {
    const float* xr = &x[size_t(n) * d];
    double ss = 0.0, dot = 0.0;
    for (int i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    const float r = cuda::rms_rstd(ss, d, 1e-6f);
    CHECK(r == Approx(rstd_cpu[n]).epsilon(1e-6));
    for (int i = 0; i < d; ++i) y[size_t(n) * d + i] = xr[i] * r * gain[i];
    for (int i = 0; i < d; ++i) dot += double(dy[size_t(n) * d + i]) * gain[i] * xr[i];
    const float k = cuda::rms_backward_k(dot, r, d);
    for (int i = 0; i < d; ++i) dx[size_t(n) * d + i] = r * gain[i] * dy[size_t(n) * d + i] - xr[i] * k;
  }
  CHECK(max_rel_error(y, y_cpu) < 1e-6);
  CHECK(max_rel_error(dx, dx_cpu) < 1e-4);  // a difference of two terms: relative error grows near 0
}

TEST_CASE("cuda element math: partial RoPE rotation equals the CPU kernel forward and backward", "[cuda][math]") {
  const int N = 5, heads = 3, hd = 16, rot = 8;
  const float theta = 10000.0f;
  const auto x = randn(size_t(N) * heads * hd, 7);
  const std::vector<int32_t> pos = {0, 1, 17, 4095, 16383};
  for (float sign : {1.0f, -1.0f}) {
    std::vector<float> y_cpu(x.size()), y(x);
    if (sign > 0) rope_forward(y_cpu.data(), x.data(), pos.data(), N, heads, hd, rot, theta);
    else rope_backward(y_cpu.data(), x.data(), pos.data(), N, heads, hd, rot, theta);
    for (int n = 0; n < N; ++n)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < rot / 2; ++i) {
          const size_t base = (size_t(n) * heads + h) * hd;
          cuda::rope_rotate(x[base + i], x[base + i + rot / 2], cuda::rope_angle(pos[n], i, rot, theta), sign,
                            &y[base + i], &y[base + i + rot / 2]);
        }
    CHECK(max_rel_error(y, y_cpu) == 0.0);
  }
}

TEST_CASE("cuda element math: YaRN RoPE (frequencies, ramp, scale) equals the CPU kernel forward and backward",
          "[cuda][math]") {
  const int N = 5, heads = 3, hd = 64, rot = 48;
  const float theta = 150000.0f;
  const auto x = randn(size_t(N) * heads * hd, 7);
  const std::vector<int32_t> pos = {0, 1, 17, 4095, 16383};
  for (const bool truncate : {false, true}) {
    const RopeYarn yarn{.factor = 32.0, .original_positions = 4096.0, .beta_fast = 32.0, .beta_slow = 1.0,
                        .truncate = truncate};
    double low = 0, high = 0;
    cuda::yarn_ramp_ends(rot, theta, yarn.original_positions, yarn.beta_fast, yarn.beta_slow, truncate, &low, &high);
    REQUIRE(low > 0.0);
    REQUIRE(high < rot / 2.0);  // the ramp lies inside the pairs: both sides of it are exercised
    for (float sign : {1.0f, -1.0f}) {
      std::vector<float> y_cpu(x.size()), y(x);
      if (sign > 0) rope_forward(y_cpu.data(), x.data(), pos.data(), N, heads, hd, rot, theta, &yarn);
      else rope_backward(y_cpu.data(), x.data(), pos.data(), N, heads, hd, rot, theta, &yarn);
      for (int n = 0; n < N; ++n)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < rot / 2; ++i) {
            const size_t base = (size_t(n) * heads + h) * hd;
            cuda::rope_rotate(x[base + i], x[base + i + rot / 2],
                              cuda::rope_angle_yarn(pos[n], i, rot, theta, yarn.factor, low, high), sign, &y[base + i],
                              &y[base + i + rot / 2], cuda::yarn_scale(yarn.factor));
          }
      INFO("truncate " << truncate << " sign " << sign);
      CHECK(max_rel_error(y, y_cpu) == 0.0);
    }
  }
}

TEST_CASE("cuda element math: three Adam steps equal the CPU optimizer bitwise", "[cuda][math]") {
  const int64_t n = 1000;
  auto layout = std::make_shared<ArenaLayout>(std::vector<TensorSpec>{{"gain", {n}, OptGroup::kAdam}});
  Arena params(layout), grads(layout);
  const auto w_init = randn(n, 11);
  std::copy(w_init.begin(), w_init.end(), params.view("gain").data);
  OptimizerState st = init_optimizer_state(params);
  OptimizerConfig cfg;
  cfg.adam_lr = 0.01;
  cfg.adam_weight_decay = 0.1;
  cfg.total_steps = 10;
  Optimizer opt(cfg);

  std::vector<float> w = w_init, m(n, 0.0f), v(n, 0.0f);
  for (int step = 0; step < 3; ++step) {
    const auto g = randn(n, 20 + step);
    std::copy(g.begin(), g.end(), grads.view("gain").data);
    // The scalars exactly as exec/optim.cpp forms them.
    const double lr_now = opt.lr(OptGroup::kAdam, step), t = step + 1.0;
    const auto c1 = static_cast<float>(1.0 / (1.0 - std::pow(cfg.beta1, t)));
    const auto c2 = static_cast<float>(1.0 / (1.0 - std::pow(cfg.beta2, t)));
    const auto b1 = static_cast<float>(cfg.beta1), b2 = static_cast<float>(cfg.beta2);
    const auto lr_f = static_cast<float>(lr_now), decay = static_cast<float>(lr_now * cfg.adam_weight_decay);
    opt.step(params, grads, st);
    for (int64_t i = 0; i < n; ++i) {
      cuda::adam_moments(g[i], b1, b2, &m[i], &v[i]);
      w[i] = cuda::adam_weight(w[i], m[i], v[i], lr_f, c1, c2, static_cast<float>(cfg.eps), decay);
    }
  }
  const float* w_cpu = params.view("gain").data;
  for (int64_t i = 0; i < n; ++i) REQUIRE(w[i] == w_cpu[i]);
  for (int64_t i = 0; i < n; ++i) REQUIRE(m[i] == st.momentum.view("gain").data[i]);
}

TEST_CASE("cuda element math: attention visibility and GQA mapping reproduce the CPU attention", "[cuda][math]") {
  // A naive attention over the shared visibility rule against exec's kernel:
  // window, documents and GQA with fewer KV heads used than stored.
  const int B = 2, T = 24, H = 4, kv_stored = 2, kv_used = 1, hd = 8, window = 7;
  const float scale = 0.35f;
  const auto q = randn(size_t(B) * T * H * hd, 30), k = randn(size_t(B) * T * kv_stored * hd, 31),
             v = randn(size_t(B) * T * kv_stored * hd, 32);
  std::vector<int32_t> doc(size_t(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) doc[size_t(b) * T + t] = (t + 3 * b) / 10;  // documents of 10 tokens
  std::vector<float> o_cpu(q.size()), lse_cpu(size_t(B) * H * T);
  attention_forward(o_cpu.data(), lse_cpu.data(), q.data(), k.data(), v.data(), doc.data(), B, T, H, kv_stored,
                    kv_used, hd, window, scale);

  std::vector<float> o(q.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const int g = cuda::kv_head_of(h, H, kv_used);
        const float* qr = &q[((size_t(b) * T + t) * H + h) * hd];
        std::vector<double> s(T, -1e300);
        double mx = -1e300;
        for (int j = 0; j < T; ++j) {
          if (!cuda::attention_visible(t, j, window, doc[size_t(b) * T + t], doc[size_t(b) * T + j])) continue;
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(qr[d]) * k[((size_t(b) * T + j) * kv_stored + g) * hd + d];
          s[j] = scale * dot;
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        std::vector<double> acc(hd, 0.0);
        for (int j = 0; j < T; ++j) {
          if (s[j] <= -1e299) continue;
          const double p = std::exp(s[j] - mx);
          l += p;
          for (int d = 0; d < hd; ++d) acc[d] += p * v[((size_t(b) * T + j) * kv_stored + g) * hd + d];
        }
        for (int d = 0; d < hd; ++d) o[((size_t(b) * T + t) * H + h) * hd + d] = static_cast<float>(acc[d] / l);
        CHECK(lse_cpu[(size_t(b) * H + h) * T + t] == Approx(mx + std::log(l)).epsilon(1e-5));
      }
  CHECK(max_rel_error(o, o_cpu) < 1e-3);  // relative per element: near-zero outputs dominate
  CHECK(testing::normalised_error(o, o_cpu) < 1e-5);
}

// The attention kernels of exec/cuda/attention.cu replayed on the host in their
// own order and precision (fp32; an online softmax per query row in the
// forward, the sink taken last; probabilities recomputed from the saved lse in
// the backward, dq per query row, dk and dv per key row, each head's sink
// gradient summed over its rows in double), every score through alibi_score.
namespace {

struct HostAttention {
  int B, T, H, kv_stored, kv_used, hd, window;
  float scale;
  const std::vector<float>& slopes;  // (H) models::alibi_slopes(H) as floats
  const std::vector<int32_t>& doc;   // (B, T)
  const float* sinks = nullptr;      // (H) gpt-oss's sink logits, or none
  size_t qi(int b, int t, int h) const { return ((size_t(b) * T + t) * H + h) * hd; }
  size_t ki(int b, int t, int g) const { return ((size_t(b) * T + t) * kv_stored + g) * hd; }
  size_t ri(int b, int h, int t) const { return (size_t(b) * H + h) * T + t; }
  bool seen(int b, int i, int j) const {
    return cuda::attention_visible(i, j, window, doc[size_t(b) * T + i], doc[size_t(b) * T + j]);
  }
  static float dot(const float* a, const float* c, int n) {
    float s = 0.0f;
    for (int d = 0; d < n; ++d) s += a[d] * c[d];
    return s;
  }
  float score(const float* q, const float* k, int h, int i, int j) const {
    return cuda::alibi_score(scale * dot(q, k, hd), slopes[size_t(h)], i, j);
  }

  void forward(std::vector<float>& o, std::vector<float>& lse, const std::vector<float>& q, const std::vector<float>& k,
               const std::vector<float>& v) const {
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) {
          const int g = cuda::kv_head_of(h, H, kv_used);
          float m = -INFINITY, l = 0.0f, corr = 0.0f;
          std::vector<float> acc(size_t(hd), 0.0f);
          for (int j = 0; j <= t; ++j) {
            if (!seen(b, t, j)) continue;
            const float p = cuda::online_softmax_add(score(&q[qi(b, t, h)], &k[ki(b, j, g)], h, t, j), &m, &l, &corr);
            for (int d = 0; d < hd; ++d) acc[size_t(d)] = acc[size_t(d)] * corr + p * v[ki(b, j, g) + size_t(d)];
          }
          if (sinks) {
            cuda::online_softmax_add(sinks[h], &m, &l, &corr);
            for (float& a : acc) a *= corr;
          }
          for (int d = 0; d < hd; ++d) o[qi(b, t, h) + size_t(d)] = acc[size_t(d)] / l;
          lse[ri(b, h, t)] = m + std::log(l);
        }
  }

  // dsinks (H) += with sinks.
  void backward(std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv, const std::vector<float>& dout,
                const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                const std::vector<float>& o, const std::vector<float>& lse, float* dsinks = nullptr) const {
    std::vector<float> delta(lse.size());
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) delta[ri(b, h, t)] = dot(&dout[qi(b, t, h)], &o[qi(b, t, h)], hd);
    for (int h = 0; sinks && h < H; ++h) {
      double sum = 0.0;
      for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) sum += cuda::sink_grad_term(sinks[h], lse[ri(b, h, t)], delta[ri(b, h, t)]);
      dsinks[h] += static_cast<float>(sum);
    }
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) {
          const int g = cuda::kv_head_of(h, H, kv_used);
          std::vector<float> acc(size_t(hd), 0.0f);
          for (int j = 0; j <= t; ++j) {
            if (!seen(b, t, j)) continue;
            const float p = std::exp(score(&q[qi(b, t, h)], &k[ki(b, j, g)], h, t, j) - lse[ri(b, h, t)]);
            const float ds = p * (dot(&dout[qi(b, t, h)], &v[ki(b, j, g)], hd) - delta[ri(b, h, t)]);
            for (int d = 0; d < hd; ++d) acc[size_t(d)] += scale * ds * k[ki(b, j, g) + size_t(d)];
          }
          std::copy(acc.begin(), acc.end(), dq.begin() + long(qi(b, t, h)));
        }
    const int group = H / kv_used;
    std::fill(dk.begin(), dk.end(), 0.0f);
    std::fill(dv.begin(), dv.end(), 0.0f);
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < T; ++j)
        for (int g = 0; g < kv_used; ++g)
          for (int h = g * group; h < (g + 1) * group; ++h)
            for (int i = j; i < T; ++i) {
              if (!seen(b, i, j)) continue;
              const float p = std::exp(score(&q[qi(b, i, h)], &k[ki(b, j, g)], h, i, j) - lse[ri(b, h, i)]);
              const float ds = p * (dot(&v[ki(b, j, g)], &dout[qi(b, i, h)], hd) - delta[ri(b, h, i)]);
              for (int d = 0; d < hd; ++d) {
                dv[ki(b, j, g) + size_t(d)] += p * dout[qi(b, i, h) + size_t(d)];
                dk[ki(b, j, g) + size_t(d)] += scale * ds * q[qi(b, i, h) + size_t(d)];
              }
            }
  }
};

// The CPU kernel's forward and backward next to the host replay of the CUDA
// kernels on the same inputs (extras.sinks / dsinks as the replay's sinks; the
// replay's sink gradient into dsinks), each output compared.
void check_against_cpu(const HostAttention& cu, const std::vector<float>& q, const std::vector<float>& k,
                       const std::vector<float>& v, const std::vector<float>& dout, const AttentionExtras& extras,
                       float* dsinks = nullptr) {
  std::vector<float> o_cpu(q.size()), lse_cpu(size_t(cu.B) * cu.H * cu.T), dq_cpu(q.size()), dk_cpu(k.size()),
      dv_cpu(v.size());
  attention_forward(o_cpu.data(), lse_cpu.data(), q.data(), k.data(), v.data(), cu.doc.data(), cu.B, cu.T, cu.H,
                    cu.kv_stored, cu.kv_used, cu.hd, cu.window, cu.scale, extras);
  attention_backward(dq_cpu.data(), dk_cpu.data(), dv_cpu.data(), dout.data(), q.data(), k.data(), v.data(),
                     o_cpu.data(), lse_cpu.data(), cu.doc.data(), cu.B, cu.T, cu.H, cu.kv_stored, cu.kv_used, cu.hd,
                     cu.window, cu.scale, false, extras);
  std::vector<float> o(q.size()), lse(lse_cpu.size()), dq(q.size()), dk(k.size()), dv(v.size());
  cu.forward(o, lse, q, k, v);
  cu.backward(dq, dk, dv, dout, q, k, v, o_cpu, lse_cpu, dsinks);
  CHECK(normalised_error(o, o_cpu) < 1e-5);
  CHECK(normalised_error(lse, lse_cpu) < 1e-5);
  CHECK(normalised_error(dq, dq_cpu) < 1e-4);
  CHECK(normalised_error(dk, dk_cpu) < 1e-4);
  CHECK(normalised_error(dv, dv_cpu) < 1e-4);
}

}  // namespace

TEST_CASE("cuda element math: ALiBi scores, forward and backward as the CUDA kernels run them, equal the CPU kernel",
          "[cuda][math]") {
  // Six heads: not a power of two, so the slopes include the interleaved half
  // of alibi_slopes(8) (Press et al.'s rule); window, documents and GQA as well.
  const int B = 2, T = 24, H = 6, kv_stored = 3, kv_used = 2, hd = 8;
  const float scale = 0.35f;
  std::vector<float> slopes;
  for (const double s : rackstep::models::alibi_slopes(H)) slopes.push_back(static_cast<float>(s));
  const auto q = randn(size_t(B) * T * H * hd, 50), k = randn(size_t(B) * T * kv_stored * hd, 51),
             v = randn(size_t(B) * T * kv_stored * hd, 52), dout = randn(q.size(), 53);
  std::vector<int32_t> doc(size_t(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) doc[size_t(b) * T + t] = (t + 5 * b) / 11;
  for (const int window : {0, 7}) {
    INFO("window " << window);
    AttentionExtras extras;
    extras.alibi_slopes = slopes.data();
    check_against_cpu({B, T, H, kv_stored, kv_used, hd, window, scale, slopes, doc}, q, k, v, dout, extras);
  }
}

TEST_CASE("cuda element math: LayerNorm forward and backward equal the CPU kernel", "[cuda][math]") {
  const int rows = 6, d = 80;
  const auto x = randn(size_t(rows) * d, 40, 2.0f), gain = randn(d, 41), dy = randn(x.size(), 42);
  std::vector<float> y_cpu(x.size()), rstd_cpu(rows), dx_cpu(x.size()), dgain_cpu(d, 0.0f);
  layernorm_forward(y_cpu.data(), rstd_cpu.data(), x.data(), gain.data(), 1e-6f, rows, d);
  layernorm_backward(dx_cpu.data(), dgain_cpu.data(), dy.data(), x.data(), rstd_cpu.data(), gain.data(), rows, d);

  // The kernels' per-row arithmetic, serially (block_sum reorders double sums only).
  std::vector<float> y(x.size()), dx(x.size());
  for (int n = 0; n < rows; ++n) {
    const float* xr = &x[size_t(n) * d];
    const float* dyr = &dy[size_t(n) * d];
    double sum = 0.0, ss = 0.0, s1 = 0.0, s2 = 0.0;
    for (int i = 0; i < d; ++i) sum += xr[i];
    const double mean = sum / d;
    for (int i = 0; i < d; ++i) ss += (xr[i] - mean) * (xr[i] - mean);
    const float r = cuda::rms_rstd(ss, d, 1e-6f), m = static_cast<float>(mean);
    CHECK(r == Approx(rstd_cpu[n]).epsilon(1e-6));
    for (int i = 0; i < d; ++i) y[size_t(n) * d + i] = cuda::layernorm_y(xr[i] - m, r, gain[i]);
    for (int i = 0; i < d; ++i) {
      const double g = double(dyr[i]) * gain[i];
      s1 += g;
      s2 += g * (xr[i] - m) * r;
    }
    const auto a = static_cast<float>(s1 / d), b = static_cast<float>(s2 / d);
    for (int i = 0; i < d; ++i) dx[size_t(n) * d + i] = cuda::layernorm_dx(dyr[i], gain[i], xr[i] - m, r, a, b);
  }
  CHECK(max_rel_error(y, y_cpu) < 1e-6);
  CHECK(testing::normalised_error(dx, dx_cpu) < 1e-6);
}

TEST_CASE("cuda element math: the gated norm's elementwise parts equal the CPU kernel", "[cuda][math]") {
  const int N = 9, d = 24, r = 5;
  const auto x = randn(size_t(N) * d, 43), wd = randn(size_t(d) * r, 44, 0.3f), wu = randn(size_t(r) * d, 45, 0.3f),
             dy = randn(size_t(N) * d, 46);
  std::vector<float> y_cpu(x.size()), a(size_t(N) * r), g(x.size());
  gated_norm_forward(y_cpu.data(), a.data(), g.data(), x.data(), wd.data(), wu.data(), N, d, r);
  std::vector<float> dx_cpu(x.size()), dwd(wd.size(), 0.0f), dwu(wu.size(), 0.0f),
      scratch(gated_norm_scratch_floats(N, d, r));
  gated_norm_backward(dx_cpu.data(), dwd.data(), dwu.data(), dy.data(), x.data(), a.data(), g.data(), wd.data(),
                      wu.data(), scratch.data(), N, d, r);

  // The CUDA composition: the same GEMMs (CPU linear layers here) around the shared formulas.
  std::vector<float> s(a.size()), b(x.size()), y(x.size());
  for (size_t i = 0; i < a.size(); ++i) s[i] = cuda::silu(a[i]);
  linear_forward(b.data(), s.data(), wu.data(), nullptr, N, r, d);
  for (size_t i = 0; i < b.size(); ++i) y[i] = x[i] * cuda::sigmoid(b[i]);
  CHECK(max_rel_error(y, y_cpu) == 0.0);
  std::vector<float> db(x.size()), dx(x.size()), ds(a.size()), dwd2(wd.size(), 0.0f), dwu2(wu.size(), 0.0f);
  for (size_t i = 0; i < x.size(); ++i) cuda::gated_norm_grad(dy[i], x[i], g[i], &db[i], &dx[i]);
  linear_backward(ds.data(), dwu2.data(), nullptr, db.data(), s.data(), wu.data(), N, r, d);
  for (size_t i = 0; i < ds.size(); ++i) ds[i] *= cuda::silu_grad(a[i]);
  linear_backward(dx.data(), dwd2.data(), nullptr, ds.data(), x.data(), wd.data(), N, d, r, true);
  CHECK(max_rel_error(dx, dx_cpu) == 0.0);
  CHECK(max_rel_error(dwd2, dwd) == 0.0);
  CHECK(max_rel_error(dwu2, dwu) == 0.0);
}

TEST_CASE("cuda element math: the aux balancing loss's gradient equals the CPU kernel for both routers",
          "[cuda][math]") {
  const int N = 11, E = 6, k = 2;
  const auto logits = randn(size_t(N) * E, 47, 2.0f);
  std::vector<int32_t> expert(size_t(N) * k);
  for (size_t a = 0; a < expert.size(); ++a) expert[a] = static_cast<int32_t>((a * 5 + a / 3) % E);
  for (RouterKind kind : {RouterKind::kSoftmax, RouterKind::kSigmoid}) {
    const bool softmax = kind == RouterKind::kSoftmax;
    const float weight = 0.01f;
    std::vector<float> d_cpu(logits.size(), 0.25f), d(logits.size(), 0.25f);
    aux_loss_backward(d_cpu.data(), logits.data(), expert.data(), N, E, k, kind, weight);
    const double loss_cpu = aux_loss_forward(logits.data(), expert.data(), N, E, k, kind, weight);

    std::vector<double> f(E, 0.0), p_sum(E, 0.0);
    for (int32_t e : expert) f[size_t(e)] += 1.0;
    for (double& v : f) v /= double(N) * k;
    const double c = double(weight) * E / N;
    for (int t = 0; t < N; ++t) {
      const float* l = &logits[size_t(t) * E];
      double mx = l[0], S = 0.0, fp = 0.0;
      for (int e = 1; e < E; ++e) mx = std::max(mx, double(l[e]));
      for (int e = 0; e < E; ++e) S += cuda::router_affinity(l[e], mx, softmax);
      for (int e = 0; e < E; ++e) fp += f[size_t(e)] * (cuda::router_affinity(l[e], mx, softmax) / S);
      for (int e = 0; e < E; ++e) p_sum[size_t(e)] += cuda::router_affinity(l[e], mx, softmax) / S;
      for (int j = 0; j < E; ++j)
        d[size_t(t) * E + j] += cuda::aux_loss_dlogit(cuda::router_affinity(l[j], mx, softmax), S, f[size_t(j)], fp, c,
                                                      softmax);
    }
    double loss = 0.0;
    for (int e = 0; e < E; ++e) loss += f[size_t(e)] * p_sum[size_t(e)] / N;
    CHECK(double(weight) * E * loss == Approx(loss_cpu).epsilon(1e-12));
    CHECK(max_rel_error(d, d_cpu) < 1e-6);
  }
}

TEST_CASE("cuda element math: the router's per-token top-k picks, orders, thresholds and weighs as the CPU kernel",
          "[cuda][math]") {
  // Logits and biases on a coarse grid: many biased scores tie, where the
  // kernel's repeated arg-max and the CPU's partial sort must agree (lower id first).
  const int N = 64, E = 9;
  auto logits = randn(size_t(N) * E, 70, 2.0f), bias = randn(E, 71, 0.5f);
  for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;
  for (float& x : bias) x = std::round(x * 2.0f) / 2.0f;
  for (int e = 0; e < E; ++e) logits[size_t(e)] = 1.0f;  // token 0: every score ties without a bias
  for (RouterKind kind : {RouterKind::kSigmoid, RouterKind::kSoftmax})
  for (const int k : {1, 3, E - 1, E})
  for (const bool with_bias : {false, true}) {
    INFO("k " << k << (kind == RouterKind::kSoftmax ? ", softmax" : ", sigmoid") << (with_bias ? ", bias" : ""));
    const float* b = with_bias ? bias.data() : nullptr;
    std::vector<int32_t> expert_cpu(size_t(N) * k), expert(expert_cpu.size());
    std::vector<float> weight_cpu(expert_cpu.size()), weight(expert_cpu.size()), threshold_cpu(N), threshold(N);
    router_forward(expert_cpu.data(), weight_cpu.data(), threshold_cpu.data(), logits.data(), b, N, E, k, kind, 2.5f);
    for (int t = 0; t < N; ++t) {
      cuda::router_token(&logits[size_t(t) * E], b, E, k, kind == RouterKind::kSoftmax, 2.5f, &expert[size_t(t) * k],
                         &weight[size_t(t) * k], &threshold[size_t(t)]);
    }
    CHECK(expert == expert_cpu);
    CHECK(std::memcmp(threshold.data(), threshold_cpu.data(), sizeof(float) * threshold.size()) == 0);
    CHECK(max_rel_error(weight, weight_cpu) == 0.0);
  }
}

TEST_CASE("cuda element math: quantile balancing's bins and biases equal the CPU kernel, edge bins included",
          "[cuda][math]") {
  const int N = 400, E = 5, k = 2, n_bins = 16;
  const float lo = -8.0f, hi = 8.0f;
  auto logits = randn(size_t(N) * E, 72, 4.0f);
  logits[0] = -8.0f;   // on the low edge
  logits[1] = 8.0f;    // on the high edge: the last bin
  logits[2] = -40.0f;  // beyond either end: the edge bins
  logits[3] = 40.0f;
  logits[4] = 0.5f;    // on a bin boundary
  for (size_t t = 0; t < size_t(N); ++t) logits[t * E + 3] = 1.25f;  // expert 3: one bin holds every count
  std::vector<int64_t> counts_cpu(size_t(E) * n_bins, 0), counts(counts_cpu.size(), 0);
  qb_histogram(counts_cpu.data(), logits.data(), N, E, n_bins, lo, hi);
  const double per_unit = n_bins / (double(hi) - lo), width = (double(hi) - lo) / n_bins;
  for (size_t i = 0; i < logits.size(); ++i)
    ++counts[i % E * n_bins + size_t(cuda::qb_bin(logits[i], lo, per_unit, n_bins))];
  REQUIRE(counts == counts_cpu);

  for (int e = 0; e < n_bins; ++e) counts[size_t(4) * n_bins + e] = 0;  // expert 4: no counts, bias 0
  counts[size_t(2) * n_bins + 15] += 5000;  // expert 2: the quantile in the last bin
  std::vector<float> bias_cpu(E), bias(E);
  qb_bias_from_histogram(bias_cpu.data(), counts.data(), E, k, n_bins, lo, hi);
  for (int e = 0; e < E; ++e) bias[size_t(e)] = cuda::qb_bias(&counts[size_t(e) * n_bins], n_bins, k, E, lo, width);
  CHECK(std::memcmp(bias.data(), bias_cpu.data(), sizeof(float) * E) == 0);
  CHECK(bias[4] == 0.0f);
}

TEST_CASE("cuda element math: attention sinks in the online softmax and their gradient equal the CPU kernel",
          "[cuda][math]") {
  // gpt-oss's sinks with ALiBi, a window, documents and GQA; one sink far above
  // every score (it dominates the denominator), one far below (it vanishes).
  const int B = 2, T = 20, H = 4, kv_stored = 2, kv_used = 2, hd = 8;
  const float scale = 0.35f;
  std::vector<float> slopes;
  for (const double s : rackstep::models::alibi_slopes(H)) slopes.push_back(static_cast<float>(s));
  auto sinks = randn(size_t(H), 54, 2.0f);
  sinks[1] = 12.0f;
  sinks[2] = -30.0f;
  const auto q = randn(size_t(B) * T * H * hd, 55), k = randn(size_t(B) * T * kv_stored * hd, 56),
             v = randn(size_t(B) * T * kv_stored * hd, 57), dout = randn(q.size(), 58);
  std::vector<int32_t> doc(size_t(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) doc[size_t(b) * T + t] = (t + 4 * b) / 9;
  for (const int window : {0, 6}) {
    INFO("window " << window);
    std::vector<float> dsinks_cpu(size_t(H), 0.5f), dsinks(size_t(H), 0.5f);  // "+=" onto 0.5 on both
    AttentionExtras extras;
    extras.alibi_slopes = slopes.data();
    extras.sinks = sinks.data();
    extras.dsinks = dsinks_cpu.data();
    check_against_cpu({B, T, H, kv_stored, kv_used, hd, window, scale, slopes, doc, sinks.data()}, q, k, v, dout,
                      extras, dsinks.data());
    CHECK(normalised_error(dsinks, dsinks_cpu) < 1e-5);
  }
}
