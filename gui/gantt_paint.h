// Draws a trace (gui/trace_model.h) as a per-GPU, per-stream Gantt chart
// with QPainter, for both the viewer's timeline widget and PNG timelines.
//
//   GanttView v = fit_view(model);            // the whole trace
//   paint_gantt(painter, model, QSize(1600, 900), v);
//   if (auto hit = gantt_hit(model, size, v, mouse)) show(model.rows[hit->row].events[hit->event]);
//
// Layout, top to bottom: a time axis, then per process a header line (click
// it to collapse the process; the header of the process at the top stays
// pinned while its rows scroll), one row per thread (one lane per nesting
// level of its slices) and one track per counter. A label column on the left
// names the rows.
#pragma once

#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <vector>

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
  int row_h = 22;       // one lane of a thread
  int counter_h = 44;   // one counter track
};

struct GanttView {
  double t0_us = 0, t1_us = 1;  // visible time window
  int scroll_px = 0;            // rows scrolled up under the axis
  bool dim_noncritical = false; // fade slices off the critical path
  bool show_flows = false;      // dependency arrows
  int hover_row = -1, hover_event = -1;    // outlined
  int pinned_row = -1, pinned_event = -1;  // outlined in black until unpinned
  std::set<int64_t> collapsed;  // pids whose rows are folded under their header
  std::string search;           // lower case; slices whose name, category or op class contain it stand out
  std::string row_filter;       // lower case; only rows whose process or thread name contain it
  int op_class = -1;            // >= 0: only slices of this TraceModel::op_classes entry stand out
  double sel_t0_us = NAN, sel_t1_us = NAN;  // a range selection, drawn with its duration
  GanttGeometry geo;
};

struct GanttHit {
  int row = -1;
  int event = -1;
};

// One horizontal band of the chart, in content coordinates (below the axis).
struct GanttTrack {
  enum Kind { header, row, counter } kind = row;
  int index = 0;  // header: a row or counter of the process; row: TraceModel::rows; counter: TraceModel::counters
  int64_t pid = 0;
  int y = 0, h = 0;
};
struct GanttLayout {
  std::vector<GanttTrack> tracks;
  std::vector<int> row_track;  // per row: its track, or -1 when hidden (collapsed or filtered out)
  int height = 0;
  int rows_shown = 0, rows_left_out = 0;  // of a bounded layout
};

// The whole trace, with a small margin.
GanttView fit_view(const TraceModel& m);
// The tracks in display order; `max_rows` >= 0 bounds the thread rows laid out.
GanttLayout gantt_layout(const TraceModel& m, const GanttView& v, int max_rows = -1);
// Height of all process headers and rows, without the axis.
int gantt_content_height(const TraceModel& m, const GanttView& v);

void paint_gantt(QPainter& p, const TraceModel& m, QSize size, const GanttView& v, int max_rows = -1);
// The legend: every category (by time), critical path, exposed communication;
// wraps onto as many lines as `r` is tall. Returns the height it needs at r.width().
int paint_gantt_legend(QPainter& p, const TraceModel& m, const QRect& r);
std::optional<GanttHit> gantt_hit(const TraceModel& m, QSize size, const GanttView& v, QPoint at);
// The pid of the process header under `at`, if any.
std::optional<int64_t> gantt_header_hit(const TraceModel& m, QSize size, const GanttView& v, QPoint at);
// Time at the x pixel `x` of a chart `width` px wide, and back.
double gantt_time_at(const GanttView& v, int width, double x);
double gantt_x_of(const GanttView& v, int width, double t_us);

// A stable colour per category name: the same name has the same colour in
// every file; communication categories get the warm colours.
QColor category_color(const TraceModel& m, int category);
// True when the slice matches the view's search and op-class filter.
bool slice_matches(const TraceModel& m, const TraceEvent& e, const GanttView& v);
// Multi-line description of a slice for tooltips and the details pane.
std::string describe_event(const TraceModel& m, int row, int event);

// Per slice name over a time range on the rows shown: count, time inside the range, mean, share.
struct RangeAggregate {
  std::string name;
  int64_t count = 0;
  double total_us = 0, mean_us = 0, share = 0;  // share of all slice time in the range
};
std::vector<RangeAggregate> aggregate_range(const TraceModel& m, const GanttView& v, double t0_us, double t1_us);

}  // namespace rackstep::gui
