// `rackstep sweep --model M --cluster C [--tokens-per-step N] [--top N] [--explain] [--json]`:
// every valid layout predicted, ranked by step time, with the Pareto front of
// throughput vs memory headroom and (--explain) why the rest were rejected.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "sim/base/check.h"
#include "models/layer_graph.h"
#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"
#include "sim/emit_run.h"
#include "sim/stack.h"
#include "sim/sweep.h"

namespace rackstep::sim {
namespace {

struct SweepArgs {
  std::string model_path, cluster_path, calibration_path, stack_name, emit_run_dir;
  int64_t domains = 0;
  int64_t tokens_per_step = 0;
  size_t top = 10;
  int threads = 0;
  bool explain = false;
  bool json = false;
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

nlohmann::json entry_json(const SweepEntry& e) {
  nlohmann::json j = prediction_to_json(e.prediction);
  j["layout"] = layout_to_json(e.layout);
  j["headroom_bytes"] = e.headroom_bytes;
  return j;
}

void print_entry(size_t rank, const SweepEntry& e) {
  const Prediction& p = e.prediction;
  std::printf("%3zu  %8.3f s  %12.0f tok/s  MFU %5.2f%%  mem %7.2f GiB (+%6.2f)  %s\n", rank, p.step_time_s,
              p.tokens_per_s, 100.0 * p.mfu, p.memory.device_total / kGiB, e.headroom_bytes / kGiB,
              describe(e.layout).c_str());
}

void print_breakdown(const Prediction& p) {
  std::printf("      ");
  for (const auto& [name, v] : p.breakdown.lines()) {
    if (v > 0.005 * p.step_time_s) std::printf(" %s %.2f", name.c_str(), v);
  }
  std::printf("\n");
}

int run_sweep(const SweepArgs& a) {
  const models::LayerGraph g = models::build_layer_graph(models::load_model(a.model_path));
  const topologies::Cluster c = topologies::load_cluster(a.cluster_path, a.domains);
  if (a.tokens_per_step < 0 || (a.tokens_per_step > 0 && a.tokens_per_step % g.model.seq_len != 0)) {
    throw UserError("--tokens-per-step: expected a positive multiple of the sequence length (" +
                    std::to_string(g.model.seq_len) + "), found " + std::to_string(a.tokens_per_step));
  }
  const CommandCalibration under = command_calibration(a.stack_name, a.calibration_path);
  const Stack& stack = under.stack;
  const Calibration& cal = under.cal;
  const Predictor p(g, c, cal);
  const auto t0 = std::chrono::steady_clock::now();
  const SweepResult r = sweep(p, {.tokens_per_step = a.tokens_per_step,
                                  .top = a.top,
                                  .threads = a.threads,
                                  .stack = a.stack_name.empty() ? nullptr : &stack});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.emit_run_dir.empty() && !r.top.empty()) {
    emit_run(a.emit_run_dir, {a.model_path, a.cluster_path, a.calibration_path}, r.top.front().layout,
             r.top.front().prediction);
    std::fprintf(stderr, "sweep: the fastest layout's run written to %s (launch-mpirun.sh, launch-slurm.sbatch)\n",
                 a.emit_run_dir.c_str());
  }

  if (a.json) {
    nlohmann::json j;
    j["model"] = g.model.name;
    j["cluster"] = c.name;
    j["gpus"] = c.gpus();
    j["enumerated"] = r.enumerated;
    j["valid"] = r.valid;
    j["seconds"] = secs;
    j["threads"] = r.threads_used;
    nlohmann::json rej = nlohmann::json::object();
    for (size_t i = 0; i < r.rejected.size(); ++i) {
      if (r.rejected[i] == 0) continue;
      rej[to_string(static_cast<Reason>(i))] = {{"count", r.rejected[i]}, {"example", r.example[i]}};
    }
    j["rejected"] = rej;
    j["top"] = nlohmann::json::array();
    for (const auto& e : r.top) j["top"].push_back(entry_json(e));
    j["pareto"] = nlohmann::json::array();
    for (const auto& e : r.pareto) j["pareto"].push_back(entry_json(e));
    std::printf("%s\n", j.dump(2).c_str());
    return r.valid > 0 ? 0 : 2;
  }
  std::printf("%s on %s (%lld GPUs): %lld layouts, %lld valid, %.2f s on %d threads\n", g.model.name.c_str(),
              c.name.c_str(), static_cast<long long>(c.gpus()), static_cast<long long>(r.enumerated),
              static_cast<long long>(r.valid), secs, r.threads_used);
  const auto print_reasons = [&] {
    for (size_t i = 0; i < r.rejected.size(); ++i) {
      if (r.rejected[i] == 0) continue;
      std::printf("  %-22s %10lld   e.g. %s\n", to_string(static_cast<Reason>(i)),
                  static_cast<long long>(r.rejected[i]), r.example[i].c_str());
    }
  };
  if (r.valid == 0) {
    std::printf("no valid layout: every candidate was rejected:\n");
    print_reasons();
    return 2;
  }
  std::printf("\nfastest %zu:\n", r.top.size());
  for (size_t i = 0; i < r.top.size(); ++i) {
    print_entry(i + 1, r.top[i]);
    print_breakdown(r.top[i].prediction);
  }
  std::printf("\nPareto front (throughput vs HBM headroom):\n");
  for (size_t i = 0; i < r.pareto.size(); ++i) print_entry(i + 1, r.pareto[i]);
  if (a.explain) {
    std::printf("\nrejected, by reason:\n");
    print_reasons();
  }
  return 0;
}

rackstep::cli::Registration reg{
    "sweep", "Search layouts of a model on a cluster: fastest, Pareto front, rejections",
    [](CLI::App& app) {
      auto a = std::make_shared<SweepArgs>();
      app.add_option("--model", a->model_path, "model JSON")->required();
      app.add_option("--cluster", a->cluster_path, "cluster or system JSON")->required();
      app.add_option("--domains", a->domains, "override the cluster's domain count")->check(cli::count(1, 10000));
      app.add_option("--tokens-per-step", a->tokens_per_step, "global batch in tokens (default: the recipe's)")
          ->check(cli::count(1, int64_t{1} << 28));  // the sweep's time grows with it: ~6 s per thread at 2^28
      app.add_option("--top", a->top, "how many layouts to show (default 10)")->check(cli::count(1, 100000));
      app.add_option("--threads", a->threads, "worker threads (default: all cores)")->check(cli::count(1, 1024));
      app.add_option("--calibration", a->calibration_path, "calibration JSON");
      app.add_option("--stack", a->stack_name,
                     "training stack (sim/stacks/NAME.json or a path): propose only layouts it runs, priced with "
                     "its overheads");
      app.add_option("--emit-run", a->emit_run_dir,
                     "write the fastest layout's model, layout, cluster, calibration and mpirun / Slurm launch "
                     "scripts into this directory");
      app.add_flag("--explain", a->explain, "count rejected layouts per reason, with an example each");
      app.add_flag("--json", a->json, "print JSON");
      return [a] { return run_sweep(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
