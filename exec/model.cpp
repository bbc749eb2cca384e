// The CPU model: plan (who reads what), init, forward, backward. See model.h.
#include "exec/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "exec/kernels.h"
#include "models/check.h"

namespace rackstep::exec {

using models::OpKind;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Features of the model JSON this backend does not implement: one clear line.
void check_supported(const models::ModelConfig& m) {
  const std::string& f = m.source_file;
  if (m.attention.kind == models::AttentionKind::kMla) {
    throw UserError(f, "/attention/kind", "\"gqa\" (the CPU backend cannot run MLA attention)", "\"mla\"");
  }
  if (m.norm.kind == models::NormKind::kLayerNorm) {
    throw UserError(f, "/norm/kind", "\"rmsnorm\" (the CPU backend has no LayerNorm)", "\"layernorm\"");
  }
  if (m.moe.experts > 0 && m.moe.balancing == models::BalancingKind::kAuxLoss) {
    throw UserError(f, "/moe/balancing", "\"quantile\" or \"none\" (the CPU backend has no auxiliary loss)",
                    "\"aux_loss\"");
  }
  if (m.moe.experts > 0 && m.moe.router_z_loss_applied) {
    throw UserError(f, "/moe/router_z_loss_applied", "false (the CPU backend logs the router z-loss only)", "true");
  }
  if (m.tied_embeddings) {
    throw UserError(f, "/tied_embeddings", "false (the CPU backend has an untied LM head)", "true");
  }
}

bool all_finite(const float* x, int64_t n) {
  bool ok = true;
#pragma omp parallel for schedule(static) reduction(&& : ok)
  for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(x[i]);
  return ok;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Box–Muller on two uniforms in (0, 1] (53-bit).
double normal(uint64_t& state) {
  const double u1 = (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

RouterKind router_kind(const models::ModelConfig& m) {
  return m.moe.router == models::RouterKind::kSoftmax ? RouterKind::kSoftmax : RouterKind::kSigmoid;
}

}  // namespace

// --- plan --------------------------------------------------------------------------

CpuModel::CpuModel(const models::LayerGraph& graph, int64_t batch, int64_t seq)
    : graph_(graph), B_(batch), T_(seq), N_(batch * seq) {
  check_supported(graph_.model);
  if (batch < 1 || seq < 1) throw UserError("model batch: expected batch >= 1 and seq >= 1");
  params_ = Arena(std::make_shared<const ArenaLayout>(arena_specs_from_graph(graph_)));
  grads_ = Arena(params_.layout_ptr());
  plan(graph_);
  pos_.resize(static_cast<size_t>(N_));
  for (int64_t t = 0; t < N_; ++t) pos_[t] = static_cast<int32_t>(t % T_);
}

int CpuModel::new_slot(int64_t width) {
  Slot s;
  s.offset = slots_.empty() ? 0 : slots_.back().offset + N_ * slots_.back().width;
  s.width = width;
  slots_.push_back(s);
  return static_cast<int>(slots_.size()) - 1;
}

// Walks the op list once, following the data flow of a pre-norm Marin block:
//   resid -> [site norm (+ gated norm)] -> branch input x
//   attention: q, k, v = x·Wq, x·Wk, x·Wv -> k SConv -> QK-norm -> RoPE -> attention
//              -> XSA (reads v) -> gate (reads x) -> o_proj -> SConv -> resid += branch
//   MoE:       router(x) -> top-k; latent_down(x) -> latent norm -> dispatch -> experts
//              -> combine -> latent_up; shared experts(x) add to it -> SConv -> resid += branch
void CpuModel::plan(const models::LayerGraph& g) {
  const auto& m = g.model;
  const int64_t d = m.d_model, hd = m.attention.head_dim;
  int resid = -1, cur = -1, branch = -1, q = -1, k = -1, v = -1, moe_x = -1, weights = -1;
  bool in_site = false;
  size_t scratch = 0;  // kernel scratch floats
  auto param_index = [&](const models::Op& op, size_t j) {
    if (j >= op.params.size() || !op.params[j].learnable) return -1;
    const int64_t idx = params_.layout().find(op.params[j].name);
    RS_CHECK(idx >= 0, "layer-graph parameter missing from the arena: " + op.params[j].name);
    return static_cast<int>(idx);
  };
  auto width = [&](int slot) { return slots_[static_cast<size_t>(slot)].width; };
  plan_.resize(g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const models::Op& op = g.ops[i];
    OpPlan& p = plan_[i];
    p.p0 = param_index(op, 0);
    p.p1 = param_index(op, 1);
    p.p2 = param_index(op, 2);
    const bool was_site = in_site;
    in_site = false;
    switch (op.kind) {
      case OpKind::kEmbedding:
        p.out = cur = resid = new_slot(d);
        break;
      case OpKind::kRmsNorm: {
        p.site_norm = ends_with(op.name, "attn_norm") || ends_with(op.name, "mlp_norm") ||
                      ends_with(op.name, "final_norm");
        p.in = p.site_norm ? resid : cur;
        p.out = cur = new_slot(width(p.in));
        p.save = new_slot(1);  // rstd
        in_site = p.site_norm;
        if (p.site_norm) branch = cur;
        if (ends_with(op.name, "latent_norm")) moe_x = cur;
        break;
      }
      case OpKind::kGatedNorm: {
        const int64_t r = op.params[0].shape[1];
        p.in = cur;
        p.out = cur = new_slot(d);
        p.save = new_slot(r);   // a = x·W_down
        p.save2 = new_slot(d);  // g
        scratch = std::max(scratch, gated_norm_scratch_floats(static_cast<int>(N_), static_cast<int>(d),
                                                              static_cast<int>(r)));
        in_site = was_site;
        if (was_site) branch = cur;
        break;
      }
      case OpKind::kLinear: {
        const int64_t out_w = op.params[0].shape[1];  // stored width (K/V: every stored head)
        if (ends_with(op.name, "attn.q_proj")) {
          p.in = branch;
          p.out = q = new_slot(out_w);
        } else if (ends_with(op.name, "attn.k_proj")) {
          p.in = branch;
          p.out = k = new_slot(out_w);
        } else if (ends_with(op.name, "attn.v_proj")) {
          p.in = branch;
          p.out = v = new_slot(out_w);
        } else if (ends_with(op.name, "moe.latent_down")) {
          p.in = branch;
          p.out = cur = moe_x = new_slot(out_w);
        } else if (ends_with(op.name, "attn.o_proj") || ends_with(op.name, "moe.latent_up")) {
          p.in = cur;
          p.out = cur = new_slot(out_w);
        } else {
          throw UserError(m.source_file, "", "a projection the CPU backend knows", "op " + op.name);
        }
        RS_CHECK(width(p.in) == op.params[0].shape[0], "linear input width differs from its weight: " + op.name);
        break;
      }
      case OpKind::kSConv: {
        const bool on_k = ends_with(op.name, "attn.k_sconv");
        p.in = on_k ? k : cur;
        p.out = new_slot(width(p.in));
        RS_CHECK(width(p.in) == op.params[0].shape[0], "SConv channels differ from its kernel: " + op.name);
        (on_k ? k : cur) = p.out;
        break;
      }
      case OpKind::kQkNorm:
      case OpKind::kRope:
        p.in = q;
        p.in2 = k;
        p.out = q = new_slot(width(p.in));
        p.out2 = k = new_slot(width(p.in2));
        if (op.kind == OpKind::kQkNorm) {
          p.save = new_slot(width(p.in) / hd);    // q rstd per head
          p.save2 = new_slot(width(p.in2) / hd);  // k rstd per head
        } else {
          const double rot = op.rope_fraction * static_cast<double>(hd);
          p.rot_dims = static_cast<int>(std::lround(rot));
          if (std::abs(rot - p.rot_dims) > 1e-9 || p.rot_dims % 2 != 0) {
            throw UserError(m.source_file, "/attention/local/rope_fraction",
                            "a fraction giving an even number of rotated dims per head", std::to_string(op.rope_fraction));
          }
        }
        break;
      case OpKind::kAttention:
        p.in = q;
        p.in2 = k;
        p.in3 = v;
        p.out = cur = new_slot(op.heads * op.head_dim);
        p.save = new_slot(op.heads);  // lse, stored (B, H, T)
        break;
      case OpKind::kXsa:
        p.in = cur;
        p.in2 = v;
        p.out = cur = new_slot(width(p.in));
        break;
      case OpKind::kAttnGate:
        p.in = cur;
        p.in2 = branch;
        p.out = cur = new_slot(width(p.in));
        p.save = new_slot(op.heads);  // g
        scratch = std::max(scratch, static_cast<size_t>(N_ * op.heads));
        break;
      case OpKind::kRouter: {
        MoeState s;
        s.layer = op.layer;
        s.E = static_cast<int>(m.moe.experts);
        s.k = static_cast<int>(m.moe.top_k);
        s.L = static_cast<int>(m.moe_width());
        s.F = static_cast<int>(m.moe.expert_width);
        s.expert.resize(static_cast<size_t>(N_ * s.k));
        s.threshold.resize(static_cast<size_t>(N_));
        s.sorted_pos.resize(static_cast<size_t>(N_ * s.k));
        s.offsets.resize(static_cast<size_t>(s.E + 1));
        s.bias.assign(static_cast<size_t>(s.E), 0.0f);
        s.bias_param = param_index(op, 1);
        if (m.moe.balancing == models::BalancingKind::kQuantile) {
          s.hist.assign(static_cast<size_t>(s.E * m.moe.balancing_bins), 0);
        }
        moe_.push_back(std::move(s));
        p.moe = static_cast<int>(moe_.size()) - 1;
        p.p1 = -1;  // the bias is a selection input, read by top-k
        p.in = moe_x = branch;
        p.out = new_slot(m.moe.experts);
        cur = p.out;
        break;
      }
      case OpKind::kTopK:
        p.moe = static_cast<int>(moe_.size()) - 1;
        p.in = cur;
        p.out = weights = new_slot(m.moe.top_k);
        break;
      case OpKind::kDispatch:
        p.moe = static_cast<int>(moe_.size()) - 1;
        p.in = moe_x;
        p.in2 = weights;  // read for the capacity transport's router-probability priority only
        p.out = cur = new_slot(m.moe.top_k * width(moe_x));
        break;
      case OpKind::kExpertMlp: {
        p.moe = static_cast<int>(moe_.size()) - 1;
        const MoeState& s = moe_.back();
        p.in = cur;
        p.out = cur = new_slot(width(p.in));
        p.save = new_slot(s.k * s.F);   // a1
        p.save2 = new_slot(s.k * s.F);  // a3
        p.save3 = new_slot(s.k * s.F);  // h
        scratch = std::max(scratch, experts_scratch_floats(static_cast<int>(N_ * s.k), s.L, s.F));
        break;
      }
      case OpKind::kCombine:
        p.moe = static_cast<int>(moe_.size()) - 1;
        p.in = cur;
        p.in2 = weights;
        p.out = cur = new_slot(moe_.back().L);
        break;
      case OpKind::kSharedMlp: {
        const int64_t F = op.params[0].shape[1];
        p.in = branch;
        p.in2 = g.model.is_moe_layer(op.layer) ? cur : -1;  // the routed output it adds to
        p.out = cur = new_slot(d);
        p.save = new_slot(F);
        p.save2 = new_slot(F);
        p.save3 = new_slot(F);
        scratch = std::max(scratch, static_cast<size_t>(3 * N_ * F));
        break;
      }
      case OpKind::kResidualAdd:
        p.in = resid;
        p.in2 = cur;
        p.out = cur = resid = new_slot(d);
        break;
      case OpKind::kLmHead:
        p.in = cur;
        p.out = cur = logits_slot_ = new_slot(m.vocab);
        break;
      case OpKind::kCrossEntropy:
        p.in = cur;
        p.save = lse_slot_ = new_slot(1);
        break;
    }
    // Before the first block, the embedding (and its norm) is the residual stream.
    if (!g.block_begin.empty() && i < g.block_begin[0]) resid = cur;
  }
  RS_CHECK(logits_slot_ >= 0 && lse_slot_ >= 0, "layer graph without LM head and loss");

  // "=" for the first reader of a slot in backward order, "+=" for the rest.
  std::vector<uint8_t> written(slots_.size(), 0);
  for (size_t i = plan_.size(); i-- > 0;) {
    OpPlan& p = plan_[i];
    auto mark = [&](int slot, bool& acc) {
      if (slot < 0) return;
      acc = written[static_cast<size_t>(slot)] != 0;
      written[static_cast<size_t>(slot)] = 1;
    };
    mark(p.in, p.acc_in);
    mark(p.in2, p.acc_in2);
    mark(p.in3, p.acc_in3);
  }

  int64_t max_width = 0;
  for (const Slot& s : slots_) max_width = std::max(max_width, s.width);
  const size_t total = static_cast<size_t>(slots_.back().offset + N_ * slots_.back().width);
  act_.assign(total, 0.0f);
  dact_.assign(total, 0.0f);
  scratch_.assign(scratch, 0.0f);
  scratch2_.assign(static_cast<size_t>(2 * N_ * max_width), 0.0f);
}

// --- parameters --------------------------------------------------------------------

void CpuModel::init_params(uint64_t seed) {
  const auto& m = graph_.model;
  const double std_dev = m.init_std_scale / std::sqrt(static_cast<double>(m.d_model));
  for (const models::Op& op : graph_.ops) {
    for (const models::ParamTensor& pt : op.params) {
      if (!pt.learnable) continue;
      TensorView w = params_.view(pt.name);
      if (op.kind == OpKind::kSConv) {
        sconv_init_identity(w.data, static_cast<int>(pt.shape[0]), static_cast<int>(pt.shape[1]));
      } else if (op.kind == OpKind::kRmsNorm) {
        std::fill(w.data, w.data + w.numel, 1.0f);
      } else if (pt.shape.size() == 1) {
        std::fill(w.data, w.data + w.numel, 0.0f);  // a learnable router bias
      } else {
        // One stream per tensor, keyed by its name: init does not depend on op order.
        uint64_t state = checksum64(pt.name.data(), pt.name.size(), seed);
        for (int64_t i = 0; i < w.numel; ++i) w.data[i] = static_cast<float>(std_dev * normal(state));
      }
    }
  }
  for (MoeState& s : moe_) {
    std::fill(s.bias.begin(), s.bias.end(), 0.0f);
    std::fill(s.hist.begin(), s.hist.end(), 0);
  }
}

void CpuModel::set_dispatch(const DispatchOptions& d) {
  if (d.enabled) {
    sim::validate(d.config, d.ep);
    if (N_ % d.ep != 0) {
      throw UserError("dispatch: expected --ep to divide the batch's " + std::to_string(N_) + " tokens, found " +
                      std::to_string(d.ep));
    }
    if (!moe_.empty() && (d.config.n_experts != moe_[0].E || d.config.top_k != moe_[0].k)) {
      throw UserError("dispatch: expected the model's experts and top_k in the dispatch config");
    }
  }
  dispatch_ = d;
}

void CpuModel::update_balancing() {
  const auto& m = graph_.model;
  if (m.moe.balancing != models::BalancingKind::kQuantile) return;
  const int bins = static_cast<int>(m.moe.balancing_bins);
  for (MoeState& s : moe_) {
    qb_bias_from_histogram(s.bias.data(), s.hist.data(), s.E, s.k, bins, kQbLo, kQbHi);
    std::fill(s.hist.begin(), s.hist.end(), 0);
  }
}

std::vector<float> CpuModel::balancing_state() const {
  std::vector<float> out;
  for (const MoeState& s : moe_) out.insert(out.end(), s.bias.begin(), s.bias.end());
  return out;
}

void CpuModel::set_balancing_state(const std::vector<float>& bias) {
  size_t need = 0;
  for (const MoeState& s : moe_) need += s.bias.size();
  if (bias.size() != need) {
    throw UserError("balancing state: expected " + std::to_string(need) + " router biases, found " +
                    std::to_string(bias.size()));
  }
  size_t at = 0;
  for (MoeState& s : moe_) {
    std::copy(bias.begin() + static_cast<std::ptrdiff_t>(at),
              bias.begin() + static_cast<std::ptrdiff_t>(at + s.bias.size()), s.bias.begin());
    at += s.bias.size();
  }
}

std::vector<std::pair<int64_t*, size_t>> CpuModel::balancing_histograms() {
  std::vector<std::pair<int64_t*, size_t>> out;
  for (MoeState& s : moe_)
    if (!s.hist.empty()) out.emplace_back(s.hist.data(), s.hist.size());
  return out;
}

ExpertLayer CpuModel::expert_layer(const OpPlan& p) {
  const MoeState& s = moe_[static_cast<size_t>(p.moe)];
  ExpertLayer l;
  l.moe = p.moe;
  l.tokens = static_cast<int>(N_);
  l.E = s.E;
  l.k = s.k;
  l.L = s.L;
  l.F = s.F;
  l.expert = s.expert.data();
  l.sorted_pos = s.sorted_pos.data();
  l.w1 = P(p.p0);
  l.w3 = P(p.p1);
  l.w2 = P(p.p2);
  l.dw1 = G(p.p0);
  l.dw3 = G(p.p1);
  l.dw2 = G(p.p2);
  return l;
}

const float* CpuModel::logits() const { return act_.data() + slots_[static_cast<size_t>(logits_slot_)].offset; }

const int32_t* CpuModel::routed_experts(int layer) const {
  for (const MoeState& s : moe_)
    if (s.layer == layer) return s.expert.data();
  return nullptr;
}

const float* CpuModel::balancing_bias(int layer) const {
  for (const MoeState& s : moe_)
    if (s.layer == layer) return s.bias.data();
  return nullptr;
}

const float* CpuModel::op_output(size_t i, int64_t* width) const {
  const int out = plan_[i].out;
  if (out < 0) return nullptr;
  const Slot& s = slots_[static_cast<size_t>(out)];
  if (width) *width = s.width;
  return act_.data() + s.offset;
}

// --- forward -----------------------------------------------------------------------

LossResult CpuModel::forward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_ids) {
  tokens_ = inputs;
  targets_ = targets;
  doc_ = doc_ids;
  const int V = static_cast<int>(graph_.model.vocab);
  counted_targets_ = 0;
  for (int64_t t = 0; t < N_; ++t) {
    if (inputs[t] < 0 || inputs[t] >= V || targets[t] >= V) {
      throw UserError("batch: expected token ids in [0, " + std::to_string(V) + ") (the model's vocab), found " +
                      std::to_string(std::max(inputs[t], targets[t])));
    }
    counted_targets_ += targets[t] >= 0;
  }
  if (loss_tokens_ > 0) {
    RS_CHECK(loss_tokens_ >= counted_targets_, "the global batch has fewer targets than this slice");
    counted_targets_ = loss_tokens_;
  }
  if (counted_targets_ == 0) throw UserError("batch: expected at least one target token, found none");
  LossResult r;
  for (size_t i = 0; i < graph_.ops.size(); ++i) {
    if (!timer_) {
      forward_op(i, inputs, targets, doc_ids);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    forward_op(i, inputs, targets, doc_ids);
    timer_(i, 0, t0, std::chrono::steady_clock::now());
  }
  r.ce = last_ce_;
  r.z_loss = last_z_;
  r.loss = r.ce + r.z_loss;
  for (const MoeState& s : moe_) {
    r.drops += s.drops;
    r.router_z_loss += s.router_z / static_cast<double>(moe_.size());
  }
  return r;
}

void CpuModel::dispatch_layer(MoeState& s, const float* weights) {
  const int64_t A = N_ * s.k;
  if (experts_) return;  // the expert backend decides while it ships the rows
  if (!dispatch_.enabled) {
    s.keep.clear();
    s.drops = sim::DropCounts{};
    s.drops.assignments = A;
    return;
  }
  const int64_t S = dispatch_.ep, per = A / S;
  std::vector<sim::GpuAssignments> gpus(static_cast<size_t>(S));
  for (int64_t g = 0; g < S; ++g) {
    gpus[g].experts.assign(s.expert.begin() + g * per, s.expert.begin() + (g + 1) * per);
    gpus[g].probs.assign(weights + g * per, weights + (g + 1) * per);
  }
  const sim::DispatchResult r = sim::dispatch(dispatch_.config, gpus);
  s.keep.resize(static_cast<size_t>(A));
  for (int64_t a = 0; a < A; ++a) s.keep[s.sorted_pos[a]] = r.keep[a / per][a % per];
  s.drops = r.counts;
}

void CpuModel::forward_op(size_t i, const int32_t* inputs, const int32_t* targets, const int32_t* doc) {
  const models::Op& op = graph_.ops[i];
  const auto& m = graph_.model;
  const OpPlan& p = plan_[i];
  const int N = static_cast<int>(N_), B = static_cast<int>(B_), T = static_cast<int>(T_);
  const int d = static_cast<int>(m.d_model), hd = static_cast<int>(m.attention.head_dim);
  const float eps = static_cast<float>(m.norm.eps);
  auto w = [&](int slot) { return static_cast<int>(slots_[static_cast<size_t>(slot)].width); };
  switch (op.kind) {
    case OpKind::kEmbedding:
      embedding_forward(A(p.out), inputs, P(p.p0), N, d, static_cast<int>(m.vocab));
      return;
    case OpKind::kRmsNorm:
      rmsnorm_forward(A(p.out), A(p.save), A(p.in), P(p.p0), eps, N, w(p.in));
      return;
    case OpKind::kGatedNorm:
      gated_norm_forward(A(p.out), A(p.save), A(p.save2), A(p.in), P(p.p0), P(p.p1), N, d, w(p.save));
      return;
    case OpKind::kLinear:
      linear_forward(A(p.out), A(p.in), P(p.p0), nullptr, N, w(p.in), w(p.out));
      return;
    case OpKind::kSConv:
      sconv_forward(A(p.out), A(p.in), P(p.p0), doc, B, T, w(p.in), static_cast<int>(m.sconv.kernel));
      return;
    case OpKind::kQkNorm: {
      const auto mult = static_cast<float>(m.attention.qk_norm_multiplier);
      rmsnorm_noparam_forward(A(p.out), A(p.save), A(p.in), mult, eps, N * (w(p.in) / hd), hd);
      rmsnorm_noparam_forward(A(p.out2), A(p.save2), A(p.in2), mult, eps, N * (w(p.in2) / hd), hd);
      return;
    }
    case OpKind::kRope: {
      const auto theta = static_cast<float>(m.attention.rope_theta);
      rope_forward(A(p.out), A(p.in), pos_.data(), N, w(p.in) / hd, hd, p.rot_dims, theta);
      rope_forward(A(p.out2), A(p.in2), pos_.data(), N, w(p.in2) / hd, hd, p.rot_dims, theta);
      return;
    }
    case OpKind::kAttention:
      attention_forward(A(p.out), A(p.save), A(p.in), A(p.in2), A(p.in3), doc, B, T, static_cast<int>(op.heads),
                        w(p.in2) / hd, static_cast<int>(op.kv_heads), hd, static_cast<int>(op.window),
                        1.0f / std::sqrt(static_cast<float>(op.qk_head_dim)));
      return;
    case OpKind::kXsa:
      xsa_forward(A(p.out), A(p.in), A(p.in2), N, static_cast<int>(op.heads), w(p.in2) / hd,
                  static_cast<int>(op.kv_heads), hd, kXsaEps);
      return;
    case OpKind::kAttnGate:
      attn_gate_forward(A(p.out), A(p.save), A(p.in), A(p.in2), P(p.p0), N, d, static_cast<int>(op.heads), hd);
      return;
    case OpKind::kRouter: {
      MoeState& s = moe_[static_cast<size_t>(p.moe)];
      linear_forward(A(p.out), A(p.in), P(p.p0), nullptr, N, d, s.E);
      s.router_z = router_z_loss(A(p.out), N, s.E);
      if (training_ && !s.hist.empty()) {
        qb_histogram(s.hist.data(), A(p.out), N, s.E, static_cast<int>(m.moe.balancing_bins), kQbLo, kQbHi);
      }
      return;
    }
    case OpKind::kTopK: {
      MoeState& s = moe_[static_cast<size_t>(p.moe)];
      const float* bias = s.bias_param >= 0 ? P(s.bias_param) : s.bias.data();
      router_forward(s.expert.data(), A(p.out), s.threshold.data(), A(p.in), bias, N, s.E, s.k, router_kind(m),
                     static_cast<float>(m.moe.routing_weight_sum));
      return;
    }
    case OpKind::kDispatch: {
      MoeState& s = moe_[static_cast<size_t>(p.moe)];
      moe_group_by_expert(s.sorted_pos.data(), s.offsets.data(), s.expert.data(), N * s.k, s.E);
      dispatch_layer(s, A(p.in2));
      moe_gather_forward(A(p.out), A(p.in), s.sorted_pos.data(), N, s.k, s.L);
      return;
    }
    case OpKind::kExpertMlp: {
      MoeState& s = moe_[static_cast<size_t>(p.moe)];
      if (experts_) {
        s.keep.resize(static_cast<size_t>(N_ * s.k));
        experts_->forward(expert_layer(p), A(p.in), A(p.out), s.keep.data(), s.drops);
        return;
      }
      experts_forward(A(p.out), A(p.save), A(p.save2), A(p.save3), A(p.in), s.offsets.data(),
                      s.keep.empty() ? nullptr : s.keep.data(), P(p.p0), P(p.p1), P(p.p2), N * s.k, s.E, s.L, s.F);
      return;
    }
    case OpKind::kCombine: {
      MoeState& s = moe_[static_cast<size_t>(p.moe)];
      moe_combine_forward(A(p.out), A(p.in), A(p.in2), s.sorted_pos.data(), N, s.k, s.L);
      return;
    }
    case OpKind::kSharedMlp:
      dense_swiglu_forward(A(p.out), A(p.save), A(p.save2), A(p.save3), A(p.in), P(p.p0), P(p.p1), P(p.p2), N, d,
                           w(p.save));
      if (p.in2 >= 0) add_inplace(A(p.out), A(p.in2), static_cast<size_t>(N_ * d));
      return;
    case OpKind::kResidualAdd:
      residual_forward(A(p.out), A(p.in), A(p.in2), static_cast<size_t>(N_ * d));
      return;
    case OpKind::kLmHead:
      linear_forward(A(p.out), A(p.in), P(p.p0), nullptr, N, d, static_cast<int>(m.vocab));
      return;
    case OpKind::kCrossEntropy: {
      const CrossEntropyResult r = cross_entropy_forward(A(p.save), A(p.in), targets, N, static_cast<int>(m.vocab),
                                                         static_cast<float>(m.logit_z_loss_weight), counted_targets_);
      last_ce_ = r.ce;
      last_z_ = r.z_loss;
      return;
    }
  }
}

// --- backward ----------------------------------------------------------------------

float* CpuModel::grad_dst(int slot, bool accumulate, int staging) {
  if (!accumulate) return D(slot);
  return scratch2_.data() + static_cast<size_t>(staging) * (scratch2_.size() / 2);
}

void CpuModel::grad_done(int slot, bool accumulate, int staging) {
  if (!accumulate) return;
  add_inplace(D(slot), scratch2_.data() + static_cast<size_t>(staging) * (scratch2_.size() / 2),
              static_cast<size_t>(N_ * slots_[static_cast<size_t>(slot)].width));
}

void CpuModel::zero_if_first(int slot, bool accumulate) {
  if (accumulate) return;
  std::fill(D(slot), D(slot) + N_ * slots_[static_cast<size_t>(slot)].width, 0.0f);
}

void CpuModel::backward() {
  for (size_t i = graph_.ops.size(); i-- > 0;) {
    if (!timer_) {
      backward_op(i);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    backward_op(i);
    timer_(i, 1, t0, std::chrono::steady_clock::now());
  }
}

void CpuModel::backward_op(size_t i) {
  const models::Op& op = graph_.ops[i];
  const auto& m = graph_.model;
  const OpPlan& p = plan_[i];
  const int N = static_cast<int>(N_), B = static_cast<int>(B_), T = static_cast<int>(T_);
  const int d = static_cast<int>(m.d_model), hd = static_cast<int>(m.attention.head_dim);
  auto w = [&](int slot) { return static_cast<int>(slots_[static_cast<size_t>(slot)].width); };
  switch (op.kind) {
    case OpKind::kCrossEntropy: {
      float* dl = grad_dst(p.in, p.acc_in);
      cross_entropy_backward(dl, A(p.in), A(p.save), targets_, N, static_cast<int>(m.vocab),
                             static_cast<float>(m.logit_z_loss_weight), counted_targets_);
      grad_done(p.in, p.acc_in);
      return;
    }
    case OpKind::kLmHead:
      linear_backward(D(p.in), G(p.p0), nullptr, D(p.out), A(p.in), P(p.p0), N, d, static_cast<int>(m.vocab),
                      p.acc_in);
      return;
    case OpKind::kResidualAdd:
      zero_if_first(p.in, p.acc_in);
      zero_if_first(p.in2, p.acc_in2);
      residual_backward(D(p.in), D(p.in2), D(p.out), static_cast<size_t>(N_ * d));
      return;
    case OpKind::kSharedMlp:
      if (p.in2 >= 0) {
        zero_if_first(p.in2, p.acc_in2);
        add_inplace(D(p.in2), D(p.out), static_cast<size_t>(N_ * d));
      }
      dense_swiglu_backward(D(p.in), G(p.p0), G(p.p1), G(p.p2), D(p.out), A(p.in), A(p.save), A(p.save2), A(p.save3),
                            P(p.p0), P(p.p1), P(p.p2), scratch_.data(), N, d, w(p.save), p.acc_in);
      return;
    case OpKind::kCombine: {
      const MoeState& s = moe_[static_cast<size_t>(p.moe)];
      float* dys = grad_dst(p.in, p.acc_in, 0);
      float* dweight = grad_dst(p.in2, p.acc_in2, 1);
      moe_combine_backward(dys, dweight, D(p.out), A(p.in), A(p.in2), s.sorted_pos.data(), N, s.k, s.L);
      grad_done(p.in, p.acc_in, 0);
      grad_done(p.in2, p.acc_in2, 1);
      return;
    }
    case OpKind::kExpertMlp: {
      const MoeState& s = moe_[static_cast<size_t>(p.moe)];
      float* dxs = grad_dst(p.in, p.acc_in);
      if (experts_) {
        experts_->backward(expert_layer(p), D(p.out), dxs);
        grad_done(p.in, p.acc_in);
        return;
      }
      experts_backward(dxs, G(p.p0), G(p.p1), G(p.p2), D(p.out), A(p.in), A(p.save), A(p.save2), A(p.save3),
                       s.offsets.data(), s.keep.empty() ? nullptr : s.keep.data(), P(p.p0), P(p.p1), P(p.p2),
                       scratch_.data(), N * s.k, s.E, s.L, s.F);
      grad_done(p.in, p.acc_in);
      return;
    }
    case OpKind::kDispatch: {
      const MoeState& s = moe_[static_cast<size_t>(p.moe)];
      float* dx = grad_dst(p.in, p.acc_in);
      moe_gather_backward(dx, D(p.out), s.sorted_pos.data(), N, s.k, s.L);
      grad_done(p.in, p.acc_in);
      // The weights only choose drop priority: no gradient, but the slot's
      // gradient must exist for its "+=" readers.
      zero_if_first(p.in2, p.acc_in2);
      return;
    }
    case OpKind::kTopK: {
      const MoeState& s = moe_[static_cast<size_t>(p.moe)];
      float* dl = grad_dst(p.in, p.acc_in);
      router_backward(dl, D(p.out), A(p.out), s.expert.data(), A(p.in), N, s.E, s.k, router_kind(m),
                      static_cast<float>(m.moe.routing_weight_sum));
      grad_done(p.in, p.acc_in);
      return;
    }
    case OpKind::kRouter: {
      const MoeState& s = moe_[static_cast<size_t>(p.moe)];
      linear_backward(D(p.in), G(p.p0), nullptr, D(p.out), A(p.in), P(p.p0), N, d, s.E, p.acc_in);
      return;
    }
    case OpKind::kAttnGate: {
      float* d_o = grad_dst(p.in, p.acc_in);
      attn_gate_backward(d_o, D(p.in2), G(p.p0), D(p.out), A(p.in), A(p.in2), A(p.save), P(p.p0), scratch_.data(), N,
                         d, static_cast<int>(op.heads), hd, p.acc_in2);
      grad_done(p.in, p.acc_in);
      return;
    }
    case OpKind::kXsa: {
      float* d_o = grad_dst(p.in, p.acc_in);
      zero_if_first(p.in2, p.acc_in2);
      xsa_backward(d_o, D(p.in2), D(p.out), A(p.in), A(p.in2), N, static_cast<int>(op.heads), w(p.in2) / hd,
                   static_cast<int>(op.kv_heads), hd, kXsaEps);
      grad_done(p.in, p.acc_in);
      return;
    }
    case OpKind::kAttention: {
      float* dq = grad_dst(p.in, p.acc_in);
      const bool acc_kv = p.acc_in2 || p.acc_in3;
      if (acc_kv) {
        zero_if_first(p.in2, p.acc_in2);
        zero_if_first(p.in3, p.acc_in3);
      }
      attention_backward(dq, D(p.in2), D(p.in3), D(p.out), A(p.in), A(p.in2), A(p.in3), A(p.out), A(p.save), doc_, B,
                         T, static_cast<int>(op.heads), w(p.in2) / hd, static_cast<int>(op.kv_heads), hd,
                         static_cast<int>(op.window), 1.0f / std::sqrt(static_cast<float>(op.qk_head_dim)), acc_kv);
      grad_done(p.in, p.acc_in);
      return;
    }
    case OpKind::kRope: {
      const auto theta = static_cast<float>(m.attention.rope_theta);
      float* dq = grad_dst(p.in, p.acc_in, 0);
      float* dk = grad_dst(p.in2, p.acc_in2, 1);
      rope_backward(dq, D(p.out), pos_.data(), N, w(p.in) / hd, hd, p.rot_dims, theta);
      rope_backward(dk, D(p.out2), pos_.data(), N, w(p.in2) / hd, hd, p.rot_dims, theta);
      grad_done(p.in, p.acc_in, 0);
      grad_done(p.in2, p.acc_in2, 1);
      return;
    }
    case OpKind::kQkNorm: {
      const auto mult = static_cast<float>(m.attention.qk_norm_multiplier);
      float* dq = grad_dst(p.in, p.acc_in, 0);
      float* dk = grad_dst(p.in2, p.acc_in2, 1);
      rmsnorm_noparam_backward(dq, D(p.out), A(p.in), A(p.save), mult, N * (w(p.in) / hd), hd);
      rmsnorm_noparam_backward(dk, D(p.out2), A(p.in2), A(p.save2), mult, N * (w(p.in2) / hd), hd);
      grad_done(p.in, p.acc_in, 0);
      grad_done(p.in2, p.acc_in2, 1);
      return;
    }
    case OpKind::kSConv: {
      float* dx = grad_dst(p.in, p.acc_in);
      sconv_backward(dx, G(p.p0), D(p.out), A(p.in), P(p.p0), doc_, B, T, w(p.in), static_cast<int>(m.sconv.kernel));
      grad_done(p.in, p.acc_in);
      return;
    }
    case OpKind::kLinear:
      linear_backward(D(p.in), G(p.p0), nullptr, D(p.out), A(p.in), P(p.p0), N, w(p.in), w(p.out), p.acc_in);
      return;
    case OpKind::kGatedNorm: {
      float* dx = grad_dst(p.in, p.acc_in);
      gated_norm_backward(dx, G(p.p0), G(p.p1), D(p.out), A(p.in), A(p.save), A(p.save2), P(p.p0), P(p.p1),
                          scratch_.data(), N, d, w(p.save));
      grad_done(p.in, p.acc_in);
      return;
    }
    case OpKind::kRmsNorm: {
      float* dx = grad_dst(p.in, p.acc_in);
      rmsnorm_backward(dx, G(p.p0), D(p.out), A(p.in), A(p.save), P(p.p0), N, w(p.in));
      grad_done(p.in, p.acc_in);
      return;
    }
    case OpKind::kEmbedding:
      embedding_backward(G(p.p0), D(p.out), tokens_, N, d, static_cast<int>(m.vocab));
      return;
  }
}

// --- finiteness --------------------------------------------------------------------

bool CpuModel::op_output_finite(size_t i) {
  const OpPlan& p = plan_[i];
  for (int s : {p.out, p.out2}) {
    if (s >= 0 && !all_finite(A(s), N_ * slots_[static_cast<size_t>(s)].width)) return false;
  }
  if (graph_.ops[i].kind == OpKind::kCrossEntropy) return std::isfinite(last_ce_) && std::isfinite(last_z_);
  return true;
}

bool CpuModel::op_grads_finite(size_t i) {
  const OpPlan& p = plan_[i];
  for (int s : {p.in, p.in2, p.in3}) {
    if (s >= 0 && !all_finite(D(s), N_ * slots_[static_cast<size_t>(s)].width)) return false;
  }
  for (int q : {p.p0, p.p1, p.p2}) {
    if (q >= 0 && !all_finite(G(q), grads_.view(static_cast<size_t>(q)).numel)) return false;
  }
  return true;
}

std::string CpuModel::find_nonfinite_forward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_ids) {
  tokens_ = inputs;
  targets_ = targets;
  doc_ = doc_ids;
  const bool was_training = training_;
  training_ = false;  // a diagnosis must not move the QB histogram
  std::string culprit;
  // With an expert backend every op runs (its exchanges are collectives all
  // ranks must join); the first culprit is kept.
  for (size_t i = 0; i < graph_.ops.size() && (culprit.empty() || experts_); ++i) {
    forward_op(i, inputs, targets, doc_ids);
    if (culprit.empty() && !op_output_finite(i)) culprit = graph_.ops[i].name;
  }
  training_ = was_training;
  return culprit;
}

std::string CpuModel::find_nonfinite_backward() {
  zero_grads();
  std::string culprit;
  for (size_t i = graph_.ops.size(); i-- > 0;) {
    backward_op(i);
    if (culprit.empty() && !op_grads_finite(i)) culprit = graph_.ops[i].name + " (backward)";
    if (!culprit.empty() && !experts_) break;
  }
  return culprit;
}

}  // namespace rackstep::exec
