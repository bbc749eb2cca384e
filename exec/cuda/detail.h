// Small launchers shared by the CUDA backend's host-side orchestration
// (exec/cuda/optim.cpp, exec/cuda/moe.cpp); not public.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "exec/kernels.h"

namespace rackstep::exec::cuda::detail {

void scale(float* x, size_t n, float s, cudaStream_t stream);                          // x *= s
void axpy(float* y, const float* x, size_t n, float a, cudaStream_t stream);           // y += a x
void transpose(float* out, const float* in, int64_t rows, int64_t cols, cudaStream_t stream);  // (rows, cols) -> (cols, rows)
// dst[r] = keep[r] ? src[r] : 0 per row of L floats (dst may alias src).
void zero_dropped_rows(float* dst, const float* src, const uint8_t* keep, int rows, int L, cudaStream_t stream);

// The routed experts' variant (exec/cuda/moe.cu, formulas in element_math.h):
// the clamped SwiGLU forward / backward (exec/kernels.h SwiGluVariant), a
// per-expert bias added to each of its rows, y (rows, width) += bias (width),
// and its gradient, db (width) += Σ_rows dy (columns summed in row order, double).
void swiglu_variant_forward(float* h, const float* a1, const float* a3, size_t n, const SwiGluVariant& v,
                            cudaStream_t stream);
void swiglu_variant_backward(float* da1, float* da3, const float* dh, const float* a1, const float* a3, size_t n,
                             const SwiGluVariant& v, cudaStream_t stream);
void add_bias_rows(float* y, const float* bias, int rows, int width, cudaStream_t stream);
void bias_grad_rows(float* db, const float* dy, int rows, int width, cudaStream_t stream);

// Attention gate, elementwise part: z (N, H) becomes g = 2σ(z) in place, y = g·o.
void attn_gate_apply(float* y, float* g, const float* o, int N, int H, int hd, cudaStream_t stream);
// d_o = g·dy, dz = (dy·o) g (1 − g/2).
void attn_gate_grad(float* d_o, float* dz, const float* dy, const float* o, const float* g, int N, int H, int hd,
                    cudaStream_t stream);

// Gated norm, elementwise parts (exec/cuda/layers.cpp): s = silu(a); g = σ(g) in place and
// y = x·g; db = dy x g (1 − g) and dx = dy g; ds *= silu'(a).
void silu(float* s, const float* a, size_t n, cudaStream_t stream);
void gate_sigmoid_mul(float* y, float* g, const float* x, size_t n, cudaStream_t stream);
void gated_norm_grad(float* db, float* dx, const float* dy, const float* x, const float* g, size_t n,
                     cudaStream_t stream);
void mul_silu_grad(float* ds, const float* a, size_t n, cudaStream_t stream);

}  // namespace rackstep::exec::cuda::detail
