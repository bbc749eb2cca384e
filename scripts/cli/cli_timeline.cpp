// `rackstep timeline`: simulate training steps event by event and write a
// Chrome trace (Perfetto / chrome://tracing), with a summary beside the
// analytic prediction for the same layout.
//
//   rackstep timeline --model models/zoo/marin-535b-a23b.json
//                     --cluster topologies/zoo/gb200-11-racks.json
//                     --layout sim/layouts/hero-ragged.json [--steps 2] -o trace.json
//                     [--no-contention] [--fabric-oversubscription 4] [--checkpoint-every 2]
//                     [--stack megatron-bridge-2025]
//
// --stack prices and schedules the step as `predict --stack` does: the stack's
// calibration overrides (host issue of an eager trainer, its GC, bucketing, ...)
// and the features of the layout it cannot run, printed as notes.
//
// What-if questions (every GPU explicit: --ranks-per-stage = GPUs per stage):
//   --slow-gpu 17:1.3 --degraded-nic 40:4 --failed-nic 5 --rack-healthy 3:60
//   --expert-load 1.4,1,1,1 --jitter 0.05 --sweep slow-gpu-factor=1,1.1,1.5,2
// print what changed against the same step without them: step time, the
// ranks and resources on the critical path, and how long each rank waited
// for whom.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "sim/base/check.h"
#include "models/layer_graph.h"
#include "sim/calibration.h"
#include "scripts/cli/command.h"
#include "scripts/cli/flags.h"
#include "sim/des.h"
#include "sim/expert_load.h"
#include "sim/predict.h"
#include "sim/stack.h"
#include "sim/step_graph.h"
#include "sim/base/trace.h"
#include "topologies/topology.h"

namespace rackstep::sim {
namespace {

struct TimelineArgs {
  std::string model_path, cluster_path, layout_path, calibration_path, stack_name, out;
  int64_t domains = 0;
  StepGraphOptions graph;
  RunOptions run;
  bool no_gc = false;
  bool json = false;
  // What-if questions, as given: "rank:factor".
  std::vector<std::string> slow_gpus, degraded_nvlinks, degraded_nics, rack_healthy;
  std::string expert_load, sweep;
  double max_memory_gb = 0;  // 0: three quarters of this machine's memory
  int64_t max_arrows = 200000;
};

constexpr int64_t kMaxSteps = 1000;
// Peak bytes per task of the symmetric one-rank graph, per explicit rank:
// build + run + summary, and a trace on top. Measured on the explicit hero
// (704 and 8,192 GPUs: 180-200 bytes per task, peak RSS in
// bench/des_bench.cpp BM_ExplicitStep; a trace adds ~520) with the explicit
// graph's extra end-of-collective tasks (x1.55), rounded up.
constexpr double kRunBytesPerTask = 300;
constexpr double kTraceBytesPerTask = 900;

[[noreturn]] void bad_flag(const std::string& flag, const std::string& expected, const std::string& found) {
  throw UserError("timeline: " + flag + ": expected " + expected + ", found '" + found + "'");
}

void check_real(const std::string& flag, double v, double lo, double hi) {
  if (!std::isfinite(v)) bad_flag(flag, "a finite number (NaN and inf are refused)", std::to_string(v));
  if (v < lo || v > hi) {
    std::ostringstream e;
    e << "a number in [" << lo << ", " << hi << "]";
    bad_flag(flag, e.str(), std::to_string(v));
  }
}

double parse_real(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    bad_flag(flag, "a number", text);
  }
  if (used != text.size()) bad_flag(flag, "a number", text);
  return v;
}

int64_t parse_int(const std::string& flag, const std::string& text) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    bad_flag(flag, "an integer", text);
  }
  if (used != text.size()) bad_flag(flag, "an integer", text);
  return v;
}

struct RankFactor {
  int64_t rank;
  double factor;
};

// "rank:factor", the rank in [0, ranks), the factor finite in [lo, hi].
RankFactor parse_rank_factor(const std::string& flag, const std::string& text, int64_t ranks, double lo, double hi) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) bad_flag(flag, "rank:factor", text);
  RankFactor rf{parse_int(flag, text.substr(0, colon)), parse_real(flag, text.substr(colon + 1))};
  if (rf.rank < 0 || rf.rank >= ranks) bad_flag(flag, "a rank in 0.." + std::to_string(ranks - 1), text);
  check_real(flag, rf.factor, lo, hi);
  return rf;
}

std::vector<double> parse_list(const std::string& flag, const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(parse_real(flag, item));
  if (out.empty()) bad_flag(flag, "a comma-separated list of numbers", text);
  return out;
}

void validate(const TimelineArgs& a) {
  if (a.domains < 0) bad_flag("--domains", "a count >= 1 (0 or absent: the cluster's own)", std::to_string(a.domains));
  if (a.graph.steps < 1 || a.graph.steps > kMaxSteps) {
    bad_flag("--steps", "at least 1 and at most " + std::to_string(kMaxSteps), std::to_string(a.graph.steps));
  }
  if (a.graph.ranks_per_stage < 1) bad_flag("--ranks-per-stage", "a count >= 1", std::to_string(a.graph.ranks_per_stage));
  if (a.graph.checkpoint_every < 0) bad_flag("--checkpoint-every", "a count >= 0", std::to_string(a.graph.checkpoint_every));
  check_real("--jitter", a.run.jitter_sigma, 0.0, 2.0);
  check_real("--straggler-prob", a.run.straggler_probability, 0.0, 1.0);
  check_real("--straggler-slowdown", a.run.straggler_slowdown, 1.0, 1000.0);
  check_real("--fabric-oversubscription", a.graph.fabric_oversubscription, 1.0, 1e6);
  check_real("--max-memory-gb", a.max_memory_gb, 0.0, 1e6);
  if (a.max_arrows < 0) bad_flag("--max-arrows", "a count >= 0", std::to_string(a.max_arrows));
}

double machine_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 8e9;
}

// The library names StepGraphOptions' fields; this command's user typed flags.
StepGraph build_graph(const Predictor& pred, const Layout& l, const StepGraphOptions& o) {
  return rackstep::cli::flag_names({{"steps", "--steps"},
                                    {"ranks_per_stage", "--ranks-per-stage"},
                                    {"fabric_oversubscription", "--fabric-oversubscription"},
                                    {"checkpoint_every", "--checkpoint-every"},
                                    {"expert_load", "--expert-load"},
                                    {"failed_nics", "--failed-nic"}},
                                   [&] { return build_step_graph(pred, l, o); });
}

// Refuses a graph that would not fit before building it: the symmetric graph
// of one step (cheap) times the explicit ranks and steps.
void check_memory(const Predictor& pred, const Layout& l, const TimelineArgs& a) {
  StepGraphOptions one = a.graph;
  one.steps = 1;
  one.ranks_per_stage = 1;
  one.failed_nics.clear();
  const double tasks = static_cast<double>(build_graph(pred, l, one).engine.num_tasks()) *
                       static_cast<double>(a.graph.ranks_per_stage) * static_cast<double>(a.graph.steps);
  const double per_task = kRunBytesPerTask + (a.out.empty() ? 0.0 : kTraceBytesPerTask);
  const double need = tasks * per_task;
  const double limit = a.max_memory_gb > 0 ? a.max_memory_gb * 1e9 : 0.75 * machine_memory_bytes();
  if (need <= limit) return;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "timeline: an estimated %.1f GB (%.3g tasks: %lld ranks per stage x %lld steps%s) exceeds the "
                "%.1f GB limit; use fewer --ranks-per-stage or --steps%s, or raise --max-memory-gb",
                need / 1e9, tasks, static_cast<long long>(a.graph.ranks_per_stage),
                static_cast<long long>(a.graph.steps), a.out.empty() ? "" : ", with a trace",
                limit / 1e9, a.out.empty() ? "" : ", leave out -o");
  throw UserError(buf);
}

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

// ------------------------------------------------------------ what-if

struct WhatIf {
  bool any_run = false;    // run-time changes: slow GPUs, degraded links, jitter, stragglers
  bool any_graph = false;  // graph changes: failed NICs, expert load
  std::vector<std::string> lines;  // what was asked, for the summary
};

// Ranks are the GPU processes, stage-major (the first stages x ranks_per_stage processes).
int64_t gpu_ranks(const StepGraph& sg, const TimelineArgs& a) { return sg.stages * a.graph.ranks_per_stage; }

ResourceId find_resource(const Engine& e, int process, ResourceKind kind) {
  for (int64_t i = 0; i < e.num_resources(); ++i) {
    const ResourceId id{static_cast<int32_t>(i)};
    if (e.resource_process(id) == process && e.resource_kind(id) == kind) return id;
  }
  return {};
}

// Turns the rank:factor options into run options on this graph.
RunOptions what_if_run(const StepGraph& sg, const TimelineArgs& a, const topologies::Cluster& c, WhatIf& w) {
  RunOptions o = a.run;
  const int64_t ranks = gpu_ranks(sg, a);
  const Engine& e = sg.engine;
  for (const std::string& t : a.slow_gpus) {
    const RankFactor rf = parse_rank_factor("--slow-gpu", t, ranks, 1.0, 1000.0);
    o.slow_processes.emplace_back(static_cast<int>(rf.rank), rf.factor);
    w.lines.push_back("GPU rank " + std::to_string(rf.rank) + " computes " + std::to_string(rf.factor) + "x slower");
  }
  auto degrade = [&](const std::vector<std::string>& specs, const char* flag, ResourceKind kind, const char* what) {
    for (const std::string& t : specs) {
      const RankFactor rf = parse_rank_factor(flag, t, ranks, 1.0, 1e6);
      const ResourceId l = find_resource(e, static_cast<int>(rf.rank), kind);
      if (!l.valid()) bad_flag(flag, std::string("a rank with a ") + what, t);
      o.slow_links.emplace_back(l, rf.factor);
      w.lines.push_back(std::string(what) + " of rank " + std::to_string(rf.rank) + " at 1/" +
                        std::to_string(rf.factor) + " of its bandwidth");
    }
  };
  degrade(a.degraded_nvlinks, "--degraded-nvlink", ResourceKind::kNvlinkPort, "NVLink port");
  degrade(a.degraded_nics, "--degraded-nic", ResourceKind::kNic, "NIC");
  // A rack with fewer healthy GPUs: its work spreads over the healthy ones,
  // so each of its GPUs computes gpus_per_rack / healthy times as long.
  for (const std::string& t : a.rack_healthy) {
    const size_t colon = t.find(':');
    if (colon == std::string::npos) bad_flag("--rack-healthy", "rack:healthy_gpus", t);
    const int64_t rack = parse_int("--rack-healthy", t.substr(0, colon));
    const int64_t healthy = parse_int("--rack-healthy", t.substr(colon + 1));
    const int64_t per_rack = c.gpus_per_domain;
    if (rack < 0 || rack >= c.domains) bad_flag("--rack-healthy", "a rack in 0.." + std::to_string(c.domains - 1), t);
    if (healthy < 1 || healthy > per_rack) {
      bad_flag("--rack-healthy", "healthy GPUs in 1.." + std::to_string(per_rack), t);
    }
    if (e.process_multiplicity(0) != 1) {
      bad_flag("--rack-healthy", "every GPU explicit (--ranks-per-stage = GPUs per stage)", t);
    }
    const double f = static_cast<double>(per_rack) / static_cast<double>(healthy);
    for (int64_t g = rack * per_rack; g < (rack + 1) * per_rack && g < ranks; ++g) {
      o.slow_processes.emplace_back(static_cast<int>(g), f);
    }
    w.lines.push_back("rack " + std::to_string(rack) + " runs on " + std::to_string(healthy) + " of " +
                      std::to_string(per_rack) + " GPUs (each " + std::to_string(f) + "x the work)");
  }
  for (auto [p, f] : o.slow_processes) {
    if (e.process_multiplicity(p) > 1) {
      w.lines.push_back("note: rank " + std::to_string(p) + " stands for " +
                        std::to_string(e.process_multiplicity(p)) +
                        " GPUs (--ranks-per-stage = GPUs per stage makes one GPU one rank)");
    }
  }
  if (o.jitter_sigma > 0) w.lines.push_back("kernel jitter sigma " + std::to_string(o.jitter_sigma));
  if (o.straggler_probability > 0) {
    w.lines.push_back("stragglers: p " + std::to_string(o.straggler_probability) + ", x" +
                      std::to_string(o.straggler_slowdown));
  }
  w.any_run = !o.slow_processes.empty() || !o.slow_links.empty() || o.jitter_sigma > 0 ||
              o.straggler_probability > 0;
  return o;
}

// The processes that hold the critical path longest, and its resources.
nlohmann::json critical_by(const Engine& e, const RunResult& r, bool by_process, size_t top) {
  std::map<int, double> s;
  for (TaskId t : r.critical_path) {
    const ResourceId h = e.task_home(t);
    s[by_process ? e.resource_process(h) : h.v] += r.end_s[t.v] - r.start_s[t.v];
  }
  std::vector<std::pair<double, int>> v;
  for (auto [k, x] : s) v.emplace_back(x, k);
  std::sort(v.begin(), v.end(), [](auto& x, auto& y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
  if (v.size() > top) v.resize(top);
  nlohmann::json out = nlohmann::json::array();
  for (auto [x, k] : v) {
    const std::string name = by_process ? e.process_name(k)
                                        : e.process_name(e.resource_process({k})) + "/" + e.resource_name({k});
    out.push_back({{"name", name}, {"critical_s", x}});
  }
  return out;
}

nlohmann::json waits_json(const Engine& e, const RunResult& r, size_t top) {
  std::vector<RankWait> w = compute_waits(e, r);
  std::sort(w.begin(), w.end(), [](const RankWait& x, const RankWait& y) {
    return x.wait_s != y.wait_s ? x.wait_s > y.wait_s : x.process < y.process;
  });
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < w.size() && i < top && w[i].wait_s > 0; ++i) {
    std::vector<std::pair<double, std::string>> by;
    for (const auto& [who, x] : w[i].wait_s_by_cause) by.emplace_back(x, who);
    std::sort(by.begin(), by.end(), [](auto& x, auto& y) { return x.first > y.first; });
    nlohmann::json whom = nlohmann::json::array();
    for (size_t k = 0; k < by.size() && k < 3; ++k) whom.push_back({{"for", by[k].second}, {"wait_s", by[k].first}});
    out.push_back({{"rank", e.process_name(w[i].process)}, {"wait_s", w[i].wait_s}, {"waited_for", whom}});
  }
  return out;
}

nlohmann::json what_changed(const Engine& e, const RunResult& base, const RunResult& now, double steps) {
  nlohmann::json j;
  j["step_time_s"] = now.makespan_s / steps;
  j["baseline_step_time_s"] = base.makespan_s / steps;
  j["change"] = now.makespan_s / base.makespan_s - 1.0;
  j["critical_ranks"] = critical_by(e, now, true, 5);
  j["critical_resources"] = critical_by(e, now, false, 5);
  j["baseline_critical_ranks"] = critical_by(e, base, true, 5);
  j["waits"] = waits_json(e, now, 8);
  return j;
}

void print_what_changed(const nlohmann::json& j, const WhatIf& w) {
  std::printf("what-if:\n");
  for (const std::string& l : w.lines) std::printf("  %s\n", l.c_str());
  std::printf("  step time %.4f s against %.4f s without it (%+.2f%%)\n", j["step_time_s"].get<double>(),
              j["baseline_step_time_s"].get<double>(), 100.0 * j["change"].get<double>());
  std::printf("  critical path by rank (time on it):");
  for (const auto& x : j["critical_ranks"]) {
    std::printf(" %s %.4f s;", x["name"].get<std::string>().c_str(), x["critical_s"].get<double>());
  }
  std::printf("\n  critical path by resource:");
  for (const auto& x : j["critical_resources"]) {
    std::printf(" %s %.4f s;", x["name"].get<std::string>().c_str(), x["critical_s"].get<double>());
  }
  std::printf("\n  compute-stream waits, longest first (rank: total, waited for):\n");
  for (const auto& x : j["waits"]) {
    std::printf("    %-22s %9.4f s:", x["rank"].get<std::string>().c_str(), x["wait_s"].get<double>());
    for (const auto& y : x["waited_for"]) {
      std::printf(" %s %.4f s;", y["for"].get<std::string>().c_str(), y["wait_s"].get<double>());
    }
    std::printf("\n");
  }
}

// --sweep knob=v1,v2,...: the step time against one run-time knob, the
// graph built once.
nlohmann::json run_sweep(const StepGraph& sg, const TimelineArgs& a, const RunOptions& base) {
  const size_t eq = a.sweep.find('=');
  if (eq == std::string::npos) bad_flag("--sweep", "knob=v1,v2,... (slow-gpu-factor, jitter, straggler-prob)", a.sweep);
  const std::string knob = a.sweep.substr(0, eq);
  const std::vector<double> values = parse_list("--sweep", a.sweep.substr(eq + 1));
  if (values.size() > 1000) bad_flag("--sweep", "at most 1000 values", std::to_string(values.size()));
  nlohmann::json rows = nlohmann::json::array();
  const double steps = static_cast<double>(sg.step_end.size());
  for (double v : values) {
    RunOptions o = base;
    if (knob == "slow-gpu-factor") {
      check_real("--sweep slow-gpu-factor", v, 1.0, 1000.0);
      if (o.slow_processes.empty()) o.slow_processes.emplace_back(0, v);  // rank 0 unless --slow-gpu names one
      for (auto& [p, f] : o.slow_processes) f = v;
    } else if (knob == "jitter") {
      check_real("--sweep jitter", v, 0.0, 2.0);
      o.jitter_sigma = v;
    } else if (knob == "straggler-prob") {
      check_real("--sweep straggler-prob", v, 0.0, 1.0);
      o.straggler_probability = v;
    } else if (knob == "nic-factor" || knob == "nvlink-factor") {
      check_real("--sweep " + knob, v, 1.0, 1e6);
      const bool nic = knob == "nic-factor";
      if (o.slow_links.empty()) {
        o.slow_links.emplace_back(find_resource(sg.engine, 0, nic ? ResourceKind::kNic : ResourceKind::kNvlinkPort), v);
        if (!o.slow_links.back().first.valid()) bad_flag("--sweep", "a cluster with that link", a.sweep);
      }
      for (auto& [l, f] : o.slow_links) f = v;
    } else {
      bad_flag("--sweep", "a knob among slow-gpu-factor, jitter, straggler-prob, nic-factor, nvlink-factor", knob);
    }
    const RunResult r = sg.engine.run(o);
    rows.push_back({{knob, v}, {"step_time_s", r.makespan_s / steps}});
  }
  return rows;
}

int run_timeline(TimelineArgs a) {
  validate(a);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const models::LayerGraph g = models::build_layer_graph(models::load_model(a.model_path));
  const topologies::Cluster c = topologies::load_cluster(a.cluster_path, a.domains);
  const Layout l = load_layout(a.layout_path);
  // As `predict --stack`: the stack's overrides merged over --calibration (or sim/calibration.json).
  const CommandCalibration under = command_calibration(a.stack_name, a.calibration_path);
  const Stack& stack = under.stack;
  const Calibration& cal = under.cal;
  const Predictor pred(g, c, cal);
  a.graph.gc_stalls = !a.no_gc;
  if (a.expert_load == "routing") {
    const ExpertLoad load = expert_load_for_layout(g.model, l, {.samples = 8});
    a.graph.expert_load = load.rank_sorted;
    char line[160];
    std::snprintf(line, sizeof line, "%.3f", load.max_over_mean);
    a.expert_load = "from the drop model's routing (busiest EP rank " + std::string(line) + "x the mean)";
  } else if (!a.expert_load.empty()) {
    a.graph.expert_load = parse_list("--expert-load", a.expert_load);
  }
  check_memory(pred, l, a);
  StepGraph sg = build_graph(pred, l, a.graph);
  if (!a.stack_name.empty()) {
    for (LayoutIssue& i : check_stack(l, stack)) sg.prediction.issues.push_back(std::move(i));
  }
  WhatIf w;
  const RunOptions what_if = what_if_run(sg, a, c, w);
  w.any_graph = !a.graph.failed_nics.empty() || !a.graph.expert_load.empty();
  for (int64_t f : a.graph.failed_nics) {
    w.lines.push_back("NIC of rank " + std::to_string(f) + " failed: its traffic leaves through the next rank's");
  }
  if (!a.graph.expert_load.empty()) w.lines.push_back("expert load per rank: " + a.expert_load);
  const auto t1 = clock::now();
  auto simulate = [&](const Engine& e, const RunOptions& o) {
    try {
      return e.run(o);
    } catch (const UserError& err) {
      // A schedule that cannot run: name the layout and schedule, keep the engine's first offending dependency.
      throw UserError("timeline: layout '" + l.name + "' (" + to_string(l.schedule) + ") cannot run: " + err.what());
    }
  };
  const RunResult r = simulate(sg.engine, what_if);
  const auto t2 = clock::now();
  const double steps = static_cast<double>(sg.step_end.size());
  nlohmann::json changed;
  if (w.any_run || w.any_graph) {
    // The same step without the what-ifs: the graph again only when they changed it.
    RunResult base;
    if (w.any_graph) {
      StepGraphOptions plain = a.graph;
      plain.failed_nics.clear();
      plain.expert_load.clear();
      base = simulate(build_graph(pred, l, plain).engine, RunOptions{});
    } else {
      base = simulate(sg.engine, RunOptions{});
    }
    changed = what_changed(sg.engine, base, r, steps);
  }
  nlohmann::json sweep;
  if (!a.sweep.empty()) sweep = run_sweep(sg, a, what_if);
  const StepSummary s = summarize(sg.engine, r);
  TraceStats ts;
  if (!a.out.empty()) {
    TraceWriter tw;
    tw.metadata("model", g.model.name);
    tw.metadata("layout", describe(l));
    tw.metadata("predicted_step_time_s", sg.prediction.step_time_s);
    TraceOptions topts;
    topts.max_flows = a.max_arrows;
    ts = export_trace(sg.engine, r, tw, topts);
    tw.write(a.out);
  }
  const double build_s = std::chrono::duration<double>(t1 - t0).count();
  const double run_s = std::chrono::duration<double>(t2 - t1).count();
  if (ts.arrows_left_out > 0) {
    std::fprintf(stderr, "timeline: %lld of %lld dependency arrows left out of the trace (--max-arrows %lld)\n",
                 static_cast<long long>(ts.arrows_left_out), static_cast<long long>(ts.arrows + ts.arrows_left_out),
                 static_cast<long long>(a.max_arrows));
  }
  if (a.json) {
    nlohmann::json j = summary_json(sg.engine, s, sg, r, build_s, run_s);
    if (!a.stack_name.empty()) {
      // As predict's JSON: the stack's name and every reason the layout cannot run as given.
      j["stack"] = stack.name;
      nlohmann::json issues = nlohmann::json::array();
      for (const auto& i : sg.prediction.issues) issues.push_back({{"reason", to_string(i.reason)}, {"detail", i.detail}});
      j["issues"] = issues;
    }
    if (!changed.is_null()) {
      j["what_if"] = changed;
      j["what_if"]["asked"] = w.lines;
    }
    if (!sweep.is_null()) j["sweep"] = sweep;
    if (!a.out.empty()) {
      j["trace"] = a.out;
      j["trace_arrows"] = ts.arrows;
      j["trace_arrows_left_out"] = ts.arrows_left_out;
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("timeline: %s | %s\n", g.model.name.c_str(), describe(l).c_str());
  if (!a.stack_name.empty()) std::printf("stack: %s (%s)\n", stack.name.c_str(), stack.file.c_str());
  std::printf("  %lld GPUs simulated as %d processes, %lld micro-batches x %lld stages, %lld tasks, %llu events\n",
              static_cast<long long>(l.gpus()), sg.engine.num_processes(),
              static_cast<long long>(sg.micro_batches), static_cast<long long>(sg.stages),
              static_cast<long long>(sg.engine.num_tasks()), static_cast<unsigned long long>(r.events));
  std::printf("  step time: DES %.4f s, analytic %.4f s (%+.2f%%)\n", s.makespan_s / steps,
              sg.prediction.step_time_s, 100.0 * (s.makespan_s / steps / sg.prediction.step_time_s - 1.0));
  for (const auto& i : sg.prediction.issues) std::printf("  not runnable: %s (%s)\n", to_string(i.reason), i.detail.c_str());
  std::fputs(format_summary(sg.engine, s).c_str(), stdout);
  if (!changed.is_null()) print_what_changed(changed, w);
  if (!sweep.is_null()) {
    const std::string knob = a.sweep.substr(0, a.sweep.find('='));
    std::printf("sweep %s:\n  %-16s %14s\n", knob.c_str(), knob.c_str(), "step time (s)");
    for (const auto& row : sweep) std::printf("  %-16g %14.6f\n", row[knob].get<double>(), row["step_time_s"].get<double>());
  }
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
      app.add_option("--stack", a->stack_name,
                     "training stack (sim/stacks/NAME.json or a path): its overrides of the calibration, and "
                     "what of the layout it cannot run");
      app.add_option("--steps", a->graph.steps, "training steps to simulate (default 1, at most 1000)");
      app.add_option("--ranks-per-stage", a->graph.ranks_per_stage,
                     "explicit data ranks per pipeline stage (default 1: full symmetry)");
      app.add_option("--seed", a->run.seed, "seed for jitter and stragglers");
      app.add_option("--jitter", a->run.jitter_sigma, "lognormal sigma of per-kernel time (default 0, at most 2)");
      app.add_option("--straggler-prob", a->run.straggler_probability, "chance a kernel straggles, in [0, 1]");
      app.add_option("--straggler-slowdown", a->run.straggler_slowdown,
                     "how much slower a straggler is (>= 1, default 1)");
      app.add_flag("--no-gc", a->no_gc, "leave out garbage-collection pauses");
      app.add_flag("!--no-contention", a->graph.contention,
                   "give every comm stream links of its own (the analytic model's view)");
      app.add_option("--fabric-oversubscription", a->graph.fabric_oversubscription,
                     "scale-out fabric carries GPUs x NIC bandwidth / this (default 1: non-blocking)");
      app.add_option("--checkpoint-every", a->graph.checkpoint_every,
                     "steps between checkpoint saves; step k saves when k % N == 0 (default 0: none)");
      app.add_option("-o,--output", a->out, "Chrome trace JSON to write (atomic)");
      app.add_option("--max-arrows", a->max_arrows,
                     "dependency arrows written to the trace at most (default 200000; the rest are counted)");
      app.add_option("--max-memory-gb", a->max_memory_gb,
                     "refuse a simulation estimated to need more (default: 3/4 of this machine's memory)");
      app.add_flag("--json", a->json, "print the summary as JSON");
      auto* w = app.add_option_group("what-if",
          "What-if questions. Ranks are GPU processes numbered stage-major (stage s, rank r is s x R + r for "
          "--ranks-per-stage R); for one GPU per rank set R to the GPUs per stage (704 for the hero). The summary "
          "then says what changed against the same step without them: step time, ranks and resources on the "
          "critical path, and how long each rank's compute waited and for whom. Example: --ranks-per-stage 704 "
          "--slow-gpu 17:1.5 --sweep slow-gpu-factor=1,1.1,1.5,2");
      w->add_option("--slow-gpu", a->slow_gpus, "rank:factor, the GPU computes factor (>= 1) times slower; repeatable");
      w->add_option("--degraded-nvlink", a->degraded_nvlinks,
                    "rank:factor, the rank's NVLink port runs at 1/factor of its bandwidth; repeatable");
      w->add_option("--degraded-nic", a->degraded_nics, "rank:factor, the rank's NIC at 1/factor; repeatable");
      w->add_option("--failed-nic", a->graph.failed_nics,
                    "rank whose NIC is down: its traffic crosses NVLink to the next rank and shares that rank's NIC; "
                    "repeatable");
      w->add_option("--rack-healthy", a->rack_healthy,
                    "rack:gpus, the rack (NVLink domain; ranks numbered rack-major) runs its work on fewer healthy GPUs, "
                    "each doing gpus_per_rack / gpus of it; repeatable");
      w->add_option("--expert-load", a->expert_load,
                    "f0,f1,...: rank r's routed-expert GEMMs take f[r mod n] times as long (uneven EP load); "
                    "'routing': the per-rank load the drop model's routing implies for this layout (busiest rank first)");
      w->add_option("--sweep", a->sweep,
                    "knob=v1,v2,...: step time against one knob, graph built once (slow-gpu-factor [the --slow-gpu "
                    "ranks, else rank 0], jitter, straggler-prob, nic-factor, nvlink-factor [the degraded ranks, else "
                    "rank 0])");
      return [a] { return run_timeline(*a); };
    }};

}  // namespace
}  // namespace rackstep::sim
