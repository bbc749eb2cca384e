// Dense GEMM rates per GPU (sim/calibration.json gemm.peak_efficiency, priced in
// sim/cost.cpp): a tensor-core GEMM runs at the clock the board's power limit
// sustains, so two GPUs with the same datasheet peak can differ in the rate the
// predictor gives them. The GB300 (1.4 kW) against the GB200 (1.2 kW) is the case.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "sim/predict.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

// One micro-batch of 16,384 tokens on one GPU, BF16 or FP8 (per-tensor current scaling) GEMMs.
PriceContext gemm_context(const topologies::GpuSpec& gpu, const Calibration& cal, bool fp8) {
  PriceContext ctx = device_price_context(gpu, cal);
  ctx.tokens = 16384;
  ctx.seq = 8192;
  if (fp8) {
    ctx.fp8_linear = true;
    ctx.fp8_recipe = Fp8Recipe::kCurrent;
  }
  return ctx;
}

// The shipped calibration without its measured shape tables: every GPU on the half_dim curve.
Calibration half_dim_only(const Calibration& cal) {
  Calibration c = cal;
  c.gemm_shape_by_gpu.clear();
  return c;
}

}  // namespace

TEST_CASE("A GB300 runs the same GEMM faster than a GB200 at equal datasheet peaks (its power limit)", "[gemm]") {
  const auto t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const auto gb200 = topologies::load_system(src("topologies/zoo/gb200-nvl72.json")).gpu;
  const auto gb300 = topologies::load_system(src("topologies/zoo/gb300-nvl72.json")).gpu;
  const Calibration& cal = default_calibration();
  // Same datasheet tensor peaks, more board power: the difference is the rate sustained.
  REQUIRE(gb300.peak_bf16_flops_per_s == gb200.peak_bf16_flops_per_s);
  REQUIRE(gb300.peak_fp8_flops_per_s == gb200.peak_fp8_flops_per_s);
  REQUIRE(gb300.power_w > gb200.power_w);

  const OpEntry& mlp = find_op(t, models::OpKind::kSharedMlp);
  const OpTime bf16_200 = price_op(mlp, gemm_context(gb200, cal, false));
  const OpTime bf16_300 = price_op(mlp, gemm_context(gb300, cal, false));
  // The measured maximum cuBLAS rates at rated power: GB300 2,174 TF, GB200 1,822 TF
  // (the sources of gemm.peak_efficiency.GB300). The MLP's GEMMs are compute-bound, so
  // its time scales by their ratio; the few kernel launches keep it within 1%.
  const double measured_ratio = 2174.0 / 1822.0;
  CHECK(bf16_200.fwd_s / bf16_300.fwd_s == Approx(measured_ratio).epsilon(0.01));
  CHECK(bf16_200.bwd_s / bf16_300.bwd_s == Approx(measured_ratio).epsilon(0.01));

  // FP8 GEMMs share the power limit; the quantization passes are HBM-bound and cost the same.
  const PriceContext fp8_200 = gemm_context(gb200, cal, true);
  const PriceContext fp8_300 = gemm_context(gb300, cal, true);
  const double q200 = fp8_quantize(mlp, fp8_200).fwd_s, q300 = fp8_quantize(mlp, fp8_300).fwd_s;
  CHECK(q300 == Approx(q200));
  CHECK(price_op(mlp, fp8_300).fwd_s - q300 < price_op(mlp, fp8_200).fwd_s - q200);
}

TEST_CASE("An H100 SXM's GEMMs are priced at the rate it sustains at its power limit, not its burst rate", "[gemm]") {
  const auto h100 = topologies::load_system(src("topologies/zoo/hgx-h100.json")).gpu;
  const Calibration& sustained = default_calibration();
  // cuBLAS BF16 8192^3 measured twice on an H100 SXM at 700 W (the sources of
  // gemm.sustained_ratio.H100-SXM): 797.8 TF over 11 ms after a 5 s rest, ~730 TF averaged
  // over 60 s of back-to-back launches. A training step is the second case.
  const double burst_flops_per_s = 797.8e12, sustained_flops_per_s = 730e12;
  const double rate = gemm_efficiency(sustained, h100, 8192, 8192, 8192) * h100.peak_bf16_flops_per_s;
  CHECK(rate == Approx(sustained_flops_per_s).epsilon(0.005));
  CHECK(rate < burst_flops_per_s);

  // Priced: the MLP's compute-bound GEMMs take 1 / ratio longer than at the 8192^3 share alone.
  Calibration burst = sustained;
  burst.gemm_sustained_ratio.erase(h100.name);
  const double ratio = sustained.gemm_sustained_ratio.at(h100.name);
  const auto t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const OpEntry& mlp = find_op(t, models::OpKind::kSharedMlp);
  const OpTime with = price_op(mlp, gemm_context(h100, sustained, false));
  const OpTime without = price_op(mlp, gemm_context(h100, burst, false));
  CHECK(with.fwd_s / without.fwd_s == Approx(1.0 / ratio).epsilon(0.01));
  CHECK(with.bwd_s / without.bwd_s == Approx(1.0 / ratio).epsilon(0.01));
}

TEST_CASE("An H100 held at 500 W takes the GEMM rates measured at that limit, everything else the H100's", "[gemm]") {
  const Calibration cal = load_calibration();
  const auto h100 = topologies::load_system(src("topologies/zoo/hgx-h100.json")).gpu;
  const auto grand_teton = topologies::load_system(src("topologies/zoo/grand-teton-h100.json")).gpu;
  REQUIRE(grand_teton.name == h100.name);
  REQUIRE(grand_teton.power_w == 500);
  CHECK(gpu_power_key(grand_teton) == "H100-SXM@500W");
  // The entries at 500 W replace the H100's: BF16 slower, FP8 keeps more of its peak.
  const double at_500w = gemm_peak_efficiency(cal, grand_teton), at_700w = gemm_peak_efficiency(cal, h100);
  CHECK(at_500w == Approx(cal.gemm_peak_eff.at("H100-SXM@500W") * cal.gemm_sustained_ratio.at("H100-SXM@500W")));
  CHECK(at_500w < at_700w);
  CHECK(fp8_dense_relative_efficiency(cal, grand_teton) > fp8_dense_relative_efficiency(cal, h100));
  // A GPU whose limit has no entries keeps its own (the HGX H100's 700 W).
  CHECK(at_700w == Approx(cal.gemm_peak_eff.at("H100-SXM") * cal.gemm_sustained_ratio.at("H100-SXM")));
  // The shape table is the H100's: the same relative fall at a small shape.
  CHECK(gemm_efficiency(cal, grand_teton, 1024, 1024, 1024) / at_500w ==
        Approx(gemm_efficiency(cal, h100, 1024, 1024, 1024) / at_700w));
  // Priced: a BF16 MLP's compute-bound GEMMs take the rates' ratio longer on the 500 W part.
  const auto t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const OpEntry& mlp = find_op(t, models::OpKind::kSharedMlp);
  const OpTime capped = price_op(mlp, gemm_context(grand_teton, cal, false));
  const OpTime rated = price_op(mlp, gemm_context(h100, cal, false));
  CHECK(capped.fwd_s / rated.fwd_s == Approx(at_700w / at_500w).epsilon(0.01));
}

TEST_CASE("An H100's GEMM shape factor is XLA's measured sm_90 table, normalised at its largest shape", "[gemm]") {
  const auto h100 = topologies::load_system(src("topologies/zoo/hgx-h100.json")).gpu;
  const auto h200 = topologies::load_system(src("topologies/zoo/hgx-h200.json")).gpu;
  const auto gb200 = topologies::load_system(src("topologies/zoo/gb200-nvl72.json")).gpu;
  const Calibration& cal = default_calibration();
  const Calibration half_dim = half_dim_only(cal);
  REQUIRE(gemm_shape_table(cal, h100) != nullptr);
  CHECK(gemm_shape_table(cal, h200) != nullptr);
  CHECK(gemm_shape_table(cal, gb200) != gemm_shape_table(cal, h100));  // Blackwell has its own (sm_100)

  // The table's rates (gemm.shape_tables.sm_90, TFLOP/s): 4096^3 783.3, 4096 x 4096 x 256 392.2,
  // 2048 x 4096 x 4096 753.6, 4096 x 4096 x 2048 738.7.
  const auto eff = [&](const Calibration& c, double m, double n, double k) { return gemm_efficiency(c, h100, m, n, k); };
  CHECK(eff(cal, 4096, 4096, 256) / eff(cal, 4096, 4096, 4096) == Approx(392.2 / 783.3).epsilon(0.001));
  // A small-K GEMM (a TP-split projection) is slower than the half_dim curve priced it...
  CHECK(eff(cal, 4096, 4096, 256) < 0.8 * eff(half_dim, 4096, 4096, 256));  // burst: 392 TF measured, 507 priced by half_dim
  // ...while the large shape keeps peak_efficiency x sustained_ratio: 1 at and beyond 4096.
  CHECK(eff(cal, 8192, 8192, 8192) == Approx(eff(half_dim, 8192, 8192, 8192)));
  CHECK(eff(cal, 4096, 4096, 4096) == Approx(eff(cal, 16384, 8192, 4096)));
  // Between grid points: linear in ln(dimension), e.g. M halfway from 2048 to 4096 in log.
  const double m_mid = std::sqrt(2048.0 * 4096.0);
  CHECK(eff(cal, m_mid, 4096, 4096) / eff(cal, 4096, 4096, 4096) == Approx((753.6 / 783.3 + 1.0) / 2).epsilon(0.001));
  // Below the smallest dimension the half_dim curve carries the fall from the table's edge.
  const double h = cal.gemm_half_dim;
  CHECK(eff(cal, 128, 4096, 4096) / eff(cal, 256, 4096, 4096) == Approx((128 / (128 + h)) / (256 / (256 + h))));
}

TEST_CASE("A Blackwell GPU's GEMM shape factor is XLA's measured B200 table: small experts run below the half_dim curve", "[gemm]") {
  const auto b200 = topologies::load_system(src("topologies/zoo/dgx-b200.json")).gpu;
  const auto gb200 = topologies::load_system(src("topologies/zoo/gb200-nvl72.json")).gpu;
  const auto gb300 = topologies::load_system(src("topologies/zoo/gb300-nvl72.json")).gpu;
  const Calibration& cal = default_calibration();
  const Calibration half_dim = half_dim_only(cal);
  for (const auto* gpu : {&b200, &gb200, &gb300}) REQUIRE(gemm_shape_table(cal, *gpu) != nullptr);

  // The table's rates (gemm.shape_tables.sm_100, TFLOP/s): 4096^3 1,416.9, 4096 x 1024 x 2048
  // 990.3, 4096 x 2048 x 512 652.3 (M x N x K). A Qwen3-30B-A3B expert (K 2048, N 768 x 2 for
  // fc1; K 768 for fc2) sits at these shapes, which the half_dim curve priced at 0.85 and 0.77.
  for (const auto* gpu : {&b200, &gb200, &gb300}) {
    const auto eff = [&](const Calibration& c, double m, double n, double k) { return gemm_efficiency(c, *gpu, m, n, k); };
    CHECK(eff(cal, 4096, 1024, 2048) / eff(cal, 4096, 4096, 4096) == Approx(990.3 / 1416.9).epsilon(0.001));
    CHECK(eff(cal, 4096, 2048, 512) / eff(cal, 4096, 4096, 4096) == Approx(652.3 / 1416.9).epsilon(0.001));
    CHECK(eff(cal, 4096, 1024, 2048) < 0.85 * eff(half_dim, 4096, 1024, 2048));
    CHECK(eff(cal, 4096, 2048, 512) < 0.65 * eff(half_dim, 4096, 2048, 512));
    // The large shape keeps the GPU's measured peak: the table only shapes below it.
    CHECK(eff(cal, 8192, 8192, 8192) == Approx(eff(half_dim, 8192, 8192, 8192)));
  }

  // Priced: the routed experts of one Qwen3-30B-A3B layer on a B200 (16 local experts of
  // 8,192 rows each, the DGX-B200 MBS 1 run) take longer than the half_dim curve said.
  const auto t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/qwen3-30b-a3b.json"))));
  const OpEntry& experts = find_op(t, models::OpKind::kExpertMlp);
  const auto ctx = [&](const Calibration& c) {
    PriceContext x = device_price_context(b200, c);
    x.tokens = 4096;
    x.seq = 4096;
    x.expert_rows = 8.0 * 4096.0 * 8.0;
    x.local_experts = 16;
    return x;
  };
  const OpTime measured_shape = price_op(experts, ctx(cal)), on_curve = price_op(experts, ctx(half_dim));
  CHECK(measured_shape.fwd_s > 1.1 * on_curve.fwd_s);
  CHECK(measured_shape.bwd_s > 1.1 * on_curve.bwd_s);
}

TEST_CASE("A GEMM shape table that is not a full grid of positive rates is a one-line user error", "[gemm]") {
  nlohmann::json doc = load_json_file(default_calibration_path());
  CHECK(parse_calibration(doc, "test.json").gemm_shape_by_gpu.count("H100-SXM") == 1);
  nlohmann::json bad = doc;
  bad["gemm"]["shape_tables"]["sm_90"]["bf16_tflops"]["value"][1][2].erase(0);
  CHECK_THROWS_AS(parse_calibration(bad, "test.json"), UserError);
  bad = doc;
  bad["gemm"]["shape_tables"]["sm_90"]["bf16_tflops"]["value"][0][0][0] = 0;
  CHECK_THROWS_AS(parse_calibration(bad, "test.json"), UserError);
  bad = doc;
  bad["gemm"]["shape_tables"]["sm_90"]["dims"]["value"] = {512, 256, 1024, 2048, 4096};
  CHECK_THROWS_AS(parse_calibration(bad, "test.json"), UserError);
}
