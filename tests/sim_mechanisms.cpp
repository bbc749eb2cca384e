// Pricing of the layer-graph mechanisms (sim/cost.*, sim/memory.*): a GeLU
// MLP is two GEMMs, biases and learned positions are parameters the memory
// model holds, ALiBi and sinks are hardware work inside the attention kernel.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "sim/calibration.h"
#include "sim/cost.h"
#include "topologies/topology.h"

using namespace rackstep;
using nlohmann::json;

namespace {

json zoo_json(const std::string& name) {
  return load_json_file(std::string(rackstep::source_dir()) + "/models/zoo/" + name + ".json");
}

sim::OpTable table_of(const json& doc) { return sim::build_op_table(models::build_layer_graph(models::parse_model(doc, "m.json"))); }

const sim::OpEntry& entry(const sim::OpTable& t, models::OpKind kind) {
  for (const auto& e : t.classes.at(0).ops)
    if (e.kind == kind) return e;
  FAIL("no such op in the first layer class");
  return t.classes[0].ops[0];
}

struct Context {
  topologies::Cluster cluster =
      topologies::load_cluster(std::string(rackstep::source_dir()) + "/topologies/zoo/hgx-h100.json");
  sim::Calibration cal = sim::load_calibration();
  sim::PriceContext ctx() const {
    sim::PriceContext c;
    c.gpu = &cluster.system.gpu;
    c.cal = &cal;
    c.tokens = 8 * 2048;
    c.seq = 2048;
    c.peak_flops_per_s = cluster.system.gpu.peak_bf16_flops_per_s;
    c.hbm_bw_bytes_per_s = cluster.system.gpu.hbm_bw_bytes_per_s;
    c.gemm_peak_eff = sim::gemm_peak_efficiency(cal, cluster.system.gpu);
    c.gemm_shape = sim::gemm_shape_table(cal, cluster.system.gpu);
    return c;
  }
};

}  // namespace

TEST_CASE("a GeLU MLP prices two GEMMs, SwiGLU three", "[sim][mech]") {
  const Context c;
  json gelu = zoo_json("tiny-gpt-gelu");
  gelu["mlp"]["bias"] = false;
  json swiglu = gelu;
  swiglu["mlp"]["activation"] = "swiglu";
  const sim::OpTable tg = table_of(gelu), ts = table_of(swiglu);
  const auto& g = entry(tg, models::OpKind::kSharedMlp);
  const auto& s = entry(ts, models::OpKind::kSharedMlp);
  CHECK(g.gemm_count == 2);
  CHECK(s.gemm_count == 3);
  const sim::OpTime pg = sim::price_op(g, c.ctx()), ps = sim::price_op(s, c.ctx());
  const double gemm = 2.0 * 128 * 512 * 8 * 2048;  // one (d x F) GEMM over the micro-batch
  CHECK(pg.fwd_flops == Approx(2 * gemm + 8.0 * 512 * 8 * 2048));
  CHECK(ps.fwd_flops == Approx(3 * gemm + 5.0 * 512 * 8 * 2048));
  CHECK(pg.fwd_s < ps.fwd_s);
  CHECK(sim::model_flops_per_token(tg, 2048) < sim::model_flops_per_token(ts, 2048));
}

TEST_CASE("biases and learned positions are parameters, priced and held", "[sim][mech]") {
  const Context c;
  json with = zoo_json("tiny-gpt-gelu");
  json without = with;
  without["attention"]["qkv_bias"] = false;
  without["attention"]["o_bias"] = false;
  without["mlp"]["bias"] = false;
  without.erase("position_embedding");
  const sim::OpTable a = table_of(with), b = table_of(without);
  const double d = 128, F = 512;
  CHECK(a.total_params - b.total_params == 2 * (4 * d + F + d) + 256 * d);
  CHECK(a.embedding_params - b.embedding_params == 256 * d);
  CHECK(a.classes[0].dense_params - b.classes[0].dense_params == 4 * d + F + d);
  // Biases are Adam-group vectors, never Muon matrices.
  CHECK(a.muon_params == b.muon_params);
  // The bias add is one more elementwise pass of the projection.
  const auto& qa = entry(a, models::OpKind::kLinear);
  const auto& qb = entry(b, models::OpKind::kLinear);
  CHECK(sim::price_op(qa, c.ctx()).fwd_flops - sim::price_op(qb, c.ctx()).fwd_flops == Approx(d * 8 * 2048));
  CHECK(sim::price_op(qa, c.ctx()).fwd_s > sim::price_op(qb, c.ctx()).fwd_s);
}

TEST_CASE("ALiBi and sinks make attention slightly dearer, not its model FLOPs", "[sim][mech]") {
  const Context c;
  json alibi = zoo_json("tiny-alibi-sink-moe");
  json plain = alibi;
  plain["attention"]["local"]["position"] = "nope";
  plain["attention"]["global"]["position"] = "nope";
  plain["attention"]["sinks"] = false;
  const sim::OpTable a = table_of(alibi), p = table_of(plain);
  const auto& ea = entry(a, models::OpKind::kAttention);
  const auto& ep = entry(p, models::OpKind::kAttention);
  CHECK(ea.alibi);
  CHECK(ea.sinks);
  const sim::OpTime ta = sim::price_op(ea, c.ctx()), tp = sim::price_op(ep, c.ctx());
  const double span = models::mean_attention_span(2048, ea.window, models::FlopConvention::kExact);
  CHECK(ta.fwd_flops - tp.fwd_flops == Approx((2 * 4 * span + 2 * 4) * 8 * 2048));
  CHECK(ta.fwd_s >= tp.fwd_s);
  CHECK(ta.bwd_s >= tp.bwd_s);
  CHECK(ta.fwd_flops < 1.2 * tp.fwd_flops);  // slightly
  CHECK(sim::model_flops_per_token(a, 2048) == sim::model_flops_per_token(p, 2048));
}

TEST_CASE("a tiled flash kernel computes whole key tiles of the causal or windowed band", "[sim][mech][attention]") {
  // Exact without a tile.
  CHECK(sim::attention_tiled_span(0, 4096, 0) ==
        Approx(models::mean_attention_span(4096, 0, models::FlopConvention::kExact)));
  // Full causal, 128-token tiles: query tile b computes b + 1 key tiles, 128 (33 / 2) keys on average.
  CHECK(sim::attention_tiled_span(0, 4096, 128) == Approx(128.0 * 33.0 / 2.0));
  // A 128-token window: every query tile but the first touches two key tiles.
  CHECK(sim::attention_tiled_span(128, 4096, 128) == Approx((128.0 + 31.0 * 256.0) / 32.0));
  CHECK(sim::attention_tiled_span(128, 4096, 128) >
        1.9 * models::mean_attention_span(4096, 128, models::FlopConvention::kExact));
  // A window aligned wider than the tile: ceil((T + w - 1) / T) tiles, never fewer than the exact span.
  CHECK(sim::attention_tiled_span(2048, 8192, 128) >= models::mean_attention_span(8192, 2048, models::FlopConvention::kExact));
}

TEST_CASE("a flash kernel's masked tiles cost more: windows dearer, the measured causal sequence unchanged",
          "[sim][mech][attention]") {
  // Weight 1 is the plain tiled span.
  CHECK(sim::attention_tiled_span(0, 4096, 128, 1.0) == sim::attention_tiled_span(0, 4096, 128));
  CHECK(sim::attention_tiled_span(128, 4096, 128, 1.0) == sim::attention_tiled_span(128, 4096, 128));
  // Full causal: query tile b runs b unmasked key tiles and the masked diagonal one.
  CHECK(sim::attention_tiled_span(0, 4096, 128, 3.0) == Approx(128.0 * (15.5 + 3.0)));
  // A 128-token window over 128-token tiles: both key tiles of every query tile but the first are masked.
  CHECK(sim::attention_tiled_span(128, 4096, 128, 3.0) == Approx((3.0 * 128.0 + 31.0 * 2.0 * 3.0 * 128.0) / 32.0));
  // A 2048-token window: once it is full (query tile 16 on) two edge tiles are masked, before it one.
  CHECK(sim::attention_tiled_span(2048, 8192, 128, 3.0) - sim::attention_tiled_span(2048, 8192, 128) ==
        Approx((16.0 * 1.0 + 48.0 * 2.0) / 64.0 * 2.0 * 128.0));

  // Priced: the windowed layers of a local/global model get dearer, its full causal
  // layers keep their time at the sequence the efficiencies were measured at.
  Context c;
  c.cal.attention_tile_tokens = 128;
  const sim::OpTable t = table_of(zoo_json("tiny-alibi-sink-moe"));
  const sim::OpEntry *local = nullptr, *global = nullptr;
  for (const auto& cls : t.classes) {
    for (const auto& e : cls.ops) {
      if (e.kind != models::OpKind::kAttention) continue;
      (e.window > 0 ? local : global) = &e;
    }
  }
  REQUIRE(local != nullptr);
  REQUIRE(global != nullptr);
  const sim::OpTime local_plain = sim::price_op(*local, c.ctx()), global_plain = sim::price_op(*global, c.ctx());
  c.cal.attention_masked_tile_cost = 3.6;  // the H100 context has no per_gpu entry: the stack-wide value
  c.cal.attention_efficiency_seq_tokens = c.ctx().seq;
  CHECK(sim::attention_masked_tile_scale(c.cal, 3.6) > 1.0);
  CHECK(sim::attention_masked_tile_scale(c.cal, 1.0) == 1.0);
  const sim::OpTime local_masked = sim::price_op(*local, c.ctx()), global_masked = sim::price_op(*global, c.ctx());
  CHECK(global_masked.fwd_s == Approx(global_plain.fwd_s));
  CHECK(global_masked.bwd_s == Approx(global_plain.bwd_s));
  CHECK(local_masked.fwd_s > 1.5 * local_plain.fwd_s);
  CHECK(local_masked.bwd_s > 1.5 * local_plain.bwd_s);
  CHECK(local_masked.fwd_flops == local_plain.fwd_flops);  // the model's FLOPs are the same
  // A GPU's own value wins over the stack-wide one.
  c.cal.attention_eff_by_gpu[c.cluster.system.gpu.name] = {.fwd = c.cal.attention_fwd_eff,
                                                           .bwd = c.cal.attention_bwd_eff,
                                                           .masked_tile_cost = 1.0};
  CHECK(sim::price_op(*local, c.ctx()).fwd_s == Approx(local_plain.fwd_s));
  c.cal.attention_eff_by_gpu.clear();
  // A shorter causal sequence than the measured one is dearer per token.
  c.cal.attention_efficiency_seq_tokens = 4.0 * c.ctx().seq;
  CHECK(sim::price_op(*global, c.ctx()).fwd_s > global_plain.fwd_s);
}

TEST_CASE("attention efficiency follows the calibration's head-dim points", "[sim][mech][attention]") {
  const std::vector<std::pair<double, double>> points{{64, 0.68}, {128, 1.0}};
  CHECK(sim::attention_head_dim_factor({}, 64) == 1.0);
  CHECK(sim::attention_head_dim_factor(points, 32) == 0.68);   // held below the first point
  CHECK(sim::attention_head_dim_factor(points, 64) == 0.68);
  CHECK(sim::attention_head_dim_factor(points, 96) == Approx(0.84));
  CHECK(sim::attention_head_dim_factor(points, 192) == 1.0);   // held above the last

  // Priced: a head-dim-64 attention under those points and a 128-token tile is dearer.
  Context c;
  const json doc = zoo_json("tiny-alibi-sink-moe");
  const sim::OpTable t = table_of(doc);
  const sim::OpEntry& e = entry(t, models::OpKind::kAttention);
  const sim::OpTime plain = sim::price_op(e, c.ctx());
  c.cal.attention_head_dim_fwd = points;
  c.cal.attention_head_dim_bwd = {{64, 0.79}, {128, 1.0}};
  c.cal.attention_tile_tokens = 128;
  const sim::OpTime tiled = sim::price_op(e, c.ctx());
  CHECK(tiled.fwd_flops == plain.fwd_flops);  // the model's FLOPs are the same
  if (e.head_dim <= 64) CHECK(tiled.fwd_s > plain.fwd_s);
  CHECK(tiled.fwd_s >= plain.fwd_s);
  CHECK(tiled.bwd_s >= plain.bwd_s);
}

TEST_CASE("the megatron-bridge stack's attention head-dim points and tile read from its file", "[sim][mech][attention]") {
  const std::string root = rackstep::source_dir();
  const sim::Calibration cal =
      sim::parse_calibration([&] {
        json doc = load_json_file(root + "/sim/calibration.json");
        doc.merge_patch(load_json_file(root + "/sim/stacks/megatron-bridge-2025.json")["calibration"]);
        return doc;
      }(), "stack");
  REQUIRE(cal.attention_head_dim_fwd.size() == 2);
  CHECK(cal.attention_head_dim_fwd.front().first == 64);
  CHECK(cal.attention_tile_tokens == 128);
  // Masked tiles cost more on Blackwell, not on Hopper (H100 has no per_gpu entry).
  CHECK(cal.attention_masked_tile_cost == 1.0);
  CHECK(cal.attention_eff_by_gpu.at("GB200").masked_tile_cost > 1.0);
  CHECK(cal.attention_efficiency_seq_tokens == 8192);
  // The base calibration (Marin's stack) has neither: exact spans at every head dim.
  const sim::Calibration base = sim::load_calibration();
  CHECK(base.attention_head_dim_fwd.empty());
  CHECK(base.attention_tile_tokens == 0);
  CHECK(base.attention_masked_tile_cost == 1.0);
  // A masked-tile cost needs a tile to count masked tiles in.
  json untiled = load_json_file(root + "/sim/calibration.json");
  untiled["attention"]["masked_tile_cost"] = {{"value", 3.6}, {"source", "x"}};
  untiled["attention"]["efficiency_seq_tokens"] = {{"value", 8192}, {"source", "x"}};
  CHECK_THROWS_WITH(sim::parse_calibration(untiled, "untiled.json"), Catch::Contains("/attention/masked_tile_cost"));
  // ... and the sequence the efficiencies hold at, where a GPU sets its own.
  json unanchored = load_json_file(root + "/sim/calibration.json");
  unanchored["attention"]["tile_tokens"] = {{"value", 128}, {"source", "x"}};
  unanchored["attention"]["per_gpu"]["B200"] = {{"fwd_efficiency", {{"value", 0.6}, {"source", "x"}}},
                                                {"bwd_efficiency", {{"value", 0.45}, {"source", "x"}}},
                                                {"masked_tile_cost", {{"value", 3.6}, {"source", "x"}}}};
  CHECK_THROWS_WITH(sim::parse_calibration(unanchored, "unanchored.json"),
                    Catch::Contains("/attention/per_gpu/B200/masked_tile_cost"));
  // A head dim that is not a number is one error naming its path.
  json bad = load_json_file(root + "/sim/calibration.json");
  bad["attention"]["head_dim_fwd_factor"] = {{"sixty-four", {{"value", 0.7}, {"source", "x"}}}};
  CHECK_THROWS_WITH(sim::parse_calibration(bad, "bad.json"), Catch::Contains("/attention/head_dim_fwd_factor/sixty-four"));
}

TEST_CASE("attention efficiency is read per GPU, the stack-wide value elsewhere", "[sim][mech][attention]") {
  const std::string root = rackstep::source_dir();
  json doc = load_json_file(root + "/sim/calibration.json");
  doc.merge_patch(load_json_file(root + "/sim/stacks/megatron-bridge-2025.json")["calibration"]);
  const sim::Calibration cal = sim::parse_calibration(doc, "stack");
  const auto gpu_of = [&](const char* topo) {
    return topologies::load_cluster(root + "/topologies/zoo/" + topo + ".json").system.gpu;
  };
  // Hopper has no entry: the stack-wide H100 measurement.
  const sim::Calibration::AttentionEfficiency h100 = sim::attention_efficiency(cal, gpu_of("hgx-h100"));
  CHECK(h100.fwd == cal.attention_fwd_eff);
  CHECK(h100.bwd == cal.attention_bwd_eff);
  // B200 and GB200 run the same kernel rate (TF/s) against different datasheet peaks;
  // GB300 runs faster than GB200 at the same peak.
  const topologies::GpuSpec b200 = gpu_of("dgx-b200"), gb200 = gpu_of("gb200-nvl72"), gb300 = gpu_of("gb300-nvl72");
  const auto rate = [&](const topologies::GpuSpec& g) { return sim::attention_efficiency(cal, g).fwd * g.peak_bf16_flops_per_s; };
  CHECK(rate(b200) == Approx(rate(gb200)).epsilon(0.01));
  CHECK(rate(gb300) > rate(gb200));
  CHECK(sim::attention_efficiency(cal, gb200).bwd < sim::attention_efficiency(cal, gb200).fwd);

  // Priced: the GB200 entry is what the attention op runs at.
  Context c;
  c.cal = cal;
  c.cluster = topologies::load_cluster(root + "/topologies/zoo/gb200-nvl72.json");
  const sim::OpTable t = table_of(zoo_json("tiny-moe"));
  const sim::OpEntry& e = entry(t, models::OpKind::kAttention);
  const auto long_seq = [&] {  // a long sequence, so the tiny model's attention is compute-bound
    sim::PriceContext p = c.ctx();
    p.seq = p.tokens = 65536;
    return p;
  };
  const sim::OpTime with = sim::price_op(e, long_seq());
  c.cal.attention_eff_by_gpu.clear();
  const sim::OpTime without = sim::price_op(e, long_seq());
  CHECK(with.fwd_s > without.fwd_s);  // GB200's 0.567 below the stack-wide 0.59
  CHECK(with.bwd_s > without.bwd_s);

  // Marin's calibration has no per-GPU entries: GB200 runs at its own numbers.
  const sim::Calibration base = sim::load_calibration();
  CHECK(base.attention_eff_by_gpu.empty());
  CHECK(sim::attention_efficiency(base, gb200).fwd == base.attention_fwd_eff);

  // A per-GPU entry without its backward is one error naming the path.
  json bad = doc;
  bad["attention"]["per_gpu"]["GB200"].erase("bwd_efficiency");
  CHECK_THROWS_WITH(sim::parse_calibration(bad, "bad.json"), Catch::Contains("/attention/per_gpu/GB200"));
}

TEST_CASE("the experts' biases and clamped SwiGLU are parameters and elementwise passes the stack prices", "[sim][mech][experts]") {
  json plain = zoo_json("tiny-moe");
  json oss = plain;
  oss["moe"]["expert_bias"] = true;
  oss["moe"]["swiglu_alpha"] = 1.702;
  oss["moe"]["swiglu_limit"] = 7.0;
  oss["moe"]["swiglu_linear_offset"] = 1.0;
  const models::ModelConfig m = models::parse_model(oss, "oss.json");
  CHECK_FALSE(m.moe.standard_experts());
  CHECK(models::parse_model(plain, "plain.json").moe.standard_experts());
  const sim::OpTable to = table_of(oss), tp = table_of(plain);
  const sim::OpEntry& eo = entry(to, models::OpKind::kExpertMlp);
  const sim::OpEntry& ep = entry(tp, models::OpKind::kExpertMlp);
  const double E = static_cast<double>(m.moe.experts), F = static_cast<double>(m.moe.expert_width),
               L = static_cast<double>(m.moe_width());
  CHECK(eo.param_elems - ep.param_elems == Approx(E * (2 * F + L)));  // b1, b3 (E, F), b2 (E, L)
  CHECK(eo.expert_bias);
  CHECK(eo.swiglu_limit == 7.0);

  // Without the stack's passes (Marin's calibration) they cost nothing; with them the
  // bytes follow the fc1 (2 F per row) and fc2 (L per row) elements.
  Context c;
  CHECK(sim::expert_elementwise_bytes(eo, c.cal, 1000, F).fwd == 0);
  c.cal.moe_activation_kernel = true;  // the stack runs the activation as a kernel of its own
  c.cal.expert_glu_fwd_bytes = 3;
  c.cal.expert_glu_bwd_bytes = 5;
  c.cal.expert_clamp_fwd_bytes = 8;
  c.cal.expert_clamp_bwd_bytes = 10;
  c.cal.expert_bias_fwd_bytes = 12;
  c.cal.expert_bias_bwd_bytes = 12;
  const sim::ExpertElementwiseBytes xo = sim::expert_elementwise_bytes(eo, c.cal, 1000, F);
  const sim::ExpertElementwiseBytes xp = sim::expert_elementwise_bytes(ep, c.cal, 1000, F);
  CHECK(xp.fwd == Approx(1000 * 2 * F * 3));
  CHECK(xo.fwd == Approx(1000 * 2 * F * (3 + 8) + 1000 * L * 12));
  CHECK(xo.bwd == Approx(1000 * 2 * F * (5 + 10) + 1000 * L * 12));

  // Priced beside the grouped GEMMs, not hidden under them.
  sim::PriceContext ctx = c.ctx();
  ctx.expert_rows = 8 * 2048 * m.moe.top_k;
  ctx.local_experts = static_cast<double>(m.moe.experts);
  ctx.tp = 1;
  const sim::Calibration plain_cal = sim::load_calibration();
  sim::PriceContext base = ctx;
  base.cal = &plain_cal;
  const sim::OpTime with = sim::price_op(eo, ctx), without = sim::price_op(eo, base);
  const double bw = ctx.hbm_bw_bytes_per_s * c.cal.mem_eff_elementwise;
  const sim::ExpertElementwiseBytes x = sim::expert_elementwise_bytes(eo, c.cal, ctx.expert_rows, F);
  CHECK(with.fwd_s - without.fwd_s == Approx(x.fwd / bw));
  CHECK(with.bwd_s - without.bwd_s == Approx(x.bwd / bw));

  // A bad value is one error naming its path.
  json bad = oss;
  bad["moe"]["swiglu_limit"] = -1;
  CHECK_THROWS_WITH(models::parse_model(bad, "bad.json"), Catch::Contains("/moe/swiglu_limit"));
}

TEST_CASE("YaRN RoPE costs eager passes and calls only under a stack that runs it unfused", "[sim][mech][rope]") {
  const std::string root = rackstep::source_dir();
  json plain = zoo_json("tiny-moe");
  json yarn = plain;
  yarn["attention"]["rope_scaling"] = "yarn";
  yarn["attention"]["yarn"] = {{"factor", 32.0}, {"original_max_position_embeddings", 4096}};
  const sim::OpTable ty = table_of(yarn), tp = table_of(plain);
  const sim::OpEntry& ey = entry(ty, models::OpKind::kRope);
  const sim::OpEntry& ep = entry(tp, models::OpKind::kRope);
  CHECK(ey.rope_yarn);
  CHECK_FALSE(ep.rope_yarn);

  // Marin's calibration fuses RoPE whatever its frequencies: YaRN prices as plain RoPE.
  Context c;
  sim::PriceContext ctx = c.ctx();
  ctx.tp = 1;
  CHECK_FALSE(sim::rope_runs_unfused(ey, c.cal));
  CHECK(sim::price_op(ey, ctx).fwd_s == Approx(sim::price_op(ep, ctx).fwd_s));

  // The megatron-bridge stack runs YaRN's rotation as eager PyTorch ops: the bytes per
  // element of q and k and the kernels per rotated tensor its file gives.
  const sim::Calibration mb = sim::parse_calibration(
      [&] {
        json doc = load_json_file(root + "/sim/calibration.json");
        doc.merge_patch(load_json_file(root + "/sim/stacks/megatron-bridge-2025.json")["calibration"]);
        return doc;
      }(),
      "stack");
  REQUIRE(mb.rope_yarn_unfused);
  ctx.cal = &mb;
  CHECK(sim::rope_runs_unfused(ey, mb));
  CHECK_FALSE(sim::rope_runs_unfused(ep, mb));  // plain RoPE keeps the fused kernel
  const sim::OpTime unfused = sim::price_op(ey, ctx), fused = sim::price_op(ep, ctx);
  const double elems = ey.in_elems * ctx.tokens;
  const double bw = ctx.hbm_bw_bytes_per_s * mb.mem_eff_elementwise;
  CHECK(unfused.fwd_s == Approx(elems * mb.rope_yarn_fwd_bytes / bw + 2 * mb.rope_yarn_fwd_kernels * mb.launch_overhead_s));
  CHECK(unfused.bwd_s == Approx(elems * mb.rope_yarn_bwd_bytes / bw + 2 * mb.rope_yarn_bwd_kernels * mb.launch_overhead_s));
  CHECK(unfused.fwd_s > 3 * fused.fwd_s);  // six passes over q and k where the fused kernel makes one
  CHECK(unfused.fwd_flops == Approx(fused.fwd_flops));  // the same arithmetic

  // Each eager kernel is a host call: 2 tensors x the kernels of one rotation.
  ctx.op_issue_s = 10e-6;
  const double calls_fused = mb.host_calls_per_op.at("rope");
  CHECK(sim::op_host_issue_s(ey, ctx) == Approx(2 * mb.rope_yarn_fwd_kernels * (ctx.op_issue_s + mb.launch_overhead_s)));
  CHECK(sim::op_host_issue_s(ep, ctx) == Approx(calls_fused * ctx.op_issue_s + mb.launch_overhead_s));

  // An unknown scaling is one error naming its path.
  json bad = plain;
  bad["attention"]["rope_scaling"] = "ntk";
  CHECK_THROWS_WITH(models::parse_model(bad, "bad.json"), Catch::Contains("/attention/rope_scaling"));
}
