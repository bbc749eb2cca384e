// Qt Charts from the plain chart specs; see gui/chart_build.h.
#include "gui/chart_build.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <QAreaSeries>
#include <QBarCategoryAxis>
#include <QBarSet>
#include <QLegendMarker>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QPen>
#include <QScatterSeries>
#include <QStackedBarSeries>
#include <QValueAxis>

#include "sim/base/check.h"

namespace rackstep::gui {
namespace {

const QColor kDeadline(0xc0, 0x1c, 0x28);

QString qs(const std::string& s) { return QString::fromStdString(s); }

std::string num(double v, const char* fmt = "%.3g") {
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

QChart* new_chart(const std::string& title) {
  auto* c = new QChart;
  c->setTitle(qs(title));
  QFont f = c->titleFont();
  f.setPointSizeF(f.pointSizeF() * 1.4);
  f.setBold(true);
  c->setTitleFont(f);
  c->legend()->setAlignment(Qt::AlignBottom);
  c->setBackgroundRoundness(0);
  c->setMargins(QMargins(6, 6, 6, 6));
  return c;
}

QValueAxis* value_axis(QChart* c, const std::string& title, double lo, double hi, Qt::Alignment where) {
  auto* a = new QValueAxis;
  a->setTitleText(qs(title));
  a->setRange(lo, hi);
  a->setLabelFormat("%.4g");
  a->setTickType(QValueAxis::TicksDynamic);
  a->setTickAnchor(0);
  // A 1-2-5 interval for about 8 ticks keeps labels round.
  const double raw = (hi - lo) / 8;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double f : {1.0, 2.0, 5.0}) {
    if (f * mag >= raw) {
      step = f * mag;
      break;
    }
  }
  a->setTickInterval(step);
  c->addAxis(a, where);
  return a;
}

// A dashed straight line from (x0, y0) to (x1, y1) on the given axes.
QLineSeries* rule(QChart* c, const std::string& name, double x0, double y0, double x1, double y1, QAbstractAxis* ax,
                  QAbstractAxis* ay) {
  auto* s = new QLineSeries;
  s->setName(qs(name));
  s->append(x0, y0);
  s->append(x1, y1);
  c->addSeries(s);  // before styling: adding applies the theme's pen
  s->setPen(QPen(kDeadline, 2.5, Qt::DashLine));
  s->attachAxis(ax);
  s->attachAxis(ay);
  return s;
}

void need(bool ok, const std::string& chart, const std::string& expected, const std::string& found) {
  if (!ok) throw UserError("chart \"" + chart + "\": expected " + expected + ", found " + found);
}

}  // namespace

QChart* build_scatter(const ScatterSpec& spec) {
  need(!spec.points.empty(), spec.title, "at least one point", "none");
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (const ScatterPoint& p : spec.points) {
    need(std::isfinite(p.x) && std::isfinite(p.y), spec.title, "finite coordinates",
         p.label + " at (" + num(p.x) + ", " + num(p.y) + ")");
    xlo = std::min(xlo, p.x), xhi = std::max(xhi, p.x);
    ylo = std::min(ylo, p.y), yhi = std::max(yhi, p.y);
  }
  if (std::isfinite(spec.deadline_x)) xlo = std::min(xlo, spec.deadline_x), xhi = std::max(xhi, spec.deadline_x);
  auto [x0, x1] = padded(xlo, xhi, 0.12);
  auto [y0, y1] = padded(ylo, yhi, 0.15);

  QChart* c = new_chart(spec.title);
  QValueAxis* ax = value_axis(c, spec.x_label, x0, x1, Qt::AlignBottom);
  QValueAxis* ay = value_axis(c, spec.y_label, y0, y1, Qt::AlignLeft);
  // Labels sit above their point; one that would overlap a label already
  // placed (boxes estimated from the chart size, 7 px a character, 16 px a
  // line) moves below its point, then further down, until it is clear.
  const double px_x = (x1 - x0) / std::max(200, spec.width_px - 100);
  const double px_y = (y1 - y0) / std::max(150, spec.height_px - 180);
  struct Box {
    double x0, x1, y0, y1;
  };
  std::vector<Box> placed;
  for (const ScatterPoint& p : spec.points) {  // markers are obstacles too
    const double r = (p.highlight ? 11 : 8);
    placed.push_back({p.x - r * px_x, p.x + r * px_x, p.y - r * px_y, p.y + r * px_y});
  }
  auto overlaps = [&](const Box& b) {
    for (const Box& o : placed) {
      if (b.x0 < o.x1 && o.x0 < b.x1 && b.y0 < o.y1 && o.y0 < b.y1) return true;
    }
    return false;
  };
  // The winner's label is placed first, so it keeps the best place.
  std::vector<ScatterPoint> order = spec.points;
  std::stable_sort(order.begin(), order.end(),
                   [](const ScatterPoint& a, const ScatterPoint& b) { return a.highlight && !b.highlight; });
  for (const ScatterPoint& p : order) {
    const std::string text = p.label + (p.highlight ? "  (best)" : "");
    const double half_w = 3.5 * static_cast<double>(text.size()) * px_x, line = 16 * px_y;
    // Candidate places: above (Qt's own), right, left, below, then further up and down.
    const double side = half_w + 15 * px_x;  // clear of the marker (radius 11 px at most)
    const std::pair<double, double> tries[] = {{0, 0},  {side, -0.55}, {-side, -0.55}, {0, -2}, {0, 1},
                                               {0, -3}, {0, 2},        {side, 1},      {-side, 1}, {0, -4}};
    double dx = 0, offset_lines = 0;  // (0, 0): Qt's own place above the point
    for (auto [tx, k] : tries) {
      const Box b{p.x + tx - half_w, p.x + tx + half_w, p.y + (k + 0.5) * line, p.y + (k + 1.5) * line};
      if (!overlaps(b)) {
        dx = tx;
        offset_lines = k;
        placed.push_back(b);
        break;
      }
    }
    auto* s = new QScatterSeries;
    s->setName(qs(p.label));
    s->append(p.x, p.y);
    c->addSeries(s);
    const bool moved = dx != 0 || offset_lines != 0;
    if (moved) {
      // The label rides on an invisible point beside, below or above the marker.
      auto* tag = new QScatterSeries;
      tag->append(p.x + dx, p.y + (offset_lines + 0.3) * line);
      c->addSeries(tag);
      tag->setMarkerSize(1);
      tag->setColor(Qt::transparent);
      tag->setBorderColor(Qt::transparent);
      tag->setPointLabelsFormat(qs(text));
      tag->setPointLabelsVisible(true);
      tag->setPointLabelsClipping(false);
      QFont f = tag->pointLabelsFont();
      f.setBold(p.highlight);
      f.setPointSizeF(f.pointSizeF() * 1.1);
      tag->setPointLabelsFont(f);
      tag->attachAxis(ax);
      tag->attachAxis(ay);
      for (QLegendMarker* m : c->legend()->markers(tag)) m->setVisible(false);
    }
    s->setMarkerSize(p.highlight ? 20 : 13);
    s->setBorderColor(p.highlight ? Qt::black : Qt::white);
    // A literal format string labels the point with the candidate's name.
    s->setPointLabelsFormat(qs(text));
    s->setPointLabelsVisible(!moved);
    s->setPointLabelsClipping(false);
    QFont f = s->pointLabelsFont();
    f.setBold(p.highlight);
    f.setPointSizeF(f.pointSizeF() * 1.1);
    s->setPointLabelsFont(f);
    s->attachAxis(ax);
    s->attachAxis(ay);
    for (QLegendMarker* m : c->legend()->markers(s)) m->setVisible(false);  // the label names it
  }
  if (std::isfinite(spec.deadline_x))
    rule(c, spec.deadline_label + " (" + num(spec.deadline_x, "%.4g") + ")", spec.deadline_x, y0, spec.deadline_x, y1,
         ax, ay);
  else
    c->legend()->hide();
  return c;
}

QChart* build_stacked_bars(const StackedBarSpec& spec) {
  const size_t n = spec.categories.size();
  need(n > 0, spec.title, "at least one category", "none");
  need(!spec.segments.empty(), spec.title, "at least one segment", "none");
  std::vector<double> totals(n, 0);
  for (const BarSegment& seg : spec.segments) {
    need(seg.values.size() == n, spec.title, std::to_string(n) + " values in segment \"" + seg.name + "\"",
         std::to_string(seg.values.size()));
    for (size_t i = 0; i < n; ++i) {
      need(std::isfinite(seg.values[i]) && seg.values[i] >= 0, spec.title, "finite values >= 0",
           num(seg.values[i]) + " in \"" + seg.name + "\"");
      totals[i] += seg.values[i];
    }
  }
  const bool has_cap = std::isfinite(spec.capacity);
  double top = *std::max_element(totals.begin(), totals.end());
  if (has_cap) top = std::max(top, spec.capacity);

  QChart* c = new_chart(spec.title);
  c->legend()->setAlignment(Qt::AlignRight);  // a dozen parts: one per line, names in full
  auto* bars = new QStackedBarSeries;
  for (const BarSegment& seg : spec.segments) {
    auto* set = new QBarSet(qs(seg.name));
    for (double v : seg.values) set->append(v);
    bars->append(set);
  }
  bars->setBarWidth(0.6);
  c->addSeries(bars);
  // Each label carries the bar's total and whether it exceeds the capacity.
  QStringList labels;
  for (size_t i = 0; i < n; ++i) {
    std::string l = spec.categories[i] + " (" + num(totals[i], "%.0f");
    l += has_cap && totals[i] > spec.capacity ? ", over)" : ")";
    labels << qs(l);
  }
  auto* ax = new QBarCategoryAxis;
  ax->append(labels);
  c->addAxis(ax, Qt::AlignBottom);
  bars->attachAxis(ax);
  QValueAxis* ay = value_axis(c, spec.y_label, 0, top * 1.12 > 0 ? top * 1.12 : 1, Qt::AlignLeft);
  bars->attachAxis(ay);
  if (has_cap) {
    // A hidden value axis spanning the category slots carries the capacity line.
    auto* slot_axis = new QValueAxis;
    slot_axis->setRange(-0.5, static_cast<double>(n) - 0.5);
    slot_axis->setVisible(false);
    c->addAxis(slot_axis, Qt::AlignBottom);
    rule(c, spec.capacity_label + " (" + num(spec.capacity, "%.4g") + ")", -0.5, spec.capacity,
         static_cast<double>(n) - 0.5, spec.capacity, slot_axis, ay);
  }
  return c;
}

QChart* build_histogram(const HistogramSpec& spec) {
  const HistogramBins h = histogram_bins(spec);  // the same bins as the SVG report (gui/chart_svg.h)
  std::vector<double> xs = spec.samples;
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  const int bins = static_cast<int>(h.counts.size());
  const double lo = h.lo, width = h.width, hi = lo + bins * width;
  const std::vector<double>& counts = h.counts;
  double xlo = lo, xhi = hi;
  const bool has_deadline = std::isfinite(spec.deadline_x);
  if (has_deadline) xlo = std::min(xlo, spec.deadline_x), xhi = std::max(xhi, spec.deadline_x);
  auto [x0, x1] = padded(xlo, xhi, 0.05);
  const double ytop = *std::max_element(counts.begin(), counts.end()) * 1.15;

  QChart* c = new_chart(spec.title);
  QValueAxis* ax = value_axis(c, spec.x_label, x0, x1, Qt::AlignBottom);
  QValueAxis* ay = value_axis(c, "samples per bin", 0, ytop, Qt::AlignLeft);
  // Bars as one stepped area: exact bin edges on a value axis.
  auto* upper = new QLineSeries;
  upper->append(lo, 0);
  for (int b = 0; b < bins; ++b) {
    upper->append(lo + b * width, counts[b]);
    upper->append(lo + (b + 1) * width, counts[b]);
  }
  upper->append(hi, 0);
  auto* area = new QAreaSeries(upper);
  area->setName(qs("samples (" + std::to_string(n) + ", " + std::to_string(bins) + " bins)"));
  c->addSeries(area);
  area->setColor(QColor(0x9d, 0xb6, 0xd3));
  area->setBorderColor(QColor(0x2e, 0x59, 0x87));
  area->attachAxis(ax);
  area->attachAxis(ay);
  if (spec.show_cdf) {
    auto* ac = new QValueAxis;
    ac->setTitleText("fraction finished (CDF)");
    ac->setRange(0, 1);
    ac->setTickCount(6);
    ac->setLabelFormat("%.2f");
    c->addAxis(ac, Qt::AlignRight);
    auto* cdf = new QLineSeries;
    cdf->setName("empirical CDF");
    const size_t stride = std::max<size_t>(1, n / 400);  // a few hundred steps are enough to see
    double prev = 0;
    for (size_t i = 0; i < n; i += stride) {
      cdf->append(xs[i], prev);
      prev = static_cast<double>(i + 1) / static_cast<double>(n);
      cdf->append(xs[i], prev);
    }
    cdf->append(xs.back(), 1.0);
    c->addSeries(cdf);
    cdf->setPen(QPen(QColor(0x22, 0x22, 0x22), 2));
    cdf->attachAxis(ax);
    cdf->attachAxis(ac);
  }
  if (has_deadline) {
    const size_t by = static_cast<size_t>(std::upper_bound(xs.begin(), xs.end(), spec.deadline_x) - xs.begin());
    rule(c, spec.deadline_label + " (" + num(spec.deadline_x, "%.4g") + "): " +
                num(100.0 * static_cast<double>(by) / static_cast<double>(n), "%.1f") + "% finish by it",
         spec.deadline_x, 0, spec.deadline_x, ytop, ax, ay);
  }
  return c;
}

QChart* build_lines(const LineSpec& spec) {
  need(!spec.series.empty(), spec.title, "at least one series", "none");
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (const LineSeries& s : spec.series) {
    need(!s.x.empty() && s.x.size() == s.y.size(), spec.title, "as many x as y values (and some) in \"" + s.name + "\"",
         std::to_string(s.x.size()) + " x, " + std::to_string(s.y.size()) + " y");
    for (size_t i = 0; i < s.x.size(); ++i) {
      need(std::isfinite(s.x[i]) && std::isfinite(s.y[i]), spec.title, "finite values", "a NaN or infinity in \"" + s.name + "\"");
      need(!spec.log2_x || s.x[i] > 0, spec.title, "x > 0 on a log axis", num(s.x[i]));
      xlo = std::min(xlo, s.x[i]), xhi = std::max(xhi, s.x[i]);
      ylo = std::min(ylo, s.y[i]), yhi = std::max(yhi, s.y[i]);
    }
  }
  QChart* c = new_chart(spec.title);
  QAbstractAxis* ax = nullptr;
  if (!spec.x_categories.empty()) {
    auto* a = new QBarCategoryAxis;
    for (const std::string& cat : spec.x_categories) a->append(qs(cat));
    a->setTitleText(qs(spec.x_label));
    c->addAxis(a, Qt::AlignBottom);
    ax = a;
  } else if (spec.log2_x) {
    auto* a = new QLogValueAxis;
    a->setBase(2);
    a->setLabelFormat("%g");
    a->setTitleText(qs(spec.x_label));
    a->setRange(xlo / 1.3, xhi * 1.3);
    c->addAxis(a, Qt::AlignBottom);
    ax = a;
  } else {
    auto [x0, x1] = padded(xlo, xhi, 0.05);
    ax = value_axis(c, spec.x_label, x0, x1, Qt::AlignBottom);
  }
  // Fractions and rates start at zero so their ratios read true.
  auto [y0, y1] = ylo >= 0 ? std::pair{0.0, yhi > 0 ? yhi * 1.15 : 1.0} : padded(ylo, yhi, 0.1);
  QValueAxis* ay = value_axis(c, spec.y_label, y0, y1, Qt::AlignLeft);
  for (const LineSeries& ls : spec.series) {
    auto* s = new QLineSeries;
    s->setName(qs(ls.name));
    for (size_t i = 0; i < ls.x.size(); ++i) s->append(ls.x[i], ls.y[i]);
    s->setPointsVisible(true);
    c->addSeries(s);
    QPen pen = s->pen();
    pen.setWidthF(2.5);
    s->setPen(pen);
    s->attachAxis(ax);
    s->attachAxis(ay);
  }
  return c;
}

}  // namespace rackstep::gui
