// The grouped SwiGLU experts on the GPU: one cuBLASLt GEMM per expert over its
// rows (host offsets give the sizes), in the CPU kernel's order of operations.
// A grouped-GEMM kernel (one launch for all experts) is the next step; the
// per-expert loop is the correct baseline it will be measured against.
#include "exec/cuda/moe.h"

#include "exec/cuda/check.h"
#include "exec/cuda/detail.h"
#include "exec/cuda/ops.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {

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
  float* dy_kept = scratch;              // (A, L)
  float* dh = dy_kept + size_t(A) * L;   // (A, F)
  float* da1 = dh + size_t(A) * F;       // (A, F)
  float* da3 = da1 + size_t(A) * F;      // (A, F)
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

}  // namespace rackstep::exec::cuda
