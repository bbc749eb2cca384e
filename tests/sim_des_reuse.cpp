// A thread reuses a run's buffers and what it derived from a graph (see
// RunMemory in sim/des.cpp): runs must not depend on what ran before them on
// the same thread, and a graph grown after a run must be derived again.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "sim/des.h"

using namespace rackstep::sim;

namespace {

// Two streams with a cross edge, a ready-order host queue and two flows
// sharing a link; `extra` adds one more kernel at the end of stream 0.
Engine small_graph(bool extra) {
  Engine e;
  const int p = e.add_process("gpu", 2);
  ResourceId s0 = e.add_resource(p, "s0", ResourceKind::kComputeStream);
  ResourceId s1 = e.add_resource(p, "s1", ResourceKind::kComputeStream);
  ResourceId host = e.add_resource(p, "host", ResourceKind::kHostCpu, 0, Order::kReadyOrder, 1);
  ResourceId nic = e.add_resource(p, "nic", ResourceKind::kNic, 10e9);
  TaskId a = e.add_compute(s0, "a", "forward", 1e-3);
  TaskId b = e.add_compute(s1, "b", "forward", 2e-3);
  TaskId h1 = e.add_compute(host, "h1", "host", 0.5e-3);
  TaskId h2 = e.add_compute(host, "h2", "host", 0.5e-3);
  TaskId f1 = e.add_transfer("f1", "ep_dispatch", {nic}, 1e7);
  TaskId f2 = e.add_transfer("f2", "ep_dispatch", {nic}, 2e7);
  e.add_dependency(a, h1);
  e.add_dependency(a, h2);
  e.add_dependency(a, f1);
  e.add_dependency(b, f2);
  TaskId c = e.add_compute(s0, "c", "backward", 1e-3);
  e.add_dependency(f2, c);
  if (extra) {
    TaskId d = e.add_compute(s0, "d", "backward", 5e-3);
    e.add_dependency(h2, d);
  }
  return e;
}

void same(const RunResult& x, const RunResult& y) {
  CHECK(x.start_s == y.start_s);
  CHECK(x.end_s == y.end_s);
  CHECK(x.flow_start_s == y.flow_start_s);
  CHECK(x.busy_s == y.busy_s);
  CHECK(x.events == y.events);
  REQUIRE(x.critical_path.size() == y.critical_path.size());
  for (size_t i = 0; i < x.critical_path.size(); ++i) CHECK(x.critical_path[i].v == y.critical_path[i].v);
}

}  // namespace

TEST_CASE("des runs on one thread do not depend on the runs before them", "[des][reuse]") {
  RunOptions jit;
  jit.seed = 7;
  jit.jitter_sigma = 0.3;
  const RunResult plain = small_graph(false).run();
  const RunResult jittered = small_graph(false).run(jit);
  REQUIRE(plain.start_s != jittered.start_s);  // the options matter here

  Engine e = small_graph(false);
  same(e.run(jit), jittered);
  same(e.run(), plain);  // no jitter left over from the run before
  same(e.run(jit), jittered);
  Engine other = small_graph(true);
  const RunResult other_r = other.run();
  same(e.run(), plain);  // another graph in between
  same(other.run(), other_r);
  Engine copy = e;
  same(copy.run(), plain);
}

TEST_CASE("des: a graph grown after a run is derived again", "[des][reuse]") {
  Engine e = small_graph(false);
  const RunResult before = e.run();
  const int p = 0;
  ResourceId s = e.add_resource(p, "late", ResourceKind::kComputeStream);
  TaskId late = e.add_compute(s, "late", "forward", 1.0);
  e.add_dependency({0}, late);
  const RunResult after = e.run();
  REQUIRE(after.end_s.size() == before.end_s.size() + 1);
  CHECK(after.end_s[late.v] == Approx(1.0 + 1e-3));
  CHECK(after.makespan_s == Approx(1.0 + 1e-3));
  // Adding only an edge between existing tasks changes the run as well.
  Engine g = small_graph(false);
  const RunResult g0 = g.run();
  g.add_dependency({5}, {1});  // b waits for f2, which waits for b: a cycle now
  CHECK_THROWS(g.run());
  Engine h = small_graph(false);
  h.run();
  h.add_dependency({3}, {1});  // b waits for h2, queued behind h1 after a: b starts at 2 ms
  const RunResult h1 = h.run();
  CHECK(h1.start_s[1] == Approx(2e-3));
  CHECK(g0.start_s[1] == 0);
}
