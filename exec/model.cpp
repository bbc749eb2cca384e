// The model driver: plan (who reads what), init, forward, backward. See model.h.
#include "exec/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numbers>

#include "exec/kernels.h"
#include "sim/base/check.h"
#include "sim/base/value_error.h"

namespace rackstep::exec {

using models::OpKind;

namespace {

bool has_router_losses(const models::ModelConfig& m) {
  return m.moe.experts > 0 &&
         (m.moe.balancing == models::BalancingKind::kAuxLoss || m.moe.router_z_loss_applied);
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

// The routed experts' biases (E, width): the op's tensors after its three matrices.
bool is_expert_bias(const models::Op& op, const models::ParamTensor& pt) {
  return op.kind == OpKind::kExpertMlp && op.expert_bias && &pt >= &op.params[3];
}

// SConv kernels start as the identity: tap K-1 (the current token) 1, the others 0.
void sconv_identity(float* w, int64_t C, int64_t K) {
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) w[c * K + j] = j == K - 1 ? 1.0f : 0.0f;
}

}  // namespace

// --- plan --------------------------------------------------------------------------

Model::Model(const models::LayerGraph& graph, int64_t batch, int64_t seq, std::unique_ptr<Backend> backend)
    : graph_(graph), B_(batch), T_(seq), N_(batch * seq), backend_(std::move(backend)) {
  if (batch < 1 || seq < 1) throw UserError("model batch: expected batch >= 1 and seq >= 1");
  if (!backend_) backend_ = make_backend("cpu");
  // The "other" group holds vectors (gains, biases, sinks, the routed experts'
  // (E, width) biases): the optimizer must update them elementwise, where a
  // Muon or hyperball group would treat a stack of them as a matrix.
  const auto& m = graph_.model;
  if (m.recipe.other != models::OptimizerKind::kAdam) {
    throw UserError(m.source_file, "/recipe/optimizer/other",
                    "adam (the group holds the gains, biases and sinks: vectors, updated elementwise)",
                    models::to_string(m.recipe.other));
  }
  params_ = Arena(std::make_shared<const ArenaLayout>(arena_specs_from_graph(graph_)));
  grads_ = Arena(params_.layout_ptr());
  plan(graph_);
  pos_.resize(static_cast<size_t>(N_));
  for (int64_t t = 0; t < N_; ++t) pos_[t] = static_cast<int32_t>(t % T_);
  allocate();
}

int Model::new_slot(int64_t width) {
  Slot s;
  s.offset = slots_.empty() ? 0 : slots_.back().offset + N_ * slots_.back().width;
  s.width = width;
  slots_.push_back(s);
  return static_cast<int>(slots_.size()) - 1;
}

// The data flow is the layer graph's (models::Op::inputs / outputs): every
// (B, T, ...) f32 output gets an activation slot, every input is the slot its
// name was written to. Per op kind, the plan adds the buffers the op set keeps
// for backward ("save", exec/backend.h). No op is recognised by
// its name: a new architecture needs a new declaration in the layer graph, not
// a change here.
namespace {

// An activation the driver holds in the arena; i32 tensors (token and expert
// ids) live in the batch and the routing state, the scalar loss in LossResult.
bool in_arena(const models::TensorDecl& t) {
  return t.dtype == models::DType::kF32 && t.shape.size() >= 2 && t.shape[0].name == "B" &&
         t.shape[1].name == "T";
}

}  // namespace

void Model::plan(const models::LayerGraph& g) {
  const auto& m = g.model;
  std::map<std::string, int> slot_of;   // tensor name -> activation slot
  std::map<int32_t, int> moe_of_layer;  // layer -> index into moe_
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
    p.p3 = param_index(op, 3);
    p.p4 = param_index(op, 4);
    p.p5 = param_index(op, 5);
    RS_CHECK(op.params.size() <= static_cast<size_t>(OpCall::kMaxParams), "an op with more parameters than a backend takes: " + op.name);
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
    RS_CHECK(in.size() <= 3 && out.size() <= 2, "an op with more inputs or outputs than a backend takes: " + op.name);
    p.in = at(in, 0);
    p.in2 = at(in, 1);
    p.in3 = at(in, 2);
    p.out = at(out, 0);
    p.out2 = at(out, 1);
    if (op.layer >= 0 && moe_of_layer.count(op.layer)) p.moe = moe_of_layer.at(op.layer);
    // The buffers the op set keeps for backward (rstd, lse, gates, SwiGLU's a1/a3/h).
    std::vector<int64_t> in_widths;
    for (int slot : in) in_widths.push_back(width(slot));
    const std::vector<int64_t> saved = saved_widths(op, m, in_widths);
    RS_CHECK(saved.size() <= 3, "an op keeping more buffers than a backend takes: " + op.name);
    p.save = saved.size() > 0 ? new_slot(saved[0]) : -1;
    p.save2 = saved.size() > 1 ? new_slot(saved[1]) : -1;
    p.save3 = saved.size() > 2 ? new_slot(saved[2]) : -1;
    switch (op.kind) {
      case OpKind::kEmbedding:
        if (op.params.size() > 1 && op.params[1].shape[0] < T_) {  // learned positions
          throw UserError(m.source_file, "/position_embedding/max_positions",
                          "at least the run's sequence length (" + std::to_string(T_) + ")",
                          std::to_string(op.params[1].shape[0]));
        }
        break;
      case OpKind::kLmHead:
        logits_slot_ = p.out;
        break;
      case OpKind::kSConv:
        RS_CHECK(width(p.in) == op.params[0].shape[0], "SConv channels differ from its kernel: " + op.name);
        break;
      case OpKind::kRope: {
        // DeepSeek's MLA YaRN scales the softmax by mscale² instead of cos and sin, and the
        // schema carries no mscale: the kernels run the GQA form (gpt-oss) only.
        if (op.rope_yarn && m.attention.kind == models::AttentionKind::kMla) {
          throw UserError(m.source_file, "/attention/rope_scaling",
                          "\"none\" with kind \"mla\" (the execution engine runs YaRN as gpt-oss's GQA has it)",
                          "\"yarn\"");
        }
        const double rot = op.rope_fraction * static_cast<double>(op.qk_head_dim);
        p.rot_dims = static_cast<int>(std::lround(rot));
        if (std::abs(rot - p.rot_dims) > 1e-9 || p.rot_dims % 2 != 0) {
          throw UserError(m.source_file, "/attention/local/rope_fraction",
                          "a fraction giving an even number of rotated dims per head", std::to_string(op.rope_fraction));
        }
        break;
      }
      case OpKind::kAttention:
        if (op.qk_head_dim != op.head_dim) {
          p.v_pad = new_slot(width(p.in3) / op.head_dim * op.qk_head_dim);
          p.o_pad = new_slot(op.heads * op.qk_head_dim);
        }
        break;
      case OpKind::kRouter: {
        MoeState s;
        s.layer = op.layer;
        s.E = static_cast<int>(m.moe.experts);
        s.k = static_cast<int>(m.moe.top_k);
        s.L = static_cast<int>(m.moe_width());
        s.F = static_cast<int>(m.moe.expert_width);
        s.expert.resize(static_cast<size_t>(N_ * s.k));
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
      default:
        break;
    }
    if (op.kind == OpKind::kLinear) {
      const int64_t out_w = width(p.out) + (p.out2 >= 0 ? width(p.out2) : 0);
      RS_CHECK(width(p.in) == op.params[0].shape[0], "linear input width differs from its weight: " + op.name);
      RS_CHECK(out_w == op.params[0].shape[1], "linear output width differs from its weight: " + op.name);
      if (p.out2 >= 0) p.joined = new_slot(out_w);
    }
  }
  RS_CHECK(logits_slot_ >= 0, "layer graph without LM head");

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
  act_floats_ = static_cast<size_t>(slots_.back().offset + N_ * slots_.back().width);

  // A parameter gradient's last write in the backward is by the first op (in
  // op order) that writes it; one no op writes is final from the start.
  const ArenaLayout& layout = params_.layout();
  std::vector<size_t> first_writer(layout.size(), plan_.size());
  for (size_t i = plan_.size(); i-- > 0;) {
    for (int q : {plan_[i].p0, plan_[i].p1, plan_[i].p2, plan_[i].p3, plan_[i].p4, plan_[i].p5}) {
      if (q >= 0) first_writer[static_cast<size_t>(q)] = i;
    }
  }
  // After op i's backward the tensors from t on are final: t is the lowest
  // index with every first writer from t on >= i, and only goes down with i.
  grads_final_from_.assign(plan_.size(), 0);
  size_t t = layout.size();
  for (size_t i = plan_.size(); i-- > 0;) {
    while (t > 0 && first_writer[t - 1] >= i) --t;
    grads_final_from_[i] = t < layout.size() ? layout.offset(t) : layout.total_floats();
  }
}

// Every buffer the ops touch, in the backend's memory.
void Model::allocate() {
  Backend& be = *backend_;
  act_buf_ = be.allocate(act_floats_ * sizeof(float));
  dact_buf_ = be.allocate(act_floats_ * sizeof(float));
  act_ = act_buf_->as<float>();
  dact_ = dact_buf_->as<float>();
  if (be.uses_host_memory()) {
    param_dev_ = params_.data();
    grad_dev_ = grads_.data();
  } else {
    param_buf_ = be.allocate(params_.bytes());
    grad_buf_ = be.allocate(grads_.bytes());
    param_dev_ = param_buf_->as<float>();
    grad_dev_ = grad_buf_->as<float>();
  }
  const size_t n = static_cast<size_t>(N_);
  batch_buf_ = be.allocate(4 * n * sizeof(int32_t));
  tokens_ = batch_buf_->as<int32_t>();
  targets_ = tokens_ + n;
  doc_ = tokens_ + 2 * n;
  pos_dev_ = tokens_ + 3 * n;
  be.copy_to_backend(pos_dev_, pos_.data(), n * sizeof(int32_t));
  for (MoeState& s : moe_) {
    auto buffer = [&](size_t bytes) {
      s.buffers.push_back(be.allocate(bytes));
      return s.buffers.back()->data();
    };
    const size_t A = n * static_cast<size_t>(s.k);
    s.dev.E = s.E;
    s.dev.k = s.k;
    s.dev.L = s.L;
    s.dev.F = s.F;
    s.dev.expert = static_cast<int32_t*>(buffer(A * sizeof(int32_t)));
    s.dev.threshold = static_cast<float*>(buffer(n * sizeof(float)));
    s.dev.sorted_pos = static_cast<int32_t*>(buffer(A * sizeof(int32_t)));
    s.dev.offsets = static_cast<int32_t*>(buffer((static_cast<size_t>(s.E) + 1) * sizeof(int32_t)));
    s.keep_dev = static_cast<uint8_t*>(buffer(A));
    s.bias_dev = static_cast<float*>(buffer(s.bias.size() * sizeof(float)));
    s.counts.assign(static_cast<size_t>(s.E), 0);
    s.counts_dev = static_cast<int64_t*>(buffer(s.counts.size() * sizeof(int64_t)));
    if (!s.hist.empty()) s.dev.hist = static_cast<int64_t*>(buffer(s.hist.size() * sizeof(int64_t)));
  }
}

// --- parameters --------------------------------------------------------------------

void Model::init_params(uint64_t seed) {
  const auto& m = graph_.model;
  const double std_dev = m.init_std_scale / std::sqrt(static_cast<double>(m.d_model));
  for (const models::Op& op : graph_.ops) {
    for (const models::ParamTensor& pt : op.params) {
      if (!pt.learnable) continue;
      TensorView w = params_.view(pt.name);
      if (op.kind == OpKind::kSConv) {
        sconv_identity(w.data, pt.shape[0], pt.shape[1]);
      } else if (op.kind == OpKind::kRmsNorm) {
        std::fill(w.data, w.data + w.numel, 1.0f);
      } else if (pt.shape.size() == 1 || is_expert_bias(op, pt)) {
        std::fill(w.data, w.data + w.numel, 0.0f);  // a bias (router, linear, MLP, routed experts)
      } else {
        // One stream per tensor, keyed by its name: init does not depend on op order.
        uint64_t state = checksum64(pt.name.data(), pt.name.size(), seed);
        for (int64_t i = 0; i < w.numel; ++i) w.data[i] = static_cast<float>(std_dev * normal(state));
      }
    }
  }
  if (!backend_->uses_host_memory()) params_fresh_ = Fresh::kHost;  // every tensor written: the host is newer
  for (MoeState& s : moe_) {
    std::fill(s.bias.begin(), s.bias.end(), 0.0f);
    std::fill(s.hist.begin(), s.hist.end(), 0);
    backend_->copy_to_backend(s.bias_dev, s.bias.data(), s.bias.size() * sizeof(float));
    if (s.dev.hist) backend_->copy_to_backend(s.dev.hist, s.hist.data(), s.hist.size() * sizeof(int64_t));
    s.hist_on_host = false;
  }
}

void Model::zero_grads() {
  if (backend_->uses_host_memory()) {
    grads_.zero();
    return;
  }
  backend_->fill_zero(grad_dev_, grads_.total_floats());
  grads_fresh_ = Fresh::kBackend;
}

// --- the arenas' two copies (a backend outside host memory) ------------------------

void Model::host_current(Arena& host, const float* dev, Fresh& fresh) const {
  if (fresh != Fresh::kBackend) return;
  backend_->copy_to_host(host.data(), dev, host.bytes());
  arena_copy_bytes_ += host.bytes();
  fresh = Fresh::kBoth;
}

void Model::backend_current(const Arena& host, float* dev, Fresh& fresh) {
  if (fresh != Fresh::kHost) return;
  backend_->copy_to_backend(dev, host.data(), host.bytes());
  arena_copy_bytes_ += host.bytes();
  fresh = Fresh::kBoth;
}

Arena& Model::params() {
  if (backend_->uses_host_memory()) return params_;
  host_current(params_, param_dev_, params_fresh_);
  params_fresh_ = Fresh::kHost;
  return params_;
}

const Arena& Model::params() const {
  host_current(params_, param_dev_, params_fresh_);
  return params_;
}

Arena& Model::grads() {
  if (backend_->uses_host_memory()) return grads_;
  host_current(grads_, grad_dev_, grads_fresh_);
  grads_fresh_ = Fresh::kHost;
  return grads_;
}

const Arena& Model::grads() const {
  host_current(grads_, grad_dev_, grads_fresh_);
  return grads_;
}

float* Model::backend_params() {
  if (backend_->uses_host_memory()) return params_.data();
  backend_current(params_, param_dev_, params_fresh_);
  params_fresh_ = Fresh::kBackend;
  return param_dev_;
}

const float* Model::backend_grads() {
  if (backend_->uses_host_memory()) return grads_.data();
  backend_current(grads_, grad_dev_, grads_fresh_);
  return grad_dev_;
}

template <typename T>
const T* Model::host_view(const T* p, int64_t n, std::vector<T>& copy) const {
  if (backend_->uses_host_memory()) return p;
  copy.resize(static_cast<size_t>(n));
  backend_->copy_to_host(copy.data(), p, static_cast<size_t>(n) * sizeof(T));
  return copy.data();
}

void Model::set_dispatch(const DispatchOptions& d) {
  if (d.enabled) {
    sim::validate(d.config, d.ep);
    if (N_ % d.ep != 0) {
      throw ValueError("dispatch", "ep", "a divisor of the batch's " + std::to_string(N_) + " tokens",
                       std::to_string(d.ep));
    }
    if (!moe_.empty() && (d.config.n_experts != moe_[0].E || d.config.top_k != moe_[0].k)) {
      throw UserError("dispatch: expected the model's experts and top_k in the dispatch config");
    }
  }
  dispatch_ = d;
}

void Model::set_expert_backend(ExpertBackend* experts) {
  RS_CHECK(!experts || experts->uses_host_memory() == backend_->uses_host_memory(),
           "an expert backend exchanges rows in another memory than backend " + backend_->name() + "'s");
  experts_ = experts;
}

void Model::set_router_loss_share(int64_t global_tokens, CountReducer reduce_counts) {
  RS_CHECK(global_tokens >= N_ && reduce_counts, "a global batch holds this slice, and a reducer sums over the ranks");
  global_tokens_ = global_tokens;
  reduce_counts_ = std::move(reduce_counts);
  for (MoeState& s : moe_) s.dev.loss_share = static_cast<double>(N_) / static_cast<double>(global_tokens_);
}

void Model::update_balancing() {
  const auto& m = graph_.model;
  if (m.moe.balancing != models::BalancingKind::kQuantile) return;
  const int bins = static_cast<int>(m.moe.balancing_bins);
  for (MoeState& s : moe_) {
    if (s.hist_on_host) backend_->copy_to_backend(s.dev.hist, s.hist.data(), s.hist.size() * sizeof(int64_t));
    s.hist_on_host = false;
    backend_->update_balancing_bias(s.bias_dev, s.dev.hist, s.E, s.k, bins, kQbLo, kQbHi);
    backend_->copy_to_host(s.bias.data(), s.bias_dev, s.bias.size() * sizeof(float));
  }
}

std::vector<float> Model::balancing_state() const {
  std::vector<float> out;
  for (const MoeState& s : moe_) out.insert(out.end(), s.bias.begin(), s.bias.end());
  return out;
}

void Model::set_balancing_state(const std::vector<float>& bias) {
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
    backend_->copy_to_backend(s.bias_dev, s.bias.data(), s.bias.size() * sizeof(float));
    at += s.bias.size();
  }
}

std::vector<std::pair<int64_t*, size_t>> Model::balancing_histograms() {
  std::vector<std::pair<int64_t*, size_t>> out;
  for (MoeState& s : moe_) {
    if (s.hist.empty()) continue;
    backend_->copy_to_host(s.hist.data(), s.dev.hist, s.hist.size() * sizeof(int64_t));
    s.hist_on_host = true;
    out.emplace_back(s.hist.data(), s.hist.size());
  }
  return out;
}

ExpertLayer Model::expert_layer(const OpPlan& p) {
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
  l.act = expert_activation(graph_.model.moe);
  if (p.p3 < 0) return l;  // no expert biases
  l.b1 = P(p.p3);
  l.b3 = P(p.p4);
  l.b2 = P(p.p5);
  l.db1 = G(p.p3);
  l.db3 = G(p.p4);
  l.db2 = G(p.p5);
  return l;
}

const float* Model::logits() const {
  return host_view<float>(A(logits_slot_), N_ * W(logits_slot_), host_floats_);
}

const int32_t* Model::routed_experts(int layer) const {
  for (const MoeState& s : moe_)
    if (s.layer == layer) return s.expert.data();
  return nullptr;
}

std::vector<uint8_t> Model::kept_assignments(int layer) const {
  for (const MoeState& s : moe_) {
    if (s.layer != layer) continue;
    std::vector<uint8_t> kept(s.expert.size(), 1);
    if (s.keep.empty()) return kept;
    for (size_t a = 0; a < kept.size(); ++a) kept[a] = s.keep[static_cast<size_t>(s.sorted_pos[a])];
    return kept;
  }
  return {};
}

const float* Model::balancing_bias(int layer) const {
  for (const MoeState& s : moe_)
    if (s.layer == layer) return s.bias.data();
  return nullptr;
}

const float* Model::op_output(size_t i, int64_t* width) const {
  const int out = plan_[i].out;
  if (out < 0) return nullptr;
  if (width) *width = W(out);
  return host_view<float>(A(out), N_ * W(out), host_floats_);
}

// --- binding -------------------------------------------------------------------------

OpCall Model::bind(size_t i) {
  const models::Op& op = graph_.ops[i];
  const OpPlan& p = plan_[i];
  OpCall c;
  c.op = &op;
  c.model = &graph_.model;
  c.B = B_;
  c.T = T_;
  c.N = N_;
  auto bound = [&](int slot, bool accumulate = false) {
    Bound b;
    if (slot < 0) return b;
    b.value = A(slot);
    b.grad = D(slot);
    b.width = W(slot);
    b.accumulate = accumulate;
    return b;
  };
  c.in[0] = bound(p.in, p.acc_in);
  c.in[1] = bound(p.in2, p.acc_in2);
  c.in[2] = bound(p.in3, p.acc_in3);
  c.out[0] = bound(p.joined >= 0 ? p.joined : p.out);  // a two-output linear runs into its joined buffer
  if (p.joined < 0) c.out[1] = bound(p.out2);
  c.saved[0] = bound(p.save);
  c.saved[1] = bound(p.save2);
  c.saved[2] = bound(p.save3);
  if (p.v_pad >= 0) {  // MLA attention: at the q/k head dim on a zero-padded v (forward_op pads it)
    c.in[2] = bound(p.v_pad);
    c.out[0] = bound(p.o_pad);
  }
  const int params[OpCall::kMaxParams] = {p.p0, p.p1, p.p2, p.p3, p.p4, p.p5};
  for (int j = 0; j < OpCall::kMaxParams; ++j) {
    if (params[j] < 0) continue;
    c.w[j] = P(params[j]);
    c.dw[j] = G(params[j]);
  }
  c.tied = p.tied;
  c.rot_dims = p.rot_dims;
  c.tokens = tokens_;
  c.targets = targets_;
  c.doc = has_doc_ ? doc_ : nullptr;
  c.pos = pos_dev_;
  c.loss_tokens = counted_targets_;
  c.training = training_;
  if (p.moe >= 0) c.routing = &moe_[static_cast<size_t>(p.moe)].dev;
  return c;
}

// --- forward -----------------------------------------------------------------------

LossResult Model::forward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_ids) {
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
    RS_CHECK(!has_router_losses(graph_.model) || reduce_counts_,
             "a data-parallel slice with router losses needs set_router_loss_share");
    RS_CHECK(loss_tokens_ >= counted_targets_, "the global batch has fewer targets than this slice");
    counted_targets_ = loss_tokens_;
  }
  if (counted_targets_ == 0) throw UserError("batch: expected at least one target token, found none");
  load_batch(inputs, targets, doc_ids);
  LossResult r;
  router_loss_ = 0;
  for (size_t i = 0; i < graph_.ops.size(); ++i) op_timed(i, 0);
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

void Model::load_batch(const int32_t* inputs, const int32_t* targets, const int32_t* doc_ids) {
  const size_t bytes = static_cast<size_t>(N_) * sizeof(int32_t);
  if (!backend_->uses_host_memory()) backend_current(params_, param_dev_, params_fresh_);
  backend_->copy_to_backend(tokens_, inputs, bytes);
  backend_->copy_to_backend(targets_, targets, bytes);
  has_doc_ = doc_ids != nullptr;
  if (has_doc_) backend_->copy_to_backend(doc_, doc_ids, bytes);
  backend_->set_documents(has_doc_ ? doc_ : nullptr, doc_ids, B_, T_);
  if (backend_->uses_host_memory()) {  // the host arenas may have been reallocated (a checkpoint load)
    param_dev_ = params_.data();
    grad_dev_ = grads_.data();
  }
}

// The aux loss of a layer's selection; under data parallelism with the global
// batch's assignment fractions (every rank reduces its counts here).
double Model::aux_loss(MoeState& s, size_t i) {
  s.dev.counts = nullptr;
  if (reduce_counts_) {
    std::fill(s.counts.begin(), s.counts.end(), 0);
    for (int32_t e : s.expert) ++s.counts[static_cast<size_t>(e)];
    reduce_counts_(s.counts.data(), s.E);
    backend_->copy_to_backend(s.counts_dev, s.counts.data(), s.counts.size() * sizeof(int64_t));
    s.dev.counts = s.counts_dev;
    s.dev.count_tokens = global_tokens_;
  }
  return backend_->aux_loss(bind(i));
}

// Which assignments the experts compute this step: all (one process, no EP),
// or what the shared dispatch library decides for `ep` virtual GPUs of N/ep
// tokens each. An expert backend decides itself while it ships the rows.
void Model::decide_drops(MoeState& s, const float* weights) {
  const int64_t A = N_ * s.k;
  s.dev.keep = nullptr;
  if (experts_) return;
  if (!dispatch_.enabled) {
    s.keep.clear();
    s.drops = sim::DropCounts{};
    s.drops.assignments = A;
    return;
  }
  std::vector<float> weights_copy;
  const float* w = host_view<float>(weights, A, weights_copy);
  const int64_t S = dispatch_.ep, per = A / S;
  std::vector<sim::GpuAssignments> gpus(static_cast<size_t>(S));
  for (int64_t g = 0; g < S; ++g) {
    gpus[g].experts.assign(s.expert.begin() + g * per, s.expert.begin() + (g + 1) * per);
    gpus[g].probs.assign(w + g * per, w + (g + 1) * per);
  }
  const sim::DispatchResult r = sim::dispatch(dispatch_.config, gpus);
  s.keep.resize(static_cast<size_t>(A));
  for (int64_t a = 0; a < A; ++a) s.keep[s.sorted_pos[a]] = r.keep[a / per][a % per];
  s.drops = r.counts;
  backend_->copy_to_backend(s.keep_dev, s.keep.data(), s.keep.size());
  s.dev.keep = s.keep_dev;
}

// One op of the architecture: the driver's data-flow glue around the backend's op.
void Model::forward_op(size_t i) {
  const models::Op& op = graph_.ops[i];
  const auto& m = graph_.model;
  const OpPlan& p = plan_[i];
  Backend& be = *backend_;
  const int64_t hd = m.attention.head_dim, qk = op.qk_head_dim;
  if (p.k_nope >= 0) be.assemble_key(A(p.in2), A(p.k_nope), A(p.k_rope), N_, op.heads, hd, qk - hd);
  if (p.v_pad >= 0) be.copy_columns(A(p.v_pad), qk, A(p.in3), hd, N_ * (W(p.in3) / hd), false);
  MoeState* s = p.moe >= 0 ? &moe_[static_cast<size_t>(p.moe)] : nullptr;
  if (op.kind == OpKind::kExpertMlp && experts_) {  // rows (N*k, L) through the expert-parallel group
    s->keep.resize(static_cast<size_t>(N_ * s->k));
    experts_->forward(expert_layer(p), A(p.in), A(p.out), s->keep.data(), s->drops);
    return;
  }
  if (s && op.kind == OpKind::kTopK) s->dev.bias = s->bias_param >= 0 ? P(s->bias_param) : s->bias_dev;
  const OpResult r = be.forward(bind(i));
  switch (op.kind) {
    case OpKind::kRouter:  // logits (N, E): the router z-loss, logged, applied when the model says so
      s->router_z = r.router_z;
      if (m.moe.router_z_loss_applied) router_loss_ += m.moe.router_z_loss_weight * s->router_z * s->dev.loss_share;
      break;
    case OpKind::kTopK:  // weights (N, k), expert ids (N, k): the host keeps the ids for dispatch and dumps
      be.copy_to_host(s->expert.data(), s->dev.expert, s->expert.size() * sizeof(int32_t));
      if (m.moe.balancing == models::BalancingKind::kAuxLoss) router_loss_ += aux_loss(*s, i);
      break;
    case OpKind::kDispatch:  // rows grouped by expert: which of them the experts compute
      be.copy_to_host(s->sorted_pos.data(), s->dev.sorted_pos, s->sorted_pos.size() * sizeof(int32_t));
      be.copy_to_host(s->offsets.data(), s->dev.offsets, s->offsets.size() * sizeof(int32_t));
      s->dev.host_offsets = s->offsets.data();
      decide_drops(*s, A(p.in2));
      break;
    case OpKind::kCrossEntropy:
      last_ce_ = r.ce;
      last_z_ = r.z_loss;
      break;
    default:
      break;
  }
  if (p.joined >= 0) {  // two outputs: (N, out) and (N, out2), the weight's columns in that order
    be.copy_columns(A(p.out), W(p.out), A(p.joined), W(p.joined), N_, false);
    be.copy_columns(A(p.out2), W(p.out2), A(p.joined) + W(p.out), W(p.joined), N_, false);
  }
  if (p.o_pad >= 0) be.copy_columns(A(p.out), hd, A(p.o_pad), qk, N_ * op.heads, false);
}

// --- backward ----------------------------------------------------------------------

void Model::backward(const GradsFinal& grads_final) {
  const bool host_memory = backend_->uses_host_memory();
  if (!host_memory) backend_current(grads_, grad_dev_, grads_fresh_);  // "+=" onto what the host holds
  int64_t final_from = grads_.total_floats();
  for (size_t i = graph_.ops.size(); i-- > 0;) {
    op_timed(i, 1);
    if (!grads_final || grads_final_from_[i] == final_from) continue;
    final_from = grads_final_from_[i];
    grads_final(final_from);
  }
  if (!host_memory) grads_fresh_ = Fresh::kBackend;
}

void Model::op_timed(size_t i, int pass) {
  const auto run = [&] { pass == 0 ? forward_op(i) : backward_op(i); };
  if (brackets_) {
    brackets_->begin_op(i, pass);
    run();
    brackets_->end_op(i, pass);
    return;
  }
  if (!timer_) {
    run();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  run();
  backend_->synchronize();
  timer_(i, pass, t0, std::chrono::steady_clock::now());
}

void Model::backward_op(size_t i) {
  const models::Op& op = graph_.ops[i];
  const auto& m = graph_.model;
  const OpPlan& p = plan_[i];
  Backend& be = *backend_;
  const int64_t hd = m.attention.head_dim, qk = op.qk_head_dim;
  if (op.kind == OpKind::kExpertMlp && experts_) {
    RS_CHECK(!p.acc_in, "the routed rows have one reader, the experts");
    experts_->backward(expert_layer(p), D(p.out), D(p.in));
    return;
  }
  if (p.joined >= 0) {  // two outputs: their gradients side by side, as the weight's columns
    be.copy_columns(D(p.joined), W(p.joined), D(p.out), W(p.out), N_, false);
    be.copy_columns(D(p.joined) + W(p.out), W(p.joined), D(p.out2), W(p.out2), N_, true);
  }
  if (p.o_pad >= 0) be.copy_columns(D(p.o_pad), qk, D(p.out), hd, N_ * op.heads, false);
  be.backward(bind(i));
  if (p.v_pad >= 0) be.copy_columns(D(p.in3), hd, D(p.v_pad), qk, N_ * (W(p.in3) / hd), p.acc_in3);
  if (p.k_nope < 0) return;
  // The MLA key this op assembled: its gradient back to the two parts.
  be.split_key_grad(D(p.k_nope), p.acc_k_nope, D(p.k_rope), p.acc_k_rope, D(p.in2), N_, op.heads, hd, qk - hd);
}

// --- finiteness --------------------------------------------------------------------

bool Model::op_output_finite(size_t i) {
  const OpPlan& p = plan_[i];
  for (int s : {p.out, p.out2}) {
    if (s >= 0 && !backend_->all_finite(A(s), N_ * W(s))) return false;
  }
  if (graph_.ops[i].kind == OpKind::kCrossEntropy) return std::isfinite(last_ce_) && std::isfinite(last_z_);
  return true;
}

bool Model::op_grads_finite(size_t i) {
  const OpPlan& p = plan_[i];
  for (int s : {p.in, p.in2, p.in3}) {
    if (s >= 0 && !backend_->all_finite(D(s), N_ * W(s))) return false;
  }
  for (int q : {p.p0, p.p1, p.p2, p.p3, p.p4, p.p5}) {
    if (q >= 0 && !backend_->all_finite(G(q), grads_.view(static_cast<size_t>(q)).numel)) return false;
  }
  return true;
}

std::string Model::find_nonfinite_forward(const int32_t* inputs, const int32_t* targets, const int32_t* doc_ids) {
  load_batch(inputs, targets, doc_ids);
  const bool was_training = training_;
  training_ = false;  // a diagnosis must not move the QB histogram
  std::string culprit;
  // With an expert backend or reduced router counts every op runs (their
  // exchanges are collectives all ranks must join); the first culprit is kept.
  const bool collectives = experts_ || reduce_counts_;
  for (size_t i = 0; i < graph_.ops.size() && (culprit.empty() || collectives); ++i) {
    forward_op(i);
    if (culprit.empty() && !op_output_finite(i)) culprit = graph_.ops[i].name;
  }
  training_ = was_training;
  return culprit;
}

std::string Model::find_nonfinite_backward() {
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
