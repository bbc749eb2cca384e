// Offscreen PNG rendering of charts and timelines; see gui/charts.h.
#include "gui/charts.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <QApplication>
#include <QChartView>
#include <QFileInfo>
#include <QImage>
#include <QLibraryInfo>
#include <QPainter>

#include "gui/chart_build.h"
#include "gui/gantt_paint.h"
#include "gui/trace_model.h"
#include "sim/base/check.h"

namespace rackstep::gui {
namespace {

// Qt's chatter (offscreen plugin notes, missing XDG dirs) would garble a
// command-line tool's output; RACKSTEP_QT_DEBUG=1 lets it through.
void quiet_handler(QtMsgType type, const QMessageLogContext&, const QString& msg) {
  if (type == QtDebugMsg || type == QtInfoMsg || type == QtWarningMsg) return;
  std::fprintf(stderr, "qt: %s\n", msg.toLocal8Bit().constData());
}

bool offscreen_plugin_exists() {
  const QString dir = QLibraryInfo::path(QLibraryInfo::PluginsPath) + "/platforms";
  return QFileInfo::exists(dir + "/libqoffscreen.so");
}

void require_app() {
  if (!charts_available())
    throw UserError("charts: expected Qt's offscreen platform plugin (qt6-qpa-plugins) to draw PNGs, found none");
}

// Writes via a temporary file and a rename, so a reader never sees half a PNG.
void save_png(const QImage& img, const std::string& path) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  if (!img.save(QString::fromStdString(tmp), "PNG")) {
    std::remove(tmp.c_str());
    throw UserError(path, "", "a writable PNG path", "it cannot be written");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw UserError(path, "", "a writable PNG path", "the rename from its temporary file failed");
  }
}

void render_chart(QChart* chart, int width_px, int height_px, const std::string& path) {
  QChartView view(chart);  // owns the chart
  view.setRenderHint(QPainter::Antialiasing);
  view.resize(width_px, height_px);
  view.show();
  QCoreApplication::processEvents();  // lets the chart lay itself out at this size
  QImage img(width_px, height_px, QImage::Format_RGB32);
  img.fill(Qt::white);
  QPainter p(&img);
  p.setRenderHint(QPainter::Antialiasing);
  view.render(&p);
  p.end();
  save_png(img, path);
}

}  // namespace

bool charts_available() {
  QCoreApplication* existing = QCoreApplication::instance();
  if (existing != nullptr) return qobject_cast<QApplication*>(existing) != nullptr;
  if (!offscreen_plugin_exists()) return false;
  // A tool drawing files never needs a screen, and must not fail for want of one.
  qputenv("QT_QPA_PLATFORM", "offscreen");
  if (std::getenv("RACKSTEP_QT_DEBUG") == nullptr) qInstallMessageHandler(quiet_handler);
  static int argc = 1;
  static char name[] = "rackstep";
  static char* argv[] = {name, nullptr};
  // Never deleted: Qt's own globals are torn down after main's statics.
  new QApplication(argc, argv);
  return true;
}

void render_scatter(const ScatterSpec& spec, const std::string& png_path) {
  require_app();
  render_chart(build_scatter(spec), spec.width_px, spec.height_px, png_path);
}

void render_stacked_bars(const StackedBarSpec& spec, const std::string& png_path) {
  require_app();
  render_chart(build_stacked_bars(spec), spec.width_px, spec.height_px, png_path);
}

void render_histogram(const HistogramSpec& spec, const std::string& png_path) {
  require_app();
  render_chart(build_histogram(spec), spec.width_px, spec.height_px, png_path);
}

void render_lines(const LineSpec& spec, const std::string& png_path) {
  require_app();
  render_chart(build_lines(spec), spec.width_px, spec.height_px, png_path);
}

void render_timeline(const TimelineSpec& spec, const std::string& png_path) {
  require_app();
  const TraceModel m = load_trace(spec.trace_path);
  GanttView v = fit_view(m);
  if (std::isfinite(spec.t0_us)) v.t0_us = spec.t0_us;
  if (std::isfinite(spec.t1_us)) v.t1_us = spec.t1_us;
  if (!(v.t1_us > v.t0_us))
    throw UserError("timeline: expected a window with t1 > t0, found [" + std::to_string(v.t0_us) + ", " +
                    std::to_string(v.t1_us) + "] us");
  const int max_rows = std::max(1, spec.max_rows);
  const GanttLayout lay = gantt_layout(m, v, max_rows);
  const bool cut = lay.rows_left_out > 0;
  const int title_h = 40;
  const int gantt_h = v.geo.axis_h + lay.height + (cut ? v.geo.row_h + 4 : 4);
  const int width = std::max(400, spec.width_px);
  int legend_h = 30;
  {
    QImage probe(8, 8, QImage::Format_RGB32);
    QPainter pp(&probe);
    QFont f = pp.font();
    f.setPixelSize(12);
    pp.setFont(f);
    legend_h = paint_gantt_legend(pp, m, QRect(0, -10000, width, 0)) + 6;
  }
  QImage img(width, title_h + gantt_h + legend_h, QImage::Format_RGB32);
  img.fill(Qt::white);
  QPainter p(&img);
  p.setRenderHint(QPainter::Antialiasing, false);  // crisp slice edges
  p.setRenderHint(QPainter::TextAntialiasing);
  QFont f = p.font();
  f.setPixelSize(12);
  p.setFont(f);

  // Title and a one-line summary of what the picture shows.
  QFont title = f;
  title.setBold(true);
  title.setPixelSize(15);
  p.setFont(title);
  p.setPen(Qt::black);
  const std::string name = spec.title.empty() ? QFileInfo(QString::fromStdString(spec.trace_path)).fileName().toStdString()
                                              : spec.title;
  p.drawText(QRect(8, 2, width - 16, 20), Qt::AlignVCenter | Qt::AlignLeft, QString::fromStdString(name));
  p.setFont(f);
  p.setPen(QColor(0x44, 0x44, 0x44));
  const std::string summary = std::to_string(m.n_events) + " slices on " + std::to_string(m.rows.size()) +
                              " rows, span " + format_us(m.t1_us - m.t0_us) + ", " + std::to_string(m.n_critical) +
                              " on the critical path, exposed communication per GPU " +
                              format_us(m.per_gpu_exposed_comm_us());
  p.drawText(QRect(8, 21, width - 16, 17), Qt::AlignVCenter | Qt::AlignLeft, QString::fromStdString(summary));

  p.translate(0, title_h);
  paint_gantt(p, m, QSize(width, gantt_h), v, max_rows);
  p.translate(0, gantt_h);
  p.setPen(QColor(0xdd, 0xdd, 0xdd));
  p.drawLine(0, 0, width, 0);
  paint_gantt_legend(p, m, QRect(0, 0, width, legend_h));
  p.end();
  save_png(img, png_path);
}

}  // namespace rackstep::gui
