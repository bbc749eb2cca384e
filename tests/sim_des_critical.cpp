// Critical path of a simulated step: hand-built graphs whose chain is known,
// the waits it runs through (contention, a busy slot), its summary by class and
// category, and the trace slices it marks for the GUI.
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "sim/des.h"
#include "sim/base/trace.h"

using namespace rackstep::sim;
using Catch::Matchers::Contains;

namespace {

std::vector<int32_t> ids(const std::vector<TaskId>& path) {
  std::vector<int32_t> out;
  for (TaskId t : path) out.push_back(t.v);
  return out;
}

// gpu0 computes A (1 s), then sends X (2 B) over its 1 B/s NIC while Y (1 B),
// also released by A, shares that NIC; gpu1 computes C (3 s) meanwhile; B on
// gpu1 needs both X and C.
//   X and Y at 0.5 B/s until Y ends at t=3 (1 B each); X's last byte at 1 B/s: ends at 4.
//   B: 4 -> 5. C ends at 3, so the chain is A, X, B; X lost 1 s to Y.
struct Contended {
  Engine e;
  TaskId a, x, y, c, b;
  Contended() {
    int g0 = e.add_process("gpu0"), g1 = e.add_process("gpu1");
    ResourceId c0 = e.add_resource(g0, "compute", ResourceKind::kComputeStream);
    ResourceId m0 = e.add_resource(g0, "comm", ResourceKind::kCommStream);
    ResourceId nic = e.add_resource(g0, "nic", ResourceKind::kNic, 1.0);
    ResourceId c1 = e.add_resource(g1, "compute", ResourceKind::kComputeStream);
    a = e.add_compute(c0, "A", "forward", 1.0);
    x = e.add_transfer("X", "pp_send", {nic}, 2.0, m0);
    y = e.add_transfer("Y", "grad_sync", {nic}, 1.0);
    c = e.add_compute(c1, "C", "forward", 3.0);
    b = e.add_compute(c1, "B", "forward", 1.0);
    e.add_dependency(a, x);
    e.add_dependency(a, y);
    e.add_dependency(x, b);
  }
};

}  // namespace

TEST_CASE("critical path of a hand-built graph runs through the contended transfer", "[des][critical]") {
  Contended g;
  RunResult r = g.e.run();
  REQUIRE(r.makespan_s == Approx(5.0));
  CHECK(r.end_s[g.x.v] == Approx(4.0));
  CHECK(ids(r.critical_path) == std::vector<int32_t>{g.a.v, g.x.v, g.b.v});
  CHECK(r.flow_start_s[g.x.v] == Approx(1.0));
  CHECK(r.flow_start_s[g.a.v] == r.end_s[g.a.v]);  // moves no bytes

  StepSummary s = summarize(g.e, r);
  CHECK(s.critical_path_s_by_class["compute"] == Approx(2.0));
  CHECK(s.critical_path_s_by_class["communication"] == Approx(3.0));
  CHECK(s.critical_path_s_by_class.count("host") == 0);
  CHECK(s.critical_path_s_by_category["pp_send"] == Approx(3.0));
  CHECK(s.critical_path_s_by_category.count("grad_sync") == 0);  // Y is off the path
  // X alone would take 2 s; it took 3.
  CHECK(g.e.uncontended_flow_s(g.x) == Approx(2.0));
  CHECK(s.critical_path_contention_s == Approx(1.0));
  CHECK(s.critical_path_contention_s_by_category["pp_send"] == Approx(1.0));

  std::string text = format_summary(g.e, s);
  CHECK_THAT(text, Contains("lost to contention"));
  CHECK_THAT(text, Contains("communication"));
}

TEST_CASE("without the competing flow the transfer loses nothing to contention", "[des][critical]") {
  Engine e;
  int g0 = e.add_process("gpu0");
  ResourceId c0 = e.add_resource(g0, "compute", ResourceKind::kComputeStream);
  ResourceId nic = e.add_resource(g0, "nic", ResourceKind::kNic, 4.0);
  TaskId a = e.add_compute(c0, "A", "forward", 1.0);
  TaskId x = e.add_transfer("X", "pp_send", {nic}, 2.0, {}, 0.25);  // 0.25 s latency, then 0.5 s of bytes
  e.add_dependency(a, x);
  RunResult r = e.run();
  REQUIRE(r.makespan_s == Approx(1.75));
  StepSummary s = summarize(e, r);
  CHECK(s.critical_path_s_by_category["pp_send"] == Approx(0.75));
  CHECK(s.critical_path_contention_s == Approx(0.0).margin(1e-12));
  CHECK(format_summary(e, s).find("lost to contention") == std::string::npos);
}

TEST_CASE("a task that waited for a busy slot has the slot's holder before it on the path", "[des][critical]") {
  Engine e;
  int host = e.add_process("host");
  ResourceId cpu = e.add_resource(host, "cpu", ResourceKind::kHostCpu, 0, Order::kReadyOrder, 1);
  int g = e.add_process("gpu0");
  ResourceId c0 = e.add_resource(g, "compute", ResourceKind::kComputeStream);
  TaskId j1 = e.add_compute(cpu, "gc", "gc_stall", 2.0);
  TaskId j2 = e.add_compute(cpu, "load", "data", 1.0);  // ready at 0, runs 2 -> 3
  e.add_compute(c0, "side", "forward", 0.5);  // before k in stream order, off the path
  TaskId k = e.add_compute(c0, "step", "forward", 1.0);
  e.add_dependency(j2, k);
  RunResult r = e.run();
  REQUIRE(r.makespan_s == Approx(4.0));
  CHECK(ids(r.critical_path) == std::vector<int32_t>{j1.v, j2.v, k.v});
  StepSummary s = summarize(e, r);
  CHECK(s.critical_path_s_by_class["host"] == Approx(3.0));
  CHECK(s.critical_path_s_by_class["compute"] == Approx(1.0));
}

TEST_CASE("the critical path of a step with stream order picks the later of two inputs", "[des][critical]") {
  // Two layers on one stream; the second waits for a gather that finishes after the first layer.
  Engine e;
  int g = e.add_process("gpu0");
  ResourceId c0 = e.add_resource(g, "compute", ResourceKind::kComputeStream);
  ResourceId ag = e.add_resource(g, "allgather", ResourceKind::kCommStream);
  e.add_compute(c0, "L0", "forward", 1.0);
  TaskId gather = e.add_compute(ag, "L1.gather", "fsdp_allgather", 1.5);
  TaskId l1 = e.add_compute(c0, "L1", "forward", 1.0);
  e.add_dependency(gather, l1);
  RunResult r = e.run();
  REQUIRE(r.makespan_s == Approx(2.5));
  CHECK(ids(r.critical_path) == std::vector<int32_t>{gather.v, l1.v});
  // Make the gather fast: the stream order (L0) becomes the binding input.
  Engine e2;
  int g2 = e2.add_process("gpu0");
  ResourceId c2 = e2.add_resource(g2, "compute", ResourceKind::kComputeStream);
  ResourceId ag2 = e2.add_resource(g2, "allgather", ResourceKind::kCommStream);
  TaskId m0 = e2.add_compute(c2, "L0", "forward", 1.0);
  TaskId fast = e2.add_compute(ag2, "L1.gather", "fsdp_allgather", 0.5);
  TaskId m1 = e2.add_compute(c2, "L1", "forward", 1.0);
  e2.add_dependency(fast, m1);
  RunResult r2 = e2.run();
  CHECK(ids(r2.critical_path) == std::vector<int32_t>{m0.v, m1.v});
}

TEST_CASE("the trace marks exactly the critical slices with args.critical", "[des][critical][trace]") {
  Contended g;
  RunResult r = g.e.run();
  TraceWriter w;
  export_trace(g.e, r, w);
  nlohmann::json doc = nlohmann::json::parse(w.to_string());
  std::vector<std::string> marked, unmarked;
  for (const auto& ev : doc["traceEvents"]) {
    if (ev["ph"] != "X") continue;
    const bool crit = ev.contains("args") && ev["args"].value("critical", false);
    (crit ? marked : unmarked).push_back(ev["name"].get<std::string>());
  }
  CHECK(marked == std::vector<std::string>{"A", "X", "B"});
  CHECK(unmarked.size() == 2);  // Y and C

  TraceOptions plain;
  plain.mark_critical = false;
  TraceWriter w2;
  export_trace(g.e, r, w2, plain);
  CHECK(w2.to_string().find("\"critical\"") == std::string::npos);
}
