// The HBM passes PyTorch FSDP makes each micro-batch over a block's gathered parameters
// and its unsharded gradient, besides the all-gather and reduce-scatter (issue 13), as the
// stacks give them (collectives.fsdp_hbm_passes):
//  - FSDP1 (pytorch-fsdp1, torch 2.1 flat_param.py / _runtime_utils.py): the flat
//    gradient assembled from the views' bf16 gradients (a read and a write at 2 B), its
//    cast to an fp32 reduce dtype (2 B read, 4 B write; none when it reduces in bf16), and
//    the pre-division before the reduce-scatter (a read and a write at the reduce dtype);
//    nothing in the forward: the all-gather lands in the flat parameter itself; torch 1.13
//    (llm-foundry-torch113) also copies the gradient into F.pad's padded tensor.
//  - FSDP2 (pytorch-fsdp, torch 2.6 _fsdp_collectives.py): each gather's copy-out into the
//    parameters (a read and a write at 2 B), forward and backward, and the gradients'
//    copy into the reduce-scatter buffer at the reduce dtype, always.
//  - FSDP2 with torchao's float8 all-gather (Layout::fp8_params under FP8 linears): the
//    FP8 GEMMs' weights are gathered, copied out and held gathered as 1 B float8 data.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/source_dir.h"
#include "sim/cost.h"
#include "sim/predict.h"
#include "sim/stack.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

// ZeRO-3 over one HGX H100 node, two micro-batches of 2 x 2048 tokens, no recompute.
Layout fsdp8(GradDtype grads) {
  Layout l;
  l.data = 8;
  l.fsdp = 8;
  l.zero_stage = 3;
  l.micro_batch_seqs = 2;
  l.tokens_per_step = 8.0 * 2 * 2048 * 2;
  l.recompute = models::Recompute::kNone;
  l.grad_dtype = grads;
  return l;
}

Layout fp8_linears(Layout l, bool fp8_params) {
  l.fp8 = Fp8Gemms::kLinear;
  l.fp8_recipe = Fp8Recipe::kCurrent;
  l.fp8_params = fp8_params;
  return l;
}

Calibration without_passes(Calibration c) {
  c.fsdp_gather_copy_passes = 0;
  c.fsdp_grad_view_passes = 0;
  c.fsdp_grad_copy = Calibration::FsdpGradCopy::kNone;
  c.fsdp_grad_reduce_dtype_passes = 0;
  return c;
}

struct Passes {
  double fwd_s = 0, bwd_s = 0;  // added per step
};

// What the stack's passes add to the step's forward and backward device time.
Passes added(const std::string& stack, GradDtype grads) {
  const auto graph = models::build_layer_graph(models::load_model(src("tests/validation/models/mpt-7b.json")));
  const auto cluster = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  const Calibration with = stack_calibration(load_stack(stack_path(stack)));
  const Prediction a = Predictor(graph, cluster, with).predict(fsdp8(grads));
  const Prediction b = Predictor(graph, cluster, without_passes(with)).predict(fsdp8(grads));
  REQUIRE(a.valid);
  REQUIRE(b.valid);
  REQUIRE(a.micro_batches == 2.0);
  return {a.breakdown.compute_fwd_s - b.breakdown.compute_fwd_s, a.breakdown.compute_bwd_s - b.breakdown.compute_bwd_s};
}

// Seconds of `bytes_per_elem` over every gathered parameter of the model's blocks, per step.
double hbm_s(const std::string& stack, double bytes_per_elem) {
  const auto graph = models::build_layer_graph(models::load_model(src("tests/validation/models/mpt-7b.json")));
  const auto cluster = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  const Calibration c = stack_calibration(load_stack(stack_path(stack)));
  double elems = 0.0;
  for (const LayerClass& lc : build_op_table(graph).classes) elems += static_cast<double>(lc.count) * lc.dense_params;
  const auto& gpu = cluster.system.gpu;
  const double bw = gpu.hbm_bw_measured_bytes_per_s > 0 ? gpu.hbm_bw_measured_bytes_per_s : gpu.hbm_bw_bytes_per_s;
  return 2.0 * elems * bytes_per_elem / (bw * c.mem_eff_elementwise);  // two micro-batches
}

}  // namespace

TEST_CASE("FSDP1: the flat gradient's assembly, cast and pre-division each backward; nothing in the forward",
          "[zero3][fsdp_passes]") {
  // Composer's DEFAULT mixed precision: bf16 params, fp32 reduce: 2 x 2 + (2 + 4) + 2 x 4 = 18 B.
  const Passes fp32 = added("pytorch-fsdp1", GradDtype::kFp32);
  CHECK(fp32.fwd_s == 0.0);
  CHECK(fp32.bwd_s == Approx(hbm_s("pytorch-fsdp1", 18.0)).epsilon(1e-9));
  // fms-fsdp's bfSixteen: bf16 reduce, no cast: 2 x 2 + 2 x 2 = 8 B.
  const Passes bf16 = added("pytorch-fsdp1", GradDtype::kBf16);
  CHECK(bf16.fwd_s == 0.0);
  CHECK(bf16.bwd_s == Approx(hbm_s("pytorch-fsdp1", 8.0)).epsilon(1e-9));
  // torch 1.13 copies the fp32 gradient once more, into F.pad's padded tensor: 18 + 2 x 4 = 26 B.
  const Passes padded = added("llm-foundry-torch113", GradDtype::kFp32);
  CHECK(padded.fwd_s == 0.0);
  CHECK(padded.bwd_s == Approx(hbm_s("llm-foundry-torch113", 26.0)).epsilon(1e-9));
}

TEST_CASE("FSDP2: each gather's copy-out, and the gradients' copy into the reduce-scatter buffer",
          "[zero3][fsdp_passes]") {
  // torchtitan: bf16 params, fp32 reduce: forward 2 x 2 = 4 B; backward 4 + (2 + 4) = 10 B.
  const Passes fp32 = added("pytorch-fsdp", GradDtype::kFp32);
  CHECK(fp32.fwd_s == Approx(hbm_s("pytorch-fsdp", 4.0)).epsilon(1e-9));
  CHECK(fp32.bwd_s == Approx(hbm_s("pytorch-fsdp", 10.0)).epsilon(1e-9));
  // A bf16 reduce still copies into the buffer: 4 + (2 + 2) = 8 B.
  CHECK(added("pytorch-fsdp", GradDtype::kBf16).bwd_s == Approx(hbm_s("pytorch-fsdp", 8.0)).epsilon(1e-9));
}

TEST_CASE("stacks without FSDP passes charge none (Megatron, the base calibration)", "[zero3][fsdp_passes]") {
  for (const Calibration& c : {default_calibration(), stack_calibration(load_stack(stack_path("megatron-lm")))}) {
    CHECK(c.fsdp_gather_copy_passes == 0);
    CHECK(c.fsdp_grad_view_passes == 0);
    CHECK(c.fsdp_grad_copy == Calibration::FsdpGradCopy::kNone);
    CHECK(c.fsdp_grad_reduce_dtype_passes == 0);
  }
}

TEST_CASE("FSDP2 float8 all-gather: the FP8 linears' weights gathered, copied out and held at one byte",
          "[zero3][fsdp_passes][fp8_params]") {
  const auto graph = models::build_layer_graph(models::load_model(src("tests/validation/models/mpt-7b.json")));
  const auto cluster = topologies::load_cluster(src("topologies/zoo/hgx-h100.json"), 1);
  const Stack fsdp2 = load_stack(stack_path("pytorch-fsdp"));
  Calibration cal = stack_calibration(fsdp2);
  cal.dense_fp8_weight_cast_per_pass = false;  // the forward's weight cast it saves: tests/sim_fp8.cpp
  const Layout bf16_gather = fp8_linears(fsdp8(GradDtype::kFp32), false);
  const Layout fp8_gather = fp8_linears(fsdp8(GradDtype::kFp32), true);
  // torchtitan's --float8.enable_fsdp_float8_all_gather runs on FSDP2; FSDP1 has no such hook.
  CHECK(stack_runs(fp8_gather, fsdp2));
  CHECK_FALSE(stack_runs(fp8_gather, load_stack(stack_path("pytorch-fsdp1"))));

  // One block: its GEMMs' weights at 1 B, the norms at 2 B.
  const OpTable table = build_op_table(graph);
  REQUIRE(table.classes.size() == 1);
  const LayerClass& block = table.classes.front();
  double gemm_elems = 0.0;
  for (const OpEntry& e : block.ops) {
    if (e.cls == models::OpClass::kGemm) gemm_elems += e.param_elems;
  }
  REQUIRE(gemm_elems > 0.9 * block.dense_params);
  REQUIRE(gemm_elems < block.dense_params);
  const Network net = make_network(cluster, cal);
  const Group shard = group_of(net, 8, 1);
  const Predictor p(graph, cluster, cal);
  const StepPrice a = p.price(bf16_gather), b = p.price(fp8_gather);
  CHECK(a.layers.at(0).fsdp_gather_s == Approx(all_gather_s(net, shard, 2.0 * block.dense_params)).epsilon(1e-9));
  CHECK(b.layers.at(0).fsdp_gather_s ==
        Approx(all_gather_s(net, shard, 2.0 * block.dense_params - gemm_elems)).epsilon(1e-9));

  // The copy-out (two passes, forward and backward, two micro-batches) reads and writes
  // one byte less per GEMM weight element.
  const auto& gpu = cluster.system.gpu;
  const double bw = gpu.hbm_bw_measured_bytes_per_s * cal.mem_eff_elementwise;
  const double saved_s = 2.0 * static_cast<double>(block.count) * gemm_elems * cal.fsdp_gather_copy_passes / bw;
  CHECK(a.prediction.breakdown.compute_fwd_s - b.prediction.breakdown.compute_fwd_s == Approx(saved_s).epsilon(1e-6));
  CHECK(a.prediction.breakdown.compute_bwd_s - b.prediction.breakdown.compute_bwd_s == Approx(saved_s).epsilon(1e-6));

  // The two gathered layers a GPU holds keep the float8 data: one byte less per GEMM weight.
  CHECK(a.prediction.memory.working_weights - b.prediction.memory.working_weights == Approx(2.0 * gemm_elems));
  CHECK(b.prediction.memory.master_weights == Approx(a.prediction.memory.master_weights));
}
