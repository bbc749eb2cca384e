// The MoE kernels an eager trainer runs beside the routed-expert GEMMs (issue 13,
// calibration block `moe_kernels`, sim/cost.cpp): Megatron-Core's all-to-all dispatcher
// sorts the received rows by local expert (and back), FP8 experts copy their rows to the
// FP8 alignment, the activation is a kernel of its own, and Transformer Engine quantizes
// the grouped GEMMs' FP8 inputs expert by expert. Each adds HBM passes (or kernels) only
// where its condition holds; a compiled step (the base calibration) adds none.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "sim/predict.h"
#include "sim/stack.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

// Qwen3-30B-A3B (d_model 2048, 128 experts of width 768, top-8) on an H100: one
// micro-batch of 8192 tokens, 65,536 routed rows over 16 local experts (EP 8).
struct SmallMoe {
  OpTable t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/qwen3-30b-a3b.json"))));
  topologies::SystemSpec sys = topologies::load_system(src("topologies/zoo/hgx-h100.json"));

  PriceContext ctx(const Calibration& cal) const {
    PriceContext c = device_price_context(sys.gpu, cal);
    c.tokens = 8192;
    c.seq = 4096;
    c.expert_rows = 8192.0 * 8.0;
    c.local_experts = 16;
    return c;
  }
  // Seconds to read and write `elems` BF16 elements once at the elementwise HBM rate.
  double pass_s(const PriceContext& c, double elems) const {
    return 2.0 * elems * 2.0 / (c.hbm_bw_bytes_per_s * c.cal->mem_eff_elementwise);
  }
};

Calibration with_flags(bool sort, bool pad, bool act, bool quant) {
  Calibration cal = default_calibration();
  cal.moe_sort_rows_by_local_expert = sort;
  cal.moe_fp8_pad_expert_rows = pad;
  cal.moe_activation_kernel = act;
  // The stack's byte counts of the weighted SwiGLU kernel (megatron-bridge-2025: reads
  // [h1|h3], writes h; backward reads [h1|h3] and dh, writes d[h1|h3]; BF16).
  cal.expert_glu_fwd_bytes = 3.0;
  cal.expert_glu_bwd_bytes = 5.0;
  cal.moe_fp8_quantize_per_expert = quant;
  return cal;
}

// Qwen3-30B-A3B's one-node H100 layout with FP8 (current scaling) experts:
// data 8 with the distributed optimizer, EP 8 over the data ranks, the ragged transport.
Layout qwen3_30b_h100_fp8_layout() {
  Layout l;
  l.data = 8;
  l.fsdp = 8;
  l.zero_stage = 1;
  l.ep = 8;
  l.ep_transport = Transport::ragged;
  l.micro_batch_seqs = 2;
  l.tokens_per_step = 8.0 * 16.0 * 4096.0;
  l.recompute = models::Recompute::kNone;
  l.fp8 = Fp8Gemms::kLinear;
  l.fp8_recipe = Fp8Recipe::kCurrent;
  return l;
}

}  // namespace

TEST_CASE("The base calibration (a compiled step) runs none of the eager MoE kernels", "[moe_kernels]") {
  const Calibration& cal = default_calibration();
  CHECK_FALSE(cal.moe_sort_rows_by_local_expert);
  CHECK_FALSE(cal.moe_fp8_pad_expert_rows);
  CHECK_FALSE(cal.moe_activation_kernel);
  CHECK_FALSE(cal.moe_fp8_quantize_per_expert);
  const Calibration mb = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  CHECK(mb.moe_sort_rows_by_local_expert);
  CHECK(mb.moe_fp8_pad_expert_rows);
  CHECK(mb.moe_activation_kernel);
  CHECK(mb.moe_fp8_quantize_per_expert);
}

TEST_CASE("The all-to-all dispatcher's sort by local expert is one more pass over the routed rows each way", "[moe_kernels]") {
  const SmallMoe m;
  const Calibration cal = with_flags(true, false, false, false);
  PriceContext off = m.ctx(cal);
  PriceContext on = off;
  on.moe_sort_rows = true;
  const double rows_elems = on.expert_rows * 2048.0;
  const double expected = m.pass_s(on, rows_elems) + cal.launch_overhead_s;
  for (const auto kind : {models::OpKind::kDispatch, models::OpKind::kCombine}) {
    const OpEntry& e = find_op(m.t, kind);
    const OpTime a = price_op(e, off), b = price_op(e, on);
    CHECK(b.fwd_s - a.fwd_s == Approx(expected).epsilon(1e-9));
    // The backward sorts the gradient back: one pass, not the op's doubled backward.
    CHECK(b.bwd_s - a.bwd_s == Approx(expected).epsilon(1e-9));
  }
  // Other ops do not see it.
  const OpEntry& ex = find_op(m.t, models::OpKind::kExpertMlp);
  CHECK(price_op(ex, on).fwd_s == price_op(ex, off).fwd_s);
}

TEST_CASE("FP8 alignment copies add a pass over the experts' input and output rows, FP8 experts only", "[moe_kernels]") {
  const SmallMoe m;
  const Calibration cal = with_flags(false, true, false, false);
  const OpEntry& ex = find_op(m.t, models::OpKind::kExpertMlp);
  PriceContext fp8 = m.ctx(cal);
  fp8.fp8_peak_flops_per_s = m.sys.gpu.peak_fp8_flops_per_s;
  fp8.fp8_linear = true;
  fp8.fp8_recipe = Fp8Recipe::kCurrent;
  PriceContext fp8_pad = fp8;
  fp8_pad.moe_fp8_pad_rows = true;
  // Pad the input rows, unpad the output rows: two copies of rows x d_model.
  const double copies = 2.0 * m.pass_s(fp8, fp8.expert_rows * 2048.0) + 2.0 * cal.launch_overhead_s;
  CHECK(price_op(ex, fp8_pad).fwd_s - price_op(ex, fp8).fwd_s == Approx(copies).epsilon(1e-9));
  CHECK(price_op(ex, fp8_pad).bwd_s - price_op(ex, fp8).bwd_s == Approx(copies).epsilon(1e-9));
  // BF16 experts are not padded, whatever the dispatcher says.
  PriceContext bf16 = m.ctx(cal);
  PriceContext bf16_pad = bf16;
  bf16_pad.moe_fp8_pad_rows = true;
  CHECK(price_op(ex, bf16_pad).fwd_s == price_op(ex, bf16).fwd_s);
}

TEST_CASE("A separate activation kernel adds its HBM traffic to the expert GEMMs' time", "[moe_kernels]") {
  const SmallMoe m;
  const OpEntry& ex = find_op(m.t, models::OpKind::kExpertMlp);
  const Calibration off_cal = with_flags(false, false, false, false);
  const Calibration on_cal = with_flags(false, false, true, false);
  const PriceContext off = m.ctx(off_cal), on = m.ctx(on_cal);
  const double bw = on.hbm_bw_bytes_per_s * on_cal.mem_eff_elementwise;
  const double rows = on.expert_rows, n = 768.0;
  // Forward reads [h1|h3] and writes h; backward reads [h1|h3] and dh, writes d[h1|h3].
  CHECK(price_op(ex, on).fwd_s - price_op(ex, off).fwd_s == Approx(rows * 3.0 * n * 2.0 / bw).epsilon(1e-9));
  CHECK(price_op(ex, on).bwd_s - price_op(ex, off).bwd_s == Approx(rows * 5.0 * n * 2.0 / bw).epsilon(1e-9));
  // It scales with the rows, not with the calls: twice the rows, twice the added time.
  PriceContext on2 = on, off2 = off;
  on2.expert_rows = off2.expert_rows = 2.0 * rows;
  on2.tokens = off2.tokens = 2.0 * on.tokens;
  CHECK(price_op(ex, on2).fwd_s - price_op(ex, off2).fwd_s == Approx(2.0 * rows * 3.0 * n * 2.0 / bw).epsilon(1e-9));
}

TEST_CASE("Per-expert FP8 quantization launches its kernels once per local expert, by recipe", "[moe_kernels]") {
  const SmallMoe m;
  const OpEntry& ex = find_op(m.t, models::OpKind::kExpertMlp);
  const Calibration whole = with_flags(false, false, false, false);
  const Calibration split = with_flags(false, false, false, true);
  auto quant = [&](const Calibration& cal, Fp8Recipe r) {
    PriceContext c = m.ctx(cal);
    c.fp8_peak_flops_per_s = m.sys.gpu.peak_fp8_flops_per_s;
    c.fp8_linear = true;
    c.fp8_recipe = r;
    return fp8_quantize(ex, c);
  };
  const double launch = whole.launch_overhead_s;
  // Two quantized tensors forward (x, h), two backward (the output gradients):
  // current scaling 4 kernels per expert instead of 2 per tensor...
  const Fp8QuantizeTime cur_whole = quant(whole, Fp8Recipe::kCurrent), cur_split = quant(split, Fp8Recipe::kCurrent);
  CHECK(cur_split.fwd_s - cur_whole.fwd_s == Approx(2.0 * (4.0 * 16.0 - 2.0) * launch).epsilon(1e-9));
  CHECK(cur_split.bwd_s - cur_whole.bwd_s == Approx(2.0 * (4.0 * 16.0 - 2.0) * launch).epsilon(1e-9));
  CHECK(cur_split.fwd_bytes == cur_whole.fwd_bytes);  // the same bytes, more kernels
  // ...MXFP8 one per expert instead of one per tensor...
  const Fp8QuantizeTime mx_whole = quant(whole, Fp8Recipe::kMxfp8), mx_split = quant(split, Fp8Recipe::kMxfp8);
  CHECK(mx_split.fwd_s - mx_whole.fwd_s == Approx(2.0 * (16.0 - 1.0) * launch).epsilon(1e-9));
  // ...and delayed scaling's fused multi-tensor cast stays one kernel per tensor.
  CHECK(quant(split, Fp8Recipe::kDelayed).fwd_s == quant(whole, Fp8Recipe::kDelayed).fwd_s);
}

TEST_CASE("FP8 rows from the all-to-all and DeepEP are padded for the experts; HybridEP's arrive aligned", "[moe_kernels][fp8]") {
  const auto g = models::build_layer_graph(models::load_model(src("tests/validation/models/qwen3-30b-a3b.json")));
  const auto c = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  const Calibration pad = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  Calibration no_pad = pad;
  no_pad.moe_fp8_pad_expert_rows = false;
  const Layout l = qwen3_30b_h100_fp8_layout();
  const auto padding_s = [&](EpDispatcher d, FlexBackend b) {
    Layout x = l;
    x.ep_dispatcher = d;
    x.ep_flex_backend = b;
    return Predictor(g, c, pad).predict(x).step_time_s - Predictor(g, c, no_pad).predict(x).step_time_s;
  };
  CHECK(padding_s(EpDispatcher::kAllToAll, FlexBackend::kDeepEp) > 0.0);
  CHECK(padding_s(EpDispatcher::kFlex, FlexBackend::kDeepEp) > 0.0);
  CHECK(padding_s(EpDispatcher::kFlex, FlexBackend::kHybridEp) == Approx(0.0));
}

TEST_CASE("The dispatcher decides which passes a layout pays; Marin's layouts pay none", "[moe_kernels]") {
  const auto g = models::build_layer_graph(models::load_model(src("tests/validation/models/qwen3-30b-a3b.json")));
  const auto c = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  const Calibration eager = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  Calibration compiled = eager;
  compiled.moe_sort_rows_by_local_expert = compiled.moe_fp8_pad_expert_rows = false;
  compiled.moe_activation_kernel = compiled.moe_fp8_quantize_per_expert = false;
  const Layout l = qwen3_30b_h100_fp8_layout();
  Layout flex = l;
  flex.ep_dispatcher = EpDispatcher::kFlex;
  const Prediction a2a_eager = Predictor(g, c, eager).predict(l), a2a_compiled = Predictor(g, c, compiled).predict(l);
  const Prediction flex_eager = Predictor(g, c, eager).predict(flex), flex_compiled = Predictor(g, c, compiled).predict(flex);
  REQUIRE((a2a_eager.valid && a2a_compiled.valid && flex_eager.valid && flex_compiled.valid));
  const auto compute = [](const Prediction& p) { return p.breakdown.compute_fwd_s + p.breakdown.compute_bwd_s; };
  // The all-to-all dispatcher pays the sort and the FP8 copies beside what flex pays too
  // (the activation kernel, per-expert quantization): it grows more.
  CHECK(compute(flex_eager) > compute(flex_compiled));
  CHECK(compute(a2a_eager) - compute(a2a_compiled) > compute(flex_eager) - compute(flex_compiled));

  // The hero's layout under the base calibration (Marin's compiled step) prices no
  // activation pass; the same layout with one would be slower.
  const auto hero = models::build_layer_graph(models::load_model(src("models/zoo/marin-535b-a23b.json")));
  const auto racks = topologies::load_cluster(src("topologies/zoo/gb200-11-racks.json"));
  const Layout hl = load_layout(src("sim/layouts/hero-ragged.json"));
  Calibration marin_on = default_calibration();
  marin_on.moe_activation_kernel = true;
  marin_on.expert_glu_fwd_bytes = 3.0;
  marin_on.expert_glu_bwd_bytes = 5.0;
  CHECK(Predictor(hero, racks, marin_on).predict(hl).step_time_s > Predictor(hero, racks).predict(hl).step_time_s);
}

TEST_CASE("A bad moe_kernels entry is one user error naming the file and JSON path", "[moe_kernels]") {
  nlohmann::json doc = load_json_file(default_calibration_path());
  doc["moe_kernels"]["activation_kernel"]["value"] = 1;
  try {
    (void)parse_calibration(doc, "cal.json");
    FAIL("a number where a flag belongs was accepted");
  } catch (const UserError& e) {
    const std::string what = e.what();
    CHECK(what.find("cal.json") != std::string::npos);
    CHECK(what.find("/moe_kernels/activation_kernel/value") != std::string::npos);
  }
  nlohmann::json unknown = load_json_file(default_calibration_path());
  unknown["moe_kernels"]["sort_rows"] = {{"value", true}, {"source", "typo"}};
  CHECK_THROWS_AS(parse_calibration(unknown, "cal.json"), UserError);
}

// Megatron-Core runs its routed experts through Transformer Engine GroupedLinear: one
// cuBLAS GEMM per local expert (multi-stream). Its stacks state the measured grouped rate
// over the dense curve (grouped_gemm.per_expert_dense_relative_efficiency), which replaces
// the factor anchored on Marin's JAX kernel; the shape still follows the dense curve at
// the per-expert rows, and FP8 experts take the dense FP8 factors.
TEST_CASE("A per-expert dense GEMM stack prices its experts on the dense curve at the per-expert shape", "[moe_kernels]") {
  const Calibration base = default_calibration();
  const Calibration te = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  REQUIRE(base.grouped_per_expert_dense_relative_eff == 0);  // Marin's stacks keep the anchor
  REQUIRE(te.grouped_per_expert_dense_relative_eff > 0);
  CHECK(te.grouped_factor == te.grouped_per_expert_dense_relative_eff);
  Calibration anchored = te;  // the same stack without the entry
  anchored.grouped_per_expert_dense_relative_eff = 0;
  anchored.grouped_factor = base.grouped_factor;
  REQUIRE(te.grouped_factor != anchored.grouped_factor);

  // Shape dependence as a formula: the factor times the dense curve; small experts lose.
  const double peak = 0.7;
  for (const double rows : {128.0, 1024.0, 8192.0}) {
    CHECK(grouped_gemm_efficiency_at(te, peak, nullptr, rows, 2048, 768) ==
          Approx(te.grouped_factor * gemm_efficiency_at(te, peak, nullptr, rows, 768, 2048)));
  }
  CHECK(grouped_gemm_efficiency_at(te, peak, nullptr, 128, 2048, 768) < grouped_gemm_efficiency_at(te, peak, nullptr, 1024, 2048, 768));
  CHECK(grouped_gemm_efficiency_at(te, peak, nullptr, 1024, 2048, 768) < grouped_gemm_efficiency_at(te, peak, nullptr, 8192, 2048, 768));
  CHECK(grouped_gemm_efficiency_at(te, peak, nullptr, 8192, 2048, 256) < grouped_gemm_efficiency_at(te, peak, nullptr, 8192, 2048, 768));

  // The stack entry changes the priced expert GEMM time (BF16, compute-bound shape).
  const SmallMoe m;
  const OpEntry& e = find_op(m.t, models::OpKind::kExpertMlp);
  const OpTime with = price_op(e, m.ctx(te)), without = price_op(e, m.ctx(anchored));
  CHECK((te.grouped_factor > anchored.grouped_factor ? with.fwd_s < without.fwd_s : with.fwd_s > without.fwd_s));
  CHECK((te.grouped_factor > anchored.grouped_factor ? with.bwd_s < without.bwd_s : with.bwd_s > without.bwd_s));

  // Fewer rows per expert (same FLOPs over more local experts): a lower rate, a longer time.
  PriceContext many = m.ctx(te);
  many.local_experts = 512;  // 128 rows per expert
  CHECK(price_op(e, many).fwd_s > with.fwd_s);

  // FP8 experts: the per-expert dense stack follows the dense FP8 factor; the anchor does not.
  const auto fp8_ctx = [&](const Calibration& cal, double dense_rel) {
    PriceContext c = m.ctx(cal);
    c.fp8_experts = true;
    c.fp8_recipe = Fp8Recipe::kMxfp8;
    c.fp8_peak_flops_per_s = 2.0 * c.peak_flops_per_s;
    c.fp8_dense_rel_eff = dense_rel;
    return c;
  };
  CHECK(price_op(e, fp8_ctx(te, 0.5)).fwd_s > price_op(e, fp8_ctx(te, 0.99)).fwd_s);
  CHECK(price_op(e, fp8_ctx(anchored, 0.5)).fwd_s == price_op(e, fp8_ctx(anchored, 0.99)).fwd_s);
}
