// CPU kernels for every op of the Marin layer graph: forward and backward, fp32.
//
// This is the op set the training loop strings together (llm.c style: the
// loop calls these passes explicitly, layer by layer). Each op is one plain
// function pair over row-major float buffers; the caller owns every buffer
// (activation arena, parameter arena, scratch). GEMMs go through OpenBLAS
// (cblas_sgemm), everything else through OpenMP. Results are deterministic for
// a fixed OpenMP/OpenBLAS thread count: every reduction runs in a fixed order
// (per-thread partial sums over static row chunks, then summed in thread
// order), never with atomics. OpenMP regions alternate with OpenBLAS's own
// pthreads; run with OMP_WAIT_POLICY=passive so idle OpenMP threads do not
// spin against the GEMM threads (measured on a loaded 2-core box: attention
// ran 3-4x slower without it).
//
// GRADIENT RULE (kept by every backward below):
//   * parameter gradients   +=  (they accumulate across micro-batches)
//   * activation gradients  =   (overwritten), unless the call takes an
//                               `accumulate_*` flag: an activation that fans
//                               out to several consumers (x feeds Q, K, V, the
//                               gate and the router; v feeds attention and XSA)
//                               passes true on every consumer after the first.
//   * the residual stream   +=  (residual_backward adds into both inputs).
//
// Shapes: N = tokens in the micro-batch (B*T), d = model width, H = query
// heads, hd = head dim, E = experts, k = experts per token, A = N*k
// assignments, L = latent width, F = expert FFN width, V = vocab.
//
// Usage (one local-attention sub-block, forward; each output is its own
// buffer because the backward reads the inputs again):
//   rmsnorm_forward(xn, rstd, x, gain, 1e-6f, N, d);
//   linear_forward(q_raw, xn, wq, nullptr, N, d, H * hd);
//   rmsnorm_noparam_forward(q_n, q_rstd, q_raw, 1.3f, 1e-6f, N * H, hd);  // QK-norm
//   rope_forward(q, q_n, pos, N, H, hd, hd / 2, 10000.f);                 // partial RoPE
//   ... the same for k (kv_stored heads) and v ...
//   attention_forward(o, lse, q, k, v, doc, B, T, H, kv_stored, kv_used, hd,
//                     window, 1.f / std::sqrt(float(hd)));
//   xsa_forward(o_x, o, v, N, H, kv_stored, kv_used, hd, 1e-6f);
//   attn_gate_forward(o_g, g, o_x, xn, w_gate, N, d, H, hd);
//   linear_forward(attn_out, o_g, wo, nullptr, N, H * hd, d);
//   residual_forward(x_next, x, attn_out, size_t(N) * d);
#pragma once

#include <cstddef>
#include <cstdint>

namespace rackstep::exec {

// ---------------------------------------------------------------------------
// matmul.cpp: linear layers through cblas_sgemm.

// y = x·W (+ bias).
void linear_forward(float* y,           // (N, out)
                    const float* x,     // (N, in)
                    const float* w,     // (in, out)
                    const float* bias,  // (out) or nullptr
                    int N, int in, int out);
// dx = dy·Wᵀ (or += when accumulate_dx), dW += xᵀ·dy, dbias += Σ_rows dy.
void linear_backward(float* dx,          // (N, in) or nullptr to skip
                     float* dw,          // (in, out) +=
                     float* dbias,       // (out) += or nullptr
                     const float* dy,    // (N, out)
                     const float* x,     // (N, in)
                     const float* w,     // (in, out)
                     int N, int in, int out, bool accumulate_dx = false);

// Tied LM head: y = x·Wᵀ with W stored (out, in) (the embedding table, (V, d)).
void linear_t_forward(float* y,        // (N, out)
                      const float* x,  // (N, in)
                      const float* w,  // (out, in)
                      int N, int in, int out);
// dx = dy·W (or += when accumulate_dx), dW += dyᵀ·x.
void linear_t_backward(float* dx,        // (N, in) or nullptr to skip
                       float* dw,        // (out, in) +=
                       const float* dy,  // (N, out)
                       const float* x,   // (N, in)
                       const float* w,   // (out, in)
                       int N, int in, int out, bool accumulate_dx = false);

// The machine's measured sgemm rate (FLOP/s), the peak CPU MFU is quoted
// against: square n x n x n products, repeated for at least min_seconds after
// one warm-up, best repetition wins. Same GEMM path as linear_forward.
double measure_sgemm_flops_per_s(int n = 1024, double min_seconds = 0.5);

// ---------------------------------------------------------------------------
// activations.cpp: residual stream and elementwise helpers.

// y = a + b (y may alias a or b).
void residual_forward(float* y, const float* a, const float* b, size_t n);  // (n) each
// da += dy, db += dy: the residual stream accumulates.
void residual_backward(float* da, float* db, const float* dy, size_t n);    // (n) each
// dst += src.
void add_inplace(float* dst, const float* src, size_t n);                   // (n) each
// Index of the first NaN/Inf in x, or n when all are finite (the training
// loop's "which op produced the first NaN" check).
size_t first_nonfinite(const float* x, size_t n);                           // (n)
// h = silu(a1) * a3 (SwiGLU inner product, Shazeer 2020 "GLU variants").
void swiglu_forward(float* h, const float* a1, const float* a3, size_t n);  // (n) each
// da1 = dh * a3 * silu'(a1), da3 = dh * silu(a1); both overwritten.
void swiglu_backward(float* da1, float* da3, const float* dh, const float* a1,
                     const float* a3, size_t n);                            // (n) each

// The routed experts' SwiGLU variant (models::MoeConfig swiglu_*; gpt-oss):
//   g = min(a1, limit), u = clamp(a3, -limit, limit)   (limit 0: no clamp)
//   h = g σ(alpha g) (u + linear_offset)
// gpt-oss: alpha 1.702, limit 7, offset 1 (openai/gpt-oss gpt_oss/torch/model.py
// `swiglu`: x_glu.clamp(max=limit), x_linear.clamp(-limit, limit),
// x_glu * sigmoid(alpha * x_glu) * (x_linear + 1); HF transformers
// GptOssExperts the same). A clamp passes the gradient where its input is inside
// the closed range and nothing outside (torch.clamp's backward). alpha 1,
// limit 0, offset 0 is the plain SwiGLU above.
struct SwiGluVariant {
  float alpha = 1.0f;
  float limit = 0.0f;          // 0 = no clamp
  float linear_offset = 0.0f;
  bool plain() const { return alpha == 1.0f && limit == 0.0f && linear_offset == 0.0f; }
};
void swiglu_variant_forward(float* h, const float* a1, const float* a3, size_t n,
                            const SwiGluVariant& v);                           // (n) each
// da1 = dh (u + offset) d[g σ(αg)]/dg [a1 <= limit], da3 = dh g σ(αg) [|a3| <= limit]; overwritten.
void swiglu_variant_backward(float* da1, float* da3, const float* dh, const float* a1,
                             const float* a3, size_t n, const SwiGluVariant& v);  // (n) each

// GeLU, tanh approximation (Hendrycks & Gimpel 2016, as GPT-2 and llm.c):
// h = 0.5 a (1 + tanh(√(2/π) (a + 0.044715 a³))).
void gelu_forward(float* h, const float* a, size_t n);                      // (n) each
// da = dh * gelu'(a), overwritten.
void gelu_backward(float* da, const float* dh, const float* a, size_t n);   // (n) each
// ReLU² (So et al. 2021, "Primer"): h = max(a, 0)².
void relu2_forward(float* h, const float* a, size_t n);                     // (n) each
// da = dh * 2 max(a, 0), overwritten.
void relu2_backward(float* da, const float* dh, const float* a, size_t n);  // (n) each

// ---------------------------------------------------------------------------
// embedding.cpp

// out[t] = table[tokens[t]].
void embedding_forward(float* out,             // (N, d)
                       const int32_t* tokens,  // (N), each in [0, V)
                       const float* table,     // (V, d)
                       int N, int d, int V);
// dtable[tokens[t]] += dout[t] (scatter-add; deterministic: threads own
// column ranges and walk the tokens in order).
void embedding_backward(float* dtable,          // (V, d) +=
                        const float* dout,      // (N, d)
                        const int32_t* tokens,  // (N)
                        int N, int d, int V);

// Learned absolute positions (GPT-2): out[t] += table[pos[t]]. The backward
// is embedding_backward(dtable, dout, pos, N, d, P).
void position_embedding_forward(float* out,           // (N, d) +=
                                const int32_t* pos,   // (N), each in [0, P)
                                const float* table,   // (P, d)
                                int N, int d, int P);

// ---------------------------------------------------------------------------
// norm.cpp

// RMSNorm with learnable gain (Zhang & Sennrich 2019):
// y = x / sqrt(mean(x²) + eps) * gain. y may alias x.
void rmsnorm_forward(float* y,           // (N, d)
                     float* rstd,        // (N) saved: 1/sqrt(mean(x²)+eps)
                     const float* x,     // (N, d)
                     const float* gain,  // (d)
                     float eps, int N, int d);
void rmsnorm_backward(float* dx,          // (N, d) =
                      float* dgain,       // (d) +=
                      const float* dy,    // (N, d)
                      const float* x,     // (N, d)
                      const float* rstd,  // (N)
                      const float* gain,  // (d)
                      int N, int d);

// LayerNorm with a gain and no bias (NormKind::kLayerNorm; the layer graph
// declares one gain per norm): y = (x - mean) · rstd · gain, rstd = (var + eps)^-1/2.
void layernorm_forward(float* y,           // (N, d)
                       float* rstd,        // (N) saved
                       const float* x,     // (N, d)
                       const float* gain,  // (d)
                       float eps, int N, int d);
void layernorm_backward(float* dx,          // (N, d) =
                        float* dgain,       // (d) +=
                        const float* dy,    // (N, d)
                        const float* x,     // (N, d)
                        const float* rstd,  // (N)
                        const float* gain,  // (d)
                        int N, int d);

// Non-parametric RMSNorm followed by a fixed multiplier (the QK-norm of the
// spec: multiplier 1.3). Rows are whatever the caller normalises: for QK-norm
// pass N*H rows of width hd. y may alias x.
void rmsnorm_noparam_forward(float* y,        // (rows, d)
                             float* rstd,     // (rows) saved
                             const float* x,  // (rows, d)
                             float multiplier, float eps, int rows, int d);
void rmsnorm_noparam_backward(float* dx,          // (rows, d) =
                              const float* dy,    // (rows, d)
                              const float* x,     // (rows, d)
                              const float* rstd,  // (rows)
                              float multiplier, int rows, int d);

// Gated norm (spec, "norms"): y = x * sigmoid(silu(x·W_down)·W_up).
// Forward saves a = x·W_down and g = sigmoid(silu(a)·W_up).
void gated_norm_forward(float* y,             // (N, d)
                        float* a,             // (N, r) saved
                        float* g,             // (N, d) saved
                        const float* x,       // (N, d)
                        const float* w_down,  // (d, r)
                        const float* w_up,    // (r, d)
                        int N, int d, int r);
size_t gated_norm_scratch_floats(int N, int d, int r);  // N*d + 2*N*r
void gated_norm_backward(float* dx,             // (N, d) =
                         float* dw_down,        // (d, r) +=
                         float* dw_up,          // (r, d) +=
                         const float* dy,       // (N, d)
                         const float* x,        // (N, d)
                         const float* a,        // (N, r)
                         const float* g,        // (N, d)
                         const float* w_down,   // (d, r)
                         const float* w_up,     // (r, d)
                         float* scratch,        // (gated_norm_scratch_floats)
                         int N, int d, int r);

// ---------------------------------------------------------------------------
// rope.cpp: partial rotary position embedding (Su et al. 2021, RoFormer),
// GPT-NeoX "rotate half" pairing inside the rotated part: for i < rot_dims/2,
// (x[i], x[i + rot_dims/2]) rotates by angle pos * theta^(-2i/rot_dims).
// Dims [rot_dims, hd) pass through unchanged; rot_dims = 0 is NoPE (identity).
// Rows are tokens; each token has `heads` heads of width hd. y may alias x.
// yarn (nullptr = plain RoPE): YaRN's frequencies and cos/sin scale, as
// models::YarnConfig describes them (HF transformers _compute_yarn_parameters).
struct RopeYarn {
  double factor = 1.0;                // s
  double original_positions = 0.0;    // L, the context before extension
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;               // floor/ceil the ramp's ends
};
void rope_forward(float* y,            // (N, heads, hd)
                  const float* x,      // (N, heads, hd)
                  const int32_t* pos,  // (N) position of each token
                  int N, int heads, int hd, int rot_dims, float theta, const RopeYarn* yarn = nullptr);
// dx = Rᵀ·dy (the inverse rotation; with YaRN, its scale times Rᵀ). dx may alias dy.
void rope_backward(float* dx,           // (N, heads, hd) =
                   const float* dy,     // (N, heads, hd)
                   const int32_t* pos,  // (N)
                   int N, int heads, int hd, int rot_dims, float theta, const RopeYarn* yarn = nullptr);

// ---------------------------------------------------------------------------
// attention.cpp: causal softmax attention, sliding window, GQA, doc masking.

// Optional parts of the attention score and softmax (each nullptr = absent):
//   ALiBi (Press et al. 2022): logit_ij -= slope_h (i - j), i, j the query's
//     and key's positions in the sequence;
//   sinks (gpt-oss): a learnable logit s_h per query head joins every row's
//     softmax denominator, p_ij = exp(l_ij) / (exp(s_h) + Σ_j exp(l_ij)),
//     and the saved lse includes it. Its gradient (backward):
//     ∂L/∂s_h = -Σ_rows exp(s_h - lse_i) (dO_i·O_i).
struct AttentionExtras {
  const float* alibi_slopes = nullptr;  // (H)
  const float* sinks = nullptr;         // (H)
  float* dsinks = nullptr;              // (H) += (backward, with sinks)
};
//
// Key j is visible to query i (same sequence) iff j <= i, and i - window < j
// when window > 0 (window = 0: full causal), and doc[j] == doc[i] when doc is
// given (queries attend only within their document). Query head h reads kv
// head h / (H / kv_used); k and v store kv_stored heads of which the first
// kv_used are read (global layers use the first n of the stored KV heads).
// logits = scale * q·k; scale is the caller's (1/sqrt(hd) by default; the
// spec applies the QK-norm multiplier to q and k, not to the scale).
// Forward saves lse (logsumexp of each query row) for an exact backward.
void attention_forward(float* o,              // (B, T, H, hd)
                       float* lse,            // (B, H, T) saved
                       const float* q,        // (B, T, H, hd)
                       const float* k,        // (B, T, kv_stored, hd)
                       const float* v,        // (B, T, kv_stored, hd)
                       const int32_t* doc,    // (B, T) document id per token, or nullptr
                       int B, int T, int H, int kv_stored, int kv_used, int hd,
                       int window, float scale, const AttentionExtras& extras = {});
// dq =; dk, dv = (or += with accumulate_dkv). Heads >= kv_used of dk/dv get
// zero (or are left as they are with accumulate_dkv).
// Query tiles through sgemm (OpenBLAS threads), masked softmax row-parallel;
// tiles run in a fixed order, so dk/dv sums are the same on every run.
void attention_backward(float* dq,             // (B, T, H, hd)
                        float* dk,             // (B, T, kv_stored, hd)
                        float* dv,             // (B, T, kv_stored, hd)
                        const float* dout,     // (B, T, H, hd)
                        const float* q,        // (B, T, H, hd)
                        const float* k,        // (B, T, kv_stored, hd)
                        const float* v,        // (B, T, kv_stored, hd)
                        const float* o,        // (B, T, H, hd) forward output
                        const float* lse,      // (B, H, T)
                        const int32_t* doc,    // (B, T) or nullptr
                        int B, int T, int H, int kv_stored, int kv_used, int hd,
                        int window, float scale, bool accumulate_dkv = false,
                        const AttentionExtras& extras = {});

// XSA, exclusive self attention (spec): per token and head,
// y = o - (o·v / (v·v + eps)) v with v the token's own value vector of the kv
// head the query head reads. Afterwards y·v ≈ 0. y may not alias o.
void xsa_forward(float* y,          // (N, H, hd)
                 const float* o,    // (N, H, hd)
                 const float* v,    // (N, kv_stored, hd)
                 int N, int H, int kv_stored, int kv_used, int hd, float eps);
// do =, dv += (v also feeds attention: call xsa_backward first, then
// attention_backward with accumulate_dkv = true — or zero dv yourself).
void xsa_backward(float* d_o,         // (N, H, hd) =
                  float* dv,          // (N, kv_stored, hd) +=
                  const float* dy,    // (N, H, hd)
                  const float* o,     // (N, H, hd)
                  const float* v,     // (N, kv_stored, hd)
                  int N, int H, int kv_stored, int kv_used, int hd, float eps);

// Per-head attention gate (spec, "gated attention"): g = 2*sigmoid(x·W_gate),
// y[n, h, :] = g[n, h] * o[n, h, :]. Forward saves g; keep o for backward.
void attn_gate_forward(float* y,             // (N, H, hd)
                       float* g,             // (N, H) saved
                       const float* o,       // (N, H, hd)
                       const float* x,       // (N, d)
                       const float* w_gate,  // (d, H)
                       int N, int d, int H, int hd);
// d_o =, dx = (or += with accumulate_dx), dW_gate +=.
void attn_gate_backward(float* d_o,           // (N, H, hd) =
                        float* dx,            // (N, d)
                        float* dw_gate,       // (d, H) +=
                        const float* dy,      // (N, H, hd)
                        const float* o,       // (N, H, hd)
                        const float* x,       // (N, d)
                        const float* g,       // (N, H)
                        const float* w_gate,  // (d, H)
                        float* scratch,       // (N, H)
                        int N, int d, int H, int hd, bool accumulate_dx = false);

// ---------------------------------------------------------------------------
// sconv.cpp: short depthwise causal convolution (spec, "short conv").
// y[b,t,c] = Σ_{j<K} w[c,j] * x[b, t-(K-1-j), c], a tap counting only when
// t-(K-1-j) >= 0 and, when doc is given, doc[b, t-(K-1-j)] == doc[b, t].
// Tap K-1 is the current token: w[c, K-1] = 1, others 0 is the identity init.
void sconv_forward(float* y,            // (B, T, C)
                   const float* x,      // (B, T, C)
                   const float* w,      // (C, K)
                   const int32_t* doc,  // (B, T) or nullptr
                   int B, int T, int C, int K);
void sconv_init_identity(float* w, int C, int K);  // (C, K)
void sconv_backward(float* dx,           // (B, T, C) =
                    float* dw,           // (C, K) +=
                    const float* dy,     // (B, T, C)
                    const float* x,      // (B, T, C)
                    const float* w,      // (C, K)
                    const int32_t* doc,  // (B, T) or nullptr
                    int B, int T, int C, int K);

// ---------------------------------------------------------------------------
// moe.cpp: router, quantile balancing, grouped experts, combine.
//
// Assignment a = t*k + j is token t's j-th choice (token-major). The grouped
// ("sorted") buffer holds the assignments expert by expert; sorted_pos[a] is
// a's row there and offsets[e]..offsets[e+1] are expert e's rows.

enum class RouterKind { kSigmoid, kSoftmax };

// Router logits = x·W_router: use linear_forward(logits, x, w_router, nullptr, N, d, E).
//
// Selection (spec, "router"): rank experts by the biased score logits + bias,
// keep the top k (ties to the lower expert id); threshold[t] is the (k+1)-th
// biased score (-inf when k == E). Combine weights come from the unbiased
// logits of the chosen k, renormalised to sum to weight_sum:
//   sigmoid: w_j = weight_sum * σ(l_j) / Σ_chosen σ(l_m)
//   softmax: w_j = weight_sum * exp(l_j) / Σ_chosen exp(l_m)  (= renormalised softmax)
void router_forward(int32_t* expert,      // (N, k) chosen expert ids, best first
                    float* weight,        // (N, k) combine weights
                    float* threshold,     // (N) (k+1)-th biased score
                    const float* logits,  // (N, E)
                    const float* bias,    // (E) selection bias, or nullptr
                    int N, int E, int k, RouterKind kind, float weight_sum);
// dlogits = ∂loss/∂logits through the combine weights (the selection itself
// has no gradient); zero for unchosen experts. Then
// linear_backward(dx, dw_router, nullptr, dlogits, x, w_router, N, d, E, true).
void router_backward(float* dlogits,         // (N, E) =
                     const float* dweight,   // (N, k)
                     const float* weight,    // (N, k)
                     const int32_t* expert,  // (N, k)
                     const float* logits,    // (N, E)
                     int N, int E, int k, RouterKind kind, float weight_sum);
// Router z-loss, mean over tokens of logsumexp(logits)² (logged; applied when
// the model says router_z_loss_applied).
double router_z_loss(const float* logits, int N, int E);  // (N, E)
// d(weight · router_z_loss)/d logits = weight · 2 lse_t softmax(logits_t) / N.
void router_z_loss_backward(float* dlogits,       // (N, E) +=
                            const float* logits,  // (N, E)
                            int N, int E, float weight);

// Auxiliary balancing loss (Switch Transformer, Fedus et al. 2021, eq. 4; with
// top-k as DeepSeek-V3 §2.1.2 writes it): weight · E · Σ_e f_e P_e, where
// f_e = (assignments to e) / (N k) and P_e = mean over tokens of the router's
// probability of e: softmax(logits) for a softmax router, the normalised
// affinity σ(l_e) / Σ_j σ(l_j) for a sigmoid one. f is a count (no gradient).
// Data parallelism: with `counts` (E), the global batch's assignments per
// expert over its n_total tokens, f and the mean of P are the global batch's,
// so this slice's loss and gradient are its share (they add up over ranks).
double aux_loss_forward(const float* logits,    // (N, E)
                        const int32_t* expert,  // (N, k)
                        int N, int E, int k, RouterKind kind, float weight,
                        const int64_t* counts = nullptr, int64_t n_total = 0);
void aux_loss_backward(float* dlogits,          // (N, E) +=
                       const float* logits,     // (N, E)
                       const int32_t* expert,   // (N, k)
                       int N, int E, int k, RouterKind kind, float weight,
                       const int64_t* counts = nullptr, int64_t n_total = 0);

// Quantile balancing (QB), the selection bias for the next step.
// Algorithm (ours, documented here): a balanced router gives each expert
// N*k/E of the N*k assignments, i.e. expert e should be chosen by a fraction
// p = k/E of the tokens. If bias_e = -q_e, where q_e is the (1-p)-quantile of
// expert e's unbiased logits over the step's tokens, then the biased score of
// expert e is > 0 for exactly a fraction p of tokens, so each expert crosses
// the common level 0 equally often and top-k on biased scores is balanced to
// first order. The quantile comes from a histogram of each expert's logits
// (n_bins bins over the fixed range [lo, hi], values outside clamp into the
// edge bins; linear interpolation inside the bin). Histograms add up, so
// data-parallel ranks sum their counts (MPI_Allreduce) before the bias step.
// State: the counts of the previous step (in) and the bias (out).
void qb_histogram(int64_t* counts,       // (E, n_bins) +=
                  const float* logits,   // (N, E)
                  int N, int E, int n_bins, float lo, float hi);
// bias[e] = -quantile_e(1 - k/E), from counts.
void qb_bias_from_histogram(float* bias,            // (E) =
                            const int64_t* counts,  // (E, n_bins)
                            int E, int k, int n_bins, float lo, float hi);

// Group assignments by expert (stable counting sort: within an expert, rows
// stay in token order). The dispatch library may produce its own grouping.
void moe_group_by_expert(int32_t* sorted_pos,    // (A) row of assignment a
                         int32_t* offsets,       // (E + 1)
                         const int32_t* expert,  // (A) = (N, k)
                         int A, int E);
// xs[sorted_pos[a]] = x[a / k].
void moe_gather_forward(float* xs,                 // (A, L)
                        const float* x,            // (N, L)
                        const int32_t* sorted_pos, // (A)
                        int N, int k, int L);
// dx[t] = Σ_j dxs[sorted_pos[t*k + j]].
void moe_gather_backward(float* dx,                 // (N, L) =
                         const float* dxs,          // (A, L)
                         const int32_t* sorted_pos, // (A)
                         int N, int k, int L);

// Routed experts: grouped SwiGLU in the latent width, per expert e over its
// rows: a1 = xs·W1[e] (+ b1[e]), a3 = xs·W3[e] (+ b3[e]), h = silu(a1)*a3 (or
// the variant of ExpertOptions::act), ys = h·W2[e] (+ b2[e]).
// keep[row] == 0 marks a dropped assignment (the dispatch library decides):
// its ys row is 0 and it contributes no gradient. keep == nullptr keeps all.
//
// ExpertOptions: the experts' own variant (gpt-oss, models::MoeConfig
// expert_bias / swiglu_*): per-expert biases on W1, W3 (E, F) and W2 (E, L)
// (HF GptOssExperts: gate_up_proj_bias, down_proj_bias, added before the
// clamp and before the routing weight), and the SwiGLU variant. The default
// is the plain, bias-free expert; the bias gradients (+=) are the column sums
// of each expert's rows' gradients (backward only; nullptr = no bias).
struct ExpertOptions {
  SwiGluVariant act;
  const float* b1 = nullptr;  // (E, F) or nullptr
  const float* b3 = nullptr;  // (E, F) or nullptr
  const float* b2 = nullptr;  // (E, L) or nullptr
  float* db1 = nullptr;       // (E, F) += (backward)
  float* db3 = nullptr;       // (E, F) +=
  float* db2 = nullptr;       // (E, L) +=
};
void experts_forward(float* ys,             // (A, L)
                     float* a1,             // (A, F) saved
                     float* a3,             // (A, F) saved
                     float* h,              // (A, F) saved
                     const float* xs,       // (A, L) grouped by expert
                     const int32_t* offsets,// (E + 1)
                     const uint8_t* keep,   // (A) in grouped order, or nullptr
                     const float* w1,       // (E, L, F)
                     const float* w3,       // (E, L, F)
                     const float* w2,       // (E, F, L)
                     int A, int E, int L, int F, const ExpertOptions& opt = {});
size_t experts_scratch_floats(int A, int L, int F);  // A*L + 3*A*F
void experts_backward(float* dxs,            // (A, L) =
                      float* dw1,            // (E, L, F) +=
                      float* dw3,            // (E, L, F) +=
                      float* dw2,            // (E, F, L) +=
                      const float* dys,      // (A, L)
                      const float* xs,       // (A, L)
                      const float* a1,       // (A, F)
                      const float* a3,       // (A, F)
                      const float* h,        // (A, F)
                      const int32_t* offsets,// (E + 1)
                      const uint8_t* keep,   // (A) or nullptr
                      const float* w1,       // (E, L, F)
                      const float* w3,       // (E, L, F)
                      const float* w2,       // (E, F, L)
                      float* scratch,        // (experts_scratch_floats)
                      int A, int E, int L, int F, const ExpertOptions& opt = {});

// Combine: y[t] = Σ_j weight[t,j] * ys[sorted_pos[t*k + j]].
void moe_combine_forward(float* y,                  // (N, L)
                         const float* ys,           // (A, L)
                         const float* weight,       // (N, k)
                         const int32_t* sorted_pos, // (A)
                         int N, int k, int L);
// dys = (weight * dy) at each row, dweight = dy·ys; both overwritten.
void moe_combine_backward(float* dys,                // (A, L) =
                          float* dweight,            // (N, k) =
                          const float* dy,           // (N, L)
                          const float* ys,           // (A, L)
                          const float* weight,       // (N, k)
                          const int32_t* sorted_pos, // (A)
                          int N, int k, int L);

// Shared experts / any dense SwiGLU: y = (silu(x·W1) * (x·W3))·W2. Several
// shared experts summed equal one SwiGLU with their widths concatenated.
void dense_swiglu_forward(float* y,         // (N, d)
                          float* a1,        // (N, F) saved
                          float* a3,        // (N, F) saved
                          float* h,         // (N, F) saved
                          const float* x,   // (N, d)
                          const float* w1,  // (d, F)
                          const float* w3,  // (d, F)
                          const float* w2,  // (F, d)
                          int N, int d, int F);
void dense_swiglu_backward(float* dx,          // (N, d) = (or += with accumulate_dx)
                           float* dw1,         // (d, F) +=
                           float* dw3,         // (d, F) +=
                           float* dw2,         // (F, d) +=
                           const float* dy,    // (N, d)
                           const float* x,     // (N, d)
                           const float* a1,    // (N, F)
                           const float* a3,    // (N, F)
                           const float* h,     // (N, F)
                           const float* w1,    // (d, F)
                           const float* w3,    // (d, F)
                           const float* w2,    // (F, d)
                           float* scratch,     // (3 * N * F)
                           int N, int d, int F, bool accumulate_dx = false);

// Any dense MLP (dense layers, shared experts) with optional biases:
//   SwiGLU:       a1 = x·W1 + b1, a3 = x·W3 + b3, h = silu(a1) * a3
//   GeLU / ReLU²: a1 = x·W1 + b1, h = act(a1)           (W3, b3, a3 unused)
//   y = h·W2 + b2.
// With kSwiGlu and no biases this is dense_swiglu_forward / _backward, op for op.
enum class MlpActivation { kSwiGlu, kGelu, kRelu2 };
struct MlpWeights {
  const float* w1 = nullptr;  // (d, F)
  const float* w3 = nullptr;  // (d, F) SwiGLU only
  const float* w2 = nullptr;  // (F, d)
  const float* b1 = nullptr;  // (F) or nullptr
  const float* b3 = nullptr;  // (F) or nullptr
  const float* b2 = nullptr;  // (d) or nullptr
};
struct MlpGrads {             // each += ; a bias's gradient nullptr when it has none
  float* dw1 = nullptr;
  float* dw3 = nullptr;
  float* dw2 = nullptr;
  float* db1 = nullptr;
  float* db3 = nullptr;
  float* db2 = nullptr;
};
void dense_mlp_forward(float* y,         // (N, d)
                       float* a1,        // (N, F) saved
                       float* a3,        // (N, F) saved (SwiGLU), else unused / nullptr
                       float* h,         // (N, F) saved
                       const float* x,   // (N, d)
                       const MlpWeights& w, MlpActivation act, int N, int d, int F);
size_t dense_mlp_scratch_floats(int N, int F);  // 3 * N * F
void dense_mlp_backward(float* dx,          // (N, d) = (or += with accumulate_dx)
                        const MlpGrads& g,
                        const float* dy,    // (N, d)
                        const float* x,     // (N, d)
                        const float* a1,    // (N, F)
                        const float* a3,    // (N, F) SwiGLU only
                        const float* h,     // (N, F)
                        const MlpWeights& w, MlpActivation act,
                        float* scratch,     // (dense_mlp_scratch_floats)
                        int N, int d, int F, bool accumulate_dx = false);

// ---------------------------------------------------------------------------
// loss.cpp: cross-entropy with logit z-loss (spec, "output").
// loss = mean_t [ lse_t - logits[t, target_t] ] + z_weight * mean_t lse_t²,
// over tokens with target >= 0 (target < 0 is ignored). Memory-lean: call it
// on chunks of tokens (the LM head for a chunk, then its loss, then its
// dlogits in place), passing the whole batch's counted tokens as n_total so
// the chunks' results add up to the batch mean.
struct CrossEntropyResult {
  double ce = 0;      // this chunk's share of mean cross-entropy
  double z_loss = 0;  // this chunk's share of z_weight * mean lse²
};
CrossEntropyResult cross_entropy_forward(float* lse,              // (N) saved
                                         const float* logits,     // (N, V)
                                         const int32_t* targets,  // (N), < 0 ignored
                                         int N, int V, float z_weight, int64_t n_total);
// dlogits = (softmax - onehot + 2 z_weight lse softmax) / n_total; zero rows for
// ignored targets. dlogits may alias logits.
void cross_entropy_backward(float* dlogits,          // (N, V) =
                            const float* logits,     // (N, V)
                            const float* lse,        // (N)
                            const int32_t* targets,  // (N)
                            int N, int V, float z_weight, int64_t n_total);

}  // namespace rackstep::exec
