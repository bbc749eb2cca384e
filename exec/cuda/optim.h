// The optimizer updates of exec/optim.h on the GPU, one call per tensor (or per
// expert matrix), fp32 master weights and states: Adam (+ decoupled decay),
// the AdamH direction, Muon's Nesterov momentum, Newton–Schulz through
// cuBLASLt, and the hyperball step (normalised update, then rescale to ‖W0‖).
// Sums of squares are deterministic: fixed grid, per-block partials in double
// summed in block order.
//
//   cuda::adam_update(w, g, m, v, n, {.lr = lr, .b1 = b1, .b2 = b2, .c1 = c1, .c2 = c2, .eps = eps}, stream);
//   cuda::muon_momentum(u, g, m, n, b1, stream);
//   cuda::newton_schulz(gemm, u, rows, cols, 5, o, work, sum_work);
//   cuda::hyperball_update(w, o, n, lr, w0_norm, work, stream);
// The whole step over resident arenas, as the trainer runs it: exec/cuda/optimizer.h.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "exec/cuda/gemm.h"

namespace rackstep::exec::cuda {

struct AdamScalars {
  float lr = 0, b1 = 0, b2 = 0;
  float c1 = 1, c2 = 1;  // bias corrections 1/(1 − β^t)
  float eps = 1e-8f;
  float decay = 0;       // lr · weight decay (decoupled)
};

// w −= lr · adam_direction + decay · w; m, v updated.
void adam_update(float* w, const float* g, float* m, float* v, size_t n, const AdamScalars& s, cudaStream_t stream);
// u = adam_direction (AdamH feeds it to hyperball_update); m, v updated.
void adam_direction(float* u, const float* g, float* m, float* v, size_t n, const AdamScalars& s, cudaStream_t stream);
// u = Nesterov look-ahead of the updated momentum m.
void muon_momentum(float* u, const float* g, float* m, size_t n, float b1, cudaStream_t stream);

// Scratch floats the functions below need for (rows, cols) / n elements.
size_t newton_schulz_work_floats(int64_t rows, int64_t cols);
size_t sum_squares_work_doubles();

// Σ x² in double, on the host when the call returns (synchronises the stream).
double sum_squares(const float* x, size_t n, double* work, cudaStream_t stream);
// The same into *total on the device, stream-ordered (partials: sum_squares_work_doubles() − 1).
void sum_squares_async(double* total, const float* x, size_t n, double* partials, cudaStream_t stream);
// out (rows, cols) = NS5(g / (‖g‖_F + 1e-7)) with the quintic of exec/optim.h,
// on X (r, c), r ≤ c (transposed in and out when rows > cols).
// Runs on gemm.stream().
void newton_schulz(Gemm& gemm, const float* g, int64_t rows, int64_t cols, int steps, float* out, float* work,
                   double* sum_work);
// w −= lr ‖W0‖ u/‖u‖, then w ← w ‖W0‖/‖w‖.
void hyperball_update(float* w, const float* u, size_t n, double lr, double w0_norm, double* sum_work,
                      cudaStream_t stream);

}  // namespace rackstep::exec::cuda
