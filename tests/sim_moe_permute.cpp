// Megatron-Core's all-to-all dispatcher with moe_permute_fusion off (Layout::moe_permute_fusion,
// issue 13): the permute before the dispatch's all-to-all runs as an argsort and an
// index_select, the unpermute after the combine's as an atomic scatter_add into a zeroed
// buffer (megatron/core/transformer/moe/moe_utils.py, fused=False), and the dispatcher's
// chunk sorts as torch.split / torch.cat: more device passes, more host calls. The default
// (true) keeps the fused pricing.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "sim/predict.h"
#include "sim/stack.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;
using Catch::Matchers::Contains;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

Layout parse(const std::string& json) { return parse_layout(nlohmann::json::parse(json), "layout.json"); }

const Calibration& bridge_cal() {
  static const Calibration cal = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  return cal;
}

// Qwen3-30B-A3B (d_model 2048, 128 experts, top-8) on an H100: one micro-batch of 4096
// tokens, 32,768 routed rows, 8 local experts (EP 16).
struct Qwen30b {
  OpTable t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/qwen3-30b-a3b.json"))));
  topologies::SystemSpec sys = topologies::load_system(src("topologies/zoo/hgx-h100.json"));

  PriceContext ctx(bool unfused) const {
    PriceContext c = device_price_context(sys.gpu, bridge_cal());
    c.tokens = 4096;
    c.seq = 4096;
    c.expert_rows = 4096.0 * 8.0;
    c.local_experts = 8;
    c.moe_sort_rows = true;
    c.op_issue_s = 18.6e-6;
    c.moe_permute_unfused = unfused;
    c.experts = 128;
    return c;
  }
};

}  // namespace

TEST_CASE("moe_permute_fusion defaults to the fused kernels, reads false and writes it back", "[moe_permute]") {
  const Layout fused = parse(R"({"data": 16, "ep": 16})");
  CHECK(fused.moe_permute_fusion);
  CHECK_FALSE(layout_to_json(fused).contains("moe_permute_fusion"));
  const Layout unfused = parse(R"({"data": 16, "ep": 16, "moe_permute_fusion": false})");
  CHECK_FALSE(unfused.moe_permute_fusion);
  CHECK(layout_to_json(unfused)["moe_permute_fusion"] == false);
  CHECK_FALSE(parse_layout(layout_to_json(unfused), "back.json").moe_permute_fusion);
}

TEST_CASE("moe_permute_fusion: a bad value or another dispatcher is one line naming the field", "[moe_permute]") {
  CHECK_THROWS_WITH(parse(R"({"data": 16, "ep": 16, "moe_permute_fusion": "no"})"),
                    Contains("layout.json") && Contains("/moe_permute_fusion"));
  CHECK_THROWS_WITH(parse(R"({"data": 16, "ep": 16, "ep_dispatcher": "flex", "moe_permute_fusion": false})"),
                    Contains("layout.json") && Contains("/moe_permute_fusion") && Contains("all_to_all"));
  CHECK_THROWS_WITH(parse(R"({"data": 16, "ep": 16, "ep_transport": "pooled", "moe_permute_fusion": false})"),
                    Contains("/moe_permute_fusion") && Contains("ragged"));
}

TEST_CASE("The unfused unpermute is a zeroed buffer and an atomic scatter_add at the routing rate", "[moe_permute]") {
  const Qwen30b m;
  const PriceContext fused = m.ctx(false), unfused = m.ctx(true);
  const Calibration& cal = bridge_cal();
  const double bw = unfused.hbm_bw_bytes_per_s, launch = cal.launch_overhead_s;
  const double tokens_b = 4096.0 * 2048.0 * 2.0, rows_b = 8.0 * tokens_b, index_b = 4096.0 * 8.0 * 8.0;
  const OpEntry& combine = find_op(m.t, models::OpKind::kCombine);
  const OpTime a = price_op(combine, fused), b = price_op(combine, unfused);
  // The chunk sort before the combine's all-to-all moves the same bytes fused or not.
  const double sort_s = 2.0 * rows_b / (bw * cal.mem_eff_elementwise) + launch;
  CHECK(b.fwd_s - sort_s ==
        Approx(tokens_b / (bw * cal.mem_eff_elementwise) + (rows_b + index_b + tokens_b) / (bw * cal.mem_eff_routing) + 2.0 * launch)
            .epsilon(1e-9));
  // Its backward is a dense gather of the rows from the output gradient.
  CHECK(b.bwd_s - sort_s == Approx((tokens_b + index_b + rows_b) / (bw * cal.mem_eff_elementwise) + launch).epsilon(1e-9));
  CHECK(b.fwd_s > a.fwd_s);
  // The permute before the dispatch's all-to-all: an index_select (the fused kernel's
  // bytes) plus the routing map's argsort and the probs' gather: slower, never faster.
  const OpEntry& dispatch = find_op(m.t, models::OpKind::kDispatch);
  CHECK(price_op(dispatch, unfused).fwd_s > price_op(dispatch, fused).fwd_s);
  // Other ops do not see it.
  const OpEntry& ex = find_op(m.t, models::OpKind::kExpertMlp);
  CHECK(price_op(ex, unfused).fwd_s == price_op(ex, fused).fwd_s);
}

TEST_CASE("The unfused permute's host calls: the permute's inside the preprocess graph, the chunk sorts' eager", "[moe_permute]") {
  const Qwen30b m;
  const Calibration& cal = bridge_cal();
  const PriceContext fused = m.ctx(false), unfused = m.ctx(true);
  const double permute_calls = cal.host_unfused_permute_calls.at("dispatch");
  const double sort_calls = cal.host_unfused_sort_chunks_calls.at("dispatch");
  REQUIRE((permute_calls > 0 && sort_calls > 0));
  const OpEntry& dispatch = find_op(m.t, models::OpKind::kDispatch);
  // 6 kernels in place of the fused permute's one.
  CHECK(op_host_issue_s(dispatch, unfused) - op_host_issue_s(dispatch, fused) ==
        Approx((permute_calls + sort_calls) * 18.6e-6 + 5.0 * cal.launch_overhead_s).epsilon(1e-9));
  // With one local expert nothing is sorted: only the permute's calls remain.
  PriceContext one = unfused;
  one.moe_sort_rows = false;
  PriceContext one_fused = fused;
  one_fused.moe_sort_rows = false;
  CHECK(op_host_issue_s(dispatch, one) - op_host_issue_s(dispatch, one_fused) ==
        Approx(permute_calls * 18.6e-6 + 5.0 * cal.launch_overhead_s).epsilon(1e-9));
  // The moe_preprocess graph captures the permute (it runs before the sync), not the sorts.
  const LayerClass* moe = nullptr;
  for (const LayerClass& c : m.t.classes) {
    if (c.moe) moe = &c;
  }
  REQUIRE(moe != nullptr);
  const LayerClass& lc = *moe;
  const uint32_t graphs = cuda_graph_bit(CudaGraphScope::kMoeRouter) | cuda_graph_bit(CudaGraphScope::kMoePreprocess);
  size_t j = 0;
  while (lc.ops[j].kind != models::OpKind::kDispatch) ++j;
  const LayerHostIssue eager_f = layer_host_issue(lc, fused, graphs), eager_u = layer_host_issue(lc, unfused, graphs);
  CHECK(eager_u.op_fwd_s[j] - eager_f.op_fwd_s[j] == Approx(sort_calls * 18.6e-6).epsilon(1e-9));
}

// The validation rows' shape (Qwen3-30B-A3B, 16 H100, EP 16, all-to-all, MBS 1, GBS 1024):
// the unfused permute makes the step slower under the Megatron-Bridge stack.
TEST_CASE("A step with the unfused permute is slower than with the fused one", "[moe_permute]") {
  const models::LayerGraph g = models::build_layer_graph(models::load_model(src("tests/validation/models/qwen3-30b-a3b.json")));
  const topologies::Cluster c = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 2);
  Layout l = parse(R"({"data": 16, "fsdp": 16, "zero_stage": 1, "ep": 16, "micro_batch_seqs": 1,
                       "tokens_per_step": 4194304, "recompute": "none"})");
  const Predictor pred(g, c, bridge_cal());
  const Prediction fused = pred.predict(l);
  l.moe_permute_fusion = false;
  const Prediction unfused = pred.predict(l);
  REQUIRE((fused.valid && unfused.valid));
  CHECK(unfused.breakdown.compute_fwd_s > fused.breakdown.compute_fwd_s);
  CHECK(unfused.step_time_s > fused.step_time_s);
  // The all-to-alls are the same: the sync and the rows sent do not change.
  CHECK(unfused.breakdown.ep_comm_s == Approx(fused.breakdown.ep_comm_s).epsilon(1e-12));
}
