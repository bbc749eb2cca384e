// The experts' quick-GEGLU activation syncs the host (issue 13): Megatron-Core's
// weighted_bias_quick_geglu_impl copies its linear offset to the device on every call
// (torch.tensor(..., device=...), a blocking copy), after fc1 and before the activation
// kernel. The host stops there in each forward, and in each backward that recomputes
// moe_act (the replay runs from the hook on fc2's output): predict prices both with the
// in-order issue from each sync, and the timeline issues the ops the same way.
#include <catch2/catch.hpp>

#include <string>
#include <utility>

#include "sim/base/source_dir.h"
#include "sim/des.h"
#include "sim/predict.h"
#include "sim/stack.h"
#include "sim/step_graph.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

Calibration megatron_bridge(bool activation_syncs) {
  Calibration cal = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  cal.quick_glu_activation_syncs = activation_syncs;
  return cal;
}

// gpt-oss-120b on 64 GB200 (Grace hosts) as Megatron-Bridge's 25.11 GB200 preset runs
// it: EP 64 over 64 data ranks, micro-batch 1 of 8192 tokens, recompute of `modules`;
// 8 micro-batches per step.
struct GptOss {
  models::LayerGraph g = models::build_layer_graph(models::load_model(src("tests/validation/models/gpt-oss-120b.json")));
  topologies::Cluster c = topologies::make_cluster(topologies::load_system(src("topologies/zoo/gb200-nvl72.json")), 1, 64);

  static Layout layout(uint32_t modules) {
    Layout l;
    l.data = 64;
    l.fsdp = 64;
    l.zero_stage = 1;
    l.ep = 64;
    l.ep_transport = Transport::ragged;
    l.micro_batch_seqs = 1;
    l.seq_len = 8192;
    l.tokens_per_step = 64.0 * 8.0 * 8192.0;
    l.recompute = models::Recompute::kSelective;
    l.recompute_modules = modules;
    return l;
  }
};

const uint32_t kLayernorm = models::recompute_module_bit(models::RecomputeModule::kLayernorm);
const uint32_t kMoeAct = models::recompute_module_bit(models::RecomputeModule::kMoeAct);

const OpEntry& experts_of(const LayerClass& lc) {
  for (const OpEntry& e : lc.ops) {
    if (e.kind == models::OpKind::kExpertMlp) return e;
  }
  FAIL("no experts op");
  return lc.ops.front();
}

}  // namespace

TEST_CASE("Only a quick-GEGLU expert activation syncs, and only under a stack that says so", "[moe_host]") {
  const GptOss oss;
  const OpTable oss_ops = build_op_table(oss.g);
  const OpEntry& quick = experts_of(oss_ops.classes.at(0));
  CHECK(quick.swiglu_alpha == 1.702);
  CHECK(expert_activation_syncs(quick, megatron_bridge(true)));
  CHECK_FALSE(expert_activation_syncs(quick, megatron_bridge(false)));
  CHECK_FALSE(expert_activation_syncs(quick, default_calibration()));  // Marin's compiled step
  // Qwen3's SwiGLU experts (alpha 1) go through weighted_bias_swiglu_impl: no copy.
  const auto qwen = models::build_layer_graph(models::load_model(src("tests/validation/models/qwen3-30b-a3b.json")));
  const OpTable qwen_ops = build_op_table(qwen);
  CHECK_FALSE(expert_activation_syncs(experts_of(qwen_ops.classes.at(0)), megatron_bridge(true)));
  CHECK(stack_calibration(load_stack(stack_path("megatron-bridge-2025"))).quick_glu_activation_syncs);
}

TEST_CASE("The experts' forward splits at the activation: fc1 and the clamps before, the rest after", "[moe_host]") {
  const GptOss oss;
  const Calibration cal = megatron_bridge(true);
  const StepPrice price = Predictor(oss.g, oss.c, cal).price(GptOss::layout(kLayernorm | kMoeAct));
  REQUIRE(price.prediction.valid);
  int experts = 0;
  for (const OpTiming& o : price.ops) {
    if (o.layer != 0) continue;
    const bool is_experts = oss.g.ops[o.graph_index].kind == models::OpKind::kExpertMlp;
    INFO(oss.g.ops[o.graph_index].name);
    if (!is_experts) {
      CHECK(o.fwd_before_sync_s == 0.0);
      CHECK_FALSE(o.bwd_after_sync);
      continue;
    }
    ++experts;
    // fc1 holds 2 of the 3 matrices' FLOPs: most of the op, not all of it.
    CHECK(o.fwd_before_sync_s > 0.5 * o.fwd_s);
    CHECK(o.fwd_before_sync_s < o.fwd_s);
    CHECK(o.fwd_host_before_sync_s > 0.0);
    CHECK(o.fwd_host_before_sync_s < o.fwd_host_s);
    CHECK(o.bwd_after_sync);  // moe_act is recomputed
  }
  CHECK(experts == 1);
  // Without moe_act in the recompute the backward has no sync.
  const StepPrice ln = Predictor(oss.g, oss.c, cal).price(GptOss::layout(kLayernorm));
  for (const OpTiming& o : ln.ops) CHECK_FALSE(o.bwd_after_sync);
}

TEST_CASE("The activation's sync exposes host issue in the forward, and again in a backward that recomputes moe_act", "[moe_host]") {
  const GptOss oss;
  const auto host_issue = [&](bool syncs, uint32_t modules) {
    const Prediction p = Predictor(oss.g, oss.c, megatron_bridge(syncs)).predict(GptOss::layout(modules));
    REQUIRE(p.valid);
    return p.breakdown.host_issue_s;
  };
  const Prediction off = Predictor(oss.g, oss.c, megatron_bridge(false)).predict(GptOss::layout(kLayernorm));
  // Forward only (layernorm recomputed): a second sync per MoE layer forward.
  const double forward_s = host_issue(true, kLayernorm) - host_issue(false, kLayernorm);
  // moe_act recomputed: the backward's host also stops at the replayed activation, so it
  // can no longer run ahead over the pass: far more of its issue is exposed.
  const double both_s = host_issue(true, kLayernorm | kMoeAct) - host_issue(false, kLayernorm | kMoeAct);
  INFO("forward sync " << forward_s << " s, with the backward's " << both_s << " s per step");
  CHECK(forward_s > 0.01 * off.step_time_s);
  CHECK(both_s > 2.0 * forward_s);
}

TEST_CASE("The timeline stops the host at the activation as predict does", "[moe_host][step_graph]") {
  const GptOss oss;
  const auto step = [&](bool syncs) {
    const Predictor p(oss.g, oss.c, megatron_bridge(syncs));
    StepGraph sg = build_step_graph(p, GptOss::layout(kLayernorm | kMoeAct), StepGraphOptions{});
    return std::pair{sg.prediction.step_time_s, sg.engine.run().makespan_s};
  };
  const auto [predict_off, des_off] = step(false);
  const auto [predict_on, des_on] = step(true);
  INFO("predict " << predict_off << " -> " << predict_on << " s, DES " << des_off << " -> " << des_on << " s");
  REQUIRE(predict_on - predict_off > 0.05 * predict_off);
  // The DES moves by what predict adds, within a fifth of it.
  CHECK(des_on - des_off == Approx(predict_on - predict_off).epsilon(0.2));
}
