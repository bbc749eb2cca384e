// cuDNN's fused SDPA (exec/cuda/cudnn_attention.h) against the own CUDA kernel
// and the CPU kernel, in the bf16 mode: causal, sliding windows, GQA with
// unread stored KV heads, head dims 64 and 128, a length that is no tile
// multiple; the "+=" of dK/dV; the refusals that fall back; one graph per shape;
// packed documents as ragged segments (with the CPU's and the own kernel's doc mask).
// Part of test_cuda (tests/cuda_kernels.cpp's main): exits 77, skipped, without
// a device. References run in fp32 on the bf16-rounded inputs cuDNN sees; the
// tolerances are bf16's (cuDNN rounds O, P and the gradients to bf16).
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "exec/cuda/bf16_math.h"
#include "exec/cuda/check.h"
#include "exec/cuda/cudnn_attention.h"
#include "exec/cuda/ops.h"
#include "exec/kernels.h"
#include "tests/exec_kernels_testutil.h"

namespace {

using namespace rackstep::exec;
using rackstep::exec::testing::normalised_error;

struct Device {
  float* ptr = nullptr;
  size_t n = 0;
  explicit Device(const std::vector<float>& host) : n(host.size()) {
    RS_CUDA_CHECK(cudaMalloc(&ptr, sizeof(float) * n));
    RS_CUDA_CHECK(cudaMemcpy(ptr, host.data(), sizeof(float) * n, cudaMemcpyHostToDevice));
  }
  explicit Device(size_t count) : Device(std::vector<float>(count, 0.0f)) {}
  ~Device() { cudaFree(ptr); }
  Device(const Device&) = delete;
  std::vector<float> get() const {
    std::vector<float> h(n);
    RS_CUDA_CHECK(cudaMemcpy(h.data(), ptr, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return h;
  }
};

std::vector<float> bf16_rounded(std::vector<float> x) {
  for (float& v : x) v = cuda::bf16_round(v);
  return x;
}

// A growing device workspace, as the backend's scratch.
struct Workspace {
  void* p = nullptr;
  size_t bytes = 0;
  ~Workspace() { cudaFree(p); }
  cuda::SdpaWorkspace fn() {
    return [this](size_t b) {
      if (b > bytes) {
        cudaFree(p);
        RS_CUDA_CHECK(cudaMalloc(&p, b));
        bytes = b;
      }
      return p;
    };
  }
};

// This build's cuDNN attention, or nullptr after one warning (a build without
// cuDNN has nothing to compare: CMake's message says why).
std::unique_ptr<cuda::CudnnAttention> cudnn_attention_or_warn() {
  std::unique_ptr<cuda::CudnnAttention> sdpa = cuda::make_cudnn_attention(nullptr);
  if (!sdpa) WARN("this build has no cuDNN attention (CMake's message says why): nothing to check");
  return sdpa;
}

}  // namespace

TEST_CASE("cuda: cuDNN SDPA forward and backward match the own kernel and the CPU in bf16 (causal, windows, GQA)",
          "[cuda][gpu][cudnn][bf16]") {
  const std::unique_ptr<cuda::CudnnAttention> sdpa = cudnn_attention_or_warn();
  if (!sdpa) return;
  INFO("cuDNN " << sdpa->version());
  Workspace ws;
  struct Case { int B, T, H, kv_stored, kv_used, hd, window; };
  for (const Case cs : {Case{2, 256, 8, 8, 8, 64, 0}, Case{2, 200, 8, 4, 2, 64, 48}, Case{1, 384, 4, 2, 2, 128, 0},
                        Case{1, 384, 4, 4, 1, 128, 100}}) {
    const int B = cs.B, T = cs.T, H = cs.H, kvs = cs.kv_stored, kvu = cs.kv_used, hd = cs.hd, w = cs.window;
    INFO("B " << B << " T " << T << " H " << H << " kv " << kvu << "/" << kvs << " hd " << hd << " window " << w);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const size_t nq = size_t(B) * T * H * hd, nkv = size_t(B) * T * kvs * hd, nl = size_t(B) * H * T;
    const auto q = bf16_rounded(testing::randn(nq, 60)), k = bf16_rounded(testing::randn(nkv, 61)),
               v = bf16_rounded(testing::randn(nkv, 62)), dout = bf16_rounded(testing::randn(nq, 63));
    // The CPU reference in fp32.
    std::vector<float> o(nq), lse(nl), dq(nq), dk(nkv), dv(nkv);
    attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, B, T, H, kvs, kvu, hd, w, scale);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), o.data(),
                       lse.data(), nullptr, B, T, H, kvs, kvu, hd, w, scale);
    // The own CUDA kernel in fp32.
    Device gq(q), gk(k), gv(v), gdout(dout), go(nq), glse(nl), gdq(nq), gdk(nkv), gdv(nkv), gdelta(nl);
    cuda::attention_forward(go.ptr, glse.ptr, gq.ptr, gk.ptr, gv.ptr, nullptr, B, T, H, kvs, kvu, hd, w, scale,
                            nullptr);
    cuda::attention_backward(gdq.ptr, gdk.ptr, gdv.ptr, gdout.ptr, gq.ptr, gk.ptr, gv.ptr, go.ptr, glse.ptr, nullptr,
                             gdelta.ptr, B, T, H, kvs, kvu, hd, w, scale, false, nullptr);
    // cuDNN.
    const cuda::SdpaShape s{.B = B, .T = T, .H = H, .kv_stored = kvs, .kv_used = kvu, .hd = hd, .window = w,
                            .scale = scale, .bf16 = true};
    Device co(nq), clse(nl), cdq(nq), cdk(nkv), cdv(nkv);
    REQUIRE(sdpa->forward(s, co.ptr, clse.ptr, gq.ptr, gk.ptr, gv.ptr, ws.fn()));
    REQUIRE(sdpa->backward(s, cdq.ptr, cdk.ptr, cdv.ptr, gdout.ptr, gq.ptr, gk.ptr, gv.ptr, co.ptr, clse.ptr, false,
                           ws.fn()));
    RS_CUDA_CHECK(cudaDeviceSynchronize());
    const auto c_o = co.get(), c_lse = clse.get(), c_dq = cdq.get(), c_dk = cdk.get(), c_dv = cdv.get();
    CHECK(normalised_error(c_o, o) < 2e-2);
    CHECK(normalised_error(c_lse, lse) < 1e-3);  // fp32 statistics of the same bf16 inputs
    CHECK(normalised_error(c_dq, dq) < 5e-2);  // dS = P (dP − δ) in bf16: cancellation widens it
    CHECK(normalised_error(c_dk, dk) < 5e-2);
    CHECK(normalised_error(c_dv, dv) < 5e-2);
    CHECK(normalised_error(c_o, go.get()) < 2e-2);  // the own kernel agrees with the CPU to 1e-5 (fp32 test)
    CHECK(normalised_error(c_dk, gdk.get()) < 5e-2);
    // "+=": dK, dV onto what is there; the unread stored heads keep it.
    const auto before = testing::randn(nkv, 64);
    Device adk(before), adv(before), adq(nq);
    REQUIRE(sdpa->backward(s, adq.ptr, adk.ptr, adv.ptr, gdout.ptr, gq.ptr, gk.ptr, gv.ptr, co.ptr, clse.ptr, true,
                           ws.fn()));
    std::vector<float> want_dk(nkv), want_dv(nkv);
    for (size_t i = 0; i < nkv; ++i) {
      want_dk[i] = before[i] + c_dk[i];
      want_dv[i] = before[i] + c_dv[i];
    }
    CHECK(normalised_error(adk.get(), want_dk) < 1e-6);  // deterministic backward: the same dK to the bit
    CHECK(normalised_error(adv.get(), want_dv) < 1e-6);
  }
  // One graph per shape and direction: the shapes again build nothing.
  const size_t graphs = sdpa->cached_graphs();
  CHECK(graphs == 8);
}

namespace {

struct DeviceIds {
  int32_t* ptr = nullptr;
  explicit DeviceIds(const std::vector<int32_t>& host) {
    RS_CUDA_CHECK(cudaMalloc(&ptr, sizeof(int32_t) * host.size()));
    RS_CUDA_CHECK(cudaMemcpy(ptr, host.data(), sizeof(int32_t) * host.size(), cudaMemcpyHostToDevice));
  }
  ~DeviceIds() { cudaFree(ptr); }
  DeviceIds(const DeviceIds&) = delete;
};

// Packed documents of run lengths cycling through `runs`, ids continuing across sequences.
std::vector<int32_t> packed_docs(int B, int T, const std::vector<int>& runs) {
  std::vector<int32_t> doc(size_t(B) * T);
  int32_t id = 0;
  size_t r = 0;
  int left = runs[0];
  for (int32_t& d : doc) {
    if (left == 0) {
      ++id;
      left = runs[++r % runs.size()];
    }
    d = id;
    --left;
  }
  return doc;
}

}  // namespace

TEST_CASE("cuda: cuDNN SDPA with packed documents (ragged segments) matches the own kernel and the CPU",
          "[cuda][gpu][cudnn][bf16]") {
  const std::unique_ptr<cuda::CudnnAttention> sdpa = cudnn_attention_or_warn();
  if (!sdpa) return;
  INFO("cuDNN " << sdpa->version());
  Workspace ws;
  const int B = 2, T = 200, H = 8, kvs = 4, kvu = 2, hd = 64;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t nq = size_t(B) * T * H * hd, nkv = size_t(B) * T * kvs * hd, nl = size_t(B) * H * T;
  const auto q = bf16_rounded(testing::randn(nq, 80)), k = bf16_rounded(testing::randn(nkv, 81)),
             v = bf16_rounded(testing::randn(nkv, 82)), dout = bf16_rounded(testing::randn(nq, 83));
  Device gq(q), gk(k), gv(v), gdout(dout);
  size_t graphs_after_first = 0;
  // Batches: one-token documents and one crossing the sequence boundary; a second packing of the
  // same bucket (no new graph, the table uploaded again); sequences that are one document each.
  const std::vector<std::vector<int>> packings = {{1, 37, 5, 1, 90, 120}, {60, 1, 1, 70, 30}, {200}};
  for (size_t p = 0; p < packings.size(); ++p) {
    const std::vector<int32_t> doc = packed_docs(B, T, packings[p]);
    DeviceIds gdoc(doc);
    sdpa->set_documents(gdoc.ptr, doc.data(), B, T);
    const int segments = sdpa->segments(gdoc.ptr, B, T);
    REQUIRE(segments > 0);
    for (const int w : {0, 48}) {
      INFO("packing " << p << " window " << w << " segments " << segments);
      std::vector<float> o(nq), lse(nl), dq(nq), dk(nkv), dv(nkv);
      attention_forward(o.data(), lse.data(), q.data(), k.data(), v.data(), doc.data(), B, T, H, kvs, kvu, hd, w,
                        scale);
      attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), o.data(),
                         lse.data(), doc.data(), B, T, H, kvs, kvu, hd, w, scale);
      Device go(nq), glse(nl), gdq(nq), gdk(nkv), gdv(nkv), gdelta(nl);
      cuda::attention_forward(go.ptr, glse.ptr, gq.ptr, gk.ptr, gv.ptr, gdoc.ptr, B, T, H, kvs, kvu, hd, w, scale,
                              nullptr);
      const cuda::SdpaShape s{.B = B, .T = T, .H = H, .kv_stored = kvs, .kv_used = kvu, .hd = hd, .window = w,
                              .scale = scale, .doc_mask = true, .doc = gdoc.ptr, .segments = segments,
                              .bf16 = true};
      Device co(nq), clse(nl), cdq(nq), cdk(nkv), cdv(nkv);
      REQUIRE(sdpa->forward(s, co.ptr, clse.ptr, gq.ptr, gk.ptr, gv.ptr, ws.fn()));
      REQUIRE(sdpa->backward(s, cdq.ptr, cdk.ptr, cdv.ptr, gdout.ptr, gq.ptr, gk.ptr, gv.ptr, co.ptr, clse.ptr, false,
                             ws.fn()));
      // The own backward on cuDNN's saved lse: the (B, H, T) layout it expects.
      cuda::attention_backward(gdq.ptr, gdk.ptr, gdv.ptr, gdout.ptr, gq.ptr, gk.ptr, gv.ptr, co.ptr, clse.ptr,
                               gdoc.ptr, gdelta.ptr, B, T, H, kvs, kvu, hd, w, scale, false, nullptr);
      RS_CUDA_CHECK(cudaDeviceSynchronize());
      const auto c_o = co.get(), c_lse = clse.get(), c_dq = cdq.get(), c_dk = cdk.get(), c_dv = cdv.get();
      CHECK(normalised_error(c_o, o) < 2e-2);
      CHECK(normalised_error(c_lse, lse) < 1e-3);
      CHECK(normalised_error(c_lse, glse.get()) < 1e-3);
      CHECK(normalised_error(c_dq, dq) < 5e-2);
      CHECK(normalised_error(c_dk, dk) < 5e-2);
      CHECK(normalised_error(c_dv, dv) < 5e-2);
      CHECK(normalised_error(c_o, go.get()) < 2e-2);
      CHECK(normalised_error(gdq.get(), dq) < 5e-2);  // own backward from cuDNN's o and lse
      CHECK(normalised_error(gdk.get(), dk) < 5e-2);
    }
    if (p == 0) graphs_after_first = sdpa->cached_graphs();
    if (p == 1) CHECK(sdpa->cached_graphs() == graphs_after_first);  // same bucket: the same graphs
  }
  // An id that comes back inside a sequence: no segments, the own kernel's.
  const std::vector<int32_t> back = [&] {
    std::vector<int32_t> d(size_t(B) * T, 0);
    for (int t = 50; t < 60; ++t) d[size_t(t)] = 1;
    return d;
  }();
  DeviceIds gback(back);
  sdpa->set_documents(gback.ptr, back.data(), B, T);
  CHECK(sdpa->segments(gback.ptr, B, T) == 0);
  DeviceIds unknown(back);  // ids the host never gave for this pointer: no segments either
  CHECK(sdpa->segments(unknown.ptr, B, T) == 0);
}

TEST_CASE("cuda: cuDNN SDPA refuses the fp32 mode, documents, sinks, ALiBi and a misaligned lse without writing",
          "[cuda][gpu][cudnn]") {
  const std::unique_ptr<cuda::CudnnAttention> sdpa = cudnn_attention_or_warn();
  if (!sdpa) return;
  const cuda::SdpaShape ok{.B = 1, .T = 64, .H = 2, .kv_stored = 2, .kv_used = 2, .hd = 64, .window = 0,
                           .scale = 0.125f, .bf16 = true};
  const size_t n = 64 * 2 * 64;
  Device q(testing::randn(n, 70)), o(std::vector<float>(n, 7.0f)), lse(std::vector<float>(129, 7.0f));
  Workspace ws;
  for (int which = 0; which < 5; ++which) {
    cuda::SdpaShape s = ok;
    if (which == 0) s.bf16 = false;
    if (which == 1) s.doc_mask = true;
    if (which == 2) s.sinks = true;
    if (which == 3) s.alibi = true;
    // A saved lse 4 bytes off cuDNN's declared 16-byte alignment (an activation slot where B·T % 4 != 0).
    float* saved_lse = which == 4 ? lse.ptr + 1 : lse.ptr;
    INFO("variant " << which);
    CHECK_FALSE(sdpa->forward(s, o.ptr, saved_lse, q.ptr, q.ptr, q.ptr, ws.fn()));
  }
  CHECK(o.get() == std::vector<float>(n, 7.0f));
  CHECK(lse.get() == std::vector<float>(129, 7.0f));
  CHECK(sdpa->cached_graphs() == 0);
}
