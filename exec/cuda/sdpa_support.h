// Which attentions the CUDA backend hands to cuDNN's fused SDPA
// (exec/cuda/cudnn_attention.h), and the key its cached graphs are found by.
// Host code only, no CUDA or cuDNN header: tests/cuda_host_sdpa.cpp checks the
// decision on the CPU. A shape this accepts can still be refused by cuDNN
// itself (the graph fails to validate, to find an engine or to build): the
// backend then falls back to its own kernel (exec/cuda/attention.cu) too.
//
// The mapping (cudnn-frontend 1.32, SDPA_attributes, in
// .vendor/cudnn_frontend/include/cudnn_frontend/graph_properties.h and
// utils/attn_score_modifiers.h):
//   causal             set_causal_mask(true): top-left diagonal (s_q = s_kv here), right bound 0
//   window w > 0       set_diagonal_band_left_bound(w): kept where col + w > row, i.e.
//                      j ≥ i − w + 1, the own kernel's attention_visible (element_math.h)
//   GQA                K/V with kv_used heads; cuDNN's head h reads kv head h / (H / kv_used),
//                      kv_head_of (element_math.h); the stored kv_stored ≥ kv_used are a stride
//   lse                the Stats output, max + ln Σ exp (natural log, the frontend's doc of
//                      set_stats_use_log2), (B, H, T) fp32: the own kernel's lse layout
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>

namespace rackstep::exec::cuda {

// One attention call as the backend sees it (exec/cuda/ops.h attention_forward).
struct SdpaShape {
  int B = 0, T = 0, H = 0;
  int kv_stored = 0, kv_used = 0;  // KV heads stored per token, and read (GQA groups)
  int hd = 0;                      // head dim of q, k and v
  int window = 0;                  // 0: causal over the whole sequence; w > 0: the last w keys
  float scale = 0.0f;              // on q·k before the softmax
  bool doc_mask = false;           // packed documents: a key of another document is masked
  bool sinks = false;              // gpt-oss's per-head sink logit
  bool alibi = false;              // ALiBi's per-head linear bias
  bool bf16 = false;               // the backend's bf16 mode (the fp32 mode is the parity mode)

  // The cached graph's key: what changes a cuDNN graph (the flags that refuse are not in it).
  auto key() const {
    uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &scale, sizeof(scale_bits));
    return std::make_tuple(B, T, H, kv_stored, kv_used, hd, window, scale_bits);
  }
};

// The oldest cuDNN the path tries: below 9.6 the frontend's support surface
// (node/sdpa_support_surface.h) refuses several sliding-window and diagonal
// combinations; GQA, bf16 and the Stats output are older. A conservative
// floor, not a measured one.
constexpr int64_t kCudnnSdpaMinVersion = 90600;
// cuDNN's SDPA limit on the head dim (bf16: d ≤ 256, a multiple of 8).
constexpr int kCudnnSdpaMaxHeadDim = 256;

// Why this attention stays on the own kernel; empty when cuDNN may take it.
// `cudnn_version` is cudnnGetVersion() (0: the build has no cuDNN).
inline std::string sdpa_refusal(const SdpaShape& s, int64_t cudnn_version) {
  if (cudnn_version == 0) return "this build has no cuDNN";
  if (cudnn_version < kCudnnSdpaMinVersion) {
    return "cuDNN " + std::to_string(cudnn_version) + " is older than " + std::to_string(kCudnnSdpaMinVersion);
  }
  if (!s.bf16) return "the fp32 mode (the parity mode) keeps the own fp32 kernel";
  if (s.doc_mask) {
    return "document masking (packed documents) is not mapped onto cuDNN's ragged (THD) layout yet";
  }
  if (s.sinks) return "attention sinks are not mapped onto cuDNN's sink token yet";
  if (s.alibi) return "ALiBi: cuDNN computes its own slopes, not checked against models::alibi_slopes";
  if (s.hd <= 0 || s.hd > kCudnnSdpaMaxHeadDim || s.hd % 8 != 0) {
    return "head dim " + std::to_string(s.hd) + " (cuDNN: a multiple of 8, at most 256)";
  }
  if (s.B <= 0 || s.T <= 0 || s.H <= 0) return "an empty attention";
  if (s.kv_used <= 0 || s.kv_used > s.kv_stored || s.H % s.kv_used != 0) return "GQA groups that are not whole";
  if (s.window < 0) return "a negative window";
  return "";
}

// The bytes of bf16 copies the cuDNN path stages (q, k, v, o forward; those,
// dO and dQ, dK, dV backward), each rounded up to 256 bytes, before cuDNN's
// own workspace: what the backend's allocator is asked for.
inline size_t sdpa_staging_bytes(const SdpaShape& s, bool backward) {
  const auto round_up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t tokens = size_t(s.B) * size_t(s.T);
  const size_t q = round_up(tokens * size_t(s.H) * size_t(s.hd) * 2);
  const size_t kv = round_up(tokens * size_t(s.kv_stored) * size_t(s.hd) * 2);
  return backward ? 4 * q + 4 * kv : 2 * q + 2 * kv;
}

}  // namespace rackstep::exec::cuda
