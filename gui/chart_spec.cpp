// Chart data shared by every renderer; see gui/chart_spec.h.
#include "gui/chart_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "sim/base/check.h"

namespace rackstep::gui {

std::pair<double, double> padded(double lo, double hi, double frac) {
  if (!(hi > lo)) {
    const double d = std::max(std::fabs(lo) * 0.05, 0.5);
    return {lo - d, hi + d};
  }
  const double d = (hi - lo) * frac;
  return {lo - d, hi + d};
}

HistogramBins histogram_bins(const HistogramSpec& spec) {
  if (spec.samples.empty()) throw UserError(spec.title, "", "at least one sample", "none");
  for (double x : spec.samples) {
    if (!std::isfinite(x)) throw UserError(spec.title, "", "finite samples", std::to_string(x));
  }
  const auto [min_it, max_it] = std::minmax_element(spec.samples.begin(), spec.samples.end());
  double lo = *min_it, hi = *max_it;
  if (!(hi > lo)) {  // one value: a bin of visible width around it
    const double d = std::max(std::fabs(lo) * 0.05, 0.5);
    lo -= d, hi += d;
  }
  const double n = static_cast<double>(spec.samples.size());
  const int auto_bins = static_cast<int>(std::max(std::ceil(std::log2(n)) + 1, std::ceil(std::sqrt(n))));
  const int bins = spec.bins > 0 ? spec.bins : std::clamp(auto_bins, 5, 60);
  HistogramBins h{lo, (hi - lo) / bins, std::vector<double>(bins, 0.0)};
  for (double x : spec.samples) h.counts[std::min(bins - 1, static_cast<int>((x - lo) / h.width))] += 1;
  return h;
}

}  // namespace rackstep::gui
