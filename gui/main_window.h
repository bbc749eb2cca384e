// The viewer's window: one tab per opened file — a timeline for a Chrome
// trace, a compare view for a predicted and a measured trace (one combined
// file from `rackstep compare`, or two files), a candidate table with memory
// bars, a days-vs-loss scatter and a finish-date histogram for a sizing
// result, a drop curve for a drops sweep. The status bar names the file of the
// tab on screen.
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
  // Opens a predicted and a measured trace as one compare tab, aligned at step start.
  void open_compare(const std::string& predicted_path, const std::string& measured_path);
  // Sets every timeline's row filter (only rows whose process or stream name contain `text`).
  void set_row_filter(const std::string& text);
  QTabWidget* tabs() const { return tabs_; }

 private:
  void open_dialog();
  void compare_dialog();
  void add_tab(QWidget* page, const std::string& title, const std::string& path);
  QTabWidget* tabs_;
};

}  // namespace rackstep::gui
