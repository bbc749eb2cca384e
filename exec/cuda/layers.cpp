#include "exec/cuda/layers.h"

#include <cstddef>

#include "exec/cuda/detail.h"
#include "exec/cuda/ops.h"
#include "sim/base/check.h"

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

namespace {

// y (N, out) = x·W [+ bias]: the GEMM, then the bias added to every row.
void linear_bias_forward(Gemm& gemm, float* y, const float* x, const float* w, const float* bias, int N, int in,
                         int out) {
  linear_forward(gemm, y, x, w, N, in, out);
  if (bias) detail::add_bias_rows(y, bias, N, out, gemm.stream());
}

// dbias += Σ_rows dy, then linear_backward (every output reads dy only).
void linear_bias_backward(Gemm& gemm, float* dx, float* dw, float* dbias, const float* dy, const float* x,
                          const float* w, int N, int in, int out, bool accumulate_dx) {
  if (dbias) detail::bias_grad_rows(dbias, dy, N, out, gemm.stream());
  linear_backward(gemm, dx, dw, dy, x, w, N, in, out, accumulate_dx);
}

}  // namespace

void dense_mlp_forward(Gemm& gemm, float* y, float* a1, float* a3, float* h, const float* x, const MlpWeights& w,
                       MlpActivation act, int N, int d, int F) {
  const size_t nf = size_t(N) * F;
  linear_bias_forward(gemm, a1, x, w.w1, w.b1, N, d, F);
  switch (act) {
    case MlpActivation::kSwiGlu:
      RS_CHECK(w.w3 && a3, "cuda::dense_mlp_forward: SwiGLU needs W3 and a3");
      linear_bias_forward(gemm, a3, x, w.w3, w.b3, N, d, F);
      swiglu_forward(h, a1, a3, nf, gemm.stream());
      break;
    case MlpActivation::kGelu: gelu_forward(h, a1, nf, gemm.stream()); break;
    case MlpActivation::kRelu2: relu2_forward(h, a1, nf, gemm.stream()); break;
  }
  linear_bias_forward(gemm, y, h, w.w2, w.b2, N, F, d);
}

void dense_mlp_backward(Gemm& gemm, float* dx, const MlpGrads& g, const float* dy, const float* x, const float* a1,
                        const float* a3, const float* h, const MlpWeights& w, MlpActivation act, float* scratch, int N,
                        int d, int F, bool accumulate_dx) {
  const size_t nf = size_t(N) * F;
  float* dh = scratch;    // (N, F)
  float* da1 = dh + nf;   // (N, F)
  float* da3 = da1 + nf;  // (N, F) SwiGLU
  linear_bias_backward(gemm, dh, g.dw2, g.db2, dy, h, w.w2, N, F, d, /*accumulate_dx=*/false);
  switch (act) {
    case MlpActivation::kSwiGlu: swiglu_backward(da1, da3, dh, a1, a3, nf, gemm.stream()); break;
    case MlpActivation::kGelu: gelu_backward(da1, dh, a1, nf, gemm.stream()); break;
    case MlpActivation::kRelu2: relu2_backward(da1, dh, a1, nf, gemm.stream()); break;
  }
  linear_bias_backward(gemm, dx, g.dw1, g.db1, da1, x, w.w1, N, d, F, accumulate_dx);
  if (act == MlpActivation::kSwiGlu) {
    linear_bias_backward(gemm, dx, g.dw3, g.db3, da3, x, w.w3, N, d, F, /*accumulate_dx=*/true);
  }
}

// The bias-free SwiGLU case of dense_mlp_*: the same calls in the same order.
void dense_swiglu_forward(Gemm& gemm, float* y, float* a1, float* a3, float* h, const float* x, const float* w1,
                          const float* w3, const float* w2, int N, int d, int F) {
  dense_mlp_forward(gemm, y, a1, a3, h, x, {.w1 = w1, .w3 = w3, .w2 = w2}, MlpActivation::kSwiGlu, N, d, F);
}

void dense_swiglu_backward(Gemm& gemm, float* dx, float* dw1, float* dw3, float* dw2, const float* dy, const float* x,
                           const float* a1, const float* a3, const float* h, const float* w1, const float* w3,
                           const float* w2, float* scratch, int N, int d, int F, bool accumulate_dx) {
  dense_mlp_backward(gemm, dx, {.dw1 = dw1, .dw3 = dw3, .dw2 = dw2}, dy, x, a1, a3, h, {.w1 = w1, .w3 = w3, .w2 = w2},
                     MlpActivation::kSwiGlu, scratch, N, d, F, accumulate_dx);
}

}  // namespace rackstep::exec::cuda
