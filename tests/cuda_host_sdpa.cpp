// Which attentions the CUDA backend hands to cuDNN (exec/cuda/sdpa_support.h),
// on the CPU in CI: the refusals that keep the own kernel, the graph-cache key
// and the staging bytes the backend's allocator is asked for.
#include <catch2/catch.hpp>

#include <string>

#include "exec/cuda/sdpa_support.h"

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
  s.doc_mask = true;
  refused_for(s, "document");
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
  for (int field = 0; field < 8; ++field) {
    SdpaShape c = a;
    switch (field) {
      case 0: c.B = 2; break;
      case 1: c.T = 2048; break;
      case 2: c.H = 16; break;
      case 3: c.kv_stored = 16; break;
      case 4: c.kv_used = 16; break;
      case 5: c.hd = 64; break;
      case 6: c.window = 128; break;
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
}
