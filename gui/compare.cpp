// Predicted beside measured; see gui/compare.h.
#include "gui/compare.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "sim/base/check.h"

namespace rackstep::gui {
namespace {

using json = nlohmann::ordered_json;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

const json& events_of(const json& doc, const std::string& path) {
  if (doc.is_array()) return doc;
  auto it = doc.find("traceEvents");
  if (it == doc.end() || !it->is_array()) throw UserError(path, "/traceEvents", "an array of events", "none");
  return *it;
}

// Earliest start of a slice ("X" or "B"): where the side's step begins.
double first_slice_us(const json& events) {
  double t0 = INFINITY;
  for (const json& e : events) {
    if (!e.is_object()) continue;
    auto ph = e.find("ph");
    auto ts = e.find("ts");
    if (ph == e.end() || !ph->is_string() || ts == e.end() || !ts->is_number()) continue;
    const std::string p = ph->get<std::string>();
    if (p == "X" || p == "B") t0 = std::min(t0, ts->get<double>());
  }
  return std::isfinite(t0) ? t0 : 0;
}

void append_side(json& out, const json& events, const char* prefix, int64_t pid_offset) {
  const double t0 = first_slice_us(events);
  std::set<std::string> named;  // pids given a process_name
  std::set<std::string> seen;
  for (const json& e : events) {
    if (!e.is_object()) continue;
    json c = e;
    auto pid = c.find("pid");
    std::string pid_key = pid == c.end() ? "0" : pid->dump();
    if (pid != c.end() && pid->is_number()) *pid = pid->get<int64_t>() + pid_offset;
    else if (pid != c.end() && pid->is_string()) *pid = std::string(prefix) + pid->get<std::string>();
    else c["pid"] = pid_offset;
    seen.insert(pid_key);
    auto ts = c.find("ts");
    if (ts != c.end() && ts->is_number()) *ts = ts->get<double>() - t0;
    auto name = c.find("name");
    if (c.value("ph", "") == "M" && name != c.end() && name->is_string() && name->get<std::string>() == "process_name") {
      auto args = c.find("args");
      if (args != c.end() && args->is_object() && args->contains("name") && (*args)["name"].is_string()) {
        (*args)["name"] = std::string(prefix) + (*args)["name"].get<std::string>();
        named.insert(pid_key);
      }
    }
    out.push_back(std::move(c));
  }
  // Processes without a name are named by side, so every row says where it comes from.
  for (const std::string& k : seen) {
    if (named.count(k)) continue;
    const json pid = json::parse(k);
    json m = {{"ph", "M"}, {"name", "process_name"}};
    m["pid"] = pid.is_number() ? json(pid.get<int64_t>() + pid_offset) : json(std::string(prefix) + pid.get<std::string>());
    m["args"] = {{"name", std::string(prefix) + "pid " + (pid.is_string() ? pid.get<std::string>() : pid.dump())}};
    out.push_back(std::move(m));
  }
}

// Op classes are compared only when both sides carry them (the compare
// format does); a predicted trace from `rackstep timeline` has none, and then
// both sides are compared by category (forward, backward, optimizer...).
bool by_op_class(const TraceModel& m) {
  bool side[2] = {false, false};
  for (const TraceRow& r : m.rows) {
    const int k = is_measured_row(r) ? 1 : 0;
    for (const TraceEvent& e : r.events) {
      if (e.op_class >= 0) {
        side[k] = true;
        break;
      }
    }
  }
  return side[0] && side[1];
}

// The class a slice is compared under: its op class, else its category.
std::string class_of(const TraceModel& m, const TraceEvent& e, bool op_classes) {
  return op_classes && e.op_class >= 0 ? m.op_classes[e.op_class] : m.categories[e.category];
}

std::string op_of(const TraceModel& m, const TraceEvent& e) { return e.op >= 0 ? m.ops[e.op] : e.name; }

}  // namespace

bool is_measured_row(const TraceRow& r) {
  return r.pid >= kMeasuredPidOffset || starts_with(r.process_name, "measured: ");
}

bool is_compare_trace(const TraceModel& m) {
  if (m.other_data_json.find("\"rackstep_compare\"") != std::string::npos) return true;
  bool predicted = false, measured = false;
  for (const TraceRow& r : m.rows) {
    predicted = predicted || starts_with(r.process_name, "predicted: ");
    measured = measured || starts_with(r.process_name, "measured: ");
  }
  return predicted && measured;
}

json merge_traces(const json& predicted, const std::string& predicted_path, const json& measured,
                  const std::string& measured_path) {
  json out = json::object();
  json events = json::array();
  append_side(events, events_of(predicted, predicted_path), "predicted: ", 0);
  append_side(events, events_of(measured, measured_path), "measured: ", kMeasuredPidOffset);
  out["traceEvents"] = std::move(events);
  out["otherData"] = {{"rackstep_compare", {{"predicted", predicted_path}, {"measured", measured_path}}}};
  return out;
}

double CompareLine::error() const { return measured_us > 0 ? (predicted_us - measured_us) / measured_us : NAN; }

CompareSummary compare_summary(const TraceModel& m) {
  CompareSummary s;
  // GPUs per side: GPU processes weighted by copies; a side without GPU processes counts its processes.
  std::set<int64_t> pids[2];
  std::set<int> steps[2];
  double t0[2] = {INFINITY, INFINITY}, t1[2] = {-INFINITY, -INFINITY};
  for (const TraceRow& r : m.rows) {
    const int side = is_measured_row(r) ? 1 : 0;
    pids[side].insert(r.pid);
    for (const TraceEvent& e : r.events) {
      if (e.step >= 0) steps[side].insert(e.step);
      t0[side] = std::min(t0[side], e.start_us);
      t1[side] = std::max(t1[side], e.start_us + e.dur_us);
    }
  }
  double gpus[2] = {0, 0};
  for (const GpuBreakdown& g : m.gpus) {
    const bool measured = g.pid >= kMeasuredPidOffset || starts_with(g.process_name, "measured: ");
    gpus[measured ? 1 : 0] += static_cast<double>(g.copies);
  }
  for (int side = 0; side < 2; ++side) {
    if (gpus[side] == 0) gpus[side] = std::max<double>(1, static_cast<double>(pids[side].size()));
  }
  s.predicted_steps = std::max<int>(1, static_cast<int>(steps[0].size()));
  s.measured_steps = std::max<int>(1, static_cast<int>(steps[1].size()));
  const double n_steps[2] = {static_cast<double>(s.predicted_steps), static_cast<double>(s.measured_steps)};
  s.predicted_gpus = gpus[0];
  s.measured_gpus = gpus[1];
  s.predicted_span_us = t1[0] > t0[0] ? t1[0] - t0[0] : 0;
  s.measured_span_us = t1[1] > t0[1] ? t1[1] - t0[1] : 0;

  // `rackstep compare` de-loads the measured step (wall x CPU / (threads x wall)) in its table; apply the
  // same factor here unless the trace itself was written de-loaded.
  if (!m.other_data_json.empty()) {
    const json other = json::parse(m.other_data_json, nullptr, false);
    if (!other.is_discarded() && other.contains("rackstep_compare")) {
      const json& rc = other["rackstep_compare"];
      const double f = rc.value("measured_deload_factor", 1.0);
      if (!rc.value("trace_deloaded", false) && f > 0 && std::isfinite(f)) s.measured_scale = f;
    }
  }
  std::map<std::string, CompareLine> classes, ops;
  const bool op_classes = by_op_class(m);
  for (const TraceRow& r : m.rows) {
    const bool measured = is_measured_row(r);
    // A process drawn once for N identical GPUs holds N GPUs' time.
    int64_t copies = 1;
    for (const GpuBreakdown& g : m.gpus) {
      if (g.pid == r.pid) copies = g.copies;
    }
    const double w = static_cast<double>(copies) / gpus[measured ? 1 : 0] / n_steps[measured ? 1 : 0] *
                     (measured ? s.measured_scale : 1.0);
    for (const TraceEvent& e : r.events) {
      if (e.depth > 0) continue;  // nested slices are inside their parents' time
      const std::string cls = class_of(m, e, op_classes);
      CompareLine& c = classes[cls];
      c.name = cls;
      c.op_class_index = op_classes ? e.op_class : -1;
      (measured ? c.measured_us : c.predicted_us) += w * e.dur_us;
      const std::string op = op_of(m, e);
      CompareLine& o = ops[op];
      o.name = op;
      o.op_class = cls;
      o.op_class_index = op_classes ? e.op_class : -1;
      (measured ? o.measured_us : o.predicted_us) += w * e.dur_us;
    }
  }
  for (auto& [k, c] : classes) s.classes.push_back(c);
  for (auto& [k, o] : ops) s.ops.push_back(o);
  std::sort(s.classes.begin(), s.classes.end(), [](const CompareLine& a, const CompareLine& b) {
    return a.predicted_us + a.measured_us > b.predicted_us + b.measured_us;
  });
  std::sort(s.ops.begin(), s.ops.end(), [](const CompareLine& a, const CompareLine& b) {
    return std::fabs(a.predicted_us - a.measured_us) > std::fabs(b.predicted_us - b.measured_us);
  });
  return s;
}

std::vector<SliceRef> slices_of_class(const TraceModel& m, const std::string& op_class, size_t limit) {
  std::vector<std::pair<double, SliceRef>> all;
  const bool op_classes = by_op_class(m);
  for (size_t r = 0; r < m.rows.size(); ++r) {
    const auto& events = m.rows[r].events;
    for (size_t i = 0; i < events.size(); ++i) {
      if (class_of(m, events[i], op_classes) == op_class)
        all.push_back({events[i].dur_us, SliceRef{static_cast<int>(r), static_cast<int>(i)}});
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<SliceRef> out;
  for (size_t i = 0; i < all.size() && i < limit; ++i) out.push_back(all[i].second);
  return out;
}

}  // namespace rackstep::gui
