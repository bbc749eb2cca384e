// The viewer's window: one tab per opened file — a timeline for a Chrome
// trace, a candidate table with memory bars and a days-vs-loss scatter for a
// sizing result, a drop curve for a drops sweep.
//
//   MainWindow w;
//   w.open_file("trace.json");   // throws rackstep::UserError on a bad file
//   w.show();
#pragma once

#include <string>

#include <QMainWindow>
#include <QTabWidget>

namespace rackstep::gui {

class MainWindow : public QMainWindow {
 public:
  MainWindow();
  // Opens `path` in a new tab and shows it; the kind is read from the content.
  void open_file(const std::string& path);
  QTabWidget* tabs() const { return tabs_; }

 private:
  void open_dialog();
  QTabWidget* tabs_;
};

}  // namespace rackstep::gui
