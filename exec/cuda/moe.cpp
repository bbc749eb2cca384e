// The grouped SwiGLU experts on the GPU: one cuBLASLt GEMM per expert over its
// rows (host offsets give the sizes), in the CPU kernel's order of operations,
// with the experts' variant (per-expert biases, the clamped SwiGLU) where
// ExpertOptions asks for it.
// The grouped variants make each of those GEMMs one cuBLAS grouped-batched
// call over all experts; the per-expert loop is the baseline they are measured
// against (bench/cuda/kernels_timing.cpp).
#include "exec/cuda/moe.h"

#include <vector>

#include "exec/cuda/check.h"
#include "exec/cuda/detail.h"
#include "exec/cuda/ops.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {
namespace {

// The experts' backward scratch (experts_scratch_floats(A, L, F), moe.h),
// carved once for the per-expert loop and the grouped path alike.
struct BackwardScratch {
  float* dy_kept;  // (A, L) dy with dropped rows zeroed
  float* dh;       // (A, F)
  float* da1;      // (A, F)
  float* da3;      // (A, F)
};
// The experts' variant (ExpertOptions, exec/kernels.h): expert e's bias row
// added to its n rows, its gradient summed over them, and the SwiGLU (plain:
// the templated kernels of ops.h, bitwise the bias-free path of before).
void add_expert_bias(float* y, const float* bias, int e, int n, int width, cudaStream_t stream) {
  if (bias) detail::add_bias_rows(y, bias + size_t(e) * width, n, width, stream);
}
void add_expert_bias_grad(float* db, const float* dy, int e, int n, int width, cudaStream_t stream) {
  if (db) detail::bias_grad_rows(db + size_t(e) * width, dy, n, width, stream);
}
void expert_act_forward(float* h, const float* a1, const float* a3, size_t n, const SwiGluVariant& v,
                        cudaStream_t stream) {
  if (v.plain()) {
    swiglu_forward(h, a1, a3, n, stream);
    return;
  }
  detail::swiglu_variant_forward(h, a1, a3, n, v, stream);
}
void expert_act_backward(float* da1, float* da3, const float* dh, const float* a1, const float* a3, size_t n,
                         const SwiGluVariant& v, cudaStream_t stream) {
  if (v.plain()) {
    swiglu_backward(da1, da3, dh, a1, a3, n, stream);
    return;
  }
  detail::swiglu_variant_backward(da1, da3, dh, a1, a3, n, v, stream);
}

BackwardScratch carve_backward_scratch(float* scratch, int A, int L, int F) {
  BackwardScratch b;
  b.dy_kept = scratch;
  b.dh = b.dy_kept + size_t(A) * L;
  b.da1 = b.dh + size_t(A) * F;
  b.da3 = b.da1 + size_t(A) * F;
  return b;
}

}  // namespace

void experts_forward(Gemm& gemm, float* ys, float* a1, float* a3, float* h, const float* xs,
                     const int32_t* host_offsets, const uint8_t* keep, const float* w1, const float* w3,
                     const float* w2, int A, int E, int L, int F, const ExpertOptions& opt) {
  const cudaStream_t stream = gemm.stream();
  RS_CHECK(host_offsets[0] == 0 && host_offsets[E] == A, "experts: offsets must cover the A rows");
  const size_t LF = size_t(L) * F;
  for (int e = 0; e < E; ++e) {
    const int n = host_offsets[e + 1] - host_offsets[e];
    if (n == 0) continue;
    const size_t r0 = host_offsets[e];
    gemm.run({.m = n, .n = F, .k = L}, DType::kF32, a1 + r0 * F, xs + r0 * L, w1 + e * LF);
    gemm.run({.m = n, .n = F, .k = L}, DType::kF32, a3 + r0 * F, xs + r0 * L, w3 + e * LF);
    add_expert_bias(a1 + r0 * F, opt.b1, e, n, F, stream);
    add_expert_bias(a3 + r0 * F, opt.b3, e, n, F, stream);
    expert_act_forward(h + r0 * F, a1 + r0 * F, a3 + r0 * F, size_t(n) * F, opt.act, stream);
    gemm.run({.m = n, .n = L, .k = F}, DType::kF32, ys + r0 * L, h + r0 * F, w2 + e * LF);
    add_expert_bias(ys + r0 * L, opt.b2, e, n, L, stream);
  }
  if (!keep || A == 0) return;
  detail::zero_dropped_rows(ys, ys, keep, A, L, stream);
}

void experts_backward(Gemm& gemm, float* dxs, float* dw1, float* dw3, float* dw2, const float* dys, const float* xs,
                      const float* a1, const float* a3, const float* h, const int32_t* host_offsets,
                      const uint8_t* keep, const float* w1, const float* w3, const float* w2, float* scratch, int A,
                      int E, int L, int F, const ExpertOptions& opt) {
  const cudaStream_t stream = gemm.stream();
  RS_CHECK(host_offsets[0] == 0 && host_offsets[E] == A, "experts: offsets must cover the A rows");
  const size_t LF = size_t(L) * F;
  const BackwardScratch sc = carve_backward_scratch(scratch, A, L, F);
  float *dy_kept = sc.dy_kept, *dh = sc.dh, *da1 = sc.da1, *da3 = sc.da3;
  if (keep && A > 0) {
    detail::zero_dropped_rows(dy_kept, dys, keep, A, L, stream);
  } else {
    RS_CUDA_CHECK(cudaMemcpyAsync(dy_kept, dys, sizeof(float) * size_t(A) * L, cudaMemcpyDeviceToDevice, stream));
  }
  for (int e = 0; e < E; ++e) {
    const int n = host_offsets[e + 1] - host_offsets[e];
    if (n == 0) continue;
    const size_t r0 = host_offsets[e];
    // dh = dy·W2ᵀ, dW2 += hᵀ·dy
    gemm.run({.m = n, .n = F, .k = L, .trans_b = true}, DType::kF32, dh + r0 * F, dy_kept + r0 * L, w2 + e * LF);
    gemm.run({.m = F, .n = L, .k = n, .trans_a = true, .beta = 1.0f}, DType::kF32, dw2 + e * LF, h + r0 * F,
             dy_kept + r0 * L);
    expert_act_backward(da1 + r0 * F, da3 + r0 * F, dh + r0 * F, a1 + r0 * F, a3 + r0 * F, size_t(n) * F, opt.act,
                        stream);
    add_expert_bias_grad(opt.db2, dy_kept + r0 * L, e, n, L, stream);
    add_expert_bias_grad(opt.db1, da1 + r0 * F, e, n, F, stream);
    add_expert_bias_grad(opt.db3, da3 + r0 * F, e, n, F, stream);
    // dxs = da1·W1ᵀ + da3·W3ᵀ, dW1 += xsᵀ·da1, dW3 += xsᵀ·da3
    gemm.run({.m = n, .n = L, .k = F, .trans_b = true}, DType::kF32, dxs + r0 * L, da1 + r0 * F, w1 + e * LF);
    gemm.run({.m = n, .n = L, .k = F, .trans_b = true, .beta = 1.0f}, DType::kF32, dxs + r0 * L, da3 + r0 * F,
             w3 + e * LF);
    gemm.run({.m = L, .n = F, .k = n, .trans_a = true, .beta = 1.0f}, DType::kF32, dw1 + e * LF, xs + r0 * L,
             da1 + r0 * F);
    gemm.run({.m = L, .n = F, .k = n, .trans_a = true, .beta = 1.0f}, DType::kF32, dw3 + e * LF, xs + r0 * L,
             da3 + r0 * F);
  }
}

namespace {

// Expert e's rows [offsets[e], offsets[e+1]) as GEMM items: C_e = A_e · B_e with
// row strides (in floats) and the expert's weight matrix at w + e·w_stride.
std::vector<GemmItem> per_expert(const int32_t* offsets, int E, int n, int k, float* c, int c_cols, const float* a,
                                 int a_cols, const float* w, size_t w_stride) {
  std::vector<GemmItem> items;
  for (int e = 0; e < E; ++e) {
    const size_t r0 = offsets[e];
    items.push_back({.m = offsets[e + 1] - offsets[e], .n = n, .k = k, .c = c + r0 * c_cols, .a = a + r0 * a_cols,
                     .b = w + e * w_stride});
  }
  return items;
}

// Weight gradients: dW_e (rows, cols) += X_eᵀ · D_e over expert e's rows.
std::vector<GemmItem> per_expert_weight_grad(const int32_t* offsets, int E, int rows, int cols, float* dw,
                                             const float* x, const float* d) {
  std::vector<GemmItem> items;
  for (int e = 0; e < E; ++e) {
    const size_t r0 = offsets[e];
    const int n_rows = offsets[e + 1] - offsets[e];
    if (n_rows == 0) continue;
    items.push_back({.m = rows, .n = cols, .k = n_rows, .c = dw + size_t(e) * rows * cols, .a = x + r0 * rows,
                     .b = d + r0 * cols});
  }
  return items;
}

}  // namespace

void experts_forward_grouped(Gemm& gemm, float* ys, float* a1, float* a3, float* h, const float* xs,
                             const int32_t* host_offsets, const uint8_t* keep, const float* w1, const float* w3,
                             const float* w2, int A, int E, int L, int F, const ExpertOptions& opt) {
  const cudaStream_t stream = gemm.stream();
  RS_CHECK(host_offsets[0] == 0 && host_offsets[E] == A, "experts: offsets must cover the A rows");
  const size_t LF = size_t(L) * F;
  // Expert e's rows of buffer y (rows, width) get its bias row.
  const auto add_biases = [&](float* y, const float* bias, int width) {
    for (int e = 0; bias && e < E; ++e) {
      const int r0 = host_offsets[e];
      add_expert_bias(y + size_t(r0) * width, bias, e, host_offsets[e + 1] - r0, width, stream);
    }
  };
  gemm.run_grouped(per_expert(host_offsets, E, F, L, a1, F, xs, L, w1, LF), false, false, 1.0f, 0.0f, DType::kF32);
  gemm.run_grouped(per_expert(host_offsets, E, F, L, a3, F, xs, L, w3, LF), false, false, 1.0f, 0.0f, DType::kF32);
  add_biases(a1, opt.b1, F);
  add_biases(a3, opt.b3, F);
  expert_act_forward(h, a1, a3, size_t(A) * F, opt.act, stream);
  gemm.run_grouped(per_expert(host_offsets, E, L, F, ys, L, h, F, w2, LF), false, false, 1.0f, 0.0f, DType::kF32);
  add_biases(ys, opt.b2, L);
  if (!keep || A == 0) return;
  detail::zero_dropped_rows(ys, ys, keep, A, L, gemm.stream());
}

void experts_backward_grouped(Gemm& gemm, float* dxs, float* dw1, float* dw3, float* dw2, const float* dys,
                              const float* xs, const float* a1, const float* a3, const float* h,
                              const int32_t* host_offsets, const uint8_t* keep, const float* w1, const float* w3,
                              const float* w2, float* scratch, int A, int E, int L, int F, const ExpertOptions& opt) {
  const cudaStream_t stream = gemm.stream();
  RS_CHECK(host_offsets[0] == 0 && host_offsets[E] == A, "experts: offsets must cover the A rows");
  const size_t LF = size_t(L) * F;
  const BackwardScratch sc = carve_backward_scratch(scratch, A, L, F);
  float *dy_kept = sc.dy_kept, *dh = sc.dh, *da1 = sc.da1, *da3 = sc.da3;
  if (A == 0) return;
  if (keep) {
    detail::zero_dropped_rows(dy_kept, dys, keep, A, L, stream);
  } else {
    RS_CUDA_CHECK(cudaMemcpyAsync(dy_kept, dys, sizeof(float) * size_t(A) * L, cudaMemcpyDeviceToDevice, stream));
  }
  // dh = dy·W2ᵀ, dW2 += hᵀ·dy
  gemm.run_grouped(per_expert(host_offsets, E, F, L, dh, F, dy_kept, L, w2, LF), false, true, 1.0f, 0.0f,
                   DType::kF32);
  gemm.run_grouped(per_expert_weight_grad(host_offsets, E, F, L, dw2, h, dy_kept), true, false, 1.0f, 1.0f,
                   DType::kF32);
  expert_act_backward(da1, da3, dh, a1, a3, size_t(A) * F, opt.act, stream);
  for (int e = 0; e < E; ++e) {  // the biases' gradients: each expert's rows summed
    const int r0 = host_offsets[e], n = host_offsets[e + 1] - r0;
    add_expert_bias_grad(opt.db2, dy_kept + size_t(r0) * L, e, n, L, stream);
    add_expert_bias_grad(opt.db1, da1 + size_t(r0) * F, e, n, F, stream);
    add_expert_bias_grad(opt.db3, da3 + size_t(r0) * F, e, n, F, stream);
  }
  // dxs = da1·W1ᵀ + da3·W3ᵀ, dW1 += xsᵀ·da1, dW3 += xsᵀ·da3
  gemm.run_grouped(per_expert(host_offsets, E, L, F, dxs, L, da1, F, w1, LF), false, true, 1.0f, 0.0f, DType::kF32);
  gemm.run_grouped(per_expert(host_offsets, E, L, F, dxs, L, da3, F, w3, LF), false, true, 1.0f, 1.0f, DType::kF32);
  gemm.run_grouped(per_expert_weight_grad(host_offsets, E, L, F, dw1, xs, da1), true, false, 1.0f, 1.0f, DType::kF32);
  gemm.run_grouped(per_expert_weight_grad(host_offsets, E, L, F, dw3, xs, da3), true, false, 1.0f, 1.0f, DType::kF32);
}

}  // namespace rackstep::exec::cuda
