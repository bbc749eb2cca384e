// Burst benchmarks against a training step's sustained load (issue 13, calibration
// attention.per_gpu.<GPU>.sustained_ratio, sim/calibration.cpp attention_efficiency): a
// kernel benchmark of a few milliseconds runs at the boost clock, while a training step
// keeps the tensor cores busy for seconds and a GPU whose power limit is below their draw
// at that clock slows to the clock the limit holds (flashinfer PR #2899 on a B200). A
// per-GPU attention figure measured in bursts is priced at its sustained share.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <string>

#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "sim/calibration.h"
#include "sim/cost.h"
#include "sim/stack.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;
using nlohmann::json;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

topologies::GpuSpec gpu_of(const char* system) { return topologies::load_system(src("topologies/zoo/") + system + ".json").gpu; }

// Llama 3 8B's attention (32 heads of 128, GQA 8) on one micro-batch of two 8,192-token sequences.
PriceContext llama_ctx(const Calibration& cal, const topologies::GpuSpec& gpu) {
  PriceContext c = device_price_context(gpu, cal);
  c.tokens = 16384;
  c.seq = 8192;
  return c;
}

}  // namespace

TEST_CASE("Megatron-Bridge's Blackwell attention figures are burst rates with a sustained share below 1", "[sustained_clock]") {
  const Calibration cal = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  for (const char* g : {"B200", "GB200", "GB300"}) {
    INFO(g);
    REQUIRE(cal.attention_eff_by_gpu.count(g) == 1);
    CHECK(cal.attention_eff_by_gpu.at(g).sustained_ratio < 1.0);
  }
  // Hopper's stack-wide figure has no burst entry; Marin's calibration has no per-GPU entries.
  const topologies::GpuSpec h100 = gpu_of("hgx-h100");
  CHECK(attention_efficiency(cal, h100).fwd == cal.attention_fwd_eff);
  CHECK(attention_efficiency(cal, h100).bwd == cal.attention_bwd_eff);
  CHECK(default_calibration().attention_eff_by_gpu.empty());
}

TEST_CASE("A burst-measured attention rate is priced at its sustained share, once", "[sustained_clock]") {
  const Calibration sustained = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  Calibration burst = sustained;
  for (auto& [gpu, e] : burst.attention_eff_by_gpu) e.sustained_ratio = 1.0;
  const topologies::GpuSpec b200 = gpu_of("dgx-b200");
  const Calibration::AttentionEfficiency& entry = sustained.attention_eff_by_gpu.at("B200");
  const double ratio = entry.sustained_ratio;

  // The efficiency the op runs at: the entry's figures times the ratio, and the result is
  // a sustained rate (its own ratio 1, so nothing downstream applies it again).
  const Calibration::AttentionEfficiency eff = attention_efficiency(sustained, b200);
  CHECK(eff.fwd == Approx(entry.fwd * ratio).epsilon(1e-12));
  CHECK(eff.bwd == Approx(entry.bwd * ratio).epsilon(1e-12));
  CHECK(eff.sustained_ratio == 1.0);
  CHECK(attention_efficiency(burst, b200).fwd == entry.fwd);

  // Priced: Llama 3 8B's attention at seq 8192 is compute-bound, so its kernel time (the
  // launches aside) grows by 1 / ratio; its FLOPs do not change.
  const OpTable t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const OpEntry& attn = find_op(t, models::OpKind::kAttention);
  const OpTime with = price_op(attn, llama_ctx(sustained, b200));
  const OpTime without = price_op(attn, llama_ctx(burst, b200));
  const double launch = sustained.launch_overhead_s;
  CHECK((with.fwd_s - launch) / (without.fwd_s - launch) == Approx(1.0 / ratio).epsilon(1e-9));
  CHECK((with.bwd_s - 2.0 * launch) / (without.bwd_s - 2.0 * launch) == Approx(1.0 / ratio).epsilon(1e-9));
  CHECK(with.fwd_flops == without.fwd_flops);
  CHECK(with.bwd_flops == without.bwd_flops);

  // The GEMMs keep their rate: the ratio belongs to the attention figures it was measured with.
  const OpEntry& mlp = find_op(t, models::OpKind::kSharedMlp);
  CHECK(price_op(mlp, llama_ctx(sustained, b200)).fwd_s == price_op(mlp, llama_ctx(burst, b200)).fwd_s);
}

TEST_CASE("A sustained share outside (0, 1] is one error naming its path", "[sustained_clock]") {
  json doc = load_json_file(src("sim/calibration.json"));
  doc.merge_patch(load_json_file(src("sim/stacks/megatron-bridge-2025.json"))["calibration"]);
  json bad = doc;
  bad["attention"]["per_gpu"]["B200"]["sustained_ratio"]["value"] = 1.2;
  CHECK_THROWS_WITH(parse_calibration(bad, "bad.json"), Catch::Contains("/attention/per_gpu/B200/sustained_ratio"));
  // Without the key, the figures are sustained rates.
  json plain = doc;
  plain["attention"]["per_gpu"]["B200"].erase("sustained_ratio");
  CHECK(parse_calibration(plain, "plain.json").attention_eff_by_gpu.at("B200").sustained_ratio == 1.0);
}

TEST_CASE("A B200's GEMMs are priced at the share of their figure it sustains; other GPUs keep theirs", "[sustained_clock]") {
  const Calibration& cal = default_calibration();
  Calibration burst = cal;
  burst.gemm_sustained_ratio.clear();
  const topologies::GpuSpec b200 = gpu_of("dgx-b200"), gb200 = gpu_of("gb200-nvl72"), h200 = gpu_of("hgx-h200");
  REQUIRE(cal.gemm_sustained_ratio.count("B200") == 1);
  const double ratio = cal.gemm_sustained_ratio.at("B200");
  CHECK(ratio < 1.0);
  CHECK(gemm_peak_efficiency(cal, b200) == Approx(cal.gemm_peak_eff.at("B200") * ratio).epsilon(1e-12));
  CHECK(gemm_peak_efficiency(burst, b200) == cal.gemm_peak_eff.at("B200"));
  // GB200 and GB300 have more power than the part the share was measured on; H200 has no
  // sustained measurement (H100 SXM's share: tests/sim_gemm_rate.cpp).
  CHECK(gemm_peak_efficiency(cal, gb200) == cal.gemm_peak_eff.at("GB200"));
  CHECK(gemm_peak_efficiency(cal, h200) == cal.gemm_peak_eff.at("H200"));

  // Priced: Llama 3 8B's query projection (16,384 x 4,096 x 4,096) is compute-bound,
  // so its GEMM time (the launches aside) grows by 1 / ratio.
  const OpTable t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const OpEntry& proj = find_op(t, models::OpKind::kLinear);
  const OpTime with = price_op(proj, llama_ctx(cal, b200));
  const OpTime without = price_op(proj, llama_ctx(burst, b200));
  const double launches = cal.launch_overhead_s * (proj.gemm_count + (proj.ew_flops_per_token > 0 ? 1.0 : 0.0));
  CHECK((with.fwd_s - launches) / (without.fwd_s - launches) == Approx(1.0 / ratio).epsilon(1e-9));
  CHECK((with.bwd_s - 2.0 * launches) / (without.bwd_s - 2.0 * launches) == Approx(1.0 / ratio).epsilon(1e-9));
  CHECK(with.fwd_flops == without.fwd_flops);
}
