// png_stats FILE [RRGGBB...]: prints "width height gray_stddev distinct_colors [near_count...]"
// for the shell tests of rackstep-gui (tests/gui/gui_cli.sh); exit 1 when FILE is not a PNG.
#include <cstdio>
#include <string>
#include <vector>

#include "tests/gui/png_stats.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: png_stats FILE [RRGGBB...]\n");
    return 2;
  }
  std::vector<QColor> probes;
  for (int i = 2; i < argc; ++i) probes.push_back(QColor(QString("#") + argv[i]));
  const auto s = rackstep::gui::test::png_stats(argv[1], probes);
  if (!s.loaded) {
    std::fprintf(stderr, "png_stats: %s is not a readable PNG\n", argv[1]);
    return 1;
  }
  std::printf("%d %d %.2f %d", s.width, s.height, s.gray_stddev, s.distinct_colors);
  for (long c : s.near_color) std::printf(" %ld", c);
  std::printf("\n");
  return 0;
}
