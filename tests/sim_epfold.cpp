// MoE parallel folding (sim/layout.h: etp, ep over tp x cp x data ranks): the
// layout rule, which stacks run it, where its EP groups sit, how it shards the
// experts and prices their GEMMs, and that an unfolded layout prices as before.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/check.h"
#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "sim/memory.h"
#include "sim/predict.h"
#include "sim/stack.h"
#include "tests/sim_qwen235b_h100.h"
#include "sim/sweep.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

using testing::qwen235b_folded;
using testing::qwen235b_h100;

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

bool has_reason(const std::vector<LayoutIssue>& v, Reason r) {
  for (const auto& i : v) {
    if (i.reason == r) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("folding: ep x etp must tile the tp x cp x data GPUs of a stage", "[epfold]") {
  const Predictor& p = qwen235b_h100();
  Layout l = qwen235b_folded();
  CHECK(l.folded());
  CHECK(l.expert_tp() == 1);
  CHECK(l.expert_dp() == 1);  // 2 x 16 GPUs = 32 EP ranks x 1 expert TP
  CHECK(l.ep_stride() == 1);  // Megatron's expert mesh: etp innermost, then ep
  CHECK(check_layout(l, p.graph(), p.cluster()).empty());

  // Megatron's default etp is tp: then ep 32 x etp 2 = 64 GPUs per stage, but a stage has 32.
  l.etp = 0;
  CHECK(l.expert_tp() == 2);
  const auto why = check_layout(l, p.graph(), p.cluster());
  REQUIRE(has_reason(why, Reason::kEpDivides));
  const std::string want = "ep×etp = 32×2 = 64 does not divide tp×cp×data = 2×1×16 = 32";
  CHECK(why.front().detail.find(want) != std::string::npos);

  // An unfolded layout: etp = tp and ep dividing data, EP over data ranks as before.
  l.ep = 16;
  CHECK_FALSE(l.folded());
  CHECK(l.ep_stride() == 2);
  CHECK(check_layout(l, p.graph(), p.cluster()).empty());

  // etp must split the expert width (1536) evenly.
  l = qwen235b_folded();
  l.ep = 8;
  l.etp = 4;  // 8 x 4 = 32 GPUs: tiles the stage
  CHECK(check_layout(l, p.graph(), p.cluster()).empty());
  l.ep = 4;
  l.etp = 8;
  CHECK(check_layout(l, p.graph(), p.cluster()).empty());
  l = qwen235b_folded();
  l.etp = 2;
  l.ep = 16;
  l.tp = 1;
  l.data = 32;
  l.fsdp = 32;
  CHECK(l.folded());  // etp 2 with tp 1
  CHECK(check_layout(l, p.graph(), p.cluster()).empty());
}

TEST_CASE("folding: a layout file that breaks the rule is one user error naming /ep", "[epfold]") {
  nlohmann::json j = layout_to_json(qwen235b_folded());
  CHECK(j["etp"] == 1);
  CHECK(layout_to_json(parse_layout(j, "folded.json")) == j);  // round trip
  j["ep"] = 64;  // 64 x 1 > 2 x 16
  try {
    parse_layout(j, "folded.json");
    FAIL("parse_layout accepted ep 64 x etp 1 on 32 GPUs per stage");
  } catch (const UserError& e) {
    const std::string what = e.what();
    CHECK(what.find("folded.json") != std::string::npos);
    CHECK(what.find("/ep") != std::string::npos);
    CHECK(what.find("ep × etp = 64 × 1 = 64") != std::string::npos);
    CHECK(what.find('\n') == std::string::npos);
  }
  // A layout without etp is written without it (etp 0 = tp).
  CHECK_FALSE(layout_to_json(load_layout(src("sim/layouts/hero-ragged.json"))).contains("etp"));
}

TEST_CASE("folding: only stacks that say so run it", "[epfold]") {
  const Layout l = qwen235b_folded();
  CHECK(stack_runs(l, load_stack(stack_path("megatron-bridge-2025"))));
  CHECK(stack_runs(l, load_stack(stack_path("megatron-lm"))));
  const auto mentions_folding = [](const std::vector<LayoutIssue>& v) {
    for (const auto& i : v) {
      const bool folding = i.detail.find("folded over tensor and data ranks") != std::string::npos;
      if (i.reason == Reason::kStack && folding) return true;
    }
    return false;
  };
  const Stack marin = load_stack(stack_path("marin-july-2026"));
  CHECK(mentions_folding(check_stack(l, marin)));
  // An unfolded EP layout is not refused for folding (marin may refuse its other features).
  Layout u = l;
  u.etp = 0;
  u.ep = 16;
  CHECK_FALSE(mentions_folding(check_stack(u, marin)));
}

TEST_CASE("folding: the EP group spans TP ranks, and nodes when it outgrows one", "[epfold]") {
  const Predictor& p = qwen235b_h100();
  const auto moe_layer = [&](const Layout& l) {
    const StepPrice sp = p.price(l);  // collectives are priced whether or not the layout fits
    REQUIRE_FALSE(sp.collectives.empty());
    return sp.collectives.front();  // every Qwen3 layer is MoE
  };
  // EP 32 at stride 1: 32 consecutive GPUs = 4 nodes of 8; 24 of each GPU's 31 peers are off-node.
  const LayerCollectives wide = moe_layer(qwen235b_folded());
  REQUIRE(wide.ep_dispatch.nic_bytes > 0);
  CHECK(wide.ep_dispatch.nic_bytes / (wide.ep_dispatch.nic_bytes + wide.ep_dispatch.nvlink_bytes) ==
        Approx(24.0 / 31.0).epsilon(0.02));
  // EP 4 x ETP 8 at stride 8: 4 ranks, one per node -- the all-to-all is all off-node; NVLink
  // carries only the gather over the 8 expert-TP GPUs of a node (7/8 of the gathered rows).
  Layout l = qwen235b_folded();
  l.ep = 4;
  l.etp = 8;
  const LayerCollectives strided = moe_layer(l);
  const double gathered = layout_shape(p.table(), p.cluster(), l, p.calibration()).expert_rows_mb * 4096 * 2.0;
  CHECK(strided.ep_dispatch.nvlink_bytes == Approx(7.0 / 8.0 * gathered));
  CHECK(strided.ep_dispatch.nic_bytes == Approx(3.0 / 4.0 * gathered / 8.0));
  // EP 4 x ETP 2 (x expert-DP 4): 4 ranks at stride 2 inside one node.
  l.ep = 4;
  l.etp = 2;
  const LayerCollectives node = moe_layer(l);
  CHECK(node.ep_dispatch.nic_bytes == 0);
  CHECK(node.ep_dispatch.nvlink_bytes > 0);
}

TEST_CASE("folding: token rows, expert shards and expert state follow ep x etp", "[epfold]") {
  const Predictor& p = qwen235b_h100();
  const Layout folded = qwen235b_folded();  // EP 32, ETP 1
  Layout unfolded = folded;               // EP 16, ETP = TP 2: the same 32 GPUs per expert set
  unfolded.ep = 16;
  unfolded.etp = 0;
  const LayoutShape f = layout_shape(p.table(), p.cluster(), folded, p.calibration());
  const LayoutShape u = layout_shape(p.table(), p.cluster(), unfolded, p.calibration());
  // Sequence parallel: each TP rank holds 1/tp of the micro-batch; ETP 1 dispatches just that share.
  CHECK(f.tokens_mb == 4096.0);
  CHECK(f.ep_tokens_mb == 2048.0);
  CHECK(f.expert_rows_mb == 2048.0 * 8);
  CHECK(u.ep_tokens_mb == 4096.0);  // the TP pair computes all of its rows at half width
  CHECK(f.local_experts == 4.0);
  CHECK(u.local_experts == 8.0);
  // Expert weights per GPU: 1/(ep x etp) of a stage's experts either way.
  CHECK(f.weights_whole_local == Approx(u.weights_whole_local));
  // Distributed optimizer: experts have expert-DP 1 here, so their state is not sharded further.
  CHECK(f.expert_zero == 1.0);
  CHECK(f.expert_shard == 32.0);
  // Memory: the same expert bytes, half the EP buffer rows per GPU (ETP 1 sends the SP share).
  const MemoryBreakdown mf = estimate_memory(p.table(), p.cluster(), folded, p.calibration(), f);
  const MemoryBreakdown mu = estimate_memory(p.table(), p.cluster(), unfolded, p.calibration(), u);
  CHECK(mf.ep_buffers == Approx(mu.ep_buffers / 2.0));
  CHECK(mf.master_weights == Approx(mu.master_weights));
}

TEST_CASE("folding: an expert GEMM does the same FLOPs as rows x etp/tp at width / etp", "[epfold]") {
  const Predictor& p = qwen235b_h100();
  const OpEntry* grouped = nullptr;
  for (const auto& lc : p.table().classes) {
    for (const auto& e : lc.ops) {
      if (e.cls == models::OpClass::kGroupedGemm) grouped = &e;
    }
  }
  REQUIRE(grouped != nullptr);
  PriceContext c;
  c.gpu = &p.cluster().system.gpu;
  c.cal = &p.calibration();
  c.tokens = 4096;
  c.seq = 4096;
  c.tp = 2;
  c.peak_flops_per_s = c.gpu->peak_bf16_flops_per_s;
  c.hbm_bw_bytes_per_s = c.gpu->hbm_bw_bytes_per_s;
  c.local_experts = 8;
  c.expert_rows = 4096.0 * 8;  // ETP = TP 2: all the pair's rows, half the width each
  const OpTime tp_split = price_op(*grouped, c);
  c.etp = 1;
  c.local_experts = 4;
  c.expert_rows = 2048.0 * 8;  // ETP 1: the SP share of the rows, whole experts
  const OpTime whole = price_op(*grouped, c);
  // The matrix FLOPs (hardware FLOPs less the per-row SwiGLU elementwise term) are conserved.
  const auto elementwise = [&](double rows) { return grouped->ew_flops_per_token / grouped->rows_per_token * rows; };
  CHECK(whole.fwd_flops - elementwise(2048.0 * 8) == Approx(tp_split.fwd_flops - elementwise(4096.0 * 8)));
  CHECK(whole.fwd_flops - elementwise(2048.0 * 8) ==
        Approx(2.0 * grouped->gemm_k * grouped->gemm_n * grouped->gemm_count * 2048.0 * 8));
}

TEST_CASE("folding: an unfolded layout prices the same with etp written as tp", "[epfold]") {
  const Predictor& p = qwen235b_h100();
  Layout l = qwen235b_folded();
  l.ep = 16;
  l.etp = 0;
  const Prediction a = p.predict(l);
  l.etp = 2;
  const Prediction b = p.predict(l);
  REQUIRE(a.valid);
  CHECK(a.step_time_s == b.step_time_s);
  CHECK(a.memory.device_total == b.memory.device_total);
  CHECK(a.drop_fraction == b.drop_fraction);
}

TEST_CASE("folding: the sweep tries etp 1 only under a stack that folds", "[epfold][sweep]") {
  const Predictor& p = testing::qwen235b_h100_8_nodes();
  const Stack folds = load_stack(stack_path("megatron-bridge-2025"));
  Stack no_folding = folds;
  no_folding.supports.expert_folding = false;
  const SweepResult with = testing::sweep_under(p, &folds, 50);
  const SweepResult without = testing::sweep_under(p, &no_folding, 50);
  CHECK(with.enumerated > without.enumerated);
  const auto any_folded = [](const SweepResult& r) {
    for (const auto& e : r.top) {
      if (e.layout.folded()) return true;
    }
    for (const auto& e : r.pareto) {
      if (e.layout.folded()) return true;
    }
    return false;
  };
  CHECK_FALSE(any_folded(without));
  INFO("valid with folding " << with.valid << ", without " << without.valid);
  CHECK(with.valid > without.valid);  // some folded layouts run and fit
}

TEST_CASE("folding: with etp > 1 each GPU sends its SP share, then gathers over the expert TP group", "[epfold]") {
  const Predictor& p = qwen235b_h100();
  Layout l = qwen235b_folded();
  l.tp = 4;  // 4 KV heads
  l.data = 8;
  l.fsdp = 8;
  l.ep = 16;
  l.etp = 2;  // 16 x 2 = 32 = 4 x 8: folded (etp 2 != tp 4)
  REQUIRE(check_layout(l, p.graph(), p.cluster()).empty());
  const LayoutShape s = layout_shape(p.table(), p.cluster(), l, p.calibration());
  CHECK(s.ep_tokens_mb == 4096.0 * 2 / 4);
  const double gathered = s.expert_rows_mb * 4096 * 2.0;  // bf16 rows of d_model the pair's experts compute
  const double sent = gathered / 2;                      // this GPU's 1/tp share of the micro-batch, x k
  const LayerCollectives c = p.price(l).collectives.front();
  // All-to-all over 16 ranks at stride 2 (4 per node, 4 nodes): 3/16 over NVLink, 12/16 over NICs;
  // the expert-TP all-gather of 2 consecutive GPUs: half the gathered buffer over NVLink.
  CHECK(c.ep_dispatch.nic_bytes == Approx(12.0 / 16.0 * sent));
  CHECK(c.ep_dispatch.nvlink_bytes == Approx(3.0 / 16.0 * sent + 0.5 * gathered));
  CHECK(c.ep_combine.nvlink_bytes == Approx(c.ep_dispatch.nvlink_bytes));
}
