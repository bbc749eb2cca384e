// What a rendered PNG holds, for tests: its size, how much it varies (a blank
// image has no variance) and how many pixels are close to a given colour (a
// deadline line, a critical-path outline).
//
//   PngStats s = png_stats("out.png", {QColor(0xc0, 0x1c, 0x28)});
//   REQUIRE(s.gray_stddev > 20);
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <QColor>
#include <QImage>

namespace rackstep::gui::test {

struct PngStats {
  bool loaded = false;
  int width = 0, height = 0;
  double gray_stddev = 0;            // over all pixels, 0..255
  int distinct_colors = 0;           // in a 64-level quantisation, capped at 4096
  std::vector<long> near_color;      // per probe colour: pixels within `tolerance` per channel
};

inline PngStats png_stats(const std::string& path, const std::vector<QColor>& probes = {}, int tolerance = 12) {
  PngStats s;
  QImage img;
  if (!img.load(QString::fromStdString(path), "PNG")) return s;
  img = img.convertToFormat(QImage::Format_RGB32);
  s.loaded = true;
  s.width = img.width();
  s.height = img.height();
  s.near_color.assign(probes.size(), 0);
  double sum = 0, sum2 = 0;
  std::vector<char> seen(64 * 64 * 64, 0);
  for (int y = 0; y < img.height(); ++y) {
    const QRgb* line = reinterpret_cast<const QRgb*>(img.constScanLine(y));
    for (int x = 0; x < img.width(); ++x) {
      const int r = qRed(line[x]), g = qGreen(line[x]), b = qBlue(line[x]);
      const double gray = 0.299 * r + 0.587 * g + 0.114 * b;
      sum += gray;
      sum2 += gray * gray;
      char& q = seen[(r / 4) * 4096 + (g / 4) * 64 + b / 4];
      if (!q && s.distinct_colors < 4096) ++s.distinct_colors;
      q = 1;
      for (size_t i = 0; i < probes.size(); ++i) {
        if (std::abs(r - probes[i].red()) <= tolerance && std::abs(g - probes[i].green()) <= tolerance &&
            std::abs(b - probes[i].blue()) <= tolerance)
          ++s.near_color[i];
      }
    }
  }
  const double n = static_cast<double>(img.width()) * img.height();
  s.gray_stddev = n > 0 ? std::sqrt(std::max(0.0, sum2 / n - (sum / n) * (sum / n))) : 0;
  return s;
}

}  // namespace rackstep::gui::test
