// Chrome trace JSON -> rows of slices, critical path and exposed communication; see gui/trace_model.h.
#include "gui/trace_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "models/check.h"

namespace rackstep::gui {
namespace {

using json = nlohmann::ordered_json;
using Interval = std::pair<double, double>;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string kind_of(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// The parse state of one (pid, tid).
struct RowBuild {
  std::vector<TraceEvent> events;
  std::vector<TraceEvent> open;  // "B" slices waiting for their "E"
};

struct Builder {
  const std::string& path;
  std::map<int64_t, std::pair<int64_t, std::string>> processes;  // pid -> (sort index, name)
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, std::string>> threads;
  std::map<std::pair<int64_t, int64_t>, RowBuild> rows;
  std::map<std::string, int> category_ids;
  std::map<std::string, int64_t> string_ids;  // pids/tids given as strings
  std::vector<std::string> categories;

  std::string where(size_t i, const char* field) const {
    return "/traceEvents/" + std::to_string(i) + (field[0] ? "/" : "") + field;
  }

  int64_t id(const json& e, const char* field, size_t i) {
    auto it = e.find(field);
    if (it == e.end()) return 0;  // viewers put id-less events in process/thread 0
    if (it->is_number_integer()) return it->get<int64_t>();
    if (it->is_number()) return static_cast<int64_t>(it->get<double>());
    if (it->is_string()) {
      auto [s, added] = string_ids.emplace(it->get<std::string>(), -1 - static_cast<int64_t>(string_ids.size()));
      return s->second;
    }
    throw UserError(path, where(i, field), "a number or a string", kind_of(*it));
  }

  double number(const json& e, const char* field, size_t i) {
    auto it = e.find(field);
    if (it == e.end()) throw UserError(path, where(i, field), "a number (microseconds)", "nothing");
    if (!it->is_number()) throw UserError(path, where(i, field), "a number (microseconds)", kind_of(*it));
    return it->get<double>();
  }

  int category(const json& e) {
    auto it = e.find("cat");
    std::string c = it != e.end() && it->is_string() ? it->get<std::string>() : std::string();
    auto [s, added] = category_ids.emplace(c, static_cast<int>(categories.size()));
    if (added) categories.push_back(c);
    return s->second;
  }

  TraceEvent slice(const json& e, size_t i, double start_us) {
    TraceEvent ev;
    ev.start_us = start_us;
    auto name = e.find("name");
    if (name != e.end() && name->is_string()) ev.name = name->get<std::string>();
    ev.category = category(e);
    auto args = e.find("args");
    if (args != e.end() && !args->is_null()) {
      if (!args->is_object()) throw UserError(path, where(i, "args"), "an object", kind_of(*args));
      ev.args_json = args->dump();
      auto crit = args->find("critical");
      ev.critical = crit != args->end() && crit->is_boolean() && crit->get<bool>();
    }
    return ev;
  }

  void metadata_event(const json& e, size_t i, int64_t pid, int64_t tid) {
    auto name = e.find("name");
    if (name == e.end() || !name->is_string()) return;
    auto args = e.find("args");
    if (args == e.end() || !args->is_object()) return;
    const std::string what = name->get<std::string>();
    auto str = args->find("name");
    auto idx = args->find("sort_index");
    if (what == "process_name" && str != args->end() && str->is_string()) {
      processes.try_emplace(pid, pid, "").first->second.second = str->get<std::string>();
    } else if (what == "thread_name" && str != args->end() && str->is_string()) {
      threads.try_emplace({pid, tid}, tid, "").first->second.second = str->get<std::string>();
    } else if (what == "process_sort_index" && idx != args->end() && idx->is_number()) {
      processes.try_emplace(pid, pid, "").first->second.first = idx->get<int64_t>();
    } else if (what == "thread_sort_index" && idx != args->end() && idx->is_number()) {
      threads.try_emplace({pid, tid}, tid, "").first->second.first = idx->get<int64_t>();
    }
  }

  void event(const json& e, size_t i) {
    if (!e.is_object()) throw UserError(path, where(i, ""), "an event object", kind_of(e));
    auto ph_it = e.find("ph");
    if (ph_it == e.end() || !ph_it->is_string())
      throw UserError(path, where(i, "ph"), "a phase string (\"X\", \"B\", \"E\", \"M\", ...)",
                      ph_it == e.end() ? "nothing" : kind_of(*ph_it));
    const std::string ph = ph_it->get<std::string>();
    const int64_t pid = id(e, "pid", i), tid = id(e, "tid", i);
    if (ph == "M") return metadata_event(e, i, pid, tid);
    if (ph == "X") {
      TraceEvent ev = slice(e, i, number(e, "ts", i));
      ev.dur_us = number(e, "dur", i);
      if (ev.dur_us < 0) throw UserError(path, where(i, "dur"), "a duration >= 0", std::to_string(ev.dur_us));
      rows[{pid, tid}].events.push_back(std::move(ev));
      return;
    }
    if (ph == "B") {
      rows[{pid, tid}].open.push_back(slice(e, i, number(e, "ts", i)));
      return;
    }
    if (ph == "E") {
      RowBuild& r = rows[{pid, tid}];
      if (r.open.empty()) return;  // an end without a begin: nothing to draw
      TraceEvent ev = std::move(r.open.back());
      r.open.pop_back();
      const double end_us = number(e, "ts", i);
      if (end_us < ev.start_us)
        throw UserError(path, where(i, "ts"), "an end time >= its begin (" + std::to_string(ev.start_us) + ")",
                        std::to_string(end_us));
      ev.dur_us = end_us - ev.start_us;
      r.events.push_back(std::move(ev));
    }
    // Flows, counters, instants, async events: not drawn.
  }
};

// Union of intervals: sorted, disjoint.
std::vector<Interval> merge(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& x : v) {
    if (x.second <= x.first) continue;
    if (!out.empty() && x.first <= out.back().second) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

// a minus b, both sorted and disjoint.
std::vector<Interval> subtract(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  std::vector<Interval> out;
  size_t j = 0;
  for (Interval x : a) {
    while (j < b.size() && b[j].second <= x.first) ++j;
    double cur = x.first;
    for (size_t k = j; k < b.size() && b[k].first < x.second; ++k) {
      if (b[k].first > cur) out.push_back({cur, b[k].first});
      cur = std::max(cur, b[k].second);
    }
    if (cur < x.second) out.push_back({cur, x.second});
  }
  return out;
}

double total(const std::vector<Interval>& v) {
  double s = 0;
  for (const Interval& x : v) s += x.second - x.first;
  return s;
}

std::vector<Interval> intervals(const TraceRow& r) {
  std::vector<Interval> v;
  v.reserve(r.events.size());
  for (const TraceEvent& e : r.events) v.push_back({e.start_us, e.start_us + e.dur_us});
  return merge(std::move(v));
}

bool is_compute_name(const std::string& thread_name) { return lower(thread_name).find("compute") != std::string::npos; }

bool is_host_name(const std::string& thread_name) {
  const std::string n = lower(thread_name);
  return n.find("host") != std::string::npos || n.find("cpu") != std::string::npos;
}

// Classifies rows and fills exposed_us: communication not hidden under compute, per GPU.
void find_exposed(TraceModel& m) {
  std::map<int64_t, std::vector<Interval>> compute_by_pid;
  for (TraceRow& r : m.rows) {
    r.compute = is_compute_name(r.thread_name);
    std::vector<Interval> busy = intervals(r);
    r.busy_us = total(busy);
    if (!r.compute) continue;
    auto& c = compute_by_pid[r.pid];
    c.insert(c.end(), busy.begin(), busy.end());
  }
  for (auto& [pid, v] : compute_by_pid) v = merge(std::move(v));
  for (TraceRow& r : m.rows) {
    auto gpu = compute_by_pid.find(r.pid);
    r.comm = !r.compute && gpu != compute_by_pid.end() && !is_host_name(r.thread_name);
    if (!r.comm) continue;
    r.exposed_us = subtract(intervals(r), gpu->second);
    r.exposed_total_us = total(r.exposed_us);
  }
}

// A category is communication when most of its time is on communication rows;
// slots number each kind's categories in order of first appearance.
void classify_categories(TraceModel& m) {
  std::vector<double> comm_us(m.categories.size(), 0);
  for (const TraceRow& r : m.rows) {
    if (!r.comm) continue;
    for (const TraceEvent& e : r.events) comm_us[e.category] += e.dur_us;
  }
  m.category_is_comm.assign(m.categories.size(), 0);
  m.category_slot.assign(m.categories.size(), 0);
  int slots[2] = {0, 0};
  for (size_t c = 0; c < m.categories.size(); ++c) {
    m.category_is_comm[c] = comm_us[c] > 0.5 * m.category_total_us[c] ? 1 : 0;
    m.category_slot[c] = slots[m.category_is_comm[c] ? 1 : 0]++;
  }
}

}  // namespace

bool looks_like_trace(const json& doc) {
  if (doc.is_object()) return doc.contains("traceEvents");
  return doc.is_array() && !doc.empty() && doc.front().is_object() && doc.front().contains("ph");
}

size_t TraceModel::first_visible(const TraceRow& row, double t_us) const {
  // Slices are sorted by start; one starting before t_us - max_dur ends before t_us.
  const double from = t_us - row.max_dur_us;
  auto it = std::lower_bound(row.events.begin(), row.events.end(), from,
                             [](const TraceEvent& e, double t) { return e.start_us < t; });
  return static_cast<size_t>(it - row.events.begin());
}

TraceModel parse_trace(const json& doc, const std::string& path) {
  const json* events = nullptr;
  std::string events_path = "/traceEvents";
  if (doc.is_object()) {
    auto it = doc.find("traceEvents");
    if (it == doc.end())
      throw UserError(path, "/traceEvents", "a Chrome trace (an object with \"traceEvents\")", "no traceEvents");
    if (!it->is_array()) throw UserError(path, "/traceEvents", "an array of events", kind_of(*it));
    events = &*it;
  } else if (doc.is_array()) {
    events = &doc;
    events_path = "";
  } else {
    throw UserError(path, "", "a Chrome trace (an object with \"traceEvents\" or an array of events)", kind_of(doc));
  }

  Builder b{path};
  for (size_t i = 0; i < events->size(); ++i) b.event((*events)[i], i);

  TraceModel m;
  m.path = path;
  m.categories = b.categories;
  m.category_total_us.assign(m.categories.size(), 0);
  if (doc.is_object()) {
    auto md = doc.find("metadata");
    if (md != doc.end() && md->is_object()) {
      for (auto it = md->begin(); it != md->end(); ++it)
        m.metadata.emplace_back(it.key(), it->is_string() ? it->get<std::string>() : it->dump());
    }
  }
  // Rows in viewer order: process sort index, then thread sort index.
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> order;
  for (auto& [key, rb] : b.rows) {
    if (rb.events.empty()) continue;
    auto p = b.processes.find(key.first);
    auto t = b.threads.find(key);
    order.emplace_back(p != b.processes.end() ? p->second.first : key.first, key.first,
                       t != b.threads.end() ? t->second.first : key.second, key.second);
  }
  std::sort(order.begin(), order.end());
  double t0 = INFINITY, t1 = -INFINITY;
  for (auto& [psort, pid, tsort, tid] : order) {
    TraceRow r;
    r.pid = pid;
    r.tid = tid;
    auto p = b.processes.find(pid);
    auto t = b.threads.find({pid, tid});
    r.process_name = p != b.processes.end() && !p->second.second.empty() ? p->second.second
                                                                         : "pid " + std::to_string(pid);
    r.thread_name = t != b.threads.end() && !t->second.second.empty() ? t->second.second
                                                                      : "tid " + std::to_string(tid);
    r.events = std::move(b.rows[{pid, tid}].events);
    std::stable_sort(r.events.begin(), r.events.end(),
                     [](const TraceEvent& x, const TraceEvent& y) { return x.start_us < y.start_us; });
    for (const TraceEvent& e : r.events) {
      r.max_dur_us = std::max(r.max_dur_us, e.dur_us);
      t0 = std::min(t0, e.start_us);
      t1 = std::max(t1, e.start_us + e.dur_us);
      m.category_total_us[e.category] += e.dur_us;
      m.n_critical += e.critical ? 1 : 0;
    }
    m.n_events += static_cast<int64_t>(r.events.size());
    m.rows.push_back(std::move(r));
  }
  if (m.rows.empty())
    throw UserError(path, events_path, "at least one slice (\"ph\":\"X\" or a \"B\"/\"E\" pair)", "none");
  m.t0_us = t0;
  m.t1_us = t1;
  find_exposed(m);
  classify_categories(m);
  return m;
}

TraceModel load_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "", "a readable trace file", "it cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  json doc;
  try {
    doc = json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw UserError(path, "", "valid JSON", "a syntax error at byte " + std::to_string(e.byte));
  }
  return parse_trace(doc, path);
}

std::string format_us(double us) {
  char buf[48];
  const double a = std::fabs(us);
  if (a == 0) return "0 us";
  if (a >= 1e6) std::snprintf(buf, sizeof buf, "%.4g s", us * 1e-6);
  else if (a >= 1e3) std::snprintf(buf, sizeof buf, "%.4g ms", us * 1e-3);
  else if (a >= 1) std::snprintf(buf, sizeof buf, "%.4g us", us);
  else std::snprintf(buf, sizeof buf, "%.4g ns", us * 1e3);
  return buf;
}

}  // namespace rackstep::gui
