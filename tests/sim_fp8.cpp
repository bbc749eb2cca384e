// FP8 recipes as mechanisms (issue 13): the quantization passes each recipe adds in
// front of the FP8 GEMMs (sim/cost.cpp fp8_quantize), the per-GPU dense FP8 GEMM
// efficiency, block-scaled kernels, and the layout's fp8_recipe field.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/check.h"
#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "sim/predict.h"
#include "sim/stack.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

PriceContext fp8_context(const topologies::GpuSpec& gpu, const Calibration& cal, Fp8Recipe recipe) {
  PriceContext ctx = device_price_context(gpu, cal);
  ctx.tokens = 16384;
  ctx.seq = 8192;
  ctx.fp8_linear = true;
  ctx.fp8_recipe = recipe;
  return ctx;
}

}  // namespace

TEST_CASE("FP8 recipes: bytes per quantized element follow the passes each recipe makes", "[fp8]") {
  // Per-tensor current scaling reads the tensor twice (amax, then the cast).
  CHECK(fp8_quantize_bytes_per_elem(Fp8Recipe::kCurrent, false) == Approx(5.0));
  CHECK(fp8_quantize_bytes_per_elem(Fp8Recipe::kDelayed, false) == Approx(3.0));
  // A TN-only GPU (Hopper) needs a transposed copy of per-tensor FP8 operands...
  CHECK(fp8_quantize_bytes_per_elem(Fp8Recipe::kCurrent, true) == Approx(6.0));
  CHECK(fp8_quantize_bytes_per_elem(Fp8Recipe::kDelayed, true) == Approx(4.0));
  // ...block-scaled formats always write both directions, whatever the GPU.
  CHECK(fp8_quantize_bytes_per_elem(Fp8Recipe::kMxfp8, true) == fp8_quantize_bytes_per_elem(Fp8Recipe::kMxfp8, false));
  CHECK(fp8_quantize_bytes_per_elem(Fp8Recipe::kMxfp8, false) == Approx(4.0 + 2.0 / 32.0));
  CHECK(fp8_quantize_bytes_per_elem(Fp8Recipe::kBlockwise, false) == Approx(4.0 + 8.0 / 128.0));
}

TEST_CASE("FP8 quantization is priced on the GEMM operands of FP8 GEMMs only", "[fp8]") {
  const auto t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const auto sys = topologies::load_system(src("topologies/zoo/gb200-nvl72.json"));
  const Calibration& cal = default_calibration();
  const PriceContext ctx = fp8_context(sys.gpu, cal, Fp8Recipe::kCurrent);

  // The gated MLP reads x (k) and h (n) forward, gets dy (k) and d[h1|h3] (2n) backward.
  const OpEntry& mlp = find_op(t, models::OpKind::kSharedMlp);
  REQUIRE(mlp.gemm_count == 3);
  const Fp8QuantizeTime q = fp8_quantize(mlp, ctx);
  const double per_elem = fp8_quantize_bytes_per_elem(Fp8Recipe::kCurrent, false);  // GB200: any layout
  CHECK(q.fwd_bytes == Approx(ctx.tokens * (mlp.gemm_k + mlp.gemm_n) * per_elem));
  CHECK(q.bwd_bytes == Approx(ctx.tokens * (mlp.gemm_k + 2.0 * mlp.gemm_n) * per_elem));
  CHECK(q.fwd_s > q.fwd_bytes / ctx.hbm_bw_bytes_per_s);  // at a fraction of HBM bandwidth, plus launches

  // The LM head stays BF16; attention has no FP8 operands; BF16 layouts pay nothing.
  CHECK(fp8_quantize(find_op(t, models::OpKind::kLmHead), ctx).fwd_s == 0.0);
  CHECK(fp8_quantize(find_op(t, models::OpKind::kAttention), ctx).bwd_s == 0.0);
  PriceContext bf16 = ctx;
  bf16.fp8_linear = false;
  CHECK(fp8_quantize(mlp, bf16).fwd_s == 0.0);

  // The op's price carries the passes on top of the GEMM: with block-scaled kernels as
  // fast as per-tensor ones and non-TN backward GEMMs as fast as TN ones, current scaling
  // and MXFP8 differ by their passes alone.
  Calibration same_kernels = cal;
  same_kernels.fp8_block_scaled_relative_eff = 1.0;
  same_kernels.fp8_non_tn_backward_relative_eff = 1.0;
  const PriceContext cur = fp8_context(sys.gpu, same_kernels, Fp8Recipe::kCurrent);
  const PriceContext mx = fp8_context(sys.gpu, same_kernels, Fp8Recipe::kMxfp8);
  CHECK(fp8_quantize(mlp, mx).fwd_bytes < fp8_quantize(mlp, cur).fwd_bytes);
  CHECK(price_op(mlp, cur).fwd_s - price_op(mlp, mx).fwd_s ==
        Approx(fp8_quantize(mlp, cur).fwd_s - fp8_quantize(mlp, mx).fwd_s));
  CHECK(price_op(mlp, cur).bwd_s - price_op(mlp, mx).bwd_s ==
        Approx(fp8_quantize(mlp, cur).bwd_s - fp8_quantize(mlp, mx).bwd_s));
}

TEST_CASE("Dense FP8 GEMM efficiency is per GPU where measured, else the one value under a warning", "[fp8]") {
  const Calibration& cal = default_calibration();
  topologies::GpuSpec gb200;
  gb200.name = "GB200";
  bool measured = false;
  const double e = fp8_dense_relative_efficiency(cal, gb200, &measured);
  CHECK(measured);
  CHECK(e == Approx(cal.fp8_dense_relative_eff.at("GB200")));
  topologies::GpuSpec other;
  other.name = "a GPU without an FP8 measurement";
  CHECK(fp8_dense_relative_efficiency(cal, other, &measured) == Approx(cal.fp8_gemm_relative_eff));
  CHECK_FALSE(measured);
  // Block-scaled kernels run below per-tensor ones; per-tensor recipes are the reference.
  CHECK(fp8_block_scaled_factor(cal, Fp8Recipe::kMxfp8) < 1.0);
  CHECK(fp8_block_scaled_factor(cal, Fp8Recipe::kCurrent) == 1.0);
}

TEST_CASE("A layout's fp8_recipe reads, writes back and orders step times", "[fp8][layout]") {
  nlohmann::json j = {{"tp", 8}, {"zero_stage", 0}, {"tokens_per_step", 65536}, {"recompute", "none"}, {"fp8", "linear"}};
  CHECK(parse_layout(j, "test").fp8_recipe == Fp8Recipe::kDelayed);  // the stated default
  j["fp8_recipe"] = "current";
  const Layout current = parse_layout(j, "test");
  CHECK(current.fp8_recipe == Fp8Recipe::kCurrent);
  CHECK(layout_to_json(current).at("fp8_recipe") == "current");
  CHECK(parse_layout(layout_to_json(current), "test").fp8_recipe == Fp8Recipe::kCurrent);
  j["fp8_recipe"] = "tensorwise";
  CHECK_THROWS_AS(parse_layout(j, "test"), UserError);

  // On an H100 (TN-only FP8 GEMMs) current scaling's extra amax pass makes the step slower
  // than delayed scaling; both are slower than the bare FP8 GEMMs would be.
  const auto g = models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-70b.json")));
  const auto c = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  const Predictor p(g, c, default_calibration());
  Layout delayed = current;
  delayed.fp8_recipe = Fp8Recipe::kDelayed;
  Layout bf16 = current;
  bf16.fp8 = Fp8Gemms::kNone;
  const double t_current = p.predict(current).step_time_s;
  const double t_delayed = p.predict(delayed).step_time_s;
  CHECK(t_current > t_delayed);
  CHECK(t_delayed < p.predict(bf16).step_time_s);  // FP8 still pays off at 70B
}

TEST_CASE("Per-tensor FP8 backward GEMMs run non-TN kernels where FP8 takes any layout", "[fp8]") {
  const auto t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const auto gb200 = topologies::load_system(src("topologies/zoo/gb200-nvl72.json")).gpu;
  const auto h100 = topologies::load_system(src("topologies/zoo/hgx-h100.json")).gpu;
  const OpEntry& mlp = find_op(t, models::OpKind::kSharedMlp);
  const Calibration& cal = default_calibration();
  REQUIRE(cal.fp8_non_tn_backward_relative_eff < 1.0);
  Calibration same_rate = cal;  // the backward GEMMs at the forward's rate
  same_rate.fp8_non_tn_backward_relative_eff = 1.0;

  // Backward GEMM time without the quantization passes and launches (both unchanged).
  const auto bwd_gemm_s = [&](const topologies::GpuSpec& gpu, const Calibration& c, Fp8Recipe r) {
    const PriceContext ctx = fp8_context(gpu, c, r);
    return price_op(mlp, ctx).bwd_s - fp8_quantize(mlp, ctx).bwd_s;
  };
  // GB200, per-tensor current scaling: dgrad and wgrad read the one row-wise copy (NN, NT),
  // so the compute-bound backward GEMMs take 1 / fp8_non_tn_backward_relative_efficiency longer.
  const double kernel_launches_s = 2.0 * (mlp.gemm_count + 1.0) * cal.launch_overhead_s;
  CHECK((bwd_gemm_s(gb200, cal, Fp8Recipe::kCurrent) - kernel_launches_s) ==
        Approx((bwd_gemm_s(gb200, same_rate, Fp8Recipe::kCurrent) - kernel_launches_s) / cal.fp8_non_tn_backward_relative_eff));
  CHECK(bwd_gemm_s(gb200, cal, Fp8Recipe::kDelayed) > bwd_gemm_s(gb200, same_rate, Fp8Recipe::kDelayed));
  // Block-scaled recipes quantize both directions: every GEMM is TN.
  CHECK(bwd_gemm_s(gb200, cal, Fp8Recipe::kMxfp8) == Approx(bwd_gemm_s(gb200, same_rate, Fp8Recipe::kMxfp8)));
  // Hopper transposes per-tensor operands: TN as well.
  CHECK(bwd_gemm_s(h100, cal, Fp8Recipe::kCurrent) == Approx(bwd_gemm_s(h100, same_rate, Fp8Recipe::kCurrent)));
  // The forward GEMM is TN everywhere.
  CHECK(price_op(mlp, fp8_context(gb200, cal, Fp8Recipe::kCurrent)).fwd_s ==
        Approx(price_op(mlp, fp8_context(gb200, same_rate, Fp8Recipe::kCurrent)).fwd_s));
}

TEST_CASE("MXFP8 against per-tensor FP8 GEMM time on Blackwell reproduces TE's B300 table", "[fp8]") {
  // Transformer Engine's GEMM profiling guide, pre-quantized, per layer on a B300:
  // per-tensor current scaling 6.812 ms (TN fprop, non-TN dgrad and wgrad), MXFP8 7.161 ms
  // (all TN). The two calibration entries split that ratio; together they must give it back.
  const auto t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const auto gb300 = topologies::load_system(src("topologies/zoo/gb300-nvl72.json")).gpu;
  const Calibration& cal = default_calibration();
  const OpEntry& mlp = find_op(t, models::OpKind::kSharedMlp);
  const auto gemm_s = [&](Fp8Recipe r) {  // forward + backward GEMMs alone (no passes, no launches)
    const PriceContext ctx = fp8_context(gb300, cal, r);
    const OpTime ot = price_op(mlp, ctx);
    const Fp8QuantizeTime q = fp8_quantize(mlp, ctx);
    return ot.fwd_s + ot.bwd_s - q.fwd_s - q.bwd_s - 3.0 * (mlp.gemm_count + 1.0) * cal.launch_overhead_s;
  };
  CHECK(gemm_s(Fp8Recipe::kMxfp8) / gemm_s(Fp8Recipe::kCurrent) == Approx(7.161 / 6.812).epsilon(0.002));
}

TEST_CASE("A compiled block casts the input its q, k and v projections share once; eager casts it per linear",
          "[fp8]") {
  const auto t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const auto sys = topologies::load_system(src("topologies/zoo/hgx-h200.json"));
  const Calibration compiled = stack_calibration(load_stack(stack_path("pytorch-fsdp")));
  const Calibration eager = stack_calibration(load_stack(stack_path("pytorch-fsdp-eager")));
  REQUIRE(compiled.dense_fp8_shared_input_once);
  REQUIRE_FALSE(eager.dense_fp8_shared_input_once);
  // Weights gathered as FP8: the forward casts only the inputs.
  PriceContext c = fp8_context(sys.gpu, compiled, Fp8Recipe::kCurrent);
  PriceContext e = fp8_context(sys.gpu, eager, Fp8Recipe::kCurrent);
  c.fp8_params = e.fp8_params = true;
  const double per_elem = fp8_quantize_bytes_per_elem(Fp8Recipe::kCurrent, true);  // H200: TN only
  int shared = 0;
  for (const OpEntry& op : t.classes.front().ops) {
    if (op.cls != models::OpClass::kGemm) continue;
    const Fp8QuantizeTime qc = fp8_quantize(op, c), qe = fp8_quantize(op, e);
    // The gradients differ per linear: cast for each, compiled or not.
    CHECK(qc.bwd_bytes == Approx(qe.bwd_bytes));
    if (!op.same_input_as_prev) {
      CHECK(qc.fwd_bytes == Approx(qe.fwd_bytes));
      continue;
    }
    // k and v read q's input: the compiled graph's one cast serves them (AOTAutograd's CSE).
    ++shared;
    CHECK(qc.fwd_bytes == 0.0);
    CHECK(qc.fwd_launches == 0.0);
    CHECK(qe.fwd_bytes == Approx(c.tokens * op.gemm_k * per_elem));
  }
  CHECK(shared == 2);
}

TEST_CASE("torchao casts an FP8 linear's weight every forward unless FSDP gathered it as FP8, and the dgrad copies it "
          "column-major",
          "[fp8][fp8_params]") {
  const auto t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const auto sys = topologies::load_system(src("topologies/zoo/hgx-h200.json"));
  const Calibration torchao = stack_calibration(load_stack(stack_path("pytorch-fsdp")));
  REQUIRE(torchao.dense_fp8_weight_cast_per_pass);
  REQUIRE_FALSE(default_calibration().dense_fp8_weight_cast_per_pass);
  const PriceContext cast = fp8_context(sys.gpu, torchao, Fp8Recipe::kCurrent);
  PriceContext gathered = cast;
  gathered.fp8_params = true;
  const PriceContext none = fp8_context(sys.gpu, default_calibration(), Fp8Recipe::kCurrent);
  const OpEntry& mlp = find_op(t, models::OpKind::kSharedMlp);
  const Fp8QuantizeTime c = fp8_quantize(mlp, cast), g = fp8_quantize(mlp, gathered), n = fp8_quantize(mlp, none);
  // Forward: the bf16 weight's amax (2 B) and its cast (2 B read, 1 B written); none when it arrives FP8.
  CHECK(c.fwd_bytes - n.fwd_bytes == Approx(mlp.param_elems * 5.0));
  CHECK(g.fwd_bytes == Approx(n.fwd_bytes));
  // Backward: the column-major copy of the FP8 weight (1 B read, 1 B written), either way.
  CHECK(c.bwd_bytes - n.bwd_bytes == Approx(mlp.param_elems * 2.0));
  CHECK(g.bwd_bytes == Approx(c.bwd_bytes));
  // The LM head stays BF16: no weight passes.
  CHECK(fp8_quantize(find_op(t, models::OpKind::kLmHead), cast).fwd_bytes == 0.0);
}
