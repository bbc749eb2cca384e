// The viewer's window and its three kinds of tab; see gui/main_window.h.
#include "gui/main_window.h"

#include <cmath>
#include <functional>
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
#include <QVBoxLayout>

#include "gui/chart_build.h"
#include "gui/gantt_paint.h"
#include "gui/gantt_widget.h"
#include "gui/result_files.h"
#include "gui/trace_model.h"
#include "models/check.h"

namespace rackstep::gui {
namespace {

QString qs(const std::string& s) { return QString::fromStdString(s); }

// The legend strip under a timeline.
class LegendWidget : public QWidget {
 public:
  explicit LegendWidget(std::shared_ptr<const TraceModel> m) : m_(std::move(m)) { setFixedHeight(26); }

 protected:
  void paintEvent(QPaintEvent*) override {
    QPainter p(this);
    p.setRenderHint(QPainter::TextAntialiasing);
    paint_gantt_legend(p, *m_, rect());
  }

 private:
  std::shared_ptr<const TraceModel> m_;
};

// What the trace adds up to: span, critical path, exposed communication per row.
std::string trace_summary(const TraceModel& m) {
  std::string s = m.path + "\n" + std::to_string(m.n_events) + " slices on " + std::to_string(m.rows.size()) +
                  " rows, span " + format_us(m.t1_us - m.t0_us) + ", " + std::to_string(m.n_critical) +
                  " slices on the critical path\n";
  for (const auto& [k, v] : m.metadata) s += k + ": " + v + "\n";
  s += "\nexposed communication (runs while its GPU's compute streams are idle):\n";
  bool any = false;
  for (const TraceRow& r : m.rows) {
    if (!r.comm) continue;
    any = true;
    s += "  " + r.process_name + " / " + r.thread_name + ": " + format_us(r.exposed_total_us) + " of " +
         format_us(r.busy_us) + " busy\n";
  }
  if (!any) s += "  (no GPU communication rows: a GPU is a process with a thread named \"compute\")\n";
  s += "\nHover a slice for its details; wheel zooms, drag pans, shift+wheel scrolls, double-click zooms to a slice, "
       "F fits.";
  return s;
}

QWidget* trace_tab(std::shared_ptr<const TraceModel> m) {
  auto* page = new QWidget;
  auto* layout = new QVBoxLayout(page);
  auto* bar = new QHBoxLayout;
  auto* gantt = new GanttWidget(m);
  auto* fit = new QPushButton("Fit (F)");
  auto* dim = new QCheckBox("Dim slices off the critical path");
  dim->setEnabled(m->n_critical > 0);
  bar->addWidget(fit);
  bar->addWidget(dim);
  bar->addStretch(1);
  double exposed = 0;
  for (const TraceRow& r : m->rows) exposed += r.exposed_total_us;
  bar->addWidget(new QLabel(qs(std::to_string(m->n_events) + " slices, span " + format_us(m->t1_us - m->t0_us) +
                               ", exposed communication " + format_us(exposed))));
  layout->addLayout(bar);

  auto* split = new QSplitter(Qt::Vertical);
  auto* timeline = new QWidget;
  auto* tl = new QVBoxLayout(timeline);
  tl->setContentsMargins(0, 0, 0, 0);
  tl->addWidget(gantt, 1);
  tl->addWidget(new LegendWidget(m));
  split->addWidget(timeline);
  auto* details = new QPlainTextEdit(qs(trace_summary(*m)));
  details->setReadOnly(true);
  split->addWidget(details);
  split->setStretchFactor(0, 4);
  split->setStretchFactor(1, 1);
  layout->addWidget(split, 1);

  QObject::connect(fit, &QPushButton::clicked, gantt, [gantt] { gantt->fit(); });
  QObject::connect(dim, &QCheckBox::toggled, gantt, [gantt](bool on) { gantt->set_dim_noncritical(on); });
  gantt->on_details = [details](const std::string& text) { details->setPlainText(qs(text)); };
  return page;
}

QTableWidget* table_widget(const Table& t, int bold_row = -1) {
  auto* w = new QTableWidget(static_cast<int>(t.rows.size()), static_cast<int>(t.columns.size()));
  QStringList headers;
  for (const auto& c : t.columns) headers << qs(c);
  w->setHorizontalHeaderLabels(headers);
  for (size_t r = 0; r < t.rows.size(); ++r) {
    for (size_t c = 0; c < t.rows[r].size(); ++c) {
      auto* item = new QTableWidgetItem;
      // Numbers sort as numbers.
      bool ok = false;
      const double v = qs(t.rows[r][c]).toDouble(&ok);
      if (ok) item->setData(Qt::DisplayRole, v);
      else item->setText(qs(t.rows[r][c]));
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
  split->addWidget(table_widget(s.table, winner));
  auto* charts = new QSplitter(Qt::Horizontal);
  const StackedBarSpec mem = memory_chart(s);
  const ScatterSpec days = days_loss_chart(s);
  charts->addWidget(chart_or_note([&] { return build_stacked_bars(mem); }, "No memory breakdown in this file."));
  charts->addWidget(chart_or_note([&] { return build_scatter(days); }, "No candidate with both days and forecast loss."));
  const HistogramSpec finish = finish_chart(s);
  if (!finish.samples.empty()) charts->addWidget(chart_or_note([&] { return build_histogram(finish); }, ""));
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
  statusBar()->showMessage("Open a Chrome trace (rackstep timeline, a profiler), a `rackstep size --json` result or a "
                           "`rackstep drops --json` sweep.");
}

void MainWindow::open_file(const std::string& path) {
  const auto doc = read_json_file(path);
  const QString name = QFileInfo(qs(path)).fileName();
  QWidget* page = nullptr;
  switch (detect_kind(doc, path)) {
    case FileKind::trace: page = trace_tab(std::make_shared<const TraceModel>(parse_trace(doc, path))); break;
    case FileKind::sizing: page = sizing_tab(parse_sizing(doc, path)); break;
    case FileKind::drops: page = drops_tab(parse_drops(doc, path)); break;
  }
  tabs_->setCurrentIndex(tabs_->addTab(page, name));
  tabs_->setTabToolTip(tabs_->currentIndex(), qs(path));
  statusBar()->showMessage(qs(path));
}

void MainWindow::open_dialog() {
  const QStringList paths =
      QFileDialog::getOpenFileNames(this, "Open results", QString(), "JSON (*.json);;All files (*)");
  for (const QString& p : paths) {
    try {
      open_file(p.toStdString());
    } catch (const UserError& e) {
      QMessageBox::warning(this, "rackstep", e.what());
    }
  }
}

}  // namespace rackstep::gui
