// Engine::add_dependencies: a barrier between two groups of tasks, joined
// through one internal hub when pairs would be more edges. It must schedule
// exactly like the pairwise dependencies, stay out of the task list and the
// critical path, and still name a cycle that runs through it.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "sim/base/check.h"
#include "sim/des.h"

using namespace rackstep::sim;

namespace {

// `before` tasks on their own streams with durations 1..nb s, then `after`
// tasks on their own streams, each 0.5 s; every after task waits for every
// before task, by a hub (use_hub) or by pairs.
struct Barrier {
  Engine e;
  std::vector<TaskId> before, after;
};

Barrier barrier(int nb, int na, bool use_hub) {
  Barrier b;
  const int p = b.e.add_process("gpu");
  for (int i = 0; i < nb; ++i) {
    ResourceId s = b.e.add_resource(p, "b" + std::to_string(i), ResourceKind::kComputeStream);
    b.before.push_back(b.e.add_compute(s, "before" + std::to_string(i), "forward", 1.0 + i));
  }
  for (int i = 0; i < na; ++i) {
    ResourceId s = b.e.add_resource(p, "a" + std::to_string(i), ResourceKind::kComputeStream);
    b.after.push_back(b.e.add_compute(s, "after" + std::to_string(i), "backward", 0.5));
  }
  if (use_hub) {
    b.e.add_dependencies(b.before, b.after);
  } else {
    for (TaskId a : b.after) {
      for (TaskId x : b.before) b.e.add_dependency(x, a);
    }
  }
  return b;
}

}  // namespace

TEST_CASE("add_dependencies: every after task waits for the last before task", "[des][hub]") {
  Barrier b = barrier(5, 7, true);
  CHECK(b.e.num_tasks() == 12);          // the hub is not a task
  CHECK(b.e.dependencies().empty());     // 35 pairs would be more edges than 5 + 7
  RunResult r = b.e.run();
  REQUIRE(r.start_s.size() == 12);
  for (TaskId a : b.after) {
    CHECK(r.start_s[a.v] == Approx(5.0));
    CHECK(r.end_s[a.v] == Approx(5.5));
  }
  CHECK(r.makespan_s == Approx(5.5));
  // The path runs from the longest before task straight to an after task.
  REQUIRE(r.critical_path.size() == 2);
  CHECK(r.critical_path[0].v == b.before.back().v);
  CHECK(r.critical_path[1].v >= b.after.front().v);
}

TEST_CASE("add_dependencies: a hub schedules exactly like the pairs", "[des][hub]") {
  Barrier hub = barrier(6, 9, true);
  Barrier pairs = barrier(6, 9, false);
  // More work after the barrier, and a second barrier on top of the first.
  for (Barrier* b : {&hub, &pairs}) {
    const int p = b->e.add_process("host");
    ResourceId q = b->e.add_resource(p, "q", ResourceKind::kHostCpu, 0, Order::kReadyOrder, 2);
    std::vector<TaskId> late;
    for (int i = 0; i < 4; ++i) late.push_back(b->e.add_compute(q, "late" + std::to_string(i), "host", 0.25 * (i + 1)));
    if (b == &hub) {
      b->e.add_dependencies(b->after, late);
      continue;
    }
    for (TaskId a : late) {
      for (TaskId x : b->after) b->e.add_dependency(x, a);
    }
  }
  RunResult rh = hub.e.run(), rp = pairs.e.run();
  CHECK(rh.start_s == rp.start_s);
  CHECK(rh.end_s == rp.end_s);
  CHECK(rh.makespan_s == rp.makespan_s);
  REQUIRE(rh.critical_path.size() == rp.critical_path.size());
  for (size_t i = 0; i < rh.critical_path.size(); ++i) CHECK(rh.critical_path[i].v == rp.critical_path[i].v);
  CHECK(hub.e.dependencies().empty());
  CHECK(pairs.e.dependencies().size() == 6 * 9 + 9 * 4);
}

TEST_CASE("add_dependencies: small groups become plain pairs, empty ones nothing", "[des][hub]") {
  Barrier b = barrier(1, 3, true);
  CHECK(b.e.dependencies().size() == 3);
  b.e.add_dependencies({}, b.after);
  b.e.add_dependencies(b.before, {});
  CHECK(b.e.dependencies().size() == 3);
  RunResult r = b.e.run();
  for (TaskId a : b.after) CHECK(r.start_s[a.v] == Approx(1.0));
}

TEST_CASE("add_dependencies: a cycle through a hub is named", "[des][hub]") {
  Barrier b = barrier(3, 4, true);
  // before0 waits for after2, which waits (through the hub) for before0.
  b.e.add_dependency(b.after[2], b.before[0]);
  try {
    b.e.run();
    FAIL("expected a cycle error");
  } catch (const rackstep::UserError& err) {
    const std::string msg = err.what();
    CHECK(msg.find("dependency cycle of 2 tasks") != std::string::npos);
    CHECK(msg.find("'before0'") != std::string::npos);
    CHECK(msg.find("'after2'") != std::string::npos);
    CHECK(msg.find("stream order") == std::string::npos);
  }
  Barrier self = barrier(3, 4, true);
  CHECK_THROWS_AS(self.e.add_dependencies({self.before[0], self.before[1], self.after[0]},
                                          {self.after[0], self.after[1], self.after[2]}),
                  rackstep::UserError);
}
