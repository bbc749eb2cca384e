// The counting conventions of spec/marin-architecture.md are tests: every
// figure there is reproduced from the model JSON through the layer graph.
#include <catch2/catch.hpp>

#include <cmath>

#include "models/layer_graph.h"
#include "sim/base/source_dir.h"

using namespace rackstep::models;

namespace {

LayerGraph zoo(const std::string& name) {
  return build_layer_graph(load_model(std::string(rackstep::source_dir()) + "/models/zoo/" + name + ".json"));
}

// Rounds like the spec's tables: to `digits` after the decimal point, in billions.
double round_b(double x, int digits) {
  const double s = std::pow(10.0, digits);
  return std::round(x / 1e9 * s) / s;
}

}  // namespace

TEST_CASE("hero 535B-A23B reproduces every published count", "[models][counting]") {
  const LayerGraph g = zoo("marin-535b-a23b");
  const ParamCounts p = count_params(g);
  CHECK(round_b(p.total, 2) == Approx(535.48));
  CHECK(round_b(p.active, 3) == Approx(22.762));
  // Per-layer components as listed in the spec.
  CHECK(round_b(p.experts / 48, 2) == Approx(10.87));
  CHECK(std::round(p.attention / 48 / 1e5) / 10 == Approx(94.4));   // M
  CHECK(std::round(p.shared_experts / 48 / 1e6) == Approx(113));
  CHECK(std::round(p.latent / 48 / 1e5) / 10 == Approx(37.7));
  CHECK(std::round(p.router / 48 / 1e5) / 10 == Approx(2.4));
  CHECK(std::round(p.gated_norms / 48 / 1e5) / 10 == Approx(3.1).epsilon(0.05));
  // "Including gated norms, SConv and LM head gives ~23.7B".
  CHECK(round_b(p.active_with_extras, 1) == Approx(23.7));

  const FlopCounts f = count_flops(g, 4096, FlopConvention::kMarin);
  CHECK(round_b(f.forward, 2) == Approx(49.91));
  CHECK(round_b(f.training, 1) == Approx(149.7));
  const int64_t steps = recipe_steps(g);
  CHECK(steps == 390251);
  const double run_flops = f.training * static_cast<double>(steps) * static_cast<double>(g.model.tokens_per_step());
  CHECK(std::round(run_flops / 1e21) / 1e3 == Approx(2.696));
  CHECK(g.model.tokens_per_step() == 46137344);
  CHECK(g.model.global_layer_count() == 12);
}

TEST_CASE("the exact convention halves causal attention and clips windows", "[models][counting]") {
  const LayerGraph g = zoo("marin-535b-a23b");
  const FlopCounts marin = count_flops(g, 4096, FlopConvention::kMarin);
  const FlopCounts exact = count_flops(g, 4096, FlopConvention::kExact);
  CHECK(exact.attention_core < marin.attention_core);
  CHECK(exact.experts == marin.experts);  // matmuls do not change
  CHECK(mean_attention_span(4096, 0, FlopConvention::kExact) == Approx(2048.5));
  CHECK(mean_attention_span(4096, 0, FlopConvention::kMarin) == 4096);
  CHECK(mean_attention_span(4096, 2048, FlopConvention::kMarin) == 2048);
  // Queries 0..2047 see 1..2048 keys, the rest 2048.
  CHECK(mean_attention_span(4096, 2048, FlopConvention::kExact) ==
        Approx((2048.0 * 2049.0 / 2.0 + 2048.0 * 2048.0) / 4096.0));
  CHECK(mean_attention_span(100, 4096, FlopConvention::kExact) == Approx(50.5));
}

TEST_CASE("hardware FLOPs grow with recomputation", "[models][counting]") {
  const LayerGraph g = zoo("marin-535b-a23b");
  const double none = training_hardware_flops_per_token(g, 4096, Recompute::kNone);
  const double sel = training_hardware_flops_per_token(g, 4096, Recompute::kSelective);
  const double full = training_hardware_flops_per_token(g, 4096, Recompute::kFull);
  CHECK(none < sel);
  CHECK(sel < full);
  // Full recompute replays the whole forward of the blocks: ~4/3 of no recompute.
  CHECK(full / none == Approx(4.0 / 3.0).epsilon(0.03));
}

TEST_CASE("scaling ladder rungs match the table", "[models][counting]") {
  struct Rung {
    const char* name;
    double total_b;
    int total_digits;
    double active_b;
    int active_digits;
    int64_t steps;
  };
  const Rung rungs[] = {
      {"marin-ladder-d768", 1.6, 1, 0.061, 3, 11420},
      {"marin-ladder-d1024", 4.0, 1, 0.162, 3, 15276},
      {"marin-ladder-d1536", 11.5, 1, 0.481, 3, 15128},
      {"marin-ladder-d2048", 27.7, 1, 1.2, 1, 20072},
  };
  for (const Rung& r : rungs) {
    INFO(r.name);
    const LayerGraph g = zoo(r.name);
    const ParamCounts p = count_params(g);
    CHECK(round_b(p.total, r.total_digits) == Approx(r.total_b));
    CHECK(round_b(p.active, r.active_digits) == Approx(r.active_b));
    CHECK(recipe_steps(g) == r.steps);
  }
}

TEST_CASE("other shapes: 360B FSDP, earlier EP shapes, 67B-A2B", "[models][counting]") {
  const ParamCounts fsdp = count_params(zoo("marin-360b-fsdp"));
  CHECK(round_b(fsdp.total, 1) == Approx(359.6));
  CHECK(round_b(fsdp.active, 1) == Approx(20.9));

  // These two publish active as total minus the unselected routed experts.
  const ParamCounts ep6272 = count_params(zoo("marin-ep-192x6272"));
  CHECK(round_b(ep6272.total, 1) == Approx(546.3));
  CHECK(round_b(ep6272.active_total_minus_unselected, 1) == Approx(24.7));
  CHECK(round_b(ep6272.total, 3) == Approx(546.292));
  CHECK(round_b(ep6272.active_total_minus_unselected, 3) == Approx(24.680));
  const ParamCounts ep6144 = count_params(zoo("marin-ep-192x6144"));
  CHECK(round_b(ep6144.total, 1) == Approx(535.4));
  CHECK(round_b(ep6144.active_total_minus_unselected, 1) == Approx(24.5));

  const ParamCounts snowball = count_params(zoo("marin-67b-a2b"));
  CHECK(round_b(snowball.total, 2) == Approx(67.04));
  CHECK(round_b(snowball.active, 2) == Approx(1.98));
}

TEST_CASE("the layer graph has every component of the hero", "[models][graph]") {
  const LayerGraph g = zoo("marin-535b-a23b");
  auto count = [&](OpKind k) {
    return std::count_if(g.ops.begin(), g.ops.end(), [k](const Op& op) { return op.kind == k; });
  };
  CHECK(count(OpKind::kEmbedding) == 1);
  CHECK(count(OpKind::kAttention) == 48);
  CHECK(count(OpKind::kXsa) == 48);
  CHECK(count(OpKind::kAttnGate) == 48);
  CHECK(count(OpKind::kQkNorm) == 48);
  CHECK(count(OpKind::kRope) == 36);          // NoPE on the 12 global layers
  CHECK(count(OpKind::kSConv) == 3 * 48);     // K, attention out, MoE out
  CHECK(count(OpKind::kGatedNorm) == 2 * 48 + 2);
  CHECK(count(OpKind::kExpertMlp) == 48);
  CHECK(count(OpKind::kSharedMlp) == 48);
  CHECK(count(OpKind::kDispatch) == 48);
  CHECK(count(OpKind::kCombine) == 48);
  CHECK(count(OpKind::kLmHead) == 1);
  CHECK(count(OpKind::kCrossEntropy) == 1);
  REQUIRE(g.block_begin.size() == 49);
  // Layer 3 is global: full causal, 6 KV heads; layer 0 local: window 2048, 12 KV heads.
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::kAttention) continue;
    if (op.layer == 3) {
      CHECK(op.window == 0);
      CHECK(op.kv_heads == 6);
      CHECK(op.layer_kind == LayerKind::kGlobal);
    }
    if (op.layer == 0) {
      CHECK(op.window == 2048);
      CHECK(op.kv_heads == 12);
    }
  }
  // Shapes are functions of (batch, seq).
  const Op& q = *std::find_if(g.ops.begin(), g.ops.end(), [](const Op& op) { return op.name == "layers.0.attn.q_proj"; });
  CHECK(q.in_shape(2, 4096) == std::vector<int64_t>{2, 4096, 6144});
  CHECK(q.out_shape(2, 4096) == std::vector<int64_t>{2, 4096, 6144});
}

TEST_CASE("optimizer groups follow Marin's recipe", "[models][graph]") {
  const LayerGraph g = zoo("marin-535b-a23b");
  for (const Op& op : g.ops) {
    for (const ParamTensor& p : op.params) {
      INFO(p.name);
      switch (p.role) {
        case ParamRole::kBlockMatrix:
        case ParamRole::kExpertMatrix: CHECK(p.optimizer == OptimizerKind::kMuonH); break;
        case ParamRole::kLmHead: CHECK(p.optimizer == OptimizerKind::kAdamH); break;
        default: CHECK(p.optimizer == OptimizerKind::kAdam); break;
      }
    }
  }
}

TEST_CASE("op costs scale with batch and sequence", "[models][graph]") {
  const LayerGraph g = zoo("tiny-moe");
  for (const Op& op : g.ops) {
    const OpCost a = op_cost(op, 1, 128);
    const OpCost b = op_cost(op, 2, 128);
    INFO(op.name);
    CHECK(b.fwd_flops == Approx(2 * a.fwd_flops));
    CHECK(b.saved_bytes == Approx(2 * a.saved_bytes));
    CHECK(b.param_bytes == a.param_bytes);
    if (op.kind == OpKind::kAttention && op.window == 0) {
      // Full causal attention per token grows with the sequence.
      CHECK(op_cost(op, 1, 256).fwd_flops > 2.0 * a.fwd_flops);
    }
  }
}
