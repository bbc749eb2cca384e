// The layer graph carries the data flow: every op names the tensors it reads
// and writes, with symbolic shapes, and every read names an earlier write.
// exec derives its buffers from these declarations alone (exec/model.cpp plan()).
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "models/layer_graph.h"
#include "sim/base/source_dir.h"

using namespace rackstep::models;

namespace {

const Op& find_op(const LayerGraph& g, const std::string& name) {
  for (const Op& op : g.ops)
    if (op.name == name) return op;
  FAIL("no op " << name);
  return g.ops.front();
}

}  // namespace

TEST_CASE("every zoo model's data flow is well formed", "[models][data_flow]") {
  const std::string dir = std::string(rackstep::source_dir()) + "/models/zoo";
  int models = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    ModelConfig m = load_model(entry.path().string());
    INFO(entry.path().string());
    CHECK(check_data_flow(build_layer_graph(m)) == "");
    // The shapes exec and the generator add: MLA, tied embeddings, dense.
    m.attention.kind = AttentionKind::kMla;
    m.attention.mla_kv_latent = 32;
    m.attention.mla_q_latent = 48;
    m.attention.mla_rope_dim = 16;
    m.tied_embeddings = true;
    CHECK(check_data_flow(build_layer_graph(m)) == "");
    m.moe.experts = 0;
    m.moe.dense_width = 64;
    CHECK(check_data_flow(build_layer_graph(m)) == "");
    ++models;
  }
  CHECK(models >= 10);
}

TEST_CASE("the tiny model's attention reads the tensors the architecture says", "[models][data_flow]") {
  const LayerGraph g =
      build_layer_graph(load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json"));
  const Op& core = find_op(g, "layers.0.attn.core");
  REQUIRE(core.inputs.size() == 3);
  CHECK(core.inputs[0].name == "layers.0.attn.q_rot");   // q after QK-norm and RoPE
  CHECK(core.inputs[1].name == "layers.0.attn.k_rot");
  CHECK(core.inputs[2].name == "layers.0.attn.v");       // v straight from its projection
  CHECK(core.inputs[0].shape_string() == "(B, T, heads=4, head_dim=32)");
  CHECK(core.inputs[1].shape_string() == "(B, T, kv_heads=2, head_dim=32)");  // stored KV heads
  // The gate reads the branch input, XSA reads v, the residual adds the branch to the stream.
  CHECK(find_op(g, "layers.0.attn.gate").inputs[1].name == "layers.0.attn_norm_gate.out");
  CHECK(find_op(g, "layers.0.attn.xsa").inputs[1].name == "layers.0.attn.v");
  const Op& res = find_op(g, "layers.1.attn_residual");
  CHECK(res.inputs[0].name == "layers.0.resid_out");
  CHECK(res.inputs[1].name == "layers.1.attn.out_sconv.out");
  // MoE: the router and the latent projection read the branch input; the shared
  // experts add to the routed output; top-k writes expert ids as i32.
  CHECK(find_op(g, "layers.2.moe.router").inputs[0].name == "layers.2.mlp_norm_gate.out");
  CHECK(find_op(g, "layers.2.moe.topk").outputs[1].dtype == DType::kI32);
  const Op& shared = find_op(g, "layers.2.moe.shared");
  REQUIRE(shared.inputs.size() == 2);
  CHECK(shared.inputs[1].name == "layers.2.moe.routed_up");
  CHECK(find_op(g, "cross_entropy").inputs[0].name == "logits");
}

TEST_CASE("a broken data flow is reported", "[models][data_flow]") {
  LayerGraph g = build_layer_graph(load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json"));
  g.ops[5].inputs[0].name = "layers.0.nothing";
  CHECK(check_data_flow(g).find("layers.0.nothing") != std::string::npos);
  g = build_layer_graph(g.model);
  g.ops[5].inputs[0].shape.back().size += 1;
  CHECK(check_data_flow(g).find("reads") != std::string::npos);
}
