// The CPU backend (exec/cpu/backend.h): one forward and one backward function
// per OpKind, each calling the kernels of exec/kernels.h on the bound tensors.
// Bindings and the gradient rule: exec/backend.h.
#include "exec/cpu/backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {

using models::OpKind;

namespace {

// Host bytes, zero-filled, 64-byte aligned (a cache line: the kernels' rows).
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (!data_) throw std::bad_alloc();
    std::memset(data_, 0, rounded);
  }
  ~HostBuffer() override { std::free(data_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() override { return data_; }
  size_t bytes() const override { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

RouterKind router_kind(const models::ModelConfig& m) {
  return m.moe.router == models::RouterKind::kSoftmax ? RouterKind::kSoftmax : RouterKind::kSigmoid;
}

// Kernel scratch and the staging buffers that turn a "=" kernel into "+=":
// grown on demand, never shrunk; contents are never read before written.
class Scratch {
 public:
  float* kernel(size_t n) { return grown(kernel_, n); }
  // Where a backward writes an input's gradient: the gradient itself ("="),
  // or staging buffer `slot` to be added by done() ("+=").
  float* dst(const OpCall& c, const Bound& b, int slot = 0) {
    if (!b.accumulate) return b.grad;
    return grown(stage_[slot], static_cast<size_t>(c.N * b.width));
  }
  void done(const OpCall& c, const Bound& b, int slot = 0) {
    if (!b.accumulate) return;
    add_inplace(b.grad, stage_[slot].data(), static_cast<size_t>(c.N * b.width));
  }

 private:
  static float* grown(std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }
  std::vector<float> kernel_, stage_[2];
};

// An input gradient the kernel adds into: zeroed first unless another reader wrote it.
void zero_if_first(const OpCall& c, const Bound& b) {
  if (b.accumulate) return;
  std::fill(b.grad, b.grad + c.N * b.width, 0.0f);
}

int I(int64_t v) { return static_cast<int>(v); }

// --- one pair per OpKind, in layer-graph order ----------------------------------------

// Rows of the learned position table (w1), 0 without one.
int position_rows(const OpCall& c) { return c.w[1] ? I(c.op->params[1].shape[0]) : 0; }

void embedding_fwd(const OpCall& c) {  // tokens (N) -> (N, d) [+ the position table's row of each token]
  embedding_forward(c.out[0].value, c.tokens, c.w[0], I(c.N), I(c.out[0].width), I(c.model->vocab));
  if (c.w[1]) position_embedding_forward(c.out[0].value, c.pos, c.w[1], I(c.N), I(c.out[0].width), position_rows(c));
}
void embedding_bwd(const OpCall& c) {
  embedding_backward(c.dw[0], c.out[0].grad, c.tokens, I(c.N), I(c.out[0].width), I(c.model->vocab));
  if (c.w[1]) embedding_backward(c.dw[1], c.out[0].grad, c.pos, I(c.N), I(c.out[0].width), position_rows(c));
}

void norm_fwd(const OpCall& c) {  // (N, width) -> (N, width), RMSNorm or LayerNorm with a gain
  const auto eps = static_cast<float>(c.model->norm.eps);
  if (c.model->norm.kind == models::NormKind::kLayerNorm) {
    layernorm_forward(c.out[0].value, c.saved[0].value, c.in[0].value, c.w[0], eps, I(c.N), I(c.in[0].width));
    return;
  }
  rmsnorm_forward(c.out[0].value, c.saved[0].value, c.in[0].value, c.w[0], eps, I(c.N), I(c.in[0].width));
}
void norm_bwd(Scratch& s, const OpCall& c) {
  float* dx = s.dst(c, c.in[0]);
  if (c.model->norm.kind == models::NormKind::kLayerNorm) {
    layernorm_backward(dx, c.dw[0], c.out[0].grad, c.in[0].value, c.saved[0].value, c.w[0], I(c.N),
                       I(c.in[0].width));
  } else {
    rmsnorm_backward(dx, c.dw[0], c.out[0].grad, c.in[0].value, c.saved[0].value, c.w[0], I(c.N), I(c.in[0].width));
  }
  s.done(c, c.in[0]);
}

void gated_norm_fwd(const OpCall& c) {  // x (N, d) -> x * sigmoid(silu(x W_down) W_up)
  gated_norm_forward(c.out[0].value, c.saved[0].value, c.saved[1].value, c.in[0].value, c.w[0], c.w[1], I(c.N),
                     I(c.in[0].width), I(c.saved[0].width));
}
void gated_norm_bwd(Scratch& s, const OpCall& c) {
  const int N = I(c.N), d = I(c.in[0].width), r = I(c.saved[0].width);
  float* dx = s.dst(c, c.in[0]);
  gated_norm_backward(dx, c.dw[0], c.dw[1], c.out[0].grad, c.in[0].value, c.saved[0].value, c.saved[1].value,
                      c.w[0], c.w[1], s.kernel(gated_norm_scratch_floats(N, d, r)), N, d, r);
  s.done(c, c.in[0]);
}

void linear_fwd(const OpCall& c) {  // (N, in) -> (N, out) [+ bias]
  linear_forward(c.out[0].value, c.in[0].value, c.w[0], c.w[1], I(c.N), I(c.in[0].width), I(c.out[0].width));
}
void linear_bwd(const OpCall& c) {
  linear_backward(c.in[0].grad, c.dw[0], c.dw[1], c.out[0].grad, c.in[0].value, c.w[0], I(c.N), I(c.in[0].width),
                  I(c.out[0].width), c.in[0].accumulate);
}

void sconv_fwd(const OpCall& c) {  // (B, T, C) -> (B, T, C), causal inside each document
  sconv_forward(c.out[0].value, c.in[0].value, c.w[0], c.doc, I(c.B), I(c.T), I(c.in[0].width),
                I(c.model->sconv.kernel));
}
void sconv_bwd(Scratch& s, const OpCall& c) {
  float* dx = s.dst(c, c.in[0]);
  sconv_backward(dx, c.dw[0], c.out[0].grad, c.in[0].value, c.w[0], c.doc, I(c.B), I(c.T), I(c.in[0].width),
                 I(c.model->sconv.kernel));
  s.done(c, c.in[0]);
}

void qk_norm_fwd(const OpCall& c) {  // q (N, H, qk), k (N, kv, qk) -> RMS-normalised per head, times a multiplier
  const int qk = I(c.op->qk_head_dim);
  const auto mult = static_cast<float>(c.model->attention.qk_norm_multiplier);
  const auto eps = static_cast<float>(c.model->norm.eps);
  for (int j = 0; j < 2; ++j) {
    rmsnorm_noparam_forward(c.out[j].value, c.saved[j].value, c.in[j].value, mult, eps,
                            I(c.N * (c.in[j].width / qk)), qk);
  }
}
void qk_norm_bwd(Scratch& s, const OpCall& c) {
  const int qk = I(c.op->qk_head_dim);
  const auto mult = static_cast<float>(c.model->attention.qk_norm_multiplier);
  float* dq = s.dst(c, c.in[0], 0);
  float* dk = s.dst(c, c.in[1], 1);
  rmsnorm_noparam_backward(dq, c.out[0].grad, c.in[0].value, c.saved[0].value, mult, I(c.N * (c.in[0].width / qk)),
                           qk);
  rmsnorm_noparam_backward(dk, c.out[1].grad, c.in[1].value, c.saved[1].value, mult, I(c.N * (c.in[1].width / qk)),
                           qk);
  s.done(c, c.in[0], 0);
  s.done(c, c.in[1], 1);
}

void rope_fwd(const OpCall& c) {  // q (N, H, qk), k (N, kv, qk) -> the leading rot_dims of each head rotated
  const int qk = I(c.op->qk_head_dim);
  const auto theta = static_cast<float>(c.model->attention.rope_theta);
  const std::optional<RopeYarn> yarn = rope_yarn_of(c);
  for (int j = 0; j < 2; ++j) {
    rope_forward(c.out[j].value, c.in[j].value, c.pos, I(c.N), I(c.in[j].width / qk), qk, c.rot_dims, theta,
                 yarn ? &*yarn : nullptr);
  }
}
void rope_bwd(Scratch& s, const OpCall& c) {
  const int qk = I(c.op->qk_head_dim);
  const auto theta = static_cast<float>(c.model->attention.rope_theta);
  float* dq = s.dst(c, c.in[0], 0);
  float* dk = s.dst(c, c.in[1], 1);
  const std::optional<RopeYarn> yarn = rope_yarn_of(c);
  rope_backward(dq, c.out[0].grad, c.pos, I(c.N), I(c.in[0].width / qk), qk, c.rot_dims, theta, yarn ? &*yarn : nullptr);
  rope_backward(dk, c.out[1].grad, c.pos, I(c.N), I(c.in[1].width / qk), qk, c.rot_dims, theta, yarn ? &*yarn : nullptr);
  s.done(c, c.in[0], 0);
  s.done(c, c.in[1], 1);
}

// Attention geometry from the bound widths: q (N, H, hd), k and v (N, kv_stored, hd).
struct AttnDims {
  int H, hd, kv_stored;
};
AttnDims attn_dims(const OpCall& c) {
  const AttnDims a{I(c.op->heads), I(c.in[0].width / c.op->heads), I(c.in[1].width * c.op->heads / c.in[0].width)};
  RS_CHECK(a.hd == c.op->qk_head_dim && c.in[2].width == c.in[1].width && c.out[0].width == c.in[0].width,
           "attention binds q, k, v and its output at one head dim (the driver pads MLA's v): " + c.op->name);
  return a;
}
float attn_scale(const OpCall& c) { return 1.0f / std::sqrt(static_cast<float>(c.op->qk_head_dim)); }

// ALiBi slopes (op.alibi) and sink logits (w0 when op.sinks) of an attention call.
struct AttnExtras {
  std::vector<float> slopes;  // (H) or empty
  AttentionExtras of(const OpCall& c) const {
    AttentionExtras e;
    e.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    if (c.op->sinks) {
      e.sinks = c.w[0];
      e.dsinks = c.dw[0];
    }
    return e;
  }
};
AttnExtras attn_extras(const OpCall& c) {
  AttnExtras x;
  if (!c.op->alibi) return x;
  for (double s : models::alibi_slopes(c.op->heads)) x.slopes.push_back(static_cast<float>(s));
  return x;
}

void attention_fwd(const OpCall& c) {  // q (N, H, hd), k (N, kv, hd), v (N, kv, hd) -> (N, H, hd)
  const AttnDims a = attn_dims(c);
  const AttnExtras x = attn_extras(c);
  attention_forward(c.out[0].value, c.saved[0].value, c.in[0].value, c.in[1].value, c.in[2].value, c.doc, I(c.B),
                    I(c.T), a.H, a.kv_stored, I(c.op->kv_heads), a.hd, I(c.op->window), attn_scale(c), x.of(c));
}
void attention_bwd(Scratch& s, const OpCall& c) {
  const AttnDims a = attn_dims(c);
  float* dq = s.dst(c, c.in[0]);
  const bool acc_kv = c.in[1].accumulate || c.in[2].accumulate;
  if (acc_kv) {
    zero_if_first(c, c.in[1]);
    zero_if_first(c, c.in[2]);
  }
  attention_backward(dq, c.in[1].grad, c.in[2].grad, c.out[0].grad, c.in[0].value, c.in[1].value, c.in[2].value,
                     c.out[0].value, c.saved[0].value, c.doc, I(c.B), I(c.T), a.H, a.kv_stored, I(c.op->kv_heads),
                     a.hd, I(c.op->window), attn_scale(c), acc_kv, attn_extras(c).of(c));
  s.done(c, c.in[0]);
}

void xsa_fwd(const OpCall& c) {  // o (N, H, hd), v (N, kv, hd) -> o minus its component along its own v
  const int H = I(c.op->heads), hd = I(c.in[0].width / c.op->heads);
  xsa_forward(c.out[0].value, c.in[0].value, c.in[1].value, I(c.N), H, I(c.in[1].width / hd), I(c.op->kv_heads), hd,
              kXsaEps);
}
void xsa_bwd(Scratch& s, const OpCall& c) {
  const int H = I(c.op->heads), hd = I(c.in[0].width / c.op->heads);
  float* d_o = s.dst(c, c.in[0]);
  zero_if_first(c, c.in[1]);
  xsa_backward(d_o, c.in[1].grad, c.out[0].grad, c.in[0].value, c.in[1].value, I(c.N), H, I(c.in[1].width / hd),
               I(c.op->kv_heads), hd, kXsaEps);
  s.done(c, c.in[0]);
}

void attn_gate_fwd(const OpCall& c) {  // o (N, H, hd), x (N, d) -> o * 2 sigmoid(x W_gate) per head
  const int H = I(c.op->heads);
  attn_gate_forward(c.out[0].value, c.saved[0].value, c.in[0].value, c.in[1].value, c.w[0], I(c.N),
                    I(c.in[1].width), H, I(c.in[0].width / H));
}
void attn_gate_bwd(Scratch& s, const OpCall& c) {
  const int H = I(c.op->heads);
  float* d_o = s.dst(c, c.in[0]);
  attn_gate_backward(d_o, c.in[1].grad, c.dw[0], c.out[0].grad, c.in[0].value, c.in[1].value, c.saved[0].value,
                     c.w[0], s.kernel(static_cast<size_t>(c.N * H)), I(c.N), I(c.in[1].width), H,
                     I(c.in[0].width / H), c.in[1].accumulate);
  s.done(c, c.in[0]);
}

OpResult router_fwd(const OpCall& c) {  // x (N, d) -> router logits (N, E)
  const Routing& r = *c.routing;
  const models::MoeConfig& moe = c.model->moe;
  linear_forward(c.out[0].value, c.in[0].value, c.w[0], nullptr, I(c.N), I(c.in[0].width), r.E);
  OpResult res;
  res.router_z = router_z_loss(c.out[0].value, I(c.N), r.E);
  if (c.training && r.hist) {
    qb_histogram(r.hist, c.out[0].value, I(c.N), r.E, static_cast<int>(moe.balancing_bins), kQbLo, kQbHi);
  }
  return res;
}
void router_bwd(const OpCall& c) {
  const Routing& r = *c.routing;
  const models::MoeConfig& moe = c.model->moe;
  if (moe.router_z_loss_applied) {
    router_z_loss_backward(c.out[0].grad, c.out[0].value, I(c.N), r.E,
                           static_cast<float>(moe.router_z_loss_weight * r.loss_share));
  }
  linear_backward(c.in[0].grad, c.dw[0], nullptr, c.out[0].grad, c.in[0].value, c.w[0], I(c.N), I(c.in[0].width), r.E,
                  c.in[0].accumulate);
}

void top_k_fwd(const OpCall& c) {  // logits (N, E) -> weights (N, k); expert ids (N, k) into the routing state
  Routing& r = *c.routing;
  router_forward(r.expert, c.out[0].value, r.threshold, c.in[0].value, r.bias, I(c.N), r.E, r.k,
                 router_kind(*c.model), static_cast<float>(c.model->moe.routing_weight_sum));
}
double top_k_aux_loss(const OpCall& c) {  // weight · E · Σ_e f_e P_e of the selection
  const Routing& r = *c.routing;
  return aux_loss_forward(c.in[0].value, r.expert, I(c.N), r.E, r.k, router_kind(*c.model),
                          static_cast<float>(c.model->moe.aux_loss_weight), r.counts, r.count_tokens);
}
void top_k_bwd(Scratch& s, const OpCall& c) {
  const Routing& r = *c.routing;
  const models::MoeConfig& moe = c.model->moe;
  float* dl = s.dst(c, c.in[0]);
  router_backward(dl, c.out[0].grad, c.out[0].value, r.expert, c.in[0].value, I(c.N), r.E, r.k,
                  router_kind(*c.model), static_cast<float>(moe.routing_weight_sum));
  s.done(c, c.in[0]);
  if (moe.balancing == models::BalancingKind::kAuxLoss) {
    aux_loss_backward(c.in[0].grad, c.in[0].value, r.expert, I(c.N), r.E, r.k, router_kind(*c.model),
                      static_cast<float>(moe.aux_loss_weight), r.counts, r.count_tokens);
  }
}

void dispatch_fwd(const OpCall& c) {  // x (N, L) -> rows (N*k, L) grouped by expert
  Routing& r = *c.routing;
  moe_group_by_expert(r.sorted_pos, r.offsets, r.expert, I(c.N) * r.k, r.E);
  moe_gather_forward(c.out[0].value, c.in[0].value, r.sorted_pos, I(c.N), r.k, r.L);
}
void dispatch_bwd(Scratch& s, const OpCall& c) {
  const Routing& r = *c.routing;
  float* dx = s.dst(c, c.in[0]);
  moe_gather_backward(dx, c.out[0].grad, r.sorted_pos, I(c.N), r.k, r.L);
  s.done(c, c.in[0]);
  // The weights only choose drop priority: no gradient, but their gradient
  // must exist for its "+=" readers.
  zero_if_first(c, c.in[1]);
}

void experts_fwd(const OpCall& c) {  // rows (N*k, L) -> each row through its expert's SwiGLU (N*k, L)
  const Routing& r = *c.routing;
  experts_forward(c.out[0].value, c.saved[0].value, c.saved[1].value, c.saved[2].value, c.in[0].value, r.offsets,
                  r.keep, c.w[0], c.w[1], c.w[2], I(c.N) * r.k, r.E, r.L, r.F, expert_options(c));
}
void experts_bwd(Scratch& s, const OpCall& c) {
  const Routing& r = *c.routing;
  const int A = I(c.N) * r.k;
  float* dxs = s.dst(c, c.in[0]);
  experts_backward(dxs, c.dw[0], c.dw[1], c.dw[2], c.out[0].grad, c.in[0].value, c.saved[0].value, c.saved[1].value,
                   c.saved[2].value, r.offsets, r.keep, c.w[0], c.w[1], c.w[2],
                   s.kernel(experts_scratch_floats(A, r.L, r.F)), A, r.E, r.L, r.F, expert_options(c));
  s.done(c, c.in[0]);
}

void combine_fwd(const OpCall& c) {  // rows (N*k, L), weights (N, k) -> weighted sum per token (N, L)
  const Routing& r = *c.routing;
  moe_combine_forward(c.out[0].value, c.in[0].value, c.in[1].value, r.sorted_pos, I(c.N), r.k, r.L);
}
void combine_bwd(Scratch& s, const OpCall& c) {
  const Routing& r = *c.routing;
  float* dys = s.dst(c, c.in[0], 0);
  float* dweight = s.dst(c, c.in[1], 1);
  moe_combine_backward(dys, dweight, c.out[0].grad, c.in[0].value, c.in[1].value, r.sorted_pos, I(c.N), r.k, r.L);
  s.done(c, c.in[0], 0);
  s.done(c, c.in[1], 1);
}

void shared_mlp_fwd(const OpCall& c) {  // x (N, d) [, added (N, d)] -> MLP(x) [+ added] (N, d)
  const int d = I(c.in[0].width);
  dense_mlp_forward(c.out[0].value, c.saved[0].value, c.saved[1].value, c.saved[2].value, c.in[0].value,
                    mlp_weights(c), mlp_activation(*c.op), I(c.N), d, I(c.saved[0].width));
  if (c.in[1].value) add_inplace(c.out[0].value, c.in[1].value, static_cast<size_t>(c.N * d));
}
void shared_mlp_bwd(Scratch& s, const OpCall& c) {
  const int d = I(c.in[0].width), F = I(c.saved[0].width);
  if (c.in[1].grad) {
    zero_if_first(c, c.in[1]);
    add_inplace(c.in[1].grad, c.out[0].grad, static_cast<size_t>(c.N * d));
  }
  dense_mlp_backward(c.in[0].grad, mlp_grads(c), c.out[0].grad, c.in[0].value, c.saved[0].value, c.saved[1].value,
                     c.saved[2].value, mlp_weights(c), mlp_activation(*c.op), s.kernel(dense_mlp_scratch_floats(I(c.N), F)),
                     I(c.N), d, F, c.in[0].accumulate);
}

void residual_fwd(const OpCall& c) {  // resid (N, d), branch (N, d) -> resid + branch
  residual_forward(c.out[0].value, c.in[0].value, c.in[1].value, static_cast<size_t>(c.N * c.out[0].width));
}
void residual_bwd(const OpCall& c) {
  zero_if_first(c, c.in[0]);
  zero_if_first(c, c.in[1]);
  residual_backward(c.in[0].grad, c.in[1].grad, c.out[0].grad, static_cast<size_t>(c.N * c.out[0].width));
}

void lm_head_fwd(const OpCall& c) {  // (N, d) -> logits (N, V)
  const int d = I(c.in[0].width), V = I(c.out[0].width);
  if (c.tied) {
    linear_t_forward(c.out[0].value, c.in[0].value, c.w[0], I(c.N), d, V);
    return;
  }
  linear_forward(c.out[0].value, c.in[0].value, c.w[0], nullptr, I(c.N), d, V);
}
void lm_head_bwd(const OpCall& c) {
  const int d = I(c.in[0].width), V = I(c.out[0].width);
  if (c.tied) {
    linear_t_backward(c.in[0].grad, c.dw[0], c.out[0].grad, c.in[0].value, c.w[0], I(c.N), d, V, c.in[0].accumulate);
    return;
  }
  linear_backward(c.in[0].grad, c.dw[0], nullptr, c.out[0].grad, c.in[0].value, c.w[0], I(c.N), d, V,
                  c.in[0].accumulate);
}

OpResult cross_entropy_fwd(const OpCall& c) {  // logits (N, V), targets (N) -> mean CE + logit z-loss
  const CrossEntropyResult r =
      cross_entropy_forward(c.saved[0].value, c.in[0].value, c.targets, I(c.N), I(c.in[0].width),
                            static_cast<float>(c.model->logit_z_loss_weight), c.loss_tokens);
  OpResult res;
  res.ce = r.ce;
  res.z_loss = r.z_loss;
  return res;
}
void cross_entropy_bwd(Scratch& s, const OpCall& c) {
  float* dl = s.dst(c, c.in[0]);
  cross_entropy_backward(dl, c.in[0].value, c.saved[0].value, c.targets, I(c.N), I(c.in[0].width),
                         static_cast<float>(c.model->logit_z_loss_weight), c.loss_tokens);
  s.done(c, c.in[0]);
}

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  std::unique_ptr<Buffer> allocate(size_t bytes) override { return std::make_unique<HostBuffer>(bytes); }
  void copy_to_backend(void* dst, const void* host_src, size_t bytes) override {
    if (bytes) std::memcpy(dst, host_src, bytes);
  }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(host_dst, src, bytes);
  }
  bool uses_host_memory() const override { return true; }
  void synchronize() override {}

  OpResult forward(const OpCall& c) override {
    switch (c.op->kind) {
      case OpKind::kEmbedding: embedding_fwd(c); break;
      case OpKind::kRmsNorm: norm_fwd(c); break;
      case OpKind::kGatedNorm: gated_norm_fwd(c); break;
      case OpKind::kLinear: linear_fwd(c); break;
      case OpKind::kSConv: sconv_fwd(c); break;
      case OpKind::kQkNorm: qk_norm_fwd(c); break;
      case OpKind::kRope: rope_fwd(c); break;
      case OpKind::kAttention: attention_fwd(c); break;
      case OpKind::kXsa: xsa_fwd(c); break;
      case OpKind::kAttnGate: attn_gate_fwd(c); break;
      case OpKind::kRouter: return router_fwd(c);
      case OpKind::kTopK: top_k_fwd(c); break;
      case OpKind::kDispatch: dispatch_fwd(c); break;
      case OpKind::kExpertMlp: experts_fwd(c); break;
      case OpKind::kCombine: combine_fwd(c); break;
      case OpKind::kSharedMlp: shared_mlp_fwd(c); break;
      case OpKind::kResidualAdd: residual_fwd(c); break;
      case OpKind::kLmHead: lm_head_fwd(c); break;
      case OpKind::kCrossEntropy: return cross_entropy_fwd(c);
    }
    return {};
  }

  void backward(const OpCall& c) override {
    switch (c.op->kind) {
      case OpKind::kEmbedding: embedding_bwd(c); return;
      case OpKind::kRmsNorm: norm_bwd(scratch_, c); return;
      case OpKind::kGatedNorm: gated_norm_bwd(scratch_, c); return;
      case OpKind::kLinear: linear_bwd(c); return;
      case OpKind::kSConv: sconv_bwd(scratch_, c); return;
      case OpKind::kQkNorm: qk_norm_bwd(scratch_, c); return;
      case OpKind::kRope: rope_bwd(scratch_, c); return;
      case OpKind::kAttention: attention_bwd(scratch_, c); return;
      case OpKind::kXsa: xsa_bwd(scratch_, c); return;
      case OpKind::kAttnGate: attn_gate_bwd(scratch_, c); return;
      case OpKind::kRouter: router_bwd(c); return;
      case OpKind::kTopK: top_k_bwd(scratch_, c); return;
      case OpKind::kDispatch: dispatch_bwd(scratch_, c); return;
      case OpKind::kExpertMlp: experts_bwd(scratch_, c); return;
      case OpKind::kCombine: combine_bwd(scratch_, c); return;
      case OpKind::kSharedMlp: shared_mlp_bwd(scratch_, c); return;
      case OpKind::kResidualAdd: residual_bwd(c); return;
      case OpKind::kLmHead: lm_head_bwd(c); return;
      case OpKind::kCrossEntropy: cross_entropy_bwd(scratch_, c); return;
    }
  }

  double aux_loss(const OpCall& c) override {
    RS_CHECK(c.op->kind == OpKind::kTopK && c.model->moe.balancing == models::BalancingKind::kAuxLoss,
             "aux_loss is kTopK's under aux-loss balancing: " + c.op->name);
    return top_k_aux_loss(c);
  }

  void copy_columns(float* y, int64_t wy, const float* x, int64_t wx, int64_t rows, bool accumulate) override {
    const int64_t n = std::min(wx, wy);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y + r * wy;
      const float* xr = x + r * wx;
      for (int64_t j = 0; j < n; ++j) yr[j] = accumulate ? yr[j] + xr[j] : xr[j];
      if (!accumulate)
        for (int64_t j = n; j < wy; ++j) yr[j] = 0.0f;
    }
  }

  void assemble_key(float* k, const float* k_nope, const float* k_rope, int64_t N, int64_t H, int64_t hd,
                    int64_t r) override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) {
        float* kr = k + (n * H + h) * (hd + r);
        std::copy(k_nope + (n * H + h) * hd, k_nope + (n * H + h + 1) * hd, kr);
        std::copy(k_rope + n * r, k_rope + (n + 1) * r, kr + hd);
      }
  }

  void split_key_grad(float* dk_nope, bool acc_nope, float* dk_rope, bool acc_rope, const float* dk, int64_t N,
                      int64_t H, int64_t hd, int64_t r) override {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float* dr = dk_rope + n * r;
      if (!acc_rope) std::fill(dr, dr + r, 0.0f);
      for (int64_t h = 0; h < H; ++h) {
        const float* g = dk + (n * H + h) * (hd + r);
        float* dn = dk_nope + (n * H + h) * hd;
        for (int64_t j = 0; j < hd; ++j) dn[j] = acc_nope ? dn[j] + g[j] : g[j];
        for (int64_t j = 0; j < r; ++j) dr[j] += g[hd + j];
      }
    }
  }

  void fill_zero(float* x, int64_t n) override { std::fill(x, x + n, 0.0f); }

  bool all_finite(const float* x, int64_t n) override {
    bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
    for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(x[i]);
    return ok;
  }

  void update_balancing_bias(float* bias, int64_t* hist, int E, int k, int bins, float lo, float hi) override {
    qb_bias_from_histogram(bias, hist, E, k, bins, lo, hi);
    std::fill(hist, hist + static_cast<int64_t>(E) * bins, 0);
  }

 private:
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace rackstep::exec
