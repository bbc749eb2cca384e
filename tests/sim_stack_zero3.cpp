// ZeRO-3 as DeepSpeed runs it (issue 13): a gather per module, a re-gather for the
// recompute, and a prefetch bounded in parameters. Each moves the priced gathers
// the way its mechanism says, and none changes a trainer that does not set it.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/source_dir.h"
#include "sim/predict.h"
#include "sim/stack.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

std::string src(const std::string& p) { return std::string(rackstep::source_dir()) + "/" + p; }

// GPT-175B, ZeRO-3 over 128 A100s (16 DGX nodes), full recompute.
Layout zero3() {
  Layout l;
  l.data = 128;
  l.fsdp = 128;
  l.zero_stage = 3;
  l.micro_batch_seqs = 1;
  l.tokens_per_step = 128 * 2048;
  l.recompute = models::Recompute::kFull;
  return l;
}

double fsdp_comm_s(const Calibration& cal) {
  static const auto g = models::build_layer_graph(models::load_model(src("tests/validation/models/gpt-175b.json")));
  static const auto c = topologies::load_cluster(src("topologies/zoo/dgx-a100-80gb.json"), 16);
  const Predictor p(g, c, cal);
  const Prediction r = p.predict(zero3());
  REQUIRE(r.valid);
  return r.breakdown.fsdp_comm_s;
}

}  // namespace

TEST_CASE("DeepSpeed's ZeRO-3 mechanisms each add the gather time they name", "[stack][zero]") {
  Calibration base = default_calibration();
  base.fsdp_prefetch_overlap = 0.0;  // every gather exposed, so the counts show
  const double per_layer = fsdp_comm_s(base);
  REQUIRE(per_layer > 0.0);

  // One call per parameter-holding module pays the ring latency once per module.
  Calibration modules = base;
  modules.fsdp_gather_per_module = true;
  const double per_module = fsdp_comm_s(modules);
  CHECK(per_module > per_layer);

  // Re-gathering for the recompute: three gathers + one reduce-scatter per layer
  // instead of two + one (the reduce-scatter moves fp32 gradients, twice a gather's bytes).
  Calibration regather = base;
  regather.fsdp_regather_for_recompute = true;
  const double three = fsdp_comm_s(regather);
  CHECK(three > per_layer * 1.2);
  CHECK(three < per_layer * 1.5);

  // A prefetch bucket smaller than the layer's largest module hides only its share.
  Calibration overlap = default_calibration();
  overlap.fsdp_prefetch_overlap = 1.0;
  const double hidden = fsdp_comm_s(overlap);
  overlap.fsdp_prefetch_bucket_params = 5e7;  // DeepSpeed's default; GPT-175B's MLP matrices are 604M
  const double bounded = fsdp_comm_s(overlap);
  CHECK(bounded > hidden);
  CHECK(bounded < per_layer);
}

TEST_CASE("the DeepSpeed stacks set the ZeRO-3 mechanisms, Marin's does not", "[stack][zero]") {
  const Calibration ds = stack_calibration(load_stack(stack_path("megatron-deepspeed-2021")));
  CHECK(ds.fsdp_gather_per_module);
  CHECK(ds.fsdp_regather_for_recompute);
  CHECK(ds.fsdp_prefetch_bucket_params == 5e7);
  const Calibration marin = stack_calibration(load_stack(stack_path("marin-july-2026")));
  CHECK_FALSE(marin.fsdp_gather_per_module);
  CHECK_FALSE(marin.fsdp_regather_for_recompute);
  CHECK(marin.fsdp_prefetch_bucket_params == 0.0);
}
