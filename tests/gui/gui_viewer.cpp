// The viewer's widgets driven offscreen: tabs per file kind, zoom, pan, fit
// and hover details on the timeline (gui/main_window.h, gui/gantt_widget.h).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <QApplication>
#include <QChartView>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QTableWidget>
#include <QWheelEvent>

#include "gui/charts.h"
#include "gui/gantt_widget.h"
#include "gui/main_window.h"
#include "sim/base/check.h"
#include "tests/temp_dir.h"

namespace g = rackstep::gui;
namespace fs = std::filesystem;

namespace {

TempDir tmp("gui", "viewer");  // removed when the test binary exits

std::string write_tmp(const std::string& name, const std::string& text) {
  const std::string path = tmp.file(name);
  std::ofstream(path) << text;
  return path;
}

const char* kTrace = R"({"traceEvents":[
{"ph":"M","name":"process_name","pid":0,"args":{"name":"gpu0"}},
{"ph":"M","name":"thread_name","pid":0,"tid":0,"args":{"name":"compute"}},
{"ph":"M","name":"thread_name","pid":0,"tid":1,"args":{"name":"comm"}},
{"ph":"X","pid":0,"tid":0,"ts":0,"dur":200,"name":"L0.fwd","cat":"forward"},
{"ph":"X","pid":0,"tid":1,"ts":200,"dur":100,"name":"reduce_scatter","cat":"fsdp","args":{"critical":true,"bytes":1000000000}},
{"ph":"X","pid":0,"tid":0,"ts":300,"dur":200,"name":"L0.bwd","cat":"backward"}]})";

template <class T>
T* find_widget(QWidget* root) {
  for (QWidget* w : root->findChildren<QWidget*>()) {
    if (auto* t = dynamic_cast<T*>(w)) return t;
  }
  return nullptr;
}

// The x pixel of time t in the widget (the layout of gui/gantt_paint.cpp: label
// column, plot, 8 px margin, then the 14 px scroll bar).
double x_of(const g::GanttWidget& w, double t_us) {
  const g::GanttView& v = w.view();
  const double plot_w = w.width() - 14 - v.geo.label_w - 8;
  return v.geo.label_w + (t_us - v.t0_us) / (v.t1_us - v.t0_us) * plot_w;
}

void send_move(QWidget* w, QPointF at, Qt::MouseButtons buttons = Qt::NoButton) {
  QMouseEvent e(QEvent::MouseMove, at, w->mapToGlobal(at), Qt::NoButton, buttons, Qt::NoModifier);
  QApplication::sendEvent(w, &e);
}

}  // namespace

TEST_CASE("viewer: timeline zoom, pan, fit and hover details", "[gui][viewer]") {
  REQUIRE(g::charts_available());
  g::MainWindow win;
  win.open_file(write_tmp("t.json", kTrace));
  win.resize(1200, 800);
  win.show();
  QApplication::processEvents();
  auto* gantt = find_widget<g::GanttWidget>(&win);
  REQUIRE(gantt != nullptr);
  REQUIRE(gantt->width() > 600);
  std::string details;
  gantt->on_details = [&](const std::string& text) { details = text; };

  // Hover the reduce-scatter (row 1: below the process header and row 0).
  const g::GanttGeometry geo = gantt->view().geo;
  const double row1_y = geo.axis_h + geo.header_h + geo.row_h + geo.row_h / 2.0;
  send_move(gantt, QPointF(x_of(*gantt, 250), row1_y));
  CHECK_THAT(details, Catch::Contains("reduce_scatter"));
  CHECK_THAT(details, Catch::Contains("critical path"));
  CHECK_THAT(details, Catch::Contains("\"bytes\": 1000000000"));
  CHECK_THAT(details, Catch::Contains("exposed (compute idle): 100 us"));
  details.clear();
  send_move(gantt, QPointF(x_of(*gantt, 100), row1_y));  // empty comm row under the forward pass
  CHECK(details.empty());

  // Wheel: zoom in around the pointer; the time under it stays put.
  const g::GanttView before = gantt->view();
  const QPointF at(x_of(*gantt, 250), row1_y);
  QWheelEvent wheel(at, gantt->mapToGlobal(at), QPoint(), QPoint(0, 240), Qt::NoButton, Qt::NoModifier,
                    Qt::NoScrollPhase, false);
  QApplication::sendEvent(gantt, &wheel);
  const g::GanttView zoomed = gantt->view();
  CHECK((zoomed.t1_us - zoomed.t0_us) < 0.8 * (before.t1_us - before.t0_us));
  CHECK(x_of(*gantt, 250) == Approx(at.x()).margin(0.5));

  // Drag 100 px right: the window moves 100 px worth of time earlier.
  const double span = zoomed.t1_us - zoomed.t0_us;
  const double plot_w = gantt->width() - 14 - geo.label_w - 8;
  QMouseEvent press(QEvent::MouseButtonPress, at, gantt->mapToGlobal(at), Qt::LeftButton, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(gantt, &press);
  send_move(gantt, at + QPointF(100, 0), Qt::LeftButton);
  QMouseEvent release(QEvent::MouseButtonRelease, at + QPointF(100, 0), gantt->mapToGlobal(at), Qt::LeftButton,
                      Qt::NoButton, Qt::NoModifier);
  QApplication::sendEvent(gantt, &release);
  CHECK(gantt->view().t0_us == Approx(zoomed.t0_us - 100.0 / plot_w * span));

  // F fits the whole trace again.
  QKeyEvent f(QEvent::KeyPress, Qt::Key_F, Qt::NoModifier, "f");
  QApplication::sendEvent(gantt, &f);
  CHECK(gantt->view().t0_us == Approx(before.t0_us));
  CHECK(gantt->view().t1_us == Approx(before.t1_us));
}

TEST_CASE("viewer: one tab per file kind; a bad file adds none", "[gui][viewer]") {
  REQUIRE(g::charts_available());
  g::MainWindow win;
  win.open_file(write_tmp("sizing.json", R"({"candidates": [
      {"name": "a", "days": 70, "forecast_loss": 1.9, "memory": {"weights_bytes": 3e10}},
      {"name": "b", "days": 90, "forecast_loss": 1.95, "memory": {"weights_bytes": 4e10}},
      {"name": "c", "days": 50, "forecast_loss": 2.0}]})"));
  REQUIRE(win.tabs()->count() == 1);
  auto* table = find_widget<QTableWidget>(win.tabs()->widget(0));
  REQUIRE(table != nullptr);
  CHECK(table->rowCount() == 3);
  CHECK(table->item(0, 0)->text() == "a");  // file order, not sorted
  CHECK(table->item(2, 0)->text() == "c");
  CHECK(win.tabs()->widget(0)->findChildren<QChartView*>().size() == 2);  // memory bars, days vs loss

  win.open_file(write_tmp("drops.json", R"({"sweep": "cf", "points": [
      {"cf": "1.0", "total": 0.05}, {"cf": "1.1", "total": 0.03}, {"cf": "1.3", "total": 0.01}]})"));
  REQUIRE(win.tabs()->count() == 2);
  CHECK(win.tabs()->widget(1)->findChildren<QChartView*>().size() == 1);

  const std::string bad = write_tmp("bad.json", R"({"traceEvents": [{"ph": "X", "ts": 0}]})");
  CHECK_THROWS_AS(win.open_file(bad), rackstep::UserError);
  CHECK(win.tabs()->count() == 2);
}
