// The figures the viewer puts on screen for a file, as JSON, so they can be
// checked against what the command-line tools print for the same file
// (`rackstep-gui --json FILE`, tests/gui/gui_vs_cli.sh):
//   trace:  per-GPU compute, idle and exposed time by kind (`rackstep timeline --json`)
//   sizing: device and host memory per candidate (`rackstep size --json` peak_memory_bytes)
//   drops:  the drop table in percent (`rackstep drops` prints "%.3f")
//
//   nlohmann::ordered_json f = rackstep::gui::figures_json("trace.json");
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "gui/trace_model.h"

namespace rackstep::gui {

nlohmann::ordered_json figures_json(const std::string& path);
nlohmann::ordered_json trace_figures(const TraceModel& m);

}  // namespace rackstep::gui
