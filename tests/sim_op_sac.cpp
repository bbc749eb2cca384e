// torchtitan's per-op selective activation checkpointing (Layout::torchtitan_op_sac, issue 13):
// it saves the outputs of aten.mm except every second one of a block, so its replay runs
// Llama's k, o and w3 GEMMs beside the elementwise ops, and, under TP, the sequence-parallel
// all-gathers; it keeps those outputs only (sim/memory.cpp).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "sim/base/check.h"
#include "sim/cost.h"
#include "sim/predict.h"
#include "tests/sim_llama8b.h"
#include "tests/sim_step_graph_case.h"

using namespace rackstep;
using namespace rackstep::sim;

TEST_CASE("torchtitan op SAC replays every second GEMM of a block: Llama's k, o and w3", "[recompute][op_sac]") {
  const Llama8b m("topologies/zoo/hgx-h100.json");  // an H100
  const Calibration& cal = default_calibration();
  const std::vector<OpEntry>& ops = m.t.classes.at(0).ops;
  // The block's GEMMs in forward order: q, k, v, o (linears), then the fused w1, w3, w2.
  std::vector<const OpEntry*> linears;
  const OpEntry* mlp = nullptr;
  for (const OpEntry& e : ops) {
    if (e.kind == models::OpKind::kLinear) linears.push_back(&e);
    if (e.kind == models::OpKind::kSharedMlp) mlp = &e;
  }
  REQUIRE(linears.size() == 4);
  REQUIRE(mlp != nullptr);
  REQUIRE(mlp->gemm_count == 3);

  PriceContext keep = m.ctx(cal);
  keep.fp8_recipe = Fp8Recipe::kCurrent;
  PriceContext sac = keep;
  sac.torchtitan_op_sac = true;
  const BlockTime k = price_ops(ops, keep), s = price_ops(ops, sac);
  // Forward and backward are the policy's business only through the replay.
  CHECK(s.fwd_s == k.fwd_s);
  CHECK(s.bwd_s == k.bwd_s);
  // The 2nd, 4th and 6th aten.mm: k, o and w3 (a third of the fused SwiGLU's forward).
  const double replayed_s = price_op(*linears[1], keep).fwd_s + price_op(*linears[3], keep).fwd_s + price_op(*mlp, keep).fwd_s / 3.0;
  CHECK(s.recompute_selective_s - k.recompute_selective_s == Approx(replayed_s).epsilon(1e-12));
  CHECK(s.recompute_selective_flops > k.recompute_selective_flops);

  // FP8 linears count the same: Float8Linear issues aten.mm on Float8Tensors, which the
  // policy sees before the subclass turns it into torch._scaled_mm.
  keep.fp8_linear = sac.fp8_linear = true;
  const BlockTime k8 = price_ops(ops, keep), s8 = price_ops(ops, sac);
  const double replayed8_s = price_op(*linears[1], keep).fwd_s + price_op(*linears[3], keep).fwd_s + price_op(*mlp, keep).fwd_s / 3.0;
  CHECK(replayed8_s < replayed_s);
  CHECK(s8.recompute_selective_s - k8.recompute_selective_s == Approx(replayed8_s).epsilon(1e-12));
}

TEST_CASE("torchtitan op SAC replays the TP all-gathers, and is a selective policy only", "[recompute][op_sac][tp]") {
  const test::Case c = test::llama8b_fsdp8_tp8(false);
  const Layout& l = c.layout;
  const Layout sac = test::llama8b_fsdp8_tp8(true).layout;
  const Predictor p(c.graph, c.cluster);
  const Prediction a = p.predict(l), b = p.predict(sac);
  REQUIRE(a.valid);
  REQUIRE(b.valid);
  CHECK(b.breakdown.compute_recompute_s > a.breakdown.compute_recompute_s);
  // Two all-gathers a layer (attention and MLP inputs) on top of the forward's and backward's
  // four collectives each: more TP time, less than half again as much.
  CHECK(b.breakdown.tp_comm_s > a.breakdown.tp_comm_s);
  CHECK(b.breakdown.tp_comm_s < 1.5 * a.breakdown.tp_comm_s);

  // Memory (TP 1): the block input and the outputs of q, v, SDPA (+ its fp32 logsumexp),
  // w1 and w2 of Llama 3 8B (d 4096, 32 heads, 8 KV heads of 128, SwiGLU 14336), against
  // what keeping every GEMM's saved tensors holds.
  Layout l1 = l, sac1 = sac;
  l1.tp = sac1.tp = 1;
  l1.data = l1.fsdp = sac1.data = sac1.fsdp = 64;
  l1.tokens_per_step = sac1.tokens_per_step = 64 * 2 * 8192;
  const OpTable table = build_op_table(p.graph());
  const double op_sac_elems = 4096 + 4096 + 1024 + (4096 + 2 * 32) + 14336 + 4096;
  const double keep_elems = table.classes.at(0).saved_gemm_elems_per_token;
  CHECK(p.predict(sac1).memory.activations / p.predict(l1).memory.activations == Approx(op_sac_elems / keep_elems).epsilon(1e-9));

  const nlohmann::json j = layout_to_json(sac);
  CHECK(j.at("selective_policy") == "torchtitan_op_sac");
  CHECK(parse_layout(j, "rt").torchtitan_op_sac);
  nlohmann::json full = j;
  full["recompute"] = "full";
  CHECK_THROWS_AS(parse_layout(full, "bad.json"), UserError);
}
