// CUDA kernels for the memory-bound ops of the layer graph: SwiGLU, RMSNorm
// (with gain, and the non-parametric QK-norm form), partial RoPE and the
// residual add, forward and backward. Each is templated on the storage type
// (float: the fp32 parity mode; __nv_bfloat16: the bf16 training mode) and
// computes in fp32 through the formulas of exec/cuda/element_math.h, the same
// ones tests/exec_cuda_math.cpp proves equal to exec/cpu/ on the CPU.
// Signatures mirror exec/kernels.h (same buffers, same shapes, same gradient
// rule: parameter gradients +=, activation gradients =), plus the stream.
//
//   rmsnorm_forward<float>(y, rstd, x, gain, 1e-6f, N, d, stream);
//   RS_CUDA_CHECK(cudaGetLastError());
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "exec/kernels.h"

#include <cstddef>
#include <cstdint>

namespace rackstep::exec::cuda {

// h = silu(a1) · a3.
template <typename T>
void swiglu_forward(T* h, const T* a1, const T* a3, size_t n, cudaStream_t stream);  // (n) each
// da1 = dh · a3 · silu'(a1), da3 = dh · silu(a1); both overwritten.
template <typename T>
void swiglu_backward(T* da1, T* da3, const T* dh, const T* a1, const T* a3, size_t n,
                     cudaStream_t stream);                                           // (n) each

// GeLU (tanh form) and ReLU², as exec/kernels.h's gelu_* / relu2_*: h = act(a);
// da = dh · act'(a), overwritten.
template <typename T>
void gelu_forward(T* h, const T* a, size_t n, cudaStream_t stream);                   // (n) each
template <typename T>
void gelu_backward(T* da, const T* dh, const T* a, size_t n, cudaStream_t stream);    // (n) each
template <typename T>
void relu2_forward(T* h, const T* a, size_t n, cudaStream_t stream);                  // (n) each
template <typename T>
void relu2_backward(T* da, const T* dh, const T* a, size_t n, cudaStream_t stream);   // (n) each

// y = x rounded to bf16 (exec/cuda/bf16_math.h: nearest, ties to even), the
// bf16 mode's one cast (GEMM operands, bf16 copies of the fp32 masters).
void to_bf16(__nv_bfloat16* y, const float* x, size_t n, cudaStream_t stream);  // (n) each

// y = a + b (y may alias a or b).
template <typename T>
void residual_forward(T* y, const T* a, const T* b, size_t n, cudaStream_t stream);  // (n) each

// y = x · rstd · (gain or 1) · multiplier per row; rstd saved in fp32.
// gain == nullptr is the non-parametric QK-norm (multiplier 1.3 in Marin).
template <typename T>
void rmsnorm_forward(T* y,              // (rows, d)
                     float* rstd,       // (rows)
                     const T* x,        // (rows, d)
                     const float* gain, // (d) fp32 master gain, or nullptr
                     float multiplier, float eps, int rows, int d, cudaStream_t stream);
// dx = (overwritten); dgain += Σ_rows dy·x·rstd (fp32, deterministic: one
// block per column chunk walks the rows in order, no atomics).
template <typename T>
void rmsnorm_backward(T* dx,            // (rows, d) =
                      float* dgain,     // (d) += or nullptr
                      const T* dy,      // (rows, d)
                      const T* x,       // (rows, d)
                      const float* rstd,// (rows)
                      const float* gain,// (d) or nullptr
                      float multiplier, int rows, int d, cudaStream_t stream);

// LayerNorm with a gain and no bias (exec/kernels.h, layernorm_*): y = (x − mean)·rstd·gain.
template <typename T>
void layernorm_forward(T* y,              // (rows, d)
                       float* rstd,       // (rows) saved
                       const T* x,        // (rows, d)
                       const float* gain, // (d)
                       float eps, int rows, int d, cudaStream_t stream);
// dx =, dgain += (a thread per column walks the rows in order: deterministic).
template <typename T>
void layernorm_backward(T* dx,             // (rows, d) =, may alias dy
                        float* dgain,      // (d) +=
                        const T* dy,       // (rows, d)
                        const T* x,        // (rows, d)
                        const float* rstd, // (rows)
                        const float* gain, // (d)
                        float* row_mean,   // (rows) scratch
                        int rows, int d, cudaStream_t stream);

// Partial RoPE (NeoX pairing) over (N, heads, hd); sign +1 forward, −1 backward
// (with YaRN: its scale times Rᵀ). yarn: nullptr = plain RoPE frequencies.
template <typename T>
void rope_apply(T* y,                  // (N, heads, hd)
                const T* x,            // (N, heads, hd)
                const int32_t* pos,    // (N)
                int N, int heads, int hd, int rot_dims, float theta, float sign, cudaStream_t stream,
                const RopeYarn* yarn = nullptr);

// Causal softmax attention with sliding window, GQA (kv_used of kv_stored
// heads read), document masking, optional sinks and optional ALiBi slopes
// (device memory, models::alibi_slopes(H) as floats), as exec/kernels.h's attention_forward /
// attention_backward (same buffers and shapes; lse saved in fp32). hd ≤ 256.
// One warp per query row (forward, dq) or key row (dk, dv): exact and
// deterministic (no atomics), not yet fast — the tensor-core version is future work.
template <typename Elem>
void attention_forward(Elem* o,             // (B, T, H, hd)
                       float* lse,          // (B, H, T)
                       const Elem* q,       // (B, T, H, hd)
                       const Elem* k,       // (B, T, kv_stored, hd)
                       const Elem* v,       // (B, T, kv_stored, hd)
                       const int32_t* doc,  // (B, T) or nullptr
                       int B, int T, int H, int kv_stored, int kv_used, int hd, int window, float scale,
                       cudaStream_t stream,
                       const float* sinks = nullptr,          // (H) one logit per head in every denominator, or nullptr
                       const float* alibi_slopes = nullptr);  // (H) score_ij -= slope_h (i - j), or nullptr
// dq =; dk, dv = (or += with accumulate_dkv); heads ≥ kv_used of dk/dv get
// zero (or are left as they are). `delta` is scratch of B·H·T floats.
template <typename Elem>
void attention_backward(Elem* dq, Elem* dk, Elem* dv,  // as q, k, v
                        const Elem* dout,              // (B, T, H, hd)
                        const Elem* q, const Elem* k, const Elem* v, const Elem* o,
                        const float* lse,              // (B, H, T)
                        const int32_t* doc,            // (B, T) or nullptr
                        float* delta,                  // (B, H, T) scratch: Σ dout·o per query row
                        int B, int T, int H, int kv_stored, int kv_used, int hd, int window, float scale,
                        bool accumulate_dkv, cudaStream_t stream,
                        const float* sinks = nullptr,  // (H) or nullptr
                        float* dsinks = nullptr,       // (H) += with sinks
                        const float* alibi_slopes = nullptr);  // (H) the forward's slopes, or nullptr

// XSA (exclusive self attention): y = o − (o·v / (v·v + eps)) v per token and
// head, v the token's own value of the kv head the query head reads. fp32.
void xsa_forward(float* y,        // (N, H, hd)
                 const float* o,  // (N, H, hd)
                 const float* v,  // (N, kv_stored, hd)
                 int N, int H, int kv_stored, int kv_used, int hd, float eps, cudaStream_t stream);
// d_o =, dv += (a warp per (token, kv head) sums its group's heads in order).
void xsa_backward(float* d_o, float* dv, const float* dy, const float* o, const float* v, int N, int H, int kv_stored,
                  int kv_used, int hd, float eps, cudaStream_t stream);

// Short depthwise causal convolution, document-masked taps (exec/kernels.h). fp32.
void sconv_forward(float* y,            // (B, T, C)
                   const float* x,      // (B, T, C)
                   const float* w,      // (C, K)
                   const int32_t* doc,  // (B, T) or nullptr
                   int B, int T, int C, int K, cudaStream_t stream);
// dx =, dw += (one thread per (c, j) sums every row in order: deterministic).
void sconv_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const int32_t* doc, int B,
                    int T, int C, int K, cudaStream_t stream);

// out[t] = table[tokens[t]] (fp32 master table, T activations).
template <typename Elem>
void embedding_forward(Elem* out,              // (N, d)
                       const int32_t* tokens,  // (N), each in [0, V)
                       const float* table,     // (V, d)
                       int N, int d, cudaStream_t stream);
// Learned absolute positions (GPT-2), as exec/kernels.h's position_embedding_forward:
// out[t] += table[pos[t]] (fp32 master table). Positions are < P: the driver
// refuses a run longer than the table (exec/model.cpp). The backward is
// embedding_backward with pos in place of tokens.
template <typename Elem>
void position_embedding_forward(Elem* out,            // (N, d) +=
                                const int32_t* pos,   // (N), each in [0, P)
                                const float* table,   // (P, d)
                                int N, int d, cudaStream_t stream);
// dtable[tokens[t]] += dout[t]; deterministic: a thread per column walks the
// tokens in order (as the CPU kernel's threads do), no atomics.
template <typename Elem>
void embedding_backward(float* dtable,          // (V, d) +=
                        const Elem* dout,       // (N, d)
                        const int32_t* tokens,  // (N)
                        int N, int d, cudaStream_t stream);

// Column slicing of row-major tensors (exec/model.cpp's MLA plumbing): y (rows, wy)
// gets the first min(wx, wy) columns of x (rows, wx), zeros after; with
// accumulate, the common columns are added and the rest left alone.
void copy_columns(float* y, int64_t wy, const float* x, int64_t wx, int64_t rows, bool accumulate,
                  cudaStream_t stream);
// MLA key: k (N, H, hd + r) = [k_nope (N, H, hd) | k_rope (N, r) for every head].
void assemble_key(float* k, const float* k_nope, const float* k_rope, int64_t N, int64_t H, int64_t hd, int64_t r,
                  cudaStream_t stream);
// Its backward: dk_nope = dk[..., :hd] (= or +=), dk_rope = Σ_h dk[..., hd:] (= or +=; heads in order).
void split_key_grad(float* dk_nope, bool acc_nope, float* dk_rope, bool acc_rope, const float* dk, int64_t N,
                    int64_t H, int64_t hd, int64_t r, cudaStream_t stream);
// dst += src.
void add_inplace(float* dst, const float* src, size_t n, cudaStream_t stream);  // (n) each
// Whether every element is finite (waits for the stream). The NaN localisation check.
bool all_finite(const float* x, size_t n, cudaStream_t stream);                 // (n)

// Cross-entropy with logit z-loss over a chunk of tokens, as exec/kernels.h's
// cross_entropy_forward (the chunk's shares of the batch means; waits for the
// stream to return them). row_terms is scratch of 2·N doubles.
struct CrossEntropySums {
  double ce = 0, z_loss = 0;
};
template <typename Elem>
CrossEntropySums cross_entropy_forward(float* lse,               // (N)
                                       double* row_terms,        // (2, N) scratch
                                       const Elem* logits,       // (N, V)
                                       const int32_t* targets,   // (N), < 0 ignored
                                       int N, int V, float z_weight, int64_t n_total, cudaStream_t stream);
// dlogits = (softmax − onehot + 2 z_weight lse softmax) / n_total; rows of
// ignored targets zero. dlogits may alias logits.
template <typename Elem>
void cross_entropy_backward(Elem* dlogits,            // (N, V) =
                            const Elem* logits,       // (N, V)
                            const float* lse,         // (N)
                            const int32_t* targets,   // (N)
                            int N, int V, float z_weight, int64_t n_total, cudaStream_t stream);

}  // namespace rackstep::exec::cuda
