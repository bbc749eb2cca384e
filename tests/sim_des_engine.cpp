// Event engine internals that the speed work touched: event order at equal
// times, max-min fairness with many weighted and capped flows, determinism for
// a seed on random graphs, and the critical path's invariants on them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/des.h"

using namespace rackstep::sim;

namespace {

// xorshift64: the tests' own deterministic draws.
struct Draws {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
};

// A random DAG over every kind of resource: in-order streams, a ready-order
// host with one or two slots, zero-time tasks, flows with latency, rate caps
// and weights over private and shared links, processes with multiplicity.
Engine random_graph(uint64_t seed, int tasks) {
  Draws d{seed * 2654435761ULL + 12345};
  Engine e;
  const int fabric = e.add_process("fabric");
  std::vector<ResourceId> shared, serial, nics;
  for (int i = 0; i < 3; ++i) {
    shared.push_back(e.add_resource(fabric, "link" + std::to_string(i), ResourceKind::kFabricLink, 1e9 * (1 + i)));
  }
  for (int g = 0; g < 6; ++g) {
    const int p = e.add_process("gpu" + std::to_string(g), 1 + d.below(4));
    serial.push_back(e.add_resource(p, "compute", ResourceKind::kComputeStream));
    serial.push_back(e.add_resource(p, "comm", ResourceKind::kCommStream));
    serial.push_back(e.add_resource(p, "host", ResourceKind::kHostCpu, 0, Order::kReadyOrder, 1 + d.below(2)));
    nics.push_back(e.add_resource(p, "nic", ResourceKind::kNic, 5e8 * (1 + d.below(3))));
  }
  std::vector<TaskId> made;
  for (int t = 0; t < tasks; ++t) {
    TaskSpec s;
    s.name = "t" + std::to_string(t);
    s.category = d.below(2) ? "forward" : "comm";
    if (d.below(4) < 2) {
      s.on = serial[d.below(static_cast<int>(serial.size()))];
      s.duration_s = d.below(5) == 0 ? 0.0 : 1e-4 * (1 + d.below(100));
    } else {
      if (d.below(2)) s.on = serial[d.below(static_cast<int>(serial.size()))];
      s.duration_s = d.below(2) ? 1e-5 : 0.0;
      s.bytes = 1e4 * (1 + d.below(1000));
      s.links.push_back(nics[d.below(static_cast<int>(nics.size()))]);
      if (d.below(2)) s.links.push_back(shared[d.below(3)]);
      if (d.below(5) == 0) s.max_rate_bytes_per_s = 2e8;
      if (d.below(6) == 0) s.weight = 1 + d.below(3);
    }
    TaskId id = e.add_task(s);
    const int deps = made.empty() ? 0 : d.below(3);
    for (int k = 0; k < deps; ++k) e.add_dependency(made[d.below(static_cast<int>(made.size()))], id);
    made.push_back(id);
  }
  return e;
}

RunOptions noisy(uint64_t seed) {
  RunOptions o;
  o.seed = seed;
  o.jitter_sigma = 0.3;
  o.straggler_probability = 0.05;
  o.straggler_slowdown = 3;
  o.slow_processes = {{2, 1.5}};
  return o;
}

}  // namespace

TEST_CASE("events at the same instant run in task order, whatever order they were pushed in", "[des][engine]") {
  // x and y end together at t=1; their host jobs compete for one slot, and the
  // job of the lower task id gets it first.
  for (bool x_first : {true, false}) {
    Engine e;
    int g0 = e.add_process("gpu0"), g1 = e.add_process("gpu1"), h = e.add_process("host");
    ResourceId c0 = e.add_resource(g0, "compute", ResourceKind::kComputeStream);
    ResourceId c1 = e.add_resource(g1, "compute", ResourceKind::kComputeStream);
    ResourceId cpu = e.add_resource(h, "cpu", ResourceKind::kHostCpu, 0, Order::kReadyOrder, 1);
    TaskId first = e.add_compute(x_first ? c0 : c1, "first", "forward", 1.0);
    TaskId second = e.add_compute(x_first ? c1 : c0, "second", "forward", 1.0);
    // Jobs added in the opposite order to the tasks that release them.
    TaskId job_second = e.add_compute(cpu, "job_second", "host", 1.0);
    TaskId job_first = e.add_compute(cpu, "job_first", "host", 1.0);
    e.add_dependency(second, job_second);
    e.add_dependency(first, job_first);
    RunResult r = e.run();
    CHECK(r.start_s[job_first.v] == Approx(1.0));
    CHECK(r.start_s[job_second.v] == Approx(2.0));
  }
}

TEST_CASE("many weighted, capped flows on one link get their max-min fair rates", "[des][flows][engine]") {
  // Water-filling on one link: flow i gets min(cap_i, level) per copy, with
  // sum_i w_i min(cap_i, level) = capacity. Give every flow bytes for exactly
  // one second at its fair rate: if every rate is right, all end together at
  // t = 1 (no flow ends early and hands bandwidth to the others).
  const double capacity = 1000.0;
  const int n = 200;
  std::vector<double> cap(n), weight(n);
  Draws d{42};
  for (int i = 0; i < n; ++i) {
    cap[i] = 0.5 + 0.05 * d.below(200);  // 0.5 .. 10.45 B/s
    weight[i] = 1 + d.below(3);
  }
  // Bisection for the water level (independent of the engine's progressive filling).
  auto used = [&](double level) {
    double u = 0;
    for (int i = 0; i < n; ++i) u += weight[i] * std::min(cap[i], level);
    return u;
  };
  REQUIRE(used(1e9) > capacity);  // the link is the bottleneck for some flows
  double lo = 0, hi = 1e3;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (used(mid) < capacity ? lo : hi) = mid;
  }
  const double level = 0.5 * (lo + hi);
  int capped = 0;
  for (int i = 0; i < n; ++i) capped += cap[i] < level ? 1 : 0;
  REQUIRE(capped > 10);       // both regimes are exercised
  REQUIRE(capped < n - 10);

  Engine e;
  int fabric = e.add_process("fabric");
  ResourceId link = e.add_resource(fabric, "link", ResourceKind::kFabricLink, capacity);
  std::vector<TaskId> flows;
  for (int i = 0; i < n; ++i) {
    TaskSpec s;
    s.name = "f" + std::to_string(i);
    s.category = "x";
    s.links = {link};
    s.bytes = std::min(cap[i], level);
    s.weight = weight[i];
    s.max_rate_bytes_per_s = cap[i];
    flows.push_back(e.add_task(s));
  }
  RunResult r = e.run();
  for (int i = 0; i < n; ++i) CHECK(r.end_s[flows[i].v] == Approx(1.0).epsilon(1e-6));
  CHECK(r.bytes_moved[link.v] == Approx(capacity).epsilon(1e-6));
}

TEST_CASE("random graphs: a seed fixes every result; another seed changes it", "[des][jitter][engine]") {
  for (uint64_t seed : {1u, 2u, 3u}) {
    Engine e = random_graph(seed, 2000);
    Engine same = random_graph(seed, 2000);
    RunResult a = e.run(noisy(seed)), b = same.run(noisy(seed)), c = e.run(noisy(seed + 100));
    CHECK(a.start_s == b.start_s);
    CHECK(a.end_s == b.end_s);
    CHECK(a.busy_s == b.busy_s);
    CHECK(a.bytes_moved == b.bytes_moved);
    CHECK(a.events == b.events);
    CHECK(a.makespan_s != c.makespan_s);
  }
}

TEST_CASE("random graphs: the critical path is a gapless chain from 0 to the makespan", "[des][critical][engine]") {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    Engine e = random_graph(seed, 1500);
    RunResult r = e.run(seed % 2 ? noisy(seed) : RunOptions{});
    REQUIRE_FALSE(r.critical_path.empty());
    CHECK(r.start_s[r.critical_path.front().v] == 0.0);
    CHECK(r.end_s[r.critical_path.back().v] == r.makespan_s);
    int gaps = 0;
    for (size_t i = 1; i < r.critical_path.size(); ++i) {
      // Exactly equal: a task starts at the instant its binding input ends.
      gaps += r.start_s[r.critical_path[i].v] != r.end_s[r.critical_path[i - 1].v] ? 1 : 0;
    }
    CHECK(gaps == 0);
    StepSummary s = summarize(e, r);
    double by_class = 0, by_category = 0;
    for (auto& [k, v] : s.critical_path_s_by_class) by_class += v;
    for (auto& [k, v] : s.critical_path_s_by_category) by_category += v;
    CHECK(by_class == Approx(r.makespan_s));
    CHECK(by_category == Approx(r.makespan_s));
    CHECK(s.critical_path_contention_s >= 0);
    CHECK(s.critical_path_contention_s <= s.critical_path_s_by_class["communication"] + 1e-12);
    // Every task ends no earlier than it starts, and flows start their bytes inside that span.
    REQUIRE(r.flow_start_s.size() == static_cast<size_t>(e.num_tasks()));
    int bad = 0;
    for (int64_t t = 0; t < e.num_tasks(); ++t) {
      const bool ordered = r.start_s[t] <= r.flow_start_s[t] && r.flow_start_s[t] <= r.end_s[t];
      bad += ordered ? 0 : 1;
    }
    CHECK(bad == 0);
  }
}
