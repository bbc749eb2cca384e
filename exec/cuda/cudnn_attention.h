// Attention forward and backward through cuDNN's fused SDPA (cuDNN 9's graph
// API through the cudnn-frontend headers), for the bf16 mode: the backend's
// fp32 q, k, v (and dO, O) are rounded to bf16 copies, cuDNN runs on those
// with fp32 softmax and accumulation, and its bf16 outputs come back as fp32
// ("=" or "+=" as the own kernel writes them). Layouts are the own kernel's
// (exec/cuda/ops.h attention_forward): q, o (B, T, H, hd), k, v (B, T,
// kv_stored, hd) of which kv_used heads are read, lse (B, H, T). Packed documents
// (SdpaShape::doc_mask) run as cuDNN's ragged segments (sdpa_support.h), the
// table from set_documents; the lse saved is (B, H, T) then too.
//
// Which calls it takes: sdpa_refusal (exec/cuda/sdpa_support.h), then cuDNN's
// own checks when a shape's graph is first built. One graph per shape and
// direction, built once and cached; a shape cuDNN refuses is remembered as
// refused (one logged line) and the caller runs its own kernel. Every call
// returns false, having written nothing, when it does not take the attention.
//
//   std::unique_ptr<CudnnAttention> sdpa = make_cudnn_attention(stream);   // nullptr without cuDNN
//   if (!sdpa || !sdpa->forward(shape, o, lse, q, k, v, workspace)) attention_forward<float>(...);
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "exec/cuda/sdpa_support.h"

namespace rackstep::exec::cuda {

// Device bytes for one call (the backend's scratch allocator, in stream order).
using SdpaWorkspace = std::function<void*(size_t bytes)>;

class CudnnAttention {
 public:
  virtual ~CudnnAttention() = default;
  // cudnnGetVersion() of the library loaded.
  virtual int64_t version() const = 0;
  // o (B, T, H, hd) = softmax(scale·q·kᵀ + mask)·v, lse (B, H, T); fp32 in and out.
  virtual bool forward(const SdpaShape& s, float* o, float* lse, const float* q, const float* k, const float* v,
                       const SdpaWorkspace& workspace) = 0;
  // dq "=", dk and dv "=" (accumulate_dkv: "+=", the unread kv heads untouched) from the forward's o and lse.
  virtual bool backward(const SdpaShape& s, float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* o, const float* lse, bool accumulate_dkv,
                        const SdpaWorkspace& workspace) = 0;
  // The same on bf16 tensors (o, dq, dk, dv written "=", the unread kv heads' dk/dv untouched; lse fp32):
  // the kernels alone, without the casts (bench/cuda/kernels_timing.cpp); `workspace` is cuDNN's only.
  // No packed documents here (false).
  virtual bool forward_bf16(const SdpaShape& s, __nv_bfloat16* o, float* lse, const __nv_bfloat16* q,
                            const __nv_bfloat16* k, const __nv_bfloat16* v, const SdpaWorkspace& workspace) = 0;
  virtual bool backward_bf16(const SdpaShape& s, __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                             const __nv_bfloat16* dout, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const __nv_bfloat16* o, const float* lse,
                             const SdpaWorkspace& workspace) = 0;
  // The batch's document ids (exec/backend.h Backend::set_documents): `host_doc` (B, T) is turned
  // into the segment table (sdpa_segments) here, once per batch, and uploaded at the batch's first
  // doc-masked call; the doc-masked calls whose SdpaShape::doc is `device_doc` use it. nullptr: none.
  virtual void set_documents(const int32_t* device_doc, const int32_t* host_doc, int B, int T) = 0;
  // The bucketed segment count of the current batch's table for the calls on `device_doc`
  // (SdpaShape::segments); 0 (with the one-line reason logged) where cuDNN cannot take them.
  virtual int segments(const int32_t* device_doc, int B, int T) = 0;
  // How many graphs are cached (built or refused), for tests.
  virtual size_t cached_graphs() const = 0;
};

// The cuDNN path on `stream`, or nullptr where this build has no cuDNN or where cuDNN does not
// start (cudnnCreate fails: no device, its libraries do not load; one line on stderr says why).
std::unique_ptr<CudnnAttention> make_cudnn_attention(cudaStream_t stream);

// y = x (accumulate: y += x), bf16 to fp32, n elements (exec/cuda/attention_bf16.cu).
void bf16_to_float(float* y, const __nv_bfloat16* x, size_t n, bool accumulate, cudaStream_t stream);
// The lse between cuDNN's ragged Stats, token-major (B·T, H), and the own kernel's (B, H, T):
// to_bht: y (B, H, T) ← x (B·T, H); else y (B·T, H) ← x (B, H, T) (exec/cuda/attention_bf16.cu).
void lse_layout(float* y, const float* x, int B, int T, int H, bool to_bht, cudaStream_t stream);

}  // namespace rackstep::exec::cuda
