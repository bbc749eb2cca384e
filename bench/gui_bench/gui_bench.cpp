// gui_bench: how long rackstep-gui takes to open a big trace, and how much
// memory it holds, on this machine. The goal: a 2.75M-slice trace
// (the hero's size) opens in under 5 s and under 1.5 GB.
//
//   gui_bench                          # synthesise 2.75M slices (sim::TraceWriter, as rackstep timeline writes), open, paint
//   gui_bench --slices 500000          # a smaller one
//   gui_bench --trace /tmp/hero.json   # a trace from `rackstep timeline` (or any Chrome trace)
//   gui_bench --json                   # one JSON object instead of the table
//
// The synthetic trace is written by a child process, so the peak memory
// reported (getrusage ru_maxrss of this process) is the viewer's alone:
// reading, parsing, rows, critical path, per-GPU exposure, and one paint of
// the fitted view plus one of a zoomed view at 1600x900.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <QImage>
#include <QPainter>

#include "gui/charts.h"
#include "gui/gantt_paint.h"
#include "gui/trace_model.h"
#include "sim/base/check.h"
#include "sim/base/trace.h"

namespace {

namespace g = rackstep::gui;

struct Args {
  int64_t slices = 2750000;
  std::string trace;
  bool json = false;
};

const char* kUsage =
    "usage: gui_bench [--slices N | --trace FILE] [--json]\n"
    "  Opens a Chrome trace as rackstep-gui does and reports the time to open it (read, parse, rows,\n"
    "  exposure), to paint it fitted and zoomed at 1600x900, and the peak resident memory.\n"
    "  --slices N    synthesise a trace of N slices like `rackstep timeline` writes (default 2750000)\n"
    "  --trace FILE  open FILE instead (.json or .json.gz)\n"
    "  --json        print one JSON object\n";

// A DES-shaped trace: GPU processes with compute and communication streams,
// layer/micro-batch slice names, every fourth compute slice on the critical path.
void synthesise(const std::string& path, int64_t slices) {
  rackstep::sim::TraceWriter w;
  const int gpus = 64, per_gpu_streams = 6;
  const char* streams[per_gpu_streams] = {"compute", "fsdp_allgather", "fsdp_reduce_scatter", "ep_all_to_all",
                                          "nvlink_port", "nic"};
  const char* cats[per_gpu_streams] = {"forward", "fsdp_allgather", "fsdp_reduce_scatter", "ep_all_to_all",
                                       "ep_all_to_all", "grad_sync"};
  std::vector<int> pid(gpus), tid(gpus * per_gpu_streams);
  for (int p = 0; p < gpus; ++p) {
    pid[p] = w.process("stage" + std::to_string(p / 8) + " rank" + std::to_string(p) + " (x16)");
    for (int s = 0; s < per_gpu_streams; ++s) tid[p * per_gpu_streams + s] = w.thread(pid[p], streams[s]);
  }
  const int64_t per_row = slices / (gpus * per_gpu_streams) + 1;
  int64_t written = 0;
  const nlohmann::json crit = {{"critical", true}};
  for (int p = 0; p < gpus && written < slices; ++p) {
    for (int s = 0; s < per_gpu_streams && written < slices; ++s) {
      double t = 1e-6 * (p % 8) * 50;
      for (int64_t i = 0; i < per_row && written < slices; ++i, ++written) {
        const double dur = s == 0 ? 40e-6 : 25e-6;
        const std::string name = "L" + std::to_string(i % 96) + (i % 2 ? ".bwd" : ".fwd") + ".mb" + std::to_string(i / 96 % 32);
        w.complete(pid[p], tid[p * per_gpu_streams + s], name, s == 0 && i % 2 ? "backward" : cats[s], t, dur,
                   s == 0 && i % 4 == 0 ? crit : nlohmann::json());
        t += dur * (s == 0 ? 1.05 : 1.6);
      }
    }
  }
  w.write(path);
}

// CPU seconds of this process: on a shared machine the wall clock counts other people's work.
double cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double peak_rss_gib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0 / (1024.0 * 1024.0 * 1024.0);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "-h" || s == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (s == "--json") {
      a.json = true;
    } else if ((s == "--slices" || s == "--trace") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (s == "--trace") {
        a.trace = v;
        continue;
      }
      char* end = nullptr;
      a.slices = std::strtoll(v.c_str(), &end, 10);
      if (*end != '\0' || a.slices < 1) {
        std::fprintf(stderr, "gui_bench: --slices: expected a count >= 1, found \"%s\"\n", v.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "gui_bench: expected --slices N, --trace FILE or --json, found \"%s\"\n", s.c_str());
      return 2;
    }
  }
  std::string path = a.trace;
  bool synthetic = path.empty();
  if (synthetic) {
    path = (std::filesystem::temp_directory_path() / ("rackstep_gui_bench_" + std::to_string(getpid()) + ".json")).string();
    if (!a.json) std::fprintf(stderr, "gui_bench: writing a %lld-slice trace to %s ...\n", static_cast<long long>(a.slices), path.c_str());
    const pid_t child = fork();
    if (child == 0) {
      synthesise(path, a.slices);
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "gui_bench: writing the synthetic trace failed\n");
      return 1;
    }
  }
  const double file_mib = static_cast<double>(std::filesystem::file_size(path)) / (1024.0 * 1024.0);
  if (!g::charts_available()) {
    std::fprintf(stderr, "gui_bench: Qt's offscreen platform is missing; cannot paint\n");
    return 1;
  }
  using clock = std::chrono::steady_clock;
  try {
    const double c0 = cpu_s();
    const auto t0 = clock::now();
    const g::TraceModel m = g::load_trace(path);
    const auto t1 = clock::now();
    const double open_cpu_s = cpu_s() - c0;
    QImage img(1600, 900, QImage::Format_RGB32);
    g::GanttView v = g::fit_view(m);
    {
      QPainter p(&img);
      g::paint_gantt(p, m, img.size(), v);
    }
    const auto t2 = clock::now();
    const double span = v.t1_us - v.t0_us;
    v.t0_us += 0.4 * span;
    v.t1_us = v.t0_us + 0.01 * span;
    {
      QPainter p(&img);
      g::paint_gantt(p, m, img.size(), v);
    }
    const auto t3 = clock::now();
    const double open_s = std::chrono::duration<double>(t1 - t0).count();
    const double fit_paint_s = std::chrono::duration<double>(t2 - t1).count();
    const double zoom_paint_s = std::chrono::duration<double>(t3 - t2).count();
    const double rss = peak_rss_gib();
    if (synthetic) std::filesystem::remove(path);
    if (a.json) {
      std::printf("{\"slices\": %lld, \"rows\": %zu, \"file_mib\": %.1f, \"open_s\": %.3f, \"fit_paint_s\": %.3f, "
                  "\"zoom_paint_s\": %.3f, \"open_cpu_s\": %.3f, \"peak_rss_gib\": %.3f, \"goal_open_s\": 5, "
                  "\"goal_peak_gib\": 1.5}\n",
                  static_cast<long long>(m.n_events), m.rows.size(), file_mib, open_s, fit_paint_s, zoom_paint_s,
                  open_cpu_s, rss);
    } else {
      std::printf("trace            %s%s\n", synthetic ? "(synthetic) " : "", synthetic ? "" : path.c_str());
      std::printf("slices           %lld on %zu rows, %.1f MiB of JSON\n", static_cast<long long>(m.n_events), m.rows.size(), file_mib);
      std::printf("open             %.3f s wall, %.3f s CPU   (goal < 5 s)\n", open_s, open_cpu_s);
      std::printf("paint, fitted    %.3f s\n", fit_paint_s);
      std::printf("paint, 1%% zoom   %.3f s\n", zoom_paint_s);
      std::printf("peak memory      %.3f GiB (goal < 1.5 GB)\n", rss);
    }
    return 0;
  } catch (const rackstep::UserError& e) {
    if (synthetic) std::filesystem::remove(path);
    std::fprintf(stderr, "gui_bench: %s\n", e.what());
    return 2;
  }
}
