// `rackstep size [--scenario FILE]`: the main job. Sizes every candidate of a
// scenario (default: the embedded Marin July-2026 situation) and ranks them.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "sim/base/json_io.h"
#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"
#include "sim/emit_run.h"
#include "sim/size.h"
#include "gui/chart_svg.h"
#include "gui/result_charts.h"
#if RACKSTEP_HAVE_QT
#include "gui/charts.h"
#endif

namespace rackstep::sim {
namespace {

struct SizeArgs {
  std::string scenario;
  std::string report_dir;
  std::string emit_run_dir;
  std::string rank_by;
  std::string stack, compare_stack;
  double min_p_finish = -1;
  int64_t runs = 0;
  bool json = false;
  bool csv = false;
  bool quiet = false;
};

// The report's three pictures, built by the viewer's own chart builders
// (gui/result_charts.h) from this run's JSON, so the report and the viewer's
// tab for size.json draw the same data: days vs loss, memory per candidate,
// and the winner's finish-day distribution. Always written as SVG (no Qt
// needed); where Qt draws, also as PNG, which the report then shows. Returns
// (title, file name) pairs.
std::vector<std::pair<std::string, std::string>> write_plots(const nlohmann::json& j, const std::string& dir) {
  namespace g = rackstep::gui;
  std::vector<std::pair<std::string, std::string>> images;
  const g::SizingResult s = g::parse_sizing(nlohmann::ordered_json(j), dir + "/size.json");
  const g::ScatterSpec days = g::days_loss_chart(s);
  const g::StackedBarSpec memory = g::memory_chart(s);
  const g::HistogramSpec finish = g::finish_chart(s);
  if (days.points.empty() || memory.categories.empty()) return images;
  const bool has_finish = !finish.samples.empty();
  write_text_file_atomic(dir + "/days_vs_loss.svg", g::svg_scatter(days));
  write_text_file_atomic(dir + "/memory.svg", g::svg_stacked_bars(memory));
  if (has_finish) write_text_file_atomic(dir + "/finish_days.svg", g::svg_histogram(finish));
  std::string ext = ".svg";
#if RACKSTEP_HAVE_QT
  if (g::charts_available()) {
    g::render_scatter(days, dir + "/days_vs_loss.png");
    g::render_stacked_bars(memory, dir + "/memory.png");
    if (has_finish) g::render_histogram(finish, dir + "/finish_days.png");
    ext = ".png";
  }
#endif
  images.emplace_back(days.title, "days_vs_loss" + ext);
  images.emplace_back(memory.title, "memory" + ext);
  if (has_finish) images.emplace_back(finish.title, "finish_days" + ext);
  return images;
}

// Writes DIR/report.md, DIR/size.json and the plots; returns the report path.
std::string write_size_report(const SizeResult& r, const nlohmann::json& j, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UserError(dir, "", "a directory that can be created", ec.message());
  const std::vector<std::pair<std::string, std::string>> images = write_plots(j, dir);
  write_json_file_atomic(dir + "/size.json", j);
  const std::string md = dir + "/report.md";
  write_text_file_atomic(md, format_size_report(r, images));
  return md;
}

void progress_bar(const SizeProgress& p) {
  const int width = 30;
  const int done = static_cast<int>(width * p.index / std::max<size_t>(1, p.count));
  std::fprintf(stderr, "\r[%-*s] %zu/%zu %-10s %-24s", width, std::string(done, '#').c_str(), p.index + 1, p.count,
               p.stage.c_str(), p.candidate.c_str());
  std::fflush(stderr);
}

std::string csv_of(const nlohmann::json& j) {
  std::string out =
      "rank,name,total_params,active_params,runnable,mfu,step_time_s,tokens_per_day,days_p50,days_p90,p_finish,"
      "peak_memory_bytes,headroom_bytes,drop_fraction,forecast_loss,layout\n";
  for (const auto& c : j["candidates"]) {
    char buf[1024];
    const bool ok = c["runnable"].get<bool>();
    auto num = [&](const char* k) { return ok ? c[k].get<double>() : 0.0; };
    std::snprintf(buf, sizeof buf, "%d,%s,%.6g,%.6g,%d,%.5f,%.4f,%.6g,%.3f,%.3f,%.4f,%.6g,%.6g,%.5f,%.4f,\"%s\"\n",
                  c["rank"].get<int>(), c["name"].get<std::string>().c_str(), c["total_params"].get<double>(),
                  c["active_params"].get<double>(), ok ? 1 : 0, num("mfu"), num("step_time_s"),
                  num("tokens_per_day"), num("days_p50"), num("days_p90"), num("p_finish"),
                  num("peak_memory_bytes"), num("headroom_bytes"), num("drop_fraction"), num("forecast_loss"),
                  ok ? c["layout_summary"].get<std::string>().c_str() : c["why_not"].get<std::string>().c_str());
    out += buf;
  }
  return out;
}

// The ranked winner's model, layout, cluster, calibration and launch scripts.
void emit_winner(const SizeResult& r, const std::string& dir) {
  const CandidateResult& w = r.candidates[r.ranking.front()];
  if (!w.runnable) {
    throw UserError(r.scenario.file, "/candidates", "a runnable winner for --emit-run", w.name + ": " + w.why_not);
  }
  emit_run_docs(dir, size_candidate_docs(r.scenario, w), w.layout, w.prediction);
  std::fprintf(stderr, "size: the winner's run (%s) written to %s (launch-mpirun.sh, launch-slurm.sbatch)\n",
               w.name.c_str(), dir.c_str());
}

int run_size(const SizeArgs& a) {
  Scenario s = a.scenario.empty() ? default_scenario() : load_scenario(a.scenario);
  if (!a.rank_by.empty()) {
    s.rank_by = a.rank_by == "fastest" ? RankBy::kFastest
                                       : (a.rank_by == "highest_mfu" ? RankBy::kHighestMfu : RankBy::kLowestLoss);
  }
  if (a.min_p_finish >= 0) s.min_p_finish = a.min_p_finish;
  if (!a.stack.empty()) s.stack = a.stack == "any" ? "" : a.stack;
  if (!a.compare_stack.empty()) s.compare_stack = a.compare_stack;
  if (a.runs > 0) s.goodput_runs = a.runs;
  const bool show_progress = !a.quiet && isatty(STDERR_FILENO);
  const SizeResult r = size(s, show_progress ? std::function<void(const SizeProgress&)>(progress_bar)
                                             : std::function<void(const SizeProgress&)>());
  if (show_progress) std::fprintf(stderr, "\r%*s\r", 80, "");
  for (const auto& w : s.warnings) std::fprintf(stderr, "rackstep: warning: %s\n", w.c_str());
  const nlohmann::json j = size_result_json(r);
  if (!a.report_dir.empty()) {
    const std::string md = write_size_report(r, j, a.report_dir);
    if (!a.json && !a.csv) std::printf("report: %s\n", md.c_str());
  }
  if (!a.emit_run_dir.empty()) emit_winner(r, a.emit_run_dir);
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else if (a.csv) {
    std::printf("%s", csv_of(j).c_str());
  } else {
    std::printf("%s", format_size_table(r).c_str());
  }
  return 0;
}

cli::Registration reg{
    "size",
    "Rank candidate models against a deadline: best layout, MFU, days, P(finish), memory, drops, forecast loss",
    [](CLI::App& app) {
      auto a = std::make_shared<SizeArgs>();
      app.add_option("--scenario", a->scenario,
                     "scenario JSON (default: sim/scenarios/marin-july-2026.json, the Marin sizing decision)");
      app.add_option("--report", a->report_dir, "write a Markdown report with plots into this directory");
      app.add_option("--emit-run", a->emit_run_dir,
                     "write the winner's model, layout, cluster and calibration files and launch scripts (mpirun, "
                     "Slurm) that run it with `rackstep train --layout` into this directory");
      app.add_option("--rank-by", a->rank_by, "utility: lowest_loss (default), fastest, highest_mfu")
          ->check(CLI::IsMember({"lowest_loss", "fastest", "highest_mfu"}));
      app.add_option("--stack", a->stack,
                     "training stack whose layouts are searched (sim/stacks/NAME.json or a path; 'any' = every "
                     "layout); default: the scenario's (the default scenario: marin-july-2026)");
      app.add_option("--compare-stack", a->compare_stack,
                     "also show each candidate's best layout under this (stronger) stack, as a separate column");
      app.add_option("--min-p-finish", a->min_p_finish, "required P(finish by the deadline) for lowest_loss ranking")
          ->check(cli::number(0.0, 1.0));
      app.add_option("--runs", a->runs, "goodput Monte Carlo runs per candidate")->check(cli::count(10, 1000000));
      app.add_flag("--json", a->json, "print JSON");
      app.add_flag("--csv", a->csv, "print CSV");
      app.add_flag("--quiet", a->quiet, "no progress bar");
      return [a] { return run_size(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
