// The op-set parity harness (exec/backend.h), in the ggml manner: every
// models::OpKind, taken from the layer graphs of the tiny model and its
// variants, runs through the Backend interface on every available backend.
//   * finite differences: each op's backward against central differences of
//     its own forward, L = Σ_j out_j · R_j (+ the op's scalar losses), along
//     u = sign(gradient), for every differentiable input and parameter;
//   * the gradient rule: input gradients "=" ignore what was there, "+=" add
//     to it; parameter gradients add;
//   * parity: every other backend (CUDA registers itself where built with a
//     device) against the CPU reference by normalised error,
//     ||x - x_cpu|| / ||x_cpu||, of every output, saved buffer and gradient.
//     Without such a backend the device case exits 77 (ctest: skipped).
// And every OpKind is priced by sim (sim/cost.h price_op) and run by exec.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "exec/backend.h"
#include "exec/kernels.h"
#include "models/layer_graph.h"
#include "sim/base/check.h"
#include "sim/base/source_dir.h"
#include "sim/calibration.h"
#include "sim/cost.h"
#include "topologies/topology.h"

using namespace rackstep;
using namespace rackstep::exec;
using models::OpKind;

namespace {

constexpr int64_t kB = 2, kT = 16, kN = kB * kT;

models::ModelConfig tiny() {
  return models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json");
}

// The graphs whose ops the harness takes: tiny-moe has every OpKind; the
// variants add the other bindings of an op (LayerNorm, a tied head, a dense
// MLP, aux-loss balancing with a softmax router, an applied router z-loss;
// linear biases, ALiBi and sinks, learned positions, gpt-oss's expert biases and
// clamped SwiGLU, MLP activations and biases).
std::vector<std::pair<std::string, models::ModelConfig>> variants() {
  std::vector<std::pair<std::string, models::ModelConfig>> v;
  v.emplace_back("", tiny());
  models::ModelConfig c = tiny();
  c.norm.kind = models::NormKind::kLayerNorm;
  v.emplace_back("layernorm", c);
  c = tiny();
  c.tied_embeddings = true;
  v.emplace_back("tied", c);
  c = tiny();
  c.moe.dense_layers = 1;
  c.moe.dense_width = 48;
  v.emplace_back("dense", c);
  c = tiny();
  c.moe.balancing = models::BalancingKind::kAuxLoss;
  c.moe.aux_loss_weight = 0.5;
  c.moe.router = models::RouterKind::kSoftmax;
  c.moe.routing_weight_sum = 1.0;
  v.emplace_back("aux-softmax", c);
  c = tiny();
  c.moe.router_z_loss_applied = true;
  c.moe.router_z_loss_weight = 0.05;
  v.emplace_back("router-z", c);
  c = tiny();
  c.attention.qkv_bias = c.attention.o_bias = true;
  v.emplace_back("bias", c);
  c = tiny();
  for (models::AttentionLayerKind* k : {&c.attention.local, &c.attention.global}) {
    k->position = models::PositionKind::kAlibi;
    k->rope_fraction = 0.0;
  }
  c.attention.sinks = true;
  v.emplace_back("alibi-sinks", c);
  c = tiny();
  c.position_embedding.learned = true;
  c.position_embedding.max_positions = c.seq_len;
  v.emplace_back("positions", c);
  c = tiny();  // sinks with RoPE (gpt-oss's attention)
  c.attention.sinks = true;
  v.emplace_back("sinks", c);
  c = tiny();  // gpt-oss's experts: per-expert biases and the clamped SwiGLU (a limit the test's rows reach)
  c.moe.expert_bias = true;
  c.moe.swiglu_alpha = 1.702;
  c.moe.swiglu_limit = 0.5;
  c.moe.swiglu_linear_offset = 1.0;
  v.emplace_back("oss-experts", c);
  for (const auto& [mlp, act, bias] : {std::tuple{"gelu-bias", models::MlpActivation::kGelu, true},
                                       std::tuple{"relu2", models::MlpActivation::kRelu2, false},
                                       std::tuple{"swiglu-bias", models::MlpActivation::kSwiGlu, true}}) {
    c = tiny();
    c.mlp.activation = act;
    c.mlp.bias = bias;
    c.moe.dense_layers = 1;
    c.moe.dense_width = 48;
    v.emplace_back(mlp, c);
  }
  return v;
}

struct Rng {
  uint64_t s;
  uint64_t next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return s >> 11;
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-42; }
  float normal() {  // Box–Muller
    return static_cast<float>(std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
  }
};

bool in_arena(const models::TensorDecl& t) {
  return t.dtype == models::DType::kF32 && t.shape.size() >= 2 && t.shape[0].name == "B" &&
         t.shape[1].name == "T";
}

// One op with every bound tensor on the host: what a backend gets, before it runs.
struct HostOp {
  std::string label;
  std::shared_ptr<models::LayerGraph> graph;
  const models::Op* op = nullptr;
  std::vector<float> in[3], out[2], saved[3], w[OpCall::kMaxParams], dout[2];
  int64_t in_w[3] = {0, 0, 0}, out_w[2] = {0, 0}, saved_w[3] = {0, 0, 0};
  int n_in = 0, n_out = 0, n_w = 0;
  bool tied = false;
  int rot_dims = 0;
  std::vector<int32_t> tokens, targets, doc, pos;
  bool moe = false;
  int E = 0, k = 0, L = 0, F = 0;
  std::vector<int32_t> expert, sorted_pos, offsets;
  std::vector<float> threshold, bias;
  std::vector<uint8_t> keep;  // empty = keep all
  std::vector<int64_t> hist;
};

// What a backend produced for a HostOp.
struct Ran {
  std::vector<float> out[2], saved[3], din[3], dw[OpCall::kMaxParams];
  std::vector<int32_t> expert, sorted_pos, offsets;
  std::vector<int64_t> hist;
  OpResult result;
  double aux_loss = 0;  // kTopK under aux-loss balancing (Backend::aux_loss)
};

void fill_normal(std::vector<float>& v, size_t n, Rng& r, float scale, float shift = 0.0f) {
  v.resize(n);
  for (float& x : v) x = shift + scale * r.normal();
}

HostOp make_host_op(const std::string& variant, const std::shared_ptr<models::LayerGraph>& g, size_t i,
                    uint64_t seed) {
  const models::ModelConfig& m = g->model;
  const models::Op& op = g->ops[i];
  HostOp h;
  h.label = std::string(models::to_string(op.kind)) + (variant.empty() ? "" : " (" + variant + ")");
  h.graph = g;
  h.op = &op;
  Rng r{seed};
  std::vector<int64_t> in_widths;
  for (const models::TensorDecl& t : op.inputs) {
    if (!in_arena(t)) continue;
    const int j = h.n_in++;
    h.in_w[j] = t.elems_per_token();
    in_widths.push_back(h.in_w[j]);
    const float scale = op.kind == OpKind::kTopK ? 1.5f : 1.0f;
    fill_normal(h.in[j], static_cast<size_t>(kN * h.in_w[j]), r, scale);
    if (op.kind == OpKind::kCombine && j == 1) {  // combine weights: positive
      for (float& x : h.in[j]) x = 0.5f + 0.25f * std::abs(x);
    }
  }
  for (const models::TensorDecl& t : op.outputs) {
    if (!in_arena(t)) continue;
    const int j = h.n_out++;
    h.out_w[j] = t.elems_per_token();
    fill_normal(h.dout[j], static_cast<size_t>(kN * h.out_w[j]), r, 1.0f);
  }
  const std::vector<int64_t> sw = saved_widths(op, m, in_widths);
  for (size_t j = 0; j < sw.size(); ++j) h.saved_w[j] = sw[j];
  // Parameters as the driver binds them: learnable ones in op.params order (the
  // router's bias is routing state, not a parameter), or the tied table.
  auto add_param = [&](const std::vector<int64_t>& shape, bool gain) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const int64_t fan_in = shape.size() >= 2 ? shape[shape.size() - 2] : 1;
    const float scale = gain ? 0.1f : 1.0f / std::sqrt(static_cast<float>(fan_in));
    fill_normal(h.w[h.n_w++], static_cast<size_t>(n), r, scale, gain ? 1.0f : 0.0f);
  };
  if (!op.shared_param.empty()) {
    h.tied = true;
    add_param({m.vocab, m.d_model}, false);
  }
  for (size_t j = 0; j < op.params.size(); ++j) {
    if (!op.params[j].learnable || (op.kind == OpKind::kRouter && j > 0)) continue;
    add_param(op.params[j].shape, op.params[j].shape.size() == 1);
  }
  if (op.kind == OpKind::kSConv) {  // a kernel near the identity, every tap live
    for (float& x : h.w[0]) x *= 0.5f;
  }
  if (op.kind == OpKind::kRope) h.rot_dims = static_cast<int>(std::lround(op.rope_fraction * op.qk_head_dim));
  for (int64_t t = 0; t < kN; ++t) {
    h.tokens.push_back(static_cast<int32_t>(r.next() % static_cast<uint64_t>(m.vocab)));
    h.targets.push_back(t % 7 == 3 ? -1 : static_cast<int32_t>(r.next() % static_cast<uint64_t>(m.vocab)));
    h.doc.push_back(static_cast<int32_t>((t / kT) * 2 + ((t % kT) >= kT / 3)));
    h.pos.push_back(static_cast<int32_t>(t % kT));
  }
  const bool moe_op = op.kind == OpKind::kRouter || op.kind == OpKind::kTopK || op.kind == OpKind::kDispatch ||
                      op.kind == OpKind::kExpertMlp || op.kind == OpKind::kCombine;
  if (moe_op) {
    h.moe = true;
    h.E = static_cast<int>(m.moe.experts);
    h.k = static_cast<int>(m.moe.top_k);
    h.L = static_cast<int>(m.moe_width());
    h.F = static_cast<int>(m.moe.expert_width);
    const size_t A = static_cast<size_t>(kN * h.k);
    for (int64_t t = 0; t < kN; ++t) {  // k distinct experts per token
      const int first = static_cast<int>(r.next() % static_cast<uint64_t>(h.E));
      for (int j = 0; j < h.k; ++j) h.expert.push_back((first + j * 3) % h.E);
    }
    h.sorted_pos.resize(A);
    h.offsets.resize(static_cast<size_t>(h.E + 1));
    moe_group_by_expert(h.sorted_pos.data(), h.offsets.data(), h.expert.data(), static_cast<int>(A), h.E);
    h.threshold.assign(static_cast<size_t>(kN), 0.0f);
    fill_normal(h.bias, static_cast<size_t>(h.E), r, 0.3f);
    if (op.kind == OpKind::kExpertMlp) {  // drops: about one assignment in five
      for (size_t a = 0; a < A; ++a) h.keep.push_back(r.next() % 5 != 0);
    }
    if (m.moe.balancing == models::BalancingKind::kQuantile) h.hist.assign(static_cast<size_t>(h.E * m.moe.balancing_bins), 0);
  }
  return h;
}

// Runs a HostOp on a backend: forward, then (with `backward`) backward with
// the input and parameter gradients starting at din0 / dw0 (empty = zero) and
// the inputs' accumulate flags set to `accumulate`.
class Runner {
 public:
  Runner(Backend& be, const HostOp& h) : be_(be), h_(h) {}

  Ran run(bool backward, bool accumulate = false, const std::vector<float>* din0 = nullptr,
          const std::vector<float>* dw0 = nullptr) {
    const HostOp& h = h_;
    buffers_.clear();
    OpCall c;
    c.op = h.op;
    c.model = &h.graph->model;
    c.B = kB;
    c.T = kT;
    c.N = kN;
    for (int j = 0; j < h.n_in; ++j) {
      c.in[j] = bound(h.in[j], h.in_w[j]);
      c.in[j].accumulate = accumulate;
      if (din0) upload(c.in[j].grad, din0[j]);
    }
    const std::vector<float> nan_fill;
    for (int j = 0; j < h.n_out; ++j) c.out[j] = bound(nan_fill, h.out_w[j], true);
    for (int j = 0; j < 3; ++j)
      if (h.saved_w[j]) c.saved[j] = bound(nan_fill, h.saved_w[j], true);
    for (int j = 0; j < h.n_w; ++j) {
      c.w[j] = floats(h.w[j]);
      c.dw[j] = dw0 ? floats(dw0[j]) : floats(std::vector<float>(h.w[j].size(), 0.0f));
    }
    c.tied = h.tied;
    c.rot_dims = h.rot_dims;
    c.tokens = ints(h.tokens);
    c.targets = ints(h.targets);
    c.doc = ints(h.doc);
    c.pos = ints(h.pos);
    int64_t counted = 0;
    for (int32_t t : h.targets) counted += t >= 0;
    c.loss_tokens = counted;
    Routing routing;
    if (h.moe) {
      routing.E = h.E;
      routing.k = h.k;
      routing.L = h.L;
      routing.F = h.F;
      routing.expert = ints(h.expert);
      routing.sorted_pos = ints(h.sorted_pos);
      routing.offsets = ints(h.offsets);
      routing.host_offsets = h.offsets.data();
      routing.threshold = floats(h.threshold);
      routing.bias = floats(h.bias);
      if (!h.keep.empty()) routing.keep = bytes(h.keep);
      if (!h.hist.empty()) routing.hist = static_cast<int64_t*>(raw(h.hist.data(), h.hist.size() * sizeof(int64_t)));
      c.routing = &routing;
    }
    c.training = true;
    Ran ran;
    ran.result = be_.forward(c);
    if (h.op->kind == OpKind::kTopK && c.model->moe.balancing == models::BalancingKind::kAuxLoss) {
      ran.aux_loss = be_.aux_loss(c);
    }
    for (int j = 0; j < h.n_out; ++j) ran.out[j] = download(c.out[j].value, kN * h.out_w[j]);
    for (int j = 0; j < 3; ++j)
      if (h.saved_w[j]) ran.saved[j] = download(c.saved[j].value, kN * h.saved_w[j]);
    if (h.moe) {
      ran.expert = download_ints(routing.expert, h.expert.size());
      ran.sorted_pos = download_ints(routing.sorted_pos, h.sorted_pos.size());
      ran.offsets = download_ints(routing.offsets, h.offsets.size());
      if (routing.hist) {
        ran.hist.resize(h.hist.size());
        be_.copy_to_host(ran.hist.data(), routing.hist, h.hist.size() * sizeof(int64_t));
      }
    }
    if (!backward) return ran;
    for (int j = 0; j < h.n_out; ++j) upload(c.out[j].grad, h.dout[j]);
    be_.backward(c);
    for (int j = 0; j < h.n_in; ++j) ran.din[j] = download(c.in[j].grad, kN * h.in_w[j]);
    for (int j = 0; j < h.n_w; ++j) ran.dw[j] = download(c.dw[j], static_cast<int64_t>(h.w[j].size()));
    be_.synchronize();
    return ran;
  }

 private:
  void* raw(const void* src, size_t n) {
    buffers_.push_back(be_.allocate(n));
    if (src) be_.copy_to_backend(buffers_.back()->data(), src, n);
    return buffers_.back()->data();
  }
  float* floats(const std::vector<float>& v) { return static_cast<float*>(raw(v.data(), v.size() * sizeof(float))); }
  int32_t* ints(const std::vector<int32_t>& v) {
    return static_cast<int32_t*>(raw(v.data(), v.size() * sizeof(int32_t)));
  }
  uint8_t* bytes(const std::vector<uint8_t>& v) { return static_cast<uint8_t*>(raw(v.data(), v.size())); }
  // A bound tensor: the values given (or NaN where the backend must write), a
  // gradient buffer of the same size.
  Bound bound(const std::vector<float>& values, int64_t width, bool nan = false) {
    const size_t n = static_cast<size_t>(kN * width);
    Bound b;
    b.width = width;
    b.value = floats(nan ? std::vector<float>(n, std::nanf("")) : values);
    b.grad = floats(std::vector<float>(n, 0.0f));
    return b;
  }
  void upload(float* dst, const std::vector<float>& v) { be_.copy_to_backend(dst, v.data(), v.size() * sizeof(float)); }
  std::vector<float> download(const float* src, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    be_.copy_to_host(v.data(), src, v.size() * sizeof(float));
    return v;
  }
  std::vector<int32_t> download_ints(const int32_t* src, size_t n) {
    std::vector<int32_t> v(n);
    be_.copy_to_host(v.data(), src, n * sizeof(int32_t));
    return v;
  }

  Backend& be_;
  const HostOp& h_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

// The scalar the finite differences follow: Σ out·dout plus the op's own losses.
double objective(const HostOp& h, const Ran& r) {
  double l = 0;
  for (int j = 0; j < h.n_out; ++j)
    for (size_t i = 0; i < r.out[j].size(); ++i) l += static_cast<double>(r.out[j][i]) * h.dout[j][i];
  const models::MoeConfig& moe = h.graph->model.moe;
  l += r.result.ce + r.result.z_loss + r.aux_loss;
  if (h.op->kind == OpKind::kRouter && moe.router_z_loss_applied) l += moe.router_z_loss_weight * r.result.router_z;
  return l;
}

// result = pre + g up to one float rounding per element.
double added_error(const std::vector<float>& result, const std::vector<float>& pre, const std::vector<float>& g) {
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double e = std::abs(static_cast<double>(result[i]) - pre[i] - g[i]);
    worst = std::max(worst, e / (std::abs(static_cast<double>(pre[i])) + std::abs(static_cast<double>(g[i])) + 1e-30));
  }
  return worst;
}

double norm_error(const std::vector<float>& x, const std::vector<float>& ref) {
  double d = 0, n = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    d += (static_cast<double>(x[i]) - ref[i]) * (static_cast<double>(x[i]) - ref[i]);
    n += static_cast<double>(ref[i]) * ref[i];
  }
  return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// Every op of every variant graph, one per (OpKind, variant) whose binding differs.
std::vector<HostOp> all_cases() {
  std::vector<HostOp> cases;
  std::set<std::string> seen;
  uint64_t seed = 17;
  for (const auto& [name, cfg] : variants()) {
    auto g = std::make_shared<models::LayerGraph>(models::build_layer_graph(cfg));
    for (size_t i = 0; i < g->ops.size(); ++i) {
      const models::Op& op = g->ops[i];
      // In a variant only the ops its change touches.
      const bool touched = name.empty() || (name == "layernorm" && op.kind == OpKind::kRmsNorm) ||
                           (name == "tied" && op.kind == OpKind::kLmHead) ||
                           (name == "dense" && op.kind == OpKind::kSharedMlp && op.inputs.size() == 1) ||
                           (name == "aux-softmax" && op.kind == OpKind::kTopK) ||
                           (name == "router-z" && op.kind == OpKind::kRouter) ||
                           (name == "bias" && op.kind == OpKind::kLinear && op.params.size() == 2) ||
                           (name == "alibi-sinks" && op.kind == OpKind::kAttention) ||
                           (name == "positions" && op.kind == OpKind::kEmbedding) ||
                           (name == "oss-experts" && op.kind == OpKind::kExpertMlp) ||
                           (name == "sinks" && op.kind == OpKind::kAttention) ||
                           (name.find("-bias") != std::string::npos && op.kind == OpKind::kSharedMlp) ||
                           (name == "relu2" && op.kind == OpKind::kSharedMlp);
      if (!touched) continue;
      // One case per kind and input arity (the shared MLP with and without the routed sum).
      const std::string key = name + "/" + models::to_string(op.kind) + "/" + std::to_string(op.inputs.size());
      if (!seen.insert(key).second) continue;
      cases.push_back(make_host_op(name, g, i, seed++));
    }
  }
  return cases;
}

// Central differences along u = sign(grad) for input j (which = 0) or
// parameter j (which = 1); returns the relative error |fd - g·u| / max(|g·u|, |fd|).
struct FdResult {
  double gu = 0, fd = 0;
  bool stable = true;
};
FdResult finite_difference(Backend& be, HostOp& h, int which, int j, const std::vector<float>& grad) {
  std::vector<float>& x = which == 0 ? h.in[j] : h.w[j];
  const std::vector<float> saved = x;
  std::vector<float> u(x.size());
  double gu = 0, rms = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    u[i] = grad[i] >= 0 ? 1.0f : -1.0f;
    gu += static_cast<double>(grad[i]) * u[i];
    rms += static_cast<double>(x[i]) * x[i];
  }
  rms = std::sqrt(rms / static_cast<double>(x.size()));
  const Ran base = Runner(be, h).run(false);
  FdResult res;
  res.gu = gu;
  double step = std::max(1e-3 * rms, 1e-4);
  for (int tries = 0; tries < 5; ++tries, step /= 4) {
    auto at = [&](double by) {
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(saved[i] + by * u[i]);
      const Ran r = Runner(be, h).run(false);
      return std::pair{objective(h, r), r.expert == base.expert};  // top-k is piecewise constant
    };
    const auto [lp, sp] = at(step);
    const auto [lm, sm] = at(-step);
    res.fd = (lp - lm) / (2 * step);
    res.stable = sp && sm;
    if (res.stable) break;
  }
  x = saved;
  return res;
}

}  // namespace

TEST_CASE("every OpKind's backward through the backend interface matches finite differences of its forward",
          "[exec][parity][gradcheck]") {
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  std::set<OpKind> covered;
  std::printf("%-28s %-6s %10s  (finite differences, max relative error over inputs and parameters)\n", "op",
              "backend", "error");
  for (HostOp& h : all_cases()) {
    INFO(h.label);
    covered.insert(h.op->kind);
    const Ran r = Runner(*cpu, h).run(true);
    double worst = 0;
    for (int which = 0; which < 2; ++which) {
      const int n = which == 0 ? h.n_in : h.n_w;
      for (int j = 0; j < n; ++j) {
        INFO((which == 0 ? "input " : "parameter ") << j);
        const FdResult fd = finite_difference(*cpu, h, which, j, which == 0 ? r.din[j] : r.dw[j]);
        CHECK(fd.stable);
        const double scale = std::max({std::abs(fd.gu), std::abs(fd.fd), 1e-3});
        const double err = std::abs(fd.fd - fd.gu) / scale;
        worst = std::max(worst, err);
        CHECK(err < 2e-2);
      }
    }
    std::printf("%-28s %-6s %10.2e\n", h.label.c_str(), "cpu", worst);
  }
  for (OpKind k : models::kAllOpKinds) {
    INFO(models::to_string(k));
    CHECK(covered.count(k) == 1);
  }
}

TEST_CASE("the gradient rule holds for every OpKind: inputs = or +=, parameters +=", "[exec][parity]") {
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  for (HostOp& h : all_cases()) {
    INFO(h.label);
    const Ran clean = Runner(*cpu, h).run(true);
    std::vector<float> pre_in[3], pre_w[OpCall::kMaxParams];
    Rng r{99};
    for (int j = 0; j < 3; ++j) fill_normal(pre_in[j], static_cast<size_t>(kN * h.in_w[j]), r, 3.0f);
    for (int j = 0; j < OpCall::kMaxParams; ++j) fill_normal(pre_w[j], h.w[j].size(), r, 3.0f);
    const Ran set = Runner(*cpu, h).run(true, false, pre_in, pre_w);
    const Ran added = Runner(*cpu, h).run(true, true, pre_in, pre_w);
    for (int j = 0; j < h.n_in; ++j) {
      INFO("input " << j);
      CHECK(norm_error(set.din[j], clean.din[j]) == 0.0);  // "=": what was there does not matter
      CHECK(added_error(added.din[j], pre_in[j], clean.din[j]) < 1e-6);  // "+="
    }
    for (int j = 0; j < h.n_w; ++j) {
      INFO("parameter " << j);
      CHECK(added_error(set.dw[j], pre_w[j], clean.dw[j]) < 1e-6);
    }
  }
}

TEST_CASE("every OpKind is priced by sim and run by exec", "[exec][parity]") {
  // Priced: sim's cost model gives each op of the graphs a forward time.
  const topologies::SystemSpec sys = topologies::load_system(topologies::zoo_path("topologies/zoo/hgx-h100.json"));
  std::set<OpKind> priced, run;
  for (const auto& [name, cfg] : variants()) {
    const models::LayerGraph g = models::build_layer_graph(cfg);
    const sim::OpTable t = sim::build_op_table(g);
    sim::PriceContext ctx;
    ctx.gpu = &sys.gpu;
    ctx.cal = &sim::default_calibration();
    ctx.tokens = kN;
    ctx.seq = kT;
    ctx.expert_rows = static_cast<double>(kN * std::max<int64_t>(cfg.moe.top_k, 1));
    ctx.local_experts = static_cast<double>(std::max<int64_t>(cfg.moe.experts, 1));
    ctx.peak_flops_per_s = sys.gpu.peak_bf16_flops_per_s;
    ctx.hbm_bw_bytes_per_s = sys.gpu.hbm_bw_bytes_per_s;
    auto price = [&](const std::vector<sim::OpEntry>& ops) {
      for (const sim::OpEntry& e : ops)
        if (sim::price_op(e, ctx).fwd_s > 0) priced.insert(e.kind);
    };
    price(t.pre);
    price(t.head);
    for (const sim::LayerClass& lc : t.classes) price(lc.ops);
  }
  // Run: the CPU backend writes every output and saved buffer (they start as NaN).
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  for (HostOp& h : all_cases()) {
    const Ran r = Runner(*cpu, h).run(true);
    bool wrote = std::isfinite(r.result.ce);
    for (int j = 0; j < h.n_out; ++j) wrote = wrote && all_finite(r.out[j]);
    for (int j = 0; j < 3; ++j) wrote = wrote && all_finite(r.saved[j]);
    if (h.op->kind == OpKind::kCrossEntropy) wrote = wrote && r.result.ce > 0;
    if (wrote) run.insert(h.op->kind);
  }
  for (OpKind k : models::kAllOpKinds) {
    INFO(models::to_string(k));
    CHECK(priced.count(k) == 1);
    CHECK(run.count(k) == 1);
  }
}

// Hidden: ctest's exec_parity_devices runs it; exits 77 (skipped) without a device backend.
TEST_CASE("every OpKind on every other backend matches the CPU reference", "[.][parity-devices]") {
  const std::vector<std::string> names = available_backends();
  if (names.size() == 1) {
    std::printf("no backend but the CPU is available here (%s): skipped\n", names[0].c_str());
    std::exit(77);
  }
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  std::printf("%-28s %-6s %12s %12s\n", "op", "backend", "fwd error", "bwd error");
  for (const std::string& name : names) {
    if (name == "cpu") continue;
    std::unique_ptr<Backend> be = make_backend(name);
    for (HostOp& h : all_cases()) {
      INFO(h.label << " on " << name);
      const Ran ref = Runner(*cpu, h).run(true);
      Ran got;
      try {
        got = Runner(*be, h).run(true);
      } catch (const UserError& e) {  // an op this backend refuses (one line naming the model setting): listed, not compared
        std::printf("%-28s %-6s refused: %s\n", h.label.c_str(), name.c_str(), e.what());
        continue;
      }
      double fwd = 0, bwd = 0;
      for (int j = 0; j < h.n_out; ++j) fwd = std::max(fwd, norm_error(got.out[j], ref.out[j]));
      for (int j = 0; j < 3; ++j) fwd = std::max(fwd, norm_error(got.saved[j], ref.saved[j]));
      if (h.op->kind == OpKind::kCrossEntropy) fwd = std::max(fwd, std::abs(got.result.ce - ref.result.ce) / ref.result.ce);
      if (ref.aux_loss > 0) fwd = std::max(fwd, std::abs(got.aux_loss - ref.aux_loss) / ref.aux_loss);
      CHECK(got.expert == ref.expert);
      CHECK(got.sorted_pos == ref.sorted_pos);
      CHECK(got.hist == ref.hist);
      for (int j = 0; j < h.n_in; ++j) bwd = std::max(bwd, norm_error(got.din[j], ref.din[j]));
      for (int j = 0; j < h.n_w; ++j) bwd = std::max(bwd, norm_error(got.dw[j], ref.dw[j]));
      std::printf("%-28s %-6s %12.2e %12.2e\n", h.label.c_str(), name.c_str(), fwd, bwd);
      CHECK(fwd < 1e-5);
      CHECK(bwd < 1e-4);
    }
  }
}
