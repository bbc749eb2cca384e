// The mechanisms beyond the Marin block in the layer graph: GeLU / ReLU²
// MLPs, learned positions, ALiBi, linear and MLP biases, attention sinks.
// Counted exactly, priced as hardware work, and refused clearly when wrong.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "models/layer_graph.h"
#include "sim/base/source_dir.h"

using namespace rackstep;
using namespace rackstep::models;
using nlohmann::json;

namespace {

json zoo_json(const std::string& name) {
  return load_json_file(std::string(rackstep::source_dir()) + "/models/zoo/" + name + ".json");
}

LayerGraph graph_of(const json& doc) { return build_layer_graph(parse_model(doc, "m.json")); }

const Op& op_named(const LayerGraph& g, const std::string& name) {
  for (const Op& op : g.ops)
    if (op.name == name) return op;
  FAIL("no op " << name);
  return g.ops.front();
}

std::string error_of(const json& doc) {
  try {
    parse_model(doc, "m.json");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("tiny-gpt-gelu: every parameter counted by hand", "[models][mech]") {
  const LayerGraph g = graph_of(zoo_json("tiny-gpt-gelu"));
  REQUIRE(check_data_flow(g).empty());
  const double d = 128, V = 257, P = 256, F = 512, L = 2;
  const ParamCounts p = count_params(g);
  CHECK(p.embedding == V * d);
  CHECK(p.positions == P * d);
  CHECK(p.attention == L * 4 * d * d);
  CHECK(p.dense_mlp == L * 2 * d * F);              // two matrices, no W3
  CHECK(p.biases == L * (4 * d + F + d));           // q, k, v, o; b1 (F), b2 (d)
  CHECK(p.norms == (2 * L + 1) * d);
  CHECK(p.lm_head == 0);                            // tied
  CHECK(p.total == V * d + P * d + L * (4 * d * d + 2 * d * F + 4 * d + F + d + 2 * d) + d);
  // Biases and position tables are not matmul parameters (Marin's active convention).
  CHECK(p.active == L * (4 * d * d + 2 * d * F));

  const Op& mlp = op_named(g, "layers.0.mlp");
  CHECK(mlp.activation == MlpActivation::kGelu);
  CHECK(mlp.gemm_count == 2);
  REQUIRE(mlp.params.size() == 4);  // w1, w2, b1, b2
  CHECK(mlp.params[2].name == "layers.0.mlp.b1");
  CHECK(mlp.params[3].shape == std::vector<int64_t>{128});
  const Op& q = op_named(g, "layers.1.attn.q_proj");
  REQUIRE(q.params.size() == 2);
  CHECK(q.params[1].name == "layers.1.attn.q_proj.b");
  CHECK(q.ew_flops_per_token == 128);               // the bias add
  const Op& emb = op_named(g, "embedding");
  REQUIRE(emb.params.size() == 2);
  CHECK(emb.params[1].shape == std::vector<int64_t>{256, 128});
  for (const Op& op : g.ops) CHECK(op.kind != OpKind::kRope);

  // Model FLOPs: a GeLU MLP is two matmuls (4 d F per token), not three.
  const FlopCounts f = count_flops(g, 256, FlopConvention::kMarin);
  CHECK(f.shared == L * 2 * 2 * d * F);
}

TEST_CASE("SwiGLU stays the default: an MLP without `mlp` is three matrices", "[models][mech]") {
  json doc = zoo_json("tiny-gpt-gelu");
  doc.erase("mlp");
  const LayerGraph g = graph_of(doc);
  const Op& mlp = op_named(g, "layers.0.mlp");
  CHECK(mlp.activation == MlpActivation::kSwiGlu);
  CHECK(mlp.gemm_count == 3);
  CHECK(mlp.params.size() == 3);
  doc["mlp"] = {{"activation", "swiglu"}, {"bias", true}};
  const Op& biased = op_named(graph_of(doc), "layers.0.mlp");
  REQUIRE(biased.params.size() == 6);  // w1, w3, w2, b1, b3, b2
  CHECK(biased.params[4].name == "layers.0.mlp.b3");
}

TEST_CASE("tiny-alibi-sink-moe: ALiBi replaces RoPE, sinks are one logit per head", "[models][mech]") {
  const LayerGraph g = graph_of(zoo_json("tiny-alibi-sink-moe"));
  REQUIRE(check_data_flow(g).empty());
  int attention_ops = 0;
  for (const Op& op : g.ops) {
    CHECK(op.kind != OpKind::kRope);
    if (op.kind != OpKind::kAttention) continue;
    ++attention_ops;
    CHECK(op.alibi);
    CHECK(op.sinks);
    REQUIRE(op.params.size() == 1);
    CHECK(op.params[0].shape == std::vector<int64_t>{4});
    CHECK(op.params[0].role == ParamRole::kOther);
  }
  CHECK(attention_ops == 2);
  const ParamCounts p = count_params(g);
  CHECK(p.attn_sinks == 2 * 4);
  const Op& shared = op_named(g, "layers.0.moe.shared");
  CHECK(shared.activation == MlpActivation::kRelu2);
  CHECK(shared.gemm_count == 2);
  // Routed experts stay SwiGLU.
  CHECK(op_named(g, "layers.0.moe.experts").gemm_count == 3);
  CHECK(p.biases == 2 * (128 + 64 + 64 + 128 + 64 + 128));  // q (H hd), k, v (kv hd), o; b1, b2
}

TEST_CASE("ALiBi and sinks add hardware FLOPs only, learned positions a lookup", "[models][mech]") {
  json base = zoo_json("tiny-alibi-sink-moe");
  base["attention"]["local"]["position"] = "nope";
  base["attention"]["global"]["position"] = "nope";
  base["attention"]["sinks"] = false;
  const LayerGraph plain = graph_of(base), alibi = graph_of(zoo_json("tiny-alibi-sink-moe"));
  const int64_t seq = 256;
  const FlopCounts a = count_flops(alibi, seq, FlopConvention::kMarin), b = count_flops(plain, seq, FlopConvention::kMarin);
  CHECK(a.forward == b.forward);  // Levanter's model FLOPs count neither
  const double H = 4;
  const double local_span = mean_attention_span(seq, 64, FlopConvention::kExact);
  const double global_span = mean_attention_span(seq, 0, FlopConvention::kExact);
  const double want = 2 * H * (local_span + global_span) + 2 * (2 * H);
  CHECK(a.forward_hardware - b.forward_hardware == Approx(want).epsilon(1e-12));
  const Op& att = op_named(alibi, "layers.0.attn.core");
  const OpCost with = op_cost(att, 1, seq), without = op_cost(op_named(plain, "layers.0.attn.core"), 1, seq);
  CHECK(with.fwd_flops - without.fwd_flops == Approx(2 * H * local_span * seq + 2 * H * seq));
  CHECK(with.model_fwd_flops == without.model_fwd_flops);

  json gpt = zoo_json("tiny-gpt-gelu");
  CHECK(op_named(graph_of(gpt), "embedding").ew_flops_per_token == 128);
  gpt.erase("position_embedding");
  CHECK(op_named(graph_of(gpt), "embedding").ew_flops_per_token == 0);
}

TEST_CASE("bad mechanism fields are one line naming path, expected and found", "[models][mech][errors]") {
  json doc = zoo_json("tiny-gpt-gelu");
  json bad = doc;
  bad["mlp"]["activation"] = "tanh";
  CHECK(error_of(bad) == "m.json: /mlp/activation: expected one of swiglu, gelu, relu2, found \"tanh\"");
  bad = doc;
  bad["position_embedding"]["max_positions"] = 128;
  CHECK(error_of(bad) == "m.json: /position_embedding/max_positions: expected at least seq_len (256), found 128");
  bad = doc;
  bad["position_embedding"] = {{"kind", "none"}, {"max_positions", 512}};
  CHECK(error_of(bad) ==
        "m.json: /position_embedding/max_positions: expected no max_positions with kind \"none\", found a table size");
  bad = doc;
  bad["attention"]["local"]["position"] = "alibi2";
  CHECK(error_of(bad) == "m.json: /attention/local/position: expected one of rope, nope, alibi, found \"alibi2\"");
  bad = doc;
  bad["attention"]["sinks"] = "yes";
  CHECK(error_of(bad) == "m.json: /attention/sinks: expected true or false, found string \"yes\"");
  json routed = zoo_json("tiny-alibi-sink-moe");
  routed["moe"]["shared_experts"] = 0;
  CHECK(error_of(routed) ==
        "m.json: /mlp/activation: expected swiglu when every MLP is a routed expert (no dense layers or shared experts; "
        "experts are SwiGLU), found \"relu2\"");
  routed["mlp"]["activation"] = "swiglu";
  CHECK(error_of(routed) ==
        "m.json: /mlp/bias: expected false when every MLP is a routed expert (no dense layers or shared experts; "
        "experts have no biases), found true");
  routed["moe"]["dense_layers"] = 1;
  routed["moe"]["dense_width"] = 64;
  CHECK(error_of(routed).empty());
  json mla = load_json_file(std::string(rackstep::source_dir()) + "/models/zoo/marin-535b-a23b.json");
  mla["attention"]["kind"] = "mla";
  mla["attention"]["mla"] = {{"kv_latent", 512}};
  mla["attention"]["global"]["position"] = "alibi";
  CHECK(error_of(mla) ==
        "m.json: /attention/local/position: expected rope or nope with kind \"mla\" (its decoupled key is rotary), found \"alibi\"");
}
