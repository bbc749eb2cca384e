// Module-level recompute (Megatron-Core's recompute_modules) and what a
// Megatron-Core MoE layer keeps for its backward, in memory and in time.
// Expected figures are derived by hand from DeepSeek-V3's dimensions
// (d 7168, 128 heads of 128 + 64 RoPE dims, q latent 1536, kv latent 512,
// 8 of 256 experts of width 2048, one shared expert), not read from the code.
#include <catch2/catch.hpp>

#include "sim/base/check.h"
#include "sim/base/source_dir.h"
#include "sim/predict.h"
#include "sim/stack.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& rel) { return std::string(rackstep::source_dir()) + "/" + rel; }

const Stack& bridge() {
  static const Stack s = load_stack(stack_path("megatron-bridge-2025"));
  return s;
}

const Predictor& dsv3() {
  static const Predictor p(models::build_layer_graph(models::load_model(src("tests/validation/models/deepseek-v3.json"))),
                           topologies::load_cluster(src("topologies/zoo/gb200-nvl72.json"), 4),
                           stack_calibration(bridge()));
  return p;
}

// The published GB200 BF16 layout (tests/validation/megatron-bridge-2025.json), no recompute.
Layout dsv3_layout() {
  Layout l;
  l.data = 64;
  l.fsdp = 64;
  l.zero_stage = 1;
  l.ep = 64;
  l.pp = 4;
  l.pp_virtual = 4;
  l.schedule = PpSchedule::kInterleaved1F1B;
  l.uneven_stages = true;
  l.micro_batch_seqs = 1;
  l.tokens_per_step = 16777216;
  l.recompute = models::Recompute::kNone;
  l.grad_dtype = GradDtype::kBf16;
  return l;
}

Layout with_modules(std::initializer_list<models::RecomputeModule> modules) {
  Layout l = dsv3_layout();
  l.recompute = models::Recompute::kSelective;
  for (const auto m : modules) l.recompute_modules |= models::recompute_module_bit(m);
  return l;
}

MemoryBreakdown mem(const Layout& l, const Calibration& cal) {
  const Predictor& p = dsv3();
  return estimate_memory(p.table(), p.cluster(), l, cal, layout_shape(p.table(), p.cluster(), l, cal));
}
MemoryBreakdown mem(const Layout& l) { return mem(l, dsv3().calibration()); }

// Saved elements per token of one DeepSeek-V3 MoE layer, no recompute, with the
// combine keeping the 8 expert outputs (8 x 7168):
//   pre-norms 2 x 7169, q_down input 7168, q latent norm 1537 + q_up input 1536,
//   kv latent norm 513 + kv_up input 512, attention q 128x192 + k, v 128x(192+128)
//   + output 128x128 + lse 128, o_proj input 16384, router 256, top-k 16,
//   experts 8 x (7168 + 3 x 2048), combine 57344, shared expert 7168 + 3 x 2048.
constexpr double kMoeLayerSaved = 301460;
constexpr double kCombineSaved = 8 * 7168;
// mla_up_proj frees q, k, v after attention and the up-projections' own saved
// tensors (1537 + 1536 + 513 + 512), keeping the latents and RoPE key (1536 + 512 + 64).
constexpr double kMlaUpProjFreed = 128 * (192 + 192 + 128) + (1537 + 1536 + 513 + 512) - (1536 + 512 + 64);

}  // namespace

TEST_CASE("Megatron-Core's combine keeps no expert outputs", "[memory][recompute_modules]") {
  // megatron-bridge-2025 says combine_saves_expert_outputs 0; the default calibration keeps them.
  const MemoryBreakdown mcore = mem(dsv3_layout());
  const MemoryBreakdown kept = mem(dsv3_layout(), default_calibration());
  CHECK(dsv3().calibration().combine_saves_expert_outputs == 0.0);
  CHECK(kept.activations / mcore.activations == Approx(kMoeLayerSaved / (kMoeLayerSaved - kCombineSaved)));
}

TEST_CASE("mla_up_proj frees q, k, v and costs the up-projections' forward", "[memory][recompute_modules]") {
  const double saved = kMoeLayerSaved - kCombineSaved;
  const Layout none = dsv3_layout();
  const Layout up = with_modules({models::RecomputeModule::kMlaUpProj});
  CHECK(mem(up).activations / mem(none).activations == Approx((saved - kMlaUpProjFreed) / saved));
  // The published run (it ran in 185 GiB of a GB200) fits only with the module recompute.
  CHECK_FALSE(mem(none).fits_device);
  CHECK(mem(up).fits_device);

  const Prediction p_none = dsv3().predict(none);
  const Prediction p_up = dsv3().predict(up);
  const Prediction p_full = dsv3().predict([] {
    Layout l = dsv3_layout();
    l.recompute = models::Recompute::kFull;
    return l;
  }());
  CHECK(p_none.breakdown.compute_recompute_s == 0.0);
  CHECK(p_up.breakdown.compute_recompute_s > 0.0);
  // Two small GEMMs (1536 -> 24576, 512 -> 32768) and norms: far below a whole layer's forward.
  CHECK(p_up.breakdown.compute_recompute_s < 0.2 * p_full.breakdown.compute_recompute_s);
  CHECK(p_up.breakdown.compute_fwd_s == Approx(p_none.breakdown.compute_fwd_s));
}

TEST_CASE("each module frees what Megatron-Core discards", "[memory][recompute_modules]") {
  const double saved = kMoeLayerSaved - kCombineSaved;
  const double none = mem(dsv3_layout()).activations;
  const auto ratio = [&](models::RecomputeModule m) { return mem(with_modules({m})).activations / none; };
  // moe_act: the activation's output, 8 rows x 2048.
  CHECK(ratio(models::RecomputeModule::kMoeAct) == Approx((saved - 8 * 2048) / saved));
  // shared_experts: keeps its input only (drops 3 x 2048).
  CHECK(ratio(models::RecomputeModule::kSharedExperts) == Approx((saved - 3 * 2048) / saved));
  // layernorm: the two pre-norm outputs the q_down and shared-expert GEMMs saved.
  CHECK(ratio(models::RecomputeModule::kLayernorm) == Approx((saved - 2 * 7168) / saved));
  // moe: router, top-k, experts and shared expert go; the checkpoint keeps its input
  // (7168). The MoE layer is then lighter than the 3 dense layers (MLP width 18432:
  // the same attention and norms, 7168 + 3 x 18432 for the MLP), which set the stage's peak.
  const double moe_ops = 256 + 16 + 8 * (7168 + 3 * 2048) + (7168 + 3 * 2048);
  const double dense_layer = 2 * 7169 + 7168 + 1537 + 1536 + 513 + 512 + 82048 + 16384 + 7168 + 3 * 18432;
  CHECK(saved - moe_ops + 7168 < dense_layer);
  CHECK(ratio(models::RecomputeModule::kMoe) == Approx(dense_layer / saved));
  // core_attn: the attention kernel keeps q, k, v, not its output and lse.
  CHECK(ratio(models::RecomputeModule::kCoreAttn) == Approx((saved - 128 * 128 - 128) / saved));
  // Modules add up; the whole-MoE replay repeats the EP all-to-alls, moe_act does not.
  const Prediction act = dsv3().predict(with_modules({models::RecomputeModule::kMoeAct}));
  const Prediction moe = dsv3().predict(with_modules({models::RecomputeModule::kMoe}));
  CHECK(moe.breakdown.ep_comm_s > act.breakdown.ep_comm_s);
  CHECK(moe.breakdown.compute_recompute_s > act.breakdown.compute_recompute_s);
}

TEST_CASE("layernorm and moe_act pay a copy back into the storage the forward freed; ordinary checkpoints do not",
          "[recompute_modules][time]") {
  // CheckpointWithoutOutput frees the module's output in the forward and copies the
  // recomputed one back into it (megatron/core/tensor_parallel/random.py _recompute).
  Calibration off = dsv3().calibration();
  REQUIRE(off.recompute_restores_output);  // megatron-bridge-2025 says it does
  off.recompute_restores_output = false;
  const Predictor p_off(models::build_layer_graph(models::load_model(src("tests/validation/models/deepseek-v3.json"))),
                        topologies::load_cluster(src("topologies/zoo/gb200-nvl72.json"), 4), off);
  using models::RecomputeModule;
  const auto rec = [](const Predictor& p, RecomputeModule m) {
    return p.predict(with_modules({m})).breakdown.compute_recompute_s;
  };
  // moe_act replays the activation: reads the fc1 output (2 x 2048 per routed row) and
  // writes 2048; the copy reads and writes those 2048 again, 2/3 of the replay's bytes
  // at the same elementwise bandwidth (each kernel's launch aside).
  const double act_on = rec(dsv3(), RecomputeModule::kMoeAct), act_off = rec(p_off, RecomputeModule::kMoeAct);
  CHECK(act_on > act_off);
  CHECK((act_on - act_off) / act_off == Approx(2.0 / 3.0).epsilon(0.1));
  // layernorm: a norm replay reads and writes 7168 per token at the norm bandwidth; the
  // copy reads and writes the same 7168 at the elementwise one (0.6 / 0.7 of its time).
  const double ln_on = rec(dsv3(), RecomputeModule::kLayernorm), ln_off = rec(p_off, RecomputeModule::kLayernorm);
  CHECK((ln_on - ln_off) / ln_off == Approx(0.6 / 0.7).epsilon(0.1));
  // moe and core_attn are ordinary checkpoints: the recomputed outputs are used in place.
  CHECK(rec(dsv3(), RecomputeModule::kMoe) == Approx(rec(p_off, RecomputeModule::kMoe)));
  CHECK(rec(dsv3(), RecomputeModule::kCoreAttn) == Approx(rec(p_off, RecomputeModule::kCoreAttn)));
}

TEST_CASE("recompute_modules in a layout: parsed, checked, written back", "[layout][recompute_modules]") {
  nlohmann::json j = layout_to_json(with_modules({models::RecomputeModule::kMlaUpProj, models::RecomputeModule::kMoeAct}));
  CHECK(j.at("recompute_modules") == nlohmann::json::array({"mla_up_proj", "moe_act"}));
  const Layout back = parse_layout(j, "t.json");
  CHECK(back.recompute_modules == with_modules({models::RecomputeModule::kMlaUpProj, models::RecomputeModule::kMoeAct}).recompute_modules);
  CHECK(describe(back).find("recompute selective (mla_up_proj, moe_act)") != std::string::npos);
  CHECK_FALSE(layout_to_json(dsv3_layout()).contains("recompute_modules"));
  // Modules are what selective recompute replays (Megatron-Core's recompute_granularity).
  j["recompute"] = "none";
  CHECK_THROWS_AS(parse_layout(j, "t.json"), UserError);
  j["recompute"] = "selective";
  j["recompute_modules"] = {"attention"};
  CHECK_THROWS_AS(parse_layout(j, "t.json"), UserError);
}

TEST_CASE("only a stack that has module recompute runs it", "[stack][recompute_modules]") {
  const Layout l = with_modules({models::RecomputeModule::kMlaUpProj});
  CHECK(stack_runs(l, bridge()));
  const auto refuses_modules = [&](const Stack& s) {
    for (const LayoutIssue& i : check_stack(l, s)) {
      if (i.detail.find("module recompute of mla_up_proj") != std::string::npos) return true;
    }
    return false;
  };
  CHECK_FALSE(refuses_modules(bridge()));
  CHECK(refuses_modules(load_stack(stack_path("marin-july-2026"))));
}

TEST_CASE("Megatron-Core's distributed optimizer shards over data x context-parallel ranks", "[memory]") {
  // megatron/core/optimizer/__init__.py builds it on intra_dp_cp_group: CP ranks
  // hold the same parameters, so the fp32 master and Adam states split over them too.
  Layout l = dsv3_layout();
  const MemoryBreakdown cp1 = mem(l);
  l.cp = 2;
  const MemoryBreakdown cp2 = mem(l);
  CHECK(cp2.master_weights == Approx(cp1.master_weights / 2));
  CHECK(cp2.optimizer_states == Approx(cp1.optimizer_states / 2));
  CHECK(cp2.gradients == Approx(cp1.gradients));  // ZeRO-1: whole bf16 gradient buffer
  // A trainer that shards over the fsdp ranks only (the default calibration) does not.
  CHECK(default_calibration().zero_shards_over_cp == 0.0);
  CHECK(mem(l, default_calibration()).master_weights == Approx(mem(dsv3_layout(), default_calibration()).master_weights));
}

TEST_CASE("FP8 parameters: one byte per FP8 GEMM weight where FP8 GEMMs take any layout", "[memory][fp8_params]") {
  // Transformer Engine keeps an FP8 transpose of an FP8 weight only where FP8 GEMMs
  // need the TN layout (Hopper): on Blackwell (GB200) the FP8 weights are 1 byte.
  Layout l = dsv3_layout();
  l.fp8 = Fp8Gemms::kLinear;
  const MemoryBreakdown bf16 = mem(l);
  l.fp8_params = true;
  const MemoryBreakdown fp8 = mem(l);
  const Predictor& p = dsv3();
  const LayoutShape s = layout_shape(p.table(), p.cluster(), l, p.calibration());
  // Every block parameter (attention, dense and shared MLPs, router, norms) and the local experts.
  CHECK(bf16.working_weights - fp8.working_weights == Approx(s.dense_stage_params + s.expert_stage_params / 64.0));
  CHECK(fp8.master_weights == Approx(bf16.master_weights));
  CHECK(fp8.gradients == Approx(bf16.gradients));
  // Not on a GPU the calibration does not list (H100: data + transpose, 2 bytes).
  Calibration hopper = p.calibration();
  hopper.fp8_non_tn_gpus = {"H100-SXM"};
  CHECK(mem(l, hopper).working_weights == Approx(bf16.working_weights));
  // The layout says it only with FP8 GEMMs; JSON round-trips it.
  nlohmann::json j = layout_to_json(l);
  CHECK(j.at("fp8_params") == true);
  CHECK(parse_layout(j, "t.json").fp8_params);
  j["fp8"] = "none";
  CHECK_THROWS_AS(parse_layout(j, "t.json"), UserError);
  CHECK(stack_runs(l, bridge()));
  CHECK_FALSE(stack_runs(l, load_stack(stack_path("marin-july-2026"))));
}

TEST_CASE("embedding and loss as pipeline layers: the heaviest rank and its in-flight layers", "[memory][pipeline]") {
  // DeepSeek-V3's 61 layers + embedding + loss = 63 slots over pp 4 x v 4 chunks:
  // 4 layers a chunk, the first chunk 3 + the embedding. Megatron-Core's interleaved
  // warm-up: rank 0 peaks at 2(4-1) + 3x4 + 1 = 19 chunks, 7 of them on its 3-layer
  // chunk: 7x3 + 12x4 = 69 layer micro-batches; rank 1 at 17 chunks x 4 = 68. Without
  // the split rule: 16 layers x (4 + 3/4) = 76.
  Layout l = dsv3_layout();
  const MemoryBreakdown plain = mem(l);
  l.edges_in_pipeline_split = true;
  const MemoryBreakdown split = mem(l);
  const Predictor& p = dsv3();
  const LayoutShape s = layout_shape(p.table(), p.cluster(), l, p.calibration());
  CHECK(s.layers_per_stage == 16.0);
  CHECK(s.in_flight * s.layers_per_stage == Approx(69.0));
  CHECK(split.activations / plain.activations == Approx(69.0 / 76.0));
  CHECK(s.edge_params == 0.0);  // a middle stage (16 MoE layers) outweighs the embedding stage
  // 1F1B (v = 1): 16 layers a stage; rank 0 holds 4 x 15, rank 1 3 x 16.
  l.pp_virtual = 1;
  l.schedule = PpSchedule::k1F1B;
  const LayoutShape s1 = layout_shape(p.table(), p.cluster(), l, p.calibration());
  CHECK(s1.in_flight * s1.layers_per_stage == Approx(60.0));
  // It needs a pipeline; only a stack that splits this way runs it.
  nlohmann::json j = layout_to_json(l);
  CHECK(j.at("edges_in_pipeline_split") == true);
  j["pp"] = 1;
  CHECK_THROWS_AS(parse_layout(j, "t.json"), UserError);
  CHECK(stack_runs(l, bridge()));
}
