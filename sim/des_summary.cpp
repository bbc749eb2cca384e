// Reading a finished run of the discrete-event engine (sim/des.h): the step
// summary (exposed time by kind, critical path by category, busiest
// resources), each GPU's compute-stream waits and for whom, the plain-text
// table, and the Chrome-trace export. The engine itself (building the task
// graph and running it) is sim/des.cpp.
#include "sim/des.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "models/check.h"
#include "sim/trace.h"

namespace rackstep::sim {

// ---------------------------------------------------------------- summary

namespace {

// Time per category where no compute runs on the GPU, and pure idle.
struct Exposure {
  std::map<std::string, double> by_kind;
  double idle_s = 0;
  double compute_s = 0;
};

Exposure gpu_exposure(const Engine& e, const RunResult& r, const std::vector<int32_t>& tasks,
                      double makespan) {
  // Sweep points: (time, delta, category); category -1 = compute.
  struct Point {
    double t;
    int delta;
    int32_t cat;
  };
  std::vector<Point> pts;
  std::map<std::string, int32_t> cat_ids;
  std::vector<std::string> cat_names;
  for (int32_t t : tasks) {
    if (r.end_s[t] <= r.start_s[t]) continue;
    int32_t c = -1;
    if (e.task_class({t}) != TaskClass::kCompute) {
      auto [it, added] = cat_ids.emplace(e.task_category({t}), static_cast<int32_t>(cat_names.size()));
      if (added) cat_names.push_back(it->first);
      c = it->second;
    }
    pts.push_back({r.start_s[t], +1, c});
    pts.push_back({r.end_s[t], -1, c});
  }
  std::sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) {
    if (a.t != b.t) return a.t < b.t;
    return a.delta < b.delta;  // ends before starts at the same instant
  });
  Exposure x;
  std::vector<double> by_cat(cat_names.size(), 0);
  std::vector<int> active(cat_names.size(), 0);
  int compute = 0, kinds = 0;
  double prev = 0;
  auto account = [&](double until) {
    double dt = until - prev;
    if (dt <= 0) return;
    if (compute > 0) {
      x.compute_s += dt;
    } else if (kinds == 0) {
      x.idle_s += dt;
    } else {
      for (size_t c = 0; c < active.size(); ++c) {
        if (active[c] > 0) by_cat[c] += dt / kinds;
      }
    }
  };
  for (const Point& p : pts) {
    account(p.t);
    prev = p.t;
    if (p.cat < 0) {
      compute += p.delta;
      continue;
    }
    int before = active[p.cat];
    active[p.cat] += p.delta;
    if (before == 0 && active[p.cat] > 0) ++kinds;
    if (before > 0 && active[p.cat] == 0) --kinds;
  }
  account(makespan);
  for (size_t c = 0; c < cat_names.size(); ++c) x.by_kind[cat_names[c]] = by_cat[c];
  return x;
}

}  // namespace

StepSummary summarize(const Engine& e, const RunResult& r) {
  StepSummary s;
  s.makespan_s = r.makespan_s;
  s.critical_path = r.critical_path;
  for (TaskId t : r.critical_path) {
    const std::string& cat = e.task_category(t);
    const double span_s = r.end_s[t.v] - r.start_s[t.v];
    s.critical_path_s_by_category[cat] += span_s;
    s.critical_path_s_by_class[task_class_name(e.task_class(t))] += span_s;
    const double ideal_s = e.uncontended_flow_s(t);
    if (ideal_s <= 0 || r.flow_start_s.empty()) continue;
    // Rounding in the rate updates can leave a hair below the ideal: no contention then.
    const double lost_s = std::max(0.0, r.end_s[t.v] - r.flow_start_s[t.v] - ideal_s);
    s.critical_path_contention_s_by_category[cat] += lost_s;
    s.critical_path_contention_s += lost_s;
  }
  for (int64_t i = 0; i < e.num_resources(); ++i) {
    ResourceId id{static_cast<int32_t>(i)};
    double busy = i < static_cast<int64_t>(r.busy_s.size()) ? r.busy_s[i] : 0;
    double bytes = i < static_cast<int64_t>(r.bytes_moved.size()) ? r.bytes_moved[i] : 0;
    s.resources.push_back({id, busy, r.makespan_s > 0 ? busy / r.makespan_s : 0, bytes});
  }
  // GPUs are the processes with a compute stream.
  std::vector<char> is_gpu(e.num_processes(), 0);
  for (int64_t i = 0; i < e.num_resources(); ++i) {
    ResourceId id{static_cast<int32_t>(i)};
    if (e.resource_kind(id) == ResourceKind::kComputeStream) is_gpu[e.resource_process(id)] = 1;
  }
  std::vector<std::vector<int32_t>> per_gpu(e.num_processes());
  for (int32_t t = 0; t < e.num_tasks() && t < static_cast<int64_t>(r.end_s.size()); ++t) {
    int p = e.task_process({t});
    if (is_gpu[p]) per_gpu[p].push_back(t);
  }
  double weight = 0;
  for (int p = 0; p < e.num_processes(); ++p) {
    if (!is_gpu[p]) continue;
    const double m = static_cast<double>(e.process_multiplicity(p));
    Exposure x = gpu_exposure(e, r, per_gpu[p], r.makespan_s);
    weight += m;
    s.compute_busy_s += m * x.compute_s;
    s.bubble_s += m * x.idle_s;
    for (auto& [k, v] : x.by_kind) s.exposed_s_by_kind[k] += m * v;
  }
  if (weight > 0) {
    s.compute_busy_s /= weight;
    s.bubble_s /= weight;
    for (auto& [k, v] : s.exposed_s_by_kind) v /= weight;
  }
  s.bubble_fraction = s.makespan_s > 0 ? s.bubble_s / s.makespan_s : 0;
  return s;
}

std::vector<RankWait> compute_waits(const Engine& e, const RunResult& r) {
  std::vector<RankWait> out(static_cast<size_t>(e.num_processes()));
  for (int p = 0; p < e.num_processes(); ++p) out[static_cast<size_t>(p)].process = p;
  if (r.cause.size() != static_cast<size_t>(e.num_tasks())) return out;
  for (int32_t t = 0; t < e.num_tasks(); ++t) {
    const ResourceId home = e.task_home({t});
    if (e.resource_kind(home) != ResourceKind::kComputeStream) continue;
    const TaskId prev = e.stream_predecessor({t});
    if (!prev.valid()) continue;
    const double gap_s = r.start_s[t] - r.end_s[prev.v];
    if (!(gap_s > 0)) continue;
    const int p = e.resource_process(home);
    // The wait until the other rank's task ended is for that rank; what
    // follows (the collective's own time) is for the transfers.
    std::string culprit;
    double culprit_s = 0;
    int32_t first_comm = -1, other_comm = -1;  // the first transfer on the way; the first on another process
    int32_t c = r.cause[t];
    for (int hops = 0; c >= 0 && hops < 256; ++hops, c = r.cause[c]) {
      if (e.task_class({c}) != TaskClass::kCommunication) {
        if (e.task_process({c}) != p) {
          culprit = e.process_name(e.task_process({c}));
          culprit_s = std::clamp(r.end_s[c] - r.end_s[prev.v], 0.0, gap_s);
        }
        break;
      }
      if (first_comm < 0) first_comm = c;
      if (other_comm < 0 && e.task_process({c}) != p && e.task_bytes({c}) > 0) other_comm = c;
    }
    RankWait& w = out[static_cast<size_t>(p)];
    w.wait_s += gap_s;
    if (culprit_s > 0) w.wait_s_by_cause[culprit] += culprit_s;
    if (gap_s - culprit_s > 0) {
      // The rest is the collective's own time: another rank's transfer when
      // it finished last (a slow link), else this GPU's.
      std::string why = "itself";
      if (other_comm >= 0) {
        why = e.task_category({other_comm}) + " transfers of " + e.process_name(e.task_process({other_comm}));
      } else if (first_comm >= 0) {
        why = e.task_category({first_comm}) + " transfers";
      }
      w.wait_s_by_cause[why] += gap_s - culprit_s;
    }
  }
  return out;
}

std::string format_summary(const Engine& e, const StepSummary& s) {
  std::ostringstream o;
  char buf[256];
  auto pct = [&](double v) { return s.makespan_s > 0 ? 100.0 * v / s.makespan_s : 0.0; };
  std::snprintf(buf, sizeof buf, "step (makespan)        %12.6f s\n", s.makespan_s);
  o << buf;
  std::snprintf(buf, sizeof buf, "compute busy per GPU   %12.6f s  %5.1f%%\n", s.compute_busy_s,
                pct(s.compute_busy_s));
  o << buf;
  std::snprintf(buf, sizeof buf, "bubble (idle) per GPU  %12.6f s  %5.1f%%\n", s.bubble_s, pct(s.bubble_s));
  o << buf;
  o << "exposed per GPU, by kind:\n";
  for (auto& [k, v] : s.exposed_s_by_kind) {
    std::snprintf(buf, sizeof buf, "  %-22s %12.6f s  %5.1f%%\n", k.c_str(), v, pct(v));
    o << buf;
  }
  o << "critical path (" << s.critical_path.size() << " tasks), time by class:\n";
  for (auto& [k, v] : s.critical_path_s_by_class) {
    std::snprintf(buf, sizeof buf, "  %-22s %12.6f s  %5.1f%%\n", k.c_str(), v, pct(v));
    o << buf;
  }
  // Contention below a microsecond per second of step is rounding in the rate updates, not worth a line.
  const double shown_s = 1e-6 * s.makespan_s;
  if (s.critical_path_contention_s > shown_s) {
    std::snprintf(buf, sizeof buf, "  %-22s %12.6f s  %5.1f%%  (part of communication)\n", "lost to contention",
                  s.critical_path_contention_s, pct(s.critical_path_contention_s));
    o << buf;
  }
  o << "critical path, time by category:\n";
  for (auto& [k, v] : s.critical_path_s_by_category) {
    std::snprintf(buf, sizeof buf, "  %-22s %12.6f s  %5.1f%%", k.c_str(), v, pct(v));
    o << buf;
    auto c = s.critical_path_contention_s_by_category.find(k);
    if (c != s.critical_path_contention_s_by_category.end() && c->second > shown_s) {
      std::snprintf(buf, sizeof buf, "  (%.6f s contention)", c->second);
      o << buf;
    }
    o << "\n";
  }
  o << "busiest resources:\n";
  std::vector<ResourceUse> top = s.resources;
  std::sort(top.begin(), top.end(), [](const ResourceUse& a, const ResourceUse& b) {
    if (a.utilisation != b.utilisation) return a.utilisation > b.utilisation;
    return a.id.v < b.id.v;
  });
  if (top.size() > 12) top.resize(12);
  for (const ResourceUse& u : top) {
    std::string name = e.process_name(e.resource_process(u.id)) + "/" + e.resource_name(u.id);
    std::snprintf(buf, sizeof buf, "  %-32s %-14s %5.1f%% busy", name.c_str(),
                  resource_kind_name(e.resource_kind(u.id)), 100.0 * u.utilisation);
    o << buf;
    if (u.bytes > 0) {
      // bytes_moved counts every copy a symmetric process stands for; a
      // per-GPU resource is read per GPU.
      const double copies = static_cast<double>(e.process_multiplicity(e.resource_process(u.id)));
      std::snprintf(buf, sizeof buf, "  %.3g bytes%s", u.bytes / copies, copies > 1 ? " per copy" : "");
      o << buf;
    }
    o << "\n";
  }
  return o.str();
}

// ---------------------------------------------------------------- trace

namespace {

int64_t to_ns(double s) { return std::llround(s * 1e9); }

// The outermost tier a flow reaches: nvlink, nic (the fabric behind it
// included), spine, or fabric (a shared link with no NIC, such as storage).
const char* flow_tier(const Engine& e, const std::vector<ResourceId>& links) {
  bool nic = false, spine = false, fabric = false;
  for (ResourceId l : links) {
    const ResourceKind k = e.resource_kind(l);
    nic = nic || k == ResourceKind::kNic;
    spine = spine || (k == ResourceKind::kFabricLink && e.resource_name(l) == "spine");
    fabric = fabric || k == ResourceKind::kFabricLink;
  }
  if (spine) return "spine";
  if (nic) return "nic";
  return fabric ? "fabric" : "nvlink";
}

}  // namespace

TraceStats export_trace(const Engine& e, const RunResult& r, TraceWriter& w, const TraceOptions& opts) {
  TraceStats st;
  std::vector<int> pid(e.num_processes());
  for (int p = 0; p < e.num_processes(); ++p) {
    std::string name = e.process_name(p);
    if (e.process_multiplicity(p) > 1) name += " (x" + std::to_string(e.process_multiplicity(p)) + ")";
    pid[p] = w.process(name);
  }
  const int64_t nr = e.num_resources();
  std::vector<int> tid(nr);
  for (int64_t i = 0; i < nr; ++i) {
    ResourceId id{static_cast<int32_t>(i)};
    tid[i] = w.thread(pid[e.resource_process(id)], e.resource_name(id));
  }
  std::vector<char> critical(e.num_tasks(), 0);
  if (opts.mark_critical) {
    for (TaskId t : r.critical_path) critical[t.v] = 1;
  }
  // Lanes: per resource, tasks by start; each goes to the first lane free by
  // then (interval partitioning, as few lanes as the deepest overlap).
  std::vector<std::vector<int32_t>> on(nr);
  for (int32_t t = 0; t < e.num_tasks(); ++t) on[e.task_home({t}).v].push_back(t);
  std::vector<int> lane_tid(e.num_tasks());
  for (int64_t i = 0; i < nr; ++i) {
    auto& ts = on[i];
    std::stable_sort(ts.begin(), ts.end(), [&](int32_t a, int32_t b) { return to_ns(r.start_s[a]) < to_ns(r.start_s[b]); });
    std::vector<int64_t> lane_end;  // ns
    std::vector<int> lanes;
    for (int32_t t : ts) {
      const int64_t b = to_ns(r.start_s[t]), end = to_ns(r.end_s[t]);
      size_t k = 0;
      while (k < lane_end.size() && lane_end[k] > b) ++k;
      if (k == lane_end.size()) {
        lane_end.push_back(end);
        const ResourceId id{static_cast<int32_t>(i)};
        lanes.push_back(k == 0 ? tid[i]
                               : w.thread(pid[e.resource_process(id)], e.resource_name(id) + " #" + std::to_string(k + 1)));
        if (k > 0) ++st.extra_lanes;
      }
      lane_end[k] = std::max(lane_end[k], end);
      lane_tid[t] = lanes[k];
    }
  }
  std::vector<std::string> link_names(nr);
  for (int64_t i = 0; i < nr; ++i) {
    ResourceId id{static_cast<int32_t>(i)};
    link_names[i] = e.process_name(e.resource_process(id)) + "/" + e.resource_name(id);
  }
  for (int32_t t = 0; t < e.num_tasks(); ++t) {
    const ResourceId h = e.task_home({t});
    nlohmann::json args;
    if (critical[t]) args["critical"] = true;
    const double bytes = e.task_bytes({t});
    if (bytes > 0) {
      args["bytes"] = bytes;
      if (e.task_weight({t}) > 1) args["copies"] = e.task_weight({t});
      const std::vector<ResourceId> links = e.task_links({t});
      nlohmann::json names = nlohmann::json::array();
      for (ResourceId l : links) names.push_back(link_names[l.v]);
      args["links"] = std::move(names);
      args["tier"] = flow_tier(e, links);
    }
    if (e.task_flops({t}) > 0) args["flops"] = e.task_flops({t});
    if (e.task_class({t}) == TaskClass::kCommunication && !is_link(e.resource_kind(h))) {
      args["communicator"] = e.resource_name(h);
    }
    w.slice(pid[e.resource_process(h)], lane_tid[t], e.task_name({t}), e.task_category({t}), r.start_s[t], r.end_s[t],
            args);
    ++st.slices;
  }
  if (!opts.dependency_flows) return st;
  auto arrow = [&](int32_t b, int32_t a) {
    if (lane_tid[b] == lane_tid[a] && e.task_home({b}).v == e.task_home({a}).v) return;  // same row: order is visible
    if (st.arrows >= opts.max_flows) {
      ++st.arrows_left_out;
      return;
    }
    ++st.arrows;
    const ResourceId hb = e.task_home({b}), ha = e.task_home({a});
    // Midpoints lie inside both slices, so viewers bind the arrow to them.
    w.flow(pid[e.resource_process(hb)], lane_tid[b], 0.5 * (r.start_s[b] + r.end_s[b]), pid[e.resource_process(ha)],
           lane_tid[a], 0.5 * (r.start_s[a] + r.end_s[a]));
  };
  for (auto [b, a] : e.dependencies()) arrow(b, a);
  // Barriers joined through a hub: one arrow into each waiting task, from the
  // task whose end released it.
  if (r.cause.size() == static_cast<size_t>(e.num_tasks())) {
    for (int32_t a : e.hub_after_tasks()) {
      if (r.cause[a] >= 0) arrow(r.cause[a], a);
    }
  }
  return st;
}

}  // namespace rackstep::sim
