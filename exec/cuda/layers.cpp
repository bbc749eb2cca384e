#include "exec/cuda/layers.h"

#include <cstddef>

#include "exec/cuda/detail.h"
#include "exec/cuda/ops.h"

namespace rackstep::exec::cuda {

void linear_forward(Gemm& gemm, float* y, const float* x, const float* w, int N, int in, int out) {
  if (N == 0) return;
  gemm.run({.m = N, .n = out, .k = in}, DType::kF32, y, x, w);
}

void linear_backward(Gemm& gemm, float* dx, float* dw, const float* dy, const float* x, const float* w, int N, int in,
                     int out, bool accumulate_dx) {
  if (N == 0) return;
  if (dx) gemm.run({.m = N, .n = in, .k = out, .trans_b = true, .beta = accumulate_dx ? 1.0f : 0.0f}, DType::kF32, dx, dy, w);
  gemm.run({.m = in, .n = out, .k = N, .trans_a = true, .beta = 1.0f}, DType::kF32, dw, x, dy);
}

void linear_t_forward(Gemm& gemm, float* y, const float* x, const float* w, int N, int in, int out) {
  if (N == 0) return;
  gemm.run({.m = N, .n = out, .k = in, .trans_b = true}, DType::kF32, y, x, w);
}

void linear_t_backward(Gemm& gemm, float* dx, float* dw, const float* dy, const float* x, const float* w, int N,
                       int in, int out, bool accumulate_dx) {
  if (N == 0) return;
  if (dx) gemm.run({.m = N, .n = in, .k = out, .beta = accumulate_dx ? 1.0f : 0.0f}, DType::kF32, dx, dy, w);
  gemm.run({.m = out, .n = in, .k = N, .trans_a = true, .beta = 1.0f}, DType::kF32, dw, dy, x);
}

void gated_norm_forward(Gemm& gemm, float* y, float* a, float* g, const float* x, const float* w_down,
                        const float* w_up, float* scratch, int N, int d, int r) {
  const size_t nr = size_t(N) * r;
  float* s = scratch;  // (N, r) silu(a), not kept: backward recomputes it
  linear_forward(gemm, a, x, w_down, N, d, r);
  detail::silu(s, a, nr, gemm.stream());
  linear_forward(gemm, g, s, w_up, N, r, d);
  detail::gate_sigmoid_mul(y, g, x, size_t(N) * d, gemm.stream());
}

void gated_norm_backward(Gemm& gemm, float* dx, float* dw_down, float* dw_up, const float* dy, const float* x,
                         const float* a, const float* g, const float* w_down, const float* w_up, float* scratch, int N,
                         int d, int r) {
  const size_t nd = size_t(N) * d, nr = size_t(N) * r;
  float* db = scratch;  // (N, d) grad of the gate pre-activation b = s·W_up
  float* s = db + nd;   // (N, r) silu(a)
  float* ds = s + nr;   // (N, r) grad of s, then of a
  detail::gated_norm_grad(db, dx, dy, x, g, nd, gemm.stream());
  detail::silu(s, a, nr, gemm.stream());
  linear_backward(gemm, ds, dw_up, db, s, w_up, N, r, d);
  detail::mul_silu_grad(ds, a, nr, gemm.stream());
  linear_backward(gemm, dx, dw_down, ds, x, w_down, N, d, r, /*accumulate_dx=*/true);
}

void attn_gate_forward(Gemm& gemm, float* y, float* g, const float* o, const float* x, const float* w_gate, int N,
                       int d, int H, int hd) {
  linear_forward(gemm, g, x, w_gate, N, d, H);
  detail::attn_gate_apply(y, g, o, N, H, hd, gemm.stream());
}

void attn_gate_backward(Gemm& gemm, float* d_o, float* dx, float* dw_gate, const float* dy, const float* o,
                        const float* x, const float* g, const float* w_gate, float* scratch, int N, int d, int H,
                        int hd, bool accumulate_dx) {
  detail::attn_gate_grad(d_o, scratch, dy, o, g, N, H, hd, gemm.stream());
  linear_backward(gemm, dx, dw_gate, scratch, x, w_gate, N, d, H, accumulate_dx);
}

void dense_swiglu_forward(Gemm& gemm, float* y, float* a1, float* a3, float* h, const float* x, const float* w1,
                          const float* w3, const float* w2, int N, int d, int F) {
  linear_forward(gemm, a1, x, w1, N, d, F);
  linear_forward(gemm, a3, x, w3, N, d, F);
  swiglu_forward(h, a1, a3, size_t(N) * F, gemm.stream());
  linear_forward(gemm, y, h, w2, N, F, d);
}

void dense_swiglu_backward(Gemm& gemm, float* dx, float* dw1, float* dw3, float* dw2, const float* dy, const float* x,
                           const float* a1, const float* a3, const float* h, const float* w1, const float* w3,
                           const float* w2, float* scratch, int N, int d, int F, bool accumulate_dx) {
  const size_t nf = size_t(N) * F;
  float* dh = scratch;
  float* da1 = dh + nf;
  float* da3 = da1 + nf;
  linear_backward(gemm, dh, dw2, dy, h, w2, N, F, d);
  swiglu_backward(da1, da3, dh, a1, a3, nf, gemm.stream());
  linear_backward(gemm, dx, dw1, da1, x, w1, N, d, F, accumulate_dx);
  linear_backward(gemm, dx, dw3, da3, x, w3, N, d, F, /*accumulate_dx=*/true);
}

}  // namespace rackstep::exec::cuda
