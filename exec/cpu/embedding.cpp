// Token embedding lookup and its scatter-add backward; learned positions.
#include <algorithm>
#include <cstring>

#include <omp.h>

#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {

void embedding_forward(float* out, const int32_t* tokens, const float* table, int N, int d,
                       int V) {
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; ++t) {
    const int32_t id = tokens[t];
    RS_CHECK(id >= 0 && id < V, "embedding_forward: token id out of range");
    std::memcpy(out + t * d, table + static_cast<long>(id) * d, sizeof(float) * d);
  }
}

void position_embedding_forward(float* out, const int32_t* pos, const float* table, int N, int d, int P) {
#pragma omp parallel for schedule(static)
  for (long t = 0; t < N; ++t) {
    const int32_t p = pos[t];
    RS_CHECK(p >= 0 && p < P, "position_embedding_forward: position out of range");
    const float* row = table + static_cast<long>(p) * d;
    float* o = out + t * d;
    for (int c = 0; c < d; ++c) o[c] += row[c];
  }
}

void embedding_backward(float* dtable, const float* dout, const int32_t* tokens, int N, int d,
                        int V) {
  // Each thread owns a range of columns and walks every token in order, so
  // repeated tokens add up in the same order on every run.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads();
    const int tid = omp_get_thread_num();
    const int c0 = static_cast<int>(static_cast<long>(d) * tid / nt);
    const int c1 = static_cast<int>(static_cast<long>(d) * (tid + 1) / nt);
    for (long t = 0; t < N; ++t) {
      const int32_t id = tokens[t];
      RS_CHECK(id >= 0 && id < V, "embedding_backward: token id out of range");
      float* dst = dtable + static_cast<long>(id) * d;
      const float* src = dout + t * d;
      for (int c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace rackstep::exec
