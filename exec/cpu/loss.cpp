// Cross-entropy over the vocabulary with logit z-loss, chunkable over tokens.
#include <algorithm>
#include <cmath>
#include <vector>

#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {

CrossEntropyResult cross_entropy_forward(float* lse, const float* logits, const int32_t* targets,
                                         int N, int V, float z_weight, int64_t n_total) {
  RS_CHECK(n_total > 0, "cross_entropy: n_total must count at least one token");
  std::vector<double> ce(N), z(N);  // per-row terms, summed in row order below
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; ++t) {
    const float* row = logits + t * V;
    const float mx = *std::max_element(row, row + V);
    double sum = 0.0;
    for (int i = 0; i < V; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
    const double l = mx + std::log(sum);
    lse[t] = static_cast<float>(l);
    if (targets[t] < 0) {
      ce[t] = z[t] = 0.0;
      continue;
    }
    RS_CHECK(targets[t] < V, "cross_entropy: target id out of range");
    ce[t] = l - row[targets[t]];
    z[t] = l * l;
  }
  CrossEntropyResult r;
  for (int t = 0; t < N; ++t) {
    r.ce += ce[t];
    r.z_loss += z[t];
  }
  r.ce /= static_cast<double>(n_total);
  r.z_loss *= static_cast<double>(z_weight) / static_cast<double>(n_total);
  return r;
}

// d/dl_i [lse - l_y + zw lse²] = p_i - [i = y] + 2 zw lse p_i.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, int N, int V, float z_weight,
                            int64_t n_total) {
  const float inv = 1.0f / static_cast<float>(n_total);
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; ++t) {
    const float* row = logits + t * V;
    float* drow = dlogits + t * V;
    if (targets[t] < 0) {
      std::fill(drow, drow + V, 0.0f);
      continue;
    }
    const float l = lse[t];
    const float zf = 1.0f + 2.0f * z_weight * l;
    for (int i = 0; i < V; ++i) drow[i] = std::exp(row[i] - l) * zf * inv;
    drow[targets[t]] -= inv;
  }
}

}  // namespace rackstep::exec
