// `rackstep timeline`: simulate training steps event by event and write a
// Chrome trace (Perfetto / chrome://tracing), with a summary beside the
// analytic prediction for the same layout.
//
//   rackstep timeline --model models/zoo/marin-535b-a23b.json
//                     --cluster topologies/zoo/gb200-11-racks.json
//                     --layout sim/layouts/hero-ragged.json [--steps 2] -o trace.json
//                     [--no-contention] [--fabric-oversubscription 4] [--checkpoint-every 2]
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "models/check.h"
#include "models/layer_graph.h"
#include "sim/calibration.h"
#include "sim/cli/command.h"
#include "sim/des.h"
#include "sim/predict.h"
#include "sim/step_graph.h"
#include "sim/trace.h"
#include "topologies/topology.h"

namespace rackstep::sim {
namespace {

struct TimelineArgs {
  std::string model_path, cluster_path, layout_path, calibration_path, out;
  int64_t domains = 0;
  StepGraphOptions graph;
  RunOptions run;
  bool no_gc = false;
  bool json = false;
};

nlohmann::json summary_json(const Engine& e, const StepSummary& s, const StepGraph& sg, const RunResult& r,
                            double build_s, double run_s) {
  nlohmann::json j;
  const double steps = static_cast<double>(sg.step_end.size());
  j["makespan_s"] = s.makespan_s;
  j["step_time_s"] = s.makespan_s / steps;
  j["predicted_step_time_s"] = sg.prediction.step_time_s;
  j["des_vs_predicted"] = s.makespan_s / steps / sg.prediction.step_time_s - 1.0;
  j["compute_busy_s"] = s.compute_busy_s;
  j["bubble_s"] = s.bubble_s;
  j["bubble_fraction"] = s.bubble_fraction;
  j["exposed_s_by_kind"] = s.exposed_s_by_kind;
  j["critical_path_s_by_category"] = s.critical_path_s_by_category;
  j["critical_path_tasks"] = s.critical_path.size();
  j["critical_path_s_by_class"] = s.critical_path_s_by_class;
  j["critical_path_contention_s"] = s.critical_path_contention_s;
  j["critical_path_contention_s_by_category"] = s.critical_path_contention_s_by_category;
  j["tasks"] = e.num_tasks();
  j["events"] = r.events;
  j["processes"] = e.num_processes();
  j["micro_batches"] = sg.micro_batches;
  j["stages"] = sg.stages;
  j["build_s"] = build_s;
  j["simulate_s"] = run_s;
  return j;
}

int run_timeline(TimelineArgs a) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const models::LayerGraph g = models::build_layer_graph(models::load_model(a.model_path));
  const topologies::Cluster c = topologies::load_cluster(a.cluster_path, a.domains);
  const Layout l = load_layout(a.layout_path);
  const Calibration cal = a.calibration_path.empty() ? load_calibration() : load_calibration(a.calibration_path);
  const Predictor pred(g, c, cal);
  a.graph.gc_stalls = !a.no_gc;
  StepGraph sg = build_step_graph(pred, l, a.graph);
  const auto t1 = clock::now();
  RunResult r;
  try {
    r = sg.engine.run(a.run);
  } catch (const UserError& e) {
    // A schedule that cannot run: name the layout and schedule, keep the engine's first offending dependency.
    throw UserError("timeline: layout '" + l.name + "' (" + to_string(l.schedule) + ") cannot run: " + e.what());
  }
  const auto t2 = clock::now();
  const StepSummary s = summarize(sg.engine, r);
  if (!a.out.empty()) {
    TraceWriter w;
    w.metadata("model", g.model.name);
    w.metadata("layout", describe(l));
    w.metadata("predicted_step_time_s", sg.prediction.step_time_s);
    export_trace(sg.engine, r, w);
    w.write(a.out);
  }
  const double build_s = std::chrono::duration<double>(t1 - t0).count();
  const double run_s = std::chrono::duration<double>(t2 - t1).count();
  if (a.json) {
    nlohmann::json j = summary_json(sg.engine, s, sg, r, build_s, run_s);
    if (!a.out.empty()) j["trace"] = a.out;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  const double steps = static_cast<double>(sg.step_end.size());
  std::printf("timeline: %s | %s\n", g.model.name.c_str(), describe(l).c_str());
  std::printf("  %lld GPUs simulated as %d processes, %lld micro-batches x %lld stages, %lld tasks, %llu events\n",
              static_cast<long long>(l.gpus()), sg.engine.num_processes(),
              static_cast<long long>(sg.micro_batches), static_cast<long long>(sg.stages),
              static_cast<long long>(sg.engine.num_tasks()), static_cast<unsigned long long>(r.events));
  std::printf("  step time: DES %.4f s, analytic %.4f s (%+.2f%%)\n", s.makespan_s / steps,
              sg.prediction.step_time_s, 100.0 * (s.makespan_s / steps / sg.prediction.step_time_s - 1.0));
  for (const auto& issue : sg.prediction.issues) std::printf("  note: %s\n", issue.detail.c_str());
  std::fputs(format_summary(sg.engine, s).c_str(), stdout);
  std::printf("  built in %.4f s, simulated in %.4f s\n", build_s, run_s);
  if (!a.out.empty()) std::printf("trace written to %s\n", a.out.c_str());
  return 0;
}

rackstep::cli::Registration reg{
    "timeline", "Simulate training steps event by event; write a Chrome trace and a summary",
    [](CLI::App& app) {
      auto a = std::make_shared<TimelineArgs>();
      app.add_option("--model", a->model_path, "model JSON (models/zoo/*.json)")->required();
      app.add_option("--cluster", a->cluster_path, "cluster or system JSON (topologies/zoo/*.json)")->required();
      app.add_option("--layout", a->layout_path, "layout JSON (sim/layouts/*.json)")->required();
      app.add_option("--domains", a->domains, "override the cluster's domain (rack / node) count");
      app.add_option("--calibration", a->calibration_path, "calibration JSON (default sim/calibration.json)");
      app.add_option("--steps", a->graph.steps, "training steps to simulate (default 1)");
      app.add_option("--ranks-per-stage", a->graph.ranks_per_stage,
                     "explicit data ranks per pipeline stage (default 1: full symmetry)");
      app.add_option("--seed", a->run.seed, "seed for jitter and stragglers");
      app.add_option("--jitter", a->run.jitter_sigma, "lognormal sigma of per-kernel time (default 0)");
      app.add_option("--straggler-prob", a->run.straggler_probability, "chance a kernel straggles");
      app.add_option("--straggler-slowdown", a->run.straggler_slowdown, "how much slower a straggler is");
      app.add_flag("--no-gc", a->no_gc, "leave out garbage-collection pauses");
      app.add_flag("!--no-contention", a->graph.contention,
                   "give every comm stream links of its own (the analytic model's view)");
      app.add_option("--fabric-oversubscription", a->graph.fabric_oversubscription,
                     "scale-out fabric carries GPUs x NIC bandwidth / this (default 1: non-blocking)");
      app.add_option("--checkpoint-every", a->graph.checkpoint_every,
                     "steps between checkpoint saves; step k saves when k % N == 0 (default 0: none)");
      app.add_option("-o,--output", a->out, "Chrome trace JSON to write (atomic)");
      app.add_flag("--json", a->json, "print the summary as JSON");
      return [a] { return run_timeline(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
