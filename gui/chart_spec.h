// The charts rackstep draws, as plain data: a scatter of candidates, stacked
// bars, a histogram with its CDF, lines against one x. No Qt here: the specs
// are built by gui/result_charts.h for both the desktop viewer and the size
// report, and drawn by gui/charts.h (PNG, offscreen Qt) or gui/chart_build.h
// (the viewer's QCharts).
//
//   ScatterSpec s;
//   s.title = "Candidates";
//   s.points = {{"535B-A23B", 71.2, 1.912, true}, {"360B FSDP", 88.0, 1.95}};
//   s.deadline_x = 80;
#pragma once

#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace rackstep::gui {

inline constexpr double kNone = std::numeric_limits<double>::quiet_NaN();  // "no such line"

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

// A histogram's bins: equal widths from the smallest sample to the largest.
struct HistogramBins {
  double lo = 0, width = 0;    // bin b spans [lo + b * width, lo + (b + 1) * width)
  std::vector<double> counts;  // samples per bin
};
// spec.bins bins, or (0) the larger of Sturges' rule (ceil(log2 n) + 1, good
// for small n) and the square-root rule (finer for the thousands of runs a
// Monte Carlo gives), 5 to 60. Throws rackstep::UserError for no samples or a
// sample that is not finite.
HistogramBins histogram_bins(const HistogramSpec& spec);

// An axis range: [lo, hi] widened by `frac` of the span each side (a unit
// span when flat), so points do not sit on the frame.
std::pair<double, double> padded(double lo, double hi, double frac);

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

}  // namespace rackstep::gui
