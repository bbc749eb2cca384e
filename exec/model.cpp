// The CPU model: plan (who reads what), init, forward, backward. See model.h.
#include "exec/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numbers>

#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec {

using models::OpKind;

namespace {

bool has_router_losses(const models::ModelConfig& m) {
  return m.moe.experts > 0 &&
         (m.moe.balancing == models::BalancingKind::kAuxLoss || m.moe.router_z_loss_applied);
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

// y (rows, wy) from x (rows, wx): the first min(wx, wy) columns, zeros after
// (or added into y with accumulate). Slices and pads heads, splits and joins
// the columns of a two-output linear.
void copy_columns(float* y, int64_t wy, const float* x, int64_t wx, int64_t rows, bool accumulate = false) {
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

// MLA key: k (N, H, hd + r) = [k_nope (N, H, hd) | k_rope (N, r) for every head].
void assemble_key(float* k, const float* k_nope, const float* k_rope, int64_t N, int64_t H, int64_t hd, int64_t r) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      float* kr = k + (n * H + h) * (hd + r);
      std::copy(k_nope + (n * H + h) * hd, k_nope + (n * H + h + 1) * hd, kr);
      std::copy(k_rope + n * r, k_rope + (n + 1) * r, kr + hd);
    }
}

// Its backward: dk_nope = dk[..., :hd], dk_rope = Σ_h dk[..., hd:] (= or +=).
void split_key_grad(float* dk_nope, bool acc_nope, float* dk_rope, bool acc_rope, const float* dk, int64_t N,
                    int64_t H, int64_t hd, int64_t r) {
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

RouterKind router_kind(const models::ModelConfig& m) {
  return m.moe.router == models::RouterKind::kSoftmax ? RouterKind::kSoftmax : RouterKind::kSigmoid;
}

}  // namespace

// --- plan --------------------------------------------------------------------------

CpuModel::CpuModel(const models::LayerGraph& graph, int64_t batch, int64_t seq)
    : graph_(graph), B_(batch), T_(seq), N_(batch * seq) {
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

// The data flow is the layer graph's (models::Op::inputs / outputs): every
// (B, T, ...) f32 output gets an activation slot, every input is the slot its
// name was written to. Per op kind, this backend adds the buffers its kernels
// keep for backward ("save") and sizes their scratch. No op is recognised by
// its name: a new architecture needs a new declaration in the layer graph, not
// a change here.
namespace {

// An activation this backend holds in the arena; i32 tensors (token and expert
// ids) live in the batch and the routing state, the scalar loss in LossResult.
bool in_arena(const models::TensorDecl& t) {
  return t.dtype == models::DType::kF32 && t.shape.size() >= 2 && t.shape[0].name == "B" &&
         t.shape[1].name == "T";
}

}  // namespace

void CpuModel::plan(const models::LayerGraph& g) {
  const auto& m = g.model;
  const int64_t d = m.d_model;
  std::map<std::string, int> slot_of;   // tensor name -> activation slot
  std::map<int32_t, int> moe_of_layer;  // layer -> index into moe_
  size_t scratch = 0;  // kernel scratch floats
  auto param_index = [&](const models::Op& op, size_t j) {
    if (j >= op.params.size() || !op.params[j].learnable) return -1;
    const int64_t idx = params_.layout().find(op.params[j].name);
    RS_CHECK(idx >= 0, "layer-graph parameter missing from the arena: " + op.params[j].name);
    return static_cast<int>(idx);
  };
  auto width = [&](int slot) { return slots_[static_cast<size_t>(slot)].width; };
  const std::string flow_error = models::check_data_flow(g);
  RS_CHECK(flow_error.empty(), "layer graph data flow: " + flow_error);
  plan_.resize(g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const models::Op& op = g.ops[i];
    OpPlan& p = plan_[i];
    p.p0 = param_index(op, 0);
    p.p1 = param_index(op, 1);
    p.p2 = param_index(op, 2);
    if (!op.shared_param.empty()) {  // the tied LM head reads the embedding table
      const int64_t idx = params_.layout().find(op.shared_param);
      RS_CHECK(idx >= 0 && p.p0 < 0, "shared parameter missing from the arena: " + op.shared_param);
      p.p0 = static_cast<int>(idx);
      p.tied = true;
    }
    std::vector<int> in, out;
    for (const models::TensorDecl& t : op.inputs) {
      if (in_arena(t)) in.push_back(slot_of.at(t.name));
    }
    for (const models::TensorDecl& t : op.outputs) {
      if (!in_arena(t)) continue;
      const int s = new_slot(t.elems_per_token());
      slot_of[t.name] = s;
      out.push_back(s);
    }
    const auto at = [](const std::vector<int>& v, size_t j) { return j < v.size() ? v[j] : -1; };
    // The layer graph's convention (add_attention_core): an MLA key arrives in
    // two parts, one input more than the op's (q, k[, v]).
    const size_t arity = op.kind == OpKind::kAttention ? 3 : 2;
    const bool mla_key = (op.kind == OpKind::kQkNorm || op.kind == OpKind::kRope || op.kind == OpKind::kAttention) &&
                         op.inputs.size() == arity + 1;
    if (mla_key) {
      // (q, k_nope, k_rope[, v]) -> q, the assembled key, [v].
      const int64_t qk_w = op.heads * op.qk_head_dim;
      p.k_nope = in[1];
      p.k_rope = in[2];
      in.erase(in.begin() + 2);
      in[1] = new_slot(qk_w);
    }
    RS_CHECK(in.size() <= 3 && out.size() <= 2, "an op with more inputs or outputs than the CPU backend takes: " + op.name);
    p.in = at(in, 0);
    p.in2 = at(in, 1);
    p.in3 = at(in, 2);
    p.out = at(out, 0);
    p.out2 = at(out, 1);
    if (op.layer >= 0 && moe_of_layer.count(op.layer)) p.moe = moe_of_layer.at(op.layer);
    switch (op.kind) {
      case OpKind::kEmbedding:
      case OpKind::kLinear:
      case OpKind::kResidualAdd:
      case OpKind::kTopK:
      case OpKind::kDispatch:
      case OpKind::kCombine:
        break;
      case OpKind::kLmHead:
        logits_slot_ = p.out;
        break;
      case OpKind::kRmsNorm:
        p.save = new_slot(1);  // rstd
        break;
      case OpKind::kGatedNorm: {
        const int64_t r = op.params[0].shape[1];
        p.save = new_slot(r);   // a = x·W_down
        p.save2 = new_slot(d);  // g
        scratch = std::max(scratch, gated_norm_scratch_floats(static_cast<int>(N_), static_cast<int>(d),
                                                              static_cast<int>(r)));
        break;
      }
      case OpKind::kSConv:
        RS_CHECK(width(p.in) == op.params[0].shape[0], "SConv channels differ from its kernel: " + op.name);
        break;
      case OpKind::kQkNorm:
        p.save = new_slot(width(p.in) / op.qk_head_dim);    // q rstd per head
        p.save2 = new_slot(width(p.in2) / op.qk_head_dim);  // k rstd per head
        break;
      case OpKind::kRope: {
        const double rot = op.rope_fraction * static_cast<double>(op.qk_head_dim);
        p.rot_dims = static_cast<int>(std::lround(rot));
        if (std::abs(rot - p.rot_dims) > 1e-9 || p.rot_dims % 2 != 0) {
          throw UserError(m.source_file, "/attention/local/rope_fraction",
                          "a fraction giving an even number of rotated dims per head", std::to_string(op.rope_fraction));
        }
        break;
      }
      case OpKind::kAttention:
        p.save = new_slot(op.heads);  // lse, stored (B, H, T)
        if (op.qk_head_dim != op.head_dim) {
          p.v_pad = new_slot(width(p.in3) / op.head_dim * op.qk_head_dim);
          p.o_pad = new_slot(op.heads * op.qk_head_dim);
        }
        break;
      case OpKind::kXsa:
        break;
      case OpKind::kAttnGate:
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
        p.moe = moe_of_layer[op.layer] = static_cast<int>(moe_.size()) - 1;
        p.p1 = -1;  // the bias is a selection input, read by top-k
        break;
      }
      case OpKind::kExpertMlp: {
        const MoeState& s = moe_[static_cast<size_t>(p.moe)];
        p.save = new_slot(s.k * s.F);   // a1
        p.save2 = new_slot(s.k * s.F);  // a3
        p.save3 = new_slot(s.k * s.F);  // h
        scratch = std::max(scratch, experts_scratch_floats(static_cast<int>(N_ * s.k), s.L, s.F));
        break;
      }
      case OpKind::kSharedMlp: {
        const int64_t F = op.params[0].shape[1];
        p.save = new_slot(F);
        p.save2 = new_slot(F);
        p.save3 = new_slot(F);
        scratch = std::max(scratch, static_cast<size_t>(3 * N_ * F));
        break;
      }
      case OpKind::kCrossEntropy:
        p.save = lse_slot_ = new_slot(1);
        break;
    }
    if (op.kind == OpKind::kLinear) {
      const int64_t out_w = width(p.out) + (p.out2 >= 0 ? width(p.out2) : 0);
      RS_CHECK(width(p.in) == op.params[0].shape[0], "linear input width differs from its weight: " + op.name);
      RS_CHECK(out_w == op.params[0].shape[1], "linear output width differs from its weight: " + op.name);
      if (p.out2 >= 0) p.joined = new_slot(out_w);
    }
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
    mark(p.k_nope, p.acc_k_nope);
    mark(p.k_rope, p.acc_k_rope);
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

std::vector<uint8_t> CpuModel::kept_assignments(int layer) const {
  for (const MoeState& s : moe_) {
    if (s.layer != layer) continue;
    std::vector<uint8_t> kept(s.expert.size(), 1);
    if (s.keep.empty()) return kept;
    for (size_t a = 0; a < kept.size(); ++a) kept[a] = s.keep[static_cast<size_t>(s.sorted_pos[a])];
    return kept;
  }
  return {};
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
    if (has_router_losses(graph_.model)) {
      throw UserError(graph_.model.source_file, "/moe/balancing",
                      "one process for the router losses (aux_loss, router_z_loss_applied)",
                      "a data-parallel run");
    }
    RS_CHECK(loss_tokens_ >= counted_targets_, "the global batch has fewer targets than this slice");
    counted_targets_ = loss_tokens_;
  }
  if (counted_targets_ == 0) throw UserError("batch: expected at least one target token, found none");
  LossResult r;
  router_loss_ = 0;
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
  r.router_loss = router_loss_;
  r.loss = r.ce + r.z_loss + r.router_loss;
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
  const int qk = static_cast<int>(op.qk_head_dim);  // q/k head dim of attention ops (= hd but for MLA)
  if (p.k_nope >= 0) assemble_key(A(p.in2), A(p.k_nope), A(p.k_rope), N_, op.heads, hd, qk - hd);
  switch (op.kind) {
    case OpKind::kEmbedding:  // tokens (N) -> resid (N, d)
      embedding_forward(A(p.out), inputs, P(p.p0), N, d, static_cast<int>(m.vocab));
      return;
    case OpKind::kRmsNorm:  // (N, width) -> (N, width)
      if (m.norm.kind == models::NormKind::kLayerNorm) {
        layernorm_forward(A(p.out), A(p.save), A(p.in), P(p.p0), eps, N, w(p.in));
        return;
      }
      rmsnorm_forward(A(p.out), A(p.save), A(p.in), P(p.p0), eps, N, w(p.in));
      return;
    case OpKind::kGatedNorm:  // x (N, d) -> x * sigmoid(silu(x W_down) W_up) (N, d)
      gated_norm_forward(A(p.out), A(p.save), A(p.save2), A(p.in), P(p.p0), P(p.p1), N, d, w(p.save));
      return;
    case OpKind::kLinear:  // (N, in) -> (N, out)
      if (p.joined >= 0) {  // two outputs: (N, out) and (N, out2), the weight's columns in that order
        linear_forward(A(p.joined), A(p.in), P(p.p0), nullptr, N, w(p.in), w(p.joined));
        copy_columns(A(p.out), w(p.out), A(p.joined), w(p.joined), N_);
        copy_columns(A(p.out2), w(p.out2), A(p.joined) + w(p.out), w(p.joined), N_);
        return;
      }
      linear_forward(A(p.out), A(p.in), P(p.p0), nullptr, N, w(p.in), w(p.out));
      return;
    case OpKind::kSConv:  // (B, T, C) -> (B, T, C), causal along T inside each document
      sconv_forward(A(p.out), A(p.in), P(p.p0), doc, B, T, w(p.in), static_cast<int>(m.sconv.kernel));
      return;
    case OpKind::kQkNorm: {  // q (N, H, qk), k (N, kv, qk) -> the same, RMS-normalised per head
      const auto mult = static_cast<float>(m.attention.qk_norm_multiplier);
      rmsnorm_noparam_forward(A(p.out), A(p.save), A(p.in), mult, eps, N * (w(p.in) / qk), qk);
      rmsnorm_noparam_forward(A(p.out2), A(p.save2), A(p.in2), mult, eps, N * (w(p.in2) / qk), qk);
      return;
    }
    case OpKind::kRope: {  // q (N, H, qk), k (N, kv, qk) -> the leading rot_dims of each head rotated
      const auto theta = static_cast<float>(m.attention.rope_theta);
      rope_forward(A(p.out), A(p.in), pos_.data(), N, w(p.in) / qk, qk, p.rot_dims, theta);
      rope_forward(A(p.out2), A(p.in2), pos_.data(), N, w(p.in2) / qk, qk, p.rot_dims, theta);
      return;
    }
    case OpKind::kAttention:  // q (N, H, qk), k (N, kv, qk), v (N, kv, hd) -> (N, H, hd)
      if (p.v_pad >= 0) {  // qk > hd (MLA): run at qk with v zero-padded, keep the first hd
        copy_columns(A(p.v_pad), qk, A(p.in3), hd, N_ * (w(p.in3) / hd));
        attention_forward(A(p.o_pad), A(p.save), A(p.in), A(p.in2), A(p.v_pad), doc, B, T,
                          static_cast<int>(op.heads), w(p.in2) / qk, static_cast<int>(op.kv_heads), qk,
                          static_cast<int>(op.window), 1.0f / std::sqrt(static_cast<float>(qk)));
        copy_columns(A(p.out), hd, A(p.o_pad), qk, N_ * op.heads);
        return;
      }
      attention_forward(A(p.out), A(p.save), A(p.in), A(p.in2), A(p.in3), doc, B, T, static_cast<int>(op.heads),
                        w(p.in2) / hd, static_cast<int>(op.kv_heads), hd, static_cast<int>(op.window),
                        1.0f / std::sqrt(static_cast<float>(op.qk_head_dim)));
      return;
    case OpKind::kXsa:  // o (N, H, hd), v (N, kv, hd) -> o minus its component along its own v
      xsa_forward(A(p.out), A(p.in), A(p.in2), N, static_cast<int>(op.heads), w(p.in2) / hd,
                  static_cast<int>(op.kv_heads), hd, kXsaEps);
      return;
    case OpKind::kAttnGate:  // o (N, H, hd), x (N, d) -> o * 2 sigmoid(x W_gate) per head
      attn_gate_forward(A(p.out), A(p.save), A(p.in), A(p.in2), P(p.p0), N, d, static_cast<int>(op.heads), hd);
      return;
    case OpKind::kRouter: {  // x (N, d) -> router logits (N, E)
      MoeState& s = moe_[static_cast<size_t>(p.moe)];
      linear_forward(A(p.out), A(p.in), P(p.p0), nullptr, N, d, s.E);
      s.router_z = router_z_loss(A(p.out), N, s.E);
      if (m.moe.router_z_loss_applied) router_loss_ += m.moe.router_z_loss_weight * s.router_z;
      if (training_ && !s.hist.empty()) {
        qb_histogram(s.hist.data(), A(p.out), N, s.E, static_cast<int>(m.moe.balancing_bins), kQbLo, kQbHi);
      }
      return;
    }
    case OpKind::kTopK: {  // logits (N, E) -> weights (N, k) [+ expert ids (N, k) in the routing state]
      MoeState& s = moe_[static_cast<size_t>(p.moe)];
      const float* bias = s.bias_param >= 0 ? P(s.bias_param) : s.bias.data();
      router_forward(s.expert.data(), A(p.out), s.threshold.data(), A(p.in), bias, N, s.E, s.k, router_kind(m),
                     static_cast<float>(m.moe.routing_weight_sum));
      if (m.moe.balancing == models::BalancingKind::kAuxLoss) {
        router_loss_ += aux_loss_forward(A(p.in), s.expert.data(), N, s.E, s.k, router_kind(m),
                                         static_cast<float>(m.moe.aux_loss_weight));
      }
      return;
    }
    case OpKind::kDispatch: {  // moe_x (N, L) -> rows (N*k, L) grouped by expert; drops decided here
      MoeState& s = moe_[static_cast<size_t>(p.moe)];
      moe_group_by_expert(s.sorted_pos.data(), s.offsets.data(), s.expert.data(), N * s.k, s.E);
      dispatch_layer(s, A(p.in2));
      moe_gather_forward(A(p.out), A(p.in), s.sorted_pos.data(), N, s.k, s.L);
      return;
    }
    case OpKind::kExpertMlp: {  // rows (N*k, L) -> each row through its expert's SwiGLU (N*k, L)
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
    case OpKind::kCombine: {  // rows (N*k, L), weights (N, k) -> weighted sum per token (N, L)
      MoeState& s = moe_[static_cast<size_t>(p.moe)];
      moe_combine_forward(A(p.out), A(p.in), A(p.in2), s.sorted_pos.data(), N, s.k, s.L);
      return;
    }
    case OpKind::kSharedMlp:  // x (N, d) [, routed (N, d)] -> SwiGLU(x) [+ routed] (N, d)
      dense_swiglu_forward(A(p.out), A(p.save), A(p.save2), A(p.save3), A(p.in), P(p.p0), P(p.p1), P(p.p2), N, d,
                           w(p.save));
      if (p.in2 >= 0) add_inplace(A(p.out), A(p.in2), static_cast<size_t>(N_ * d));
      return;
    case OpKind::kResidualAdd:  // resid (N, d), branch (N, d) -> resid + branch (N, d)
      residual_forward(A(p.out), A(p.in), A(p.in2), static_cast<size_t>(N_ * d));
      return;
    case OpKind::kLmHead:  // (N, d) -> logits (N, V)
      if (p.tied) {
        linear_t_forward(A(p.out), A(p.in), P(p.p0), N, d, static_cast<int>(m.vocab));
        return;
      }
      linear_forward(A(p.out), A(p.in), P(p.p0), nullptr, N, d, static_cast<int>(m.vocab));
      return;
    case OpKind::kCrossEntropy: {  // logits (N, V), targets (N) -> mean CE + logit z-loss
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
  backward_kernels(i);
  const OpPlan& p = plan_[i];
  if (p.k_nope < 0) return;
  // The MLA key this op assembled: its gradient back to the two parts.
  const models::Op& op = graph_.ops[i];
  split_key_grad(D(p.k_nope), p.acc_k_nope, D(p.k_rope), p.acc_k_rope, D(p.in2), N_, op.heads, op.head_dim,
                 op.qk_head_dim - op.head_dim);
}

void CpuModel::backward_kernels(size_t i) {
  const models::Op& op = graph_.ops[i];
  const auto& m = graph_.model;
  const OpPlan& p = plan_[i];
  const int N = static_cast<int>(N_), B = static_cast<int>(B_), T = static_cast<int>(T_);
  const int d = static_cast<int>(m.d_model), hd = static_cast<int>(m.attention.head_dim);
  const int qk = static_cast<int>(op.qk_head_dim);
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
      if (p.tied) {
        linear_t_backward(D(p.in), G(p.p0), D(p.out), A(p.in), P(p.p0), N, d, static_cast<int>(m.vocab), p.acc_in);
        return;
      }
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
      if (m.moe.balancing == models::BalancingKind::kAuxLoss) {
        aux_loss_backward(D(p.in), A(p.in), s.expert.data(), N, s.E, s.k, router_kind(m),
                          static_cast<float>(m.moe.aux_loss_weight));
      }
      return;
    }
    case OpKind::kRouter: {
      const MoeState& s = moe_[static_cast<size_t>(p.moe)];
      if (m.moe.router_z_loss_applied) {
        router_z_loss_backward(D(p.out), A(p.out), N, s.E, static_cast<float>(m.moe.router_z_loss_weight));
      }
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
      if (p.v_pad >= 0) {  // MLA: at qk with v padded (see forward); k and v_pad have this reader only
        copy_columns(D(p.o_pad), qk, D(p.out), hd, N_ * op.heads);
        attention_backward(dq, D(p.in2), D(p.v_pad), D(p.o_pad), A(p.in), A(p.in2), A(p.v_pad), A(p.o_pad),
                           A(p.save), doc_, B, T, static_cast<int>(op.heads), w(p.in2) / qk,
                           static_cast<int>(op.kv_heads), qk, static_cast<int>(op.window),
                           1.0f / std::sqrt(static_cast<float>(qk)), false);
        grad_done(p.in, p.acc_in);
        copy_columns(D(p.in3), hd, D(p.v_pad), qk, N_ * (w(p.in3) / hd), p.acc_in3);
        return;
      }
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
      rope_backward(dq, D(p.out), pos_.data(), N, w(p.in) / qk, qk, p.rot_dims, theta);
      rope_backward(dk, D(p.out2), pos_.data(), N, w(p.in2) / qk, qk, p.rot_dims, theta);
      grad_done(p.in, p.acc_in, 0);
      grad_done(p.in2, p.acc_in2, 1);
      return;
    }
    case OpKind::kQkNorm: {
      const auto mult = static_cast<float>(m.attention.qk_norm_multiplier);
      float* dq = grad_dst(p.in, p.acc_in, 0);
      float* dk = grad_dst(p.in2, p.acc_in2, 1);
      rmsnorm_noparam_backward(dq, D(p.out), A(p.in), A(p.save), mult, N * (w(p.in) / qk), qk);
      rmsnorm_noparam_backward(dk, D(p.out2), A(p.in2), A(p.save2), mult, N * (w(p.in2) / qk), qk);
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
      if (p.joined >= 0) {  // two outputs: their gradients side by side, as the weight's columns
        copy_columns(D(p.joined), w(p.joined), D(p.out), w(p.out), N_);
        copy_columns(D(p.joined) + w(p.out), w(p.joined), D(p.out2), w(p.out2), N_, true);
        linear_backward(D(p.in), G(p.p0), nullptr, D(p.joined), A(p.in), P(p.p0), N, w(p.in), w(p.joined),
                        p.acc_in);
        return;
      }
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
      if (m.norm.kind == models::NormKind::kLayerNorm) {
        layernorm_backward(dx, G(p.p0), D(p.out), A(p.in), A(p.save), P(p.p0), N, w(p.in));
        grad_done(p.in, p.acc_in);
        return;
      }
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
