// rackstep-gui: the desktop viewer for timelines (Chrome trace JSON, predicted
// by `rackstep timeline` or measured by the profiler), sizing results
// (`rackstep size --json`) and drop sweeps (`rackstep drops --sweep ... --json`).
//
//   rackstep-gui                                   # empty window, File > Open
//   rackstep-gui trace.json sizing.json            # one tab per file
//   rackstep-gui --screenshot out.png trace.json   # no display needed: render, save, exit
//   rackstep-gui --screenshot out.png --size 1600x1000 drops.json
//   rackstep-gui --compare predicted.json run/profile/trace.json   # one compare tab
//   rackstep-gui --json trace.json size.json       # the figures each tab shows, as JSON; no window
//
// A file that cannot be read prints one line and exits with status 2.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <QApplication>
#include <QPixmap>

#include "gui/figures.h"
#include "gui/main_window.h"
#include "sim/base/check.h"

namespace {

struct Args {
  std::vector<std::string> files;
  std::vector<std::pair<std::string, std::string>> compares;  // (predicted, measured)
  bool json = false;
  std::string screenshot;
  std::string rows;  // --rows: a row filter for every timeline
  int width = 1400, height = 900;
  bool help = false;
};

const char* kUsage =
    "usage: rackstep-gui [--screenshot OUT.png [--size WxH]] [--rows TEXT] [--compare PREDICTED MEASURED]... [FILE...]\n"
    "       rackstep-gui --json FILE...\n"
    "  FILE: a Chrome trace JSON (.json or .json.gz; `rackstep timeline`, `rackstep train --profile`, PyTorch,\n"
    "        Perfetto JSON, or the combined file `rackstep compare` writes), a `rackstep size --json` result\n"
    "        or a `rackstep drops --json` result; one tab each\n"
    "  --compare P M         a predicted and a measured trace in one tab, aligned at step start, with time per\n"
    "                        op class predicted vs measured; click a bar for its slices\n"
    "  --screenshot OUT.png  render the window offscreen to a PNG and exit (no display needed)\n"
    "  --size WxH            window size for --screenshot (default 1400x900)\n"
    "  --rows TEXT           show only timeline rows whose process or stream name contains TEXT\n"
    "                        (e.g. compute: every GPU's compute stream on one screen)\n"
    "  --json                print the figures each file's tab shows (per-GPU exposed time by kind, memory\n"
    "                        per candidate, drop percentages) as JSON and exit, for checking against the CLI\n";

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&](const char* flag) {
      if (i + 1 >= argc) throw rackstep::UserError(std::string(flag) + ": expected a value, found none");
      return std::string(argv[++i]);
    };
    if (s == "-h" || s == "--help") {
      a.help = true;
    } else if (s == "--rows") {
      a.rows = value("--rows");
    } else if (s == "--json") {
      a.json = true;
    } else if (s == "--compare") {
      const std::string p = value("--compare");
      a.compares.emplace_back(p, value("--compare"));
    } else if (s == "--screenshot") {
      a.screenshot = value("--screenshot");
    } else if (s == "--size") {
      const std::string v = value("--size");
      if (std::sscanf(v.c_str(), "%dx%d", &a.width, &a.height) != 2 || a.width < 200 || a.height < 150 ||
          a.width > 8000 || a.height > 8000)
        throw rackstep::UserError("--size: expected WxH between 200x150 and 8000x8000, found \"" + v + "\"");
    } else if (!s.empty() && s[0] == '-') {
      throw rackstep::UserError("expected a file or --compare / --json / --screenshot / --size / --help, found \"" + s +
                                "\"");
    } else {
      a.files.push_back(s);
    }
  }
  if (!a.screenshot.empty() && a.files.empty() && a.compares.empty())
    throw rackstep::UserError("--screenshot: expected a FILE to show, found none");
  if (a.json && a.files.empty()) throw rackstep::UserError("--json: expected a FILE, found none");
  return a;
}

// Offscreen Qt reports features it lacks (window hints); they are not errors here.
void quiet_handler(QtMsgType type, const QMessageLogContext&, const QString& msg) {
  if (type == QtDebugMsg || type == QtInfoMsg || type == QtWarningMsg) return;
  std::fprintf(stderr, "qt: %s\n", msg.toLocal8Bit().constData());
}

int screenshot(rackstep::gui::MainWindow& w, const Args& a) {
  w.resize(a.width, a.height);
  w.show();
  for (int i = 0; i < 3; ++i) QCoreApplication::processEvents();  // layouts settle over a few passes
  const std::string tmp = a.screenshot + ".tmp" + std::to_string(getpid());
  if (!w.grab().save(QString::fromStdString(tmp), "PNG") || std::rename(tmp.c_str(), a.screenshot.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw rackstep::UserError(a.screenshot, "", "a writable PNG path", "it cannot be written");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const rackstep::UserError& e) {
    std::fprintf(stderr, "rackstep-gui: %s\n", e.what());
    return 2;
  }
  if (args.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.json) {
    try {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const std::string& f : args.files) out.push_back(rackstep::gui::figures_json(f));
      std::printf("%s\n", (out.size() == 1 ? out[0] : out).dump(2).c_str());
      return 0;
    } catch (const rackstep::UserError& e) {
      std::fprintf(stderr, "rackstep-gui: %s\n", e.what());
      return 2;
    }
  }
  if (!args.screenshot.empty()) {
    qputenv("QT_QPA_PLATFORM", "offscreen");
    if (std::getenv("RACKSTEP_QT_DEBUG") == nullptr) qInstallMessageHandler(quiet_handler);
  } else if (!std::getenv("DISPLAY") && !std::getenv("WAYLAND_DISPLAY") && !std::getenv("QT_QPA_PLATFORM")) {
    std::fprintf(stderr, "rackstep-gui: expected a display (DISPLAY or WAYLAND_DISPLAY), found none; "
                         "use --screenshot OUT.png FILE to render without one\n");
    return 2;
  }
  QApplication app(argc, argv);
  rackstep::gui::MainWindow window;
  try {
    for (const auto& [p, m] : args.compares) window.open_compare(p, m);
    for (const std::string& f : args.files) window.open_file(f);
    if (!args.rows.empty()) window.set_row_filter(args.rows);
    if (!args.screenshot.empty()) return screenshot(window, args);
  } catch (const rackstep::UserError& e) {
    std::fprintf(stderr, "rackstep-gui: %s\n", e.what());
    return 2;
  }
  window.resize(args.width, args.height);
  window.show();
  return app.exec();
}
