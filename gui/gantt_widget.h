// The viewer's interactive timeline: the Gantt of gui/gantt_paint.h with
// zoom, pan, vertical scrolling and hover details.
//
//   auto* g = new GanttWidget(std::make_shared<const TraceModel>(load_trace(path)));
//   g->on_details = [&](const std::string& text) { details->setPlainText(QString::fromStdString(text)); };
//
// Mouse: wheel zooms around the pointer, shift+wheel scrolls rows, drag pans,
// shift+drag selects a time range (its duration is drawn on the axis and
// on_range reports it), a click pins the slice under the pointer (a click on
// empty space unpins), a click on a process header folds or unfolds it,
// double-click zooms to the slice under the pointer. Keys: W/S zoom, A/D pan,
// F or Home fits the whole trace, Escape clears the range selection.
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
  void set_show_flows(bool on);
  void set_search(const std::string& text);      // slices whose name/category/op class contain it stand out
  void set_row_filter(const std::string& text);  // only rows whose process/thread name contain it
  void set_op_class(int op_class);               // -1: all
  void set_collapsed(int64_t pid, bool collapsed);
  void set_window(double t0_us, double t1_us);
  void set_selection(double t0_us, double t1_us);  // NAN, NAN clears it
  // Zooms to a slice, scrolls its row into view and pins it.
  void show_slice(int row, int event);
  const GanttView& view() const { return v_; }
  const TraceModel& model() const { return *m_; }
  // Called with a slice's description when the pointer rests on it or it is clicked.
  std::function<void(const std::string&)> on_details;
  // Called when a range selection ends (t0 < t1) or is cleared (NAN, NAN).
  std::function<void(double, double)> on_range;

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
  bool selecting_ = false;
  bool moved_ = false;
  QPoint drag_from_;
  GanttView drag_view_;
};

}  // namespace rackstep::gui
