// Router losses that move the router weights: the router z-loss (when applied)
// and the auxiliary balancing loss. Quantile balancing (no loss) is in moe.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "exec/kernels.h"
#include "models/check.h"

namespace rackstep::exec {
namespace {

// The router's probability of each expert for one token, and what the aux
// loss's gradient needs: p (E) and, for the sigmoid router, s = σ(l) and S = Σ s.
void router_probs(double* p, double* s, double& S, const float* l, int E, RouterKind kind) {
  if (kind == RouterKind::kSoftmax) {
    double mx = l[0];
    for (int e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
    S = 0.0;
    for (int e = 0; e < E; ++e) S += (s[e] = std::exp(l[e] - mx));
  } else {
    S = 0.0;
    for (int e = 0; e < E; ++e) S += (s[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
  }
  for (int e = 0; e < E; ++e) p[e] = s[e] / S;
}

// f_e = assignments to e / (N k).
std::vector<double> assignment_fractions(const int32_t* expert, int N, int E, int k) {
  std::vector<double> f(static_cast<size_t>(E), 0.0);
  for (long a = 0; a < static_cast<long>(N) * k; ++a) {
    RS_CHECK(expert[a] >= 0 && expert[a] < E, "aux loss: expert id out of range");
    f[static_cast<size_t>(expert[a])] += 1.0;
  }
  for (double& x : f) x /= static_cast<double>(N) * k;
  return f;
}

}  // namespace

void router_z_loss_backward(float* dlogits, const float* logits, int N, int E, float weight) {
  RS_CHECK(N > 0 && E > 0, "router_z_loss_backward: bad shape");
#pragma omp parallel for schedule(static)
  for (long n = 0; n < N; ++n) {
    const float* l = logits + n * E;
    double mx = l[0];
    for (int e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
    double sum = 0.0;
    for (int e = 0; e < E; ++e) sum += std::exp(l[e] - mx);
    const double lse = mx + std::log(sum);
    const double c = static_cast<double>(weight) * 2.0 * lse / N;
    float* d = dlogits + n * E;
    for (int e = 0; e < E; ++e) d[e] += static_cast<float>(c * std::exp(l[e] - mx) / sum);
  }
}

namespace {

// Data parallelism: f from the global batch's counts over its tokens.
std::vector<double> fractions(const int32_t* expert, int N, int E, int k, const int64_t* counts, int64_t n_total) {
  if (!counts) return assignment_fractions(expert, N, E, k);
  std::vector<double> f(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) f[static_cast<size_t>(e)] = static_cast<double>(counts[e]) / (static_cast<double>(n_total) * k);
  return f;
}

}  // namespace

double aux_loss_forward(const float* logits, const int32_t* expert, int N, int E, int k, RouterKind kind,
                        float weight, const int64_t* counts, int64_t n_total) {
  RS_CHECK(N > 0 && E > 0 && k > 0 && (!counts || n_total >= N), "aux_loss_forward: bad shape");
  const std::vector<double> f = fractions(expert, N, E, k, counts, n_total);
  const double n_mean = counts ? static_cast<double>(n_total) : N;
  std::vector<double> p(static_cast<size_t>(E)), s(static_cast<size_t>(E)), mean_p(static_cast<size_t>(E), 0.0);
  for (long n = 0; n < N; ++n) {  // serial: a fixed summation order
    double S = 0.0;
    router_probs(p.data(), s.data(), S, logits + n * E, E, kind);
    for (int e = 0; e < E; ++e) mean_p[static_cast<size_t>(e)] += p[static_cast<size_t>(e)];
  }
  double loss = 0.0;
  for (int e = 0; e < E; ++e) loss += f[static_cast<size_t>(e)] * mean_p[static_cast<size_t>(e)] / n_mean;
  return static_cast<double>(weight) * E * loss;
}

// dL/dl_j = c Σ_e f_e dp_e/dl_j with c = weight E / N.
//   softmax: dp_e/dl_j = p_e (δ_ej - p_j)           -> c p_j (f_j - Σ_e f_e p_e)
//   sigmoid: p_e = s_e / S, ds_j/dl_j = s_j (1 - s_j) -> c s_j (1 - s_j) / S (f_j - Σ_e f_e p_e)
void aux_loss_backward(float* dlogits, const float* logits, const int32_t* expert, int N, int E, int k,
                       RouterKind kind, float weight, const int64_t* counts, int64_t n_total) {
  RS_CHECK(N > 0 && E > 0 && k > 0 && (!counts || n_total >= N), "aux_loss_backward: bad shape");
  const std::vector<double> f = fractions(expert, N, E, k, counts, n_total);
  const double c = counts ? static_cast<double>(weight) * E / static_cast<double>(n_total)
                          : static_cast<double>(weight) * E / N;
#pragma omp parallel
  {
    std::vector<double> p(static_cast<size_t>(E)), s(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (long n = 0; n < N; ++n) {
      double S = 0.0;
      router_probs(p.data(), s.data(), S, logits + n * E, E, kind);
      double fp = 0.0;
      for (int e = 0; e < E; ++e) fp += f[static_cast<size_t>(e)] * p[static_cast<size_t>(e)];
      float* d = dlogits + n * E;
      for (int j = 0; j < E; ++j) {
        const size_t u = static_cast<size_t>(j);
        const double dp = kind == RouterKind::kSoftmax ? p[u] : s[u] * (1.0 - s[u]) / S;
        d[j] += static_cast<float>(c * dp * (f[u] - fp));
      }
    }
  }
}

}  // namespace rackstep::exec
