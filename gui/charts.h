// Charts rendered to PNG files without a display (Qt Charts on the
// "offscreen" platform), for reports written by command-line tools.
//
// Plain C++ structs in, a PNG file out; no Qt type appears here, so callers
// such as `rackstep size --report DIR` need no Qt headers. This library is
// built only where Qt 6 Widgets + Charts exist; the build then defines
// RACKSTEP_HAVE_QT=1 for the `rackstep` binary:
//
//   #if RACKSTEP_HAVE_QT
//   #include "gui/charts.h"
//   namespace g = rackstep::gui;
//   if (g::charts_available()) {
//     g::ScatterSpec s;
//     s.title = "Candidates";
//     s.points = {{"535B-A23B", 71.2, 1.912, true}, {"360B FSDP", 88.0, 1.95}};
//     s.deadline_x = 80;
//     g::render_scatter(s, dir + "/days_vs_loss.png");
//   }
//   #endif
//
// Every render_* call must come from the thread that first called
// charts_available() (Qt draws on its main thread). A spec with nothing to
// draw, or a PNG that cannot be written, throws rackstep::UserError; the file
// is written atomically (a temporary file, then a rename).
#pragma once

#include <limits>
#include <string>
#include <vector>

namespace rackstep::gui {

inline constexpr double kNone = std::numeric_limits<double>::quiet_NaN();  // "no such line"

// True when charts can be drawn: creates an offscreen QApplication unless
// one exists (a QApplication made by the GUI is reused). False when the Qt
// offscreen platform plugin is missing or a non-widget Qt application runs.
bool charts_available();

// Days to train against forecast loss, one labelled point per candidate.
struct ScatterPoint {
  std::string label;
  double x = 0;
  double y = 0;
  bool highlight = false;  // drawn larger (the winner)
};
struct ScatterSpec {
  std::string title;
  std::string x_label = "days to train";
  std::string y_label = "forecast loss";
  std::vector<ScatterPoint> points;
  double deadline_x = kNone;  // a dashed vertical line, e.g. days to the deadline
  std::string deadline_label = "deadline";
  int width_px = 1200, height_px = 750;
};
void render_scatter(const ScatterSpec& spec, const std::string& png_path);

// Stacked bars, one bar per category (candidate), one segment per part
// (weights, gradients, optimizer, activations, buffers...), with an optional
// horizontal capacity line (HBM per GPU).
struct BarSegment {
  std::string name;
  std::vector<double> values;  // one per category
};
struct StackedBarSpec {
  std::string title;
  std::string y_label = "GiB per GPU";
  std::vector<std::string> categories;
  std::vector<BarSegment> segments;
  double capacity = kNone;
  std::string capacity_label = "HBM capacity";
  int width_px = 1200, height_px = 750;
};
void render_stacked_bars(const StackedBarSpec& spec, const std::string& png_path);

// Histogram of samples (e.g. Monte Carlo finish days) with its empirical CDF
// on a right-hand axis and an optional deadline; the legend states the
// fraction of samples at or before the deadline.
struct HistogramSpec {
  std::string title;
  std::string x_label = "days to finish";
  std::vector<double> samples;
  int bins = 0;  // 0: chosen from the sample count (Sturges, at most 60)
  bool show_cdf = true;
  double deadline_x = kNone;
  std::string deadline_label = "deadline";
  int width_px = 1200, height_px = 750;
};
void render_histogram(const HistogramSpec& spec, const std::string& png_path);

// Several series against one x (EP drop fraction against context length,
// one series per transport or capacity factor).
struct LineSeries {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
};
struct LineSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<LineSeries> series;
  bool log2_x = false;  // powers of two such as 4096, 16384, 65536
  // When set, x values are indices 0..n-1 drawn with these names
  // (a sweep over "pooled", "ragged").
  std::vector<std::string> x_categories;
  int width_px = 1200, height_px = 750;
};
void render_lines(const LineSpec& spec, const std::string& png_path);

// A Gantt image of a Chrome trace JSON (gui/trace_model.h): one row per GPU
// stream, slices coloured by category, critical-path slices outlined, exposed
// communication hatched. Malformed traces throw rackstep::UserError.
struct TimelineSpec {
  std::string trace_path;
  std::string title;        // empty: the file name
  double t0_us = kNone;     // window; kNone: the whole trace
  double t1_us = kNone;
  int max_rows = 48;        // rows beyond this are summarised in one line
  int width_px = 1600;      // the height follows from the rows shown
};
void render_timeline(const TimelineSpec& spec, const std::string& png_path);

}  // namespace rackstep::gui
