// The CPU model as a whole (exec/model.h): loss at init, whole-model gradients
// against finite differences, overfitting one batch, determinism, bad models.
#include <catch2/catch.hpp>

#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "exec/model.h"
#include "sim/base/source_dir.h"
#include "exec/optim.h"
#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "models/layer_graph.h"
#include "tests/exec_not_host_backend.h"
#include "tests/exec_test_batch.h"

using namespace rackstep;
using namespace rackstep::exec;

namespace {

models::LayerGraph tiny_graph() {
  return models::build_layer_graph(models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json"));
}

using testing::make_batch;
using testing::TestBatch;

double loss_of(Model& m, const TestBatch& b) {
  return m.forward(b.inputs.data(), b.targets.data(), b.docs.data()).loss;
}


TEST_CASE("loss at init is about ln(vocab)", "[exec][model]") {
  const models::LayerGraph g = tiny_graph();
  Model m(g, 2, 64);
  m.init_params(1);
  const TestBatch b = make_batch(2, 64, g.model.vocab, 7);
  const LossResult r = m.forward(b.inputs.data(), b.targets.data(), b.docs.data());
  // Logits at init have std ~ init_std_scale (unit-RMS input times 0.5/sqrt(d) weights),
  // so the expected cross-entropy is ln V plus about var/2.
  CHECK(r.ce == Approx(std::log(static_cast<double>(g.model.vocab))).margin(0.4));
  CHECK(r.z_loss > 0.0);
  CHECK(r.z_loss < 1e-2);
  CHECK(r.drops.assignments == 2 * 64 * g.model.moe.top_k * g.model.layers);
  CHECK(r.drops.dropped() == 0);
}

// A directional derivative along a +-1 direction over each named tensor: the
// analytic value g.u against (L(w + h u) - L(w - h u)) / 2h, in double from
// fp32 losses. Many elements at once keep the signal far above fp32 noise.
void check_whole_model_gradients(const models::LayerGraph& g, uint64_t seed, const std::vector<std::string>& names,
                                 const std::function<void(Model&)>& prepare = nullptr) {
  Model m(g, 1, 48);
  m.init_params(seed);
  if (prepare) prepare(m);
  const TestBatch b = make_batch(1, 48, g.model.vocab, 11);
  auto routing = [&](const Model& model) {
    std::vector<int32_t> all;
    for (int l = 0; l < g.model.layers; ++l) {
      const int32_t* e = model.routed_experts(l);
      if (e) all.insert(all.end(), e, e + 48 * g.model.moe.top_k);
    }
    return all;
  };
  m.zero_grads();
  loss_of(m, b);
  const std::vector<int32_t> base_routing = routing(m);
  m.backward();
  for (const std::string& name : names) {
    INFO(name);
    TensorView w = m.params().view(name);
    const float* grad = m.grads().view(name).data;
    std::vector<float> saved(w.data, w.data + w.numel);
    std::vector<float> u(static_cast<size_t>(w.numel));
    uint64_t s = 12345;
    double gu = 0.0, wnorm = 0.0;
    for (int64_t i = 0; i < w.numel; ++i) {
      // Along sign(g) (ties at random): g.u = |g|_1, the largest signal a +-1 step can get.
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      u[i] = grad[i] > 0 ? 1.0f : grad[i] < 0 ? -1.0f : ((s >> 63) ? 1.0f : -1.0f);
      gu += static_cast<double>(grad[i]) * u[i];
      wnorm += static_cast<double>(saved[i]) * saved[i];
    }
    // Step: about 1e-3 of the typical element magnitude. Top-k selection is
    // piecewise constant: a step that flips any token's experts measures the
    // jump, not the derivative, so the step shrinks until routing stays put.
    double h = std::max(1e-3 * std::sqrt(wnorm / static_cast<double>(w.numel)), 1e-4);
    auto shifted = [&](double by) {
      for (int64_t i = 0; i < w.numel; ++i) w.data[i] = static_cast<float>(saved[i] + by * u[i]);
      const double l = loss_of(m, b);
      return std::pair{l, routing(m) == base_routing};
    };
    double fd = 0.0;
    bool stable = false;
    for (int tries = 0; tries < 6 && !stable; ++tries, h /= 4) {
      const auto [lp, sp] = shifted(h);
      const auto [lm, sm] = shifted(-h);
      fd = (lp - lm) / (2 * h);
      stable = sp && sm;
    }
    std::memcpy(w.data, saved.data(), saved.size() * sizeof(float));
    CHECK(stable);
    CHECK(std::abs(gu) > 1e-6);  // the tensor matters to the loss
    CHECK(fd == Approx(gu).epsilon(0.03).margin(2e-4));
  }
}

}  // namespace

TEST_CASE("whole-model gradients match finite differences", "[exec][model][gradcheck]") {
  check_whole_model_gradients(tiny_graph(), 3,
                              {"embedding.w",
                               "embedding_norm_gate.w_down",
                               "layers.0.attn_norm.gain",
                               "layers.0.attn.q_proj.w",
                               "layers.1.attn.k_proj.w",
                               "layers.0.attn.v_proj.w",
                               "layers.0.attn.k_sconv.kernel",
                               "layers.1.attn.gate.w",
                               "layers.0.attn.o_proj.w",
                               "layers.2.attn.out_sconv.kernel",
                               "layers.0.moe.router.w",
                               "layers.1.moe.latent_down.w",
                               "layers.1.moe.latent_norm.gain",
                               "layers.0.moe.experts.w1",
                               "layers.3.moe.experts.w2",
                               "layers.2.moe.latent_up.w",
                               "layers.0.moe.shared.w3",
                               "layers.3.moe.out_sconv.kernel",
                               "final_norm_gate.w_up",
                               "lm_head.w"});
}

TEST_CASE("training on one batch drives its loss down", "[exec][model]") {
  const models::LayerGraph g = tiny_graph();
  Model m(g, 2, 64);
  m.init_params(5);
  const TestBatch b = make_batch(2, 64, g.model.vocab, 13);
  OptimizerConfig cfg = default_optimizer_config(40, g.model.d_model, 2 * 64);
  Optimizer opt(cfg);
  OptimizerState st = init_optimizer_state(m.params());
  double first = 0, last = 0;
  for (int step = 0; step < 40; ++step) {
    m.zero_grads();
    last = loss_of(m, b);
    if (step == 0) first = last;
    m.backward();
    opt.step(m.params(), m.grads(), st);
    m.update_balancing();
  }
  INFO("first " << first << " last " << last);
  CHECK(last < 0.6 * first);
}

TEST_CASE("same seed and threads give bitwise the same losses", "[exec][model]") {
  const models::LayerGraph g = tiny_graph();
  const TestBatch b = make_batch(2, 32, g.model.vocab, 17);
  auto run = [&] {
    Model m(g, 2, 32);
    m.init_params(9);
    Optimizer opt(default_optimizer_config(10, g.model.d_model, 64));
    OptimizerState st = init_optimizer_state(m.params());
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) {
      m.zero_grads();
      losses.push_back(loss_of(m, b));
      m.backward();
      opt.step(m.params(), m.grads(), st);
      m.update_balancing();
    }
    return losses;
  };
  const std::vector<double> a = run(), c = run();
  REQUIRE(a.size() == c.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::memcmp(&a[i], &c[i], sizeof(double)) == 0);
  CHECK(a[2] != a[0]);  // it did train
}

TEST_CASE("the backward reports the gradient arena final from the top down when it is", "[exec][model]") {
  // tiny-gpt-gelu ties its LM head to the embedding table: that tensor is
  // written at both ends of the backward.
  for (const char* name : {"tiny-moe", "tiny-gpt-gelu"}) {
    INFO(name);
    const models::LayerGraph g =
        models::build_layer_graph(models::load_model(std::string(source_dir()) + "/models/zoo/" + name + ".json"));
    const TestBatch b = make_batch(2, 32, g.model.vocab, 3);
    Model m(g, 2, 32);
    m.init_params(4);
    m.zero_grads();
    loss_of(m, b);
    m.backward();
    const std::vector<float> final_grads(m.grads().data(), m.grads().data() + m.grads().total_floats());
    m.zero_grads();
    loss_of(m, b);
    std::vector<int64_t> reported;
    bool final_when_reported = true;
    m.backward([&](int64_t from) {
      reported.push_back(from);
      const float* now = std::as_const(m).grads().data();
      final_when_reported &= std::memcmp(now + from, final_grads.data() + from,
                                         sizeof(float) * static_cast<size_t>(m.grads().total_floats() - from)) == 0;
    });
    CHECK(final_when_reported);
    REQUIRE(reported.size() > static_cast<size_t>(g.model.layers));  // at least one range per layer
    for (size_t i = 1; i < reported.size(); ++i) CHECK(reported[i] < reported[i - 1]);
    CHECK(reported.back() == 0);
    CHECK(reported.front() < m.grads().total_floats());
    const int64_t embedding_end = m.grads().layout().offset(1);  // the table is the arena's first tensor
    REQUIRE(m.grads().layout().spec(0).name == "embedding.w");
    CHECK(reported[reported.size() - 2] >= embedding_end);
  }
}

TEST_CASE("simulated EP dispatch drops exactly what the dispatch library says", "[exec][model][drops]") {
  const models::LayerGraph g = tiny_graph();
  Model m(g, 2, 64);
  m.init_params(1);
  DispatchOptions d;
  d.enabled = true;
  d.ep = 4;
  d.config.n_experts = g.model.moe.experts;
  d.config.top_k = static_cast<int>(g.model.moe.top_k);
  d.config.transport = sim::Transport::capacity;
  d.config.receiver_cf = 0.5;  // tight: drops for sure
  m.set_dispatch(d);
  const TestBatch b = make_batch(2, 64, g.model.vocab, 21);
  const LossResult r = m.forward(b.inputs.data(), b.targets.data(), b.docs.data());
  CHECK(r.drops.dropped() > 0);
  // Every layer's decision, recomputed by the library itself from that layer's
  // chosen experts and routing weights (the capacity transport's priority):
  // the kept set must be the same assignment for assignment.
  const int64_t k = g.model.moe.top_k, per = 2 * 64 / 4 * k;  // assignments per virtual GPU
  int64_t layers = 0, dropped = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (g.ops[i].kind != models::OpKind::kTopK) continue;
    const int layer = g.ops[i].layer;
    INFO("layer " << layer);
    const int32_t* e = m.routed_experts(layer);
    const float* weights = m.op_output(i);  // (N, k)
    std::vector<sim::GpuAssignments> gpus(4);
    for (int q = 0; q < 4; ++q) {
      gpus[q].experts.assign(e + q * per, e + (q + 1) * per);
      gpus[q].probs.assign(weights + q * per, weights + (q + 1) * per);
    }
    const sim::DispatchResult ref = sim::dispatch(d.config, gpus);
    const std::vector<uint8_t> kept = m.kept_assignments(layer);
    REQUIRE(kept.size() == static_cast<size_t>(4 * per));
    int64_t differ = 0;
    for (int64_t a = 0; a < 4 * per; ++a) differ += kept[a] != ref.keep[a / per][a % per];
    CHECK(differ == 0);
    CHECK(ref.counts.dropped() > 0);
    dropped += ref.counts.dropped();
    ++layers;
  }
  CHECK(layers == g.model.layers);
  CHECK(r.drops.dropped() == dropped);  // the logged count is the sum of the layers' decisions
  // Bad EP sizes are user errors.
  d.ep = 3;
  CHECK_THROWS_AS(m.set_dispatch(d), UserError);
}

TEST_CASE("router losses under data parallelism: the ranks' shares add up to the global batch's", "[exec][model]") {
  // Aux-loss balancing (its f needs the global batch's counts, all-reduced in
  // the forward) and an applied router z-loss (a mean over the global tokens),
  // on two ranks in two threads, against one process holding the whole batch.
  models::ModelConfig cfg = models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json");
  cfg.moe.balancing = models::BalancingKind::kAuxLoss;
  cfg.moe.aux_loss_weight = 0.5;
  cfg.moe.router_z_loss_applied = true;
  cfg.moe.router_z_loss_weight = 0.05;
  const models::LayerGraph g = models::build_layer_graph(cfg);
  const int64_t T = 16;
  const TestBatch b = make_batch(2, T, cfg.vocab, 3);
  Model whole(g, 2, T);
  whole.init_params(1);
  whole.zero_grads();
  const LossResult lw = whole.forward(b.inputs.data(), b.targets.data(), b.docs.data());
  whole.backward();

  // An in-process all-reduce of two ranks' counts (a sum buffer per parity of
  // the round: a rank may start the next round before the other has read this one's).
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> sums[2];
  int arrived = 0, generation = 0;
  auto reduce = [&](int64_t* counts, int n) {
    std::unique_lock<std::mutex> lock(mu);
    const int gen = generation;
    std::vector<int64_t>& sum = sums[gen % 2];
    if (arrived == 0) sum.assign(static_cast<size_t>(n), 0);
    for (int e = 0; e < n; ++e) sum[static_cast<size_t>(e)] += counts[e];
    if (++arrived == 2) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
    for (int e = 0; e < n; ++e) counts[e] = sum[static_cast<size_t>(e)];
  };
  std::vector<std::unique_ptr<Model>> ranks;
  LossResult lr[2];
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<Model>(g, 1, T));
    ranks[r]->init_params(1);
    ranks[r]->zero_grads();
    ranks[r]->set_loss_tokens(2 * T);
    ranks[r]->set_router_loss_share(2 * T, reduce);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const size_t at = static_cast<size_t>(r * T);
      lr[r] = ranks[r]->forward(b.inputs.data() + at, b.targets.data() + at, b.docs.data() + at);
      ranks[r]->backward();
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(lw.router_loss > 0.5 * cfg.moe.aux_loss_weight * cfg.layers);
  CHECK(lr[0].router_loss + lr[1].router_loss == Approx(lw.router_loss).epsilon(1e-9));
  CHECK(lr[0].loss + lr[1].loss == Approx(lw.loss).epsilon(1e-7));  // fp32 GEMMs of another row count
  // Gradients add up too (the router's carry both losses).
  double d2 = 0, n2 = 0;
  const Arena& gw = whole.grads();
  for (int64_t i = 0; i < gw.total_floats(); ++i) {
    const double x = static_cast<double>(ranks[0]->grads().data()[i]) + ranks[1]->grads().data()[i];
    d2 += (x - gw.data()[i]) * (x - gw.data()[i]);
    n2 += static_cast<double>(gw.data()[i]) * gw.data()[i];
  }
  CHECK(std::sqrt(d2 / n2) < 1e-5);
  const TensorView router = whole.grads().view("layers.0.moe.router.w");
  const int64_t at = router.data - whole.grads().data();
  double rd = 0, rn = 0;
  for (int64_t i = 0; i < router.numel; ++i) {
    const double x = static_cast<double>(ranks[0]->grads().data()[at + i]) + ranks[1]->grads().data()[at + i];
    rd += (x - router.data[i]) * (x - router.data[i]);
    rn += static_cast<double>(router.data[i]) * router.data[i];
  }
  CHECK(std::sqrt(rd / rn) < 1e-5);
}

using testing::NotHostBackend;

TEST_CASE("a backend outside host memory trains bitwise like the CPU (the driver's device path)", "[exec][model]") {
  for (const bool mla : {false, true}) {
    models::ModelConfig cfg = models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json");
    if (mla) {  // MLA adds the driver's glue (key assembly, v padding, a linear with two outputs)
      cfg.attention.kind = models::AttentionKind::kMla;
      cfg.attention.mla_kv_latent = 32;
      cfg.attention.mla_q_latent = 48;
      cfg.attention.mla_rope_dim = 16;
      cfg.attention.kv_heads = cfg.attention.local.kv_heads = cfg.attention.global.kv_heads = cfg.attention.heads;
    }
    INFO((mla ? "MLA" : "GQA"));
    const models::LayerGraph g = models::build_layer_graph(cfg);
    Model host(g, 2, 16);
    Model dev(g, 2, 16, std::make_unique<NotHostBackend>());
    DispatchOptions d;
    d.enabled = true;
    d.ep = 2;
    d.config.n_experts = g.model.moe.experts;
    d.config.top_k = static_cast<int>(g.model.moe.top_k);
    d.config.transport = sim::Transport::capacity;
    d.config.receiver_cf = 0.6;  // drops: the keep mask crosses to the backend
    for (Model* m : {&host, &dev}) {
      m->init_params(1);
      m->set_dispatch(d);
    }
    for (int step = 0; step < 2; ++step) {
      const TestBatch b = make_batch(2, 16, cfg.vocab, 40 + step);
      LossResult r[2];
      int i = 0;
      for (Model* m : {&host, &dev}) {
        m->zero_grads();
        r[i++] = m->forward(b.inputs.data(), b.targets.data(), b.docs.data());
        m->backward();
        m->update_balancing();
      }
      CHECK(r[0].loss == r[1].loss);
      CHECK(r[0].drops.dropped() == r[1].drops.dropped());
      CHECK(r[0].drops.dropped() > 0);
      CHECK(std::memcmp(host.grads().data(), dev.grads().data(), host.grads().bytes()) == 0);
      CHECK(host.balancing_state() == dev.balancing_state());
      CHECK(std::memcmp(host.logits(), dev.logits(), static_cast<size_t>(32 * cfg.vocab) * sizeof(float)) == 0);
      CHECK(host.kept_assignments(0) == dev.kept_assignments(0));
      for (Model* m : {&host, &dev}) {  // a host-side update the device must see at the next forward
        float* p = m->params().data();
        const float* gr = m->grads().data();
        for (int64_t j = 0; j < m->params().total_floats(); ++j) p[j] -= 0.05f * gr[j];
      }
    }
    CHECK(dev.find_nonfinite_backward().empty());
  }
}

namespace {

models::LayerGraph oss_graph() {
  return models::build_layer_graph(
      models::load_model(std::string(rackstep::source_dir()) + "/tests/models/tiny-gpt-oss-moe.json"));
}

}  // namespace

TEST_CASE("gpt-oss's experts (biases, clamped SwiGLU): arena, init, optimizer group and parameter count",
          "[exec][model]") {
  const models::LayerGraph g = oss_graph();
  REQUIRE(g.model.moe.expert_bias);
  Model m(g, 1, 16);
  m.init_params(1);
  const Arena& p = m.params();
  // Every learnable tensor of the layer graph is in the arena: the count `rackstep params` prints.
  CHECK(static_cast<double>(p.layout().param_count()) == models::count_params(g).total);
  const int64_t E = g.model.moe.experts, F = g.model.moe.expert_width, d = g.model.d_model;
  for (const char* name : {"layers.0.moe.experts.b1", "layers.1.moe.experts.b3", "layers.1.moe.experts.b2"}) {
    INFO(name);
    const int64_t i = p.layout().find(name);
    REQUIRE(i >= 0);
    const auto b = p.view(static_cast<size_t>(i));
    CHECK(b.numel == E * (std::string(name).back() == '2' ? d : F));
    CHECK(b.spec->group == OptGroup::kAdam);  // a bias, updated elementwise like every other
    for (int64_t j = 0; j < b.numel; ++j) CHECK(b.data[j] == 0.0f);  // biases start at 0
  }
  // A Muon or hyperball group for the biases is refused, naming the JSON path.
  nlohmann::json doc = load_json_file(std::string(rackstep::source_dir()) + "/tests/models/tiny-gpt-oss-moe.json");
  doc["recipe"]["optimizer"]["other"] = "muon";
  const models::LayerGraph muon = models::build_layer_graph(models::parse_model(doc, "muon.json"));
  CHECK_THROWS_WITH(Model(muon, 1, 16), Catch::Contains("muon.json") && Catch::Contains("/recipe/optimizer/other"));
}

TEST_CASE("gpt-oss's experts: whole-model gradients of the expert matrices and biases match finite differences",
          "[exec][model][gradcheck]") {
  // Non-zero biases (init gives 0) so that the forward's use of them is tested too.
  check_whole_model_gradients(oss_graph(), 5,
                              {"layers.0.moe.experts.w1", "layers.0.moe.experts.w3", "layers.1.moe.experts.w2",
                               "layers.0.moe.experts.b1", "layers.1.moe.experts.b3", "layers.0.moe.experts.b2",
                               "layers.0.moe.router.w", "layers.1.attn.sinks", "layers.0.attn.q_proj.b"},
                              [](Model& m) {
                                uint64_t s = 99;
                                for (const char* name : {"b1", "b3", "b2"}) {
                                  for (int l = 0; l < 2; ++l) {
                                    TensorView b = m.params().view("layers." + std::to_string(l) + ".moe.experts." + name);
                                    for (int64_t j = 0; j < b.numel; ++j) {
                                      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
                                      b.data[j] = 0.3f * (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 0.5f);
                                    }
                                  }
                                }
                              });
}

TEST_CASE("gpt-oss's experts: the model runs the variant it declares (its loss differs from the plain SwiGLU's)",
          "[exec][model]") {
  const models::LayerGraph g = oss_graph();
  Model m(g, 2, 64);
  m.init_params(2);
  const TestBatch b = make_batch(2, 64, g.model.vocab, 7);
  const double oss = loss_of(m, b);
  nlohmann::json doc = load_json_file(std::string(rackstep::source_dir()) + "/tests/models/tiny-gpt-oss-moe.json");
  doc["moe"]["swiglu_alpha"] = 1.0;
  doc["moe"]["swiglu_limit"] = 0.0;
  doc["moe"]["swiglu_linear_offset"] = 0.0;
  const models::LayerGraph plain_g = models::build_layer_graph(models::parse_model(doc, "plain.json"));
  Model plain(plain_g, 2, 64);
  plain.init_params(2);  // the same weights: tensors are seeded by name
  CHECK(loss_of(plain, b) != oss);
}

// tiny-gpt-oss-moe with gpt-oss's YaRN, its ramp inside the tiny model's 16 pairs.
static nlohmann::json yarn_oss_doc() {
  nlohmann::json doc = load_json_file(std::string(rackstep::source_dir()) + "/tests/models/tiny-gpt-oss-moe.json");
  doc["attention"]["rope_scaling"] = "yarn";
  doc["attention"]["yarn"] = {{"factor", 32.0}, {"original_max_position_embeddings", 16},
                              {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"truncate", false}};
  return doc;
}

TEST_CASE("a model with YaRN-scaled RoPE trains with YaRN's frequencies, not plain ones", "[exec][model]") {
  const models::LayerGraph yarn = models::build_layer_graph(models::parse_model(yarn_oss_doc(), "yarn.json"));
  Model m(yarn, 2, 64);
  m.init_params(2);
  const TestBatch b = make_batch(2, 64, yarn.model.vocab, 7);
  const double with_yarn = loss_of(m, b);
  const models::LayerGraph plain_g = oss_graph();
  Model plain(plain_g, 2, 64);
  plain.init_params(2);  // the same weights: tensors are seeded by name
  CHECK(std::isfinite(with_yarn));
  CHECK(loss_of(plain, b) != with_yarn);
}

TEST_CASE("YaRN RoPE: whole-model gradients of the attention projections match finite differences",
          "[exec][model][gradcheck]") {
  const models::LayerGraph yarn = models::build_layer_graph(models::parse_model(yarn_oss_doc(), "yarn.json"));
  check_whole_model_gradients(yarn, 5, {"layers.0.attn.q_proj.w", "layers.1.attn.k_proj.w", "layers.0.attn.q_proj.b"});
}

TEST_CASE("YaRN's parameters: required with rope_scaling yarn, one error naming the path when bad", "[exec][model]") {
  nlohmann::json doc = yarn_oss_doc();
  doc["attention"].erase("yarn");
  CHECK_THROWS_WITH(models::parse_model(doc, "y.json"), Catch::Contains("y.json") && Catch::Contains("/attention/yarn"));
  doc = yarn_oss_doc();
  doc["attention"]["yarn"]["beta_slow"] = 40.0;
  CHECK_THROWS_WITH(models::parse_model(doc, "y.json"), Catch::Contains("/attention/yarn/beta_slow"));
  doc = yarn_oss_doc();
  doc["attention"]["yarn"]["factor"] = 0.5;
  CHECK_THROWS_WITH(models::parse_model(doc, "y.json"), Catch::Contains("/attention/yarn/factor"));
  doc = yarn_oss_doc();
  doc["attention"]["rope_scaling"] = "none";
  CHECK_THROWS_WITH(models::parse_model(doc, "y.json"), Catch::Contains("/attention/yarn"));
  // MLA's YaRN (DeepSeek's mscale on the softmax) is not the form the kernels run.
  nlohmann::json mla = load_json_file(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json");
  mla["attention"]["kind"] = "mla";
  mla["attention"]["mla"] = {{"kv_latent", 32}, {"rope_dim", 16}};
  mla["attention"]["rope_scaling"] = "yarn";
  mla["attention"]["yarn"] = yarn_oss_doc()["attention"]["yarn"];
  const models::LayerGraph g = models::build_layer_graph(models::parse_model(mla, "mla.json"));
  CHECK_THROWS_WITH(Model(g, 1, 16), Catch::Contains("mla.json") && Catch::Contains("/attention/rope_scaling"));
}
