// CUDA graphs of an eager trainer (Layout::cuda_graphs, issue 13): the captured scopes of a
// layer cost the host one graph replay per pass instead of their framework calls; the
// dropless dispatcher's host sync stays outside every graph; full_iteration leaves no host
// issue. Also the layout field's rules (Megatron-Core's) and which stacks run it.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "sim/base/value_error.h"
#include "sim/predict.h"
#include "sim/stack.h"

using namespace rackstep;
using namespace rackstep::sim;
using Catch::Matchers::Contains;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

const Calibration& bridge_cal() {
  static const Calibration cal = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  return cal;
}

// Qwen3-30B-A3B, EP 8 over one 8-GPU domain, dropless all-to-all, no recompute.
struct Qwen30b {
  models::LayerGraph g = models::build_layer_graph(models::load_model(src("tests/validation/models/qwen3-30b-a3b.json")));

  Layout layout(int64_t gpus, int64_t micro_batch_seqs, uint32_t graphs) const {
    Layout l;
    l.data = gpus;
    l.fsdp = gpus;
    l.zero_stage = 1;
    l.ep = gpus;
    l.ep_transport = Transport::ragged;
    l.micro_batch_seqs = micro_batch_seqs;
    l.tokens_per_step = 512 * 4096;
    l.recompute = models::Recompute::kNone;
    l.cuda_graphs = graphs;
    return l;
  }
};

constexpr uint32_t kRouter = cuda_graph_bit(CudaGraphScope::kMoeRouter) | cuda_graph_bit(CudaGraphScope::kMoePreprocess);
constexpr uint32_t kAttnRouter = kRouter | cuda_graph_bit(CudaGraphScope::kAttn);

Layout parse(const std::string& json) { return parse_layout(nlohmann::json::parse(json), "layout.json"); }

}  // namespace

TEST_CASE("cuda_graphs reads and writes back, and a layout without it stays eager", "[cuda_graphs]") {
  const Layout l = parse(R"({"data": 8, "ep": 8, "recompute": "none", "cuda_graphs": ["moe_preprocess", "attn", "moe_router"]})");
  CHECK(l.cuda_graphs == kAttnRouter);
  const Layout back = parse_layout(layout_to_json(l), "back.json");
  CHECK(back.cuda_graphs == l.cuda_graphs);
  CHECK(layout_to_json(l)["cuda_graphs"] == nlohmann::json({"attn", "moe_router", "moe_preprocess"}));
  CHECK_THAT(describe(l), Contains("graphs attn, moe_router, moe_preprocess"));
  const Layout eager = parse(R"({"data": 8})");
  CHECK(eager.cuda_graphs == 0);
  CHECK_FALSE(layout_to_json(eager).contains("cuda_graphs"));
}

TEST_CASE("cuda_graphs follows Megatron-Core's rules: one line naming /cuda_graphs", "[cuda_graphs]") {
  const auto fails = [](const std::string& json, const std::string& why) {
    CHECK_THROWS_WITH(parse(json), Contains("layout.json") && Contains("/cuda_graphs") && Contains(why));
  };
  fails(R"({"recompute": "none", "cuda_graphs": ["attention"]})", "scope names");
  fails(R"({"recompute": "none", "cuda_graphs": ["moe_preprocess"]})", "together with moe_router");
  fails(R"({"recompute": "none", "cuda_graphs": ["moe", "moe_router"]})", "not both");
  fails(R"({"recompute": "none", "cuda_graphs": ["full_iteration", "attn"]})", "full_iteration alone");
  // Layer graphs cannot replay a full recompute (recompute "full" is the layout default).
  fails(R"({"cuda_graphs": ["attn"]})", "full recompute only with full_iteration");
  CHECK(parse(R"({"cuda_graphs": ["full_iteration"]})").graphs(CudaGraphScope::kFullIteration));
}

TEST_CASE("A dropless MoE cannot sit inside a graph; the stack says which scopes it captures", "[cuda_graphs]") {
  const Qwen30b m;
  const topologies::Cluster eight = topologies::make_cluster(topologies::load_system(src("topologies/zoo/gb200-nvl72.json")), 1, 8);
  const Layout l = m.layout(8, 4, cuda_graph_bit(CudaGraphScope::kFullIteration));
  const auto issues = check_layout(l, m.g, eight);
  bool says_sync = false;
  for (const LayoutIssue& i : issues) says_sync = says_sync || i.detail.find("syncs the host") != std::string::npos;
  CHECK(says_sync);

  const Stack bridge = load_stack(stack_path("megatron-bridge-2025"));
  CHECK(check_stack(m.layout(8, 4, kAttnRouter), bridge).empty());
  const Stack marin = load_stack(stack_path("marin-july-2026"));
  int graph_refusals = 0;
  for (const LayoutIssue& i : check_stack(m.layout(8, 4, kRouter), marin)) {
    graph_refusals += i.detail.find("CUDA graphs of moe_router") != std::string::npos ||
                      i.detail.find("CUDA graphs of moe_preprocess") != std::string::npos;
  }
  CHECK(graph_refusals == 2);
}

TEST_CASE("Graphed scopes cost the host one replay instead of their calls; the sync stays", "[cuda_graphs]") {
  const Qwen30b m;
  const topologies::Cluster c = topologies::make_cluster(topologies::load_system(src("topologies/zoo/gb200-nvl72.json")), 1, 8);
  const Predictor pred(m.g, c, bridge_cal());
  const Prediction eager = pred.predict(m.layout(8, 1, 0));
  const Prediction router = pred.predict(m.layout(8, 1, kRouter));
  const Prediction attn_router = pred.predict(m.layout(8, 1, kAttnRouter));
  REQUIRE((eager.valid && router.valid && attn_router.valid));
  // On a Grace host at micro-batch 1 the eager layer is host-bound behind its sync
  // (at 4 the router's graph alone already brings the host under the device).
  REQUIRE(eager.breakdown.host_issue_s > 0.0);
  CHECK(router.breakdown.host_issue_s < eager.breakdown.host_issue_s);
  CHECK(attn_router.breakdown.host_issue_s < router.breakdown.host_issue_s);
  // The device work is the same: only the host's issue moved.
  CHECK(router.breakdown.compute_fwd_s == Approx(eager.breakdown.compute_fwd_s).epsilon(1e-12));
  CHECK(router.breakdown.ep_comm_s == Approx(eager.breakdown.ep_comm_s).epsilon(1e-12));
  // The experts, the dispatch's sync and all-to-alls stay eager: a host slower by far
  // than the device still paces every MoE layer, graphs or not.
  Calibration slow = bridge_cal();
  slow.op_issue_s_by_gpu.clear();
  slow.op_issue_s = 1e-3;
  const Prediction slow_graphs = Predictor(m.g, c, slow).predict(m.layout(8, 4, kAttnRouter));
  CHECK(slow_graphs.breakdown.host_issue_s > 0.5 * slow_graphs.step_time_s);
}

TEST_CASE("full_iteration graphs leave no host issue", "[cuda_graphs]") {
  const models::LayerGraph g = models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json")));
  const topologies::Cluster c = topologies::load_cluster(src("topologies/zoo/dgx-b200.json"), 1);
  Layout l;
  l.data = 8;
  l.fsdp = 8;
  l.zero_stage = 1;
  l.micro_batch_seqs = 1;
  l.tokens_per_step = 128 * 8192;
  l.recompute = models::Recompute::kNone;
  // A host so slow that even the sync-free dense step is paced by it when eager.
  Calibration slow = bridge_cal();
  slow.op_issue_s_by_gpu.clear();
  slow.op_issue_s = 5e-3;
  const Prediction eager = Predictor(g, c, slow).predict(l);
  l.cuda_graphs = cuda_graph_bit(CudaGraphScope::kFullIteration);
  const Prediction graphed = Predictor(g, c, slow).predict(l);
  REQUIRE((eager.valid && graphed.valid));
  CHECK(eager.breakdown.host_issue_s > 0.0);
  CHECK(graphed.breakdown.host_issue_s == 0.0);
}

// Megatron-Bridge PR #3868 (2026-05-18, docs/training/cuda-graphs.md): Qwen3-30B-A3B, BF16,
// two 8-GPU H100 nodes, EP 16, MBS 1, GBS 1024, all-to-all dispatcher: eager 41.36 s per step,
// TE-scoped attn + moe_router + moe_preprocess graphs 42.00 s. The x86 host is not what bounds
// that run, so the graphs must not make the prediction faster by more than that noise.
TEST_CASE("Graphs on an x86 host that is not the bottleneck change little (Megatron-Bridge PR #3868)", "[cuda_graphs]") {
  const Qwen30b m;
  const topologies::Cluster c = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 2);
  Layout l = m.layout(16, 1, 0);
  l.tokens_per_step = 1024 * 4096;
  const Predictor pred(m.g, c, bridge_cal());
  const Prediction eager = pred.predict(l);
  l.cuda_graphs = kAttnRouter;
  const Prediction graphed = pred.predict(l);
  REQUIRE((eager.valid && graphed.valid));
  CHECK(graphed.step_time_s <= eager.step_time_s);
  CHECK(graphed.step_time_s > 0.97 * eager.step_time_s);
}

TEST_CASE("The preprocess graph's calls are part of the dispatch op's: more is one line naming the field", "[cuda_graphs]") {
  nlohmann::json doc = load_json_file(default_calibration_path());
  doc["host"]["calls_per_op"] = {{"dispatch", {{"value", 16}, {"source", "[A] test"}}}};
  doc["host"]["moe_preprocess_calls"] = {{"value", 17}, {"source", "[A] test"}};
  CHECK_THROWS_WITH(parse_calibration(doc, "cal.json"),
                    Contains("cal.json") && Contains("/host/moe_preprocess_calls") && Contains("at most"));
  doc["host"]["moe_preprocess_calls"]["value"] = 8;
  CHECK(parse_calibration(doc, "cal.json").moe_preprocess_calls == 8);
}

TEST_CASE("The timeline's per-op host issue is what predict charges under the layout's graphs", "[cuda_graphs]") {
  const Qwen30b m;
  const topologies::Cluster c = topologies::make_cluster(topologies::load_system(src("topologies/zoo/gb200-nvl72.json")), 1, 8);
  const Predictor pred(m.g, c, bridge_cal());
  // Per-layer forward host time of layer 0 as price() hands it to the timeline.
  const auto layer0_host = [&](uint32_t graphs) {
    double fwd = 0, bwd = 0;
    for (const OpTiming& o : pred.price(m.layout(8, 1, graphs)).ops) {
      if (o.layer != 0) continue;
      fwd += o.fwd_host_s;
      bwd += o.bwd_host_s;
    }
    return std::pair{fwd, bwd};
  };
  const auto [eager_f, eager_b] = layer0_host(0);
  const auto [graph_f, graph_b] = layer0_host(kAttnRouter);
  REQUIRE(eager_f > 0.0);
  CHECK(eager_b == Approx(2.0 * eager_f).epsilon(1e-12));
  // The captured attention and router cost one replay: less host time per pass, the
  // eager experts and dispatch still issued op by op.
  CHECK(graph_f < 0.9 * eager_f);  // most of it is the 16 local experts' eager calls
  CHECK(graph_f > 0.0);
  CHECK(graph_b < graph_f * 2.0);
  // A full-iteration graph issues nothing, the embedding and the head included.
  const models::LayerGraph g = models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json")));
  Layout dense = m.layout(8, 1, 0);
  dense.ep = 1;
  dense.cuda_graphs = cuda_graph_bit(CudaGraphScope::kFullIteration);
  const StepPrice full = Predictor(g, c, bridge_cal()).price(dense);
  REQUIRE(!full.ops.empty());
  for (const OpTiming& o : full.ops) CHECK((o.fwd_host_s == 0.0 && o.bwd_host_s == 0.0));
}
