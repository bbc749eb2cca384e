// Interactive Gantt timeline; see gui/gantt_widget.h.
#include "gui/gantt_widget.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>

namespace rackstep::gui {

namespace {
constexpr int kBarW = 14;
}

GanttWidget::GanttWidget(std::shared_ptr<const TraceModel> model, QWidget* parent)
    : QWidget(parent), m_(std::move(model)), v_(fit_view(*m_)), vbar_(new QScrollBar(Qt::Vertical, this)) {
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  setMinimumSize(400, 160);
  QObject::connect(vbar_, &QScrollBar::valueChanged, this, [this](int y) {
    v_.scroll_px = y;
    update();
  });
}

QSize GanttWidget::plot_size() const { return QSize(std::max(1, width() - kBarW), height()); }

void GanttWidget::fit() {
  const GanttView f = fit_view(*m_);
  v_.t0_us = f.t0_us;
  v_.t1_us = f.t1_us;
  update();
}

void GanttWidget::set_dim_noncritical(bool dim) {
  v_.dim_noncritical = dim;
  update();
}

void GanttWidget::set_show_flows(bool on) {
  v_.show_flows = on;
  update();
}

void GanttWidget::set_search(const std::string& text) {
  std::string l = text;
  for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  v_.search = l;
  update();
}

void GanttWidget::set_row_filter(const std::string& text) {
  std::string l = text;
  for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  v_.row_filter = l;
  v_.hover_row = v_.hover_event = -1;
  update_scroll_range();
  update();
}

void GanttWidget::set_op_class(int op_class) {
  v_.op_class = op_class;
  update();
}

void GanttWidget::set_collapsed(int64_t pid, bool collapsed) {
  if (collapsed) v_.collapsed.insert(pid);
  else v_.collapsed.erase(pid);
  update_scroll_range();
  update();
}

void GanttWidget::set_window(double t0_us, double t1_us) {
  if (!(t1_us > t0_us)) return;
  v_.t0_us = t0_us;
  v_.t1_us = t1_us;
  update();
}

void GanttWidget::set_selection(double t0_us, double t1_us) {
  v_.sel_t0_us = std::min(t0_us, t1_us);
  v_.sel_t1_us = std::max(t0_us, t1_us);
  update();
  if (on_range) on_range(v_.sel_t0_us, v_.sel_t1_us);
}

void GanttWidget::show_slice(int row, int event) {
  if (row < 0 || row >= static_cast<int>(m_->rows.size())) return;
  const TraceRow& r = m_->rows[row];
  if (event < 0 || event >= static_cast<int>(r.events.size())) return;
  set_collapsed(r.pid, false);
  const GanttLayout lay = gantt_layout(*m_, v_);
  if (lay.row_track[row] < 0) {  // filtered out: show every row again
    v_.row_filter.clear();
    update_scroll_range();
  }
  const GanttLayout shown = gantt_layout(*m_, v_);
  const TraceEvent& ev = r.events[event];
  const double margin = std::max(ev.dur_us * 0.5, 1e-3);
  v_.t0_us = ev.start_us - margin;
  v_.t1_us = ev.start_us + ev.dur_us + margin;
  v_.pinned_row = row;
  v_.pinned_event = event;
  if (shown.row_track[row] >= 0) vbar_->setValue(std::max(0, shown.tracks[shown.row_track[row]].y - v_.geo.row_h * 2));
  update();
  if (on_details) on_details(describe_event(*m_, row, event));
}

void GanttWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.setRenderHint(QPainter::TextAntialiasing);
  paint_gantt(p, *m_, plot_size(), v_);
}

void GanttWidget::resizeEvent(QResizeEvent*) {
  vbar_->setGeometry(width() - kBarW, v_.geo.axis_h, kBarW, std::max(0, height() - v_.geo.axis_h));
  update_scroll_range();
}

void GanttWidget::update_scroll_range() {
  const int visible = std::max(0, height() - v_.geo.axis_h);
  const int content = gantt_content_height(*m_, v_);
  vbar_->setRange(0, std::max(0, content - visible));
  vbar_->setPageStep(std::max(1, visible));
  vbar_->setSingleStep(v_.geo.row_h);
  vbar_->setVisible(content > visible);
}

void GanttWidget::zoom(double factor, double at_px) {
  const double w = std::max(1, plot_size().width() - v_.geo.label_w - 8);
  const double frac = std::clamp((at_px - v_.geo.label_w) / w, 0.0, 1.0);
  const double span = v_.t1_us - v_.t0_us;
  const double full = std::max(m_->t1_us - m_->t0_us, 1e-3);
  // From a nanosecond to twice the whole trace.
  const double next = std::clamp(span / factor, 1e-3, 2 * full);
  const double at = v_.t0_us + frac * span;
  v_.t0_us = at - frac * next;
  v_.t1_us = v_.t0_us + next;
  update();
}

void GanttWidget::pan_px(double dx) {
  const double w = std::max(1, plot_size().width() - v_.geo.label_w - 8);
  const double dt = -dx / w * (v_.t1_us - v_.t0_us);
  v_.t0_us += dt;
  v_.t1_us += dt;
  update();
}

void GanttWidget::wheelEvent(QWheelEvent* e) {
  const QPoint d = e->angleDelta();
  if (e->modifiers() & Qt::ShiftModifier) {
    vbar_->setValue(vbar_->value() - (d.y() != 0 ? d.y() : d.x()));
  } else if (d.y() != 0) {
    zoom(std::pow(1.0015, d.y()), e->position().x());
  } else if (d.x() != 0) {
    pan_px(d.x());
  }
  e->accept();
}

void GanttWidget::mousePressEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton) return;
  if (auto pid = gantt_header_hit(*m_, plot_size(), v_, e->pos())) {
    set_collapsed(*pid, !v_.collapsed.count(*pid));
    return;
  }
  drag_from_ = e->pos();
  drag_view_ = v_;
  moved_ = false;
  if (e->modifiers() & Qt::ShiftModifier) {
    selecting_ = true;
    const double t = gantt_time_at(v_, plot_size().width(), e->pos().x());
    v_.sel_t0_us = v_.sel_t1_us = t;
    update();
    return;
  }
  dragging_ = true;
  hover(e->pos(), true);
}

void GanttWidget::mouseMoveEvent(QMouseEvent* e) {
  if (selecting_) {
    v_.sel_t1_us = gantt_time_at(v_, plot_size().width(), e->pos().x());
    update();
    return;
  }
  if (!dragging_) {
    hover(e->pos(), false);
    return;
  }
  moved_ = moved_ || (e->pos() - drag_from_).manhattanLength() > 3;
  // Pan from where the drag started, so the slice under the pointer stays under it.
  const double w = std::max(1, plot_size().width() - v_.geo.label_w - 8);
  const double dt = -(e->pos().x() - drag_from_.x()) / w * (drag_view_.t1_us - drag_view_.t0_us);
  v_.t0_us = drag_view_.t0_us + dt;
  v_.t1_us = drag_view_.t1_us + dt;
  vbar_->setValue(drag_view_.scroll_px - (e->pos().y() - drag_from_.y()));
  update();
}

void GanttWidget::mouseReleaseEvent(QMouseEvent* e) {
  if (selecting_) {
    selecting_ = false;
    v_.sel_t1_us = gantt_time_at(v_, plot_size().width(), e->pos().x());
    if (v_.sel_t1_us == v_.sel_t0_us) {
      set_selection(NAN, NAN);
      return;
    }
    set_selection(v_.sel_t0_us, v_.sel_t1_us);
    return;
  }
  if (dragging_ && !moved_) {
    // A click: pin the slice under the pointer, or unpin.
    auto hit = gantt_hit(*m_, plot_size(), v_, e->pos());
    v_.pinned_row = hit ? hit->row : -1;
    v_.pinned_event = hit ? hit->event : -1;
    update();
  }
  dragging_ = false;
}

void GanttWidget::mouseDoubleClickEvent(QMouseEvent* e) {
  auto hit = gantt_hit(*m_, plot_size(), v_, e->pos());
  if (!hit) return;
  const TraceEvent& ev = m_->rows[hit->row].events[hit->event];
  const double margin = std::max(ev.dur_us * 0.1, 1e-3);
  v_.t0_us = ev.start_us - margin;
  v_.t1_us = ev.start_us + ev.dur_us + margin;
  update();
}

void GanttWidget::keyPressEvent(QKeyEvent* e) {
  const double mid = v_.geo.label_w + (plot_size().width() - v_.geo.label_w) / 2.0;
  const double step = (plot_size().width() - v_.geo.label_w) * 0.1;
  switch (e->key()) {
    case Qt::Key_W: zoom(1.25, mid); break;
    case Qt::Key_S: zoom(0.8, mid); break;
    case Qt::Key_A: pan_px(step); break;
    case Qt::Key_D: pan_px(-step); break;
    case Qt::Key_F:
    case Qt::Key_Home: fit(); break;
    case Qt::Key_Up: vbar_->setValue(vbar_->value() - v_.geo.row_h); break;
    case Qt::Key_Down: vbar_->setValue(vbar_->value() + v_.geo.row_h); break;
    case Qt::Key_Escape: set_selection(NAN, NAN); break;
    default: QWidget::keyPressEvent(e);
  }
}

void GanttWidget::leaveEvent(QEvent*) {
  v_.hover_row = v_.hover_event = -1;
  update();
}

void GanttWidget::hover(QPoint at, bool clicked) {
  auto hit = gantt_hit(*m_, plot_size(), v_, at);
  const int row = hit ? hit->row : -1, event = hit ? hit->event : -1;
  if (row == v_.hover_row && event == v_.hover_event && !clicked) return;
  v_.hover_row = row;
  v_.hover_event = event;
  update();
  if (!hit) {
    QToolTip::hideText();
    return;
  }
  const std::string text = describe_event(*m_, row, event);
  QToolTip::showText(mapToGlobal(at), QString::fromStdString(text), this);
  if (on_details) on_details(text);
}

}  // namespace rackstep::gui
