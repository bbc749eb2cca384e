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
//   packed documents   cuDNN's ragged (THD) layout, SdpaSegments below: each run of one
//                      document id inside a sequence is its own causal segment (cuDNN's
//                      "batch"), set_padding_mask(true) with per-segment seq_len_q = seq_len_kv,
//                      ragged offsets (in elements) of each segment's first token in Q, K, V, O,
//                      dO, dQ, dK, dV and the Stats, set_max_total_seq_len_q/kv(B·T). cuDNN's
//                      Stats are then token-major (B·T, H) (ragged, THD): the cuDNN path copies
//                      them into (and, for its backward, out of) the own (B, H, T) layout, so
//                      the saved lse is the own kernel's whichever side runs the backward.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

namespace rackstep::exec::cuda {

// One attention call as the backend sees it (exec/cuda/ops.h attention_forward).
struct SdpaShape {
  int B = 0, T = 0, H = 0;
  int kv_stored = 0, kv_used = 0;  // KV heads stored per token, and read (GQA groups)
  int hd = 0;                      // head dim of q, k and v
  int window = 0;                  // 0: causal over the whole sequence; w > 0: the last w keys
  float scale = 0.0f;              // on q·k before the softmax
  bool doc_mask = false;           // packed documents: a key of another document is masked
  const int32_t* doc = nullptr;    // (B, T) the device's document ids when doc_mask (not in the key)
  int segments = 0;                // doc_mask on cuDNN: the bucketed segment count (SdpaSegments::bucket)
  bool sinks = false;              // gpt-oss's per-head sink logit
  bool alibi = false;              // ALiBi's per-head linear bias
  bool bf16 = false;               // the backend's bf16 mode (the fp32 mode is the parity mode)

  // The cached graph's key: what changes a cuDNN graph (the flags that refuse are not in it).
  auto key() const {
    uint32_t scale_bits = 0;
    std::memcpy(&scale_bits, &scale, sizeof(scale_bits));
    return std::make_tuple(B, T, H, kv_stored, kv_used, hd, window, scale_bits, segments);
  }
};

// Packed documents as cuDNN's ragged segments, built on the host from a
// batch's (B, T) document ids. The own kernels' rule (exec/kernels.h
// attention_forward): key j is visible to query i of the same sequence iff
// doc[j] == doc[i], j ≤ i and (window > 0) i − j < window. A maximal run of
// one id inside a sequence is a segment; inside it, positions relative to its
// first token keep i − j, so causal + left bound per segment is that rule
// exactly, provided an id never comes back later in the same sequence (then
// two runs would see each other: refused). A document crossing a sequence
// boundary is two segments (the rule never looks across sequences).
//
// cuDNN's graph has one "batch" entry per segment: the count is bucketed
// (a power of two, at least B) so that a graph is not built per step, the
// spare entries being empty segments (length 0, offset at the end). [A] that
// cuDNN takes zero-length entries under the padding mask: not yet run on a
// GPU; tests/cuda_sdpa.cpp's packed-documents case (13 segments in a bucket
// of 16) checks it.
struct SdpaSegments {
  int count = 0;                     // real segments
  int bucket = 0;                    // cuDNN's batch dim: count rounded up, ≥ B
  std::vector<int32_t> length;       // (bucket) tokens per segment, 0 for the spare ones
  std::vector<int64_t> first_token;  // (bucket + 1) cu_seqlens: token index (b·T + t) of each start, then B·T
  std::string refusal;               // non-empty: this batch's documents stay on the own kernel
};

inline int sdpa_segment_bucket(int count, int B) {
  int bucket = std::max(B, 1);
  while (bucket < count) bucket *= 2;
  return bucket;
}

inline SdpaSegments sdpa_segments(const int32_t* doc, int B, int T) {
  SdpaSegments g;
  for (int b = 0; b < B; ++b) {
    const int32_t* row = doc + size_t(b) * size_t(T);
    std::vector<int32_t> seen;  // ids whose run has ended in this sequence
    for (int t = 0; t < T; ++t) {
      if (t > 0 && row[t] == row[t - 1]) {
        ++g.length.back();
        continue;
      }
      if (t > 0) seen.push_back(row[t - 1]);
      if (std::find(seen.begin(), seen.end(), row[t]) != seen.end()) {
        g.refusal = "document " + std::to_string(row[t]) + " comes back at token " + std::to_string(t) +
                    " of sequence " + std::to_string(b) + " (not one run: no ragged segment)";
        return g;
      }
      g.length.push_back(1);
      g.first_token.push_back(int64_t(b) * T + t);
    }
  }
  g.count = static_cast<int>(g.length.size());
  g.bucket = sdpa_segment_bucket(g.count, B);
  g.length.resize(size_t(g.bucket), 0);
  g.first_token.resize(size_t(g.bucket) + 1, int64_t(B) * T);
  return g;
}

// A segment table's ragged offsets in elements for a tensor of `per_token`
// elements per token (Q, O, dO: H·hd; K, V: kv_stored·hd; Stats: H): (bucket + 1).
inline std::vector<int32_t> sdpa_ragged_offsets(const SdpaSegments& g, int64_t per_token) {
  std::vector<int32_t> off(g.first_token.size());
  for (size_t i = 0; i < off.size(); ++i) off[i] = static_cast<int32_t>(g.first_token[i] * per_token);
  return off;
}

// The byte alignment cuDNN is told every tensor's pointer has (cudnn-frontend 1.32,
// Tensor_attributes::default_alignment, graph_properties.h), index tensors too.
constexpr size_t kCudnnTensorAlignBytes = 16;

// Whether cuDNN may take `p` as a tensor pointer (the backend's own buffers, such as a saved lse
// at an activation slot's offset, are only 4-byte aligned where B·T is not a multiple of 4).
inline bool sdpa_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kCudnnTensorAlignBytes == 0;
}

// One device segment table (int32, one allocation): the lengths (bucket), then
// the ragged offsets (bucket + 1) of the q-wide tensors (Q, O, dO, dQ), of the
// kv-wide ones (K, V, dK, dV) and of the Stats, each array starting on a
// kCudnnTensorAlignBytes boundary (the allocation's start is one) because cuDNN
// is told so; packed end to end, the kv offsets would start at 4·(2·bucket + 1) bytes.
struct SdpaSegmentTable {
  std::vector<int32_t> data;  // what is uploaded
  size_t length = 0, off_q = 0, off_kv = 0, off_stats = 0;  // each array's first element in data
};

inline SdpaSegmentTable sdpa_segment_table(const SdpaSegments& g, int64_t q_width, int64_t kv_width,
                                           int64_t stats_width) {
  SdpaSegmentTable t;
  const auto append = [&](const std::vector<int32_t>& a) {
    constexpr size_t per_boundary = kCudnnTensorAlignBytes / sizeof(int32_t);
    t.data.resize((t.data.size() + per_boundary - 1) / per_boundary * per_boundary, 0);
    const size_t at = t.data.size();
    t.data.insert(t.data.end(), a.begin(), a.end());
    return at;
  };
  t.length = append(g.length);
  t.off_q = append(sdpa_ragged_offsets(g, q_width));
  t.off_kv = append(sdpa_ragged_offsets(g, kv_width));
  t.off_stats = append(sdpa_ragged_offsets(g, stats_width));
  return t;
}

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
  if (s.doc_mask && s.segments <= 0) return "packed documents without a segment table on the host";
  if (s.sinks) return "attention sinks are not mapped onto cuDNN's sink token yet";
  if (s.alibi) return "ALiBi: cuDNN computes its own slopes, not checked against models::alibi_slopes";
  if (s.hd <= 0 || s.hd > kCudnnSdpaMaxHeadDim || s.hd % 8 != 0) {
    return "head dim " + std::to_string(s.hd) + " (cuDNN: a multiple of 8, at most 256)";
  }
  if (s.B <= 0 || s.T <= 0 || s.H <= 0) return "an empty attention";
  if (s.kv_used <= 0 || s.kv_used > s.kv_stored || s.H % s.kv_used != 0) return "GQA groups that are not whole";
  if (s.window < 0) return "a negative window";
  // The ragged offsets are int32 elements (cuDNN's INT32 offset tensors).
  if (s.doc_mask && int64_t(s.B) * s.T * std::max(s.H, s.kv_stored) * s.hd > INT32_MAX) {
    return "packed documents with more than 2^31 elements per tensor (int32 ragged offsets)";
  }
  return "";
}

// The own lse (B, H, T) index of element i of cuDNN's ragged token-major Stats
// (B·T, H): token i / H, head i % H (exec/cuda/attention_bf16.cu lse_layout).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline size_t lse_bht_of_thd(size_t i, int T, int H) {
  const size_t token = i / size_t(H), h = i % size_t(H);
  const size_t b = token / size_t(T), t = token % size_t(T);
  return (b * size_t(H) + h) * size_t(T) + t;
}

// The bytes of bf16 copies the cuDNN path stages (q, k, v, o forward; those,
// dO and dQ, dK, dV backward; with packed documents cuDNN's fp32 (B·T, H)
// Stats too), each rounded up to 256 bytes, before cuDNN's
// own workspace: what the backend's allocator is asked for.
inline size_t sdpa_staging_bytes(const SdpaShape& s, bool backward) {
  const auto round_up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t tokens = size_t(s.B) * size_t(s.T);
  const size_t q = round_up(tokens * size_t(s.H) * size_t(s.hd) * 2);
  const size_t kv = round_up(tokens * size_t(s.kv_stored) * size_t(s.hd) * 2);
  const size_t stats = s.doc_mask ? round_up(tokens * size_t(s.H) * 4) : 0;  // cuDNN's (B·T, H) Stats
  return (backward ? 4 * q + 4 * kv : 2 * q + 2 * kv) + stats;
}

}  // namespace rackstep::exec::cuda
