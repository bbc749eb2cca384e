// Gantt drawing of a trace with QPainter; see gui/gantt_paint.h.
#include "gui/gantt_paint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <QFontMetrics>

namespace rackstep::gui {
namespace {

// Tableau-like palettes: compute kinds in blues/greens/purples, communication
// in oranges/pinks, so the eye separates the two; red is kept for the
// critical path and exposed communication.
const QColor kComputeColors[] = {QColor(0x4e, 0x79, 0xa7), QColor(0x59, 0xa1, 0x4f), QColor(0xb0, 0x7a, 0xa1),
                                 QColor(0x76, 0xb7, 0xb2), QColor(0x9c, 0x75, 0x5f), QColor(0xed, 0xc9, 0x48),
                                 QColor(0x86, 0xbc, 0xb6), QColor(0x8c, 0xd1, 0x7d), QColor(0xba, 0xb0, 0xac)};
const QColor kCommColors[] = {QColor(0xf2, 0x8e, 0x2b), QColor(0xff, 0x9d, 0xa7), QColor(0xd3, 0x72, 0x95),
                              QColor(0xf1, 0xce, 0x63), QColor(0xa0, 0xcb, 0xe8), QColor(0xd4, 0xa6, 0xc8)};
const QColor kCritical(0xb0, 0x00, 0x20);
const QColor kExposed(0xd6, 0x27, 0x28);

// Pixel tops of each row and of each process header, in content coordinates.
struct RowTops {
  std::vector<int> row;     // per row
  std::vector<int> header;  // per row: its process header's top, or -1 when the row continues a process
  int height = 0;
};

RowTops row_tops(const TraceModel& m, const GanttGeometry& g, int max_rows) {
  RowTops t;
  const size_t n = max_rows < 0 ? m.rows.size() : std::min(m.rows.size(), static_cast<size_t>(max_rows));
  int y = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool new_process = i == 0 || m.rows[i].pid != m.rows[i - 1].pid;
    t.header.push_back(new_process ? y : -1);
    if (new_process) y += g.header_h;
    t.row.push_back(y);
    y += g.row_h;
  }
  t.height = y;
  return t;
}

// A 1-2-5 step giving about `target` ticks over `span`.
double nice_step(double span, double target) {
  const double raw = span / std::max(1.0, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0}) {
    if (f * mag >= raw) return f * mag;
  }
  return 10 * mag;
}

std::string tick_label(double us, double step_us) {
  char buf[48];
  if (step_us >= 1e5) std::snprintf(buf, sizeof buf, "%g s", us * 1e-6);
  else if (step_us >= 100) std::snprintf(buf, sizeof buf, "%g ms", us * 1e-3);
  else std::snprintf(buf, sizeof buf, "%g us", us);
  return buf;
}

bool dark(const QColor& c) { return 0.299 * c.red() + 0.587 * c.green() + 0.114 * c.blue() < 140; }

struct Scale {
  double t0, t1;
  int x0, w;
  double px(double t) const { return x0 + (t - t0) / (t1 - t0) * w; }
  double t(double px) const { return t0 + (px - x0) / w * (t1 - t0); }
};

void paint_axis(QPainter& p, const Scale& s, int width, const GanttGeometry& g, int bottom) {
  p.fillRect(0, 0, width, g.axis_h, Qt::white);
  const double step = nice_step(s.t1 - s.t0, s.w / 110.0);
  QFontMetrics fm(p.font());
  for (double t = std::ceil(s.t0 / step) * step; t <= s.t1; t += step) {
    const int x = static_cast<int>(std::lround(s.px(t)));
    p.setPen(QColor(0xe4, 0xe4, 0xe4));
    p.drawLine(x, g.axis_h, x, bottom);
    p.setPen(QColor(0x55, 0x55, 0x55));
    p.drawLine(x, g.axis_h - 6, x, g.axis_h);
    const QString label = QString::fromStdString(tick_label(std::abs(t) < step * 1e-9 ? 0 : t, step));
    p.drawText(x + 3, g.axis_h - 9, label);
  }
  p.setPen(QColor(0x88, 0x88, 0x88));
  p.drawLine(s.x0, g.axis_h, s.x0 + s.w, g.axis_h);
}

void paint_row_events(QPainter& p, const TraceModel& m, const TraceRow& row, int row_index, int y,
                      const Scale& s, const GanttView& v) {
  const int h = v.geo.row_h - 4;
  const int top = y + 2;
  QFontMetrics fm(p.font());
  double last_px = -1e9;
  for (size_t i = m.first_visible(row, s.t0); i < row.events.size(); ++i) {
    const TraceEvent& e = row.events[i];
    if (e.start_us > s.t1) break;
    const double x0 = s.px(e.start_us), x1 = s.px(e.start_us + e.dur_us);
    if (x1 < s.x0) continue;
    const double w = std::max(1.0, x1 - x0);
    // Many slices inside one pixel column: draw the column once.
    if (w <= 1.0 && std::floor(x0) == last_px && !e.critical) continue;
    last_px = std::floor(x0);
    QColor c = category_color(m, e.category);
    if (v.dim_noncritical && !e.critical) c = QColor::fromHsv(c.hue(), c.saturation() / 4, 235);
    const QRectF box(x0, top, w, h);
    p.fillRect(box, c);
    if (e.critical) {
      p.setPen(QPen(kCritical, 2));
      p.drawRect(box.adjusted(1, 1, -1, -1));
    } else if (w > 4) {
      p.setPen(c.darker(140));
      p.drawRect(box.adjusted(0, 0, -1, -1));
    }
    if (static_cast<int>(i) == v.hover_event && row_index == v.hover_row) {
      p.setPen(QPen(Qt::black, 2));
      p.drawRect(box.adjusted(-1, -1, 1, 1));
    }
    if (w > 36) {
      p.setPen(dark(c) ? Qt::white : Qt::black);
      const QString text = fm.elidedText(QString::fromStdString(e.name), Qt::ElideRight, static_cast<int>(w) - 6);
      p.drawText(box.adjusted(3, 0, -3, 0), Qt::AlignVCenter | Qt::AlignLeft, text);
    }
  }
  // Exposed communication: hatched over the lower half of the row, with a solid foot.
  for (auto [a, b] : row.exposed_us) {
    if (b < s.t0 || a > s.t1) continue;
    const double x0 = std::max<double>(s.px(a), s.x0), x1 = std::min<double>(s.px(b), s.x0 + s.w);
    const QRectF band(x0, top + h / 2.0, std::max(1.0, x1 - x0), h / 2.0);
    p.fillRect(band, QBrush(kExposed, Qt::BDiagPattern));
    p.fillRect(QRectF(band.left(), top + h - 3, band.width(), 3), kExposed);
  }
}

}  // namespace

QColor category_color(const TraceModel& m, int category) {
  if (category < 0 || category >= static_cast<int>(m.category_slot.size())) return QColor(0x99, 0x99, 0x99);
  const int slot = m.category_slot[category];
  if (m.category_is_comm[category]) return kCommColors[slot % std::size(kCommColors)];
  return kComputeColors[slot % std::size(kComputeColors)];
}

GanttView fit_view(const TraceModel& m) {
  GanttView v;
  const double span = std::max(m.t1_us - m.t0_us, 1e-3);
  v.t0_us = m.t0_us - 0.01 * span;
  v.t1_us = m.t1_us + 0.01 * span;
  return v;
}

int gantt_content_height(const TraceModel& m, const GanttGeometry& g) { return row_tops(m, g, -1).height; }

int gantt_rows_height(const TraceModel& m, const GanttGeometry& g, int max_rows) {
  return row_tops(m, g, max_rows).height;
}

void paint_gantt(QPainter& p, const TraceModel& m, QSize size, const GanttView& v, int max_rows) {
  const GanttGeometry& g = v.geo;
  p.fillRect(QRect(QPoint(0, 0), size), Qt::white);
  const Scale s{v.t0_us, std::max(v.t1_us, v.t0_us + 1e-6), g.label_w, std::max(10, size.width() - g.label_w - 8)};
  const RowTops tops = row_tops(m, g, max_rows);
  const int bottom = std::min(size.height(), g.axis_h + tops.height - v.scroll_px);
  paint_axis(p, s, size.width(), g, bottom);

  QFont bold = p.font();
  bold.setBold(true);
  const QFont normal = p.font();
  QFontMetrics fm(normal);
  for (size_t i = 0; i < tops.row.size(); ++i) {
    const TraceRow& row = m.rows[i];
    const int y = g.axis_h + tops.row[i] - v.scroll_px;
    if (y > size.height()) break;
    if (tops.header[i] >= 0) {
      const int hy = g.axis_h + tops.header[i] - v.scroll_px;
      if (hy + g.header_h > g.axis_h) {
        p.fillRect(0, hy, size.width(), g.header_h, QColor(0xee, 0xf0, 0xf4));
        p.setPen(QColor(0x22, 0x22, 0x22));
        p.setFont(bold);
        p.drawText(QRect(6, hy, size.width() - 12, g.header_h), Qt::AlignVCenter | Qt::AlignLeft,
                   QString::fromStdString(row.process_name));
        p.setFont(normal);
      }
    }
    if (y + g.row_h <= g.axis_h) continue;
    if (i % 2 == 1) p.fillRect(s.x0, y, s.w, g.row_h, QColor(0xfa, 0xfa, 0xfa));
    p.save();
    p.setClipRect(QRect(s.x0, std::max(y, g.axis_h), s.w, g.row_h));
    paint_row_events(p, m, row, static_cast<int>(i), y, s, v);
    p.restore();
    std::string label = "  " + row.thread_name;
    if (row.exposed_total_us > 0) label += "  (" + format_us(row.exposed_total_us) + " exposed)";
    p.setPen(row.exposed_total_us > 0 ? kExposed.darker(130) : QColor(0x33, 0x33, 0x33));
    p.drawText(QRect(6, y, g.label_w - 10, g.row_h), Qt::AlignVCenter | Qt::AlignLeft,
               fm.elidedText(QString::fromStdString(label), Qt::ElideRight, g.label_w - 10));
  }
  p.setPen(QColor(0xbb, 0xbb, 0xbb));
  p.drawLine(g.label_w - 1, g.axis_h, g.label_w - 1, bottom);
  // Rows left out of a bounded image are counted, not silently dropped.
  const size_t hidden = m.rows.size() - tops.row.size();
  if (hidden > 0 && bottom + g.row_h <= size.height()) {
    p.setPen(QColor(0x55, 0x55, 0x55));
    p.drawText(QRect(6, bottom + 2, size.width() - 12, g.row_h), Qt::AlignVCenter | Qt::AlignLeft,
               QString("... %1 more rows not shown (open the trace in rackstep-gui or Perfetto)").arg(hidden));
  }
}

void paint_gantt_legend(QPainter& p, const TraceModel& m, const QRect& r) {
  std::vector<int> order(m.categories.size());
  for (size_t c = 0; c < order.size(); ++c) order[c] = static_cast<int>(c);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return m.category_total_us[a] > m.category_total_us[b]; });
  if (order.size() > 8) order.resize(8);
  QFontMetrics fm(p.font());
  int x = r.left() + 6;
  const int sw = 14, cy = r.center().y();
  auto item = [&](const QString& text, auto&& swatch) {
    const QRect box(x, cy - sw / 2, sw, sw);
    swatch(box);
    x += sw + 5;
    p.setPen(QColor(0x33, 0x33, 0x33));
    p.drawText(QPoint(x, cy + fm.ascent() / 2 - 1), text);
    x += fm.horizontalAdvance(text) + 16;
  };
  for (int c : order) {
    const QString name = QString::fromStdString(m.categories[c].empty() ? "(none)" : m.categories[c]);
    item(name, [&](const QRect& b) { p.fillRect(b, category_color(m, c)); });
  }
  item(QString("critical path (%1 slices)").arg(m.n_critical), [&](const QRect& b) {
    p.fillRect(b, QColor(0xdd, 0xdd, 0xdd));
    p.setPen(QPen(kCritical, 2));
    p.drawRect(b.adjusted(1, 1, -1, -1));
  });
  item("exposed communication", [&](const QRect& b) {
    p.fillRect(b, QBrush(kExposed, Qt::BDiagPattern));
    p.fillRect(b.left(), b.bottom() - 2, b.width(), 3, kExposed);
  });
}

std::optional<GanttHit> gantt_hit(const TraceModel& m, QSize size, const GanttView& v, QPoint at) {
  const GanttGeometry& g = v.geo;
  if (at.x() < g.label_w || at.y() < g.axis_h) return std::nullopt;
  const Scale s{v.t0_us, std::max(v.t1_us, v.t0_us + 1e-6), g.label_w, std::max(10, size.width() - g.label_w - 8)};
  const RowTops tops = row_tops(m, g, -1);
  const int cy = at.y() - g.axis_h + v.scroll_px;
  auto it = std::upper_bound(tops.row.begin(), tops.row.end(), cy);
  if (it == tops.row.begin()) return std::nullopt;
  const int row = static_cast<int>(it - tops.row.begin()) - 1;
  if (cy >= tops.row[row] + g.row_h) return std::nullopt;  // on a process header
  const TraceRow& r = m.rows[row];
  // Within 3 pixels; the nearest, and of those the shortest, wins.
  const double tol = 3.0 * (s.t1 - s.t0) / s.w, t = s.t(at.x());
  int best = -1;
  double best_dist = INFINITY, best_dur = INFINITY;
  for (size_t i = m.first_visible(r, t - tol); i < r.events.size(); ++i) {
    const TraceEvent& e = r.events[i];
    if (e.start_us > t + tol) break;
    const double end = e.start_us + e.dur_us;
    const double dist = t < e.start_us ? e.start_us - t : (t > end ? t - end : 0);
    if (dist > tol) continue;
    if (dist < best_dist || (dist == best_dist && e.dur_us < best_dur)) {
      best = static_cast<int>(i);
      best_dist = dist;
      best_dur = e.dur_us;
    }
  }
  if (best < 0) return std::nullopt;
  return GanttHit{row, best};
}

std::string describe_event(const TraceModel& m, int row, int event) {
  const TraceRow& r = m.rows[row];
  const TraceEvent& e = r.events[event];
  std::string s = e.name.empty() ? "(unnamed)" : e.name;
  s += "\ncategory: " + (m.categories[e.category].empty() ? "(none)" : m.categories[e.category]);
  s += "\nrow: " + r.process_name + " / " + r.thread_name;
  s += "\nstart: " + format_us(e.start_us) + "   duration: " + format_us(e.dur_us);
  if (e.critical) s += "\non the critical path";
  double exposed_us = 0;
  for (auto [a, b] : r.exposed_us) exposed_us += std::max(0.0, std::min(b, e.start_us + e.dur_us) - std::max(a, e.start_us));
  if (exposed_us > 0) s += "\nexposed (compute idle): " + format_us(exposed_us);
  if (!e.args_json.empty()) {
    std::string args = nlohmann::ordered_json::parse(e.args_json).dump(2);
    if (args.size() > 1500) args = args.substr(0, 1500) + "\n...";
    s += "\nargs: " + args;
  }
  return s;
}

}  // namespace rackstep::gui
