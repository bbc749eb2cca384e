// The profiler (exec/profiler.h) on the backend's clock (exec/backend.h
// OpTiming): the CPU backend's default clock keeps the trace and
// op_measurements.json exactly in their form (the same fields, no device
// fields); a device clock's intervals are laid out from the step's first mark;
// the high-water mark behind "peak_device_bytes" (exec/high_water.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "exec/backend.h"
#include "exec/high_water.h"
#include "exec/model.h"
#include "exec/optim.h"
#include "exec/profiler.h"
#include "models/layer_graph.h"
#include "models/model.h"
#include "sim/base/json_io.h"
#include "sim/base/source_dir.h"
#include "tests/exec_test_batch.h"
#include "tests/temp_dir.h"

using namespace rackstep;
using namespace rackstep::exec;

namespace {

models::LayerGraph tiny_graph() {
  return models::build_layer_graph(
      models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/tiny-moe.json"));
}

// `steps` training steps of `m` under `prof`, as the trainer brackets them.
void profile_steps(Model& m, Profiler& prof, int steps) {
  const auto b = testing::make_batch(m.batch(), m.seq(), m.graph().model.vocab, 5);
  Optimizer opt(default_optimizer_config(100, m.graph().model.d_model, m.tokens()));
  OptimizerState st = init_optimizer_state(m.params());
  for (int s = 0; s < steps; ++s) {
    prof.begin_step(st.step);
    m.zero_grads();
    m.forward(b.inputs.data(), b.targets.data(), b.docs.data());
    m.backward();
    prof.begin_optimizer();
    opt.step(m.params(), m.grads(), st);
    m.update_balancing();
    prof.end_optimizer();
    prof.record_routing(m, b.docs.data());
    prof.end_step();
  }
}

std::set<std::string> keys(const nlohmann::json& j) {
  std::set<std::string> k;
  for (auto it = j.begin(); it != j.end(); ++it) k.insert(it.key());
  return k;
}

// A device-like clock: interval i starts 1 ms after interval i-1 and lasts 0.25 ms.
class FakeDeviceTiming final : public OpTiming {
 public:
  std::string clock() const override { return "fake_events"; }
  void begin_step() override { n_ = 0; }
  void begin() override { ++n_; }
  void end() override {}
  StepTiming end_step() override {
    StepTiming s;
    for (int i = 0; i < n_; ++i) s.intervals.push_back({1e-3 * i, 2.5e-4});
    s.span_s = 1e-3 * n_;
    return s;
  }

 private:
  int n_ = 0;
};

// The tiny model profiled on FakeDeviceTiming's clock.
struct FakeDeviceRun {
  const models::LayerGraph g = tiny_graph();
  Model m{g, 1, 16};
  Profiler prof{g, 1, 16, 1};
  FakeDeviceRun() {
    m.init_params(1);
    prof.set_timing(std::make_unique<FakeDeviceTiming>());
    prof.attach(m);
  }
};

}  // namespace

TEST_CASE("profiler: the CPU backend's default clock keeps the profile's form", "[exec][profiler]") {
  const models::LayerGraph g = tiny_graph();
  Model m(g, 1, 32);
  m.init_params(1);
  Profiler prof(g, 1, 32, 1);
  prof.attach(m);
  profile_steps(m, prof, 2);
  TempDir dir("profiler", "cpu");
  prof.write(dir.path.string());

  // op_measurements.json: the fields it had before the backend hook, no more (no device fields on the CPU).
  const nlohmann::json om = load_json_file(dir.file("op_measurements.json"));
  CHECK(keys(om) == std::set<std::string>{"format", "device", "dtype", "threads", "model", "batch", "seq", "steps",
                                          "peak_rss_bytes", "step_wall_s", "step_cpu_s", "ops"});
  CHECK(om["format"] == "rackstep.op_measurements/1");
  CHECK(om["device"] == "cpu");
  CHECK(om["dtype"] == "f32");
  CHECK(om["steps"] == 2);
  CHECK(om["step_wall_s"].size() == 2);
  const std::set<std::string> op_keys = {"op", "kind", "class", "layer", "phase", "in_shape", "out_shape",
                                         "param_shapes", "flops", "bytes", "seconds", "seconds_min", "samples",
                                         "gflop_per_s"};
  size_t fwd = 0, bwd = 0, optimizer = 0;
  for (const auto& o : om["ops"]) {
    CHECK(o["samples"] == 2);
    CHECK(o["seconds"].get<double>() >= 0.0);
    if (o["op"] == "optimizer") {
      ++optimizer;
      CHECK(keys(o) == std::set<std::string>{"op", "kind", "class", "phase", "seconds", "seconds_min", "samples"});
      continue;
    }
    CHECK(keys(o) == op_keys);
    (o["phase"] == "forward" ? fwd : bwd) += 1;
  }
  CHECK(fwd == g.ops.size());
  CHECK(bwd == g.ops.size());
  CHECK(optimizer == 1);

  // trace.json: process "cpu0", one slice per op, phase and step, each step's slices in order inside its step.
  const nlohmann::json t = load_json_file(dir.file("trace.json"));
  const nlohmann::json& events = t.is_object() ? t["traceEvents"] : t;
  std::map<int64_t, std::vector<std::pair<double, double>>> by_step;  // step -> (ts, dur) in trace order
  bool cpu0 = false;
  for (const auto& e : events) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "process_name") cpu0 |= e["args"]["name"] == "cpu0";
    if (e.value("ph", "") != "X") continue;
    CHECK(keys(e["args"]).count("step") == 1);
    by_step[e["args"]["step"].get<int64_t>()].push_back({e["ts"].get<double>(), e["dur"].get<double>()});
  }
  CHECK(cpu0);
  REQUIRE(by_step.size() == 2);
  for (const auto& [step, slices] : by_step) {
    CHECK(slices.size() == 2 * g.ops.size() + 1);
    for (size_t i = 1; i < slices.size(); ++i) {
      CHECK(slices[i].first >= slices[i - 1].first + slices[i - 1].second - 1e-2);  // µs (ns rounding); no overlap
    }
  }
}

TEST_CASE("profiler: a device clock's intervals sit at the step's start plus their offsets", "[exec][profiler]") {
  FakeDeviceRun run;
  const models::LayerGraph& g = run.g;
  Model& m = run.m;
  Profiler& prof = run.prof;
  profile_steps(m, prof, 1);
  const nlohmann::json om = prof.measurements();
  CHECK(om["op_clock"] == "fake_events");
  REQUIRE(om["step_device_s"].size() == 1);
  CHECK(om["step_device_s"][0].get<double>() == Approx(1e-3 * double(2 * g.ops.size() + 1)));
  for (const auto& o : om["ops"]) CHECK(o["seconds"].get<double>() == 2.5e-4);
  CHECK(prof.total_seconds() == Approx(2.5e-4 * double(2 * g.ops.size() + 1)));
  CHECK(!om.contains("peak_device_bytes"));  // the CPU backend has no device memory

  TempDir dir("profiler", "device");
  prof.write(dir.path.string());
  const nlohmann::json t = load_json_file(dir.file("trace.json"));
  const nlohmann::json& events = t.is_object() ? t["traceEvents"] : t;
  std::vector<double> ts;
  for (const auto& e : events) {
    if (e.value("ph", "") == "X") ts.push_back(e["ts"].get<double>());
  }
  REQUIRE(ts.size() == 2 * g.ops.size() + 1);
  for (size_t i = 1; i < ts.size(); ++i) CHECK(ts[i] - ts[i - 1] == Approx(1000.0).margin(1e-2));  // µs, ns rounding
}

TEST_CASE("profiler: collectives on their own queue are the trace's collectives lane, not ops", "[exec][profiler]") {
  FakeDeviceRun run;
  const models::LayerGraph& g = run.g;
  Model& m = run.m;
  Profiler& prof = run.prof;
  // One step as the trainer's data parallel queues it on a device: reduce-scatter
  // ranges during the backward, the all-gather inside the optimizer's interval.
  const auto b = testing::make_batch(1, 16, g.model.vocab, 5);
  int queue = 0;  // stands for the collectives' stream
  auto collective = [&](const char* name) {
    prof.begin_collective(name, &queue);
    prof.end_collective(&queue);
  };
  prof.begin_step(0);
  m.zero_grads();
  m.forward(b.inputs.data(), b.targets.data(), b.docs.data());
  int ranges = 0;
  m.backward([&](int64_t) {
    collective("reduce_scatter");
    ++ranges;
  });
  prof.begin_optimizer();
  collective("all_gather");
  prof.end_optimizer();
  prof.end_step();
  REQUIRE(ranges > 1);

  const nlohmann::json om = prof.measurements();
  CHECK(om["ops"].size() == 2 * g.ops.size() + 1);  // the ops and the optimizer only
  for (const auto& o : om["ops"]) CHECK(o["seconds"].get<double>() == 2.5e-4);
  CHECK(prof.total_seconds() == Approx(2.5e-4 * double(2 * g.ops.size() + 1)));

  TempDir dir("profiler", "collectives");
  prof.write(dir.path.string());
  const nlohmann::json t = load_json_file(dir.file("trace.json"));
  const nlohmann::json& events = t.is_object() ? t["traceEvents"] : t;
  std::map<int, std::string> thread_name;
  for (const auto& e : events) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") thread_name[e["tid"]] = e["args"]["name"];
  }
  std::map<std::string, int> on_lane;
  std::vector<double> ts;  // every slice's start, in the order the clock gave them
  for (const auto& e : events) {
    if (e.value("ph", "") != "X") continue;
    ts.push_back(e["ts"].get<double>());
    const bool lane = thread_name[e["tid"]] == "collectives";
    CHECK(lane == (e["cat"] == "communication"));
    if (lane) ++on_lane[e["name"]];
  }
  CHECK(on_lane["reduce_scatter"] == ranges);
  CHECK(on_lane["all_gather"] == 1);
  CHECK(on_lane.size() == 2);
  CHECK(ts.size() == 2 * g.ops.size() + 1 + static_cast<size_t>(ranges) + 1);
}

TEST_CASE("profiler: the default clock keeps intervals in begin order, nested ones inside", "[exec][profiler]") {
  std::unique_ptr<Backend> be = make_backend("cpu");
  std::unique_ptr<OpTiming> t = be->make_op_timing();
  CHECK(t->clock() == "host");
  t->begin_step();
  t->begin();  // 0 encloses 1
  t->begin();
  t->end();
  t->end();
  t->begin();  // 2 after both
  t->end();
  const StepTiming s = t->end_step();
  REQUIRE(s.intervals.size() == 3);
  const auto& [a, b, c] = std::tie(s.intervals[0], s.intervals[1], s.intervals[2]);
  CHECK(a.start_s <= b.start_s);
  CHECK(a.start_s + a.duration_s >= b.start_s + b.duration_s);
  CHECK(c.start_s >= a.start_s + a.duration_s);
  CHECK(s.span_s >= c.start_s + c.duration_s);
}

TEST_CASE("high-water mark of allocated bytes", "[exec][profiler][memory]") {
  HighWater hw;
  int a = 0, b = 0, c = 0;
  CHECK(hw.add(&a, 100));
  CHECK(hw.add(&b, 50));
  CHECK(hw.peak() == 150);
  CHECK(hw.remove(&a) == 100);
  CHECK(hw.current() == 50);
  CHECK_FALSE(hw.add(&c, 80));  // 130 < 150: no new mark
  CHECK(hw.peak() == 150);
  CHECK(hw.add(&a, 40));  // 170
  CHECK(hw.peak() == 170);
  CHECK(hw.remove(nullptr) == 0);  // not held: nothing uncounted
  CHECK(hw.remove(&a) == 40);
  CHECK(hw.remove(&a) == 0);  // freed twice: counted once
  CHECK(hw.current() == 130);
  CHECK_FALSE(hw.add(&b, 60));  // a key held again is replaced, not added: 50 -> 60
  CHECK(hw.current() == 140);
  CHECK(hw.allocations() == 2);
  hw.reset_peak();
  CHECK(hw.peak() == 140);
}
