// exec runs everything the layer graph expresses: the shapes beyond the tiny
// model (dense MLP, tied embeddings, LayerNorm, auxiliary-loss balancing with
// either router, an applied router z-loss), each against finite differences
// of its own loss; and every OpKind is both priced (models::op_cost, what sim
// builds on) and run forward and backward by the CPU backend.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "exec/model.h"
#include "exec/optim.h"
#include "models/check.h"
#include "models/layer_graph.h"
#include "models/source_dir.h"
#include "tests/exec_test_batch.h"

using namespace rackstep;
using namespace rackstep::exec;

namespace {

models::ModelConfig tiny() {
  return models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json");
}

using testing::make_batch;
using Batch = testing::TestBatch;

std::vector<int32_t> routing(const Model& m) {
  std::vector<int32_t> all;
  const auto& g = m.graph();
  for (int l = 0; l < g.model.layers; ++l) {
    const int32_t* e = m.routed_experts(l);
    if (e) all.insert(all.end(), e, e + m.tokens() * g.model.moe.top_k);
  }
  return all;
}

// The analytic directional derivative g.u of the loss along u = sign(grad)
// against the central difference (L(w + h u) - L(w - h u)) / 2h, shrinking h
// until no token's experts change (top-k is piecewise constant).
void check_gradient(Model& m, const Batch& b, const std::string& name) {
  INFO(name);
  auto loss = [&] { return m.forward(b.inputs.data(), b.targets.data(), b.docs.data()).loss; };
  m.zero_grads();
  loss();
  const std::vector<int32_t> base = routing(m);
  m.backward();
  TensorView w = m.params().view(name);
  const float* grad = m.grads().view(name).data;
  std::vector<float> saved(w.data, w.data + w.numel), u(static_cast<size_t>(w.numel));
  double gu = 0.0, wnorm = 0.0;
  for (int64_t i = 0; i < w.numel; ++i) {
    u[i] = grad[i] >= 0 ? 1.0f : -1.0f;
    gu += static_cast<double>(grad[i]) * u[i];
    wnorm += static_cast<double>(saved[i]) * saved[i];
  }
  double h = std::max(1e-3 * std::sqrt(wnorm / static_cast<double>(w.numel)), 1e-4), fd = 0.0;
  bool stable = false;
  for (int tries = 0; tries < 6 && !stable; ++tries, h /= 4) {
    auto at = [&](double by) {
      for (int64_t i = 0; i < w.numel; ++i) w.data[i] = static_cast<float>(saved[i] + by * u[i]);
      const double l = loss();
      return std::pair{l, routing(m) == base};
    };
    const auto [lp, sp] = at(h);
    const auto [lm, sm] = at(-h);
    fd = (lp - lm) / (2 * h);
    stable = sp && sm;
  }
  std::memcpy(w.data, saved.data(), saved.size() * sizeof(float));
  CHECK(stable);
  CHECK(std::abs(gu) > 1e-6);
  CHECK(fd == Approx(gu).epsilon(0.03).margin(2e-4));
}

void check_shape(const models::ModelConfig& cfg, const std::vector<std::string>& params) {
  const models::LayerGraph g = models::build_layer_graph(cfg);
  Model m(g, 1, 48);
  m.init_params(3);
  const Batch b = make_batch(1, 48, cfg.vocab, 11);
  for (const std::string& p : params) check_gradient(m, b, p);
}

}  // namespace

TEST_CASE("a dense (expert-free) model trains and its gradients are right", "[exec][shapes][gradcheck]") {
  models::ModelConfig cfg = tiny();
  cfg.moe.experts = 0;
  cfg.moe.dense_width = 96;
  check_shape(cfg, {"layers.0.mlp.w1", "layers.3.mlp.w2", "lm_head.w"});
  const models::LayerGraph g = models::build_layer_graph(cfg);
  Model m(g, 2, 32);
  m.init_params(1);
  const Batch b = make_batch(2, 32, cfg.vocab, 5);
  Optimizer opt(default_optimizer_config(20, cfg.d_model, 64));
  OptimizerState st = init_optimizer_state(m.params());
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    m.zero_grads();
    last = m.forward(b.inputs.data(), b.targets.data(), b.docs.data()).loss;
    if (step == 0) first = last;
    m.backward();
    opt.step(m.params(), m.grads(), st);
  }
  CHECK(last < 0.8 * first);
}

TEST_CASE("tied embeddings: the LM head reads the embedding table", "[exec][shapes][gradcheck]") {
  models::ModelConfig cfg = tiny();
  cfg.tied_embeddings = true;
  const models::LayerGraph g = models::build_layer_graph(cfg);
  Model m(g, 1, 16);
  CHECK(m.params().layout().find("lm_head.w") < 0);
  check_shape(cfg, {"embedding.w", "final_norm.gain"});
}

TEST_CASE("LayerNorm models run every norm as LayerNorm", "[exec][shapes][gradcheck]") {
  models::ModelConfig cfg = tiny();
  cfg.norm.kind = models::NormKind::kLayerNorm;
  check_shape(cfg, {"layers.0.attn_norm.gain", "layers.1.moe.latent_norm.gain", "layers.0.attn.q_proj.w"});
  // LayerNorm and RMSNorm differ (the mean is subtracted).
  const Batch b = make_batch(1, 16, cfg.vocab, 2);
  Model ln(models::build_layer_graph(cfg), 1, 16);
  cfg.norm.kind = models::NormKind::kRmsNorm;
  Model rms(models::build_layer_graph(cfg), 1, 16);
  ln.init_params(1);
  rms.init_params(1);
  CHECK(ln.forward(b.inputs.data(), b.targets.data(), b.docs.data()).loss !=
        rms.forward(b.inputs.data(), b.targets.data(), b.docs.data()).loss);
}

TEST_CASE("auxiliary-loss balancing: the loss and its router gradient", "[exec][shapes][gradcheck]") {
  for (models::RouterKind router : {models::RouterKind::kSigmoid, models::RouterKind::kSoftmax}) {
    models::ModelConfig cfg = tiny();
    cfg.moe.balancing = models::BalancingKind::kAuxLoss;
    cfg.moe.aux_loss_weight = 0.5;  // large enough that its gradient dominates a router tensor's
    cfg.moe.router = router;
    INFO((router == models::RouterKind::kSigmoid ? "sigmoid" : "softmax"));
    check_shape(cfg, {"layers.0.moe.router.w", "layers.2.moe.router.w", "layers.1.attn.v_proj.w"});
    Model m(models::build_layer_graph(cfg), 1, 48);
    m.init_params(3);
    const Batch b = make_batch(1, 48, cfg.vocab, 11);
    const LossResult r = m.forward(b.inputs.data(), b.targets.data(), b.docs.data());
    // Perfect balance gives weight * 1 per layer; any routing gives at least about that.
    CHECK(r.router_loss > 0.5 * cfg.moe.aux_loss_weight * cfg.layers);
    CHECK(r.loss == Approx(r.ce + r.z_loss + r.router_loss));
  }
}

TEST_CASE("an applied router z-loss adds to the loss and to the router gradient", "[exec][shapes][gradcheck]") {
  models::ModelConfig cfg = tiny();
  cfg.moe.router_z_loss_applied = true;
  cfg.moe.router_z_loss_weight = 0.05;
  check_shape(cfg, {"layers.0.moe.router.w", "layers.3.moe.router.w"});
  Model m(models::build_layer_graph(cfg), 1, 48);
  m.init_params(3);
  const Batch b = make_batch(1, 48, cfg.vocab, 11);
  const LossResult r = m.forward(b.inputs.data(), b.targets.data(), b.docs.data());
  CHECK(r.router_loss == Approx(cfg.moe.router_z_loss_weight * r.router_z_loss * cfg.layers));
  CHECK(r.loss == Approx(r.ce + r.z_loss + r.router_loss));
}

TEST_CASE("every OpKind is priced by the cost model and run forward and backward by exec", "[exec][shapes]") {
  // The tiny model has every op but the dense MLP's; a dense variant adds it.
  models::ModelConfig dense = tiny();
  dense.moe.dense_layers = 1;
  dense.moe.dense_width = 64;
  std::set<models::OpKind> run_fwd, run_bwd, priced;
  for (const models::ModelConfig& cfg : {tiny(), dense}) {
    const models::LayerGraph g = models::build_layer_graph(cfg);
    Model m(g, 1, 32);
    m.init_params(1);
    m.set_op_timer([&](size_t op, int phase, auto, auto) {
      (phase == 0 ? run_fwd : run_bwd).insert(g.ops[op].kind);
    });
    const Batch b = make_batch(1, 32, cfg.vocab, 3);
    m.zero_grads();
    m.forward(b.inputs.data(), b.targets.data(), b.docs.data());
    m.backward();
    for (const models::Op& op : g.ops) {
      const models::OpCost c = models::op_cost(op, 1, 32);
      if (c.fwd_flops > 0 || c.bytes_read > 0) priced.insert(op.kind);
    }
  }
  for (models::OpKind k : models::kAllOpKinds) {
    INFO(models::to_string(k));
    CHECK(priced.count(k) == 1);
    CHECK(run_fwd.count(k) == 1);
    CHECK(run_bwd.count(k) == 1);
  }
}

TEST_CASE("MLA (the generated 360B-A21B-MLA candidate's attention) at a tiny width", "[exec][shapes][gradcheck]") {
  // The generator's MLA settings (sim/generate.cpp: q latent, KV latent, a
  // decoupled RoPE key) scaled to the tiny model's width.
  models::ModelConfig cfg = tiny();
  cfg.attention.kind = models::AttentionKind::kMla;
  cfg.attention.mla_kv_latent = 32;
  cfg.attention.mla_q_latent = 48;
  cfg.attention.mla_rope_dim = 16;
  cfg.attention.kv_heads = cfg.attention.local.kv_heads = cfg.attention.global.kv_heads = cfg.attention.heads;
  check_shape(cfg, {"layers.0.attn.q_down.w", "layers.0.attn.q_up.w", "layers.1.attn.kv_down.w",
                    "layers.1.attn.kv_latent_norm.gain", "layers.0.attn.kv_up.w"});
  cfg.attention.mla_q_latent = 0;  // queries straight from x
  cfg.attention.qk_norm = false;
  check_shape(cfg, {"layers.0.attn.q_proj.w", "layers.1.attn.kv_down.w"});
}
