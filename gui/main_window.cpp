// The viewer's window and its three kinds of tab; see gui/main_window.h.
#include "gui/main_window.h"

#include <cmath>
#include <functional>
#include <tuple>
#include <memory>

#include <QAction>
#include <QApplication>
#include <QCheckBox>
#include <QChartView>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMenuBar>
#include <QMessageBox>
#include <QPainter>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSplitter>
#include <QStatusBar>
#include <QTableWidget>
#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QHorizontalBarSeries>
#include <QBarSet>
#include <QLineEdit>
#include <QValueAxis>
#include <QVBoxLayout>

#include "gui/chart_build.h"
#include "gui/compare.h"
#include "gui/gantt_paint.h"
#include "gui/gantt_widget.h"
#include "gui/result_files.h"
#include "gui/trace_model.h"
#include "sim/base/check.h"

namespace rackstep::gui {
namespace {

QString qs(const std::string& s) { return QString::fromStdString(s); }

// The legend under a timeline: every category, wrapped onto as many lines as it needs.
class LegendWidget : public QWidget {
 public:
  explicit LegendWidget(std::shared_ptr<const TraceModel> m) : m_(std::move(m)) {
    setObjectName("legend");
    setFixedHeight(26);
  }

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.setRenderHint(QPainter::TextAntialiasing);
    paint_gantt_legend(p, *m_, rect());
  }
  void resizeEvent(QResizeEvent*) override {
    QImage probe(8, 8, QImage::Format_RGB32);
    QPainter p(&probe);
    p.setFont(font());
    const int h = paint_gantt_legend(p, *m_, QRect(0, 0, width(), 0));
    if (h != height()) setFixedHeight(std::max(26, h));
  }

 private:
  std::shared_ptr<const TraceModel> m_;
};

// Where a GPU's step goes, as one bar: compute, exposed communication, host
// work, idle (bubble) — the per-GPU figures `rackstep timeline` prints.
class BreakdownBar : public QWidget {
 public:
  using Parts = std::vector<std::pair<std::string, double>>;
  explicit BreakdownBar(Parts parts, std::string title = "per GPU") : parts_(std::move(parts)), title_(std::move(title)) {
    setObjectName("breakdown");
    setFixedHeight(24);
    setToolTip("Where each GPU's time goes over the trace, averaged over GPUs (as rackstep timeline prints it)");
  }
  // The average over `gpus` weighted by copies, split as rackstep timeline splits it.
  static Parts parts(const TraceModel& m, const std::vector<const GpuBreakdown*>& gpus) {
    double w = 0, compute = 0, comm = 0, host = 0, idle = 0;
    for (const GpuBreakdown* g : gpus) {
      const double c = static_cast<double>(g->copies);
      w += c;
      compute += c * g->compute_us;
      idle += c * g->idle_us;
      for (size_t k = 0; k < g->exposed_us_by_category.size(); ++k)
        (m.category_is_host[k] ? host : comm) += c * g->exposed_us_by_category[k];
    }
    if (w > 0) compute /= w, comm /= w, host /= w, idle /= w;
    return {{"compute", compute}, {"exposed communication", comm}, {"host", host}, {"idle (bubble)", idle}};
  }
  static Parts parts(const TraceModel& m) {
    std::vector<const GpuBreakdown*> all;
    for (const GpuBreakdown& g : m.gpus) all.push_back(&g);
    return parts(m, all);
  }

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.setRenderHint(QPainter::TextAntialiasing);
    const Parts& ps = parts_;
    double total = 0;
    for (const auto& [n, v] : ps) total += v;
    const QColor colors[] = {QColor(0x4e, 0x79, 0xa7), QColor(0xd6, 0x27, 0x28), QColor(0xba, 0xb0, 0xac),
                             QColor(0xe8, 0xe8, 0xe8)};
    QFontMetrics fm(font());
    const int label_w = fm.horizontalAdvance(QString::fromStdString(title_)) + 12;
    p.setPen(QColor(0x33, 0x33, 0x33));
    p.drawText(QRect(4, 0, label_w, height()), Qt::AlignVCenter | Qt::AlignLeft, QString::fromStdString(title_));
    if (total <= 0) return;
    double x = label_w;
    const double w = width() - label_w - 6;
    for (size_t i = 0; i < ps.size(); ++i) {
      const double pw = w * ps[i].second / total;
      const QRectF box(x, 3, pw, height() - 6);
      p.fillRect(box, colors[i]);
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s %s (%.1f%%)", ps[i].first.c_str(), format_us(ps[i].second).c_str(),
                    100.0 * ps[i].second / total);
      const QString text = fm.elidedText(buf, Qt::ElideRight, static_cast<int>(pw) - 6);
      p.setPen(i == 0 || i == 1 ? Qt::white : Qt::black);
      p.drawText(box.adjusted(3, 0, -3, 0), Qt::AlignVCenter | Qt::AlignLeft, text);
      x += pw;
    }
  }

 private:
  Parts parts_;
  std::string title_;
};

// What the trace adds up to: span, critical path, exposed communication per row.
std::string trace_summary(const TraceModel& m) {
  std::string s = m.path + "\n" + std::to_string(m.n_events) + " slices on " + std::to_string(m.rows.size()) +
                  " rows, span " + format_us(m.t1_us - m.t0_us) + ", " + std::to_string(m.n_critical) +
                  " slices on the critical path\n";
  for (const auto& [k, v] : m.metadata) s += k + ": " + v + "\n";
  if (m.n_critical > 0) {
    s += "\ncritical path, time by category (as `rackstep timeline` prints it):\n";
    for (size_t c = 0; c < m.categories.size(); ++c) {
      if (m.critical_us_by_category[c] > 0) s += "  " + m.categories[c] + ": " + format_us(m.critical_us_by_category[c]) + "\n";
    }
  }
  if (!m.gpus.empty()) {
    s += "\nper GPU (" + std::to_string(m.per_gpu.copies) + " GPUs in " + std::to_string(m.gpus.size()) +
         " processes), as `rackstep timeline` prints it:\n";
    s += "  compute busy " + format_us(m.per_gpu.compute_us) + ", idle (bubble) " + format_us(m.per_gpu.idle_us) +
         ", exposed communication " + format_us(m.per_gpu_exposed_comm_us()) + ", exposed host work " +
         format_us(m.per_gpu_exposed_host_us()) + "\n";
    s += "exposed per GPU, by kind (runs while the GPU's compute streams are idle):\n";
    for (size_t c = 0; c < m.categories.size(); ++c) {
      if (m.per_gpu.exposed_us_by_category[c] > 0)
        s += "  " + m.categories[c] + ": " + format_us(m.per_gpu.exposed_us_by_category[c]) + "\n";
    }
  }
  s += "\nexposed time per row (a NIC row overlaps the collective it carries: rows do not add up):\n";
  bool any = false;
  for (const TraceRow& r : m.rows) {
    if (!r.comm) continue;
    any = true;
    s += "  " + r.process_name + " / " + r.thread_name + ": " + format_us(r.exposed_total_us) + " of " +
         format_us(r.busy_us) + " busy\n";
  }
  if (!any) s += "  (no GPU communication rows: a GPU is a process with a thread named \"compute\")\n";
  s += "\nHover a slice for its details; click pins it; wheel zooms, drag pans, shift+wheel scrolls, shift+drag "
       "measures a range, double-click zooms to a slice, a click on a process header folds it, F fits.";
  return s;
}

std::string trace_headline(const TraceModel& m) {
  std::string s = std::to_string(m.n_events) + " slices, span " + format_us(m.t1_us - m.t0_us);
  if (!m.gpus.empty()) s += ", exposed communication " + format_us(m.per_gpu_exposed_comm_us()) + " per GPU";
  return s;
}

// Sorts by the number in Qt::UserRole when there is one.
class NumberItem : public QTableWidgetItem {
 public:
  using QTableWidgetItem::QTableWidgetItem;
  bool operator<(const QTableWidgetItem& o) const override {
    const QVariant a = data(Qt::UserRole), b = o.data(Qt::UserRole);
    if (a.isValid() && b.isValid()) return a.toDouble() < b.toDouble();
    return QTableWidgetItem::operator<(o);
  }
};

QTableWidgetItem* sortable(double v, const std::string& text) {
  auto* item = new NumberItem(qs(text));
  item->setData(Qt::UserRole, v);
  item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
  return item;
}

void fill_range_table(QTableWidget* t, const std::vector<RangeAggregate>& rows) {
  t->setSortingEnabled(false);
  t->setRowCount(static_cast<int>(rows.size()));
  for (size_t i = 0; i < rows.size(); ++i) {
    const RangeAggregate& a = rows[i];
    const int r = static_cast<int>(i);
    t->setItem(r, 0, new QTableWidgetItem(qs(a.name)));
    t->setItem(r, 1, sortable(static_cast<double>(a.count), std::to_string(a.count)));
    t->setItem(r, 2, sortable(a.total_us, format_us(a.total_us)));
    t->setItem(r, 3, sortable(a.mean_us, format_us(a.mean_us)));
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f%%", 100 * a.share);
    t->setItem(r, 4, sortable(a.share, buf));
  }
  t->setSortingEnabled(true);
  t->sortByColumn(2, Qt::DescendingOrder);  // the most time in the range first
  t->resizeColumnsToContents();
}

// A timeline with its toolbar (fit, critical path, flows, search, row filter),
// per-GPU breakdown bar, legend, and a bottom pane of details and the range table.
struct TracePage {
  QWidget* page = nullptr;
  GanttWidget* gantt = nullptr;
  QTabWidget* bottom = nullptr;
  QPlainTextEdit* details = nullptr;
};

TracePage trace_page(std::shared_ptr<const TraceModel> m) {
  TracePage tp;
  tp.page = new QWidget;
  auto* layout = new QVBoxLayout(tp.page);
  auto* bar = new QHBoxLayout;
  auto* gantt = new GanttWidget(m);
  gantt->setObjectName("gantt");
  tp.gantt = gantt;
  auto* fit = new QPushButton("Fit (F)");
  auto* dim = new QCheckBox("Dim off the critical path");
  dim->setObjectName("dim");
  dim->setEnabled(m->n_critical > 0);
  auto* flows = new QCheckBox("Flow arrows");
  flows->setToolTip(QString("%1 dependency arrows in this trace").arg(m->flows.size()));
  flows->setObjectName("flows");
  flows->setEnabled(!m->flows.empty());
  auto* search = new QLineEdit;
  search->setObjectName("search");
  search->setPlaceholderText("Search slices: name, category, op class");
  search->setClearButtonEnabled(true);
  auto* rows = new QLineEdit;
  rows->setObjectName("row_filter");
  rows->setPlaceholderText("Rows: process / rank / stream");
  rows->setClearButtonEnabled(true);
  bar->addWidget(fit);
  bar->addWidget(dim);
  bar->addWidget(flows);
  search->setMinimumWidth(90);
  rows->setMinimumWidth(70);
  bar->addWidget(search, 2);
  bar->addWidget(rows, 1);
  // Every GPU's compute stream on one screen (a pipeline's stages one under another).
  auto* compute_only = new QPushButton("Compute rows");
  compute_only->setObjectName("compute_only");
  compute_only->setCheckable(true);
  compute_only->setToolTip("Show only the rows named \"compute\" (sets the row filter)");
  bar->addWidget(compute_only);
  QObject::connect(compute_only, &QPushButton::toggled, rows, [rows](bool on) { rows->setText(on ? "compute" : ""); });
  layout->addLayout(bar);
  auto* line2 = new QHBoxLayout;
  auto* headline = new QLabel(qs(trace_headline(*m)));
  headline->setObjectName("headline");
  headline->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
  line2->addWidget(headline, 1);
  if (!m->gpus.empty() && !is_compare_trace(*m)) line2->addWidget(new BreakdownBar(BreakdownBar::parts(*m)), 2);
  layout->addLayout(line2);
  if (is_compare_trace(*m)) {
    // One bar per side: where a predicted GPU's step goes beside a measured one's.
    for (bool measured : {false, true}) {
      std::vector<const GpuBreakdown*> side;
      for (const GpuBreakdown& g : m->gpus) {
        if ((g.pid >= kMeasuredPidOffset || g.process_name.rfind("measured: ", 0) == 0) == measured) side.push_back(&g);
      }
      if (side.empty()) continue;
      auto* b = new BreakdownBar(BreakdownBar::parts(*m, side), measured ? "measured per GPU " : "predicted per GPU");
      b->setObjectName(measured ? "breakdown_measured" : "breakdown_predicted");
      layout->addWidget(b);
    }
  }

  auto* split = new QSplitter(Qt::Vertical);
  auto* timeline = new QWidget;
  auto* tl = new QVBoxLayout(timeline);
  tl->setContentsMargins(0, 0, 0, 0);
  tl->addWidget(gantt, 1);
  tl->addWidget(new LegendWidget(m));
  split->addWidget(timeline);
  tp.bottom = new QTabWidget;
  tp.bottom->setObjectName("bottom");
  tp.details = new QPlainTextEdit(qs(trace_summary(*m)));
  tp.details->setObjectName("details");
  tp.details->setReadOnly(true);
  tp.bottom->addTab(tp.details, "Details");
  auto* range = new QTableWidget(0, 5);
  range->setObjectName("range_table");
  range->setHorizontalHeaderLabels({"slice name", "count", "time in range", "mean", "share"});
  range->setEditTriggers(QAbstractItemView::NoEditTriggers);
  tp.bottom->addTab(range, "Range (shift+drag)");
  // The critical path in time order; double-click a slice to go to it.
  auto* crit = new QTableWidget(0, 4);
  crit->setObjectName("critical_table");
  crit->setHorizontalHeaderLabels({"slice on the critical path", "category", "start", "duration"});
  crit->setEditTriggers(QAbstractItemView::NoEditTriggers);
  crit->setSelectionBehavior(QAbstractItemView::SelectRows);
  {
    std::vector<std::tuple<double, int, int>> path;  // (start, row, event)
    for (size_t r = 0; r < m->rows.size(); ++r) {
      const auto& events = m->rows[r].events;
      for (size_t i = 0; i < events.size(); ++i) {
        if (events[i].critical) path.emplace_back(events[i].start_us, static_cast<int>(r), static_cast<int>(i));
      }
    }
    std::sort(path.begin(), path.end());
    constexpr size_t kMaxListed = 5000;
    crit->setRowCount(static_cast<int>(std::min(path.size(), kMaxListed)));
    for (size_t k = 0; k < path.size() && k < kMaxListed; ++k) {
      const auto [start, r, i] = path[k];
      const TraceEvent& e = m->rows[r].events[i];
      auto* name = new QTableWidgetItem(qs(e.name));
      name->setData(Qt::UserRole, r);
      name->setData(Qt::UserRole + 1, i);
      name->setToolTip(qs(m->rows[r].process_name + " / " + m->rows[r].thread_name));
      const int row = static_cast<int>(k);
      crit->setItem(row, 0, name);
      crit->setItem(row, 1, new QTableWidgetItem(qs(m->categories[e.category])));
      crit->setItem(row, 2, sortable(start, format_us(start)));
      crit->setItem(row, 3, sortable(e.dur_us, format_us(e.dur_us)));
    }
    crit->resizeColumnsToContents();
  }
  tp.bottom->addTab(crit, qs("Critical path (" + std::to_string(m->n_critical) + ")"));
  QObject::connect(crit, &QTableWidget::cellDoubleClicked, gantt, [crit, gantt](int row, int) {
    const QTableWidgetItem* it = crit->item(row, 0);
    gantt->show_slice(it->data(Qt::UserRole).toInt(), it->data(Qt::UserRole + 1).toInt());
  });
  split->addWidget(tp.bottom);
  split->setStretchFactor(0, 4);
  split->setStretchFactor(1, 1);
  layout->addWidget(split, 1);

  QTabWidget* bottom = tp.bottom;
  QObject::connect(fit, &QPushButton::clicked, gantt, [gantt] { gantt->fit(); });
  QObject::connect(dim, &QCheckBox::toggled, gantt, [gantt](bool on) { gantt->set_dim_noncritical(on); });
  QObject::connect(flows, &QCheckBox::toggled, gantt, [gantt](bool on) { gantt->set_show_flows(on); });
  QObject::connect(search, &QLineEdit::textChanged, gantt, [gantt](const QString& t) { gantt->set_search(t.toStdString()); });
  QObject::connect(rows, &QLineEdit::textChanged, gantt, [gantt](const QString& t) { gantt->set_row_filter(t.toStdString()); });
  QPlainTextEdit* details = tp.details;
  gantt->on_details = [details](const std::string& text) { details->setPlainText(qs(text)); };
  gantt->on_range = [gantt, range, bottom](double t0, double t1) {
    if (!std::isfinite(t0) || !std::isfinite(t1)) {
      range->setRowCount(0);
      bottom->setTabText(1, "Range (shift+drag)");
      return;
    }
    fill_range_table(range, aggregate_range(gantt->model(), gantt->view(), t0, t1));
    bottom->setTabText(1, qs("Range " + format_us(t1 - t0)));
    bottom->setCurrentIndex(1);
  };
  return tp;
}

QWidget* trace_tab(std::shared_ptr<const TraceModel> m) { return trace_page(std::move(m)).page; }

// The compare view: both timelines on one axis (predicted processes first),
// bars of time per op class predicted vs measured with the error, a table per
// op; clicking a bar or a row lists that class's slices, and double-clicking a
// slice zooms to it.
QWidget* compare_tab(std::shared_ptr<const TraceModel> m) {
  const CompareSummary c = compare_summary(*m);
  TracePage tp = trace_page(m);
  GanttWidget* gantt = tp.gantt;
  auto* outer = new QSplitter(Qt::Horizontal);
  outer->setObjectName("compare");
  outer->addWidget(tp.page);
  auto* side = new QSplitter(Qt::Vertical);

  // Bars: one pair per class, the error in the label.
  auto* chart = new QChart;
  chart->setTitle(qs("Time per GPU per step by op class: predicted vs measured"));
  auto* series = new QHorizontalBarSeries;
  auto* pred = new QBarSet("predicted");
  auto* meas = new QBarSet("measured");
  QStringList labels;
  const size_t n_bars = std::min<size_t>(c.classes.size(), 12);
  double top = 0;
  // Largest at the top: a horizontal bar chart counts its categories from the bottom.
  for (size_t j = n_bars; j-- > 0;) {
    const CompareLine& k = c.classes[j];
    *pred << k.predicted_us * 1e-3;
    *meas << k.measured_us * 1e-3;
    top = std::max({top, k.predicted_us * 1e-3, k.measured_us * 1e-3});
    char buf[32];
    if (std::isfinite(k.error())) std::snprintf(buf, sizeof buf, " %+.0f%%", 100 * k.error());
    else std::snprintf(buf, sizeof buf, " (not measured)");
    labels << qs(k.name + buf);
  }
  series->append(pred);
  series->append(meas);
  chart->addSeries(series);
  auto* ax = new QBarCategoryAxis;
  ax->append(labels);
  chart->addAxis(ax, Qt::AlignLeft);
  series->attachAxis(ax);
  auto* ay = new QValueAxis;
  ay->setTitleText("ms per GPU");
  ay->setLabelFormat("%.3g");
  ay->setTickCount(5);
  ay->setRange(0, top > 0 ? top * 1.1 : 1);
  chart->addAxis(ay, Qt::AlignBottom);
  series->attachAxis(ay);
  chart->legend()->setAlignment(Qt::AlignBottom);
  auto* view = new QChartView(chart);
  view->setObjectName("compare_bars");
  view->setRenderHint(QPainter::Antialiasing);
  view->setMinimumSize(360, 260);
  side->addWidget(view);

  // Per op: predicted, measured, error.
  auto* ops = new QTableWidget(0, 5);
  ops->setObjectName("compare_ops");
  ops->setHorizontalHeaderLabels({"op", "class", "predicted per GPU-step", "measured per GPU-step", "error"});
  ops->setEditTriggers(QAbstractItemView::NoEditTriggers);
  ops->setSelectionBehavior(QAbstractItemView::SelectRows);
  const size_t n_ops = std::min<size_t>(c.ops.size(), 500);
  ops->setRowCount(static_cast<int>(n_ops));
  for (size_t i = 0; i < n_ops; ++i) {
    const CompareLine& o = c.ops[i];
    const int r = static_cast<int>(i);
    ops->setItem(r, 0, new QTableWidgetItem(qs(o.name)));
    ops->setItem(r, 1, new QTableWidgetItem(qs(o.op_class)));
    ops->setItem(r, 2, sortable(o.predicted_us, format_us(o.predicted_us)));
    ops->setItem(r, 3, sortable(o.measured_us, format_us(o.measured_us)));
    char buf[32];
    if (std::isfinite(o.error())) std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * o.error());
    else std::snprintf(buf, sizeof buf, "-");
    ops->setItem(r, 4, sortable(std::isfinite(o.error()) ? o.error() : 0, buf));
  }
  // Largest difference first until a header is clicked.
  ops->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);
  ops->setSortingEnabled(true);
  ops->resizeColumnsToContents();
  side->addWidget(ops);

  // The slices of the class clicked; double-click zooms to one.
  auto* slices = new QTableWidget(0, 4);
  slices->setObjectName("compare_slices");
  slices->setHorizontalHeaderLabels({"slice", "row", "start", "duration"});
  slices->setEditTriggers(QAbstractItemView::NoEditTriggers);
  slices->setSelectionBehavior(QAbstractItemView::SelectRows);
  side->addWidget(slices);
  outer->addWidget(side);
  outer->setStretchFactor(0, 3);
  outer->setStretchFactor(1, 2);
  outer->setSizes({900, 700});
  side->setSizes({460, 260, 200});
  // The headline says how long each side's step is.
  if (auto* headline = tp.page->findChild<QLabel*>("headline")) {
    auto describe_side = [](const char* what, double span_us, double gpus, int steps) {
      return std::string(what) + " " + format_us(span_us) + " on " + std::to_string(static_cast<int64_t>(gpus)) +
             " GPUs" + (steps > 1 ? " (" + std::to_string(steps) + " steps; bars per step)" : std::string());
    };
    headline->setText(qs(describe_side("predicted", c.predicted_span_us, c.predicted_gpus, c.predicted_steps) + ", " +
                         describe_side("measured", c.measured_span_us, c.measured_gpus, c.measured_steps)));
  }

  auto show_class = [m, gantt, slices](const std::string& cls, int op_class_index) {
    if (op_class_index >= 0) {
      gantt->set_op_class(op_class_index);
      gantt->set_search("");
    } else {
      gantt->set_op_class(-1);
      gantt->set_search(cls);
    }
    const auto refs = slices_of_class(*m, cls, 500);
    slices->setSortingEnabled(false);
    slices->setRowCount(static_cast<int>(refs.size()));
    for (size_t i = 0; i < refs.size(); ++i) {
      const TraceRow& row = m->rows[refs[i].row];
      const TraceEvent& e = row.events[refs[i].event];
      const int r = static_cast<int>(i);
      auto* name = new QTableWidgetItem(qs(e.name));
      name->setData(Qt::UserRole, refs[i].row);
      name->setData(Qt::UserRole + 1, refs[i].event);
      slices->setItem(r, 0, name);
      slices->setItem(r, 1, new QTableWidgetItem(qs(row.process_name + " / " + row.thread_name)));
      slices->setItem(r, 2, sortable(e.start_us, format_us(e.start_us)));
      slices->setItem(r, 3, sortable(e.dur_us, format_us(e.dur_us)));
    }
    slices->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);
    slices->setSortingEnabled(true);
    slices->resizeColumnsToContents();
  };
  std::vector<CompareLine> bar_classes(c.classes.begin(), c.classes.begin() + static_cast<long>(n_bars));
  QObject::connect(series, &QHorizontalBarSeries::clicked, outer, [show_class, bar_classes](int index, QBarSet*) {
    // Bar `index` counts from the bottom: the classes were appended smallest first.
    const int k = static_cast<int>(bar_classes.size()) - 1 - index;
    if (k >= 0 && k < static_cast<int>(bar_classes.size())) show_class(bar_classes[k].name, bar_classes[k].op_class_index);
  });
  QObject::connect(ops, &QTableWidget::cellClicked, outer, [ops, show_class, c](int row, int) {
    const std::string cls = ops->item(row, 1)->text().toStdString();
    for (const CompareLine& k : c.classes) {
      if (k.name == cls) show_class(k.name, k.op_class_index);
    }
  });
  QObject::connect(slices, &QTableWidget::cellDoubleClicked, outer, [slices, gantt](int row, int) {
    const QTableWidgetItem* it = slices->item(row, 0);
    gantt->show_slice(it->data(Qt::UserRole).toInt(), it->data(Qt::UserRole + 1).toInt());
  });
  return outer;
}

QTableWidget* table_widget(const Table& t, int bold_row = -1) {
  auto* w = new QTableWidget(static_cast<int>(t.rows.size()), static_cast<int>(t.columns.size()));
  QStringList headers;
  for (const auto& c : t.columns) headers << qs(c);
  w->setHorizontalHeaderLabels(headers);
  for (size_t r = 0; r < t.rows.size(); ++r) {
    for (size_t c = 0; c < t.rows[r].size(); ++c) {
      // Numbers sort as numbers but show the text as given (0.000 stays 0.000, as the CLI prints it).
      bool ok = false;
      const double v = qs(t.rows[r][c]).toDouble(&ok);
      QTableWidgetItem* item = ok ? sortable(v, t.rows[r][c]) : new QTableWidgetItem(qs(t.rows[r][c]));
      if (c == 0) item->setData(Qt::UserRole + 1, static_cast<int>(r));  // the row's index in the file
      if (static_cast<int>(r) == bold_row) {
        QFont f = item->font();
        f.setBold(true);
        item->setFont(f);
      }
      w->setItem(static_cast<int>(r), static_cast<int>(c), item);
    }
  }
  w->setEditTriggers(QAbstractItemView::NoEditTriggers);
  // Rows keep the file's order (the ranking) until a header is clicked.
  w->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);
  w->setSortingEnabled(true);
  w->resizeColumnsToContents();
  return w;
}

QWidget* chart_or_note(const std::function<QChart*()>& build, const std::string& note) {
  try {
    auto* v = new QChartView(build());
    v->setRenderHint(QPainter::Antialiasing);
    v->setMinimumSize(300, 250);
    return v;
  } catch (const UserError& e) {
    auto* l = new QLabel(qs(note + "\n(" + e.what() + ")"));
    l->setAlignment(Qt::AlignCenter);
    return l;
  }
}

QWidget* sizing_tab(const SizingResult& s) {
  auto* split = new QSplitter(Qt::Vertical);
  int winner = -1;
  for (size_t i = 0; i < s.candidates.size(); ++i) {
    if (s.candidates[i].winner) winner = static_cast<int>(i);
  }
  QTableWidget* table = table_widget(s.table, winner);
  table->setObjectName("candidates");
  table->setSelectionBehavior(QAbstractItemView::SelectRows);
  split->addWidget(table);
  auto* charts = new QSplitter(Qt::Horizontal);
  const StackedBarSpec mem = memory_chart(s);
  ScatterSpec days = days_loss_chart(s);
  days.width_px = 460;  // about its share of the window: labels are placed apart at this size
  days.height_px = 520;
  charts->addWidget(chart_or_note([&] { return build_stacked_bars(mem); }, "No memory breakdown in this file."));
  charts->addWidget(chart_or_note([&] { return build_scatter(days); }, "No candidate with both days and forecast loss."));
  // The finish-date histogram follows the selected candidate (the winner until one is picked).
  bool any_samples = false;
  for (const auto& c : s.candidates) any_samples = any_samples || !c.finish_days.empty();
  if (any_samples) {
    const HistogramSpec finish = finish_chart(s);
    auto* hist = new QChartView(build_histogram(finish));
    hist->setObjectName("finish_histogram");
    hist->setRenderHint(QPainter::Antialiasing);
    hist->setMinimumSize(300, 250);
    charts->addWidget(hist);
    QObject::connect(table, &QTableWidget::currentCellChanged, hist, [s, table, hist](int row, int, int, int) {
      if (row < 0) return;
      const int candidate = table->item(row, 0)->data(Qt::UserRole + 1).toInt();
      const HistogramSpec spec = finish_chart(s, candidate);
      if (spec.samples.empty()) return;
      QChart* old = hist->chart();
      hist->setChart(build_histogram(spec));
      delete old;
    });
  }
  split->addWidget(charts);
  split->setSizes({250, 650});
  return split;
}

QWidget* drops_tab(const DropsResult& d) {
  auto* page = new QWidget;
  auto* layout = new QVBoxLayout(page);
  auto* label = new QLabel(qs("Fixed settings: " + (d.scenario.empty() ? std::string("(not in the file)") : d.scenario)));
  label->setWordWrap(true);
  layout->addWidget(label);
  auto* split = new QSplitter(Qt::Vertical);
  split->addWidget(chart_or_note([&] { return build_lines(d.chart); }, "Nothing to plot."));
  split->addWidget(table_widget(d.table));
  split->setSizes({650, 200});
  layout->addWidget(split, 1);
  return page;
}

}  // namespace

MainWindow::MainWindow() : tabs_(new QTabWidget) {
  setWindowTitle("rackstep");
  tabs_->setTabsClosable(true);
  tabs_->setDocumentMode(true);
  setCentralWidget(tabs_);
  QObject::connect(tabs_, &QTabWidget::tabCloseRequested, this, [this](int i) {
    QWidget* w = tabs_->widget(i);
    tabs_->removeTab(i);
    delete w;
  });
  QMenu* file = menuBar()->addMenu("&File");
  auto action = [&](const char* text, QKeySequence::StandardKey key, auto&& run) {
    QAction* a = file->addAction(text);
    a->setShortcut(key);
    QObject::connect(a, &QAction::triggered, this, run);
  };
  action("&Open...", QKeySequence::Open, [this] { open_dialog(); });
  action("&Close tab", QKeySequence::Close, [this] {
    if (tabs_->count() > 0) tabs_->tabCloseRequested(tabs_->currentIndex());
  });
  file->addSeparator();
  action("&Quit", QKeySequence::Quit, [this] { close(); });
  file->addAction("Co&mpare two traces...", this, [this] { compare_dialog(); });
  statusBar()->showMessage("Open a Chrome trace (rackstep timeline, a profiler), a `rackstep size --json` result or a "
                           "`rackstep drops --json` sweep.");
  // The status bar names the file of the tab on screen.
  QObject::connect(tabs_, &QTabWidget::currentChanged, this, [this](int i) {
    statusBar()->showMessage(i >= 0 ? tabs_->tabToolTip(i) : QString());
  });
}

void MainWindow::add_tab(QWidget* page, const std::string& title, const std::string& path) {
  const int i = tabs_->addTab(page, qs(title));
  tabs_->setTabToolTip(i, qs(path));
  tabs_->setCurrentIndex(i);
  statusBar()->showMessage(qs(path));
}

void MainWindow::open_compare(const std::string& predicted_path, const std::string& measured_path) {
  const auto predicted = read_trace_json(predicted_path);
  const auto measured = read_trace_json(measured_path);
  const std::string both = predicted_path + " vs " + measured_path;
  auto m = std::make_shared<const TraceModel>(parse_trace(merge_traces(predicted, predicted_path, measured, measured_path), both));
  add_tab(compare_tab(m),
          "compare: " + QFileInfo(qs(predicted_path)).fileName().toStdString() + " vs " +
              QFileInfo(qs(measured_path)).fileName().toStdString(),
          both);
}

void MainWindow::compare_dialog() {
  const QString pred = QFileDialog::getOpenFileName(this, "Predicted trace (rackstep timeline)", QString(),
                                                    "Traces (*.json *.json.gz);;All files (*)");
  if (pred.isEmpty()) return;
  const QString meas = QFileDialog::getOpenFileName(this, "Measured trace (rackstep train --profile, a profiler)",
                                                    QString(), "Traces (*.json *.json.gz);;All files (*)");
  if (meas.isEmpty()) return;
  try {
    open_compare(pred.toStdString(), meas.toStdString());
  } catch (const UserError& e) {
    QMessageBox::warning(this, "rackstep", e.what());
  }
}

void MainWindow::open_file(const std::string& path) {
  const std::string name = QFileInfo(qs(path)).fileName().toStdString();
  std::string text = read_maybe_gzip(path);
  if (looks_like_trace_text(text)) {
    // Streamed: a trace of millions of slices never becomes one JSON tree.
    auto m = std::make_shared<const TraceModel>(parse_trace_text(text, path));
    text = std::string();
    add_tab(is_compare_trace(*m) ? compare_tab(m) : trace_tab(m), name, path);
    return;
  }
  const auto doc = parse_json_text(text, path);
  QWidget* page = nullptr;
  switch (detect_kind(doc, path)) {
    case FileKind::trace: {
      auto m = std::make_shared<const TraceModel>(parse_trace(doc, path));
      page = is_compare_trace(*m) ? compare_tab(m) : trace_tab(m);
      break;
    }
    case FileKind::sizing: page = sizing_tab(parse_sizing(doc, path)); break;
    case FileKind::drops: page = drops_tab(parse_drops(doc, path)); break;
  }
  add_tab(page, name, path);
}

void MainWindow::set_row_filter(const std::string& text) {
  for (QLineEdit* e : tabs_->findChildren<QLineEdit*>("row_filter")) e->setText(qs(text));
}

void MainWindow::open_dialog() {
  const QStringList paths =
      QFileDialog::getOpenFileNames(this, "Open results", QString(), "JSON (*.json *.json.gz);;All files (*)");
  for (const QString& p : paths) {
    try {
      open_file(p.toStdString());
    } catch (const UserError& e) {
      QMessageBox::warning(this, "rackstep", e.what());
    }
  }
}

}  // namespace rackstep::gui
