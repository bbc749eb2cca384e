// SVG charts without Qt; see gui/chart_svg.h.
#include "gui/chart_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "sim/base/check.h"

namespace rackstep::gui {
namespace {

// Segment colours that stay apart on screen and in print.
const char* const kColours[] = {"#2e5987", "#d9822b", "#3f8f4f", "#b23a48", "#7a5195",
                                "#6c8ebf", "#c9a227", "#4d4d4d", "#58a4b0", "#a05195"};

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string px(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

void need(bool ok, const std::string& title, const std::string& expected, const std::string& found) {
  if (!ok) throw UserError(title, "", expected, found);
}

// Round tick values covering [lo, hi]: steps of 1, 2 or 5 x 10^k, about `n` of them.
std::vector<double> ticks(double lo, double hi, int n = 6) {
  const double raw = (hi - lo) / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

// A plot area with value axes; maps data to pixels and writes SVG elements.
class Plot {
 public:
  Plot(int w, int h, double x0, double x1, double y0, double y1, int right_margin = 40)
      : w_(w), h_(h), left_(90), right_(w - right_margin), top_(60), bottom_(h - 80), x0_(x0), x1_(x1), y0_(y0),
        y1_(y1) {
    svg_ = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(w) + "\" height=\"" +
           std::to_string(h) + "\" viewBox=\"0 0 " + std::to_string(w) + " " + std::to_string(h) +
           "\" font-family=\"sans-serif\" font-size=\"14\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  }
  double x(double v) const { return left_ + (v - x0_) / (x1_ - x0_) * (right_ - left_); }
  double y(double v) const { return bottom_ - (v - y0_) / (y1_ - y0_) * (bottom_ - top_); }
  double left() const { return left_; }
  double right() const { return right_; }
  double top() const { return top_; }
  double bottom() const { return bottom_; }

  void title(const std::string& t) {
    text(w_ / 2.0, 32, t, "middle", "font-size=\"18\" font-weight=\"bold\"");
  }
  // Axes, grid and labels; `x_ticks` false for category axes the caller labels.
  void axes(const std::string& x_label, const std::string& y_label, bool x_ticks = true) {
    for (double t : ticks(y0_, y1_)) {
      line(left_, y(t), right_, y(t), "#e0e0e0");
      text(left_ - 8, y(t) + 5, num(t), "end");
    }
    if (x_ticks) {
      for (double t : ticks(x0_, x1_)) {
        line(x(t), bottom_, x(t), bottom_ + 5, "#404040");
        text(x(t), bottom_ + 22, num(t), "middle");
      }
    }
    line(left_, bottom_, right_, bottom_, "#404040");
    line(left_, top_, left_, bottom_, "#404040");
    text((left_ + right_) / 2, h_ - 24, x_label, "middle");
    svg_ += "<text x=\"20\" y=\"" + px((top_ + bottom_) / 2) + "\" text-anchor=\"middle\" transform=\"rotate(-90 20 " +
            px((top_ + bottom_) / 2) + ")\">" + escaped(y_label) + "</text>\n";
  }
  void line(double xa, double ya, double xb, double yb, const std::string& colour, const std::string& extra = "") {
    svg_ += "<line x1=\"" + px(xa) + "\" y1=\"" + px(ya) + "\" x2=\"" + px(xb) + "\" y2=\"" + px(yb) + "\" stroke=\"" +
            colour + "\" " + extra + "/>\n";
  }
  void text(double tx, double ty, const std::string& t, const char* anchor, const std::string& extra = "") {
    svg_ += "<text x=\"" + px(tx) + "\" y=\"" + px(ty) + "\" text-anchor=\"" + anchor + "\" " + extra + ">" +
            escaped(t) + "</text>\n";
  }
  void rect(double rx, double ry, double rw, double rh, const std::string& fill, const std::string& label) {
    svg_ += "<rect class=\"bar\" x=\"" + px(rx) + "\" y=\"" + px(ry) + "\" width=\"" + px(rw) + "\" height=\"" +
            px(rh) + "\" fill=\"" + fill + "\"><title>" + escaped(label) + "</title></rect>\n";
  }
  void raw(const std::string& s) { svg_ += s; }
  std::string finish() { return svg_ + "</svg>\n"; }

 private:
  int w_, h_;
  double left_, right_, top_, bottom_;
  double x0_, x1_, y0_, y1_;
  std::string svg_;
};

void deadline(Plot& p, double x, const std::string& label) {
  p.line(p.x(x), p.top(), p.x(x), p.bottom(), "#b23a48", "stroke-dasharray=\"6 4\" stroke-width=\"2\"");
  const bool right_half = p.x(x) > (p.left() + p.right()) / 2;  // the label on the side with room
  p.text(p.x(x) + (right_half ? -6 : 6), p.top() + 16, label, right_half ? "end" : "start", "fill=\"#b23a48\"");
}

}  // namespace

std::string svg_scatter(const ScatterSpec& spec) {
  need(!spec.points.empty(), spec.title, "at least one point", "none");
  double xlo = spec.points[0].x, xhi = xlo, ylo = spec.points[0].y, yhi = ylo;
  for (const ScatterPoint& q : spec.points) {
    need(std::isfinite(q.x) && std::isfinite(q.y), spec.title, "finite points", q.label);
    xlo = std::min(xlo, q.x), xhi = std::max(xhi, q.x), ylo = std::min(ylo, q.y), yhi = std::max(yhi, q.y);
  }
  if (std::isfinite(spec.deadline_x)) xlo = std::min(xlo, spec.deadline_x), xhi = std::max(xhi, spec.deadline_x);
  const auto [x0, x1] = padded(xlo, xhi, 0.12);
  const auto [y0, y1] = padded(ylo, yhi, 0.15);
  Plot p(spec.width_px, spec.height_px, x0, x1, y0, y1);
  p.title(spec.title);
  p.axes(spec.x_label, spec.y_label);
  if (std::isfinite(spec.deadline_x)) deadline(p, spec.deadline_x, spec.deadline_label);
  for (const ScatterPoint& q : spec.points) {
    const char* colour = q.highlight ? kColours[1] : kColours[0];
    p.raw("<circle class=\"point\" cx=\"" + px(p.x(q.x)) + "\" cy=\"" + px(p.y(q.y)) + "\" r=\"" +
          (q.highlight ? "9" : "6") + "\" fill=\"" + colour + "\"><title>" + escaped(q.label) + ": " + num(q.x) +
          ", " + num(q.y) + "</title></circle>\n");
    p.text(p.x(q.x) + 12, p.y(q.y) - 8, q.label, "start", q.highlight ? "font-weight=\"bold\"" : "");
  }
  return p.finish();
}

std::string svg_stacked_bars(const StackedBarSpec& spec) {
  need(!spec.categories.empty() && !spec.segments.empty(), spec.title, "bars to draw", "none");
  std::vector<double> totals(spec.categories.size(), 0.0);
  for (const BarSegment& s : spec.segments) {
    need(s.values.size() == spec.categories.size(), spec.title, "one value per category", s.name);
    for (size_t i = 0; i < totals.size(); ++i) totals[i] += std::max(0.0, s.values[i]);
  }
  double ytop = *std::max_element(totals.begin(), totals.end());
  if (std::isfinite(spec.capacity)) ytop = std::max(ytop, spec.capacity);
  const int legend_px = 230;
  Plot p(spec.width_px, spec.height_px, 0, static_cast<double>(spec.categories.size()), 0, ytop * 1.1 + 1e-9,
         40 + legend_px);
  p.title(spec.title);
  p.axes("", spec.y_label, /*x_ticks=*/false);
  const double slot = p.x(1) - p.x(0);
  for (size_t i = 0; i < spec.categories.size(); ++i) {
    double base = 0;
    for (size_t k = 0; k < spec.segments.size(); ++k) {
      const double v = std::max(0.0, spec.segments[k].values[i]);
      if (v <= 0) continue;
      p.rect(p.x(i + 0.2), p.y(base + v), slot * 0.6, p.y(base) - p.y(base + v), kColours[k % 10],
             spec.categories[i] + ": " + spec.segments[k].name + " " + num(v));
      base += v;
    }
    p.text(p.x(i + 0.5), p.bottom() + 22, spec.categories[i], "middle");
  }
  if (std::isfinite(spec.capacity)) {
    p.line(p.left(), p.y(spec.capacity), p.right(), p.y(spec.capacity), "#b23a48",
           "stroke-dasharray=\"6 4\" stroke-width=\"2\"");
    p.text(p.right() - 4, p.y(spec.capacity) - 6, spec.capacity_label + " " + num(spec.capacity), "end",
           "fill=\"#b23a48\"");
  }
  for (size_t k = 0; k < spec.segments.size(); ++k) {
    const double ly = p.top() + 22.0 * static_cast<double>(k);
    p.raw("<rect x=\"" + px(p.right() + 20) + "\" y=\"" + px(ly) + "\" width=\"14\" height=\"14\" fill=\"" +
          kColours[k % 10] + "\"/>\n");
    p.text(p.right() + 40, ly + 12, spec.segments[k].name, "start");
  }
  return p.finish();
}

std::string svg_histogram(const HistogramSpec& spec) {
  const HistogramBins h = histogram_bins(spec);  // the viewer's bins (gui/chart_build.cpp)
  const int bins = static_cast<int>(h.counts.size());
  const double hi = h.lo + bins * h.width;
  double xlo = h.lo, xhi = hi;
  const bool has_deadline = std::isfinite(spec.deadline_x);
  if (has_deadline) xlo = std::min(xlo, spec.deadline_x), xhi = std::max(xhi, spec.deadline_x);
  const auto [x0, x1] = padded(xlo, xhi, 0.05);
  const double ytop = *std::max_element(h.counts.begin(), h.counts.end()) * 1.15;
  Plot p(spec.width_px, spec.height_px, x0, x1, 0, ytop, 80);
  p.title(spec.title);
  p.axes(spec.x_label, "samples per bin");
  for (int b = 0; b < bins; ++b) {
    const double a = h.lo + b * h.width;
    p.rect(p.x(a), p.y(h.counts[b]), p.x(a + h.width) - p.x(a), p.bottom() - p.y(h.counts[b]), "#9db6d3",
           num(a) + " to " + num(a + h.width) + ": " + num(h.counts[b]));
  }
  std::vector<double> xs = spec.samples;
  std::sort(xs.begin(), xs.end());
  const double n = static_cast<double>(xs.size());
  if (spec.show_cdf) {
    // The CDF on a right-hand axis from 0 to 1.
    std::string pts;
    const size_t stride = std::max<size_t>(1, xs.size() / 400);
    for (size_t i = 0; i < xs.size(); i += stride) {
      const double f = static_cast<double>(i + 1) / n;
      pts += px(p.x(xs[i])) + "," + px(p.bottom() - f * (p.bottom() - p.top())) + " ";
    }
    p.raw("<polyline class=\"cdf\" fill=\"none\" stroke=\"#2e5987\" stroke-width=\"2\" points=\"" + pts + "\"/>\n");
    for (double f : {0.0, 0.25, 0.5, 0.75, 1.0}) {
      p.text(p.right() + 8, p.bottom() - f * (p.bottom() - p.top()) + 5, num(f), "start");
    }
  }
  if (has_deadline) {
    const double by = static_cast<double>(std::upper_bound(xs.begin(), xs.end(), spec.deadline_x) - xs.begin()) / n;
    char share[64];
    std::snprintf(share, sizeof share, " (%.1f%% of samples by then)", 100.0 * by);
    deadline(p, spec.deadline_x, spec.deadline_label + share);
  }
  return p.finish();
}

}  // namespace rackstep::gui
