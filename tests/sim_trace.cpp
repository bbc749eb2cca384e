// Chrome trace writer: valid JSON, the event shapes viewers expect, escaping,
// atomic writes, and the DES export (one process per GPU, one thread per resource).
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "sim/base/check.h"
#include "sim/des.h"
#include "sim/base/trace.h"

using namespace rackstep::sim;

namespace {

nlohmann::json events_with(const nlohmann::json& doc, const std::string& ph) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == ph) out.push_back(e);
  }
  return out;
}

}  // namespace

TEST_CASE("trace writer emits named processes, threads, slices and flows", "[trace]") {
  TraceWriter w;
  int gpu = w.process("gpu \"0\"");
  int compute = w.thread(gpu, "compute");
  int comm = w.thread(gpu, "comm\tstream");
  w.complete(gpu, compute, "L0.fwd", "forward", 0.001, 0.002, {{"mb", 3}});
  w.complete(gpu, comm, "ag", "fsdp_allgather", 0.0, 0.001);
  w.flow(gpu, comm, 0.0005, gpu, compute, 0.002);
  w.counter(gpu, "hbm_bytes", 0.001, 1.5e9);
  w.metadata("layout", "fsdp64");
  nlohmann::json doc = nlohmann::json::parse(w.to_string());
  CHECK(doc["metadata"]["layout"] == "fsdp64");
  auto meta = events_with(doc, "M");
  bool named = false;
  for (const auto& m : meta) {
    if (m["name"] == "process_name") named = m["args"]["name"] == "gpu \"0\"";
  }
  CHECK(named);
  auto slices = events_with(doc, "X");
  REQUIRE(slices.size() == 2);
  CHECK(slices[0]["ts"].get<double>() == Approx(1000.0));  // microseconds
  CHECK(slices[0]["dur"].get<double>() == Approx(2000.0));
  CHECK(slices[0]["args"]["mb"] == 3);
  CHECK(slices[0]["cat"] == "forward");
  auto starts = events_with(doc, "s"), ends = events_with(doc, "f");
  REQUIRE(starts.size() == 1);
  REQUIRE(ends.size() == 1);
  CHECK(starts[0]["id"] == ends[0]["id"]);
  CHECK(ends[0]["bp"] == "e");
  CHECK(events_with(doc, "C").size() == 1);
}

TEST_CASE("trace files are written atomically and whole", "[trace]") {
  TraceWriter w;
  int p = w.process("gpu0");
  int t = w.thread(p, "compute");
  for (int i = 0; i < 1000; ++i) w.complete(p, t, "k" + std::to_string(i), "forward", i * 1e-3, 1e-3);
  auto path = std::filesystem::temp_directory_path() / "rackstep_trace_test.json";
  w.write(path.string());
  CHECK_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  std::ifstream in(path);
  nlohmann::json doc = nlohmann::json::parse(in);
  CHECK(events_with(doc, "X").size() == 1000);
  std::filesystem::remove(path);
  CHECK_THROWS_AS(w.write("/nonexistent-dir/trace.json"), rackstep::UserError);
}

TEST_CASE("a simulated step exports one process per GPU and one thread per resource", "[trace][des]") {
  Engine e;
  int g0 = e.add_process("gpu0"), g1 = e.add_process("gpu1..63", 63);
  ResourceId c0 = e.add_resource(g0, "compute", ResourceKind::kComputeStream);
  ResourceId n0 = e.add_resource(g0, "nic", ResourceKind::kNic, 1e9);
  ResourceId c1 = e.add_resource(g1, "compute", ResourceKind::kComputeStream);
  TaskId a = e.add_compute(c0, "fwd", "forward", 1e-3);
  TaskId x = e.add_transfer("send", "pp_send", {n0}, 1e6);
  TaskId b = e.add_compute(c1, "fwd", "forward", 1e-3);
  e.add_dependency(a, x);
  e.add_dependency(x, b);
  RunResult r = e.run();
  TraceWriter w;
  export_trace(e, r, w);
  nlohmann::json doc = nlohmann::json::parse(w.to_string());
  int processes = 0, threads = 0;
  bool multiplicity_shown = false;
  for (const auto& m : events_with(doc, "M")) {
    if (m["name"] == "process_name") {
      ++processes;
      if (m["args"]["name"] == "gpu1..63 (x63)") multiplicity_shown = true;
    }
    if (m["name"] == "thread_name") ++threads;
  }
  CHECK(processes == 2);
  CHECK(threads == 3);
  CHECK(multiplicity_shown);
  auto slices = events_with(doc, "X");
  REQUIRE(slices.size() == 3);
  CHECK(slices[2]["ts"].get<double>() == Approx(r.start_s[b.v] * 1e6));
  CHECK(events_with(doc, "s").size() == 2);  // both dependencies cross resources
}
