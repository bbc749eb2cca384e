// Discrete-event engine: scheduling, fair bandwidth sharing, symmetry,
// determinism, jitter, cycle detection and the step summary.
#include <catch2/catch.hpp>

#include <string>

#include "sim/base/check.h"
#include "sim/des.h"

using namespace rackstep::sim;
using Catch::Matchers::Contains;

namespace {

struct Gpu {
  int process;
  ResourceId compute, comm, nic;
};

Gpu add_gpu(Engine& e, const std::string& name, double nic_bw = 1.0, int64_t multiplicity = 1) {
  Gpu g;
  g.process = e.add_process(name, multiplicity);
  g.compute = e.add_resource(g.process, "compute", ResourceKind::kComputeStream);
  g.comm = e.add_resource(g.process, "comm", ResourceKind::kCommStream);
  g.nic = e.add_resource(g.process, "nic", ResourceKind::kNic, nic_bw);
  return g;
}

RunOptions seeded(uint64_t seed, double sigma) {
  RunOptions o;
  o.seed = seed;
  o.jitter_sigma = sigma;
  return o;
}

}  // namespace

TEST_CASE("tasks on one stream run back to back in issue order", "[des]") {
  Engine e;
  Gpu g = add_gpu(e, "gpu0");
  TaskId a = e.add_compute(g.compute, "a", "forward", 1.0);
  TaskId b = e.add_compute(g.compute, "b", "forward", 2.0);
  // c is issued after b but depends on nothing else: the stream still orders it.
  TaskId c = e.add_compute(g.compute, "c", "forward", 0.5);
  RunResult r = e.run();
  CHECK(r.makespan_s == Approx(3.5));
  CHECK(r.start_s[b.v] == Approx(1.0));
  CHECK(r.start_s[c.v] == Approx(3.0));
  CHECK(r.end_s[a.v] == Approx(1.0));
  CHECK(r.busy_s[g.compute.v] == Approx(3.5));
}

TEST_CASE("dependencies across streams wait for the slowest input", "[des]") {
  Engine e;
  Gpu g0 = add_gpu(e, "gpu0"), g1 = add_gpu(e, "gpu1");
  TaskId a = e.add_compute(g0.compute, "a", "forward", 1.0);
  TaskId b = e.add_compute(g1.compute, "b", "forward", 3.0);
  TaskId c = e.add_compute(g0.compute, "c", "forward", 1.0);
  e.add_dependency(a, c);
  e.add_dependency(b, c);
  RunResult r = e.run();
  CHECK(r.start_s[c.v] == Approx(3.0));
  CHECK(r.makespan_s == Approx(4.0));
  // The critical path runs through the slower input.
  REQUIRE(r.critical_path.size() == 2);
  CHECK(r.critical_path[0].v == b.v);
  CHECK(r.critical_path[1].v == c.v);
}

TEST_CASE("a ready-order resource runs up to its slots at once", "[des]") {
  Engine e;
  int host = e.add_process("host");
  ResourceId cpu = e.add_resource(host, "cpu", ResourceKind::kHostCpu, 0, Order::kReadyOrder, 2);
  for (int i = 0; i < 5; ++i) e.add_compute(cpu, "job" + std::to_string(i), "host", 1.0);
  RunResult r = e.run();
  CHECK(r.makespan_s == Approx(3.0));  // 2 + 2 + 1
  CHECK(r.busy_s[cpu.v] == Approx(5.0));
}

TEST_CASE("concurrent flows share a link fairly and speed up when one ends", "[des][flows]") {
  Engine e;
  Gpu g = add_gpu(e, "gpu0", 1.0);
  TaskId small = e.add_transfer("small", "ag", {g.nic}, 1.0);
  TaskId big = e.add_transfer("big", "ag", {g.nic}, 3.0);
  RunResult r = e.run();
  // Both at 0.5 B/s until the small one ends at t=2; the big one then has 2 B at 1 B/s.
  CHECK(r.end_s[small.v] == Approx(2.0));
  CHECK(r.end_s[big.v] == Approx(4.0));
  CHECK(r.bytes_moved[g.nic.v] == Approx(4.0));
  CHECK(r.busy_s[g.nic.v] == Approx(4.0));
}

TEST_CASE("max-min fairness gives leftover bandwidth to unconstrained flows", "[des][flows]") {
  Engine e;
  int fabric = e.add_process("fabric");
  ResourceId l1 = e.add_resource(fabric, "l1", ResourceKind::kFabricLink, 1.0);
  ResourceId l2 = e.add_resource(fabric, "l2", ResourceKind::kFabricLink, 0.5);
  TaskId f1 = e.add_transfer("f1", "x", {l1}, 1.0);
  TaskId f2 = e.add_transfer("f2", "x", {l1, l2}, 1.0);
  TaskId f3 = e.add_transfer("f3", "x", {l2}, 1.0);
  RunResult r = e.run();
  // l2 is the bottleneck: f2 and f3 get 0.25 each; f1 takes the remaining 0.75 of l1.
  CHECK(r.end_s[f1.v] == Approx(1.0 / 0.75));
  CHECK(r.end_s[f2.v] == Approx(4.0));
  CHECK(r.end_s[f3.v] == Approx(4.0));
}

TEST_CASE("a rate cap limits a flow and frees bandwidth for others", "[des][flows]") {
  Engine e;
  Gpu g = add_gpu(e, "gpu0", 1.0);
  TaskSpec capped;
  capped.name = "capped";
  capped.category = "x";
  capped.bytes = 1.0;
  capped.links = {g.nic};
  capped.max_rate_bytes_per_s = 0.25;
  TaskId a = e.add_task(capped);
  TaskId b = e.add_transfer("free", "x", {g.nic}, 1.5);
  RunResult r = e.run();
  CHECK(r.end_s[a.v] == Approx(4.0));
  CHECK(r.end_s[b.v] == Approx(2.0));  // 0.75 B/s
}

TEST_CASE("a transfer spends its latency before its bytes and holds its stream", "[des][flows]") {
  Engine e;
  Gpu g = add_gpu(e, "gpu0", 2.0);
  TaskId t = e.add_transfer("rs", "reduce_scatter", {g.nic}, 4.0, g.comm, 0.5);
  TaskId u = e.add_compute(g.comm, "next", "x", 1.0);
  RunResult r = e.run();
  CHECK(r.end_s[t.v] == Approx(2.5));
  CHECK(r.start_s[u.v] == Approx(2.5));
  CHECK(r.busy_s[g.comm.v] == Approx(3.5));
}

TEST_CASE("one representative with multiplicity matches the explicit symmetric cluster", "[des][symmetry]") {
  // Four GPUs, each sending 1 B through its own 1 B/s NIC into a shared 2 B/s spine.
  Engine full;
  int fab = full.add_process("fabric");
  ResourceId spine = full.add_resource(fab, "spine", ResourceKind::kFabricLink, 2.0);
  std::vector<TaskId> sends;
  for (int i = 0; i < 4; ++i) {
    Gpu g = add_gpu(full, "gpu" + std::to_string(i), 1.0);
    TaskId c = full.add_compute(g.compute, "c", "forward", 1.0);
    TaskId s = full.add_transfer("send", "dp", {g.nic, spine}, 1.0, g.comm);
    full.add_dependency(c, s);
    sends.push_back(s);
  }
  RunResult rf = full.run();

  Engine sym;
  int fab2 = sym.add_process("fabric");
  ResourceId spine2 = sym.add_resource(fab2, "spine", ResourceKind::kFabricLink, 2.0);
  Gpu rep = add_gpu(sym, "gpu0..3", 1.0, 4);
  TaskId c = sym.add_compute(rep.compute, "c", "forward", 1.0);
  TaskId s = sym.add_transfer("send", "dp", {rep.nic, spine2}, 1.0, rep.comm);
  sym.add_dependency(c, s);
  RunResult rs = sym.run();

  CHECK(rf.end_s[sends[0].v] == Approx(3.0));  // 1 s compute + 1 B at 0.5 B/s per copy
  CHECK(rs.end_s[s.v] == Approx(rf.end_s[sends[0].v]));
  CHECK(rs.makespan_s == Approx(rf.makespan_s));
  CHECK(rs.bytes_moved[spine2.v] == Approx(rf.bytes_moved[spine.v]));
}

TEST_CASE("contention the analytic model ignores shows up in the simulated step", "[des][flows]") {
  // Two GPUs' gradient transfers cross one fabric link: each alone takes 1 s,
  // together 2 s.
  auto build = [](bool both) {
    Engine e;
    int fab = e.add_process("fabric");
    ResourceId link = e.add_resource(fab, "uplink", ResourceKind::kFabricLink, 1.0);
    for (int i = 0; i < (both ? 2 : 1); ++i) {
      Gpu g = add_gpu(e, "gpu" + std::to_string(i), 10.0);
      e.add_transfer("grad", "dp", {g.nic, link}, 1.0, g.comm);
    }
    return e.run().makespan_s;
  };
  CHECK(build(false) == Approx(1.0));
  CHECK(build(true) == Approx(2.0));
}

TEST_CASE("a dependency cycle is reported with its offending dependency", "[des][errors]") {
  Engine e;
  Gpu g0 = add_gpu(e, "gpu0"), g1 = add_gpu(e, "gpu1");
  TaskId a = e.add_compute(g0.compute, "a", "forward", 1.0);
  TaskId b = e.add_compute(g1.compute, "b", "forward", 1.0);
  TaskId c = e.add_compute(g1.compute, "c", "forward", 1.0);
  e.add_dependency(a, b);
  e.add_dependency(b, c);
  e.add_dependency(c, a);  // closes the loop
  REQUIRE_THROWS_AS(e.run(), rackstep::UserError);
  REQUIRE_THROWS_WITH(e.run(), Contains("dependency cycle of 3 tasks") &&
                                   Contains("first offending dependency: 'c' (gpu1/compute) -> 'a' (gpu0/compute)"));
}

TEST_CASE("a pipeline deadlock through stream order is detected, not looped on", "[des][errors]") {
  // Each stage issues its receive before its send on one in-order stream: the
  // classic PP deadlock. No explicit cycle; the cycle runs through stream order.
  Engine e;
  Gpu g0 = add_gpu(e, "stage0"), g1 = add_gpu(e, "stage1");
  TaskId recv0 = e.add_compute(g0.comm, "recv_from_1", "pp_recv", 0.1);
  TaskId send0 = e.add_compute(g0.comm, "send_to_1", "pp_send", 0.1);
  TaskId recv1 = e.add_compute(g1.comm, "recv_from_0", "pp_recv", 0.1);
  TaskId send1 = e.add_compute(g1.comm, "send_to_0", "pp_send", 0.1);
  e.add_dependency(send1, recv0);
  e.add_dependency(send0, recv1);
  REQUIRE_THROWS_WITH(e.run(), Contains("stream order") && Contains("first offending dependency"));
}

TEST_CASE("a self-dependency is rejected when added", "[des][errors]") {
  Engine e;
  Gpu g = add_gpu(e, "gpu0");
  TaskId a = e.add_compute(g.compute, "a", "forward", 1.0);
  REQUIRE_THROWS_WITH(e.add_dependency(a, a), Contains("depends on itself"));
}

TEST_CASE("bad tasks and resources are user errors", "[des][errors]") {
  Engine e;
  Gpu g = add_gpu(e, "gpu0");
  CHECK_THROWS_AS(e.add_resource(g.process, "nic2", ResourceKind::kNic, 0.0), rackstep::UserError);
  CHECK_THROWS_AS(e.add_compute(g.compute, "neg", "x", -1.0), rackstep::UserError);
  CHECK_THROWS_AS(e.add_transfer("nolinks", "x", {}, 1.0, g.comm), rackstep::UserError);
  CHECK_THROWS_AS(e.add_transfer("notalink", "x", {g.compute}, 1.0), rackstep::UserError);
  CHECK_THROWS_AS(e.add_process("p", 0), rackstep::UserError);
}

TEST_CASE("jitter is deterministic for a seed and mean-preserving", "[des][jitter]") {
  Engine e;
  Gpu g = add_gpu(e, "gpu0");
  const int n = 20000;
  for (int i = 0; i < n; ++i) e.add_compute(g.compute, "k", "forward", 1e-3);
  RunResult a = e.run(seeded(7, 0.2));
  RunResult b = e.run(seeded(7, 0.2));
  RunResult c = e.run(seeded(8, 0.2));
  RunResult none = e.run();
  CHECK(a.makespan_s == b.makespan_s);
  CHECK(a.makespan_s != c.makespan_s);
  CHECK(none.makespan_s == Approx(n * 1e-3));
  // Sum of 20,000 lognormal(sigma 0.2) draws: relative sd ~0.14%; 1% is > 5 sd.
  CHECK(a.makespan_s == Approx(n * 1e-3).epsilon(0.01));
}

TEST_CASE("stragglers and slow processes stretch the step", "[des][jitter]") {
  Engine e;
  Gpu g0 = add_gpu(e, "gpu0"), g1 = add_gpu(e, "gpu1");
  TaskId a = e.add_compute(g0.compute, "a", "forward", 1.0);
  TaskId b = e.add_compute(g1.compute, "b", "forward", 1.0);
  TaskId join = e.add_compute(g0.compute, "join", "forward", 1.0);
  e.add_dependency(b, join);
  (void)a;
  RunOptions all_slow;
  all_slow.straggler_probability = 1.0;
  all_slow.straggler_slowdown = 2.0;
  CHECK(e.run(all_slow).makespan_s == Approx(4.0));
  RunOptions one_slow;
  one_slow.slow_processes = {{g1.process, 3.0}};
  CHECK(e.run(one_slow).makespan_s == Approx(4.0));  // b takes 3 s, join waits
  CHECK(e.run().makespan_s == Approx(2.0));
}

TEST_CASE("a long chain of zero-time tasks finishes without recursion", "[des]") {
  Engine e;
  Gpu g = add_gpu(e, "gpu0");
  TaskId prev = e.add_compute(g.comm, "t0", "x", 0.0);
  for (int i = 1; i < 200000; ++i) {
    TaskId t = e.add_compute(g.compute, "t", "x", 0.0);
    e.add_dependency(prev, t);
    prev = t;
  }
  RunResult r = e.run();
  CHECK(r.makespan_s == 0.0);
  CHECK(r.end_s[prev.v] == 0.0);
}

TEST_CASE("the summary separates compute, exposed communication and bubbles", "[des][summary]") {
  Engine e;
  Gpu g0 = add_gpu(e, "gpu0", 1.0), g1 = add_gpu(e, "gpu1", 1.0);
  // gpu0: compute 1 s, then a 1 s all-gather that the next compute waits for (exposed),
  // plus a 1 s reduce-scatter that overlaps the second compute (hidden).
  TaskId c0 = e.add_compute(g0.compute, "c0", "forward", 1.0);
  TaskId ag = e.add_transfer("ag", "fsdp_allgather", {g0.nic}, 1.0, g0.comm);
  e.add_dependency(c0, ag);
  TaskId c1 = e.add_compute(g0.compute, "c1", "forward", 1.0);
  e.add_dependency(ag, c1);
  TaskId rs = e.add_transfer("rs", "reduce_scatter", {g0.nic}, 1.0, g0.comm);
  e.add_dependency(ag, rs);
  // gpu1: waits for gpu0's c1 (a pipeline dependency), then computes 1 s.
  TaskId d = e.add_compute(g1.compute, "d", "forward", 1.0);
  e.add_dependency(c1, d);
  RunResult r = e.run();
  REQUIRE(r.makespan_s == Approx(4.0));
  StepSummary s = summarize(e, r);
  // Mean over the two GPUs.
  CHECK(s.compute_busy_s == Approx((2.0 + 1.0) / 2));
  CHECK(s.exposed_s_by_kind["fsdp_allgather"] == Approx(1.0 / 2));
  CHECK(s.exposed_s_by_kind["reduce_scatter"] == Approx(0.0));
  // gpu0 idles 1 s at the end; gpu1 idles 3 s waiting.
  CHECK(s.bubble_s == Approx((1.0 + 3.0) / 2));
  CHECK(s.bubble_fraction == Approx(0.5));
  CHECK(s.critical_path_s_by_category["fsdp_allgather"] == Approx(1.0));
  CHECK(s.critical_path_s_by_category["forward"] == Approx(3.0));
  std::string text = format_summary(e, s);
  CHECK_THAT(text, Contains("fsdp_allgather"));
}
