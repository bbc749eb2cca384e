// cuDNN's fused SDPA for the CUDA backend's bf16 mode (exec/cuda/cudnn_attention.h).
// The one translation unit that includes the cudnn-frontend headers (heavy to
// compile): built where CMake found cuDNN and the headers, else
// cudnn_attention_absent.cpp stands in.
//
// Graphs (cudnn-frontend 1.32's graph API, docs in its graph_properties.h):
//   forward   Q (B, H, T, hd), K and V (B, kv_used, T, hd) -> O (B, H, T, hd), Stats (B, H, T, 1) fp32
//   backward  Q, K, V, O, dO, Stats -> dQ, dK, dV (deterministic algorithm: bitwise repeatable steps)
// with bf16 I/O and fp32 intermediates and compute; dims are cuDNN's (B, H, S, D)
// order, strides the backend's token-major rows (a token's heads side by side).
// Packed documents (s.segments > 0, sdpa_support.h SdpaSegments): cuDNN's batch is
// the segment bucket, S the sequence length T (no segment is longer), every
// tensor ragged (int32 offsets in elements of each segment's first token), a
// padding mask with seq_len_q = seq_len_kv = the segment lengths, and
// max_total_seq_len_q/kv = B·T (bounds the workspaces cuDNN sizes by tokens).
// Stats are then ragged token-major (B·T, H); lse_layout copies them to and
// from the own (B, H, T) lse, which stays the one saved layout.
#include "exec/cuda/cudnn_attention.h"

#include <cudnn.h>
#include <cudnn_frontend.h>

#include <array>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "exec/cuda/check.h"
#include "exec/cuda/memory.h"
#include "exec/cuda/ops.h"

namespace rackstep::exec::cuda {
namespace {

namespace fe = cudnn_frontend;

// Tensor uids of the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kSeqLen, kSeqLenKv, kOff };
// Each ragged tensor's offsets: uid kOff + the tensor's uid (one device array per row width).
constexpr int64_t off_uid(Uid t) { return kOff + t; }

// The segment table on the device, int32 (sdpa_support.h SdpaSegmentTable): length (n), then the
// ragged offsets (n + 1) of the q-wide tensors (Q, O, dO, dQ), the kv-wide ones (K, V, dK, dV) and
// the Stats (H per token), each on a 16-byte boundary.
struct DeviceSegments {
  int32_t* length = nullptr;
  int32_t* off_q = nullptr;
  int32_t* off_kv = nullptr;
  int32_t* off_stats = nullptr;
};

// The backend's token-major rows as cuDNN's (B, heads, T, hd) dims.
std::vector<int64_t> dims(int64_t B, int64_t heads, int64_t T, int64_t hd) { return {B, heads, T, hd}; }
std::vector<int64_t> rows(int64_t T, int64_t stored_heads, int64_t hd) {
  return {T * stored_heads * hd, hd, stored_heads * hd, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    std::vector<int64_t> d, std::vector<int64_t> s) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(std::move(d)).set_stride(
      std::move(s)));
}

void output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, std::vector<int64_t> d,
            std::vector<int64_t> s) {
  t->set_output(true).set_uid(uid).set_dim(std::move(d)).set_stride(std::move(s));
}

// cuDNN's int32 (n, 1, 1, 1) index tensors: segment lengths and ragged offsets.
std::shared_ptr<fe::graph::Tensor_attributes> index(fe::graph::Graph& g, const char* name, int64_t uid, int64_t n) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({n, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_data_type(fe::DataType_t::INT32));
}

// Packed documents: t ragged by its own offsets tensor (uid off_uid(uid)).
void ragged(fe::graph::Graph& g, const SdpaShape& s, const std::shared_ptr<fe::graph::Tensor_attributes>& t,
            Uid uid) {
  if (s.segments > 0) t->set_ragged_offset(index(g, "ragged_offset", off_uid(uid), s.segments + 1));
}

// The batch dim: the sequences, or the segment bucket under packed documents.
int64_t batch_dim(const SdpaShape& s) { return s.segments > 0 ? s.segments : s.B; }

// The Stats' dims and strides: (B, H, T, 1) packed BHSD, the own lse; or ragged token-major (B·T, H).
std::vector<int64_t> stats_stride(const SdpaShape& s) {
  const int64_t H = s.H, T = s.T;
  if (s.segments > 0) return {T * H, 1, H, 1};
  return {H * T, T, 1, 1};
}

// The padding mask of packed documents on either direction's attributes.
template <typename Attributes>
void documents(fe::graph::Graph& g, const SdpaShape& s, Attributes& options) {
  if (s.segments <= 0) return;
  options.set_padding_mask(true)
      .set_seq_len_q(index(g, "seq_len_q", kSeqLen, s.segments))
      .set_seq_len_kv(index(g, "seq_len_kv", kSeqLenKv, s.segments))
      .set_max_total_seq_len_q(int64_t(s.B) * s.T)
      .set_max_total_seq_len_kv(int64_t(s.B) * s.T);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Q (B, H, T, hd) and K, V (B, kv_used, T, hd) of a graph, read from the
// backend's rows (kv_stored heads per row), ragged where the shape has segments.
std::array<std::shared_ptr<fe::graph::Tensor_attributes>, 3> qkv_inputs(fe::graph::Graph& g, const SdpaShape& s) {
  const int64_t B = batch_dim(s), T = s.T, H = s.H, G = s.kv_used, D = s.hd;
  auto q = input(g, "Q", kQ, dims(B, H, T, D), rows(T, H, D));
  auto k = input(g, "K", kK, dims(B, G, T, D), rows(T, s.kv_stored, D));
  auto v = input(g, "V", kV, dims(B, G, T, D), rows(T, s.kv_stored, D));
  ragged(g, s, q, kQ);
  ragged(g, s, k, kK);
  ragged(g, s, v, kV);
  return {q, k, v};
}

std::shared_ptr<fe::graph::Graph> forward_graph(const SdpaShape& s) {
  auto g = new_graph();
  const int64_t B = batch_dim(s), T = s.T, H = s.H, D = s.hd;
  auto [q, k, v] = qkv_inputs(*g, s);
  auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(s.scale);
  options.set_causal_mask(true);
  if (s.window > 0) options.set_diagonal_band_left_bound(s.window);
  documents(*g, s, options);
  auto [o, stats] = g->sdpa(q, k, v, options);
  output(o, kO, dims(B, H, T, D), rows(T, H, D));
  output(stats, kStats, {B, H, T, 1}, stats_stride(s));
  stats->set_data_type(fe::DataType_t::FLOAT);
  ragged(*g, s, o, kO);
  ragged(*g, s, stats, kStats);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const SdpaShape& s) {
  auto g = new_graph();
  const int64_t B = batch_dim(s), T = s.T, H = s.H, G = s.kv_used, D = s.hd;
  auto [q, k, v] = qkv_inputs(*g, s);
  auto o = input(*g, "O", kO, dims(B, H, T, D), rows(T, H, D));
  auto d_o = input(*g, "dO", kDO, dims(B, H, T, D), rows(T, H, D));
  auto stats = input(*g, "Stats", kStats, {B, H, T, 1}, stats_stride(s));
  stats->set_data_type(fe::DataType_t::FLOAT);
  using Ragged = std::pair<std::shared_ptr<fe::graph::Tensor_attributes>, Uid>;
  for (const auto& [t, uid] :
       std::initializer_list<Ragged>{{o, kO}, {d_o, kDO}, {stats, kStats}}) {
    ragged(*g, s, t, uid);
  }
  auto options = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(s.scale);
  options.set_causal_mask(true);
  if (s.window > 0) options.set_diagonal_band_left_bound(s.window);
  options.set_deterministic_algorithm(true);
  documents(*g, s, options);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
  output(dq, kDQ, dims(B, H, T, D), rows(T, H, D));
  output(dk, kDK, dims(B, G, T, D), rows(T, s.kv_stored, D));
  output(dv, kDV, dims(B, G, T, D), rows(T, s.kv_stored, D));
  ragged(*g, s, dq, kDQ);
  ragged(*g, s, dk, kDK);
  ragged(*g, s, dv, kDV);
  return g;
}

// A cached graph: built (g set, its workspace) or refused (g null).
struct Entry {
  std::shared_ptr<fe::graph::Graph> g;
  int64_t workspace_bytes = 0;
};

// Consecutive 256-byte aligned bf16 tensors out of one workspace (sdpa_staging_bytes's layout).
struct Carve {
  char* at;
  __nv_bfloat16* operator()(size_t elements) {
    auto* p = reinterpret_cast<__nv_bfloat16*>(at);
    at += (elements * sizeof(__nv_bfloat16) + 255) / 256 * 256;
    return p;
  }
};

class CudnnSdpa final : public CudnnAttention {
 public:
  // Takes `handle` (cudnnCreate's, on the current device).
  CudnnSdpa(cudnnHandle_t handle, cudaStream_t stream) : stream_(stream), handle_(handle) {
    RS_CUDNN_CHECK(cudnnSetStream(handle_, stream_));
    version_ = static_cast<int64_t>(cudnnGetVersion());
  }
  ~CudnnSdpa() override {
    graphs_.clear();  // the plans before the handle they were built on
    if (handle_) cudnnDestroy(handle_);
    for (auto& [widths, table] : tables_) device_free(table.device);
  }
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  int64_t version() const override { return version_; }
  size_t cached_graphs() const override { return graphs_.size(); }

  void set_documents(const int32_t* device_doc, const int32_t* host_doc, int B, int T) override {
    doc_device_ = host_doc ? device_doc : nullptr;
    segments_ = host_doc ? sdpa_segments(host_doc, B, T) : SdpaSegments{};
    doc_B_ = B;
    doc_T_ = T;
    for (auto& [widths, table] : tables_) table.fresh = false;  // uploaded again at first use
  }

  int segments(const int32_t* device_doc, int B, int T) override {
    if (!device_doc) return 0;
    if (device_doc != doc_device_ || B != doc_B_ || T != doc_T_) {
      log_once("no host ids", "packed documents whose ids the host did not give (Backend::set_documents)");
      return 0;
    }
    if (!segments_.refusal.empty()) {
      log_once("comes back", segments_.refusal + " (further batches like it: no new line)");
      return 0;
    }
    return segments_.bucket;
  }

  bool forward(const SdpaShape& s, float* o, float* lse, const float* q, const float* k, const float* v,
               const SdpaWorkspace& workspace) override {
    if (!stats_in_place_ok(s, lse)) return false;
    const Entry* e = entry(s, false);
    if (!e) return false;
    const size_t nq = size_t(s.B) * s.T * s.H * s.hd, nkv = size_t(s.B) * s.T * s.kv_stored * s.hd;
    const size_t staging = sdpa_staging_bytes(s, false);
    auto* base = static_cast<char*>(workspace(staging + static_cast<size_t>(e->workspace_bytes)));
    Carve take{base};
    __nv_bfloat16 *q16 = take(nq), *o16 = take(nq), *k16 = take(nkv), *v16 = take(nkv);
    to_bf16(q16, q, nq, stream_);
    to_bf16(k16, k, nkv, stream_);
    to_bf16(v16, v, nkv, stream_);
    if (s.segments > 0) {  // cuDNN's ragged (B·T, H) Stats, then the own (B, H, T) lse
      auto* stats = reinterpret_cast<float*>(take.at);
      run_forward(*e, o16, stats, q16, k16, v16, base + staging, device_segments(s));
      lse_layout(lse, stats, s.B, s.T, s.H, true, stream_);
    } else {
      run_forward(*e, o16, lse, q16, k16, v16, base + staging, nullptr);
    }
    bf16_to_float(o, o16, nq, false, stream_);
    return true;
  }

  bool backward(const SdpaShape& s, float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                const float* v, const float* o, const float* lse, bool accumulate_dkv,
                const SdpaWorkspace& workspace) override {
    if (!stats_in_place_ok(s, lse)) return false;
    const Entry* e = entry(s, true);
    if (!e) return false;
    const size_t nq = size_t(s.B) * s.T * s.H * s.hd, nkv = size_t(s.B) * s.T * s.kv_stored * s.hd;
    const size_t staging = sdpa_staging_bytes(s, true);
    auto* base = static_cast<char*>(workspace(staging + static_cast<size_t>(e->workspace_bytes)));
    Carve take{base};
    __nv_bfloat16 *q16 = take(nq), *o16 = take(nq), *do16 = take(nq), *dq16 = take(nq);
    __nv_bfloat16 *k16 = take(nkv), *v16 = take(nkv), *dk16 = take(nkv), *dv16 = take(nkv);
    to_bf16(q16, q, nq, stream_);
    to_bf16(k16, k, nkv, stream_);
    to_bf16(v16, v, nkv, stream_);
    to_bf16(o16, o, nq, stream_);
    to_bf16(do16, dout, nq, stream_);
    if (s.kv_used < s.kv_stored) {  // cuDNN writes the read heads only: the rest are zero gradients
      RS_CUDA_CHECK(cudaMemsetAsync(dk16, 0, nkv * sizeof(__nv_bfloat16), stream_));
      RS_CUDA_CHECK(cudaMemsetAsync(dv16, 0, nkv * sizeof(__nv_bfloat16), stream_));
    }
    if (s.segments > 0) {  // the own (B, H, T) lse as cuDNN's ragged (B·T, H) Stats
      auto* stats = reinterpret_cast<float*>(take.at);
      lse_layout(stats, lse, s.B, s.T, s.H, false, stream_);
      run_backward(*e, dq16, dk16, dv16, do16, q16, k16, v16, o16, stats, base + staging, device_segments(s));
    } else {
      run_backward(*e, dq16, dk16, dv16, do16, q16, k16, v16, o16, lse, base + staging, nullptr);
    }
    bf16_to_float(dq, dq16, nq, false, stream_);
    bf16_to_float(dk, dk16, nkv, accumulate_dkv, stream_);
    bf16_to_float(dv, dv16, nkv, accumulate_dkv, stream_);
    return true;
  }

  bool forward_bf16(const SdpaShape& s, __nv_bfloat16* o, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                    const __nv_bfloat16* v, const SdpaWorkspace& workspace) override {
    if (s.doc_mask) return false;
    const Entry* e = entry(s, false);
    if (!e) return false;
    run_forward(*e, o, lse, q, k, v, workspace(static_cast<size_t>(e->workspace_bytes)), nullptr);
    return true;
  }

  bool backward_bf16(const SdpaShape& s, __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                     const __nv_bfloat16* dout, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                     const __nv_bfloat16* o, const float* lse, const SdpaWorkspace& workspace) override {
    if (s.doc_mask) return false;
    const Entry* e = entry(s, true);
    if (!e) return false;
    run_backward(*e, dq, dk, dv, dout, q, k, v, o, lse, workspace(static_cast<size_t>(e->workspace_bytes)), nullptr);
    return true;
  }

 private:
  // The shape's graph, built at its first call; nullptr where the host rule or cuDNN refuses it.
  const Entry* entry(const SdpaShape& s, bool backward) {
    if (const std::string why = sdpa_refusal(s, version_); !why.empty()) {
      // The fp32 mode is the parity mode by design: nothing to say. Other refusals: one line per reason.
      if (s.bf16) log_once(why, why);
      return nullptr;
    }
    // A segment table is read by the shape's graph: it must be the current batch's, of that bucket.
    if (s.doc_mask && (s.doc != doc_device_ || s.B != doc_B_ || s.T != doc_T_ || s.segments != segments_.bucket ||
                       !segments_.refusal.empty())) {
      log_once("stale table", "packed documents whose segment table is not the current batch's");
      return nullptr;
    }
    const auto key = std::tuple_cat(std::make_tuple(backward), s.key());
    auto it = graphs_.find(key);
    if (it == graphs_.end()) it = graphs_.emplace(key, build(s, backward)).first;
    return it->second.g ? &it->second : nullptr;
  }

  // Without packed documents cuDNN reads and writes the saved lse in place as its Stats, which it is
  // told are 16-byte aligned; a saved lse that is not stays with the own kernel (forward and backward alike).
  bool stats_in_place_ok(const SdpaShape& s, const float* lse) {
    if (s.doc_mask || sdpa_aligned(lse)) return true;
    if (s.bf16) log_once("lse alignment", "a saved lse that is not 16-byte aligned (B·T not a multiple of 4)");
    return false;
  }

  // One line per reason (`key`) for the backend's life.
  void log_once(const std::string& key, const std::string& why) {
    if (!logged_.insert(key).second) return;
    std::fprintf(stderr, "rackstep: cuda attention: cuDNN SDPA not used (%s); the own kernel runs it\n",
                 why.c_str());
  }

  // The current batch's segment table on the device for s's row widths, uploaded at its first
  // use in the batch (one upload per batch and width; the layers of a model share one).
  const DeviceSegments* device_segments(const SdpaShape& s) {
    const int64_t wq = int64_t(s.H) * s.hd, wkv = int64_t(s.kv_stored) * s.hd;
    Table& table = tables_[std::make_tuple(wq, wkv, int64_t(s.H))];
    if (table.fresh) return &table.view;
    table.host = sdpa_segment_table(segments_, wq, wkv, s.H);
    const std::vector<int32_t>& host = table.host.data;
    if (host.size() > table.capacity) {
      device_free(table.device);  // waits for the device: only when the bucket grows
      device_malloc(&table.device, host.size() * sizeof(int32_t));
      table.capacity = host.size();
    }
    // Stream-ordered after the previous batch's calls that read the table; `host` outlives the copy.
    RS_CUDA_CHECK(cudaMemcpyAsync(table.device, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  stream_));
    table.view = {.length = table.device + table.host.length,
                  .off_q = table.device + table.host.off_q,
                  .off_kv = table.device + table.host.off_kv,
                  .off_stats = table.device + table.host.off_stats};
    table.fresh = true;
    return &table.view;
  }

  Entry build(const SdpaShape& s, bool backward) {
    Entry e;
    std::string why;
    try {
      auto g = backward ? backward_graph(s) : forward_graph(s);
      // Each step's first failure is the reason: validate, lower, heuristics, support, plan build.
      fe::error_t status = g->validate();
      if (status.is_good()) status = g->build_operation_graph(handle_);
      if (status.is_good()) status = g->create_execution_plans({fe::HeurMode_t::A});
      if (status.is_good()) status = g->check_support(handle_);
      if (status.is_good()) status = g->build_plans(handle_);
      if (status.is_good()) status = g->get_workspace_size(e.workspace_bytes);
      if (status.is_good()) {
        e.g = std::move(g);
        return e;
      }
      why = status.get_message();
    } catch (const std::exception& ex) {  // the frontend throws for some misuses and load failures
      why = ex.what();
    }
    std::fprintf(stderr,
                 "rackstep: cuda attention: cuDNN %lld refused the SDPA %s graph (B %d, T %d, H %d, kv %d/%d, hd %d, "
                 "window %d, document segments %d): %s; the own kernel runs it\n",
                 static_cast<long long>(version_), backward ? "backward" : "forward", s.B, s.T, s.H, s.kv_used,
                 s.kv_stored, s.hd, s.window, s.segments, why.c_str());
    return e;
  }

  // The variant packs: cuDNN takes non-const pointers for inputs too.
  void run_forward(const Entry& e, __nv_bfloat16* o, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                   const __nv_bfloat16* v, void* workspace, const DeviceSegments* seg) {
    std::unordered_map<int64_t, void*> pack = {
        {kQ, const_cast<__nv_bfloat16*>(q)}, {kK, const_cast<__nv_bfloat16*>(k)},
        {kV, const_cast<__nv_bfloat16*>(v)}, {kO, o}, {kStats, lse}};
    if (seg) add_segments(pack, *seg, {kQ, kO}, {kK, kV});
    execute(e, pack, workspace);
  }
  // Packed documents: the lengths and each ragged tensor's offsets.
  static void add_segments(std::unordered_map<int64_t, void*>& pack, const DeviceSegments& seg,
                           std::initializer_list<Uid> q_wide, std::initializer_list<Uid> kv_wide) {
    pack[kSeqLen] = seg.length;
    pack[kSeqLenKv] = seg.length;
    for (const Uid t : q_wide) pack[off_uid(t)] = seg.off_q;
    for (const Uid t : kv_wide) pack[off_uid(t)] = seg.off_kv;
    pack[off_uid(kStats)] = seg.off_stats;
  }
  void run_backward(const Entry& e, __nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                    const __nv_bfloat16* dout, const __nv_bfloat16* q, const __nv_bfloat16* k,
                    const __nv_bfloat16* v, const __nv_bfloat16* o, const float* lse, void* workspace,
                    const DeviceSegments* seg) {
    std::unordered_map<int64_t, void*> pack = {
        {kQ, const_cast<__nv_bfloat16*>(q)},     {kK, const_cast<__nv_bfloat16*>(k)},
        {kV, const_cast<__nv_bfloat16*>(v)},     {kO, const_cast<__nv_bfloat16*>(o)},
        {kDO, const_cast<__nv_bfloat16*>(dout)}, {kStats, const_cast<float*>(lse)},
        {kDQ, dq},                               {kDK, dk},
        {kDV, dv}};
    if (seg) add_segments(pack, *seg, {kQ, kO, kDO, kDQ}, {kK, kV, kDK, kDV});
    execute(e, pack, workspace);
  }

  void execute(const Entry& e, std::unordered_map<int64_t, void*>& pack, void* workspace) {
    fe::error_t status = e.g->execute(handle_, pack, workspace);
    if (!status.is_good()) {
      fail_call("cuDNN", "cudnn_frontend::graph::Graph::execute(handle, pack, workspace)", status.get_message().c_str(),
                __FILE__, __LINE__);
    }
  }

  cudaStream_t stream_;
  cudnnHandle_t handle_ = nullptr;
  int64_t version_ = 0;
  std::map<std::tuple<bool, int, int, int, int, int, int, int, uint32_t, int>, Entry> graphs_;
  std::set<std::string> logged_;
  // Packed documents: the current batch's segments (set_documents) and their device tables,
  // one per (q row, kv row, Stats row) width in elements.
  struct Table {
    int32_t* device = nullptr;
    size_t capacity = 0;        // int32s allocated
    SdpaSegmentTable host;      // the last upload's source (sdpa_support.h: each array 16-byte aligned)
    DeviceSegments view;
    bool fresh = false;  // uploaded for the current batch
  };
  const int32_t* doc_device_ = nullptr;
  int doc_B_ = 0, doc_T_ = 0;
  SdpaSegments segments_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Table> tables_;
};

}  // namespace

std::unique_ptr<CudnnAttention> make_cudnn_attention(cudaStream_t stream) {
  // A cuDNN that does not start (no device, a library or sub-library that does not load, a driver
  // too old for it) leaves every attention to the own kernel rather than ending the run.
  cudnnHandle_t handle = nullptr;
  if (const cudnnStatus_t status = cudnnCreate(&handle); status != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "rackstep: cuda attention: cuDNN did not start (cudnnCreate: %s); the own kernel runs every "
                 "attention\n", cudnnGetErrorString(status));
    return nullptr;
  }
  return std::make_unique<CudnnSdpa>(handle, stream);
}

}  // namespace rackstep::exec::cuda
