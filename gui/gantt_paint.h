// Draws a trace (gui/trace_model.h) as a per-GPU, per-stream Gantt chart
// with QPainter, for both the viewer's timeline widget and PNG timelines.
//
//   GanttView v = fit_view(model);            // the whole trace
//   paint_gantt(painter, model, QSize(1600, 900), v);
//   if (auto hit = gantt_hit(model, size, v, mouse)) show(model.rows[hit->row].events[hit->event]);
//
// Layout, top to bottom: a time axis, then per process a header line and
// one row per thread. A label column on the left names the rows.
#pragma once

#include <optional>
#include <string>

#include <QColor>
#include <QPainter>
#include <QPoint>
#include <QSize>

#include "gui/trace_model.h"

namespace rackstep::gui {

struct GanttGeometry {
  int label_w = 210;    // row names
  int axis_h = 28;      // time axis
  int header_h = 18;    // a process name line
  int row_h = 22;       // one thread
};

struct GanttView {
  double t0_us = 0, t1_us = 1;  // visible time window
  int scroll_px = 0;            // rows scrolled up under the axis
  bool dim_noncritical = false; // fade slices off the critical path
  int hover_row = -1, hover_event = -1;  // outlined
  GanttGeometry geo;
};

struct GanttHit {
  int row = -1;
  int event = -1;
};

// The whole trace, with a small margin.
GanttView fit_view(const TraceModel& m);
// Height of all process headers and rows, without the axis.
int gantt_content_height(const TraceModel& m, const GanttGeometry& g);
// Height of the first `max_rows` rows with their headers.
int gantt_rows_height(const TraceModel& m, const GanttGeometry& g, int max_rows);

void paint_gantt(QPainter& p, const TraceModel& m, QSize size, const GanttView& v, int max_rows = -1);
// A one-line legend: top categories by time, critical path, exposed communication.
void paint_gantt_legend(QPainter& p, const TraceModel& m, const QRect& r);
std::optional<GanttHit> gantt_hit(const TraceModel& m, QSize size, const GanttView& v, QPoint at);

// A stable colour per category index; communication gets the cool colours.
QColor category_color(const TraceModel& m, int category);
// Multi-line description of a slice for tooltips and the details pane.
std::string describe_event(const TraceModel& m, int row, int event);

}  // namespace rackstep::gui
