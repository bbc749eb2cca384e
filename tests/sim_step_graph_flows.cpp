// The step graph's communication as byte flows over shared links, and its
// pipeline schedules (zero-bubble, DualPipeV), pooled-wave overlap and
// checkpoint saves.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <tuple>
#include <string>

#include "sim/base/check.h"
#include "models/layer_graph.h"
#include "sim/des.h"
#include "sim/predict.h"
#include "sim/step_graph.h"
#include "tests/sim_step_graph_case.h"
#include "topologies/topology.h"

using namespace rackstep;
using namespace rackstep::sim;
using Catch::Matchers::Contains;

using test::Case;
using test::load;

namespace {

StepGraphOptions quiet(bool contention) {
  StepGraphOptions o;
  o.gc_stalls = false;
  o.contention = contention;
  return o;
}

ResourceId find_resource(const Engine& e, const std::string& name) {
  for (int32_t i = 0; i < e.num_resources(); ++i) {
    if (e.resource_name({i}) == name) return {i};
  }
  return {};
}


// Where the pipeline ends: the last stage's "backward_done" marker.
double pipeline_end_s(const Engine& e, const RunResult& r) {
  double end = 0;
  for (int32_t t = 0; t < e.num_tasks(); ++t) {
    if (e.task_name({t}).find("backward_done") != std::string::npos) end = std::max(end, r.end_s[t]);
  }
  return end;
}

StepSummary run_schedule(const Predictor& p, Layout l, PpSchedule sch, int64_t v, double* pipe_s, int64_t* m) {
  l.schedule = sch;
  l.pp_virtual = v;
  StepGraph sg = build_step_graph(p, l, quiet(true));
  RunResult r = sg.engine.run();
  *pipe_s = pipeline_end_s(sg.engine, r);
  *m = sg.micro_batches;
  return summarize(sg.engine, r);
}

// Idle time per stage of a schedule run on the engine with unit costs: a
// micro-batch's forward, input-gradient and weight-gradient passes through a
// stage each take 1 (split evenly over the stage's model chunks), and the
// pipeline's real dependencies: forward q after forward q-1, backward q after
// backward q+1 and forward q, W after its B.
using Orders = std::vector<std::vector<PipelineSlot>>;

double unit_bubble(PpSchedule sch, int64_t p, int64_t v, int64_t m, const Orders& orders) {
  Engine e;
  const int64_t chunks = sch == PpSchedule::kDualPipeV ? 2 : v;
  const double unit = 1.0 / static_cast<double>(chunks);
  const int64_t q_total = p * chunks;
  std::map<std::tuple<int, int64_t, int64_t>, TaskId> fwd, bwd, wgt;  // (kind, q, mb)
  std::vector<std::pair<PipelineSlot, std::pair<int64_t, TaskId>>> all;
  for (int64_t s = 0; s < p; ++s) {
    ResourceId stream = e.add_resource(e.add_process("stage" + std::to_string(s)), "compute",
                                       ResourceKind::kComputeStream);
    for (const PipelineSlot& x : orders[static_cast<size_t>(s)]) {
      const int64_t q = pipeline_model_chunk(sch, p, s, x.chunk);
      const double d = x.pass == PipelinePass::kBackward ? 2 * unit : unit;
      const char* kind[] = {"F", "BW", "B", "W"};
      TaskId t = e.add_compute(stream, std::string(kind[static_cast<int>(x.pass)]) + ".q" + std::to_string(q) +
                                           ".mb" + std::to_string(x.mb), "forward", d);
      auto key = std::make_tuple(0, q, x.mb);
      if (x.pass == PipelinePass::kForward) fwd[key] = t;
      if (x.pass == PipelinePass::kBackward || x.pass == PipelinePass::kInputGrad) bwd[key] = t;
      if (x.pass == PipelinePass::kWeightGrad) wgt[key] = t;
      all.push_back({x, {q, t}});
    }
  }
  for (const auto& [x, qt] : all) {
    const auto [q, t] = qt;
    auto at = [&](auto& by_key, int64_t qq) { return by_key.at(std::make_tuple(0, qq, x.mb)); };
    if (x.pass == PipelinePass::kForward && q > 0) e.add_dependency(at(fwd, q - 1), t);
    if (x.pass == PipelinePass::kBackward || x.pass == PipelinePass::kInputGrad) {
      e.add_dependency(at(fwd, q), t);
      if (q + 1 < q_total) e.add_dependency(at(bwd, q + 1), t);
    }
    if (x.pass == PipelinePass::kWeightGrad) e.add_dependency(at(bwd, q), t);
  }
  // Every (chunk, micro-batch) ran each pass once.
  REQUIRE(static_cast<int64_t>(fwd.size()) == q_total * m);
  REQUIRE(static_cast<int64_t>(bwd.size()) == q_total * m);
  return e.run().makespan_s - 3.0 * static_cast<double>(m);
}

double unit_bubble(PpSchedule sch, int64_t p, int64_t v, int64_t m) {
  Orders orders;
  for (int64_t s = 0; s < p; ++s) orders.push_back(pipeline_order(sch, p, v, m, s));
  return unit_bubble(sch, p, v, m, orders);
}

}  // namespace

TEST_CASE("hero: byte flows agree with the predictor without contention and carry real bytes",
          "[step_graph][flows]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
  Predictor p(c.graph, c.cluster);
  StepGraph own = build_step_graph(p, c.layout, quiet(false));
  RunResult a = own.engine.run();
  const double analytic = own.prediction.step_time_s - own.prediction.breakdown.host_stall_s;
  INFO("DES " << a.makespan_s << " s, analytic (no GC) " << analytic << " s");
  CHECK(a.makespan_s == Approx(analytic).epsilon(0.03));
  // EP all-to-all bytes on the first EP stream's NVLink (dispatch forward,
  // combine-gradient backward): micro-batches x 48 layers x 3 passes (forward,
  // recompute, backward) x 63/64 of each rank's A rows x 3072 x 2 bytes, x 704 GPUs.
  const ResourceId ep = find_resource(own.engine, "ep_all_to_all.nvlink");
  REQUIRE(ep.valid());
  const double rows = 16.0 * 4096 * 8;  // 16 sequences per micro-batch per GPU x top-8
  const double expect = static_cast<double>(own.micro_batches) * 48 * 3 * (63.0 / 64.0) * rows * 3072 * 2 * 704;
  CHECK(a.bytes_moved[ep.v] == Approx(expect).epsilon(1e-6));
  // Shared links: never faster than private ones.
  StepGraph shared = build_step_graph(p, c.layout, quiet(true));
  CHECK(shared.engine.run().makespan_s >= a.makespan_s * (1 - 1e-9));
}

TEST_CASE("contention: replicas' gradient rings on an oversubscribed fabric are slower by the expected amount",
          "[step_graph][flows]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
  Predictor p(c.graph, c.cluster);
  // Non-blocking (1) leaves the fabric out (it cannot bind); a hair above
  // keeps it as a link, nearly open, whose bytes and busy time we can read.
  StepGraphOptions non_blocking = quiet(true);
  StepGraphOptions open = quiet(true);
  open.fabric_oversubscription = 1.001;
  StepGraphOptions thin = quiet(true);
  thin.fabric_oversubscription = 64;  // 50 GB/s / 64 per GPU: far below any ring's rate
  StepGraph n = build_step_graph(p, c.layout, non_blocking);
  StepGraph a = build_step_graph(p, c.layout, open);
  StepGraph b = build_step_graph(p, c.layout, thin);
  RunResult ra = a.engine.run();
  RunResult rb = b.engine.run();
  CHECK(!find_resource(n.engine, "scale_out_fabric").valid());
  CHECK(n.engine.run().makespan_s == Approx(ra.makespan_s).epsilon(1e-6));
  const ResourceId fa = find_resource(a.engine, "scale_out_fabric");
  const ResourceId fb = find_resource(b.engine, "scale_out_fabric");
  REQUIRE(fa.valid());
  REQUIRE(fb.valid());
  // Only the cross-rack gradient all-reduces cross the fabric. Saturated, it
  // moves its bytes at capacity: the step grows by bytes / capacity minus the
  // time those flows took on the open fabric (up to what the backward hid).
  CHECK(rb.bytes_moved[fb.v] == Approx(ra.bytes_moved[fa.v]).epsilon(1e-9));
  const double saturated_s = rb.bytes_moved[fb.v] / b.engine.resource_bw(fb);
  CHECK(rb.busy_s[fb.v] == Approx(saturated_s).epsilon(0.01));
  const double grew = rb.makespan_s - ra.makespan_s;
  INFO("step " << ra.makespan_s << " -> " << rb.makespan_s << " s; fabric busy " << ra.busy_s[fa.v] << " -> "
               << rb.busy_s[fb.v] << " s");
  CHECK(grew > 0.5 * (saturated_s - ra.busy_s[fa.v]));
  CHECK(grew <= saturated_s - ra.busy_s[fa.v] + 1e-6);
}

TEST_CASE("pipeline schedules: 1F1B, interleaved, zero-bubble and DualPipeV with real dependencies",
          "[step_graph][pp]") {
  Case c = load("marin-535b-a23b.json", "gb200-12-racks.json", "gb200-pp6.json");
  Predictor p(c.graph, c.cluster);
  double pipe[4];
  int64_t m = 0;
  const StepSummary one = run_schedule(p, c.layout, PpSchedule::k1F1B, 1, &pipe[0], &m);
  const StepSummary inter = run_schedule(p, c.layout, PpSchedule::kInterleaved1F1B, 2, &pipe[1], &m);
  const StepSummary zb = run_schedule(p, c.layout, PpSchedule::kZeroBubble, 1, &pipe[2], &m);
  const StepSummary dpv = run_schedule(p, c.layout, PpSchedule::kDualPipeV, 1, &pipe[3], &m);
  const double pp = 6;
  const double closed = (pp - 1) / (static_cast<double>(m) + pp - 1);  // 1F1B idle share of the pipeline
  INFO("bubble fraction 1f1b " << one.bubble_fraction << " (closed form " << closed << " of the pipeline), interleaved "
                               << inter.bubble_fraction << ", zero bubble " << zb.bubble_fraction << ", dualpipev "
                               << dpv.bubble_fraction);
  REQUIRE(m == 24);
  // 1F1B idles at least the closed form over the pipeline part of the step
  // (more: exposed transfers lengthen the fill and drain).
  const double share = one.bubble_s / pipe[0];
  CHECK(share >= closed);
  CHECK(share < 1.35 * closed);
  CHECK(one.bubble_fraction > inter.bubble_fraction);
  CHECK(one.bubble_fraction > zb.bubble_fraction);
  CHECK(one.bubble_fraction > dpv.bubble_fraction);
}

TEST_CASE("pooled waves overlap the expert GEMMs; checkpoint steps save at storage bandwidth", "[step_graph][flows]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-pooled.json");
  Predictor p(c.graph, c.cluster);
  StepGraph sg = build_step_graph(p, c.layout, quiet(false));
  RunResult r = sg.engine.run();
  StepSummary s = summarize(sg.engine, r);
  const double ep_s = s.exposed_s_by_kind["ep_dispatch"] + s.exposed_s_by_kind["ep_combine"];
  INFO("pooled EP exposed: DES " << ep_s << " s, analytic " << sg.prediction.breakdown.ep_comm_s << " s");
  CHECK(ep_s < sg.prediction.breakdown.ep_comm_s * 1.1);
  Layout one_wave = c.layout;
  one_wave.waves = 1;
  StepGraph w1 = build_step_graph(p, one_wave, quiet(false));
  StepSummary s1 = summarize(w1.engine, w1.engine.run());
  CHECK(s1.exposed_s_by_kind["ep_dispatch"] + s1.exposed_s_by_kind["ep_combine"] > 1.5 * ep_s);

  StepGraphOptions save = quiet(true);
  save.steps = 2;
  save.checkpoint_every = 2;
  StepGraphOptions plain = quiet(true);
  plain.steps = 2;
  const double base = build_step_graph(p, c.layout, plain).engine.run().makespan_s;
  StepGraph ck = build_step_graph(p, c.layout, save);
  const double with = ck.engine.run().makespan_s;
  // 535.48B params x 8.0115 bytes at 2 TB/s (sim/goodput_defaults.json): ~2.14 s, blocking.
  CHECK(ck.checkpoint_bytes == Approx(535.48e9 * 8.0115).epsilon(0.001));
  CHECK(with - base == Approx(ck.checkpoint_bytes / 2e12).epsilon(0.01));
}

TEST_CASE("schedules that cannot run are one-line user errors", "[step_graph][errors]") {
  Case c = load("marin-535b-a23b.json", "gb200-12-racks.json", "gb200-pp6.json");
  Predictor p(c.graph, c.cluster);
  Layout l = c.layout;
  l.schedule = PpSchedule::kDualPipeV;
  l.tokens_per_step = 128 * 4 * 4096 * 8;  // 8 micro-batches < 2 x pp
  CHECK_THROWS_WITH(build_step_graph(p, l, {}), Contains("at least 2 x pp (12) micro-batches, found 8"));
  l = c.layout;
  l.schedule = PpSchedule::kInterleaved1F1B;
  l.pp_virtual = 2;
  l.tokens_per_step = 128 * 4 * 4096 * 25;
  CHECK_THROWS_WITH(build_step_graph(p, l, {}), Contains("multiple of pp"));
}


TEST_CASE("pipeline orders meet their closed-form bubbles with unit costs", "[step_graph][pp]") {
  const int64_t p = 6, m = 24;
  const double one = unit_bubble(PpSchedule::k1F1B, p, 1, m);
  const double inter = unit_bubble(PpSchedule::kInterleaved1F1B, p, 2, m);
  const double zb = unit_bubble(PpSchedule::kZeroBubble, p, 1, m);
  const double dpv = unit_bubble(PpSchedule::kDualPipeV, p, 1, m);
  INFO("idle per stage (units of one pass): 1f1b " << one << ", interleaved v2 " << inter << ", zb-h1 " << zb
                                                   << ", dualpipev " << dpv);
  // 1F1B: (p-1)(F+B+W), i.e. a bubble fraction (p-1)/(m+p-1) (Narayanan et al. 2021).
  CHECK(one == Approx((p - 1) * 3.0));
  CHECK(one / (one + 3.0 * m) == Approx((p - 1.0) / (m + p - 1.0)));
  // Interleaved: (p-1)(F+B+W)/v.
  CHECK(inter == Approx((p - 1) * 3.0 / 2));
  // ZB-H1: (p-1)(F+B-W) (Qi et al. 2024), a third of 1F1B when F = B = W.
  CHECK(zb == Approx((p - 1) * 1.0));
  CHECK(dpv < inter);
  CHECK(one > inter);
  CHECK(inter > zb);
}

TEST_CASE("a pipeline order that deadlocks is reported with its first offending dependency", "[step_graph][errors]") {
  const int64_t p = 4, m = 8;
  Orders orders;
  for (int64_t s = 0; s < p; ++s) orders.push_back(pipeline_order(PpSchedule::k1F1B, p, 1, m, s));
  // Stage 2 waits for micro-batch 1's gradient before it has sent micro-batch 1 forward.
  auto& o = orders[2];
  auto f1 = std::find_if(o.begin(), o.end(), [](const PipelineSlot& x) { return x.pass == PipelinePass::kForward && x.mb == 1; });
  auto b1 = std::find_if(o.begin(), o.end(), [](const PipelineSlot& x) { return x.pass == PipelinePass::kBackward && x.mb == 1; });
  REQUIRE(f1 < b1);
  std::iter_swap(f1, b1);
  try {
    unit_bubble(PpSchedule::k1F1B, p, 1, m, orders);
    FAIL("a deadlocked schedule ran");
  } catch (const UserError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Contains("first offending dependency"));
    CHECK(what.find('\n') == std::string::npos);
    CHECK_THAT(what, Contains("BW.q2.mb1"));
  }
}
