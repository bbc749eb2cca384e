// Attention kernels priced by sequence length (issue 13, sim/calibration.json
// attention_kernels, sim/calibration.h AttentionKernelCurve): a flash kernel's rate rises with
// the sequence (fixed costs per (batch, head) and per query tile, causal diagonal tiles), as
// the FlashAttention-2 paper's benchmarks show from 512 to 16k tokens, and beyond 16k keeps
// rising toward the asymptote those fixed costs imply (attention_kernel_tail). A stack that names its
// kernel (attention.kernel) prices attention on that curve; one that does not (Marin's) keeps
// its flat efficiencies.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "sim/calibration.h"
#include "sim/cost.h"
#include "sim/stack.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;
using json = nlohmann::json;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

// sim/calibration.json with the attention block naming `kernel`.
Calibration with_kernel(const std::string& kernel) {
  json doc = load_json_file(src("sim/calibration.json"));
  doc["attention"]["kernel"] = {{"value", kernel}, {"source", "test"}};
  return parse_calibration(doc, "test.json");
}

// One micro-batch of 64k tokens in sequences of `seq` of Llama 3 8B (head dim 128) on `topo`'s GPU.
struct Priced {
  topologies::SystemSpec sys;
  OpTable t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));

  explicit Priced(const std::string& topo) : sys(topologies::load_system(src("topologies/zoo/" + topo + ".json"))) {}

  // Seconds per attention FLOP of forward + backward.
  double s_per_flop(const Calibration& cal, double seq) const {
    PriceContext c = device_price_context(sys.gpu, cal);
    c.tokens = 65536;
    c.seq = seq;
    const OpTime o = price_op(find_op(t, models::OpKind::kAttention), c);
    return (o.fwd_s + o.bwd_s) / (o.fwd_flops + o.bwd_flops);
  }
};

}  // namespace

TEST_CASE("an attention kernel's curve rises with the sequence, interpolated in log length and head dim", "[attention_kernels]") {
  const Calibration cal = load_calibration();
  const Calibration::AttentionKernelCurve& fa2 = cal.attention_kernels.at("flash_attention_2").at("A100-SXM4-80GB");
  const auto fb = [&](double seq, double hd) {  // fwd + bwd efficiency of the split
    const Calibration::AttentionEfficiency e = attention_kernel_efficiency(fa2, seq, hd);
    return 3.5 / (1.0 / e.fwd + 2.5 / e.bwd);
  };
  // The published points (FlashAttention-2 paper, A100, causal, head dim 128): 99 TF/s at 512,
  // 155 at 2k, 182 at 8k, of 312.
  CHECK(fb(512, 128) == Approx(99.0 / 312.0).epsilon(1e-3));
  CHECK(fb(2048, 128) == Approx(155.0 / 312.0).epsilon(1e-3));
  CHECK(fb(8192, 128) == Approx(182.0 / 312.0).epsilon(1e-3));
  CHECK(fb(512, 128) < fb(2048, 128));
  CHECK(fb(2048, 128) < fb(8192, 128));
  // Halfway in log length between 1k and 2k, halfway in value; held beyond 512 and 16k.
  CHECK(fb(std::sqrt(1024.0 * 2048.0), 128) == Approx((133.0 + 155.0) / 2.0 / 312.0).epsilon(1e-3));
  CHECK(fb(128, 128) == Approx(fb(512, 128)));
  // Head dim 96: halfway between the 64 and 128 curves.
  CHECK(fb(2048, 96) == Approx((140.0 + 155.0) / 2.0 / 312.0).epsilon(1e-3));
  // The split keeps the fwd + bwd time and the forward over backward rate.
  const Calibration::AttentionEfficiency e = attention_kernel_efficiency(fa2, 4096, 128);
  CHECK(e.fwd / e.bwd == Approx(fa2.fwd_over_bwd_rate));
}

TEST_CASE("beyond its longest length a curve rises toward the asymptote of its fixed costs, as the published bars do",
          "[attention_kernels]") {
  const Calibration cal = load_calibration();
  const auto fb = [](const Calibration::AttentionKernelCurve& k, double seq, double hd) {
    const Calibration::AttentionEfficiency e = attention_kernel_efficiency(k, seq, hd);
    return 3.5 / (1.0 / e.fwd + 2.5 / e.bwd);
  };
  // FlashAttention-2, A100, causal, head dim 128: 182 TF/s at 8k, 189 at 16k (of 312). Through
  // them 1 / e = a + b / S: b = (312/182 - 312/189) / (1/8192 - 1/16384), a = 312/189 - b / 16384
  // (to 1e-3: the file stores the bars as fractions of the peak to 4 digits).
  const Calibration::AttentionKernelCurve& fa2 = cal.attention_kernels.at("flash_attention_2").at("A100-SXM4-80GB");
  const double b = (312.0 / 182.0 - 312.0 / 189.0) / (1.0 / 8192.0 - 1.0 / 16384.0);
  const double a = 312.0 / 189.0 - b / 16384.0;
  CHECK(fb(fa2, 32768, 128) == Approx(1.0 / (a + b / 32768.0)).epsilon(1e-3));
  CHECK(fb(fa2, 32768, 128) > fb(fa2, 16384, 128));
  CHECK(fb(fa2, 262144, 128) > fb(fa2, 32768, 128));
  CHECK(fb(fa2, 1e12, 128) == Approx(1.0 / a).epsilon(1e-3));
  // Backtest on every published panel: each curve cut at 8k, carried to 16k, meets the 16k bar
  // within 4% (holding the 8k bar misses by 1.4-6.1%), and misses it by less than half as
  // much as holding, summed over the panels.
  double tail_miss = 0, held_miss = 0;
  for (const char* kernel : {"flash_attention_2", "flash_attention_triton"}) {
    for (const char* gpu : {"A100-SXM4-80GB", "H100-SXM"}) {
      const Calibration::AttentionKernelCurve& full = cal.attention_kernels.at(kernel).at(gpu);
      for (const auto& [hd, points] : full.fwd_bwd_eff_by_ln_seq) {
        // The Triton kernel's head-dim-128 curves are fitted from 8k up to llm-foundry's own
        // runs (tests/validation/llm-foundry-mpt.json, role fitted): no published panel.
        if (std::string(kernel) == "flash_attention_triton" && hd == 128) continue;
        Calibration::AttentionKernelCurve cut = full;
        cut.fwd_bwd_eff_by_ln_seq = {{hd, std::vector<std::pair<double, double>>(points.begin(), points.end() - 1)}};
        REQUIRE(std::exp(points.back().first) == Approx(16384));
        const double bar = points.back().second, carried = fb(cut, 16384, hd);
        CHECK(carried == Approx(bar).epsilon(0.04));
        tail_miss += std::abs(carried / bar - 1.0);
        held_miss += std::abs(points[points.size() - 2].second / bar - 1.0);
      }
    }
  }
  CHECK(tail_miss < 0.5 * held_miss);
}

TEST_CASE("a curve whose last two points rise faster than any finite rate allows is one error naming its path",
          "[attention_kernels]") {
  json doc = load_json_file(src("sim/calibration.json"));
  // 8k at 0.3, 16k at 0.7: 1 / e = a + b / S through them has a < 0 (no finite asymptote).
  json& curve = doc["attention_kernels"]["flash_attention_2"]["per_gpu"]["H100-SXM"]["fwd_bwd_efficiency"]["128"];
  curve["8192"]["value"] = 0.3;
  curve["16384"]["value"] = 0.7;
  CHECK_THROWS_WITH(parse_calibration(doc, "t.json"),
                    Catch::Contains("/attention_kernels/flash_attention_2/per_gpu/H100-SXM/fwd_bwd_efficiency/128"));
}

TEST_CASE("a calibration naming its attention kernel prices attention on the kernel's curve", "[attention_kernels]") {
  const Priced a100("dgx-a100-80gb");
  const Calibration flat = load_calibration();
  const Calibration fa2 = with_kernel("flash_attention_2");
  CHECK(flat.attention_kernel.empty());
  // Flat: the same time per attention FLOP at every length.
  CHECK(a100.s_per_flop(flat, 512) == Approx(a100.s_per_flop(flat, 16384)).epsilon(0.01));
  // The kernel: cheaper per FLOP the longer the sequence, at the curve's rate.
  CHECK(a100.s_per_flop(fa2, 512) > 1.5 * a100.s_per_flop(fa2, 16384));
  const double peak = a100.sys.gpu.peak_bf16_flops_per_s;
  CHECK(1.0 / (a100.s_per_flop(fa2, 16384) * peak) == Approx(189.0 / 312.0).epsilon(0.02));
  // A GPU the kernel was not measured on runs at the flat efficiencies.
  const Priced b200("dgx-b200");
  CHECK(b200.s_per_flop(fa2, 2048) == Approx(b200.s_per_flop(flat, 2048)));
}

TEST_CASE("attention kernels: Marin keeps its flat rates; a bad kernel entry is one error naming its path", "[attention_kernels]") {
  for (const char* s : {"marin-july-2026", "marin-hero-late", "marin-hero-later", "megatron-bridge-2025"}) {
    CHECK(stack_calibration(load_stack(stack_path(s))).attention_kernel.empty());
  }
  json doc = load_json_file(src("sim/calibration.json"));
  json unknown = doc;
  unknown["attention"]["kernel"] = {{"value", "no_such_kernel"}, {"source", "test"}};
  CHECK_THROWS_WITH(parse_calibration(unknown, "t.json"), Catch::Contains("/attention/kernel/value"));
  // The curve holds the diagonal tiles: a tile count beside it would count them twice.
  json tiled = doc;
  tiled["attention"]["kernel"] = {{"value", "flash_attention_2"}, {"source", "test"}};
  tiled["attention"]["tile_tokens"] = {{"value", 128}, {"source", "test"}};
  CHECK_THROWS_WITH(parse_calibration(tiled, "t.json"), Catch::Contains("/attention/tile_tokens"));
  json bad_seq = doc;
  bad_seq["attention_kernels"]["flash_attention_2"]["per_gpu"]["H100-SXM"]["fwd_bwd_efficiency"]["128"]["long"] = {
      {"value", 0.3}, {"source", "test"}};
  CHECK_THROWS_WITH(parse_calibration(bad_seq, "t.json"),
                    Catch::Contains("/attention_kernels/flash_attention_2/per_gpu/H100-SXM/fwd_bwd_efficiency/128/long"));
}

TEST_CASE("a stack file extends another: llm-foundry is pytorch-fsdp with its Triton attention kernel", "[attention_kernels][stack]") {
  const Stack base = load_stack(stack_path("pytorch-fsdp"));
  const Stack foundry = load_stack(stack_path("llm-foundry"));
  CHECK(foundry.name == "llm-foundry");
  CHECK(foundry.supports.zero_stages == base.supports.zero_stages);
  const Calibration b = stack_calibration(base), f = stack_calibration(foundry);
  CHECK(f.attention_kernel == "flash_attention_triton");
  // Everything else of pytorch-fsdp's calibration comes along (its compiled dense MLP activation).
  CHECK(f.dense_act_fwd_bytes == b.dense_act_fwd_bytes);
  CHECK(f.dense_act_fwd_bytes > 0);
  // Priced: on A100 the Triton curve, not the flat rates pytorch-fsdp keeps without a kernel.
  const Priced a100("dgx-a100-80gb");
  CHECK(a100.s_per_flop(f, 2048) != Approx(a100.s_per_flop(b, 2048)));
}
