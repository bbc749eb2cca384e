// Charts and timelines rendered offscreen to PNG (gui/charts.h), and the
// readers behind them (gui/trace_model.h, gui/result_files.h).
// Run with QT_QPA_PLATFORM=offscreen (ctest sets it; charts_available forces it
// anyway). RACKSTEP_GUI_TEST_OUT=DIR keeps the PNGs for looking at.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "gui/charts.h"
#include "gui/result_files.h"
#include "gui/trace_model.h"
#include "sim/base/check.h"
#include "sim/base/trace.h"
#include "tests/gui/png_stats.h"

namespace g = rackstep::gui;
namespace fs = std::filesystem;
using rackstep::gui::test::png_stats;

namespace {

// Colours the charts promise: the deadline / capacity rule, the critical
// outline and the exposed-communication foot (gui/chart_build.cpp, gui/gantt_paint.cpp).
const QColor kRule(0xc0, 0x1c, 0x28);
const QColor kCritical(0xb0, 0x00, 0x20);
const QColor kExposed(0xd6, 0x27, 0x28);

std::string out_dir() {
  static const std::string dir = [] {
    const char* keep = std::getenv("RACKSTEP_GUI_TEST_OUT");
    fs::path d = keep ? fs::path(keep) : fs::temp_directory_path() / ("rackstep_gui_test_" + std::to_string(getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

struct Cleanup {
  ~Cleanup() {
    if (std::getenv("RACKSTEP_GUI_TEST_OUT") == nullptr) {
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / ("rackstep_gui_test_" + std::to_string(getpid())), ec);
    }
  }
} cleanup;

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = out_dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Two GPUs, a compute and a comm stream each, as sim/base/trace.h writes them.
// gpu0: compute [0,100] [100,200]* [300,500]*; comm [50,150] (hidden), [200,300]* (exposed 100),
// [450,520] (exposed 20). * = critical. gpu1 is gpu0 shifted by 10 us, without critical marks.
std::string small_trace(bool with_critical) {
  const std::string crit = with_critical ? "true" : "false";
  std::string t = R"({"displayTimeUnit":"ms","metadata":{"model":"toy"},"traceEvents":[
{"ph":"M","name":"process_name","pid":0,"args":{"name":"gpu0"}},
{"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"compute"}},
{"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"comm"}},
{"ph":"M","name":"process_name","pid":1,"args":{"name":"gpu1"}},
{"ph":"M","name":"thread_name","pid":1,"tid":0,"args":{"name":"compute"}},
{"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"comm"}},
{"ph":"X","pid":0,"tid":0,"ts":0,"dur":100,"name":"L0.fwd","cat":"forward","args":{"mb":0}},
{"ph":"X","pid":0,"tid":0,"ts":100,"dur":100,"name":"L1.fwd","cat":"forward","args":{"critical":CRIT}},
{"ph":"X","pid":0,"tid":0,"ts":300,"dur":200,"name":"L1.bwd","cat":"backward","args":{"critical":CRIT}},
{"ph":"X","pid":0,"tid":1,"ts":50,"dur":100,"name":"allgather","cat":"fsdp"},
{"ph":"X","pid":0,"tid":1,"ts":200,"dur":100,"name":"reduce_scatter","cat":"fsdp","args":{"critical":CRIT,"bytes":1e9}},
{"ph":"X","pid":0,"tid":1,"ts":450,"dur":70,"name":"a2a","cat":"ep"},
{"ph":"X","pid":1,"tid":0,"ts":10,"dur":100,"name":"L0.fwd","cat":"forward"},
{"ph":"X","pid":1,"tid":0,"ts":110,"dur":100,"name":"L1.fwd","cat":"forward"},
{"ph":"X","pid":1,"tid":0,"ts":310,"dur":200,"name":"L1.bwd","cat":"backward"},
{"ph":"X","pid":1,"tid":1,"ts":210,"dur":100,"name":"reduce_scatter","cat":"fsdp"},
{"ph":"s","pid":0,"tid":0,"ts":150,"id":1,"name":"dep","cat":"dependency"},
{"ph":"f","pid":0,"tid":1,"ts":250,"id":1,"bp":"e","name":"dep","cat":"dependency"},
{"ph":"C","pid":0,"tid":0,"ts":0,"name":"hbm","args":{"value":3}}
]}
)";
  for (size_t at; (at = t.find("CRIT")) != std::string::npos;) t.replace(at, 4, crit);
  return t;
}

template <class F>
std::string user_error_of(F&& f) {
  try {
    f();
  } catch (const rackstep::UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("charts are available offscreen", "[gui][charts]") { REQUIRE(g::charts_available()); }

TEST_CASE("scatter: labelled candidates and a deadline", "[gui][charts]") {
  g::ScatterSpec s;
  s.title = "Days to train vs forecast loss";
  s.points = {{"360B FSDP", 92.0, 1.951}, {"535B-A23B", 71.5, 1.912, true}, {"129B-A15B", 40.2, 2.020},
              {"707B-A23B", 118.0, 1.890}, {"360B-A21B MLA", 66.0, 1.940}};
  s.deadline_x = 80;
  const std::string with = out_dir() + "/scatter.png";
  g::render_scatter(s, with);
  auto st = png_stats(with, {kRule});
  CHECK(st.width == 1200);
  CHECK(st.height == 750);
  CHECK(st.gray_stddev > 8);  // mostly white, but not blank
  CHECK(st.distinct_colors > 20);
  CHECK(st.near_color[0] > 300);  // the dashed deadline line over the plot height

  s.deadline_x = g::kNone;
  const std::string without = out_dir() + "/scatter_no_deadline.png";
  g::render_scatter(s, without);
  CHECK(png_stats(without, {kRule}).near_color[0] < 50);
}

TEST_CASE("stacked bars: memory per candidate with the HBM line", "[gui][charts]") {
  g::StackedBarSpec s;
  s.title = "Memory per GPU";
  s.categories = {"360B FSDP", "535B-A23B", "707B-A23B"};
  s.segments = {{"weights", {42, 30, 35}}, {"gradients", {21, 15, 18}}, {"optimizer", {63, 45, 52}},
                {"activations", {40, 55, 90}}, {"buffers", {8, 14, 20}}};
  s.capacity = 186;
  s.width_px = 900;
  s.height_px = 600;
  const std::string path = out_dir() + "/memory.png";
  g::render_stacked_bars(s, path);
  auto st = png_stats(path, {kRule});
  CHECK(st.width == 900);
  CHECK(st.height == 600);
  CHECK(st.gray_stddev > 15);
  CHECK(st.near_color[0] > 200);  // the capacity rule across the plot

  s.segments[0].values.pop_back();
  CHECK_THAT(user_error_of([&] { g::render_stacked_bars(s, path); }), Catch::Contains("3 values"));
}

TEST_CASE("histogram: finish-date distribution with CDF and deadline", "[gui][charts]") {
  g::HistogramSpec s;
  s.title = "Days to finish (1000 runs)";
  std::mt19937 rng(7);
  std::gamma_distribution<double> delay(2.0, 3.0);
  for (int i = 0; i < 1000; ++i) s.samples.push_back(70 + delay(rng));
  s.deadline_x = 80;
  const std::string path = out_dir() + "/finish.png";
  g::render_histogram(s, path);
  auto st = png_stats(path, {kRule, QColor(0x9d, 0xb6, 0xd3)});
  CHECK(st.width == 1200);
  CHECK(st.gray_stddev > 15);
  CHECK(st.near_color[0] > 200);    // deadline
  CHECK(st.near_color[1] > 20000);  // the bars' fill
}

TEST_CASE("lines: drop fraction against context length, several series", "[gui][charts]") {
  g::LineSpec s;
  s.title = "EP token drops vs context";
  s.x_label = "context (tokens)";
  s.y_label = "tokens dropped (%)";
  s.log2_x = true;
  s.series = {{"pooled cf 1.10", {4096, 16384, 65536}, {2.67, 4.1, 7.9}},
              {"pooled cf 1.30", {4096, 16384, 65536}, {0.8, 1.6, 3.9}},
              {"ragged", {4096, 16384, 65536}, {0.3, 0.7, 1.9}}};
  const std::string path = out_dir() + "/drops.png";
  g::render_lines(s, path);
  auto st = png_stats(path);
  CHECK(st.width == 1200);
  CHECK(st.gray_stddev > 10);
  CHECK(st.distinct_colors > 20);

  g::LineSpec cats = s;
  cats.log2_x = false;
  cats.x_categories = {"pooled", "ragged", "capacity"};
  for (auto& ser : cats.series) ser.x = {0, 1, 2};
  g::render_lines(cats, out_dir() + "/drops_categories.png");
  CHECK(png_stats(out_dir() + "/drops_categories.png").gray_stddev > 10);

  s.series[0].x = {0, 16384, 65536};
  CHECK_THAT(user_error_of([&] { g::render_lines(s, path); }), Catch::Contains("log axis"));
}

TEST_CASE("empty specs and unwritable paths are user errors", "[gui][charts]") {
  CHECK_THAT(user_error_of([] { g::render_scatter(g::ScatterSpec{}, "/tmp/x.png"); }), Catch::Contains("at least one point"));
  CHECK_THAT(user_error_of([] { g::render_histogram(g::HistogramSpec{}, "/tmp/x.png"); }), Catch::Contains("sample"));
  g::ScatterSpec s;
  s.points = {{"a", 1, 2}};
  CHECK_THAT(user_error_of([&] { g::render_scatter(s, "/nonexistent-dir/x.png"); }), Catch::Contains("/nonexistent-dir/x.png"));
}

TEST_CASE("trace model: rows, critical slices and exposed communication", "[gui][trace]") {
  const auto m = g::load_trace(write_file("small.json", small_trace(true)));
  REQUIRE(m.rows.size() == 4);
  CHECK(m.rows[0].process_name == "gpu0");
  CHECK(m.rows[0].thread_name == "compute");
  CHECK(m.rows[0].compute);
  CHECK(m.rows[1].comm);
  CHECK(m.n_events == 10);  // flows and counters are not slices
  CHECK(m.n_critical == 3);
  CHECK(m.t0_us == 0);
  CHECK(m.t1_us == 520);
  // gpu0's comm: [200,300] fully exposed, [450,500) hidden under L1.bwd, [500,520] exposed.
  REQUIRE(m.rows[1].exposed_us.size() == 2);
  CHECK(m.rows[1].exposed_us[0] == std::pair<double, double>(200, 300));
  CHECK(m.rows[1].exposed_us[1] == std::pair<double, double>(500, 520));
  CHECK(m.rows[1].exposed_total_us == Approx(120));
  CHECK(m.rows[3].exposed_total_us == Approx(100));  // gpu1's reduce_scatter in its compute gap
  CHECK(m.metadata.at(0).first == "model");
}

TEST_CASE("trace model: reads what the simulator's TraceWriter writes", "[gui][trace]") {
  rackstep::sim::TraceWriter w;
  const int gpu = w.process("gpu0 (x64)");
  const int compute = w.thread(gpu, "compute");
  const int comm = w.thread(gpu, "nvlink");
  const int fabric = w.process("fabric");
  const int link = w.thread(fabric, "rack0->rack1");
  w.complete(gpu, compute, "L0.fwd", "forward", 0.0, 1.5e-3, {{"mb", 0}, {"critical", true}});
  w.complete(gpu, comm, "allgather", "fsdp", 1.0e-3, 1.0e-3);
  w.complete(fabric, link, "grad reduce", "cross_rack", 1.0e-3, 2.0e-3);
  w.flow(gpu, compute, 0.5e-3, gpu, comm, 1.5e-3, "dep");
  w.counter(gpu, "hbm_bytes", 0.0, 1e9);
  w.metadata("layout", "ep64");
  const auto m = g::parse_trace(nlohmann::ordered_json::parse(w.to_string()), "writer");
  REQUIRE(m.rows.size() == 3);
  CHECK(m.rows[0].process_name == "gpu0 (x64)");
  CHECK(m.rows[1].thread_name == "nvlink");
  CHECK(m.rows[1].comm);
  CHECK_FALSE(m.rows[2].comm);  // the fabric has no compute stream: not a GPU
  CHECK(m.rows[0].events[0].dur_us == Approx(1500));
  CHECK(m.n_critical == 1);
  CHECK(m.rows[1].exposed_total_us == Approx(500));  // allgather [1000, 2000) us, compute ends at 1500
  CHECK(m.metadata.at(0).second == "ep64");
}

TEST_CASE("trace model: begin/end pairs and a bare event array", "[gui][trace]") {
  const auto m = g::load_trace(write_file("be.json", R"([
{"ph":"B","pid":3,"tid":7,"ts":10,"name":"step"},
{"ph":"B","pid":3,"tid":7,"ts":12,"name":"matmul","cat":"kernel"},
{"ph":"E","pid":3,"tid":7,"ts":20},
{"ph":"E","pid":3,"tid":7,"ts":30}])"));
  REQUIRE(m.rows.size() == 1);
  REQUIRE(m.rows[0].events.size() == 2);
  CHECK(m.rows[0].events[0].name == "step");
  CHECK(m.rows[0].events[0].dur_us == 20);
  CHECK(m.rows[0].events[1].dur_us == 8);
  CHECK(m.rows[0].process_name == "pid 3");
}

TEST_CASE("trace model: malformed traces name the file and the JSON path", "[gui][trace]") {
  auto err = [](const std::string& name, const std::string& text) {
    const std::string path = write_file(name, text);
    return user_error_of([&] { g::load_trace(path); });
  };
  CHECK_THAT(err("t1.json", R"({"traceEvents":[{"ph":"X","pid":0,"tid":0,"dur":5}]})"),
             Catch::Contains("t1.json: /traceEvents/0/ts: expected a number"));
  CHECK_THAT(err("t2.json", R"({"traceEvents":[{"ph":"X","pid":0,"tid":0,"ts":1,"dur":-5}]})"),
             Catch::Contains("/traceEvents/0/dur"));
  CHECK_THAT(err("t3.json", R"({"traceEvents":[{"ph":"X","ts":1,)"), Catch::Contains("t3.json: expected valid JSON"));
  CHECK_THAT(err("t4.json", R"({"traceEvents":[]})"), Catch::Contains("at least one slice"));
  CHECK_THAT(err("t5.json", R"({"traceEvents":{}})"), Catch::Contains("an array of events"));
  CHECK_THAT(user_error_of([] { g::load_trace("/nonexistent/trace.json"); }), Catch::Contains("cannot be opened"));
}

TEST_CASE("timeline PNG: critical outline and exposed communication are drawn", "[gui][timeline]") {
  g::TimelineSpec s;
  s.trace_path = write_file("crit.json", small_trace(true));
  const std::string with = out_dir() + "/timeline.png";
  g::render_timeline(s, with);
  auto st = png_stats(with, {kCritical, kExposed}, 8);
  CHECK(st.width == 1600);
  CHECK(st.height > 150);
  CHECK(st.gray_stddev > 20);
  CHECK(st.near_color[1] > 100);  // exposed feet on both GPUs' comm rows

  s.trace_path = write_file("nocrit.json", small_trace(false));
  const std::string without = out_dir() + "/timeline_nocrit.png";
  g::render_timeline(s, without);
  auto st2 = png_stats(without, {kCritical, kExposed}, 8);
  // The legend's critical swatch is drawn in both; the outlines only with critical slices.
  CHECK(st.near_color[0] > st2.near_color[0] + 300);

  s.max_rows = 2;  // a bounded image keeps the first rows and says how many it left out
  g::render_timeline(s, out_dir() + "/timeline_cut.png");
  CHECK(png_stats(out_dir() + "/timeline_cut.png").height < st.height);
}

TEST_CASE("sizing results are read defensively", "[gui][files]") {
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(R"({
    "scenario": {"training_days_available": 80, "gpus": 768},
    "winner": "535B-A23B",
    "candidates": [
      {"name": "535B-A23B", "mfu": 0.42, "step_time_s": 7.1, "days": 71.5, "p_finish": 0.93, "forecast_loss": 1.912,
       "best": {"layout": "ep64", "fits": true}, "total_params": 535000000000,
       "layout": {"dp": 11, "ep": 64, "tp": 1, "pp": 1, "cp": 1}, "finish_days": [70, 72, 75, 81],
       "memory": {"weights_bytes": 32212254720, "optimizer_bytes": 64424509440, "activations_bytes": 53687091200,
                  "total_bytes": 150323855360, "capacity_bytes": 199715979264},
       "something_new": [1, 2, 3]},
      {"name": "360B FSDP", "mfu": 0.47, "days": 92, "forecast_loss": 1.951,
       "memory": {"weights_bytes": 45097156608, "gradients_bytes": 22548578304}}
    ]})");
  REQUIRE(g::detect_kind(doc, "s.json") == g::FileKind::sizing);
  const auto s = g::parse_sizing(doc, "s.json");
  REQUIRE(s.candidates.size() == 2);
  CHECK(s.deadline_days == 80);
  CHECK(s.candidates[0].winner);
  CHECK_FALSE(s.candidates[1].winner);
  REQUIRE(s.candidates[0].memory_gib.size() == 3);  // total and capacity are not parts
  CHECK(s.candidates[0].memory_gib[0].first == "weights");
  CHECK(s.candidates[0].memory_gib[0].second == Approx(30.0));
  CHECK(s.candidates[0].hbm_gib == Approx(186.0).epsilon(0.01));
  CHECK(s.table.columns[0] == "candidate");
  auto has_column = [&](const char* c) { return std::find(s.table.columns.begin(), s.table.columns.end(), c) != s.table.columns.end(); };
  CHECK(has_column("best.layout"));
  CHECK_FALSE(has_column("layout.dp"));  // a whole layout is too big for a cell
  CHECK(s.table.rows[0][std::find(s.table.columns.begin(), s.table.columns.end(), "total params (B)") - s.table.columns.begin()] == "535.0");
  CHECK(s.candidates[0].finish_days.size() == 4);
  const auto fin = g::finish_chart(s);
  CHECK(fin.samples.size() == 4);
  CHECK(fin.deadline_x == 80);

  const auto bars = g::memory_chart(s);
  CHECK(bars.categories.size() == 2);
  CHECK(bars.segments.size() == 4);  // weights, optimizer, activations, gradients
  for (const auto& seg : bars.segments) CHECK(seg.values.size() == 2);
  CHECK(bars.capacity == Approx(186.0).epsilon(0.01));
  const auto sc = g::days_loss_chart(s);
  CHECK(sc.points.size() == 2);
  CHECK(sc.deadline_x == 80);
}

TEST_CASE("drop sweeps become one series per kind", "[gui][files]") {
  const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(R"({
    "scenario": {"experts": 384, "top_k": 8, "ep": 64, "context": 4096, "transport": "pooled"},
    "sweep": "context",
    "points": [{"context": "4096", "total": 0.0267, "total_ci95": 0.001, "sender": 0.01, "receiver": 0.0167, "padding": 0},
               {"context": "16384", "total": 0.041, "sender": 0.02, "receiver": 0.021, "padding": 0},
               {"context": "65536", "total": 0.079, "sender": 0.04, "receiver": 0.039, "padding": 0}]})");
  REQUIRE(g::detect_kind(doc, "d.json") == g::FileKind::drops);
  const auto d = g::parse_drops(doc, "d.json");
  CHECK(d.sweep == "context");
  CHECK(d.chart.log2_x);
  REQUIRE(d.chart.series.size() == 4);
  CHECK(d.chart.series[0].name == "total");
  CHECK(d.chart.series[0].y[2] == Approx(7.9));
  CHECK(d.table.rows.size() == 3);
  CHECK(d.scenario.find("context") == std::string::npos);  // the swept key is not a fixed setting
  CHECK_THAT(user_error_of([] { g::detect_kind(nlohmann::ordered_json::parse(R"({"a":1})"), "x.json"); }),
             Catch::Contains("x.json: expected a Chrome trace"));
}
