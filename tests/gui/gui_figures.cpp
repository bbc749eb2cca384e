// The figures the viewer shows against what the command-line tools compute
// for the same input: per-GPU exposed time (sim/des.cpp summarize, printed by
// `rackstep timeline`), device memory without host memory, drop percentages
// as `rackstep drops` prints them; and the trace formats other tools write
// (nested slices, string ids, instants, counters, flows, gzip).
#include <catch2/catch.hpp>

#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gui/compare.h"
#include "gui/figures.h"
#include "gui/result_files.h"
#include "gui/trace_model.h"
#include "sim/base/check.h"
#include "sim/des.h"
#include "sim/base/trace.h"
#include "tests/temp_dir.h"

namespace g = rackstep::gui;
namespace sim = rackstep::sim;
namespace fs = std::filesystem;

namespace {

TempDir tmp("gui", "figures");  // removed when the test binary exits

std::string tmp_path(const std::string& name) {
  return tmp.file(name);
}

// Two GPU processes (one standing for 4 copies), each with a compute stream, a
// collective stream whose bytes cross the NIC, a transfer on the NIC alone
// overlapping the collective (a row that must not be counted twice), and host
// work; plus a fabric process that is no GPU.
sim::Engine small_engine() {
  sim::Engine e;
  const int p0 = e.add_process("gpu0", 4), p1 = e.add_process("gpu1");
  const int fab = e.add_process("fabric");
  const auto spine = e.add_resource(fab, "spine", sim::ResourceKind::kFabricLink, 4e9);
  for (int p : {p0, p1}) {
    const auto compute = e.add_resource(p, "compute", sim::ResourceKind::kComputeStream);
    const auto comm = e.add_resource(p, "fsdp_allgather", sim::ResourceKind::kCommStream);
    const auto nic = e.add_resource(p, "nic", sim::ResourceKind::kNic, 1e9);
    const auto host = e.add_resource(p, "host_cpu", sim::ResourceKind::kHostCpu, 0, sim::Order::kReadyOrder, 1);
    const double scale = p == p0 ? 1.0 : 1.5;
    const auto f0 = e.add_compute(compute, "L0.fwd", "forward", 2e-3 * scale);
    sim::TaskSpec ag;
    ag.name = "L1.allgather";
    ag.category = "fsdp_allgather";
    ag.on = comm;
    ag.duration_s = 1e-4;
    ag.bytes = 3e6;
    ag.links = {nic, spine};
    const auto gather = e.add_task(ag);
    const auto side = e.add_transfer("grad.bucket", "grad_sync", {nic}, 2e6);
    const auto f1 = e.add_compute(compute, "L1.fwd", "forward", 1e-3);
    const auto gc = e.add_compute(host, "gc", "gc_stall", 5e-4);
    e.add_dependency(f0, gather);
    e.add_dependency(f0, side);
    e.add_dependency(gather, f1);
    e.add_dependency(f1, gc);
  }
  return e;
}

}  // namespace

TEST_CASE("figures: exposed time per GPU is what rackstep timeline computes", "[gui][figures]") {
  const sim::Engine e = small_engine();
  const sim::RunResult r = e.run();
  const sim::StepSummary s = sim::summarize(e, r);
  sim::TraceWriter w;
  sim::export_trace(e, r, w);
  const g::TraceModel m = g::parse_trace(nlohmann::ordered_json::parse(w.to_string()), "engine");
  REQUIRE(m.gpus.size() == 2);
  CHECK(m.per_gpu.copies == 5);  // gpu0 stands for 4
  const double tol_us = 1e-6 * s.makespan_s * 1e6 + 1e-3;
  CHECK(m.per_gpu.compute_us == Approx(s.compute_busy_s * 1e6).margin(tol_us));
  CHECK(m.per_gpu.idle_us == Approx(s.bubble_s * 1e6).margin(tol_us));
  REQUIRE_FALSE(s.exposed_s_by_kind.empty());
  double cli_total_s = 0;
  for (const auto& [kind, v] : s.exposed_s_by_kind) {
    cli_total_s += v;
    const auto it = std::find(m.categories.begin(), m.categories.end(), kind);
    REQUIRE(it != m.categories.end());
    CHECK(m.per_gpu.exposed_us_by_category[it - m.categories.begin()] == Approx(v * 1e6).margin(tol_us));
  }
  CHECK(m.per_gpu.exposed_us == Approx(cli_total_s * 1e6).margin(tol_us));
  // The old headline summed every communication row: the NIC row counted on top of the collective it carries.
  double rows_sum_us = 0;
  for (const auto& row : m.rows) rows_sum_us += row.exposed_total_us;
  CHECK(rows_sum_us > m.per_gpu.exposed_us * 1.2);
  // Host work is exposed but is not communication.
  CHECK(m.per_gpu_exposed_host_us() > 0);
  CHECK(m.per_gpu_exposed_comm_us() + m.per_gpu_exposed_host_us() == Approx(m.per_gpu.exposed_us));
  const auto f = g::trace_figures(m);
  CHECK(f["exposed_s_by_kind"]["fsdp_allgather"].get<double>() == Approx(s.exposed_s_by_kind.at("fsdp_allgather")).margin(1e-9));
}

TEST_CASE("figures: device memory leaves host memory out, as rackstep size does", "[gui][figures]") {
  // The fields `rackstep size --json` writes (sim/size.cpp): memory_bytes holds
  // MemoryBreakdown::lines(), peak_memory_bytes the device total.
  const double gib = 1024.0 * 1024 * 1024;
  nlohmann::ordered_json mem = {{"master_weights", 20 * gib}, {"gradients", 10 * gib}, {"optimizer_states", 0},
                                {"working_weights", 10 * gib}, {"activations", 100 * gib},
                                {"backward_workspace", 5 * gib}, {"ep_buffers", 5 * gib}, {"loss_workspace", 1 * gib},
                                {"runtime_reserve", 10 * gib}, {"fragmentation", 5 * gib},
                                {"host_optimizer", 80 * gib}, {"host_activations", 0}};
  const double device = 166 * gib;
  nlohmann::ordered_json doc = {
      {"scenario", {{"training_days_available", 80}}},
      {"candidates",
       {{{"rank", 1}, {"name", "offload"}, {"verdict", "fits (20 GiB headroom), P(finish) 0.93"},
         {"peak_memory_bytes", device}, {"hbm_bytes", 186 * gib}, {"headroom_bytes", 20 * gib},
         {"memory_bytes", mem}, {"mfu", 0.41}, {"drop_fraction", 1e-300}}}},
      {"winner", "offload"}};
  const std::string path = tmp_path("size.json");
  std::ofstream(path) << doc.dump();
  const g::SizingResult s = g::parse_sizing(g::read_json_file(path), path);
  REQUIRE(s.candidates.size() == 1);
  CHECK(s.candidates[0].device_memory_gib() == Approx(device / gib));
  REQUIRE(s.candidates[0].host_memory_gib.size() == 2);
  const g::StackedBarSpec bars = g::memory_chart(s);
  double drawn = 0;
  for (const auto& seg : bars.segments) drawn += seg.values[0];
  CHECK(drawn == Approx(device / gib));
  CHECK(drawn < bars.capacity);  // fits: under the HBM line
  const auto f = g::figures_json(path);
  CHECK(f["candidates"][0]["over_hbm"] == false);
  // Human columns with units, the verdict right after the name; tiny fractions read as the CLI prints them.
  REQUIRE(s.table.columns.size() > 3);
  CHECK(s.table.columns[0] == "candidate");
  CHECK(s.table.columns[1] == "verdict");
  const auto col = [&](const std::string& title) {
    return std::find(s.table.columns.begin(), s.table.columns.end(), title) - s.table.columns.begin();
  };
  CHECK(s.table.rows[0][col("memory per GPU (GiB)")] == "166.0");
  CHECK(s.table.rows[0][col("MFU (%)")] == "41.0");
  CHECK(s.table.rows[0][col("token drops (%)")] == "0.000");
}

TEST_CASE("figures: drop percentages print as rackstep drops prints them", "[gui][figures]") {
  const auto doc = nlohmann::ordered_json::parse(R"({"points": [
      {"total": 0.0123, "total_ci95": 0.0004, "sender": 0.0123, "receiver": 1e-267, "padding": 0}]})");
  const g::DropsResult d = g::parse_drops(doc, "d.json");
  REQUIRE(d.table.rows.size() == 1);
  const auto col = [&](const char* c) { return std::find(d.table.columns.begin(), d.table.columns.end(), c) - d.table.columns.begin(); };
  CHECK(d.table.rows[0][col("receiver %")] == "0.000");  // was 1e-265
  CHECK(d.table.rows[0][col("sender %")] == "1.230");
  CHECK(d.table.rows[0][col("total %")] == "1.230");
}

TEST_CASE("trace model: nested slices, string ids, instants, counters, flows", "[gui][trace]") {
  // A PyTorch-profiler-like trace: string pids and tids, a step holding a
  // forward holding two kernels, an instant, two counter series, a flow.
  const auto doc = nlohmann::ordered_json::parse(R"({"traceEvents": [
    {"ph":"X","pid":"host","tid":"python 123","ts":100,"dur":1000,"name":"ProfilerStep#3","cat":"user_annotation"},
    {"ph":"X","pid":"host","tid":"python 123","ts":150,"dur":600,"name":"aten::linear","cat":"cpu_op"},
    {"ph":"X","pid":"host","tid":"python 123","ts":200,"dur":100,"name":"aten::mm","cat":"cpu_op"},
    {"ph":"X","pid":"host","tid":"python 123","ts":400,"dur":100,"name":"aten::add","cat":"cpu_op"},
    {"ph":"X","pid":"host","tid":"python 123","ts":1200,"dur":50,"name":"aten::zero_","cat":"cpu_op"},
    {"ph":"X","pid":0,"tid":"stream 7","ts":260,"dur":80,"name":"sm90_gemm","cat":"kernel"},
    {"ph":"i","pid":"host","tid":"python 123","ts":900,"name":"checkpoint","s":"t"},
    {"ph":"C","pid":0,"ts":100,"name":"memory","args":{"allocated":10,"reserved":20}},
    {"ph":"C","pid":0,"ts":500,"name":"memory","args":{"allocated":30}},
    {"ph":"s","pid":"host","tid":"python 123","ts":210,"id":7,"cat":"ac2g","name":"launch"},
    {"ph":"f","pid":0,"tid":"stream 7","ts":260,"id":7,"cat":"ac2g","name":"launch","bp":"e"}]})");
  const g::TraceModel m = g::parse_trace(doc, "torch.json");
  REQUIRE(m.rows.size() == 2);
  const g::TraceRow* host = nullptr;
  for (const auto& r : m.rows) {
    if (r.process_name == "host") host = &r;
  }
  REQUIRE(host != nullptr);  // the string pid names the process (was "pid -1")
  CHECK(host->thread_name == "python 123");
  REQUIRE(host->events.size() == 5);
  CHECK(host->events[0].name == "ProfilerStep#3");
  CHECK(host->events[0].depth == 0);
  CHECK(host->events[1].depth == 1);
  CHECK(host->events[2].depth == 2);
  CHECK(host->events[3].depth == 2);
  CHECK(host->events[4].depth == 0);
  CHECK(host->depths == 3);
  REQUIRE(host->instants.size() == 1);
  CHECK(host->instants[0].name == "checkpoint");
  REQUIRE(m.counters.size() == 1);
  CHECK(m.counters[0].series.size() == 2);
  CHECK(m.counters[0].values[1][0] == 30);
  CHECK(m.counters[0].values[1][1] == 20);  // a series missing from a sample keeps its value
  CHECK(m.counters[0].max_value == 30);
  REQUIRE(m.flows.size() == 1);
  CHECK(m.flows[0].from_us == 210);
  CHECK(m.rows[m.flows[0].to_row].thread_name == "stream 7");
}

TEST_CASE("trace model: .json.gz traces are gunzipped", "[gui][trace]") {
  const std::string text = R"({"traceEvents":[{"ph":"X","pid":1,"tid":1,"ts":5,"dur":10,"name":"a","cat":"c"}]})";
  const std::string path = tmp_path("t.json.gz");
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  const g::TraceModel m = g::load_trace(path);
  REQUIRE(m.rows.size() == 1);
  CHECK(m.rows[0].events[0].dur_us == 10);
  // A truncated gzip file is a user error naming the file.
  const std::string cut = tmp_path("cut.json.gz");
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  CHECK_THROWS_AS(g::load_trace(cut), rackstep::UserError);
}

TEST_CASE("compare: two traces aligned at step start, time per op class", "[gui][compare]") {
  // Predicted: 1 process standing for 2 GPUs; measured: 2 processes, starting at an arbitrary clock.
  const auto pred = nlohmann::ordered_json::parse(R"J({"traceEvents": [
    {"ph":"M","name":"process_name","pid":0,"args":{"name":"gpu0 (x2)"}},
    {"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"compute"}},
    {"ph":"X","pid":0,"tid":0,"ts":50,"dur":100,"name":"q.fwd","cat":"forward","args":{"op":"layers.0.attn.q_proj","op_class":"gemm"}},
    {"ph":"X","pid":0,"tid":0,"ts":150,"dur":40,"name":"norm.fwd","cat":"forward","args":{"op":"layers.0.norm","op_class":"norm"}}]})J");
  const auto meas = nlohmann::ordered_json::parse(R"({"traceEvents": [
    {"ph":"M","name":"thread_name","pid":5,"tid":1,"args":{"name":"compute"}},
    {"ph":"M","name":"thread_name","pid":6,"tid":1,"args":{"name":"compute"}},
    {"ph":"X","pid":5,"tid":1,"ts":1000000,"dur":150,"name":"q.fwd","cat":"forward","args":{"op":"layers.0.attn.q_proj","op_class":"gemm"}},
    {"ph":"X","pid":6,"tid":1,"ts":1000010,"dur":150,"name":"q.fwd","cat":"forward","args":{"op":"layers.0.attn.q_proj","op_class":"gemm"}},
    {"ph":"X","pid":5,"tid":1,"ts":1000150,"dur":20,"name":"norm.fwd","cat":"forward","args":{"op":"layers.0.norm","op_class":"norm"}}]})");
  const auto both = g::merge_traces(pred, "pred.json", meas, "meas.json");
  const g::TraceModel m = g::parse_trace(both, "both");
  CHECK(g::is_compare_trace(m));
  double pred_start = 1e18, meas_start = 1e18;
  for (const auto& r : m.rows) {
    (g::is_measured_row(r) ? meas_start : pred_start) = std::min(g::is_measured_row(r) ? meas_start : pred_start,
                                                                  r.events.front().start_us);
  }
  CHECK(pred_start == 0);
  CHECK(meas_start == 0);
  const g::CompareSummary c = g::compare_summary(m);
  CHECK(c.predicted_gpus == 2);
  CHECK(c.measured_gpus == 2);
  REQUIRE(c.classes.size() == 2);
  CHECK(c.classes[0].name == "gemm");
  CHECK(c.classes[0].predicted_us == Approx(100));  // 2 copies x 100 us / 2 GPUs
  CHECK(c.classes[0].measured_us == Approx(150));   // (150 + 150) / 2
  CHECK(c.classes[0].error() == Approx(-1.0 / 3));
  CHECK(c.classes[1].measured_us == Approx(10));
  const auto gemm = g::slices_of_class(m, "gemm", 10);
  REQUIRE(gemm.size() == 3);
  CHECK(m.rows[gemm[0].row].events[gemm[0].event].dur_us == 150);
}

TEST_CASE("compare: a rackstep compare file's de-load factor scales the measured side as the CLI table does",
          "[gui][compare]") {
  auto both = nlohmann::ordered_json::parse(R"J({"traceEvents": [
    {"ph":"M","name":"process_name","pid":0,"args":{"name":"predicted: tiny"}},
    {"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"compute"}},
    {"ph":"X","pid":0,"tid":0,"ts":0,"dur":100,"name":"q","cat":"forward","args":{"op":"q","op_class":"gemm"}},
    {"ph":"M","name":"process_name","pid":1000000,"args":{"name":"measured: tiny"}},
    {"ph":"M","name":"thread_name","pid":1000000,"tid":0,"args":{"name":"compute"}},
    {"ph":"X","pid":1000000,"tid":0,"ts":0,"dur":200,"name":"q","cat":"forward","args":{"op":"q","op_class":"gemm"}}],
    "otherData": {"rackstep_compare": {"predicted": "cal", "measured": "run", "step": 3,
                                       "measured_deload_factor": 0.6, "trace_deloaded": false}}})J");
  const g::CompareSummary c = g::compare_summary(g::parse_trace(both, "compare.json"));
  CHECK(c.measured_scale == Approx(0.6));
  REQUIRE(c.classes.size() == 1);
  CHECK(c.classes[0].measured_us == Approx(120));  // the CLI's de-loaded column: 200 us x 0.6
  // A trace written de-loaded (compare --deload) is shown as it is.
  both["otherData"]["rackstep_compare"]["trace_deloaded"] = true;
  CHECK(g::compare_summary(g::parse_trace(both, "compare.json")).classes[0].measured_us == Approx(200));
}

TEST_CASE("compare: a side without op classes is compared by category", "[gui][compare]") {
  // rackstep timeline writes no op_class; the CPU profiler does: both fall back to the pass.
  const auto pred = nlohmann::ordered_json::parse(R"({"traceEvents": [
    {"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"compute"}},
    {"ph":"X","pid":0,"tid":0,"ts":0,"dur":100,"name":"L0.fwd","cat":"forward"},
    {"ph":"X","pid":0,"tid":0,"ts":100,"dur":200,"name":"L0.bwd","cat":"backward"}]})");
  const auto meas = nlohmann::ordered_json::parse(R"({"traceEvents": [
    {"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"compute"}},
    {"ph":"X","pid":0,"tid":0,"ts":7,"dur":120,"name":"q.fwd","cat":"forward","args":{"class":"gemm","step":0}},
    {"ph":"X","pid":0,"tid":0,"ts":127,"dur":150,"name":"q.bwd","cat":"backward","args":{"class":"gemm","step":0}},
    {"ph":"X","pid":0,"tid":0,"ts":300,"dur":120,"name":"q.fwd","cat":"forward","args":{"class":"gemm","step":1}},
    {"ph":"X","pid":0,"tid":0,"ts":420,"dur":150,"name":"q.bwd","cat":"backward","args":{"class":"gemm","step":1}}]})");
  const g::TraceModel m = g::parse_trace(g::merge_traces(pred, "p", meas, "m"), "both");
  const g::CompareSummary c = g::compare_summary(m);
  CHECK(c.predicted_steps == 1);
  CHECK(c.measured_steps == 2);  // two profiled steps: times are per step
  REQUIRE(c.classes.size() == 2);
  CHECK(c.classes[0].name == "backward");
  CHECK(c.classes[0].predicted_us == Approx(200));
  CHECK(c.classes[0].measured_us == Approx(150));
  CHECK(c.classes[1].name == "forward");
  CHECK(c.classes[1].error() == Approx(-1.0 / 6));
  CHECK(g::slices_of_class(m, "forward", 10).size() == 3);
}

TEST_CASE("trace model: back-to-back slices rounded to the nanosecond are not nested", "[gui][trace]") {
  // sim/base/trace.cpp writes start and duration to 0.001 us each: an end can pass the next start by 0.001 us.
  const auto doc = nlohmann::ordered_json::parse(R"({"traceEvents": [
    {"ph":"X","pid":0,"tid":0,"ts":0.000,"dur":100.001,"name":"a"},
    {"ph":"X","pid":0,"tid":0,"ts":100.000,"dur":50,"name":"b"},
    {"ph":"X","pid":0,"tid":0,"ts":120,"dur":10,"name":"inside b"}]})");
  const g::TraceModel m = g::parse_trace(doc, "rounded");
  REQUIRE(m.rows[0].events.size() == 3);
  CHECK(m.rows[0].events[1].depth == 0);
  CHECK(m.rows[0].events[2].depth == 1);
  CHECK(m.rows[0].depths == 2);
}
