// Short depthwise causal convolution with document-boundary masking.
#include <algorithm>

#include "exec/cpu/kernel_util.h"
#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {
namespace {

// Whether source token src feeds output token t of the same sequence.
bool tap_live(const int32_t* doc_row, int t, int src) {
  return src >= 0 && (!doc_row || doc_row[src] == doc_row[t]);
}

}  // namespace

void sconv_init_identity(float* w, int C, int K) {
  std::fill(w, w + static_cast<long>(C) * K, 0.0f);
  for (int c = 0; c < C; ++c) w[static_cast<long>(c) * K + K - 1] = 1.0f;
}

void sconv_forward(float* y, const float* x, const float* w, const int32_t* doc, int B, int T,
                   int C, int K) {
  RS_CHECK(K >= 1, "sconv: kernel size must be >= 1");
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int32_t* doc_row = doc ? doc + static_cast<long>(b) * T : nullptr;
      float* yr = y + (static_cast<long>(b) * T + t) * C;
      std::fill(yr, yr + C, 0.0f);
      for (int j = 0; j < K; ++j) {
        const int src = t - (K - 1 - j);
        if (!tap_live(doc_row, t, src)) continue;
        const float* xr = x + (static_cast<long>(b) * T + src) * C;
        for (int c = 0; c < C; ++c) yr[c] += w[static_cast<long>(c) * K + j] * xr[c];
      }
    }
  }
}

void sconv_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                    const int32_t* doc, int B, int T, int C, int K) {
  RS_CHECK(K >= 1, "sconv: kernel size must be >= 1");
  // dx[t] = Σ_j w[:, j] dy[t + (K-1-j)] over the outputs t feeds.
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int32_t* doc_row = doc ? doc + static_cast<long>(b) * T : nullptr;
      float* dxr = dx + (static_cast<long>(b) * T + t) * C;
      std::fill(dxr, dxr + C, 0.0f);
      for (int j = 0; j < K; ++j) {
        const int out = t + (K - 1 - j);
        if (out >= T || !tap_live(doc_row, out, t)) continue;
        const float* dyr = dy + (static_cast<long>(b) * T + out) * C;
        for (int c = 0; c < C; ++c) dxr[c] += w[static_cast<long>(c) * K + j] * dyr[c];
      }
    }
  }
  // dw[c, j] += Σ_{b,t} dy[b,t,c] x[b, t-(K-1-j), c] over live taps.
  const long rows = static_cast<long>(B) * T;
  detail::reduce_rows(dw, static_cast<size_t>(C) * K, rows, [&](double* acc, long r) {
    const int b = static_cast<int>(r / T);
    const int t = static_cast<int>(r % T);
    const int32_t* doc_row = doc ? doc + static_cast<long>(b) * T : nullptr;
    const float* dyr = dy + r * C;
    for (int j = 0; j < K; ++j) {
      const int src = t - (K - 1 - j);
      if (!tap_live(doc_row, t, src)) continue;
      const float* xr = x + (static_cast<long>(b) * T + src) * C;
      for (int c = 0; c < C; ++c) acc[static_cast<long>(c) * K + j] += static_cast<double>(dyr[c]) * xr[c];
    }
  });
}

}  // namespace rackstep::exec
