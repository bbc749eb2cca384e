// ZeRO-3 with keep_gathered_weights in the step graph: each layer's weights are
// gathered once per step (the first micro-batch's forward) and its whole
// gradients reduced across every data rank once, as the analytic prediction
// prices it; per micro-batch gathering stays the default.
#include <catch2/catch.hpp>

#include <string>

#include "sim/des.h"
#include "sim/predict.h"
#include "sim/step_graph.h"
#include "tests/sim_step_graph_case.h"

using namespace rackstep;
using namespace rackstep::sim;

namespace {

// The 67B MoE on one GB200 rack: FSDP 64, EP 8, four micro-batches of one sequence.
Layout rack_layout(bool keep) {
  Layout l;
  l.name = keep ? "keep-gathered" : "gather-per-micro-batch";
  l.data = 64;
  l.fsdp = 64;
  l.ep = 8;
  l.micro_batch_seqs = 1;
  l.tokens_per_step = 1048576;  // 256 sequences of 4096: 4 micro-batches per data rank
  l.zero_stage = 3;
  l.keep_gathered_weights = keep;
  return l;
}

struct Count {
  int64_t gathers = 0, reduce_scatters = 0;
  double gather_bytes = 0;
};

// The collectives' stream tasks (not their NIC siblings or joins).
Count count(const Engine& e) {
  Count c;
  for (int32_t i = 0; i < e.num_tasks(); ++i) {
    const std::string& n = e.task_name({i});
    if (n.size() > 10 && n.compare(n.size() - 10, 10, ".allgather") == 0) {
      ++c.gathers;
      c.gather_bytes += e.task_bytes({i});
    }
    if (n.size() > 15 && n.compare(n.size() - 15, 15, ".reduce_scatter") == 0) ++c.reduce_scatters;
  }
  return c;
}

StepGraphOptions quiet() {
  StepGraphOptions o;
  o.gc_stalls = false;
  o.contention = false;
  return o;
}

}  // namespace

TEST_CASE("keep_gathered_weights: the DES gathers each layer once per step, as the prediction does",
          "[step_graph][zero]") {
  test::Case c = test::load("marin-67b-a2b.json", "gb200-nvl72.json", "hero-ragged.json");
  const Predictor p(c.graph, c.cluster);
  const int64_t layers = c.graph.model.layers;

  const StepPrice kept_price = p.price(rack_layout(true));
  REQUIRE(kept_price.prediction.valid);
  const StepGraph kept = build_step_graph(p, rack_layout(true), quiet());
  const StepGraph each = build_step_graph(p, rack_layout(false), quiet());
  REQUIRE(kept.micro_batches == 4);
  const Count k = count(kept.engine), e = count(each.engine);
  // Kept: one gather per layer per step and no per-micro-batch gradient reduce-scatter;
  // per micro-batch: a gather for every forward and every backward of every layer.
  CHECK(k.gathers == layers);
  CHECK(k.reduce_scatters == 0);
  CHECK(e.gathers == layers * 4 * 2);
  CHECK(e.reduce_scatters == layers * 4);
  // The gathers move the priced bytes (NVLink: the rack is one domain).
  double priced = 0;
  for (const LayerCollectives& x : kept_price.collectives) priced += x.fsdp_gather.nvlink_bytes;
  CHECK(k.gather_bytes == Approx(priced).epsilon(1e-12));

  // DES and analytic agree on the kept-weights step (no GC pauses, private links) ...
  const RunResult rk = kept.engine.run();
  const double analytic = kept.prediction.step_time_s - kept.prediction.breakdown.host_stall_s;
  INFO("kept: DES " << rk.makespan_s << " s, analytic (no GC) " << analytic << " s");
  CHECK(rk.makespan_s == Approx(analytic).epsilon(0.03));
  // ... as on the per-micro-batch step, and both move the change between the two the same way
  // (fewer gathers, but whole gradients all-reduced over all 64 ranks once per step).
  const RunResult re = each.engine.run();
  const double analytic_each = each.prediction.step_time_s - each.prediction.breakdown.host_stall_s;
  CHECK(re.makespan_s == Approx(analytic_each).epsilon(0.03));
  CHECK((rk.makespan_s > re.makespan_s) == (analytic > analytic_each));
  // Whole gradients: the exposed exchange is the once-per-step all-reduce over every data rank.
  StepSummary sk = summarize(kept.engine, rk);
  CHECK(sk.exposed_s_by_kind["fsdp_reduce_scatter"] == 0);
}
