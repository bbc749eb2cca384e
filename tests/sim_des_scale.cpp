// The DES at scale and its what-if questions: exact traces (no two slices on
// one thread overlap, recompute labelled recompute, transfers carry bytes and
// tier, barrier arrows drawn), and what-ifs that change the step the way they
// should (a failed NIC, uneven expert load, a degraded link, who waits for whom).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/base/check.h"
#include "sim/des.h"
#include "sim/predict.h"
#include "sim/step_graph.h"
#include "sim/base/trace.h"
#include "tests/sim_step_graph_case.h"

using namespace rackstep;
using namespace rackstep::sim;

using test::Case;
using test::load;

namespace {

// Integer nanoseconds from a trace's microseconds with three decimals.
int64_t ns(const nlohmann::json& us) { return std::llround(us.get<double>() * 1000.0); }

nlohmann::json trace_of(const Engine& e, const RunResult& r, TraceStats* stats = nullptr) {
  TraceWriter w;
  TraceStats s = export_trace(e, r, w);
  if (stats != nullptr) *stats = s;
  return nlohmann::json::parse(w.to_string());
}

// Every (pid, tid): slices sorted by start never overlap (end <= next start).
int64_t overlaps(const nlohmann::json& doc, std::string* first = nullptr) {
  std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>> rows;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    rows[{e["pid"].get<int>(), e["tid"].get<int>()}].emplace_back(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]));
  }
  int64_t bad = 0;
  for (auto& [key, v] : rows) {
    std::sort(v.begin(), v.end());
    for (size_t i = 1; i < v.size(); ++i) {
      if (v[i].first < v[i - 1].second) {
        if (bad++ == 0 && first != nullptr) {
          *first = "pid " + std::to_string(key.first) + " tid " + std::to_string(key.second) + " at " +
                   std::to_string(v[i].first) + " ns";
        }
      }
    }
  }
  return bad;
}

}  // namespace

TEST_CASE("a pipeline-layout trace has no overlapping slices on any thread", "[des][trace][scale]") {
  Case c = load("marin-535b-a23b.json", "gb200-12-racks.json", "gb200-pp6.json");
  Predictor p(c.graph, c.cluster);
  StepGraphOptions o;
  o.ranks_per_stage = 2;
  StepGraph sg = build_step_graph(p, c.layout, o);
  RunOptions ro;
  ro.jitter_sigma = 0.05;  // uneven times: flows on one link overlap partly
  RunResult r = sg.engine.run(ro);
  TraceStats st;
  nlohmann::json doc = trace_of(sg.engine, r, &st);
  std::string where;
  CHECK(overlaps(doc, &where) == 0);
  INFO(where);
  CHECK(st.slices == sg.engine.num_tasks());
  CHECK(st.arrows > 0);
  CHECK(st.arrows_left_out == 0);
  // Full recompute: the replayed layers (experts included) are recompute, never forward.
  int64_t recompute = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string name = e["name"];
    if (name.find(".recompute") == std::string::npos) continue;
    if (e["cat"] == "forward") FAIL("recomputed slice labelled forward: " << name);
    if (e["cat"] == "recompute") ++recompute;
  }
  CHECK(recompute > 0);
}

TEST_CASE("concurrent flows on one link go to lanes of their own, meeting slices share one timestamp",
          "[des][trace][scale]") {
  Engine e;
  const int g = e.add_process("gpu0");
  const ResourceId c = e.add_resource(g, "compute", ResourceKind::kComputeStream);
  const ResourceId nic = e.add_resource(g, "nic", ResourceKind::kNic, 3e9);
  // 1/3 ms steps: starts and durations that are not whole nanoseconds.
  const TaskId a = e.add_compute(c, "a", "forward", 1.0 / 3.0 * 1e-3);
  const TaskId b = e.add_compute(c, "b", "forward", 2.0 / 3.0 * 1e-3);
  const TaskId x = e.add_transfer("x", "ep_dispatch", {nic}, 1e6);
  const TaskId y = e.add_transfer("y", "ep_dispatch", {nic}, 2e6);
  e.add_dependency(a, x);
  e.add_dependency(a, y);
  e.add_dependency(y, b);
  const RunResult r = e.run();
  TraceStats st;
  nlohmann::json doc = trace_of(e, r, &st);
  CHECK(st.extra_lanes == 1);
  CHECK(overlaps(doc) == 0);
  int64_t a_end = -1, b_start = -2;
  bool lane = false;
  for (const auto& ev : doc["traceEvents"]) {
    if (ev["ph"] == "M" && ev["name"] == "thread_name" && ev["args"]["name"] == "nic #2") lane = true;
    if (ev["ph"] != "X") continue;
    if (ev["name"] == "y") a_end = ns(ev["ts"]) + ns(ev["dur"]);
    if (ev["name"] == "b") b_start = ns(ev["ts"]);
  }
  CHECK(lane);
  CHECK(a_end == b_start);
  (void)b;
}

TEST_CASE("trace slices carry FLOPs, or bytes, links, tier and communicator; barriers get arrows",
          "[des][trace][scale]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
  Predictor p(c.graph, c.cluster);
  StepGraphOptions o;
  o.ranks_per_stage = 4;
  StepGraph sg = build_step_graph(p, c.layout, o);
  RunResult r = sg.engine.run();
  TraceStats st;
  nlohmann::json doc = trace_of(sg.engine, r, &st);
  std::map<std::string, int> tiers;
  bool communicator = false;
  double expert_flops = 0;
  for (const auto& e : doc["traceEvents"]) {
    const std::string name = e.value("name", "");
    if (e["ph"] == "X" && e["cat"] == "forward" && name.find(".experts") != std::string::npos) {
      expert_flops = e["args"]["flops"].get<double>();
    }
    if (e["ph"] != "X" || !e.contains("args") || !e["args"].contains("bytes")) continue;
    CHECK(e["args"]["bytes"].get<double>() > 0);
    CHECK(!e["args"]["links"].empty());
    ++tiers[e["args"]["tier"].get<std::string>()];
    if (e["args"].contains("communicator") && e["args"]["communicator"] == "ep_all_to_all") communicator = true;
  }
  CHECK(tiers["nvlink"] > 0);
  CHECK(tiers["nic"] > 0);
  CHECK(communicator);
  CHECK(expert_flops > 1e9);  // compute slices carry their hardware FLOPs
  // Every task released through a hub (a collective's barrier) has an arrow into it.
  CHECK(st.arrows >= static_cast<int64_t>(sg.engine.hub_after_tasks().size()) / 2);
  // A limit leaves arrows out and says how many.
  TraceWriter w;
  TraceOptions few;
  few.max_flows = 10;
  TraceStats cut = export_trace(sg.engine, r, w, few);
  CHECK(cut.arrows == 10);
  CHECK(cut.arrows_left_out == st.arrows - 10);
}

TEST_CASE("what-ifs: a failed NIC, uneven expert load and a degraded link slow the step", "[des][whatif][scale]") {
  Case c = load("marin-535b-a23b.json", "gb200-11-racks.json", "hero-ragged.json");
  Predictor p(c.graph, c.cluster);
  StepGraphOptions o;
  o.ranks_per_stage = 4;
  o.gc_stalls = false;
  const double base = build_step_graph(p, c.layout, o).engine.run().makespan_s;

  StepGraphOptions failed = o;
  failed.failed_nics = {1};
  const double nic_down = build_step_graph(p, c.layout, failed).engine.run().makespan_s;
  CHECK(nic_down > base * 1.001);

  StepGraphOptions hot = o;
  hot.expert_load = {1.0, 1.0, 1.5, 1.0};
  StepGraph hot_sg = build_step_graph(p, c.layout, hot);
  RunResult hot_r = hot_sg.engine.run();
  CHECK(hot_r.makespan_s > base * 1.02);
  // The others wait for rank 2 (process 2) at the expert combines.
  std::vector<RankWait> waits = compute_waits(hot_sg.engine, hot_r);
  REQUIRE(waits.size() >= 4);
  CHECK(waits[0].wait_s_by_cause["stage0.rank2"] > waits[2].wait_s_by_cause["stage0.rank0"]);
  CHECK(waits[0].wait_s_by_cause["stage0.rank2"] > 0.01 * hot_r.makespan_s);

  StepGraph sg = build_step_graph(p, c.layout, o);
  ResourceId nic;
  for (int64_t i = 0; i < sg.engine.num_resources(); ++i) {
    const ResourceId id{static_cast<int32_t>(i)};
    if (sg.engine.resource_process(id) == 3 && sg.engine.resource_kind(id) == ResourceKind::kNic) nic = id;
  }
  REQUIRE(nic.valid());
  RunOptions slow_nic;
  slow_nic.slow_links = {{nic, 8.0}};
  CHECK(sg.engine.run(slow_nic).makespan_s > base * 1.01);
  RunOptions bad;
  bad.slow_links = {{nic, std::nan("")}};
  CHECK_THROWS_AS(sg.engine.run(bad), UserError);
  StepGraphOptions nowhere = o;
  nowhere.failed_nics = {99};
  CHECK_THROWS_AS(build_step_graph(p, c.layout, nowhere), UserError);
}
