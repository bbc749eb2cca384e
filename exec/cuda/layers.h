// The CUDA backend's GEMM-bearing layers, composed from cuBLASLt GEMMs and the
// elementwise kernels, in the shapes and gradient rule of exec/kernels.h
// (fp32 parity mode): linear layers (a bias is the backend's separate add), the
// tied LM head, the gated norm, the attention gate and the dense MLPs (dense
// layers and shared experts: SwiGLU, GeLU, ReLU², with or without biases).
// Everything runs on gemm.stream().
//
//   cuda::linear_forward(gemm, y, x, w, N, in, out);
//   cuda::attn_gate_forward(gemm, y, g, o, x, w_gate, N, d, H, hd);
//   cuda::dense_mlp_forward(gemm, y, a1, nullptr, h, x, weights, MlpActivation::kGelu, N, d, F);
#pragma once

#include <cuda_runtime.h>

#include "exec/cuda/gemm.h"
#include "exec/kernels.h"

namespace rackstep::exec::cuda {

// y (N, out) = x (N, in) · W (in, out).
void linear_forward(Gemm& gemm, float* y, const float* x, const float* w, int N, int in, int out);
// dx = dy·Wᵀ (+= with accumulate_dx; skipped when dx is null), dW += xᵀ·dy.
void linear_backward(Gemm& gemm, float* dx, float* dw, const float* dy, const float* x, const float* w, int N, int in,
                     int out, bool accumulate_dx = false);

// Tied LM head: y (N, out) = x (N, in) · Wᵀ, W stored (out, in) (the embedding table).
void linear_t_forward(Gemm& gemm, float* y, const float* x, const float* w, int N, int in, int out);
// dx = dy·W (+= with accumulate_dx; skipped when dx is null), dW += dyᵀ·x.
void linear_t_backward(Gemm& gemm, float* dx, float* dw, const float* dy, const float* x, const float* w, int N,
                       int in, int out, bool accumulate_dx = false);

// Gated norm: y = x · σ(silu(x·W_down)·W_up); a (N, r) and g (N, d) saved.
// scratch: exec::gated_norm_scratch_floats(N, d, r) floats (forward uses N·r of them).
void gated_norm_forward(Gemm& gemm, float* y, float* a, float* g, const float* x, const float* w_down,
                        const float* w_up, float* scratch, int N, int d, int r);
// dx =, dW_down +=, dW_up +=.
void gated_norm_backward(Gemm& gemm, float* dx, float* dw_down, float* dw_up, const float* dy, const float* x,
                         const float* a, const float* g, const float* w_down, const float* w_up, float* scratch, int N,
                         int d, int r);

// g = 2σ(x·W_gate) saved (N, H); y = g·o per head.
void attn_gate_forward(Gemm& gemm, float* y, float* g, const float* o, const float* x, const float* w_gate, int N,
                       int d, int H, int hd);
// d_o =, dx = (or +=), dW_gate +=; scratch (N, H).
void attn_gate_backward(Gemm& gemm, float* d_o, float* dx, float* dw_gate, const float* dy, const float* o,
                        const float* x, const float* g, const float* w_gate, float* scratch, int N, int d, int H,
                        int hd, bool accumulate_dx);

// y = (silu(x·W1) · (x·W3))·W2; a1, a3, h saved (N, F).
void dense_swiglu_forward(Gemm& gemm, float* y, float* a1, float* a3, float* h, const float* x, const float* w1,
                          const float* w3, const float* w2, int N, int d, int F);
// scratch: 3·N·F floats.
void dense_swiglu_backward(Gemm& gemm, float* dx, float* dw1, float* dw3, float* dw2, const float* dy, const float* x,
                           const float* a1, const float* a3, const float* h, const float* w1, const float* w3,
                           const float* w2, float* scratch, int N, int d, int F, bool accumulate_dx);

// Any dense MLP, as exec/kernels.h's dense_mlp_forward / _backward (same
// buffers, weights and calls in the same order): a1 = x·W1 [+ b1]
// (a3 = x·W3 [+ b3] for SwiGLU), h = act(a1[, a3]), y = h·W2 [+ b2]. A bias is
// added after its GEMM (the CPU starts the GEMM from it: fp32 rounding apart).
void dense_mlp_forward(Gemm& gemm,
                       float* y,         // (N, d)
                       float* a1,        // (N, F) saved
                       float* a3,        // (N, F) saved (SwiGLU), else unused / nullptr
                       float* h,         // (N, F) saved
                       const float* x,   // (N, d)
                       const MlpWeights& w, MlpActivation act, int N, int d, int F);
// dx = (or += with accumulate_dx); every weight and bias gradient +=
// (bias gradients: column sums in row order, in double, detail::bias_grad_rows).
void dense_mlp_backward(Gemm& gemm,
                        float* dx,          // (N, d)
                        const MlpGrads& g,
                        const float* dy,    // (N, d)
                        const float* x,     // (N, d)
                        const float* a1,    // (N, F)
                        const float* a3,    // (N, F) SwiGLU only
                        const float* h,     // (N, F)
                        const MlpWeights& w, MlpActivation act,
                        float* scratch,     // (exec::dense_mlp_scratch_floats(N, F))
                        int N, int d, int F, bool accumulate_dx);

}  // namespace rackstep::exec::cuda
