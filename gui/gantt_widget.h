// The viewer's interactive timeline: the Gantt of gui/gantt_paint.h with
// zoom, pan, vertical scrolling and hover details.
//
//   auto* g = new GanttWidget(std::make_shared<const TraceModel>(load_trace(path)));
//   g->on_details = [&](const std::string& text) { details->setPlainText(QString::fromStdString(text)); };
//
// Mouse: wheel zooms around the pointer, shift+wheel scrolls rows, drag pans,
// double-click zooms to the slice under the pointer. Keys: W/S zoom, A/D pan,
// F or Home fits the whole trace.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <QScrollBar>
#include <QWidget>

#include "gui/gantt_paint.h"
#include "gui/trace_model.h"

namespace rackstep::gui {

class GanttWidget : public QWidget {
 public:
  explicit GanttWidget(std::shared_ptr<const TraceModel> model, QWidget* parent = nullptr);

  void fit();
  void set_dim_noncritical(bool dim);
  const GanttView& view() const { return v_; }
  // Called with a slice's description when the pointer rests on it or it is clicked.
  std::function<void(const std::string&)> on_details;

 protected:
  void paintEvent(QPaintEvent*) override;
  void resizeEvent(QResizeEvent*) override;
  void wheelEvent(QWheelEvent* e) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  void mouseDoubleClickEvent(QMouseEvent* e) override;
  void keyPressEvent(QKeyEvent* e) override;
  void leaveEvent(QEvent*) override;

 private:
  QSize plot_size() const;  // the painted area, left of the scroll bar
  void zoom(double factor, double at_px);
  void pan_px(double dx);
  void update_scroll_range();
  void hover(QPoint at, bool clicked);

  std::shared_ptr<const TraceModel> m_;
  GanttView v_;
  QScrollBar* vbar_;
  bool dragging_ = false;
  QPoint drag_from_;
  GanttView drag_view_;
};

}  // namespace rackstep::gui
