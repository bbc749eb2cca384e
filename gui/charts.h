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

#include <string>

#include "gui/chart_spec.h"

namespace rackstep::gui {

// True when charts can be drawn: creates an offscreen QApplication unless
// one exists (a QApplication made by the GUI is reused). False when the Qt
// offscreen platform plugin is missing or a non-widget Qt application runs.
bool charts_available();

// Each renders one spec of gui/chart_spec.h to a PNG file.
void render_scatter(const ScatterSpec& spec, const std::string& png_path);
void render_stacked_bars(const StackedBarSpec& spec, const std::string& png_path);
void render_histogram(const HistogramSpec& spec, const std::string& png_path);
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
