// Optimizers: Newton–Schulz orthogonality, hyperball norm preservation, Adam
// against hand-computed steps, the warmup/decay schedule, Marin's LR fit, and
// ZeRO-style ranged steps matching a full step.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "exec/arena.h"
#include "sim/base/source_dir.h"
#include "exec/optim.h"
#include "models/layer_graph.h"
#include "models/model.h"

using namespace rackstep::exec;

namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

double frobenius(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

// Eigenvalues of a symmetric matrix (cyclic Jacobi), for singular values.
std::vector<double> symmetric_eigenvalues(std::vector<double> a, int n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-22) break;
    for (int p = 0; p < n; ++p) {
      for (int q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (std::fabs(apq) < 1e-300) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; ++k) {  // A <- A J (columns p, q)
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {  // A <- J^T A (rows p, q)
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
      }
    }
  }
  std::vector<double> ev(n);
  for (int i = 0; i < n; ++i) ev[i] = a[i * n + i];
  return ev;
}

std::vector<double> singular_values(const std::vector<float>& x, int rows, int cols) {
  const int r = std::min(rows, cols);
  std::vector<double> gram(static_cast<size_t>(r * r), 0.0);  // X X^T or X^T X, (r, r)
  for (int i = 0; i < r; ++i) {
    for (int j = 0; j < r; ++j) {
      double s = 0;
      if (rows <= cols) {
        for (int k = 0; k < cols; ++k) s += static_cast<double>(x[i * cols + k]) * x[j * cols + k];
      } else {
        for (int k = 0; k < rows; ++k) s += static_cast<double>(x[k * cols + i]) * x[k * cols + j];
      }
      gram[i * r + j] = s;
    }
  }
  std::vector<double> ev = symmetric_eigenvalues(gram, r);
  for (double& e : ev) e = std::sqrt(std::max(0.0, e));
  return ev;
}

// The quintic iteration written out in double with naive loops.
std::vector<double> reference_newton_schulz(const std::vector<float>& g, int rows, int cols, int steps) {
  const bool tr = rows > cols;
  const int r = tr ? cols : rows, c = tr ? rows : cols;
  std::vector<double> x(static_cast<size_t>(r * c));
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) (tr ? x[j * c + i] : x[i * c + j]) = g[i * cols + j];
  double n = 0;
  for (double v : x) n += v * v;
  for (double& v : x) v /= std::sqrt(n) + 1e-7;
  const double a = 3.4445, b = -4.7750, cc = 2.0315;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> A(r * r, 0), B(r * r, 0), y(r * c, 0);
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < r; ++j)
        for (int k = 0; k < c; ++k) A[i * r + j] += x[i * c + k] * x[j * c + k];
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < r; ++j) {
        double aa = 0;
        for (int k = 0; k < r; ++k) aa += A[i * r + k] * A[k * r + j];
        B[i * r + j] = b * A[i * r + j] + cc * aa;
      }
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) {
        double bx = 0;
        for (int k = 0; k < r; ++k) bx += B[i * r + k] * x[k * c + j];
        y[i * c + j] = a * x[i * c + j] + bx;
      }
    x = y;
  }
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) out[i * cols + j] = tr ? x[j * c + i] : x[i * c + j];
  return out;
}

std::shared_ptr<const ArenaLayout> small_model_layout() {
  return std::make_shared<ArenaLayout>(std::vector<TensorSpec>{
      {"embed", {17, 8}, OptGroup::kAdam},
      {"layers.0.attn.wq", {8, 12}, OptGroup::kMuonH},
      {"layers.0.moe.w_up", {3, 8, 6}, OptGroup::kMuonH},
      {"layers.0.norm.gain", {8}, OptGroup::kAdam},
      {"layers.0.attn.wo", {12, 8}, OptGroup::kMuonH},
      {"lm_head", {8, 17}, OptGroup::kAdamH}});
}

void fill_random(Arena& a, uint32_t seed, float scale) {
  for (size_t i = 0; i < a.layout().size(); ++i) {
    TensorView t = a.view(i);
    const std::vector<float> v = gaussian(t.numel, seed + static_cast<uint32_t>(i), scale);
    std::copy(v.begin(), v.end(), t.data);
  }
}

}  // namespace

TEST_CASE("Newton-Schulz matches the quintic iteration and orthogonalises", "[optim][ns]") {
  struct Shape {
    int rows, cols;
  };
  for (Shape s : {Shape{32, 64}, Shape{64, 32}, Shape{48, 48}, Shape{16, 96}}) {
    CAPTURE(s.rows, s.cols);
    const std::vector<float> g = gaussian(s.rows * s.cols, 7u + s.rows);
    std::vector<float> out(g.size());
    std::vector<float> work;
    newton_schulz(g.data(), s.rows, s.cols, 5, out.data(), work);

    // Same numbers as the double-precision iteration (checks the GEMM layout,
    // including the transposed path for tall matrices).
    const std::vector<double> ref = reference_newton_schulz(g, s.rows, s.cols, 5);
    double err = 0, norm = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      err += (out[i] - ref[i]) * (out[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    CHECK(std::sqrt(err / norm) < 1e-4);

    // Approximately orthogonal: every singular value in the quintic's band
    // (the coefficients trade exactness for speed: ~[0.7, 1.2], Jordan 2024).
    // Square Gaussian matrices have near-zero singular values that five
    // iterations cannot lift, so the band is checked on rectangular ones.
    if (s.rows == s.cols) continue;
    const std::vector<double> sv = singular_values(out, s.rows, s.cols);
    const double lo = *std::min_element(sv.begin(), sv.end());
    const double hi = *std::max_element(sv.begin(), sv.end());
    CAPTURE(lo, hi);
    CHECK(lo > 0.68);
    CHECK(hi < 1.22);
    // The input's singular values spread widely; the output's do not.
    const std::vector<double> sg = singular_values(g, s.rows, s.cols);
    CHECK(*std::max_element(sg.begin(), sg.end()) / *std::min_element(sg.begin(), sg.end()) > 2.0);
  }
}

TEST_CASE("Newton-Schulz of an orthogonal matrix stays near it", "[optim][ns]") {
  // A permutation matrix has all singular values 1: the normalisation makes
  // them 1/sqrt(n) and five iterations bring them back into the band.
  const int n = 8;
  std::vector<float> p(n * n, 0.0f);
  for (int i = 0; i < n; ++i) p[i * n + (i * 3) % n] = 1.0f;
  std::vector<float> out(p.size()), work;
  newton_schulz(p.data(), n, n, 5, out.data(), work);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (j == (i * 3) % n) {
        CHECK(out[i * n + j] > 0.68f);
        CHECK(out[i * n + j] < 1.22f);
      } else {
        CHECK(std::fabs(out[i * n + j]) < 1e-5f);
      }
    }
  }
}

TEST_CASE("hyperball steps keep every matrix at its initial Frobenius norm", "[optim][hyperball]") {
  auto layout = small_model_layout();
  Arena params(layout), grads(layout);
  fill_random(params, 1, 0.5f);
  OptimizerState st = init_optimizer_state(params);
  std::vector<double> w0;
  for (size_t i = 0; i < layout->size(); ++i) {
    const TensorView t = params.view(i);
    if (!is_hyperball_group(t.spec->group)) continue;
    const int64_t per = t.numel / t.matrices();
    for (int64_t e = 0; e < t.matrices(); ++e) w0.push_back(frobenius(t.data + e * per, per));
  }
  REQUIRE(st.w0_norm.size() == w0.size());
  REQUIRE(w0.size() == 1 + 3 + 1 + 1);  // wq, 3 experts, wo, lm_head
  for (size_t k = 0; k < w0.size(); ++k) CHECK(st.w0_norm[k] == Approx(w0[k]).epsilon(1e-12));

  OptimizerConfig cfg;
  cfg.adam_lr = 0.05;
  cfg.muonh_lr = 0.2;  // large steps: without the projection the norm would move a lot
  cfg.total_steps = 10;
  Optimizer opt(cfg);
  const std::vector<float> before(params.data(), params.data() + params.total_floats());
  for (int s = 0; s < 10; ++s) {
    fill_random(grads, 100 + s, 1.0f);
    opt.step(params, grads, st);
  }
  size_t k = 0;
  for (size_t i = 0; i < layout->size(); ++i) {
    const TensorView t = params.view(i);
    if (!is_hyperball_group(t.spec->group)) continue;
    const int64_t per = t.numel / t.matrices();
    for (int64_t e = 0; e < t.matrices(); ++e, ++k) {
      CAPTURE(t.spec->name, e);
      CHECK(frobenius(t.data + e * per, per) == Approx(w0[k]).epsilon(1e-5));
    }
    // ... while the matrix itself moved.
    double moved = 0;
    for (int64_t j = 0; j < t.numel; ++j) moved += std::fabs(t.data[j] - before[layout->offset(i) + j]);
    CHECK(moved > 0.1);
  }
  CHECK(st.step == 10);
}

TEST_CASE("hyperball_update follows W <- Norm(W - lr |W0| Norm(u)) |W0|", "[optim][hyperball]") {
  std::vector<float> w = {3.0f, 4.0f};  // |W| = 5
  const std::vector<float> u = {0.0f, 2.0f};  // Norm(u) = (0, 1)
  hyperball_update(w.data(), u.data(), 2, 0.1, 5.0);
  // W - 0.1*5*(0,1) = (3, 3.5); norm sqrt(21.25); rescale to 5.
  const double n = std::sqrt(9.0 + 12.25);
  CHECK(w[0] == Approx(3.0 * 5.0 / n).epsilon(1e-6));
  CHECK(w[1] == Approx(3.5 * 5.0 / n).epsilon(1e-6));
}

TEST_CASE("Adam matches hand-computed steps", "[optim][adam]") {
  auto layout = std::make_shared<ArenaLayout>(std::vector<TensorSpec>{{"gain", {2}, OptGroup::kAdam}});
  Arena params(layout), grads(layout);
  params.view("gain").data[0] = 1.0f;
  params.view("gain").data[1] = -2.0f;
  OptimizerState st = init_optimizer_state(params);
  OptimizerConfig cfg;
  cfg.adam_lr = 0.01;
  cfg.muonh_lr = 0.0;
  cfg.total_steps = 100;  // warmup = 1 step, so step 0 runs at the peak
  Optimizer opt(cfg);

  const double b1 = 0.9062, b2 = 0.95, eps = 1e-8;
  // Step 1, g = (0.5, -1): m = (1-b1) g, v = (1-b2) g^2; bias-corrected mhat = g,
  // vhat = g^2, so the update is lr * sign(g) (up to eps).
  grads.view("gain").data[0] = 0.5f;
  grads.view("gain").data[1] = -1.0f;
  opt.step(params, grads, st);
  const double lr0 = 0.01 * lr_multiplier(0, 100, 0.01, 0.05);
  REQUIRE(lr0 == Approx(0.01));
  CHECK(params.view("gain").data[0] == Approx(1.0 - lr0 * 0.5 / (0.5 + eps)).epsilon(1e-6));
  CHECK(params.view("gain").data[1] == Approx(-2.0 + lr0 * 1.0 / (1.0 + eps)).epsilon(1e-6));

  // Step 2, g = (-0.25, -1).
  grads.view("gain").data[0] = -0.25f;
  grads.view("gain").data[1] = -1.0f;
  const double w0 = params.view("gain").data[0];
  opt.step(params, grads, st);
  const double m = b1 * (1 - b1) * 0.5 + (1 - b1) * -0.25;
  const double v = b2 * (1 - b2) * 0.25 + (1 - b2) * 0.0625;
  const double mhat = m / (1 - b1 * b1), vhat = v / (1 - b2 * b2);
  const double lr1 = 0.01 * lr_multiplier(1, 100, 0.01, 0.05);
  CHECK(params.view("gain").data[0] == Approx(w0 - lr1 * mhat / (std::sqrt(vhat) + eps)).epsilon(1e-6));
  CHECK(st.momentum.view("gain").data[0] == Approx(m).epsilon(1e-6));
  CHECK(st.second_moment.view("gain").data[0] == Approx(v).epsilon(1e-6));
}

TEST_CASE("Muon uses Nesterov momentum before Newton-Schulz", "[optim][muon]") {
  // With zero Newton–Schulz iterations the direction is u/|u|, so the step can
  // be computed by hand: plain Muon moves W by lr * sqrt(max(1, r/c)) * u/|u|.
  auto layout = std::make_shared<ArenaLayout>(std::vector<TensorSpec>{{"w", {2, 1}, OptGroup::kMuon}});
  Arena params(layout), grads(layout);
  OptimizerState st = init_optimizer_state(params);
  OptimizerConfig cfg;
  cfg.muonh_lr = 0.1;
  cfg.total_steps = 1000;
  cfg.warmup_fraction = 0.0;  // warmup of 1 step
  cfg.ns_steps = 0;
  Optimizer opt(cfg);
  const double b1 = 0.9062;
  grads.view("w").data[0] = 1.0f;
  grads.view("w").data[1] = 0.0f;
  opt.step(params, grads, st);  // m = (1-b1)(1,0); u = (1-b1)(1,0) + b1 m: along (1,0)
  const double lr0 = opt.lr(OptGroup::kMuon, 0);
  CHECK(params.view("w").data[0] == Approx(-lr0 * std::sqrt(2.0)).epsilon(1e-5));
  CHECK(params.view("w").data[1] == Approx(0.0).margin(1e-7));
  grads.view("w").data[0] = 0.0f;
  grads.view("w").data[1] = 1.0f;
  const float w0 = params.view("w").data[0], w1 = params.view("w").data[1];
  opt.step(params, grads, st);
  const double m0 = b1 * (1 - b1), m1 = (1 - b1);          // momentum after step 2
  const double u0 = b1 * m0, u1 = (1 - b1) * 1.0 + b1 * m1;  // Nesterov direction
  const double un = std::sqrt(u0 * u0 + u1 * u1);
  const double lr1 = opt.lr(OptGroup::kMuon, 1);
  CHECK(params.view("w").data[0] == Approx(w0 - lr1 * std::sqrt(2.0) * u0 / un).epsilon(1e-5));
  CHECK(params.view("w").data[1] == Approx(w1 - lr1 * std::sqrt(2.0) * u1 / un).epsilon(1e-5));
}

TEST_CASE("MuonH descends a quadratic on the hyperball", "[optim][muonh]") {
  // Loss |W - T|^2 with |T| = |W0|: the minimiser lies on the sphere.
  auto layout = std::make_shared<ArenaLayout>(std::vector<TensorSpec>{{"w", {6, 10}, OptGroup::kMuonH}});
  Arena params(layout), grads(layout);
  const std::vector<float> w_init = gaussian(60, 3), t_raw = gaussian(60, 4);
  std::copy(w_init.begin(), w_init.end(), params.view("w").data);
  std::vector<float> target(t_raw);
  const double scale = frobenius(w_init.data(), 60) / frobenius(t_raw.data(), 60);
  for (float& x : target) x = static_cast<float>(x * scale);
  auto loss = [&] {
    double s = 0;
    for (int i = 0; i < 60; ++i) s += std::pow(params.view("w").data[i] - target[i], 2);
    return s;
  };
  OptimizerState st = init_optimizer_state(params);
  OptimizerConfig cfg;
  cfg.muonh_lr = 0.05;
  cfg.total_steps = 200;
  Optimizer opt(cfg);
  const double start = loss();
  for (int s = 0; s < 200; ++s) {
    for (int i = 0; i < 60; ++i) grads.view("w").data[i] = 2 * (params.view("w").data[i] - target[i]);
    opt.step(params, grads, st);
  }
  CAPTURE(start, loss());
  CHECK(loss() < 0.05 * start);
}

TEST_CASE("schedule: 1% warmup to the peak, linear decay to 5%", "[optim][schedule]") {
  CHECK(warmup_steps(1000, 0.01) == 10);
  CHECK(lr_multiplier(0, 1000, 0.01, 0.05) == Approx(0.1));
  CHECK(lr_multiplier(4, 1000, 0.01, 0.05) == Approx(0.5));
  CHECK(lr_multiplier(9, 1000, 0.01, 0.05) == Approx(1.0));  // peak at the end of warmup
  CHECK(lr_multiplier(999, 1000, 0.01, 0.05) == Approx(0.05));  // last step at 5%
  CHECK(lr_multiplier(504, 1000, 0.01, 0.05) == Approx(0.525));  // halfway down
  for (int64_t s = 10; s < 1000; ++s) CHECK(lr_multiplier(s, 1000, 0.01, 0.05) < lr_multiplier(s - 1, 1000, 0.01, 0.05));
  // The hero: 390,251 steps -> 3,903 warmup steps.
  CHECK(warmup_steps(390251, 0.01) == 3903);
  CHECK(lr_multiplier(3902, 390251, 0.01, 0.05) == Approx(1.0));
  CHECK(lr_multiplier(390250, 390251, 0.01, 0.05) == Approx(0.05));
  // Tiny runs still warm up for one step.
  CHECK(warmup_steps(20, 0.01) == 1);
  CHECK(lr_multiplier(0, 20, 0.01, 0.05) == Approx(1.0));
}

TEST_CASE("LR fit gives Marin's values", "[optim][lr]") {
  // Reference values computed independently with Python's math (float64):
  // 0.087571 * T**-0.3461 * d**-0.3448 * sqrt(B), T = steps * B.
  const double hero_batch = 11264.0 * 4096, hero_tokens = 390251.0 * hero_batch;
  CHECK(fit_adam_lr(hero_tokens, 6144, hero_batch) == Approx(0.0007593392684441868).epsilon(1e-9));
  CHECK(fit_muonh_lr(hero_tokens, 6144, hero_batch) == Approx(0.003290470163258143).epsilon(1e-9));
  const OptimizerConfig d768 = default_optimizer_config(11420, 768, 1024 * 4096);
  CHECK(d768.adam_lr == Approx(0.0036505380639706045).epsilon(1e-9));
  CHECK(d768.muonh_lr == Approx(0.01581899827720595).epsilon(1e-9));
  CHECK(d768.beta1 == 0.9062);
  CHECK(d768.beta2 == 0.95);
}

TEST_CASE("ranged steps (ZeRO owners) equal one full step", "[optim][zero]") {
  auto layout = small_model_layout();
  Arena params(layout), grads(layout);
  fill_random(params, 11, 0.5f);
  fill_random(grads, 12, 1.0f);
  OptimizerState full = init_optimizer_state(params);
  OptimizerConfig cfg;
  cfg.adam_lr = 0.01;
  cfg.muonh_lr = 0.04;
  cfg.total_steps = 50;
  Arena p_full = params, p_split = params;
  OptimizerState split = full;
  Optimizer(cfg).step(p_full, grads, full);
  const auto parts = partition_tensors(*layout, 3);
  REQUIRE(parts.size() == 3);
  REQUIRE(parts.front().first == 0);
  REQUIRE(parts.back().second == layout->size());
  for (auto [b, e] : parts) {
    OptimizerState owner = split;  // each owner advances its own step counter
    Optimizer(cfg).step(p_split, grads, owner, b, e);
  }
  for (int64_t i = 0; i < params.total_floats(); ++i) REQUIRE(p_full.data()[i] == p_split.data()[i]);
}

TEST_CASE("group norms and state sizes per group", "[optim]") {
  auto layout = small_model_layout();
  Arena a(layout);
  a.view("embed").data[0] = 3.0f;
  a.view("layers.0.norm.gain").data[1] = 4.0f;
  a.view("lm_head").data[2] = 2.0f;
  const GroupNorms n = group_norms(a);
  CHECK(n.by_group[static_cast<int>(OptGroup::kAdam)] == Approx(5.0));
  CHECK(n.by_group[static_cast<int>(OptGroup::kAdamH)] == Approx(2.0));
  CHECK(n.by_group[static_cast<int>(OptGroup::kMuonH)] == 0.0);
  // Momentum for Muon groups, two moments for Adam groups; the state arenas agree.
  OptimizerState st = init_optimizer_state([&] {
    Arena p(layout);
    fill_random(p, 5, 1.0f);
    return p;
  }());
  double state_bytes = 0;
  for (const TensorSpec& s : layout->specs()) state_bytes += optimizer_state_bytes_per_param(s.group) * numel(s.shape);
  const double arena_bytes = 4.0 * (st.momentum.layout().param_count() + st.second_moment.layout().param_count());
  CHECK(state_bytes == arena_bytes);
}

TEST_CASE("the tiny model's layer graph gives an arena the optimizers can step", "[optim][arena]") {
  using namespace rackstep::models;
  const LayerGraph g = build_layer_graph(load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json"));
  auto layout = std::make_shared<ArenaLayout>(arena_specs_from_graph(g));
  double learnable = 0, buffers = 0;
  for (const Op& op : g.ops)
    for (const ParamTensor& p : op.params) (p.learnable ? learnable : buffers) += static_cast<double>(p.numel());
  CHECK(static_cast<double>(layout->param_count()) == learnable);
  CHECK(learnable + buffers == count_params(g).total);
  int experts = 0, heads = 0;
  for (const TensorSpec& s : layout->specs()) {
    if (s.shape.size() == 3) {
      CHECK(s.group == OptGroup::kMuonH);  // routed experts: per-expert Muon
      ++experts;
    }
    if (s.group == OptGroup::kAdamH) ++heads;
  }
  CHECK(experts > 0);
  CHECK(heads == 1);  // the LM head
  CHECK(layout->spec(static_cast<size_t>(layout->find("embedding.w"))).group == OptGroup::kAdam);

  Arena params(layout), grads(layout);
  fill_random(params, 21, 0.05f);
  fill_random(grads, 22, 0.01f);
  OptimizerState st = init_optimizer_state(params);
  Optimizer opt(default_optimizer_config(100, g.model.d_model, 8 * 256));
  opt.step(params, grads, st);
  const TensorView head = params.view(static_cast<size_t>(layout->find("lm_head.w")));
  CHECK(frobenius(head.data, head.numel) == Approx(st.w0_norm[st.w0_index[layout->find("lm_head.w")]]).epsilon(1e-5));
}
