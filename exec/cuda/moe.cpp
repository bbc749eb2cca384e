// The grouped SwiGLU experts on the GPU: one cuBLASLt GEMM per expert over its
// rows (host offsets give the sizes), in the CPU kernel's order of operations.
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
                     const float* w2, int A, int E, int L, int F) {
  const cudaStream_t stream = gemm.stream();
  RS_CHECK(host_offsets[0] == 0 && host_offsets[E] == A, "experts: offsets must cover the A rows");
  const size_t LF = size_t(L) * F;
  for (int e = 0; e < E; ++e) {
    const int n = host_offsets[e + 1] - host_offsets[e];
    if (n == 0) continue;
    const size_t r0 = host_offsets[e];
    gemm.run({.m = n, .n = F, .k = L}, DType::kF32, a1 + r0 * F, xs + r0 * L, w1 + e * LF);
    gemm.run({.m = n, .n = F, .k = L}, DType::kF32, a3 + r0 * F, xs + r0 * L, w3 + e * LF);
    swiglu_forward(h + r0 * F, a1 + r0 * F, a3 + r0 * F, size_t(n) * F, stream);
    gemm.run({.m = n, .n = L, .k = F}, DType::kF32, ys + r0 * L, h + r0 * F, w2 + e * LF);
  }
  if (!keep || A == 0) return;
  detail::zero_dropped_rows(ys, ys, keep, A, L, stream);
}

void experts_backward(Gemm& gemm, float* dxs, float* dw1, float* dw3, float* dw2, const float* dys, const float* xs,
                      const float* a1, const float* a3, const float* h, const int32_t* host_offsets,
                      const uint8_t* keep, const float* w1, const float* w3, const float* w2, float* scratch, int A,
                      int E, int L, int F) {
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
    swiglu_backward(da1 + r0 * F, da3 + r0 * F, dh + r0 * F, a1 + r0 * F, a3 + r0 * F, size_t(n) * F, stream);
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
                             const float* w2, int A, int E, int L, int F) {
  RS_CHECK(host_offsets[0] == 0 && host_offsets[E] == A, "experts: offsets must cover the A rows");
  const size_t LF = size_t(L) * F;
  gemm.run_grouped(per_expert(host_offsets, E, F, L, a1, F, xs, L, w1, LF), false, false, 1.0f, 0.0f, DType::kF32);
  gemm.run_grouped(per_expert(host_offsets, E, F, L, a3, F, xs, L, w3, LF), false, false, 1.0f, 0.0f, DType::kF32);
  swiglu_forward(h, a1, a3, size_t(A) * F, gemm.stream());
  gemm.run_grouped(per_expert(host_offsets, E, L, F, ys, L, h, F, w2, LF), false, false, 1.0f, 0.0f, DType::kF32);
  if (!keep || A == 0) return;
  detail::zero_dropped_rows(ys, ys, keep, A, L, gemm.stream());
}

void experts_backward_grouped(Gemm& gemm, float* dxs, float* dw1, float* dw3, float* dw2, const float* dys,
                              const float* xs, const float* a1, const float* a3, const float* h,
                              const int32_t* host_offsets, const uint8_t* keep, const float* w1, const float* w3,
                              const float* w2, float* scratch, int A, int E, int L, int F) {
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
  swiglu_backward(da1, da3, dh, a1, a3, size_t(A) * F, stream);
  // dxs = da1·W1ᵀ + da3·W3ᵀ, dW1 += xsᵀ·da1, dW3 += xsᵀ·da3
  gemm.run_grouped(per_expert(host_offsets, E, L, F, dxs, L, da1, F, w1, LF), false, true, 1.0f, 0.0f, DType::kF32);
  gemm.run_grouped(per_expert(host_offsets, E, L, F, dxs, L, da3, F, w3, LF), false, true, 1.0f, 1.0f, DType::kF32);
  gemm.run_grouped(per_expert_weight_grad(host_offsets, E, L, F, dw1, xs, da1), true, false, 1.0f, 1.0f, DType::kF32);
  gemm.run_grouped(per_expert_weight_grad(host_offsets, E, L, F, dw3, xs, da3), true, false, 1.0f, 1.0f, DType::kF32);
}

}  // namespace rackstep::exec::cuda
