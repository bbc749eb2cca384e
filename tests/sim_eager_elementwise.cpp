// Eager vs compiled elementwise work of PyTorch trainers (issue 13, calibration blocks
// `eager_elementwise` and dense_kernels' glu_activation_*, sim/cost.cpp): torchtitan without
// torch.compile runs its RMSNorm, RoPE and SwiGLU as several eager ops, each a pass through
// HBM; with torch.compile each is one fused kernel. The pair of torchtitan rows that differ
// only in training.compile (tests/validation/torchtitan-h100-grand-teton.json) measures it.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "sim/stack.h"
#include "tests/sim_op_find.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

OpTable op_table(const std::string& model) {
  return build_op_table(models::build_layer_graph(models::load_model(src(model))));
}

// One micro-batch of 16,384 tokens on a Grand Teton H100 (the torchtitan rows' host).
struct H100 {
  topologies::SystemSpec sys = topologies::load_system(src("topologies/zoo/grand-teton-h100.json"));

  PriceContext ctx(const Calibration& cal, double tp = 1) const {
    PriceContext c = device_price_context(sys.gpu, cal);
    c.tokens = 16384;
    c.seq = 8192;
    c.tp = tp;
    return c;
  }
};

}  // namespace

TEST_CASE("Eager torchtitan prices its RMSNorm and RoPE as the eager ops' passes; compiled, one fused pass", "[eager_elementwise]") {
  const H100 h;
  const Calibration compiled = stack_calibration(load_stack(stack_path("pytorch-fsdp")));
  const Calibration eager = stack_calibration(load_stack(stack_path("pytorch-fsdp-eager")));
  const OpTable t = op_table("tests/validation/models/llama3-8b.json");
  const OpEntry& norm = find_op(t, models::OpKind::kRmsNorm);
  const OpEntry& rope = find_op(t, models::OpKind::kRope);
  const OpEntry& resid = find_op(t, models::OpKind::kResidualAdd);
  CHECK(eager_passes(norm, compiled) == nullptr);
  CHECK(eager_passes(rope, compiled) == nullptr);
  CHECK(eager_passes(resid, eager) == nullptr);  // x + h is one kernel either way
  REQUIRE(eager_passes(norm, eager) != nullptr);
  REQUIRE(eager_passes(rope, eager) != nullptr);

  for (const double tp : {1.0, 8.0}) {
    INFO("tp " << tp);
    const PriceContext c = h.ctx(eager, tp), cc = h.ctx(compiled, tp);
    const double bw = c.hbm_bw_bytes_per_s * eager.mem_eff_elementwise;
    const double launch = eager.launch_overhead_s;
    // RMSNorm over d_model 4096: 36 B forward, 92 B backward per element, 8 and 16 kernels.
    const double norm_elems = 16384.0 * 4096.0 / tp;
    CHECK(price_op(norm, c).fwd_s == Approx(norm_elems * 36.0 / bw + 8.0 * launch).epsilon(1e-12));
    CHECK(price_op(norm, c).bwd_s == Approx(norm_elems * 92.0 / bw + 16.0 * launch).epsilon(1e-12));
    // RoPE over q and k: (32 + 8) heads x 128 per token, 20 B each way, 3 kernels per tensor.
    const double rope_elems = 16384.0 * 40.0 * 128.0 / tp;
    CHECK(price_op(rope, c).fwd_s == Approx(rope_elems * 20.0 / bw + 6.0 * launch).epsilon(1e-12));
    CHECK(price_op(rope, c).bwd_s == Approx(rope_elems * 20.0 / bw + 6.0 * launch).epsilon(1e-12));
    // The compiled step's one pass (read x, write y) is several times cheaper.
    CHECK(price_op(norm, c).fwd_s > 4.0 * price_op(norm, cc).fwd_s);
    CHECK(price_op(rope, c).fwd_s > 3.0 * price_op(rope, cc).fwd_s);
  }
}

TEST_CASE("Eager torchtitan's SwiGLU: F.silu and the product, two kernels where torch.compile runs one", "[eager_elementwise]") {
  const Calibration compiled = stack_calibration(load_stack(stack_path("pytorch-fsdp")));
  const Calibration eager = stack_calibration(load_stack(stack_path("pytorch-fsdp-eager")));
  const OpTable llama = op_table("tests/validation/models/llama3-8b.json");
  const OpEntry& swiglu = find_op(llama, models::OpKind::kSharedMlp);
  REQUIRE(swiglu.gemm_count == 3);
  const double rows = 2048.0, n = 14336.0, fc1 = rows * 2.0 * n;  // h1 and h3
  const DenseActivationBytes e = dense_activation_bytes(swiglu, eager, rows, n);
  CHECK(e.fwd == Approx(fc1 * 5.0).epsilon(1e-12));
  CHECK(e.bwd == Approx(fc1 * 9.0).epsilon(1e-12));
  CHECK(e.fwd > dense_activation_bytes(swiglu, compiled, rows, n).fwd);
  // A plain GeLU (MPT) is one kernel in either stack.
  CHECK(eager.dense_act_fwd_bytes == compiled.dense_act_fwd_bytes);
  CHECK(eager.dense_act_bwd_bytes == compiled.dense_act_bwd_bytes);
}

TEST_CASE("eager_elementwise names op kinds run as eager passes; anything else is a one-line user error", "[eager_elementwise]") {
  nlohmann::json doc = load_json_file(default_calibration_path());
  const nlohmann::json passes = {{"fwd_bytes_per_elem", {{"value", 20}, {"source", "[A] test"}}},
                                 {"bwd_bytes_per_elem", {{"value", 20}, {"source", "[A] test"}}},
                                 {"fwd_kernels", {{"value", 3}, {"source", "[A] test"}}},
                                 {"bwd_kernels", {{"value", 3}, {"source", "[A] test"}}}};
  doc["eager_elementwise"] = {{"rope", passes}};
  CHECK(parse_calibration(doc, "test.json").eager_elementwise.count("rope") == 1);
  doc["eager_elementwise"] = {{"cross_entropy", passes}};
  CHECK(parse_calibration(doc, "test.json").eager_elementwise.count("cross_entropy") == 1);
  doc["eager_elementwise"] = {{"attention", passes}};
  CHECK_THROWS_AS(parse_calibration(doc, "test.json"), UserError);
  doc["eager_elementwise"] = {{"rmsnorm", passes}};
  doc["eager_elementwise"]["rmsnorm"].erase("bwd_kernels");
  CHECK_THROWS_AS(parse_calibration(doc, "test.json"), UserError);
}

TEST_CASE("NeMo 24.09's loss: Megatron-Core 0.9's fused cross entropy through FP32 copies of the logits", "[eager_elementwise]") {
  // Megatron-Bridge selects Transformer Engine's one-kernel cross entropy (priced as one
  // pass); Megatron-Core 0.9's own casts the logits to FP32 and passes over them three times
  // forward, once backward (sim/stacks/nemo-2409.json).
  const Calibration bridge = stack_calibration(load_stack(stack_path("megatron-bridge-2025")));
  const Calibration nemo = stack_calibration(load_stack(stack_path("nemo-2409")));
  const OpTable llama = op_table("tests/validation/models/llama3-8b.json");
  const OpEntry& loss = find_op(llama, models::OpKind::kCrossEntropy);
  CHECK(eager_passes(loss, bridge) == nullptr);
  const Calibration::EagerPasses* ce = eager_passes(loss, nemo);
  REQUIRE(ce != nullptr);
  const H100 h;
  for (const double tp : {1.0, 4.0}) {
    const PriceContext c = h.ctx(nemo, tp);
    const OpTime t = price_op(loss, c);
    const double logits = c.tokens * 128256.0 / tp;  // the vocabulary's TP share of each token's logits
    const double bw = c.hbm_bw_bytes_per_s * nemo.mem_eff_elementwise;
    CHECK(t.fwd_s == Approx(logits * ce->fwd_bytes_per_elem / bw + ce->fwd_kernels * nemo.launch_overhead_s));
    CHECK(t.bwd_s == Approx(logits * ce->bwd_bytes_per_elem / bw + ce->bwd_kernels * nemo.launch_overhead_s));
    CHECK(t.fwd_s > price_op(loss, h.ctx(bridge, tp)).fwd_s);
  }
  // Everything else of the stack is megatron-bridge-2025's.
  CHECK(nemo.attention_cp_ring_te_passes == bridge.attention_cp_ring_te_passes);
  CHECK(nemo.dense_glu_act_fwd_bytes == bridge.dense_glu_act_fwd_bytes);
}
