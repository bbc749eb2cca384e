// Qt Charts built from the plain specs of gui/charts.h, shared by the PNG
// renderer (gui/charts.cpp) and the desktop viewer, so a report image and
// the interactive view are the same chart.
//
//   QChartView* v = new QChartView(rackstep::gui::build_lines(spec));
//
// Each builder returns a new QChart the caller owns (a QChartView takes it).
#pragma once

#include <QChart>

#include "gui/charts.h"

namespace rackstep::gui {

QChart* build_scatter(const ScatterSpec& spec);
QChart* build_stacked_bars(const StackedBarSpec& spec);
QChart* build_histogram(const HistogramSpec& spec);
QChart* build_lines(const LineSpec& spec);

}  // namespace rackstep::gui
