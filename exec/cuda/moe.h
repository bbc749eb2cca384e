// The routed-expert ops of exec/kernels.h on the GPU (fp32; the bf16 path of
// the expert GEMMs is future work): router top-k with the selection bias and
// combine weights, its backward, the router z-loss and the aux balancing loss,
// the quantile-balancing histogram and bias,
// grouping assignments by expert (stable, through CUB's radix sort), gather,
// the grouped SwiGLU experts (one cuBLASLt GEMM per expert) and combine.
// Same buffers, shapes, tie rules and gradient rule as the CPU kernels.
//
//   cuda::router_forward(expert, weight, threshold, logits, bias, N, E, k, RouterKind::kSigmoid, 1.f, s);
//   cuda::group_by_expert(sorted_pos, offsets, expert, N * k, E, scratch, s);
//   cuda::gather_forward(xs, x, sorted_pos, N, k, L, s);
//   cuda::experts_forward(gemm, ys, a1, a3, h, xs, host_offsets, keep, w1, w3, w2, N * k, E, L, F);  // gemm.stream()
//   cuda::combine_forward(y, ys, weight, sorted_pos, N, k, L, s);
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "exec/cuda/gemm.h"
#include "exec/kernels.h"

namespace rackstep::exec::cuda {

void router_forward(int32_t* expert, float* weight, float* threshold, const float* logits, const float* bias, int N,
                    int E, int k, RouterKind kind, float weight_sum, cudaStream_t stream);
void router_backward(float* dlogits, const float* dweight, const float* weight, const int32_t* expert,
                     const float* logits, int N, int E, int k, RouterKind kind, float weight_sum,
                     cudaStream_t stream);
// counts (E, n_bins) += histogram of each expert's logits (integer adds: exact in any order).
void qb_histogram(int64_t* counts, const float* logits, int N, int E, int n_bins, float lo, float hi,
                  cudaStream_t stream);
void qb_bias_from_histogram(float* bias, const int64_t* counts, int E, int k, int n_bins, float lo, float hi,
                            cudaStream_t stream);

// Router z-loss: mean over tokens of logsumexp(logits)² (waits for the stream).
// work: router_loss_work_doubles(N, E).
double router_z_loss(const float* logits, int N, int E, double* work, cudaStream_t stream);  // logits (N, E)
// dlogits (N, E) += weight · 2 lse_t softmax(logits_t) / N.
void router_z_loss_backward(float* dlogits, const float* logits, int N, int E, float weight, cudaStream_t stream);
// Auxiliary balancing loss weight · E · Σ_e f_e P_e (exec/kernels.h, aux_loss_*);
// waits for the stream. Assignment counts add exactly (integers in double), the
// per-expert probability sums walk the tokens in order: deterministic.
// Data parallelism as exec/kernels.h: with `counts` (E, on the device), the
// global batch's assignments per expert over its n_total tokens, f and the
// mean of P are the global batch's and this slice's loss is its share.
size_t router_loss_work_doubles(int N, int E);
double aux_loss_forward(const float* logits, const int32_t* expert, int N, int E, int k, RouterKind kind, float weight,
                        double* work, cudaStream_t stream, const int64_t* counts = nullptr, int64_t n_total = 0);
// dlogits (N, E) +=.
void aux_loss_backward(float* dlogits, const float* logits, const int32_t* expert, int N, int E, int k,
                       RouterKind kind, float weight, double* work, cudaStream_t stream,
                       const int64_t* counts = nullptr, int64_t n_total = 0);

// Scratch bytes group_by_expert needs for A assignments.
size_t group_by_expert_scratch_bytes(int A);
void group_by_expert(int32_t* sorted_pos, int32_t* offsets, const int32_t* expert, int A, int E, void* scratch,
                     cudaStream_t stream);

void gather_forward(float* xs, const float* x, const int32_t* sorted_pos, int N, int k, int L, cudaStream_t stream);
void gather_backward(float* dx, const float* dxs, const int32_t* sorted_pos, int N, int k, int L,
                     cudaStream_t stream);

// host_offsets: (E + 1) on the host (the per-expert GEMM sizes); keep may be nullptr;
// opt: the experts' biases and SwiGLU variant (exec/kernels.h), as on the CPU.
void experts_forward(Gemm& gemm, float* ys, float* a1, float* a3, float* h, const float* xs,
                     const int32_t* host_offsets, const uint8_t* keep, const float* w1, const float* w3,
                     const float* w2, int A, int E, int L, int F, const ExpertOptions& opt = {});
// scratch: experts_scratch_floats(A, L, F) floats on the device.
void experts_backward(Gemm& gemm, float* dxs, float* dw1, float* dw3, float* dw2, const float* dys, const float* xs,
                      const float* a1, const float* a3, const float* h, const int32_t* host_offsets,
                      const uint8_t* keep, const float* w1, const float* w3, const float* w2, float* scratch, int A,
                      int E, int L, int F, const ExpertOptions& opt = {});

// The same two, each GEMM of the per-expert loop replaced by one grouped GEMM
// over the experts (Gemm::run_grouped): 3 launches forward, 6 backward,
// instead of 3E and 6E. Same buffers and results (to GEMM rounding); which is
// faster at a shape is cuda_kernels_timing's "experts" row.
void experts_forward_grouped(Gemm& gemm, float* ys, float* a1, float* a3, float* h, const float* xs,
                             const int32_t* host_offsets, const uint8_t* keep, const float* w1, const float* w3,
                             const float* w2, int A, int E, int L, int F, const ExpertOptions& opt = {});
void experts_backward_grouped(Gemm& gemm, float* dxs, float* dw1, float* dw3, float* dw2, const float* dys,
                              const float* xs, const float* a1, const float* a3, const float* h,
                              const int32_t* host_offsets, const uint8_t* keep, const float* w1, const float* w3,
                              const float* w2, float* scratch, int A, int E, int L, int F, const ExpertOptions& opt = {});

void combine_forward(float* y, const float* ys, const float* weight, const int32_t* sorted_pos, int N, int k, int L,
                     cudaStream_t stream);
void combine_backward(float* dys, float* dweight, const float* dy, const float* ys, const float* weight,
                      const int32_t* sorted_pos, int N, int k, int L, cudaStream_t stream);

}  // namespace rackstep::exec::cuda
