#include "exec/optim.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "sim/base/check.h"

namespace rackstep::exec {

namespace {

// Sums in double, serially: the result must not depend on the thread count.
double sum_squares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace

double fit_adam_lr(double tokens, double d_model, double tokens_per_batch) {
  RS_CHECK(tokens > 0 && d_model > 0 && tokens_per_batch > 0, "LR fit needs positive inputs");
  // Marin's fit (spec/marin-architecture.md, "LR fit").
  return 0.087571 * std::pow(tokens, -0.3461) * std::pow(d_model, -0.3448) * std::sqrt(tokens_per_batch);
}

double fit_muonh_lr(double tokens, double d_model, double tokens_per_batch) {
  return 13.0 / 3.0 * fit_adam_lr(tokens, d_model, tokens_per_batch);
}

OptimizerConfig default_optimizer_config(int64_t total_steps, int64_t d_model, int64_t tokens_per_batch) {
  OptimizerConfig c;
  c.total_steps = total_steps;
  const double tokens = static_cast<double>(total_steps) * static_cast<double>(tokens_per_batch);
  c.adam_lr = fit_adam_lr(tokens, static_cast<double>(d_model), static_cast<double>(tokens_per_batch));
  c.muonh_lr = fit_muonh_lr(tokens, static_cast<double>(d_model), static_cast<double>(tokens_per_batch));
  return c;
}

int64_t warmup_steps(int64_t total_steps, double warmup_fraction) {
  return std::max<int64_t>(1, std::llround(warmup_fraction * static_cast<double>(total_steps)));
}

double lr_multiplier(int64_t step, int64_t total_steps, double warmup_fraction, double final_fraction) {
  const int64_t w = warmup_steps(total_steps, warmup_fraction);
  if (step < w) return static_cast<double>(step + 1) / static_cast<double>(w);
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - w);  // from step w-1 to total-1
  const double progress = std::min(1.0, static_cast<double>(step - (w - 1)) / static_cast<double>(decay_steps));
  return 1.0 - (1.0 - final_fraction) * progress;
}

// --- Newton–Schulz ---------------------------------------------------------------------

void newton_schulz(const float* g, int64_t rows, int64_t cols, int steps, float* out, std::vector<float>& work) {
  // Work on X (r, c) with r <= c so X X^T is the small Gram matrix (as public Muon).
  const bool transposed = rows > cols;
  const int64_t r = transposed ? cols : rows;
  const int64_t c = transposed ? rows : cols;
  work.resize(static_cast<size_t>(2 * r * c + 2 * r * r));
  float* x = work.data();  // (r, c)
  float* y = x + r * c;    // (r, c)
  float* a = y + r * c;    // (r, r) X X^T
  float* b = a + r * r;    // (r, r) kNsB A + kNsC A A
  if (!transposed) {
    std::memcpy(x, g, sizeof(float) * r * c);
  } else {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) x[j * c + i] = g[i * cols + j];
  }
  const float scale = static_cast<float>(1.0 / (std::sqrt(sum_squares(x, r * c)) + 1e-7));
  for (int64_t i = 0; i < r * c; ++i) x[i] *= scale;
  const auto ri = static_cast<blasint>(r), ci = static_cast<blasint>(c);
  for (int s = 0; s < steps; ++s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ri, ri, ci, 1.0f, x, ci, x, ci, 0.0f, a, ri);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, ri, ri, kNsC, a, ri, a, ri, 0.0f, b, ri);
    for (int64_t i = 0; i < r * r; ++i) b[i] += kNsB * a[i];
    std::memcpy(y, x, sizeof(float) * r * c);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, ci, ri, 1.0f, b, ri, x, ci, kNsA, y, ci);
    std::swap(x, y);
  }
  if (!transposed) {
    std::memcpy(out, x, sizeof(float) * r * c);
    return;
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = x[j * c + i];
}

void hyperball_update(float* w, const float* u, int64_t n, double lr, double w0_norm) {
  const double u_norm = std::sqrt(sum_squares(u, n));
  if (u_norm > 0) {
    const auto step = static_cast<float>(lr * w0_norm / u_norm);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) w[i] -= step * u[i];
  }
  const double w_norm = std::sqrt(sum_squares(w, n));
  RS_CHECK(w_norm > 0, "hyperball step reached a zero matrix");
  const auto rescale = static_cast<float>(w0_norm / w_norm);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) w[i] *= rescale;
}

// --- state ----------------------------------------------------------------------------

OptimizerState init_optimizer_state(const Arena& params) {
  const ArenaLayout& layout = params.layout();
  OptimizerState st;
  st.momentum = Arena(params.layout_ptr());
  st.second_moment = Arena(layout.subset({OptGroup::kAdamH, OptGroup::kAdam}));
  st.w0_index.assign(layout.size(), -1);
  st.v_index.assign(layout.size(), -1);
  for (size_t i = 0; i < layout.size(); ++i) {
    const TensorSpec& s = layout.spec(i);
    st.v_index[i] = st.second_moment.layout().find(s.name);
    if (!is_hyperball_group(s.group)) continue;
    st.w0_index[i] = static_cast<int64_t>(st.w0_norm.size());
    const ConstTensorView w = params.view(i);
    const int64_t matrices = s.shape.size() == 3 ? s.shape[0] : 1;
    const int64_t per = w.numel / matrices;
    for (int64_t e = 0; e < matrices; ++e) {
      const double norm = std::sqrt(sum_squares(w.data + e * per, per));
      RS_CHECK(norm > 0, "hyperball tensor " + s.name + " starts at zero; initialise parameters first");
      st.w0_norm.push_back(norm);
    }
  }
  return st;
}

GroupNorms group_norms(const Arena& arena) {
  GroupNorms n;
  for (size_t i = 0; i < arena.layout().size(); ++i) {
    const ConstTensorView t = arena.view(i);
    n.by_group[static_cast<int>(t.spec->group)] += sum_squares(t.data, t.numel);
  }
  for (double& v : n.by_group) v = std::sqrt(v);
  return n;
}

// --- updates --------------------------------------------------------------------------

Optimizer::Optimizer(OptimizerConfig config) : config_(config) {
  RS_CHECK(config_.total_steps >= 1, "optimizer needs a step count for its schedule");
  RS_CHECK(config_.beta1 >= 0 && config_.beta1 < 1 && config_.beta2 >= 0 && config_.beta2 < 1, "betas in [0, 1)");
}

double Optimizer::lr(OptGroup group, int64_t step) const {
  const double peak = is_matrix_group(group) ? config_.muonh_lr : config_.adam_lr;
  return peak * lr_multiplier(step, config_.total_steps, config_.warmup_fraction, config_.final_lr_fraction);
}

void Optimizer::step(Arena& params, const Arena& grads, OptimizerState& st, size_t begin, size_t end) {
  const ArenaLayout& layout = params.layout();
  RS_CHECK(grads.layout().fingerprint() == layout.fingerprint(), "gradients must share the parameters' layout");
  RS_CHECK(st.momentum.layout().fingerprint() == layout.fingerprint(), "optimizer state of another model");
  end = std::min(end, layout.size());
  for (size_t i = begin; i < end; ++i) {
    TensorView w = params.view(i);
    const float* g = grads.view(i).data;
    float* m = st.momentum.view(i).data;
    const double lr_now = lr(w.spec->group, st.step);
    if (is_matrix_group(w.spec->group)) {
      step_muon(w, g, m, st, i, lr_now);
      continue;
    }
    float* v = st.second_moment.view(static_cast<size_t>(st.v_index[i])).data;
    step_adam(w, g, m, v, st, i, lr_now);
  }
  ++st.step;
}

void Optimizer::step_muon(TensorView w, const float* g, float* m, const OptimizerState& st, size_t tensor,
                          double lr_now) {
  const auto b1 = static_cast<float>(config_.beta1);
  const int64_t rows = w.rows(), cols = w.cols(), per = rows * cols;
  u_.resize(static_cast<size_t>(per));
  o_.resize(static_cast<size_t>(per));
  for (int64_t e = 0; e < w.matrices(); ++e) {
    const int64_t off = e * per;
    float* u = u_.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < per; ++i) {
      m[off + i] = b1 * m[off + i] + (1 - b1) * g[off + i];
      u[i] = (1 - b1) * g[off + i] + b1 * m[off + i];  // Nesterov look-ahead
    }
    newton_schulz(u, rows, cols, config_.ns_steps, o_.data(), work_);
    if (w.spec->group == OptGroup::kMuonH) {
      hyperball_update(w.data + off, o_.data(), per, lr_now, st.w0_norm[st.w0_index[tensor] + e]);
      continue;
    }
    // Plain Muon: shape scale of the public implementation.
    const auto step = static_cast<float>(lr_now * std::sqrt(std::max(1.0, static_cast<double>(rows) / cols)));
    for (int64_t i = 0; i < per; ++i) w.data[off + i] -= step * o_[i];
  }
}

void Optimizer::step_adam(TensorView w, const float* g, float* m, float* v, const OptimizerState& st,
                          size_t tensor, double lr_now) {
  const double t = static_cast<double>(st.step + 1);
  const auto b1 = static_cast<float>(config_.beta1), b2 = static_cast<float>(config_.beta2);
  const auto c1 = static_cast<float>(1.0 / (1.0 - std::pow(config_.beta1, t)));  // bias corrections
  const auto c2 = static_cast<float>(1.0 / (1.0 - std::pow(config_.beta2, t)));
  const auto eps = static_cast<float>(config_.eps);
  const int64_t n = w.numel;
  if (w.spec->group == OptGroup::kAdamH) {
    u_.resize(static_cast<size_t>(n));
    float* u = u_.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      u[i] = (m[i] * c1) / (std::sqrt(v[i] * c2) + eps);
    }
    hyperball_update(w.data, u, n, lr_now, st.w0_norm[st.w0_index[tensor]]);
    return;
  }
  const auto lr_f = static_cast<float>(lr_now);
  const auto decay = static_cast<float>(lr_now * config_.adam_weight_decay);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    w.data[i] -= lr_f * (m[i] * c1) / (std::sqrt(v[i] * c2) + eps) + decay * w.data[i];
  }
}

}  // namespace rackstep::exec
