// The CUDA backend (exec/cuda/backend.h): one forward and one backward per
// OpKind, each a few calls of the exec/cuda/ kernels on the backend's stream.
// Bindings and the gradient rule are exec/backend.h's; where a kernel writes
// an input gradient with "=" and the op must add (Bound::accumulate), the
// result is staged in scratch and added, as the CPU backend does.
#include "exec/cuda/backend.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "exec/cuda/check.h"
#include "exec/cuda/cudnn_attention.h"
#if defined(RACKSTEP_HAVE_NCCL)
#include "exec/cuda/comm.h"
#include "exec/cuda/experts.h"
#endif
#include "exec/cuda/detail.h"
#include "exec/cuda/gemm.h"
#include "exec/cuda/layers.h"
#include "exec/cuda/memory.h"
#include "exec/cuda/moe.h"
#include "exec/cuda/op_timing.h"
#include "exec/cuda/ops.h"
#include "exec/cuda/optimizer.h"
#include "exec/dist.h"
#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {

using models::OpKind;

namespace {

class DeviceBuffer final : public Buffer {
 public:
  // Zero-filled on `stream`, so the fill is ordered before the backend's work on it.
  DeviceBuffer(size_t bytes, cudaStream_t stream) : bytes_(bytes) {
    device_malloc(&data_, bytes);  // counted: the profile's peak_device_bytes (exec/cuda/memory.h)
    RS_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes, stream));
  }
  ~DeviceBuffer() override { device_free(data_); }  // cudaFree waits for the device's work
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Device scratch that grows on demand; the old allocation is freed in stream
// order, after the work already queued on it.
class Scratch {
 public:
  ~Scratch() { device_free(data_); }
  void* get(size_t bytes, cudaStream_t stream) {
    if (bytes <= bytes_) return data_;
    device_free_async(data_, stream);
    device_malloc_async(&data_, bytes, stream);
    bytes_ = bytes;
    return data_;
  }
  float* floats(size_t n, cudaStream_t stream) { return static_cast<float*>(get(n * sizeof(float), stream)); }
  double* doubles(size_t n, cudaStream_t stream) { return static_cast<double*>(get(n * sizeof(double), stream)); }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

RouterKind router_kind(const models::ModelConfig& m) {
  return m.moe.router == models::RouterKind::kSoftmax ? RouterKind::kSoftmax : RouterKind::kSigmoid;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() : stream_(make_stream()), gemm_(stream_) {}
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }

  std::unique_ptr<Buffer> allocate(size_t bytes) override { return std::make_unique<DeviceBuffer>(bytes, stream_); }
  void copy_to_backend(void* dst, const void* host_src, size_t bytes) override {
    RS_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    RS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host buffer may change after the call
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    RS_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    RS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  bool uses_host_memory() const override { return false; }
  // The bf16 mode's cuDNN attention maps packed documents to ragged segments (exec/cuda/sdpa_support.h).
  void set_documents(const int32_t* device_doc, const int32_t* host_doc, int64_t B, int64_t T) override {
    if (CudnnAttention* fused = sdpa()) fused->set_documents(device_doc, host_doc, int(B), int(T));
  }
  void synchronize() override { RS_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  // The profiler's clock: events on this stream, read once per step (exec/cuda/op_timing.h).
  std::unique_ptr<OpTiming> make_op_timing() override { return make_event_timing(stream_); }
  // Every allocation of exec/cuda/ is counted (exec/cuda/memory.h).
  std::optional<DeviceMemory> device_memory() const override { return device_memory_report(); }
  // Resident training: the optimizer on this stream and this GEMM engine (exec/cuda/optimizer.h).
  std::unique_ptr<BackendOptimizer> make_optimizer(const OptimizerConfig& config,
                                                   std::shared_ptr<const ArenaLayout> layout) override {
    return make_device_optimizer(stream_, config, std::move(layout));
  }
  // Data parallel on the device: NCCL where this backend was built with it.
  std::unique_ptr<BackendCollectives> make_collectives(const Comm& ranks, const std::vector<int64_t>& offsets,
                                                       const std::vector<int64_t>& counts, std::string& why) override {
#if defined(RACKSTEP_HAVE_NCCL)
    why.clear();
    return make_nccl_collectives(ranks, offsets, counts, stream_);
#else
    (void)ranks, (void)offsets, (void)counts;
    why = "NCCL (this CUDA backend was built without it: its ranks reduce host copies over MPI)";
    return nullptr;
#endif
  }
  // Expert parallel on the device: NCCL where this backend was built with it
  // (exec/cuda/experts.h), computing on this stream with this GEMM engine.
  std::unique_ptr<ExpertBackend> make_experts(Comm group, const sim::DispatchConfig& config,
                                              const ExpertTransportOptions& options, std::string& why) override {
#if defined(RACKSTEP_HAVE_NCCL)
    why.clear();
    return make_nccl_experts(std::move(group), config, options, gemm_);
#else
    (void)group, (void)config, (void)options;
    why = "NCCL (this CUDA backend was built without it: expert parallelism on the GPU exchanges rows with NCCL)";
    return nullptr;
#endif
  }
  // bf16: every GEMM of the op set rounds its operands to bf16 (exec/cuda/gemm.h);
  // the optimizer's Newton–Schulz keeps its own fp32 GEMMs.
  std::string set_precision(const std::string& precision) override {
    if (precision != "fp32" && precision != "bf16") return "fp32 or bf16 (the cuda backend's precisions)";
    gemm_.set_bf16_operands(precision == "bf16");
    return "";
  }

  OpResult forward(const OpCall& c) override;
  void backward(const OpCall& c) override;
  // kTopK under aux-loss balancing, after its forward (exec/backend.h).
  double aux_loss(const OpCall& c) override {
    RS_CHECK(c.op->kind == OpKind::kTopK && c.routing, "aux_loss is kTopK's under aux-loss balancing: " + c.op->name);
    const Routing& rt = *c.routing;
    const int N = static_cast<int>(c.N);
    return aux_loss_forward(c.in[0].value, rt.expert, N, rt.E, rt.k, router_kind(*c.model),
                            static_cast<float>(c.model->moe.aux_loss_weight),
                            doubles_.doubles(router_loss_work_doubles(N, rt.E), stream_), stream_, rt.counts,
                            rt.count_tokens);
  }

  void copy_columns(float* y, int64_t wy, const float* x, int64_t wx, int64_t rows, bool accumulate) override {
    cuda::copy_columns(y, wy, x, wx, rows, accumulate, stream_);
  }
  void assemble_key(float* k, const float* k_nope, const float* k_rope, int64_t N, int64_t H, int64_t hd,
                    int64_t r) override {
    cuda::assemble_key(k, k_nope, k_rope, N, H, hd, r, stream_);
  }
  void split_key_grad(float* dk_nope, bool acc_nope, float* dk_rope, bool acc_rope, const float* dk, int64_t N,
                      int64_t H, int64_t hd, int64_t r) override {
    cuda::split_key_grad(dk_nope, acc_nope, dk_rope, acc_rope, dk, N, H, hd, r, stream_);
  }
  void fill_zero(float* x, int64_t n) override {
    RS_CUDA_CHECK(cudaMemsetAsync(x, 0, sizeof(float) * static_cast<size_t>(n), stream_));
  }
  bool all_finite(const float* x, int64_t n) override { return cuda::all_finite(x, static_cast<size_t>(n), stream_); }
  void update_balancing_bias(float* bias, int64_t* hist, int E, int k, int bins, float lo, float hi) override {
    qb_bias_from_histogram(bias, hist, E, k, bins, lo, hi, stream_);
    RS_CUDA_CHECK(cudaMemsetAsync(hist, 0, sizeof(int64_t) * size_t(E) * size_t(bins), stream_));
  }

 private:
  static cudaStream_t make_stream() {
    cudaStream_t s = nullptr;
    RS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }

  // Where a backward writes an input's gradient: the gradient itself ("="),
  // or staging that grad_done adds into it ("+=").
  float* grad_dst(const OpCall& c, const Bound& b, int staging) {
    if (!b.accumulate) return b.grad;
    return stage_[staging].floats(size_t(c.N) * size_t(b.width), stream_);
  }
  void grad_done(const OpCall& c, const Bound& b, int staging) {
    if (!b.accumulate) return;
    add_inplace(b.grad, stage_[staging].floats(size_t(c.N) * size_t(b.width), stream_), size_t(c.N) * size_t(b.width),
                stream_);
  }
  void zero_if_first(const OpCall& c, const Bound& b) {
    if (b.accumulate) return;
    fill_zero(b.grad, c.N * b.width);
  }
  // ALiBi slopes of an attention with `heads` query heads, on the device: the
  // CPU backend's values (models::alibi_slopes rounded to float), uploaded at
  // the first attention that asks for them and kept for the backend's life.
  const float* alibi_slopes(int64_t heads) {
    std::unique_ptr<DeviceBuffer>& slopes = alibi_slopes_[heads];
    if (!slopes) {
      std::vector<float> host;  // (heads)
      for (const double v : models::alibi_slopes(heads)) host.push_back(static_cast<float>(v));
      slopes = std::make_unique<DeviceBuffer>(sizeof(float) * host.size(), stream_);
      copy_to_backend(slopes->data(), host.data(), sizeof(float) * host.size());
    }
    return static_cast<const float*>(slopes->data());
  }
  // cuDNN's fused attention where this build has it, made at the first attention of the bf16 mode
  // (cuDNN's libraries load then); nullptr: the own kernel runs every attention.
  CudnnAttention* sdpa() {
    if (!gemm_.bf16_operands()) return nullptr;  // the fp32 (parity) mode keeps the own kernel
    if (!sdpa_made_) {
      sdpa_ = make_cudnn_attention(stream_);
      sdpa_made_ = true;
    }
    return sdpa_.get();
  }
  SdpaShape sdpa_shape(const OpCall& c) {
    const models::Op& op = *c.op;
    const auto qk = static_cast<int>(op.qk_head_dim);
    const int segments = c.doc && sdpa_ ? sdpa_->segments(c.doc, int(c.B), int(c.T)) : 0;
    return {.B = static_cast<int>(c.B), .T = static_cast<int>(c.T), .H = static_cast<int>(op.heads),
            .kv_stored = static_cast<int>(c.in[1].width) / qk, .kv_used = static_cast<int>(op.kv_heads), .hd = qk,
            .window = static_cast<int>(op.window), .scale = 1.0f / std::sqrt(static_cast<float>(qk)),
            .doc_mask = c.doc != nullptr, .doc = c.doc, .segments = segments, .sinks = op.sinks, .alibi = op.alibi,
            .bf16 = gemm_.bf16_operands()};
  }
  SdpaWorkspace sdpa_workspace() {
    return [this](size_t bytes) { return sdpa_work_.get(bytes, stream_); };
  }
  // Expert e's rows, on the host: the per-expert GEMM sizes.
  const int32_t* host_offsets(const Routing& r) {
    offsets_.resize(size_t(r.E) + 1);
    copy_to_host(offsets_.data(), r.offsets, sizeof(int32_t) * offsets_.size());
    return offsets_.data();
  }

  cudaStream_t stream_;
  Gemm gemm_;
  Scratch stage_[2];  // input-gradient staging
  Scratch work_;      // kernel workspaces (floats)
  Scratch doubles_;   // loss row terms, router-loss work
  Scratch bytes_;     // grouping (CUB)
  std::vector<int32_t> offsets_;
  std::map<int64_t, std::unique_ptr<DeviceBuffer>> alibi_slopes_;  // heads -> (heads) slopes
  std::unique_ptr<CudnnAttention> sdpa_;  // see sdpa()
  bool sdpa_made_ = false;
  Scratch sdpa_work_;  // its bf16 copies and cuDNN's workspace
};

OpResult CudaBackend::forward(const OpCall& c) {
  const models::Op& op = *c.op;
  const models::ModelConfig& m = *c.model;
  if (const Unsupported u = unsupported(op, m); !u.json_path.empty()) {
    throw UserError(m.source_file, u.json_path, u.expected, u.found);
  }
  const cudaStream_t s = stream_;
  const int N = static_cast<int>(c.N), B = static_cast<int>(c.B), T = static_cast<int>(c.T);
  const auto eps = static_cast<float>(m.norm.eps);
  const auto H = static_cast<int>(op.heads);
  const auto qk = static_cast<int>(op.qk_head_dim);
  const Bound &in0 = c.in[0], &in1 = c.in[1], &in2 = c.in[2], &out0 = c.out[0], &out1 = c.out[1];
  const auto w = [](const Bound& b) { return static_cast<int>(b.width); };
  OpResult r;
  switch (op.kind) {
    case OpKind::kEmbedding:  // tokens (N) -> (N, d) [+ the learned position table's row of each token]
      embedding_forward<float>(out0.value, c.tokens, c.w[0], N, w(out0), s);
      if (c.w[1]) position_embedding_forward<float>(out0.value, c.pos, c.w[1], N, w(out0), s);
      return r;
    case OpKind::kRmsNorm:  // (N, width) -> (N, width)
      if (m.norm.kind == models::NormKind::kLayerNorm) {
        layernorm_forward<float>(out0.value, c.saved[0].value, in0.value, c.w[0], eps, N, w(in0), s);
        return r;
      }
      rmsnorm_forward<float>(out0.value, c.saved[0].value, in0.value, c.w[0], 1.0f, eps, N, w(in0), s);
      return r;
    case OpKind::kGatedNorm:  // x (N, d) -> x · σ(silu(x W_down) W_up)
      gated_norm_forward(gemm_, out0.value, c.saved[0].value, c.saved[1].value, in0.value, c.w[0], c.w[1],
                         work_.floats(size_t(N) * size_t(c.saved[0].width), s), N, w(in0), w(c.saved[0]));
      return r;
    case OpKind::kLinear:  // (N, in) -> (N, out) [+ bias (out)]
      linear_forward(gemm_, out0.value, in0.value, c.w[0], N, w(in0), w(out0));
      if (c.w[1]) detail::add_bias_rows(out0.value, c.w[1], N, w(out0), s);
      return r;
    case OpKind::kSConv:  // (B, T, C), causal inside each document
      sconv_forward(out0.value, in0.value, c.w[0], c.doc, B, T, w(in0), static_cast<int>(m.sconv.kernel), s);
      return r;
    case OpKind::kQkNorm: {  // q (N, H, qk), k (N, kv, qk): RMS per head times the multiplier
      const auto mult = static_cast<float>(m.attention.qk_norm_multiplier);
      rmsnorm_forward<float>(out0.value, c.saved[0].value, in0.value, nullptr, mult, eps, N * (w(in0) / qk), qk, s);
      rmsnorm_forward<float>(out1.value, c.saved[1].value, in1.value, nullptr, mult, eps, N * (w(in1) / qk), qk, s);
      return r;
    }
    case OpKind::kRope: {  // the leading rot_dims of each q/k head rotated (YaRN's frequencies and scale if set)
      const auto theta = static_cast<float>(m.attention.rope_theta);
      const std::optional<RopeYarn> yarn = rope_yarn_of(c);
      const RopeYarn* yarn_ptr = yarn ? &*yarn : nullptr;
      rope_apply<float>(out0.value, in0.value, c.pos, N, w(in0) / qk, qk, c.rot_dims, theta, 1.0f, s, yarn_ptr);
      rope_apply<float>(out1.value, in1.value, c.pos, N, w(in1) / qk, qk, c.rot_dims, theta, 1.0f, s, yarn_ptr);
      return r;
    }
    case OpKind::kAttention:  // q (N, H, qk), k and v (N, kv, qk) -> (N, H, qk); lse (B, H, T)
      if (CudnnAttention* fused = sdpa();
          fused && fused->forward(sdpa_shape(c), out0.value, c.saved[0].value, in0.value, in1.value, in2.value,
                                  sdpa_workspace())) {
        return r;
      }
      attention_forward<float>(out0.value, c.saved[0].value, in0.value, in1.value, in2.value, c.doc, B, T, H,
                               w(in1) / qk, static_cast<int>(op.kv_heads), qk, static_cast<int>(op.window),
                               1.0f / std::sqrt(static_cast<float>(qk)), s, op.sinks ? c.w[0] : nullptr,
                               op.alibi ? alibi_slopes(op.heads) : nullptr);
      return r;
    case OpKind::kXsa: {  // o (N, H, hd), v (N, kv, hd)
      const int hd = w(in0) / H;
      xsa_forward(out0.value, in0.value, in1.value, N, H, w(in1) / hd, static_cast<int>(op.kv_heads), hd, kXsaEps, s);
      return r;
    }
    case OpKind::kAttnGate:  // o (N, H, hd), x (N, d) -> o · 2σ(x W_gate) per head
      attn_gate_forward(gemm_, out0.value, c.saved[0].value, in0.value, in1.value, c.w[0], N, w(in1), H, w(in0) / H);
      return r;
    case OpKind::kRouter: {  // x (N, d) -> logits (N, E)
      const int E = w(out0);
      linear_forward(gemm_, out0.value, in0.value, c.w[0], N, w(in0), E);
      r.router_z = router_z_loss(out0.value, N, E, doubles_.doubles(router_loss_work_doubles(N, E), s), s);
      if (c.training && c.routing && c.routing->hist) {
        qb_histogram(c.routing->hist, out0.value, N, E, static_cast<int>(m.moe.balancing_bins), kQbLo, kQbHi, s);
      }
      return r;
    }
    case OpKind::kTopK: {  // logits (N, E) -> weights (N, k); experts, threshold into the routing state
      Routing& rt = *c.routing;
      router_forward(rt.expert, out0.value, rt.threshold, in0.value, rt.bias, N, rt.E, rt.k, router_kind(m),
                     static_cast<float>(m.moe.routing_weight_sum), s);
      return r;
    }
    case OpKind::kDispatch: {  // x (N, L) -> rows (N*k, L) grouped by expert
      Routing& rt = *c.routing;
      const int A = N * rt.k;
      group_by_expert(rt.sorted_pos, rt.offsets, rt.expert, A, rt.E, bytes_.get(group_by_expert_scratch_bytes(A), s),
                      s);
      gather_forward(out0.value, in0.value, rt.sorted_pos, N, rt.k, rt.L, s);
      return r;
    }
    case OpKind::kExpertMlp: {  // rows (N*k, L) through their experts' SwiGLU
      const Routing& rt = *c.routing;
      experts_forward(gemm_, out0.value, c.saved[0].value, c.saved[1].value, c.saved[2].value, in0.value,
                      host_offsets(rt), rt.keep, c.w[0], c.w[1], c.w[2], N * rt.k, rt.E, rt.L, rt.F,
                      expert_options(c));
      return r;
    }
    case OpKind::kCombine: {  // rows (N*k, L), weights (N, k) -> (N, L)
      const Routing& rt = *c.routing;
      combine_forward(out0.value, in0.value, in1.value, rt.sorted_pos, N, rt.k, rt.L, s);
      return r;
    }
    case OpKind::kSharedMlp:  // x (N, d) [, routed (N, d)] -> MLP(x) [+ routed]; SwiGLU, GeLU or ReLU², [biases]
      dense_mlp_forward(gemm_, out0.value, c.saved[0].value, c.saved[1].value, c.saved[2].value, in0.value,
                        mlp_weights(c), mlp_activation(op), N, w(in0), w(c.saved[0]));
      if (in1.value) add_inplace(out0.value, in1.value, size_t(N) * size_t(out0.width), s);
      return r;
    case OpKind::kResidualAdd:
      residual_forward<float>(out0.value, in0.value, in1.value, size_t(N) * size_t(out0.width), s);
      return r;
    case OpKind::kLmHead:  // (N, d) -> logits (N, V)
      if (c.tied) {
        linear_t_forward(gemm_, out0.value, in0.value, c.w[0], N, w(in0), w(out0));
        return r;
      }
      linear_forward(gemm_, out0.value, in0.value, c.w[0], N, w(in0), w(out0));
      return r;
    case OpKind::kCrossEntropy: {  // logits (N, V), targets -> mean CE + logit z-loss
      const CrossEntropySums sums = cross_entropy_forward<float>(
          c.saved[0].value, doubles_.doubles(2 * size_t(N), s), in0.value, c.targets, N, w(in0),
          static_cast<float>(m.logit_z_loss_weight), c.loss_tokens, s);
      r.ce = sums.ce;
      r.z_loss = sums.z_loss;
      return r;
    }
  }
  RS_CHECK(false, "cuda backend: an OpKind without a forward: " + op.name);
  return r;
}

void CudaBackend::backward(const OpCall& c) {
  const models::Op& op = *c.op;
  const models::ModelConfig& m = *c.model;
  const cudaStream_t s = stream_;
  const int N = static_cast<int>(c.N), B = static_cast<int>(c.B), T = static_cast<int>(c.T);
  const auto H = static_cast<int>(op.heads);
  const auto qk = static_cast<int>(op.qk_head_dim);
  const Bound &in0 = c.in[0], &in1 = c.in[1], &in2 = c.in[2], &out0 = c.out[0], &out1 = c.out[1];
  const auto w = [](const Bound& b) { return static_cast<int>(b.width); };
  switch (op.kind) {
    case OpKind::kCrossEntropy: {
      float* dl = grad_dst(c, in0, 0);
      cross_entropy_backward<float>(dl, in0.value, c.saved[0].value, c.targets, N, w(in0),
                                    static_cast<float>(m.logit_z_loss_weight), c.loss_tokens, s);
      grad_done(c, in0, 0);
      return;
    }
    case OpKind::kLmHead:
      if (c.tied) {
        linear_t_backward(gemm_, in0.grad, c.dw[0], out0.grad, in0.value, c.w[0], N, w(in0), w(out0), in0.accumulate);
        return;
      }
      linear_backward(gemm_, in0.grad, c.dw[0], out0.grad, in0.value, c.w[0], N, w(in0), w(out0), in0.accumulate);
      return;
    case OpKind::kResidualAdd: {  // the residual stream accumulates into both inputs
      zero_if_first(c, in0);
      zero_if_first(c, in1);
      const size_t n = size_t(N) * size_t(out0.width);
      add_inplace(in0.grad, out0.grad, n, s);
      add_inplace(in1.grad, out0.grad, n, s);
      return;
    }
    case OpKind::kSharedMlp:
      if (in1.grad) {
        zero_if_first(c, in1);
        add_inplace(in1.grad, out0.grad, size_t(N) * size_t(out0.width), s);
      }
      dense_mlp_backward(gemm_, in0.grad, mlp_grads(c), out0.grad, in0.value, c.saved[0].value, c.saved[1].value,
                         c.saved[2].value, mlp_weights(c), mlp_activation(op),
                         work_.floats(dense_mlp_scratch_floats(N, w(c.saved[0])), s), N, w(in0), w(c.saved[0]),
                         in0.accumulate);
      return;
    case OpKind::kCombine: {
      const Routing& rt = *c.routing;
      float* dys = grad_dst(c, in0, 0);
      float* dweight = grad_dst(c, in1, 1);
      combine_backward(dys, dweight, out0.grad, in0.value, in1.value, rt.sorted_pos, N, rt.k, rt.L, s);
      grad_done(c, in0, 0);
      grad_done(c, in1, 1);
      return;
    }
    case OpKind::kExpertMlp: {
      const Routing& rt = *c.routing;
      const int A = N * rt.k;
      float* dxs = grad_dst(c, in0, 0);
      experts_backward(gemm_, dxs, c.dw[0], c.dw[1], c.dw[2], out0.grad, in0.value, c.saved[0].value,
                       c.saved[1].value, c.saved[2].value, host_offsets(rt), rt.keep, c.w[0], c.w[1], c.w[2],
                       work_.floats(experts_scratch_floats(A, rt.L, rt.F), s), A, rt.E, rt.L, rt.F,
                       expert_options(c));
      grad_done(c, in0, 0);
      return;
    }
    case OpKind::kDispatch: {
      const Routing& rt = *c.routing;
      float* dx = grad_dst(c, in0, 0);
      gather_backward(dx, out0.grad, rt.sorted_pos, N, rt.k, rt.L, s);
      grad_done(c, in0, 0);
      zero_if_first(c, in1);  // the weights only order drops: no gradient, but the slot's must exist
      return;
    }
    case OpKind::kTopK: {
      const Routing& rt = *c.routing;
      float* dl = grad_dst(c, in0, 0);
      router_backward(dl, out0.grad, out0.value, rt.expert, in0.value, N, rt.E, rt.k, router_kind(m),
                      static_cast<float>(m.moe.routing_weight_sum), s);
      grad_done(c, in0, 0);
      if (m.moe.balancing == models::BalancingKind::kAuxLoss) {
        aux_loss_backward(in0.grad, in0.value, rt.expert, N, rt.E, rt.k, router_kind(m),
                          static_cast<float>(m.moe.aux_loss_weight),
                          doubles_.doubles(router_loss_work_doubles(N, rt.E), s), s, rt.counts, rt.count_tokens);
      }
      return;
    }
    case OpKind::kRouter: {
      const int E = w(out0);
      if (m.moe.router_z_loss_applied) {
        router_z_loss_backward(out0.grad, out0.value, N, E,
                               static_cast<float>(m.moe.router_z_loss_weight * c.routing->loss_share), s);
      }
      linear_backward(gemm_, in0.grad, c.dw[0], out0.grad, in0.value, c.w[0], N, w(in0), E, in0.accumulate);
      return;
    }
    case OpKind::kAttnGate: {
      float* d_o = grad_dst(c, in0, 0);
      attn_gate_backward(gemm_, d_o, in1.grad, c.dw[0], out0.grad, in0.value, in1.value, c.saved[0].value, c.w[0],
                         work_.floats(size_t(N) * size_t(H), s), N, w(in1), H, w(in0) / H, in1.accumulate);
      grad_done(c, in0, 0);
      return;
    }
    case OpKind::kXsa: {
      const int hd = w(in0) / H;
      float* d_o = grad_dst(c, in0, 0);
      zero_if_first(c, in1);
      xsa_backward(d_o, in1.grad, out0.grad, in0.value, in1.value, N, H, w(in1) / hd, static_cast<int>(op.kv_heads),
                   hd, kXsaEps, s);
      grad_done(c, in0, 0);
      return;
    }
    case OpKind::kAttention: {
      float* dq = grad_dst(c, in0, 0);
      const bool acc_kv = in1.accumulate || in2.accumulate;
      if (acc_kv) {
        zero_if_first(c, in1);
        zero_if_first(c, in2);
      }
      if (CudnnAttention* fused = sdpa();
          fused && fused->backward(sdpa_shape(c), dq, in1.grad, in2.grad, out0.grad, in0.value, in1.value, in2.value,
                                   out0.value, c.saved[0].value, acc_kv, sdpa_workspace())) {
        grad_done(c, in0, 0);
        return;
      }
      attention_backward<float>(dq, in1.grad, in2.grad, out0.grad, in0.value, in1.value, in2.value, out0.value,
                                c.saved[0].value, c.doc, work_.floats(size_t(N) * size_t(H), s), B, T, H,
                                w(in1) / qk, static_cast<int>(op.kv_heads), qk, static_cast<int>(op.window),
                                1.0f / std::sqrt(static_cast<float>(qk)), acc_kv, s, op.sinks ? c.w[0] : nullptr,
                                op.sinks ? c.dw[0] : nullptr, op.alibi ? alibi_slopes(op.heads) : nullptr);
      grad_done(c, in0, 0);
      return;
    }
    case OpKind::kRope: {  // the inverse rotation (YaRN: its scale times Rᵀ)
      const auto theta = static_cast<float>(m.attention.rope_theta);
      const std::optional<RopeYarn> yarn = rope_yarn_of(c);
      const RopeYarn* yarn_ptr = yarn ? &*yarn : nullptr;
      float* dq = grad_dst(c, in0, 0);
      float* dk = grad_dst(c, in1, 1);
      rope_apply<float>(dq, out0.grad, c.pos, N, w(in0) / qk, qk, c.rot_dims, theta, -1.0f, s, yarn_ptr);
      rope_apply<float>(dk, out1.grad, c.pos, N, w(in1) / qk, qk, c.rot_dims, theta, -1.0f, s, yarn_ptr);
      grad_done(c, in0, 0);
      grad_done(c, in1, 1);
      return;
    }
    case OpKind::kQkNorm: {
      const auto mult = static_cast<float>(m.attention.qk_norm_multiplier);
      float* dq = grad_dst(c, in0, 0);
      float* dk = grad_dst(c, in1, 1);
      rmsnorm_backward<float>(dq, nullptr, out0.grad, in0.value, c.saved[0].value, nullptr, mult, N * (w(in0) / qk),
                              qk, s);
      rmsnorm_backward<float>(dk, nullptr, out1.grad, in1.value, c.saved[1].value, nullptr, mult, N * (w(in1) / qk),
                              qk, s);
      grad_done(c, in0, 0);
      grad_done(c, in1, 1);
      return;
    }
    case OpKind::kSConv: {
      float* dx = grad_dst(c, in0, 0);
      sconv_backward(dx, c.dw[0], out0.grad, in0.value, c.w[0], c.doc, B, T, w(in0), static_cast<int>(m.sconv.kernel),
                     s);
      grad_done(c, in0, 0);
      return;
    }
    case OpKind::kLinear:  // dbias += Σ_rows dy
      if (c.dw[1]) detail::bias_grad_rows(c.dw[1], out0.grad, N, w(out0), s);
      linear_backward(gemm_, in0.grad, c.dw[0], out0.grad, in0.value, c.w[0], N, w(in0), w(out0), in0.accumulate);
      return;
    case OpKind::kGatedNorm: {
      const int d = w(in0), r = w(c.saved[0]);
      float* dx = grad_dst(c, in0, 0);
      gated_norm_backward(gemm_, dx, c.dw[0], c.dw[1], out0.grad, in0.value, c.saved[0].value, c.saved[1].value,
                          c.w[0], c.w[1], work_.floats(gated_norm_scratch_floats(N, d, r), s), N, d, r);
      grad_done(c, in0, 0);
      return;
    }
    case OpKind::kRmsNorm: {
      float* dx = grad_dst(c, in0, 0);
      if (m.norm.kind == models::NormKind::kLayerNorm) {
        layernorm_backward<float>(dx, c.dw[0], out0.grad, in0.value, c.saved[0].value, c.w[0],
                                  work_.floats(size_t(N), s), N, w(in0), s);
      } else {
        rmsnorm_backward<float>(dx, c.dw[0], out0.grad, in0.value, c.saved[0].value, c.w[0], 1.0f, N, w(in0), s);
      }
      grad_done(c, in0, 0);
      return;
    }
    case OpKind::kEmbedding:  // the position table's rows gather their tokens' gradients as the token table's do
      embedding_backward<float>(c.dw[0], out0.grad, c.tokens, N, w(out0), s);
      if (c.dw[1]) embedding_backward<float>(c.dw[1], out0.grad, c.pos, N, w(out0), s);
      return;
  }
  RS_CHECK(false, "cuda backend: an OpKind without a backward: " + op.name);
}

// Parameters each OpKind's CUDA forward/backward reads, in op.params order.
size_t known_params(const models::Op& op) {
  switch (op.kind) {
    case OpKind::kRmsNorm:     // the gain
    case OpKind::kSConv:       // the kernel
    case OpKind::kAttnGate:    // W_gate
    case OpKind::kLmHead:      // W (none when tied: the embedding table is shared)
      return 1;
    case OpKind::kAttention:   // [sinks (H)]
      return op.sinks ? 1 : 0;
    case OpKind::kEmbedding:   // the token table [, learned positions]
    case OpKind::kLinear:      // W [, bias]
    case OpKind::kGatedNorm:   // W_down, W_up
    case OpKind::kRouter:      // W [, a learnable selection bias]
      return 2;
    case OpKind::kExpertMlp:   // W1, W3, W2 per expert [, b1, b3, b2 per expert]
      return op.expert_bias ? 6 : 3;
    case OpKind::kSharedMlp:   // W1 [, W3 for SwiGLU], W2 [, as many biases]
      return op.activation == models::MlpActivation::kSwiGlu ? 6 : 4;
    case OpKind::kQkNorm:
    case OpKind::kRope:
    case OpKind::kXsa:
    case OpKind::kTopK:
    case OpKind::kDispatch:
    case OpKind::kCombine:
    case OpKind::kResidualAdd:
    case OpKind::kCrossEntropy:
      return 0;
  }
  return 0;
}

int device_count() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess ? devices : 0;
}

}  // namespace

Unsupported unsupported(const models::Op& op, const models::ModelConfig& /*m*/) {
  const std::string cpu = " (the cpu backend runs it)";
  const size_t known = known_params(op);
  if (op.params.size() > known) {  // a parameter no case above names: the op's, by name
    return {"/", "at most " + std::to_string(known) + " parameters for a " + models::to_string(op.kind) +
                     " op (op " + op.name + " on the CUDA backend)" + cpu,
            "parameter '" + op.params[known].name + "'"};
  }
  return {};
}

std::unique_ptr<Backend> make_cuda_backend() {
  const int devices = device_count();
  if (devices < 1) {
    cudaGetLastError();  // clear the sticky "no device" error
    return nullptr;
  }
  // One process per GPU: the launcher's node-local rank picks it (device 0 alone).
  RS_CUDA_CHECK(cudaSetDevice(launcher_local_rank() % devices));
  return std::make_unique<CudaBackend>();
}

void register_cuda_backend() {
  static std::once_flag once;
  std::call_once(once, [] { register_backend("cuda", make_cuda_backend); });
}

}  // namespace rackstep::exec::cuda
