// `rackstep size [--scenario FILE]`: the main job. Sizes every candidate of a
// scenario (default: the embedded Marin July-2026 situation) and ranks them.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "models/json_io.h"
#include "sim/cli/command.h"
#include "sim/cli/flags.h"
#include "sim/emit_run.h"
#include "sim/size.h"
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

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

#if RACKSTEP_HAVE_QT
// The report's three pictures: days vs loss, memory per candidate, and the
// winner's finish-day distribution. Returns (title, file name) pairs.
std::vector<std::pair<std::string, std::string>> render_plots(const SizeResult& r, const std::string& dir) {
  namespace g = rackstep::gui;
  std::vector<std::pair<std::string, std::string>> images;
  if (!g::charts_available()) return images;
  const Scenario& s = r.scenario;
  g::ScatterSpec sc;
  sc.title = "Days to train vs forecast loss (" + s.name + ")";
  sc.x_label = "days to train (p50, with goodput losses)";
  sc.deadline_x = s.training_days_available();
  sc.deadline_label = "deadline " + s.deadline_date;
  g::StackedBarSpec mem;
  mem.title = "Device memory per GPU at the chosen layout";
  std::vector<std::pair<std::string, std::vector<double>>> parts;
  for (size_t i = 0; i < r.ranking.size(); ++i) {
    const auto& c = r.candidates[r.ranking[i]];
    if (!c.runnable) continue;
    sc.points.push_back({c.name, c.goodput.p50_days, c.forecast_loss, i == 0});
    mem.categories.push_back(c.name);
    mem.capacity = c.prediction.memory.device_capacity / kGiB;
    size_t k = 0;
    for (const auto& [name, bytes] : c.prediction.memory.lines()) {
      if (name.rfind("host", 0) == 0 || name.find("total") != std::string::npos ||
          name.find("capacity") != std::string::npos) {
        continue;
      }
      if (k >= parts.size()) parts.push_back({name, {}});
      parts[k].second.resize(mem.categories.size() - 1, 0.0);
      parts[k].second.push_back(bytes / kGiB);
      ++k;
    }
  }
  if (sc.points.empty()) return images;
  for (auto& [name, values] : parts) {
    values.resize(mem.categories.size(), 0.0);
    mem.segments.push_back({name, values});
  }
  g::render_scatter(sc, dir + "/days_vs_loss.png");
  images.emplace_back("Days to train vs forecast loss", "days_vs_loss.png");
  g::render_stacked_bars(mem, dir + "/memory.png");
  images.emplace_back("Memory breakdown per candidate", "memory.png");
  const auto& w = r.candidates[r.ranking[0]];
  if (w.runnable) {
    g::HistogramSpec h;
    h.title = "Finish-day distribution of " + w.name + " (Monte Carlo over interruptions)";
    h.x_label = "days of training to the token budget";
    h.samples = w.goodput.days;
    h.deadline_x = s.training_days_available();
    h.deadline_label = "deadline " + s.deadline_date;
    g::render_histogram(h, dir + "/finish_days.png");
    images.emplace_back("Finish-day distribution (" + w.name + ")", "finish_days.png");
  }
  return images;
}
#endif

// Writes DIR/report.md, DIR/size.json and the plots; returns the report path.
std::string write_size_report(const SizeResult& r, const nlohmann::json& j, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UserError(dir, "", "a directory that can be created", ec.message());
  std::vector<std::pair<std::string, std::string>> images;
#if RACKSTEP_HAVE_QT
  images = render_plots(r, dir);
#endif
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
