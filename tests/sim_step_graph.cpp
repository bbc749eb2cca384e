// The step task graph: the DES agrees with the analytic predictor where it
// should (no contention, no jitter) and shows what it cannot (PP dependencies,
// stragglers holding up collectives).
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/check.h"
#include "models/layer_graph.h"
#include "sim/des.h"
#include "sim/pipeline_schedule.h"
#include "sim/predict.h"
#include "sim/step_graph.h"
#include "tests/sim_step_graph_case.h"
#include "topologies/topology.h"

using namespace rackstep;
using namespace rackstep::sim;
using Catch::Matchers::Contains;

using test::Case;
using test::load;

TEST_CASE("hero step: DES and analytic predictor agree without contention or jitter", "[step_graph][hero]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
  Predictor p(c.graph, c.cluster);
  StepGraph sg = build_step_graph(p, c.layout, {});
  REQUIRE(sg.prediction.valid);
  RunResult r = sg.engine.run();
  INFO("DES " << r.makespan_s << " s, analytic " << sg.prediction.step_time_s << " s");
  CHECK(r.makespan_s == Approx(sg.prediction.step_time_s).epsilon(0.03));
  // 704 GPUs, one representative process (and the shared fabric).
  CHECK(sg.engine.num_processes() == 2);
  CHECK(sg.engine.process_multiplicity(0) == 704);
  StepSummary s = summarize(sg.engine, r);
  CHECK(s.exposed_s_by_kind["ep_dispatch"] > 0);
  CHECK(s.critical_path_s_by_category["forward"] > 0);
}

TEST_CASE("explicit ranks reproduce the symmetric step; a slow rank holds up every collective",
          "[step_graph][stragglers]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
  Predictor p(c.graph, c.cluster);
  StepGraphOptions one;
  StepGraphOptions four;
  four.ranks_per_stage = 4;
  StepGraph a = build_step_graph(p, c.layout, one);
  StepGraph b = build_step_graph(p, c.layout, four);
  const double base = a.engine.run().makespan_s;
  CHECK(b.engine.run().makespan_s == Approx(base).epsilon(1e-9));
  RunOptions slow;
  slow.slow_processes = {{2, 1.2}};  // one of the four ranks computes 20% slower
  const double held = b.engine.run(slow).makespan_s;
  // Everyone waits for it at each collective: the whole step slows down, which
  // the analytic model (one rank, averages) cannot show.
  CHECK(held > base * 1.1);
}

TEST_CASE("two steps take twice one step", "[step_graph]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
  Predictor p(c.graph, c.cluster);
  StepGraphOptions two;
  two.steps = 2;
  StepGraph one = build_step_graph(p, c.layout, {});
  StepGraph sg = build_step_graph(p, c.layout, two);
  REQUIRE(sg.step_end.size() == 2);
  CHECK(sg.engine.run().makespan_s == Approx(2 * one.engine.run().makespan_s).epsilon(0.01));
}

TEST_CASE("pipeline schedules: the bubble comes from real stage dependencies", "[step_graph][pp]") {
  // 535B at 65k context on 768 H100: PP 24 x CP 4 x EP 8, 48 micro-batches.
  Case c = load("marin-535b-a23b.json", "hgx-h100.json", "h100-longctx-pp24.json", 96);
  Predictor p(c.graph, c.cluster);
  Layout plain = c.layout;
  plain.schedule = PpSchedule::k1F1B;
  plain.pp_virtual = 1;
  StepGraph sg1 = build_step_graph(p, plain, {});
  REQUIRE(sg1.stages == 24);
  REQUIRE(sg1.micro_batches == 48);
  RunResult r1 = sg1.engine.run();
  StepSummary s1 = summarize(sg1.engine, r1);
  Layout inter = c.layout;
  inter.schedule = PpSchedule::kInterleaved1F1B;
  inter.pp_virtual = 2;
  StepGraph sg2 = build_step_graph(p, inter, {});
  RunResult r2 = sg2.engine.run();
  StepSummary s2 = summarize(sg2.engine, r2);
  INFO("1F1B: DES " << r1.makespan_s << " s, analytic " << sg1.prediction.step_time_s << " s, bubble "
                    << s1.bubble_fraction << "; interleaved: DES " << r2.makespan_s << " s, analytic "
                    << sg2.prediction.step_time_s << " s, bubble " << s2.bubble_fraction);
  // 1F1B idles at least (p-1)/(m+p-1) = 23/71 of the step, more when stages are uneven.
  CHECK(s1.bubble_fraction > 0.3);
  CHECK(s1.bubble_fraction < 0.55);
  // The analytic model spreads every layer class evenly over the stages; the DES
  // places real layers (every 4th is full global attention, far costlier at 65k
  // context than the windowed local layers) and
  // waits on the slowest stage, so it can only come out slower, by a bounded amount.
  CHECK(r1.makespan_s > sg1.prediction.step_time_s);
  CHECK(r1.makespan_s == Approx(sg1.prediction.step_time_s).epsilon(0.15));
  // Interleaving puts model chunk q on stage q mod p, so every global layer of
  // this model lands on the same 6 stages: the DES step exceeds the analytic one
  // by more than for plain 1F1B (the analytic bubble / v assumes balance).
  CHECK(r2.makespan_s / sg2.prediction.step_time_s > r1.makespan_s / sg1.prediction.step_time_s);
}

TEST_CASE("bad step-graph options are user errors", "[step_graph][errors]") {
  Case c = load("marin-535b-a23b.json", "hgx-h100.json", "h100-longctx-pp24.json", 96);
  Predictor p(c.graph, c.cluster);
  StepGraphOptions bad;
  bad.ranks_per_stage = 7;
  c.layout.schedule = PpSchedule::kInterleaved1F1B;
  CHECK_THROWS_WITH(build_step_graph(p, c.layout, bad), Contains("ranks_per_stage"));
}

TEST_CASE("a merged-1F1B schedule warms up with one more forward, then pairs each forward with a backward",
          "[step_graph][pp]") {
  // One stage, 4 micro-batches: F0, then (F1 B0) (F2 B1) (F3 B2), then B3.
  const std::vector<PipelineSlot> o = pipeline_order(PpSchedule::k1F1B, 1, 1, 4, 0, 1);
  REQUIRE(o.size() == 8);
  CHECK(o[0].pass == PipelinePass::kForward);
  CHECK(o[1].pass == PipelinePass::kForward);
  CHECK(o[1].mb == 1);
  CHECK(o[2].pass == PipelinePass::kBackward);
  CHECK(o[2].mb == 0);
  CHECK(o[7].pass == PipelinePass::kBackward);
  CHECK(o[7].mb == 3);
  // Interleaved, stage 0 of 2 with 2 chunks: 2(p-1) + (v-1)p = 4 warm-up forwards (one more merged),
  // then the steady state's forward before its first backward.
  const std::vector<PipelineSlot> i0 = pipeline_order(PpSchedule::kInterleaved1F1B, 2, 2, 4, 0, 0);
  const std::vector<PipelineSlot> i1 = pipeline_order(PpSchedule::kInterleaved1F1B, 2, 2, 4, 0, 1);
  const auto first_backward = [](const std::vector<PipelineSlot>& v) {
    size_t k = 0;
    while (k < v.size() && v[k].pass == PipelinePass::kForward) ++k;
    return k;
  };
  CHECK(first_backward(i0) == 5);
  CHECK(first_backward(i1) == 6);
}
