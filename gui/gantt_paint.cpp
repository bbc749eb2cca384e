// Gantt drawing of a trace with QPainter; see gui/gantt_paint.h.
#include "gui/gantt_paint.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>

#include <QFontMetrics>
#include <QPainterPath>

namespace rackstep::gui {
namespace {

// Tableau-like palettes: compute kinds in blues/greens/purples, communication
// in oranges/pinks, so the eye separates the two; red is kept for the
// critical path and exposed communication.
const QColor kComputeColors[] = {QColor(0x4e, 0x79, 0xa7), QColor(0x59, 0xa1, 0x4f), QColor(0xb0, 0x7a, 0xa1),
                                 QColor(0x76, 0xb7, 0xb2), QColor(0x9c, 0x75, 0x5f), QColor(0xed, 0xc9, 0x48),
                                 QColor(0x86, 0xbc, 0xb6), QColor(0x8c, 0xd1, 0x7d), QColor(0xba, 0xb0, 0xac),
                                 QColor(0x49, 0x5e, 0x8c), QColor(0x3a, 0x7d, 0x44), QColor(0x7f, 0x5a, 0x99)};
const QColor kCommColors[] = {QColor(0xf2, 0x8e, 0x2b), QColor(0xff, 0x9d, 0xa7), QColor(0xd3, 0x72, 0x95),
                              QColor(0xf1, 0xce, 0x63), QColor(0xa0, 0xcb, 0xe8), QColor(0xd4, 0xa6, 0xc8),
                              QColor(0xc4, 0x6a, 0x1c), QColor(0xe8, 0x7a, 0xb0)};
// The passes and op classes every trace shares keep one colour each, in any file.
struct Fixed {
  const char* name;
  QColor color;
};
const Fixed kFixedColors[] = {
    {"forward", QColor(0x4e, 0x79, 0xa7)},         {"backward", QColor(0x59, 0xa1, 0x4f)},
    {"recompute", QColor(0xb0, 0x7a, 0xa1)},       {"optimizer", QColor(0x9c, 0x75, 0x5f)},
    {"host", QColor(0xba, 0xb0, 0xac)},            {"host_cpu", QColor(0xba, 0xb0, 0xac)},
    {"gc_stall", QColor(0x8c, 0x8c, 0x8c)},        {"data", QColor(0xd7, 0xd0, 0xc8)},
    {"comm", QColor(0xf2, 0x8e, 0x2b)},            {"fsdp_allgather", QColor(0xf2, 0x8e, 0x2b)},
    {"fsdp_reduce_scatter", QColor(0xd3, 0x72, 0x95)}, {"ep_dispatch", QColor(0xf1, 0xce, 0x63)},
    {"ep_combine", QColor(0xff, 0x9d, 0xa7)},      {"ep_all_to_all", QColor(0xf1, 0xce, 0x63)},
    {"grad_sync", QColor(0xc4, 0x6a, 0x1c)},       {"optimizer_comm", QColor(0x8f, 0x4e, 0x2a)},
    {"pp_send", QColor(0xa0, 0xcb, 0xe8)},         {"pp_recv", QColor(0x5b, 0x9b, 0xd5)},
    {"pp", QColor(0xa0, 0xcb, 0xe8)},              {"tp", QColor(0xd4, 0xa6, 0xc8)},
    {"cp_ring", QColor(0xe8, 0x7a, 0xb0)},         {"checkpoint", QColor(0x7f, 0x7f, 0x3f)},
    {"host_copy", QColor(0xc9, 0xb2, 0x8f)}};
const QColor kCritical(0xb0, 0x00, 0x20);
const QColor kExposed(0xd6, 0x27, 0x28);
constexpr int kMaxFlowsDrawn = 4000;

uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool contains_lower(const std::string& hay, const std::string& needle) {
  if (needle.empty()) return true;
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(),
                        [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) == b; });
  return it != hay.end();
}

int lanes_of(const TraceRow& r) { return std::max(1, r.depths); }

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

Scale scale_of(const GanttView& v, int width) {
  return Scale{v.t0_us, std::max(v.t1_us, v.t0_us + 1e-6), v.geo.label_w, std::max(10, width - v.geo.label_w - 8)};
}

void paint_axis(QPainter& p, const Scale& s, int width, const GanttGeometry& g, int bottom) {
  p.fillRect(0, 0, width, g.axis_h, Qt::white);
  const double step = nice_step(s.t1 - s.t0, s.w / 110.0);
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

void paint_row_events(QPainter& p, const TraceModel& m, const TraceRow& row, int row_index, int y, const Scale& s,
                      const GanttView& v) {
  const int lane_h = v.geo.row_h;
  const int h = lane_h - 4;
  QFontMetrics fm(p.font());
  const bool filtering = !v.search.empty() || v.op_class >= 0;
  std::vector<double> last_px(lanes_of(row), -1e9);
  for (size_t i = m.first_visible(row, s.t0); i < row.events.size(); ++i) {
    const TraceEvent& e = row.events[i];
    if (e.start_us > s.t1) break;
    const double x0 = s.px(e.start_us), x1 = s.px(e.start_us + e.dur_us);
    if (x1 < s.x0) continue;
    const double w = std::max(1.0, x1 - x0);
    const int lane = std::min(e.depth, lanes_of(row) - 1);
    const bool marked = static_cast<int>(i) == v.pinned_event && row_index == v.pinned_row;
    // Many slices inside one pixel column: draw the column once.
    if (w <= 1.0 && std::floor(x0) == last_px[lane] && !e.critical && !marked) continue;
    last_px[lane] = std::floor(x0);
    const int top = y + 2 + lane * lane_h;
    QColor c = category_color(m, e.category);
    const bool faded = (v.dim_noncritical && !e.critical) || (filtering && !slice_matches(m, e, v));
    if (faded) c = QColor::fromHsv(c.hue(), c.saturation() / 5, 240);
    const QRectF box(x0, top, w, h);
    p.fillRect(box, c);
    if (w > 4) {
      p.setPen(c.darker(140));
      p.drawRect(box.adjusted(0, 0, -1, -1));
    }
    // The critical path as a strip along the top, so the category colour still shows below it.
    if (e.critical && !faded) p.fillRect(QRectF(x0, top, w, 3), kCritical);
    if (e.critical && !faded && w > 6) {
      p.setPen(QPen(kCritical, 1.5));
      p.drawRect(box.adjusted(0.75, 0.75, -0.75, -0.75));
    }
    if ((static_cast<int>(i) == v.hover_event && row_index == v.hover_row) || marked) {
      p.setPen(QPen(Qt::black, marked ? 3 : 2));
      p.drawRect(box.adjusted(-1, -1, 1, 1));
    }
    if (w > 36) {
      p.setPen(faded ? QColor(0x99, 0x99, 0x99) : (dark(c) ? Qt::white : Qt::black));
      const QString text = fm.elidedText(QString::fromStdString(e.name), Qt::ElideRight, static_cast<int>(w) - 6);
      p.drawText(box.adjusted(3, 0, -3, 0), Qt::AlignVCenter | Qt::AlignLeft, text);
    }
  }
  // Exposed communication: hatched over the lower half of the first lane, with a solid foot.
  const int top = y + 2;
  for (auto [a, b] : row.exposed_us) {
    if (b < s.t0 || a > s.t1) continue;
    const double x0 = std::max<double>(s.px(a), s.x0), x1 = std::min<double>(s.px(b), s.x0 + s.w);
    const QRectF band(x0, top + h / 2.0, std::max(1.0, x1 - x0), h / 2.0);
    p.fillRect(band, QBrush(kExposed, Qt::BDiagPattern));
    p.fillRect(QRectF(band.left(), top + h - 3, band.width(), 3), kExposed);
  }
  // Instants: small downward triangles on the top edge.
  p.setPen(Qt::NoPen);
  auto first = std::lower_bound(row.instants.begin(), row.instants.end(), s.t0,
                                [](const TraceInstant& in, double t) { return in.ts_us < t; });
  for (auto it = first; it != row.instants.end() && it->ts_us <= s.t1; ++it) {
    const double x = s.px(it->ts_us);
    QPainterPath tri;
    tri.moveTo(x - 4, y + 1);
    tri.lineTo(x + 4, y + 1);
    tri.lineTo(x, y + 8);
    tri.closeSubpath();
    p.fillPath(tri, category_color(m, it->category).darker(130));
  }
}

void paint_counter(QPainter& p, const CounterTrack& c, int y, int h, const Scale& s) {
  const double lo = std::min(0.0, c.min_value), hi = c.max_value > lo ? c.max_value : lo + 1;
  auto ypx = [&](double v) { return y + h - 3 - (v - lo) / (hi - lo) * (h - 8); };
  static const QColor kSeries[] = {QColor(0x4e, 0x79, 0xa7), QColor(0xf2, 0x8e, 0x2b), QColor(0x59, 0xa1, 0x4f),
                                   QColor(0xb0, 0x7a, 0xa1)};
  for (size_t k = 0; k < c.series.size(); ++k) {
    QPainterPath path;
    bool started = false;
    double prev_y = ypx(0);
    auto it = std::lower_bound(c.ts_us.begin(), c.ts_us.end(), s.t0);
    size_t i = static_cast<size_t>(it - c.ts_us.begin());
    if (i > 0) --i;  // the value in force at the left edge
    for (; i < c.ts_us.size(); ++i) {
      const double x = std::clamp(s.px(c.ts_us[i]), double(s.x0), double(s.x0 + s.w));
      const double yy = ypx(c.values[i][k]);
      if (!started) {
        path.moveTo(x, yy);
        started = true;
      } else {
        path.lineTo(x, prev_y);  // a counter holds its value until the next sample
        path.lineTo(x, yy);
      }
      prev_y = yy;
      if (c.ts_us[i] > s.t1) break;
    }
    if (!started) continue;
    path.lineTo(s.x0 + s.w, prev_y);
    const QColor col = kSeries[k % std::size(kSeries)];
    p.setPen(QPen(col, 1.5));
    p.setBrush(Qt::NoBrush);
    p.drawPath(path);
  }
  // Each series' name in its colour, then the scale.
  QFontMetrics fm(p.font());
  int x = s.x0 + 4;
  for (size_t k = 0; k < c.series.size(); ++k) {
    const QString name = QString::fromStdString(c.series[k]);
    p.setPen(kSeries[k % std::size(kSeries)]);
    p.drawText(QRect(x, y, 300, 14), Qt::AlignLeft | Qt::AlignTop, name);
    x += fm.horizontalAdvance(name) + 10;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "max %.4g", c.max_value);
  p.setPen(QColor(0x66, 0x66, 0x66));
  p.drawText(QRect(x, y, 200, 14), Qt::AlignLeft | Qt::AlignTop, buf);
}

void paint_flows(QPainter& p, const TraceModel& m, const GanttLayout& lay, const Scale& s, const GanttView& v) {
  p.save();
  p.setRenderHint(QPainter::Antialiasing, true);
  const QColor col(0x33, 0x33, 0x33, 150);
  p.setPen(QPen(col, 1));
  int drawn = 0;
  for (const TraceFlow& f : m.flows) {
    if (drawn >= kMaxFlowsDrawn) break;
    if (std::max(f.from_us, f.to_us) < s.t0 || std::min(f.from_us, f.to_us) > s.t1) continue;
    const int ta = lay.row_track[f.from_row], tz = lay.row_track[f.to_row];
    if (ta < 0 || tz < 0) continue;
    const double ya = v.geo.axis_h + lay.tracks[ta].y - v.scroll_px + v.geo.row_h / 2.0;
    const double yz = v.geo.axis_h + lay.tracks[tz].y - v.scroll_px + v.geo.row_h / 2.0;
    const QPointF a(s.px(f.from_us), ya), z(s.px(f.to_us), yz);
    p.drawLine(a, z);
    // Arrow head at the dependent end.
    const double ang = std::atan2(z.y() - a.y(), z.x() - a.x());
    QPainterPath head;
    head.moveTo(z);
    head.lineTo(z - QPointF(7 * std::cos(ang - 0.4), 7 * std::sin(ang - 0.4)));
    head.lineTo(z - QPointF(7 * std::cos(ang + 0.4), 7 * std::sin(ang + 0.4)));
    head.closeSubpath();
    p.fillPath(head, col);
    ++drawn;
  }
  p.restore();
}

void paint_selection(QPainter& p, const Scale& s, const GanttView& v, int bottom) {
  if (!std::isfinite(v.sel_t0_us) || !std::isfinite(v.sel_t1_us)) return;
  const double a = std::min(v.sel_t0_us, v.sel_t1_us), b = std::max(v.sel_t0_us, v.sel_t1_us);
  const double xa = std::max<double>(s.px(a), s.x0), xb = std::min<double>(s.px(b), s.x0 + s.w);
  if (xb < s.x0 || xa > s.x0 + s.w) return;
  const int top = v.geo.axis_h;
  p.fillRect(QRectF(xa, top, std::max(1.0, xb - xa), bottom - top), QColor(0x30, 0x60, 0xc0, 40));
  p.setPen(QPen(QColor(0x20, 0x40, 0x90), 1));
  p.drawLine(QPointF(xa, top), QPointF(xa, bottom));
  p.drawLine(QPointF(xb, top), QPointF(xb, bottom));
  // The ruler: a bar across the axis with the duration on it.
  const QRectF ruler(xa, 2, std::max(1.0, xb - xa), v.geo.axis_h - 6);
  p.fillRect(ruler, QColor(0xe8, 0xee, 0xfa));
  p.drawRect(ruler);
  const QString d = QString::fromStdString(format_us(b - a));
  QFontMetrics fm(p.font());
  const double tw = fm.horizontalAdvance(d) + 8;
  const QRectF label(xa + std::max(0.0, (xb - xa - tw) / 2), 2, tw, v.geo.axis_h - 6);
  p.fillRect(label, QColor(0x20, 0x40, 0x90));
  p.setPen(Qt::white);
  p.drawText(label, Qt::AlignCenter, d);
}

}  // namespace

QColor category_color(const TraceModel& m, int category) {
  if (category < 0 || category >= static_cast<int>(m.categories.size())) return QColor(0x99, 0x99, 0x99);
  const std::string& name = m.categories[category];
  const std::string key = lower(name);
  for (const Fixed& f : kFixedColors) {
    if (key == f.name) return f.color;
  }
  const bool comm = category < static_cast<int>(m.category_is_comm.size()) && m.category_is_comm[category];
  const uint32_t h = fnv1a(key);
  if (comm) return kCommColors[h % std::size(kCommColors)];
  return kComputeColors[h % std::size(kComputeColors)];
}

bool slice_matches(const TraceModel& m, const TraceEvent& e, const GanttView& v) {
  if (v.op_class >= 0 && e.op_class != v.op_class) return false;
  if (v.search.empty()) return true;
  if (contains_lower(e.name, v.search)) return true;
  if (contains_lower(m.categories[e.category], v.search)) return true;
  return e.op_class >= 0 && contains_lower(m.op_classes[e.op_class], v.search);
}

GanttView fit_view(const TraceModel& m) {
  GanttView v;
  const double span = std::max(m.t1_us - m.t0_us, 1e-3);
  v.t0_us = m.t0_us - 0.01 * span;
  v.t1_us = m.t1_us + 0.01 * span;
  return v;
}

GanttLayout gantt_layout(const TraceModel& m, const GanttView& v, int max_rows) {
  const GanttGeometry& g = v.geo;
  GanttLayout lay;
  lay.row_track.assign(m.rows.size(), -1);
  // Processes in row order, then processes that only have counters.
  std::vector<int64_t> pids;
  std::map<int64_t, std::vector<int>> rows_of, counters_of;
  for (size_t i = 0; i < m.rows.size(); ++i) {
    auto [it, added] = rows_of.try_emplace(m.rows[i].pid);
    if (added) pids.push_back(m.rows[i].pid);
    it->second.push_back(static_cast<int>(i));
  }
  for (size_t i = 0; i < m.counters.size(); ++i) {
    if (!rows_of.count(m.counters[i].pid) && !counters_of.count(m.counters[i].pid)) pids.push_back(m.counters[i].pid);
    counters_of[m.counters[i].pid].push_back(static_cast<int>(i));
  }
  int y = 0;
  for (int64_t pid : pids) {
    const auto& rows = rows_of[pid];
    const auto& counters = counters_of[pid];
    std::vector<int> shown;
    for (int r : rows) {
      const TraceRow& row = m.rows[r];
      if (v.row_filter.empty() || contains_lower(row.process_name, v.row_filter) ||
          contains_lower(row.thread_name, v.row_filter))
        shown.push_back(r);
    }
    const bool counters_shown =
        !counters.empty() && (v.row_filter.empty() || contains_lower(m.counters[counters[0]].process_name, v.row_filter));
    if (shown.empty() && !counters_shown) continue;
    if (max_rows >= 0 && lay.rows_shown >= max_rows) {
      lay.rows_left_out += static_cast<int>(shown.size());
      continue;
    }
    GanttTrack head;
    head.kind = GanttTrack::header;
    head.index = !shown.empty() ? shown[0] : counters[0];
    head.pid = pid;
    head.y = y;
    head.h = g.header_h;
    lay.tracks.push_back(head);
    y += g.header_h;
    if (v.collapsed.count(pid)) continue;
    for (int r : shown) {
      if (max_rows >= 0 && lay.rows_shown >= max_rows) {
        ++lay.rows_left_out;
        continue;
      }
      GanttTrack t;
      t.kind = GanttTrack::row;
      t.index = r;
      t.pid = pid;
      t.y = y;
      t.h = g.row_h * lanes_of(m.rows[r]);
      lay.row_track[r] = static_cast<int>(lay.tracks.size());
      lay.tracks.push_back(t);
      y += t.h;
      ++lay.rows_shown;
    }
    if (!counters_shown) continue;
    for (int c : counters) {
      GanttTrack t;
      t.kind = GanttTrack::counter;
      t.index = c;
      t.pid = pid;
      t.y = y;
      t.h = g.counter_h;
      lay.tracks.push_back(t);
      y += t.h;
    }
  }
  lay.height = y;
  return lay;
}

int gantt_content_height(const TraceModel& m, const GanttView& v) { return gantt_layout(m, v).height; }

double gantt_time_at(const GanttView& v, int width, double x) { return scale_of(v, width).t(x); }
double gantt_x_of(const GanttView& v, int width, double t_us) { return scale_of(v, width).px(t_us); }

void paint_gantt(QPainter& p, const TraceModel& m, QSize size, const GanttView& v, int max_rows) {
  const GanttGeometry& g = v.geo;
  p.fillRect(QRect(QPoint(0, 0), size), Qt::white);
  const Scale s = scale_of(v, size.width());
  const GanttLayout lay = gantt_layout(m, v, max_rows);
  const int bottom = std::min(size.height(), g.axis_h + lay.height - v.scroll_px);
  paint_axis(p, s, size.width(), g, bottom);

  QFont bold = p.font();
  bold.setBold(true);
  const QFont normal = p.font();
  QFontMetrics fm(normal);
  auto paint_header = [&](const GanttTrack& t, int hy) {
    p.fillRect(0, hy, size.width(), g.header_h, QColor(0xee, 0xf0, 0xf4));
    p.setPen(QColor(0x22, 0x22, 0x22));
    p.setFont(bold);
    const bool folded = v.collapsed.count(t.pid) > 0;
    const std::string& name = t.kind == GanttTrack::header && !m.rows.empty() &&
                                      t.index < static_cast<int>(m.rows.size()) && m.rows[t.index].pid == t.pid
                                  ? m.rows[t.index].process_name
                                  : m.counters[t.index].process_name;
    p.drawText(QRect(6, hy, size.width() - 12, g.header_h), Qt::AlignVCenter | Qt::AlignLeft,
               QString::fromStdString(std::string(folded ? "\u25b8 " : "\u25be ") + name));
    p.setFont(normal);
  };
  int pinned_header = -1;  // the header of the process at the top of the view, once scrolled past
  int row_parity = 0;
  for (size_t k = 0; k < lay.tracks.size(); ++k) {
    const GanttTrack& t = lay.tracks[k];
    const int y = g.axis_h + t.y - v.scroll_px;
    if (y > size.height()) break;
    if (t.kind == GanttTrack::header) {
      if (y < g.axis_h) pinned_header = static_cast<int>(k);
      else paint_header(t, y);
      continue;
    }
    if (y + t.h <= g.axis_h) continue;
    p.save();
    p.setClipRect(QRect(0, std::max(y, g.axis_h), size.width(), t.h));
    if (++row_parity % 2 == 0) p.fillRect(s.x0, y, s.w, t.h, QColor(0xfa, 0xfa, 0xfa));
    p.setClipRect(QRect(s.x0, std::max(y, g.axis_h), s.w, t.h));
    std::string label;
    QColor label_color(0x33, 0x33, 0x33);
    if (t.kind == GanttTrack::row) {
      const TraceRow& row = m.rows[t.index];
      paint_row_events(p, m, row, t.index, y, s, v);
      label = "  " + row.thread_name;
      if (row.exposed_total_us > 0) {
        label += "  (" + format_us(row.exposed_total_us) + " exposed)";
        label_color = kExposed.darker(130);
      }
    } else {
      const CounterTrack& c = m.counters[t.index];
      paint_counter(p, c, y, t.h, s);
      label = "  " + c.name + (c.series.size() == 1 && c.series[0] != "value" ? "." + c.series[0] : std::string());
      label_color = QColor(0x22, 0x55, 0x88);
    }
    p.setClipRect(QRect(0, std::max(y, g.axis_h), g.label_w, t.h));
    p.setPen(label_color);
    p.drawText(QRect(6, y, g.label_w - 10, g.row_h), Qt::AlignVCenter | Qt::AlignLeft,
               fm.elidedText(QString::fromStdString(label), Qt::ElideRight, g.label_w - 10));
    p.restore();
  }
  if (v.show_flows) paint_flows(p, m, lay, s, v);
  // The header of the process whose rows fill the top stays visible.
  if (pinned_header >= 0) {
    int next_header_y = INT32_MAX;
    for (size_t k = pinned_header + 1; k < lay.tracks.size(); ++k) {
      if (lay.tracks[k].kind == GanttTrack::header) {
        next_header_y = g.axis_h + lay.tracks[k].y - v.scroll_px;
        break;
      }
    }
    if (next_header_y > g.axis_h) paint_header(lay.tracks[pinned_header], std::min(g.axis_h, next_header_y - g.header_h));
  }
  paint_axis(p, s, size.width(), g, g.axis_h);  // over rows scrolled under it
  p.setPen(QColor(0xbb, 0xbb, 0xbb));
  p.drawLine(g.label_w - 1, g.axis_h, g.label_w - 1, bottom);
  paint_selection(p, s, v, bottom);
  // Rows left out of a bounded image are counted, not silently dropped.
  if (lay.rows_left_out > 0 && bottom + g.row_h <= size.height()) {
    p.setPen(QColor(0x55, 0x55, 0x55));
    p.drawText(QRect(6, bottom + 2, size.width() - 12, g.row_h), Qt::AlignVCenter | Qt::AlignLeft,
               QString("... %1 more rows not shown (open the trace in rackstep-gui or Perfetto)").arg(lay.rows_left_out));
  }
}

int paint_gantt_legend(QPainter& p, const TraceModel& m, const QRect& r) {
  std::vector<int> order(m.categories.size());
  for (size_t c = 0; c < order.size(); ++c) order[c] = static_cast<int>(c);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return m.category_total_us[a] > m.category_total_us[b]; });
  QFontMetrics fm(p.font());
  const int sw = 14, line_h = 22;
  int x = r.left() + 6, y = r.top() + line_h / 2;
  auto item = [&](const QString& text, auto&& swatch) {
    const int w = sw + 5 + fm.horizontalAdvance(text) + 16;
    if (x + w > r.right() && x > r.left() + 6) {
      x = r.left() + 6;
      y += line_h;
    }
    const QRect box(x, y - sw / 2, sw, sw);
    swatch(box);
    p.setPen(QColor(0x33, 0x33, 0x33));
    p.drawText(QPoint(x + sw + 5, y + fm.ascent() / 2 - 1), text);
    x += w;
  };
  for (int c : order) {
    if (m.category_total_us[c] <= 0 && order.size() > 1) continue;  // only instants or zero-length slices
    const QString name = QString::fromStdString(m.categories[c].empty() ? "(none)" : m.categories[c]);
    item(name, [&](const QRect& b) { p.fillRect(b, category_color(m, c)); });
  }
  item(QString("critical path (%1 slices)").arg(m.n_critical), [&](const QRect& b) {
    p.fillRect(b, QColor(0xdd, 0xdd, 0xdd));
    p.fillRect(b.left(), b.top(), b.width(), 3, kCritical);
    p.setPen(QPen(kCritical, 1.5));
    p.drawRect(b.adjusted(1, 1, -1, -1));
  });
  item("exposed communication", [&](const QRect& b) {
    p.fillRect(b, QBrush(kExposed, Qt::BDiagPattern));
    p.fillRect(b.left(), b.bottom() - 2, b.width(), 3, kExposed);
  });
  return y + line_h / 2 - r.top() + 2;
}

std::optional<GanttHit> gantt_hit(const TraceModel& m, QSize size, const GanttView& v, QPoint at) {
  const GanttGeometry& g = v.geo;
  if (at.x() < g.label_w || at.y() < g.axis_h) return std::nullopt;
  const Scale s = scale_of(v, size.width());
  const GanttLayout lay = gantt_layout(m, v);
  const int cy = at.y() - g.axis_h + v.scroll_px;
  auto it = std::upper_bound(lay.tracks.begin(), lay.tracks.end(), cy,
                             [](int y, const GanttTrack& t) { return y < t.y; });
  if (it == lay.tracks.begin()) return std::nullopt;
  const GanttTrack& t = *(it - 1);
  if (t.kind != GanttTrack::row || cy >= t.y + t.h) return std::nullopt;
  const int row = t.index;
  const int lane = (cy - t.y) / g.row_h;
  const TraceRow& r = m.rows[row];
  // Within 3 pixels; the nearest, and of those the shortest, wins.
  const double tol = 3.0 * (s.t1 - s.t0) / s.w, time = s.t(at.x());
  int best = -1;
  double best_dist = INFINITY, best_dur = INFINITY;
  for (size_t i = m.first_visible(r, time - tol); i < r.events.size(); ++i) {
    const TraceEvent& e = r.events[i];
    if (e.start_us > time + tol) break;
    if (std::min(e.depth, lanes_of(r) - 1) != lane) continue;
    const double end = e.start_us + e.dur_us;
    const double dist = time < e.start_us ? e.start_us - time : (time > end ? time - end : 0);
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

std::optional<int64_t> gantt_header_hit(const TraceModel& m, QSize size, const GanttView& v, QPoint at) {
  (void)size;
  const GanttGeometry& g = v.geo;
  if (at.y() < g.axis_h) return std::nullopt;
  const GanttLayout lay = gantt_layout(m, v);
  const int cy = at.y() - g.axis_h + v.scroll_px;
  for (const GanttTrack& t : lay.tracks) {
    if (t.kind == GanttTrack::header && cy >= t.y && cy < t.y + t.h) return t.pid;
  }
  return std::nullopt;
}

std::string describe_event(const TraceModel& m, int row, int event) {
  const TraceRow& r = m.rows[row];
  const TraceEvent& e = r.events[event];
  std::string s = e.name.empty() ? "(unnamed)" : e.name;
  s += "\ncategory: " + (m.categories[e.category].empty() ? "(none)" : m.categories[e.category]);
  if (e.op_class >= 0) s += "   op class: " + m.op_classes[e.op_class];
  s += "\nrow: " + r.process_name + " / " + r.thread_name;
  if (e.depth > 0) s += "   depth " + std::to_string(e.depth);
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

std::vector<RangeAggregate> aggregate_range(const TraceModel& m, const GanttView& v, double t0_us, double t1_us) {
  if (t1_us < t0_us) std::swap(t0_us, t1_us);
  const GanttLayout lay = gantt_layout(m, v);
  std::map<std::string, RangeAggregate> by_name;
  double all_us = 0;
  for (size_t r = 0; r < m.rows.size(); ++r) {
    if (lay.row_track[r] < 0) continue;  // hidden rows are not in the selection
    const TraceRow& row = m.rows[r];
    for (size_t i = m.first_visible(row, t0_us); i < row.events.size(); ++i) {
      const TraceEvent& e = row.events[i];
      if (e.start_us > t1_us) break;
      const double in_us = std::min(e.start_us + e.dur_us, t1_us) - std::max(e.start_us, t0_us);
      if (in_us < 0 || (in_us == 0 && e.dur_us > 0)) continue;
      RangeAggregate& a = by_name[e.name];
      a.name = e.name;
      ++a.count;
      a.total_us += in_us;
      all_us += in_us;
    }
  }
  std::vector<RangeAggregate> out;
  for (auto& [name, a] : by_name) {
    a.mean_us = a.total_us / static_cast<double>(a.count);
    a.share = all_us > 0 ? a.total_us / all_us : 0;
    out.push_back(a);
  }
  std::sort(out.begin(), out.end(), [](const RangeAggregate& a, const RangeAggregate& b) { return a.total_us > b.total_us; });
  return out;
}

}  // namespace rackstep::gui
