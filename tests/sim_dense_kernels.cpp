// Dense-layer kernels an eager trainer runs beside its GEMMs (issue 13, calibration block
// `dense_kernels`, sim/cost.cpp): Megatron's MLP runs its activation (fused bias-GeLU or
// bias-SwiGLU) as a kernel of its own between fc1 and fc2, a pass over the fc1 output
// that the GEMMs' roofline does not see. A compiled step (the base calibration) adds none.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/check.h"
#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "sim/stack.h"
#include "tests/sim_llama8b.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

}  // namespace

TEST_CASE("The base calibration prices no dense activation pass; Megatron stacks do", "[dense_kernels]") {
  const Calibration& base = default_calibration();
  CHECK(base.dense_act_fwd_bytes == 0);
  CHECK(base.dense_act_bwd_bytes == 0);
  for (const char* s : {"megatron-bridge-2025", "megatron-lm", "megatron-lm-2021", "megatron-lm-2022", "megatron-deepspeed-2021"}) {
    const Calibration c = stack_calibration(load_stack(stack_path(s)));
    INFO(s);
    CHECK(c.dense_act_fwd_bytes > 0);
    CHECK(c.dense_act_bwd_bytes > c.dense_act_fwd_bytes);  // the backward also reads the saved fc1 output
  }
}

TEST_CASE("A dense MLP's activation kernel adds its HBM traffic over the fc1 output, per GPU", "[dense_kernels]") {
  const Llama8b m("topologies/zoo/dgx-b200.json");  // a B200
  Calibration off_cal = default_calibration();
  Calibration on_cal = off_cal;
  on_cal.dense_act_fwd_bytes = 3.0;  // bias_swiglu_impl: reads [h1|h3], writes h
  on_cal.dense_act_bwd_bytes = 5.0;  // reads dh and [h1|h3], writes d[h1|h3]
  const OpEntry& mlp = find_op(m.t, models::OpKind::kSharedMlp);
  const double width = 14336.0;
  for (const double tp : {1.0, 4.0}) {
    const PriceContext off = m.ctx(off_cal, 16384, tp), on = m.ctx(on_cal, 16384, tp);
    const double bw = on.hbm_bw_bytes_per_s * on_cal.mem_eff_elementwise;
    const double fc1 = 16384.0 * 2.0 * width / tp;  // gated: h1 and h3, split over tp
    INFO("tp " << tp);
    CHECK(price_op(mlp, on).fwd_s - price_op(mlp, off).fwd_s == Approx(fc1 * 3.0 / bw).epsilon(1e-9));
    CHECK(price_op(mlp, on).bwd_s - price_op(mlp, off).bwd_s == Approx(fc1 * 5.0 / bw).epsilon(1e-9));
  }
  // It grows with the tokens: twice the micro-batch, twice the added time.
  const PriceContext off2 = m.ctx(off_cal, 32768), on2 = m.ctx(on_cal, 32768);
  const PriceContext off1 = m.ctx(off_cal), on1 = m.ctx(on_cal);
  CHECK(price_op(mlp, on2).fwd_s - price_op(mlp, off2).fwd_s ==
        Approx(2.0 * (price_op(mlp, on1).fwd_s - price_op(mlp, off1).fwd_s)).epsilon(1e-9));
  // Linear layers (no activation) do not see it.
  const OpEntry& lin = find_op(m.t, models::OpKind::kLinear);
  CHECK(price_op(lin, on1).fwd_s == price_op(lin, off1).fwd_s);
  CHECK(price_op(lin, on1).bwd_s == price_op(lin, off1).bwd_s);
}

TEST_CASE("Megatron's GeLU MLP: two GEMMs of h x 4h, its fused bias-GeLU over the 4h fc1 output", "[dense_kernels]") {
  // Megatron-LM 2021 (megatron/model/transformer.py ParallelMLP): dense_h_to_4h, bias_gelu
  // (megatron/model/fused_bias_gelu.py: reads the 4h fc1 output, writes the 4h activation;
  // backward reads the gradient and the saved input, writes the input gradient, and the
  // bias gradient sums it), dense_4h_to_h. GPT 1.7B: h 2304.
  const OpTable t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/megatron-gpt-1.7b.json"))));
  const OpEntry& mlp = find_op(t, models::OpKind::kSharedMlp);
  const double h = 2304.0;
  CHECK(mlp.gemm_count == 2);
  CHECK(mlp.gemm_k == h);
  CHECK(mlp.gemm_n == 4.0 * h);
  CHECK(mlp.param_elems == 2.0 * h * 4.0 * h + 4.0 * h + h);  // two matrices and their biases
  // The stacks' bytes per fc1 element: 4 forward (2 read, 2 written), 8 backward (2 + 2 read,
  // 2 written, the bias gradient's 2-B read): 16h and 32h B per token at one fc1 element
  // per GeLU element.
  for (const char* s : {"megatron-lm-2021", "megatron-lm-2022", "megatron-deepspeed-2021"}) {
    const Calibration c = stack_calibration(load_stack(stack_path(s)));
    INFO(s);
    for (const double tp : {1.0, 8.0}) {
      const DenseActivationBytes x = dense_activation_bytes(mlp, c, 2048.0, 4.0 * h / tp);
      CHECK(x.fwd == Approx(2048.0 * 16.0 * h / tp).epsilon(1e-12));
      CHECK(x.bwd == Approx(2048.0 * 32.0 * h / tp).epsilon(1e-12));
    }
  }
}

TEST_CASE("pytorch-fsdp: a gated MLP's activation is one compiled kernel, a GeLU one eager kernel", "[dense_kernels]") {
  // torchtitan / fms-fsdp under torch.compile: w2(F.silu(w1(x)) * w3(x)) becomes one Inductor
  // pointwise kernel between the GEMMs (reads h1 and h3, writes the product; its backward
  // reads the gradient, h1 and h3 and writes dh1 and dh3); llm-foundry's MPT applies
  // nn.GELU between up_proj and down_proj, one F.gelu kernel.
  const Calibration c = stack_calibration(load_stack(stack_path("pytorch-fsdp")));
  const OpTable llama = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/llama3-8b.json"))));
  const OpEntry& swiglu = find_op(llama, models::OpKind::kSharedMlp);
  REQUIRE(swiglu.gemm_count == 3);
  const double rows = 2048.0, n = 14336.0, fc1 = rows * 2.0 * n;  // h1 and h3
  CHECK(dense_activation_bytes(swiglu, c, rows, n).fwd == Approx(fc1 * 3.0).epsilon(1e-12));
  CHECK(dense_activation_bytes(swiglu, c, rows, n).bwd == Approx(fc1 * 5.0).epsilon(1e-12));
  const OpTable mpt = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/mpt-7b.json"))));
  const OpEntry& gelu = find_op(mpt, models::OpKind::kSharedMlp);
  REQUIRE(gelu.gemm_count == 2);
  const double width = 4.0 * 4096.0;
  CHECK(dense_activation_bytes(gelu, c, rows, width).fwd == Approx(rows * width * 4.0).epsilon(1e-12));
  CHECK(dense_activation_bytes(gelu, c, rows, width).bwd == Approx(rows * width * 6.0).epsilon(1e-12));
  // Without glu_activation_* a gated MLP takes the plain activation's bytes (the Megatron stacks).
  Calibration plain = c;
  plain.dense_glu_act_own = false;
  CHECK(dense_activation_bytes(swiglu, plain, rows, n).fwd == Approx(fc1 * 4.0).epsilon(1e-12));
  CHECK(dense_activation_bytes(swiglu, plain, rows, n).bwd == Approx(fc1 * 6.0).epsilon(1e-12));
}

TEST_CASE("Unfused attention passes its score matrices through HBM: 2021-22 Megatron stacks only", "[dense_kernels]") {
  CHECK(default_calibration().attention_unfused_fwd_bytes == 0);
  CHECK(stack_calibration(load_stack(stack_path("megatron-bridge-2025"))).attention_unfused_fwd_bytes == 0);  // cuDNN fused attention
  // Korthikanti et al. 2022 measured the unfused attention too: selective recompute exists for its 5as^2b score bytes.
  for (const char* s : {"megatron-lm-2021", "megatron-lm-2022", "megatron-deepspeed-2021"}) {
    const Calibration c = stack_calibration(load_stack(stack_path(s)));
    INFO(s);
    CHECK(c.attention_unfused_fwd_bytes > 0);
    CHECK(c.attention_unfused_bwd_bytes > 0);
  }

  // GPT 1.7B of Narayanan et al. (24 heads of 96, sequence 2048) on an A100.
  const OpTable t = build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/megatron-gpt-1.7b.json"))));
  const topologies::SystemSpec sys = topologies::load_system(src("topologies/zoo/dgx-a100-80gb.json"));
  const OpEntry& att = find_op(t, models::OpKind::kAttention);
  Calibration flash = default_calibration();
  flash.attention_bwd_eff = flash.attention_fwd_eff;
  Calibration unfused = flash;
  unfused.attention_unfused_fwd_bytes = 8.0;
  unfused.attention_unfused_bwd_bytes = 9.0;
  Calibration heavier = unfused;
  heavier.attention_unfused_fwd_bytes = 16.0;
  heavier.attention_unfused_bwd_bytes = 18.0;
  const auto ctx = [&](const Calibration& cal, double seq, double tp) {
    PriceContext c = device_price_context(sys.gpu, cal);
    c.tokens = seq;
    c.seq = seq;
    c.tp = tp;
    return c;
  };
  const PriceContext u = ctx(unfused, 2048, 1), h = ctx(heavier, 2048, 1), f = ctx(flash, 2048, 1);
  // The elementwise passes move their bytes per score: heads x seq x seq on this GPU.
  const double scores = 2048.0 * 24.0 * 2048.0;
  const double bw = u.hbm_bw_bytes_per_s * unfused.mem_eff_elementwise;
  CHECK(price_op(att, h).fwd_s - price_op(att, u).fwd_s == Approx(scores * 8.0 / bw).epsilon(1e-9));
  CHECK(price_op(att, h).bwd_s - price_op(att, u).bwd_s == Approx(scores * 9.0 / bw).epsilon(1e-9));
  // Slower than a flash kernel at the same shape, and it computes the whole square (no causal skip).
  CHECK(price_op(att, u).fwd_s > 2.0 * price_op(att, f).fwd_s);
  CHECK(price_op(att, u).fwd_flops == Approx(2.0 * scores * (96.0 + 96.0) + 3.0 * scores));
  // Tensor parallelism splits the heads: a quarter of the scores per GPU at tp 4.
  const PriceContext u4 = ctx(unfused, 2048, 4), h4 = ctx(heavier, 2048, 4);
  CHECK(price_op(att, h4).fwd_s - price_op(att, u4).fwd_s == Approx(scores / 4.0 * 8.0 / bw).epsilon(1e-9));
  // Per token the score passes grow with the sequence: twice the sequence (same tokens), twice the pass.
  PriceContext u2 = u, h2 = h;
  u2.seq = h2.seq = 4096;
  CHECK(price_op(att, h2).fwd_s - price_op(att, u2).fwd_s == Approx(2.0 * scores * 8.0 / bw).epsilon(1e-9));
}

TEST_CASE("A non-gated MLP's activation: eager squared ReLU in NeMo 2.0 / Megatron-Bridge, compiled in NeMo 24.09", "[dense_kernels]") {
  // Megatron-Core fuses only GeLU and SwiGLU (mlp.py): Nemotron's squared ReLU runs as the
  // trainer writes it, torch.pow(relu(x), 2): two eager kernels and their autograd in NeMo 2.0
  // and Megatron-Bridge (8 B forward, 20 B backward per fc1 element), one torch.compile'd
  // kernel each way in NeMo 1.0 (4 B, 6 B). A gated MLP keeps bias_swiglu_impl's 3 B / 5 B.
  const Calibration bridge = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  const Calibration nemo = stack_calibration(load_stack(stack_path("nemo-2409")));
  const OpTable nemotron =
      build_op_table(models::build_layer_graph(models::load_model(src("tests/validation/models/nemotron4-15b.json"))));
  const OpEntry& relu2 = find_op(nemotron, models::OpKind::kSharedMlp);
  REQUIRE(relu2.gemm_count == 2);
  const double rows = 4096.0, n = 24576.0 / 4.0;  // TP 4's share of the width
  const DenseActivationBytes eager = dense_activation_bytes(relu2, bridge, rows, n);
  const DenseActivationBytes compiled = dense_activation_bytes(relu2, nemo, rows, n);
  CHECK(eager.fwd == Approx(rows * n * 8.0));
  CHECK(eager.bwd == Approx(rows * n * 20.0));
  CHECK(compiled.fwd == Approx(rows * n * 4.0));
  CHECK(compiled.bwd == Approx(rows * n * 6.0));
  const Llama8b m("topologies/zoo/hgx-h100.json");
  const OpEntry& swiglu = find_op(m.t, models::OpKind::kSharedMlp);
  for (const Calibration* c : {&bridge, &nemo}) {
    const DenseActivationBytes g = dense_activation_bytes(swiglu, *c, rows, n);
    CHECK(g.fwd == Approx(rows * 2.0 * n * 3.0));
    CHECK(g.bwd == Approx(rows * 2.0 * n * 5.0));
  }
}
