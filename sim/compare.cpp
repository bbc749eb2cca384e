#include "sim/compare.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "sim/base/check.h"
#include "sim/base/json_io.h"
#include "models/model.h"
#include "sim/calibration.h"
#include "sim/fit.h"
#include "sim/predict.h"
#include "topologies/topology.h"

namespace rackstep::sim {

namespace fs = std::filesystem;

namespace {

struct Slice {
  std::string name, cat, op, op_class;
  double start_s = 0, dur_s = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

nlohmann::json process_meta(int64_t pid, const std::string& name) {
  return {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", name}}}};
}
nlohmann::json thread_meta(int64_t pid, int64_t tid, const std::string& name) {
  return {{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}
nlohmann::json complete(int64_t pid, int64_t tid, const Slice& s) {
  return {{"ph", "X"},   {"name", s.name},         {"cat", s.cat},
          {"pid", pid},  {"tid", tid},             {"ts", s.start_s * 1e6},
          {"dur", s.dur_s * 1e6}, {"args", {{"op", s.op}, {"op_class", s.op_class}}}};
}

}  // namespace

Comparison compare_run(const CompareInputs& in) {
  const std::string run_path = (fs::path(in.run_dir) / "run.json").string();
  const std::string trace_path = (fs::path(in.run_dir) / "trace.json").string();
  if (!fs::exists(trace_path)) {
    throw UserError(trace_path, "", "a profiled run (rackstep train --profile --out RUN)", "no such file");
  }
  const nlohmann::json run = load_json_file(run_path);
  const std::string model_path = run.at("model").get<std::string>();
  const models::LayerGraph g = models::build_layer_graph(models::load_model(model_path));
  const int64_t batch = run.at("batch").get<int64_t>(), seq = run.at("seq").get<int64_t>();
  const int64_t procs = run.value("processes", 1);
  int64_t ep = 1;
  std::string transport = "ragged";
  if (run.contains("dispatch") && run["dispatch"].value("enabled", false) && procs > 1) {
    ep = run["dispatch"].value("ep", 1);
    transport = run["dispatch"].value("transport", "ragged");
  }
  const topologies::Cluster cluster = topologies::load_cluster(in.cluster);
  const Calibration cal = in.calibration.empty() ? default_calibration() : load_calibration(in.calibration);
  const Layout layout = cpu_run_layout(procs, ep, batch, seq, transport);
  const Predictor predictor(g, cluster, cal);
  const Prediction pred = predictor.predict(layout);
  if (!pred.valid) {
    std::string why;
    for (const auto& i : pred.issues) why += (why.empty() ? "" : "; ") + i.detail;
    throw UserError(in.cluster, "", "a cluster of " + std::to_string(procs) + " processes for this run's layout", why);
  }
  const std::vector<OpTiming> ops = predictor.op_timings(layout);

  // The predicted step as one sequential timeline: forward in graph order,
  // backward in reverse, exposed communication, optimizer.
  std::vector<Slice> predicted;
  double t = 0;
  const auto add = [&](std::vector<Slice>& v, const std::string& name, Pass p, const std::string& op,
                       const std::string& cls, double dur) {
    v.push_back({name, to_string(p), op, cls, t, dur});
    t += dur;
  };
  for (size_t i = 0; i < g.ops.size(); ++i) {
    add(predicted, slice_name(g.ops[i], Pass::kForward), Pass::kForward, g.ops[i].name,
        models::to_string(g.ops[i].op_class), ops[i].fwd_s);
    if (ops[i].comm_s > 0) {
      add(predicted, slice_name(g.ops[i], Pass::kComm), Pass::kComm, g.ops[i].name, "comm", ops[i].comm_s);
    }
  }
  for (size_t j = g.ops.size(); j-- > 0;) {
    add(predicted, slice_name(g.ops[j], Pass::kBackward), Pass::kBackward, g.ops[j].name,
        models::to_string(g.ops[j].op_class), ops[j].bwd_s);
  }
  if (pred.breakdown.grad_sync_s > 0) add(predicted, "grad_sync", Pass::kComm, "grad_sync", "comm", pred.breakdown.grad_sync_s);
  add(predicted, "optimizer", Pass::kOptimizer, "optimizer", "optimizer",
      pred.breakdown.optimizer_compute_s + pred.breakdown.optimizer_comm_s);

  // The measured step from the profiler's trace.
  const nlohmann::json mt = load_json_file(trace_path);
  std::map<std::string, const models::Op*> by_name;
  for (const auto& op : g.ops) by_name[op.name] = &op;
  std::map<int64_t, std::vector<Slice>> by_step;
  for (const auto& e : mt.at("traceEvents")) {
    if (e.value("ph", "") != "X") continue;
    const int64_t step = e.contains("args") ? e["args"].value("step", int64_t{0}) : 0;
    Slice s;
    s.name = e.at("name").get<std::string>();
    s.start_s = e.at("ts").get<double>() * 1e-6;
    s.dur_s = e.at("dur").get<double>() * 1e-6;
    std::string op;
    Pass p = Pass::kOptimizer;
    if (s.name == "optimizer") {
      s.cat = "optimizer";
      s.op = s.op_class = "optimizer";
    } else if (parse_slice_name(s.name, &op, &p) && by_name.count(op)) {
      s.cat = to_string(p);
      s.op = op;
      s.op_class = models::to_string(by_name[op]->op_class);
    } else {
      s.cat = "host";
      s.op = s.name;
      s.op_class = "host";
    }
    by_step[step].push_back(s);
  }
  if (by_step.empty()) throw UserError(trace_path, "/traceEvents", "profiled op slices", "none");
  const int64_t step = in.step >= 0 ? in.step : by_step.rbegin()->first;
  if (!by_step.count(step)) {
    throw UserError(trace_path, "/traceEvents", "slices of step " + std::to_string(step), "none for that step");
  }
  std::vector<Slice> measured = by_step[step];
  double t0 = 1e300;
  for (const auto& s : measured) t0 = std::min(t0, s.start_s);
  for (auto& s : measured) s.start_s -= t0;

  // De-loading (exec/profiler.h step_wall_s / step_cpu_s): on a shared machine a
  // step's wall time includes waiting for a core; CPU time over the process's
  // threads does not (exact for one thread), as every `rackstep calibrate` timing.
  double shown_factor = 1.0, deloaded_step = 0.0;
  const fs::path ops_path = fs::path(in.run_dir) / "op_measurements.json";
  if (fs::exists(ops_path)) {
    const nlohmann::json om = load_json_file(ops_path.string());
    const double threads = std::max(1.0, om.value("threads", 1.0));
    std::vector<double> walls = om.value("step_wall_s", std::vector<double>{});
    std::vector<double> cpus = om.value("step_cpu_s", std::vector<double>{});
    // A device's clock (exec/profiler.h "op_clock": CUDA events): its times are the device's, not de-loaded.
    if (om.value("op_clock", std::string("host")) != "host") {
      cpus.clear();
      for (const double w : walls) cpus.push_back(w * threads);  // factor 1
    }
    std::vector<double> deloaded, factor;
    for (size_t i = 0; i < std::min(walls.size(), cpus.size()); ++i) {
      const double f = walls[i] > 0 ? std::clamp(cpus[i] / threads / walls[i], 0.01, 1.0) : 1.0;
      factor.push_back(f);
      if (i > 0 || walls.size() == 1) deloaded.push_back(walls[i] * f);  // the first step warms up
    }
    deloaded_step = median(deloaded);
    size_t shown = 0;
    for (const auto& [k, v] : by_step) {
      if (k == step) break;
      ++shown;
    }
    if (shown < factor.size()) shown_factor = factor[shown];
  }
  if (in.deload) {
    for (auto& s : measured) {
      s.start_s *= shown_factor;
      s.dur_s *= shown_factor;
    }
  }

  // Per class: seconds of one step on each side.
  std::map<std::string, std::pair<double, double>> cls;
  for (const auto& s : predicted) cls[s.op_class].first += s.dur_s;
  for (const auto& s : measured) cls[s.op_class].second += s.dur_s;
  nlohmann::json by_class = nlohmann::json::array();
  double pred_sum = 0, meas_sum = 0;
  for (const auto& [c, v] : cls) {
    const double deloaded = in.deload ? v.second : v.second * shown_factor;
    by_class.push_back({{"op_class", c}, {"predicted_s", v.first}, {"measured_s", v.second},
                        {"measured_deloaded_s", deloaded},
                        {"error", deloaded > 0 ? v.first / deloaded - 1.0 : 0.0}});
    pred_sum += v.first;
    meas_sum += v.second;
  }
  // Per logged step: the measured wall time of each step vs the prediction.
  nlohmann::json steps = nlohmann::json::array();
  std::vector<double> step_s;
  std::ifstream log(fs::path(in.run_dir) / "log.jsonl");
  std::string line;
  while (std::getline(log, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("step_s")) continue;
    steps.push_back({{"step", j.value("step", int64_t{0})}, {"measured_s", j["step_s"]}, {"predicted_s", pred.step_time_s}});
    step_s.push_back(j["step_s"].get<double>());
  }
  // The first step warms caches and thread pools; the median of the rest stands for the run.
  if (step_s.size() > 2) step_s.erase(step_s.begin());
  const double measured_step = median(step_s);

  Comparison c;
  c.table = {{"model", g.model.name},
             {"run", in.run_dir},
             {"batch", batch},
             {"seq", seq},
             {"processes", procs},
             {"step_shown", step},
             {"by_class", by_class},
             {"ops_sum", {{"predicted_s", pred_sum}, {"measured_s", meas_sum}}},
             {"deload_factor_shown_step", shown_factor},
             {"trace_deloaded", in.deload},
             {"step", {{"predicted_s", pred.step_time_s},
                       {"measured_median_s", measured_step},
                       {"measured_deloaded_median_s", deloaded_step},
                       {"error", measured_step > 0 ? pred.step_time_s / measured_step - 1.0 : 0.0},
                       {"error_deloaded", deloaded_step > 0 ? pred.step_time_s / deloaded_step - 1.0 : 0.0}}},
             {"steps", steps}};

  nlohmann::json ev = nlohmann::json::array();
  const std::string label = g.model.name + " batch " + std::to_string(batch) + " seq " + std::to_string(seq);
  ev.push_back(process_meta(0, "predicted: " + label + " on " + cluster.name));
  ev.push_back(thread_meta(0, 0, "compute"));
  ev.push_back(process_meta(kMeasuredPidOffset, "measured: " + label + " step " + std::to_string(step) + " (" +
                                                     in.run_dir + ")"));
  ev.push_back(thread_meta(kMeasuredPidOffset, 0, "compute"));
  for (const auto& s : predicted) ev.push_back(complete(0, 0, s));
  for (const auto& s : measured) ev.push_back(complete(kMeasuredPidOffset, 0, s));
  c.trace = {{"traceEvents", ev},
             {"displayTimeUnit", "ms"},
             {"otherData",
              {{"rackstep_compare",
                {{"predicted", in.predicted},
                 {"measured", in.run_dir},
                 {"step", step},
                 // The shown step's de-load factor: a viewer multiplies the measured slices by it (unless the
                 // trace is already de-loaded) to show the table's de-loaded figures.
                 {"measured_deload_factor", shown_factor},
                 {"trace_deloaded", in.deload}}}}}};
  return c;
}

std::string format_comparison(const Comparison& c) {
  std::ostringstream o;
  const auto& t = c.table;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, batch %lld, seq %lld, %lld process(es); step %lld of %s\n",
                t["model"].get<std::string>().c_str(), static_cast<long long>(t["batch"].get<int64_t>()),
                static_cast<long long>(t["seq"].get<int64_t>()), static_cast<long long>(t["processes"].get<int64_t>()),
                static_cast<long long>(t["step_shown"].get<int64_t>()), t["run"].get<std::string>().c_str());
  o << buf;
  std::snprintf(buf, sizeof buf, "%-14s %14s %14s %14s %8s\n", "op class", "predicted ms", "measured ms",
                "de-loaded ms", "error");
  o << buf;
  for (const auto& r : t["by_class"]) {
    std::snprintf(buf, sizeof buf, "%-14s %14.3f %14.3f %14.3f %+7.1f%%\n", r["op_class"].get<std::string>().c_str(),
                  1e3 * r["predicted_s"].get<double>(), 1e3 * r["measured_s"].get<double>(),
                  1e3 * r["measured_deloaded_s"].get<double>(), 100.0 * r["error"].get<double>());
    o << buf;
  }
  std::snprintf(buf, sizeof buf, "%-14s %14.3f %14.3f\n", "ops total", 1e3 * t["ops_sum"]["predicted_s"].get<double>(),
                1e3 * t["ops_sum"]["measured_s"].get<double>());
  o << buf;
  std::snprintf(buf, sizeof buf, "%-14s %14.3f %14.3f %14.3f %+7.1f%%  (median of the logged / profiled steps)\n",
                "step", 1e3 * t["step"]["predicted_s"].get<double>(), 1e3 * t["step"]["measured_median_s"].get<double>(),
                1e3 * t["step"]["measured_deloaded_median_s"].get<double>(),
                100.0 * t["step"]["error_deloaded"].get<double>());
  o << buf;
  o << "de-loaded: wall x CPU time / (threads x wall) of each profiled step, the time on an idle machine "
       "(rackstep calibrate measures the same way)\n";
  return o.str();
}

}  // namespace rackstep::sim
