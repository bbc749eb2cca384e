// Which attentions the CUDA backend hands to cuDNN (exec/cuda/sdpa_support.h),
// on the CPU in CI: the refusals that keep the own kernel, the graph-cache key,
// the staging bytes the backend's allocator is asked for, and packed documents
// as cuDNN's ragged segments against the CPU attention kernel (exec/kernels.h).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "exec/cuda/sdpa_support.h"
#include "exec/kernels.h"

using namespace rackstep::exec::cuda;

namespace {

// The timing shape in the bf16 mode: B 1, T 4096, H 32, hd 128, causal.
SdpaShape bench_shape() {
  return {.B = 1, .T = 4096, .H = 32, .kv_stored = 32, .kv_used = 32, .hd = 128, .window = 0,
          .scale = 0.08838834764f, .bf16 = true};
}

}  // namespace

TEST_CASE("cuDNN SDPA: the bf16 mode's causal, windowed and GQA attentions go to cuDNN", "[cuda_host][sdpa]") {
  const int64_t v = 91900;  // the toolkit's cuDNN here
  SdpaShape s = bench_shape();
  CHECK(sdpa_refusal(s, v).empty());
  s.window = 512;  // sliding window: the left bound
  CHECK(sdpa_refusal(s, v).empty());
  s.kv_stored = 8;  // GQA, 4 query heads per KV head
  s.kv_used = 8;
  CHECK(sdpa_refusal(s, v).empty());
  s.kv_used = 4;  // a global layer reading the first 4 of 8 stored KV heads
  CHECK(sdpa_refusal(s, v).empty());
  for (int hd : {64, 96, 128, 256}) {
    s.hd = hd;
    CHECK(sdpa_refusal(s, v).empty());
  }
}

TEST_CASE("cuDNN SDPA: the variants it does not take keep the own kernel, each with its reason",
          "[cuda_host][sdpa]") {
  const int64_t v = 91900;
  const auto refused_for = [&](SdpaShape s, const std::string& word, int64_t version = 91900) {
    const std::string why = sdpa_refusal(s, version);
    INFO(why);
    CHECK(why.find(word) != std::string::npos);
  };
  SdpaShape s = bench_shape();
  refused_for(s, "no cuDNN", 0);
  refused_for(s, "older", 90500);
  CHECK(sdpa_refusal(s, kCudnnSdpaMinVersion).empty());
  s.bf16 = false;
  refused_for(s, "fp32");
  s = bench_shape();
  s.doc_mask = true;  // packed documents whose segment table the backend does not have
  refused_for(s, "segment table");
  s.segments = 4;  // with one: cuDNN's ragged layout
  CHECK(sdpa_refusal(s, v).empty());
  s.B = 8;
  s.T = 65536;  // 8·64Ki tokens of 32·128: 2^31 elements, past the int32 offsets
  refused_for(s, "2^31");
  s = bench_shape();
  s.sinks = true;
  refused_for(s, "sink");
  s = bench_shape();
  s.alibi = true;
  refused_for(s, "ALiBi");
  for (int hd : {0, 60, 264, 512}) {
    s = bench_shape();
    s.hd = hd;
    refused_for(s, "head dim");
  }
  s = bench_shape();
  s.kv_used = 5;  // 32 heads in groups of 6.4
  s.kv_stored = 8;
  refused_for(s, "GQA");
  s.kv_used = 16;  // more read than stored
  refused_for(s, "GQA");
  s = bench_shape();
  s.window = -1;
  refused_for(s, "window");
  s = bench_shape();
  s.T = 0;
  refused_for(s, "empty");
  CHECK(sdpa_refusal(bench_shape(), v).empty());
}

TEST_CASE("cuDNN SDPA: one cached graph per shape, window and scale", "[cuda_host][sdpa]") {
  const SdpaShape a = bench_shape();
  SdpaShape b = a;
  b.doc_mask = false;  // refusal flags are not part of a built graph
  CHECK(a.key() == b.key());
  for (int field = 0; field < 9; ++field) {
    SdpaShape c = a;
    switch (field) {
      case 0: c.B = 2; break;
      case 1: c.T = 2048; break;
      case 2: c.H = 16; break;
      case 3: c.kv_stored = 16; break;
      case 4: c.kv_used = 16; break;
      case 5: c.hd = 64; break;
      case 6: c.window = 128; break;
      case 7: c.segments = 16; break;  // packed documents: cuDNN's batch is the segment bucket
      default: c.scale = 0.125f; break;
    }
    INFO("field " << field);
    CHECK(c.key() != a.key());
  }
}

TEST_CASE("cuDNN SDPA: staging bytes are the bf16 copies, each 256-byte aligned", "[cuda_host][sdpa]") {
  const SdpaShape s = bench_shape();
  const size_t q = size_t(4096) * 32 * 128 * 2;  // one (B, T, H, hd) bf16 tensor
  CHECK(sdpa_staging_bytes(s, false) == 4 * q);  // q, o, k, v (kv_stored = H)
  CHECK(sdpa_staging_bytes(s, true) == 8 * q);   // those, dO, dQ, dK, dV
  SdpaShape odd = s;
  odd.B = 1;
  odd.T = 3;
  odd.H = 1;
  odd.kv_stored = 1;
  odd.kv_used = 1;
  odd.hd = 8;  // 48 bytes per tensor -> 256
  CHECK(sdpa_staging_bytes(odd, false) == 4 * 256);
  CHECK(sdpa_staging_bytes(odd, true) == 8 * 256);
  SdpaShape docs = s;  // packed documents: cuDNN's fp32 (B·T, H) Stats besides
  docs.doc_mask = true;
  docs.segments = 8;
  CHECK(sdpa_staging_bytes(docs, false) == 4 * q + size_t(4096) * 32 * 4);
  CHECK(sdpa_staging_bytes(docs, true) == 8 * q + size_t(4096) * 32 * 4);
}

namespace {

// The own kernels' visibility (exec/kernels.h attention_forward) of key j to query i in sequence b.
bool kernel_visible(const std::vector<int32_t>& doc, int T, int window, int b, int i, int j) {
  const size_t row = size_t(b) * size_t(T);
  return j <= i && (window <= 0 || i - window < j) && doc[row + size_t(i)] == doc[row + size_t(j)];
}

// The segment of token (b, t), and its position inside it.
std::pair<int, int> segment_of(const SdpaSegments& g, int T, int b, int t) {
  const int64_t token = int64_t(b) * T + t;
  for (int s = 0; s < g.count; ++s) {
    if (token >= g.first_token[size_t(s)] && token < g.first_token[size_t(s)] + g.length[size_t(s)]) {
      return {s, int(token - g.first_token[size_t(s)])};
    }
  }
  return {-1, -1};
}

// cuDNN's mask on the segments: same segment, causal and the left bound in segment positions.
bool segment_visible(const SdpaSegments& g, int T, int window, int b, int i, int j) {
  const auto [si, pi] = segment_of(g, T, b, i);
  const auto [sj, pj] = segment_of(g, T, b, j);
  return si == sj && pj <= pi && (window <= 0 || pi - window < pj);
}

}  // namespace

TEST_CASE("cuDNN SDPA: packed documents become ragged segments (cu_seqlens from the doc ids)",
          "[cuda_host][sdpa]") {
  SECTION("a document across the sequence boundary, one-token documents") {
    // B 2, T 6: doc 2 ends sequence 0 and starts sequence 1 (two segments); docs 2 (seq 0) and 3 one token.
    const std::vector<int32_t> doc = {0, 0, 1, 1, 1, 2, 2, 2, 3, 4, 4, 4};
    const SdpaSegments g = sdpa_segments(doc.data(), 2, 6);
    REQUIRE(g.refusal.empty());
    CHECK(g.count == 6);
    CHECK(g.bucket == 8);  // 2 -> 4 -> 8: a power-of-two multiple of B
    CHECK(g.length == std::vector<int32_t>{2, 3, 1, 2, 1, 3, 0, 0});
    CHECK(g.first_token == std::vector<int64_t>{0, 2, 5, 6, 8, 9, 12, 12, 12});
    // Ragged offsets in elements: Q with H·hd = 4·8 per token, Stats with H = 4.
    CHECK(sdpa_ragged_offsets(g, 32) == std::vector<int32_t>{0, 64, 160, 192, 256, 288, 384, 384, 384});
    CHECK(sdpa_ragged_offsets(g, 4) == std::vector<int32_t>{0, 8, 20, 24, 32, 36, 48, 48, 48});
  }
  SECTION("a sequence that is one document: one segment per sequence, as without documents") {
    const std::vector<int32_t> doc = {7, 7, 7, 7, 7, 9, 9, 9, 9, 9};
    const SdpaSegments g = sdpa_segments(doc.data(), 2, 5);
    REQUIRE(g.refusal.empty());
    CHECK(g.count == 2);
    CHECK(g.bucket == 2);
    CHECK(g.length == std::vector<int32_t>{5, 5});
    CHECK(g.first_token == std::vector<int64_t>{0, 5, 10});
  }
  SECTION("every token its own document") {
    const std::vector<int32_t> doc = {0, 1, 2, 3, 4};
    const SdpaSegments g = sdpa_segments(doc.data(), 1, 5);
    CHECK(g.count == 5);
    CHECK(g.bucket == 8);
    CHECK(g.length == std::vector<int32_t>{1, 1, 1, 1, 1, 0, 0, 0});
  }
  SECTION("an id that comes back later in its sequence is refused (the kernel lets the two runs meet)") {
    const std::vector<int32_t> doc = {0, 0, 1, 0, 5, 5, 5, 5};
    const SdpaSegments g = sdpa_segments(doc.data(), 2, 4);
    CHECK(g.refusal.find("comes back at token 3 of sequence 0") != std::string::npos);
    const std::vector<int32_t> across = {0, 1, 1, 0};  // the same id in the next sequence is a new segment
    CHECK(sdpa_segments(across.data(), 2, 2).refusal.empty());
  }
  SECTION("the bucket grows by doubling, so steps with similar packing share a graph") {
    CHECK(sdpa_segment_bucket(1, 4) == 4);
    CHECK(sdpa_segment_bucket(5, 4) == 8);
    CHECK(sdpa_segment_bucket(9, 4) == 16);
    CHECK(sdpa_segment_bucket(16, 4) == 16);
  }
}

TEST_CASE("cuDNN SDPA: the device segment table puts every index array on cuDNN's 16-byte alignment",
          "[cuda_host][sdpa]") {
  // cuDNN is told each tensor pointer is 16-byte aligned, the int32 lengths and offsets too: an
  // array packed right after (bucket) lengths and (bucket + 1) offsets would start 4 bytes off.
  for (const int B : {1, 2, 3, 4}) {
    for (const int T : {5, 6, 64}) {
      std::vector<int32_t> doc(size_t(B) * size_t(T));
      for (size_t n = 0; n < doc.size(); ++n) doc[n] = int32_t(n / 3);  // 3-token documents
      const SdpaSegments g = sdpa_segments(doc.data(), B, T);
      REQUIRE(g.refusal.empty());
      const int64_t wq = 4 * 64, wkv = 2 * 64, ws = 4;
      const SdpaSegmentTable t = sdpa_segment_table(g, wq, wkv, ws);
      INFO("B " << B << " T " << T << " bucket " << g.bucket);
      const size_t n = size_t(g.bucket);
      const std::vector<std::tuple<size_t, std::vector<int32_t>>> arrays = {
          {t.length, g.length},
          {t.off_q, sdpa_ragged_offsets(g, wq)},
          {t.off_kv, sdpa_ragged_offsets(g, wkv)},
          {t.off_stats, sdpa_ragged_offsets(g, ws)}};
      size_t end = 0;  // arrays in order, none overlapping the one before
      for (const auto& [at, want] : arrays) {
        CHECK(at * sizeof(int32_t) % kCudnnTensorAlignBytes == 0);
        CHECK(at >= end);
        REQUIRE(at + want.size() <= t.data.size());
        const auto first = t.data.begin() + std::ptrdiff_t(at);
        CHECK(std::vector<int32_t>(first, first + std::ptrdiff_t(want.size())) == want);
        end = at + want.size();
      }
      CHECK(t.off_q - t.length >= n);
      CHECK(t.data.size() == end);
    }
  }
}

TEST_CASE("cuDNN SDPA: a saved lse off cuDNN's 16-byte alignment is not given to cuDNN", "[cuda_host][sdpa]") {
  // The saved lse sits at an activation slot's offset, N·(widths before it) floats into the arena:
  // 4-byte steps where N = B·T is not a multiple of 4 (tiny-moe's 257-wide logits, N = 127).
  alignas(16) float arena[8] = {};
  CHECK(sdpa_aligned(arena));
  CHECK(sdpa_aligned(arena + 4));
  for (int offset : {1, 2, 3}) CHECK_FALSE(sdpa_aligned(arena + offset));
}

TEST_CASE("cuDNN SDPA: the segments' causal and window masks are the CPU kernel's document mask",
          "[cuda_host][sdpa]") {
  std::mt19937 rng(11);
  const int B = 3, T = 24;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int32_t> doc(size_t(B) * T);
    int32_t id = 0;
    for (size_t n = 0; n < doc.size(); ++n) {  // runs of 1..8 tokens, continuing across sequences
      if (n > 0 && rng() % 4 == 0) ++id;
      doc[n] = id;
    }
    const SdpaSegments g = sdpa_segments(doc.data(), B, T);
    REQUIRE(g.refusal.empty());
    for (int window : {0, 1, 2, 3, 7, 100}) {
      for (int b = 0; b < B; ++b) {
        for (int i = 0; i < T; ++i) {
          for (int j = 0; j < T; ++j) {
            INFO("trial " << trial << " window " << window << " b " << b << " i " << i << " j " << j);
            REQUIRE(kernel_visible(doc, T, window, b, i, j) == segment_visible(g, T, window, b, i, j));
          }
        }
      }
    }
  }
}

TEST_CASE("cuDNN SDPA: attention over the ragged segments is the CPU kernel's with doc ids, lse included",
          "[cuda_host][sdpa]") {
  // cuDNN's view, emulated with the CPU kernel: each segment its own causal sequence, read and
  // written at its ragged offsets, Stats token-major (B·T, H); then lse_bht_of_thd into (B, H, T).
  const int B = 2, T = 9, H = 4, kvs = 2, kvu = 2, hd = 8;
  const std::vector<int32_t> doc = {0, 0, 0, 1, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4, 4, 4, 5};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto random = [&](size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = normal(rng);
    return x;
  };
  const size_t wq = size_t(H) * hd, wkv = size_t(kvs) * hd, N = size_t(B) * T;
  const std::vector<float> q = random(N * wq), k = random(N * wkv), v = random(N * wkv);
  const float scale = 1.0f / std::sqrt(float(hd));
  const SdpaSegments g = sdpa_segments(doc.data(), B, T);
  REQUIRE(g.refusal.empty());
  const std::vector<int32_t> off_q = sdpa_ragged_offsets(g, int64_t(wq)), off_kv = sdpa_ragged_offsets(g, int64_t(wkv));
  const std::vector<int32_t> off_stats = sdpa_ragged_offsets(g, H);
  for (int window : {0, 2, 3}) {
    INFO("window " << window);
    std::vector<float> o(N * wq), lse(N * H);
    rackstep::exec::attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), doc.data(), B, T, H, kvs,
                                      kvu, hd, window, scale);
    std::vector<float> o_seg(N * wq, NAN), stats(N * H, NAN);
    for (int s = 0; s < g.bucket; ++s) {  // the spare segments (length 0) touch nothing
      const int len = g.length[size_t(s)];
      if (len == 0) continue;
      std::vector<float> lse_s(size_t(H) * len);  // (1, H, len)
      rackstep::exec::attention_forward(o_seg.data() + off_q[size_t(s)], lse_s.data(), q.data() + off_q[size_t(s)],
                                        k.data() + off_kv[size_t(s)], v.data() + off_kv[size_t(s)], nullptr, 1, len,
                                        H, kvs, kvu, hd, window, scale);
      for (int t = 0; t < len; ++t) {
        for (int h = 0; h < H; ++h) {
          stats[size_t(off_stats[size_t(s)]) + size_t(t) * H + h] = lse_s[size_t(h) * len + t];
        }
      }
    }
    for (size_t e = 0; e < o.size(); ++e) REQUIRE(o_seg[e] == Approx(o[e]).margin(1e-6));
    std::vector<float> lse_seg(N * H, NAN);
    for (size_t i = 0; i < stats.size(); ++i) lse_seg[lse_bht_of_thd(i, T, H)] = stats[i];
    for (size_t e = 0; e < lse.size(); ++e) REQUIRE(lse_seg[e] == Approx(lse[e]).margin(1e-6));
  }
}
