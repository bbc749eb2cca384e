// The viewer driven through Qt's test API (QTest), offscreen: the status bar
// follows the tab on screen, the finish histogram follows the selected
// candidate, process headers fold, search and row filters, shift+drag range
// selection with its aggregate table, slice pinning, and the compare view's
// click-through from a class bar to its slices. Screens are compared by
// structure (widgets, rows, counts), not pixels.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <QApplication>
#include <QBarSeries>
#include <QHorizontalBarSeries>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QImage>
#include <QLineEdit>
#include <QPlainTextEdit>
#include <QStatusBar>
#include <QTabWidget>
#include <QTableWidget>
#include <QTest>

#include "gui/charts.h"
#include "gui/gantt_widget.h"
#include "gui/main_window.h"
#include "tests/temp_dir.h"

namespace g = rackstep::gui;
namespace fs = std::filesystem;

namespace {

TempDir tmp("gui", "interact");  // removed when the test binary exits

std::string write_tmp(const std::string& name, const std::string& text) {
  const std::string path = tmp.file(name);
  std::ofstream(path) << text;
  return path;
}

// Two GPUs with compute and comm rows, and a counter.
const char* kTrace = R"({"traceEvents":[
{"ph":"M","name":"process_name","pid":0,"args":{"name":"stage0 gpu"}},
{"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"compute"}},
{"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"comm"}},
{"ph":"M","name":"process_name","pid":1,"args":{"name":"stage1 gpu"}},
{"ph":"M","name":"thread_name","pid":1,"tid":0,"args":{"name":"compute"}},
{"ph":"X","pid":0,"tid":0,"ts":0,"dur":100,"name":"L0.fwd","cat":"forward"},
{"ph":"X","pid":0,"tid":0,"ts":100,"dur":100,"name":"L1.fwd","cat":"forward","args":{"critical":true}},
{"ph":"X","pid":0,"tid":1,"ts":200,"dur":50,"name":"send","cat":"pp"},
{"ph":"X","pid":1,"tid":0,"ts":250,"dur":100,"name":"L2.fwd","cat":"forward","args":{"critical":true}},
{"ph":"X","pid":1,"tid":0,"ts":350,"dur":100,"name":"L2.bwd","cat":"backward","args":{"critical":true}},
{"ph":"s","pid":0,"tid":1,"ts":225,"id":1,"cat":"dep","name":"dep"},
{"ph":"f","pid":1,"tid":0,"ts":300,"id":1,"cat":"dep","name":"dep"},
{"ph":"C","pid":1,"ts":0,"name":"hbm","args":{"bytes":1e9}},
{"ph":"C","pid":1,"ts":300,"name":"hbm","args":{"bytes":3e9}}]})";

template <class T>
T* child(QWidget* root, const char* name) {
  return root->findChild<T*>(name);
}

struct Window {
  g::MainWindow win;
  Window() {
    win.resize(1400, 900);
    win.show();
    QApplication::processEvents();
  }
};

// Opens kTrace in w: its tab and Gantt widget.
struct Opened {
  QWidget* tab;
  g::GanttWidget* gantt;
};
Opened open_sample(Window& w) {
  w.win.open_file(write_tmp("t.json", kTrace));
  QWidget* tab = w.win.tabs()->widget(0);
  auto* gantt = child<g::GanttWidget>(tab, "gantt");
  REQUIRE(gantt != nullptr);
  QApplication::processEvents();
  return {tab, gantt};
}

// The y pixel of a row's middle in the widget, from the layout.
int row_y(const g::GanttWidget& w, int row) {
  const g::GanttLayout lay = g::gantt_layout(w.model(), w.view());
  const g::GanttTrack& t = lay.tracks[lay.row_track[row]];
  return w.view().geo.axis_h + t.y - w.view().scroll_px + w.view().geo.row_h / 2;
}

int x_of(const g::GanttWidget& w, double t_us) {
  return static_cast<int>(std::lround(g::gantt_x_of(w.view(), w.width() - 14, t_us)));
}

}  // namespace

TEST_CASE("interact: the status bar names the current tab's file", "[gui][interact]") {
  REQUIRE(g::charts_available());
  Window w;
  const std::string a = write_tmp("a.json", kTrace);
  const std::string b = write_tmp("drops.json", R"({"points": [{"total": 0.01, "receiver": 1e-267}]})");
  w.win.open_file(a);
  w.win.open_file(b);
  CHECK(w.win.statusBar()->currentMessage().toStdString() == b);
  w.win.tabs()->setCurrentIndex(0);
  CHECK(w.win.statusBar()->currentMessage().toStdString() == a);
  QTest::keyClick(w.win.tabs()->tabBar(), Qt::Key_Right);
  CHECK(w.win.statusBar()->currentMessage().toStdString() == b);
  // The drops table shows the receiver share as the CLI prints it.
  auto* table = w.win.tabs()->widget(1)->findChild<QTableWidget*>();
  REQUIRE(table != nullptr);
  int receiver = -1;
  for (int c = 0; c < table->columnCount(); ++c) {
    if (table->horizontalHeaderItem(c)->text() == "receiver %") receiver = c;
  }
  REQUIRE(receiver >= 0);
  CHECK(table->item(0, receiver)->text() == "0.000");
}

TEST_CASE("interact: the finish histogram follows the selected candidate", "[gui][interact]") {
  REQUIRE(g::charts_available());
  Window w;
  w.win.open_file(write_tmp("size.json", R"({"scenario": {"training_days_available": 80}, "winner": "fast",
    "candidates": [
      {"name": "fast", "verdict": "fits", "days_p50": 60, "forecast_loss": 1.95, "finish_days": [58, 60, 61, 65]},
      {"name": "slow", "verdict": "fits", "days_p50": 85, "forecast_loss": 1.90, "finish_days": [80, 84, 85, 90, 95]}]})"));
  QWidget* tab = w.win.tabs()->widget(0);
  auto* hist = child<QChartView>(tab, "finish_histogram");
  REQUIRE(hist != nullptr);
  CHECK(hist->chart()->title().contains("fast"));
  auto* table = child<QTableWidget>(tab, "candidates");
  REQUIRE(table != nullptr);
  CHECK(table->horizontalHeaderItem(0)->text() == "candidate");
  CHECK(table->horizontalHeaderItem(1)->text() == "verdict");
  // Click the second candidate's name cell.
  const QRect cell = table->visualItemRect(table->item(1, 0));
  QTest::mouseClick(table->viewport(), Qt::LeftButton, Qt::NoModifier, cell.center());
  CHECK(hist->chart()->title().contains("slow"));
  CHECK_FALSE(hist->chart()->title().contains("fast"));
}

TEST_CASE("interact: fold a process, filter rows, search slices", "[gui][interact]") {
  REQUIRE(g::charts_available());
  Window w;
  const auto [tab, gantt] = open_sample(w);
  const auto& m = gantt->model();
  REQUIRE(m.rows.size() == 3);
  REQUIRE(m.counters.size() == 1);
  g::GanttLayout lay = g::gantt_layout(m, gantt->view());
  CHECK(lay.row_track[0] >= 0);
  // Click stage0's header: its rows fold away; click again: back.
  const int header_y = gantt->view().geo.axis_h + lay.tracks[0].y + 5;
  QTest::mouseClick(gantt, Qt::LeftButton, Qt::NoModifier, QPoint(50, header_y));
  lay = g::gantt_layout(m, gantt->view());
  CHECK(lay.row_track[0] < 0);
  CHECK(lay.row_track[1] < 0);
  CHECK(lay.row_track[2] >= 0);
  QTest::mouseClick(gantt, Qt::LeftButton, Qt::NoModifier, QPoint(50, header_y));
  CHECK(g::gantt_layout(m, gantt->view()).row_track[0] >= 0);

  // Row filter: only stage1's rows (and its counter) stay.
  auto* rows = child<QLineEdit>(tab, "row_filter");
  REQUIRE(rows != nullptr);
  QTest::keyClicks(rows, "stage1");
  lay = g::gantt_layout(m, gantt->view());
  CHECK(lay.row_track[0] < 0);
  CHECK(lay.row_track[2] >= 0);
  int counters = 0;
  for (const auto& t : lay.tracks) counters += t.kind == g::GanttTrack::counter;
  CHECK(counters == 1);
  rows->clear();

  // Flow arrows on demand: the checkbox turns them on, and they are painted.
  auto* flows = child<QCheckBox>(tab, "flows");
  REQUIRE(flows != nullptr);
  REQUIRE(flows->isEnabled());
  CHECK_FALSE(gantt->view().show_flows);
  const QImage without = gantt->grab().toImage();
  QTest::mouseClick(flows, Qt::LeftButton);
  CHECK(gantt->view().show_flows);
  CHECK(gantt->grab().toImage() != without);

  // Search: "bwd" matches one slice by name; "pp" one by category.
  auto* search = child<QLineEdit>(tab, "search");
  REQUIRE(search != nullptr);
  QTest::keyClicks(search, "BWD");
  CHECK(gantt->view().search == "bwd");
  int matches = 0;
  for (const auto& r : m.rows) {
    for (const auto& e : r.events) matches += g::slice_matches(m, e, gantt->view());
  }
  CHECK(matches == 1);
}

TEST_CASE("interact: shift+drag measures a range, a click pins a slice", "[gui][interact]") {
  REQUIRE(g::charts_available());
  Window w;
  const auto [tab, gantt] = open_sample(w);
  const int y = row_y(*gantt, 0);
  // Select [50, 300] us: L0.fwd 50 us inside, L1.fwd 100, send 50, L2.fwd 50.
  QTest::mousePress(gantt, Qt::LeftButton, Qt::ShiftModifier, QPoint(x_of(*gantt, 50), y));
  QTest::mouseMove(gantt, QPoint(x_of(*gantt, 200), y));
  QTest::mouseRelease(gantt, Qt::LeftButton, Qt::ShiftModifier, QPoint(x_of(*gantt, 300), y));
  const auto& v = gantt->view();
  CHECK(v.sel_t0_us == Approx(50).margin(2));
  CHECK(v.sel_t1_us == Approx(300).margin(2));
  auto* range = child<QTableWidget>(tab, "range_table");
  REQUIRE(range != nullptr);
  CHECK(range->rowCount() == 4);
  CHECK(range->item(0, 0)->text() == "L1.fwd");  // the longest inside the range first
  CHECK(child<QTabWidget>(tab, "bottom")->currentIndex() == 1);
  CHECK(child<QTabWidget>(tab, "bottom")->tabText(1).startsWith("Range 2"));  // ~250 us
  // Escape clears it.
  QTest::keyClick(gantt, Qt::Key_Escape);
  CHECK(range->rowCount() == 0);

  // A click on L1.fwd pins it and shows its details.
  QTest::mouseClick(gantt, Qt::LeftButton, Qt::NoModifier, QPoint(x_of(*gantt, 150), y));
  CHECK(gantt->view().pinned_row == 0);
  CHECK(gantt->view().pinned_event == 1);
  CHECK(child<QPlainTextEdit>(tab, "details")->toPlainText().startsWith("L1.fwd"));
  // The critical path tab lists the critical slices in time order; a double click goes to one.
  auto* crit = child<QTableWidget>(tab, "critical_table");
  REQUIRE(crit != nullptr);
  REQUIRE(crit->rowCount() == 3);
  CHECK(crit->item(0, 0)->text() == "L1.fwd");
  CHECK(crit->item(2, 0)->text() == "L2.bwd");
  child<QTabWidget>(tab, "bottom")->setCurrentWidget(crit);
  QApplication::processEvents();
  const QRect cell = crit->visualItemRect(crit->item(2, 0));
  QTest::mouseClick(crit->viewport(), Qt::LeftButton, Qt::NoModifier, cell.center());
  QTest::mouseDClick(crit->viewport(), Qt::LeftButton, Qt::NoModifier, cell.center());
  CHECK(gantt->view().pinned_row == 2);
  CHECK(gantt->view().pinned_event == 1);
  gantt->fit();
  // A click on empty space unpins.
  QTest::mouseClick(gantt, Qt::LeftButton, Qt::NoModifier, QPoint(x_of(*gantt, 420), y));
  CHECK(gantt->view().pinned_row == -1);
}

TEST_CASE("interact: compare view, from a class bar to its slices", "[gui][interact][compare]") {
  REQUIRE(g::charts_available());
  Window w;
  const std::string pred = write_tmp("pred.json", R"({"traceEvents":[
    {"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"compute"}},
    {"ph":"X","pid":0,"tid":0,"ts":10,"dur":100,"name":"q.fwd","cat":"forward","args":{"op":"q","op_class":"gemm"}},
    {"ph":"X","pid":0,"tid":0,"ts":110,"dur":30,"name":"n.fwd","cat":"forward","args":{"op":"n","op_class":"norm"}}]})");
  const std::string meas = write_tmp("meas.json", R"({"traceEvents":[
    {"ph":"M","name":"thread_name","pid":3,"tid":0,"args":{"name":"compute"}},
    {"ph":"X","pid":3,"tid":0,"ts":5000,"dur":140,"name":"q.fwd","cat":"forward","args":{"op":"q","op_class":"gemm"}},
    {"ph":"X","pid":3,"tid":0,"ts":5140,"dur":20,"name":"n.fwd","cat":"forward","args":{"op":"n","op_class":"norm"}}]})");
  w.win.open_compare(pred, meas);
  QApplication::processEvents();
  QWidget* tab = w.win.tabs()->widget(0);
  CHECK(w.win.statusBar()->currentMessage().toStdString() == pred + " vs " + meas);
  // A step-breakdown bar per side, none mixing them.
  CHECK(child<QWidget>(tab, "breakdown_predicted") != nullptr);
  CHECK(child<QWidget>(tab, "breakdown_measured") != nullptr);
  CHECK(child<QWidget>(tab, "breakdown") == nullptr);
  auto* bars = child<QChartView>(tab, "compare_bars");
  REQUIRE(bars != nullptr);
  auto series = bars->chart()->series();
  REQUIRE(series.size() == 1);
  auto* bar_series = qobject_cast<QHorizontalBarSeries*>(series[0]);
  REQUIRE(bar_series != nullptr);
  REQUIRE(bar_series->barSets().size() == 2);
  REQUIRE(bar_series->count() == 2);
  // Bars count from the bottom; gemm (the most time) is drawn at the top: index 1.
  CHECK(bar_series->barSets()[0]->at(1) == Approx(0.100));  // gemm predicted, ms
  CHECK(bar_series->barSets()[1]->at(1) == Approx(0.140));  // gemm measured
  CHECK(bar_series->barSets()[1]->at(0) == Approx(0.020));  // norm measured
  auto* ops = child<QTableWidget>(tab, "compare_ops");
  REQUIRE(ops != nullptr);
  CHECK(ops->rowCount() == 2);
  // Click the gemm bar (Qt Charts reports clicks through this signal).
  emit bar_series->clicked(1, bar_series->barSets()[1]);
  auto* slices = child<QTableWidget>(tab, "compare_slices");
  REQUIRE(slices != nullptr);
  REQUIRE(slices->rowCount() == 2);
  QApplication::processEvents();
  CHECK(slices->item(0, 3)->text() == "140 us");
  auto* gantt = child<g::GanttWidget>(tab, "gantt");
  REQUIRE(gantt != nullptr);
  CHECK(gantt->view().op_class >= 0);
  // Double-click the measured slice: the timeline zooms to it and pins it.
  const QRect cell = slices->visualItemRect(slices->item(0, 0));
  INFO("slices visible " << slices->isVisible() << " viewport " << slices->viewport()->width() << "x"
                         << slices->viewport()->height() << " cell " << cell.x() << "," << cell.y() << " "
                         << cell.width() << "x" << cell.height());
  // A double click is a press and release, then the double-click press (Qt's item views need the first press).
  QTest::mouseClick(slices->viewport(), Qt::LeftButton, Qt::NoModifier, cell.center());
  QTest::mouseDClick(slices->viewport(), Qt::LeftButton, Qt::NoModifier, cell.center());
  REQUIRE(gantt->view().pinned_row >= 0);
  const auto& row = gantt->model().rows[gantt->view().pinned_row];
  CHECK(row.process_name.rfind("measured: ", 0) == 0);
  CHECK(gantt->view().t0_us < 0.0 + 1e-9);  // aligned: the measured slice starts at 0
  CHECK(gantt->view().t1_us < 400);
}
