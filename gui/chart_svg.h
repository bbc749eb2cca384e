// Charts as SVG text, without Qt: the size report's pictures where Qt is
// absent, drawn from the same specs (gui/chart_spec.h) as the viewer's and the
// PNG renderer's charts. Axes with round ticks, the title, a legend; a spec
// with nothing to draw throws rackstep::UserError, like the PNG renderer.
//
//   write_text_file_atomic(dir + "/memory.svg", svg_stacked_bars(memory_chart(s)));
#pragma once

#include <string>

#include "gui/chart_spec.h"

namespace rackstep::gui {

std::string svg_scatter(const ScatterSpec& spec);
std::string svg_stacked_bars(const StackedBarSpec& spec);
std::string svg_histogram(const HistogramSpec& spec);

}  // namespace rackstep::gui
