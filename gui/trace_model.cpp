// Chrome trace JSON -> rows of slices, critical path and exposed communication; see gui/trace_model.h.
#include "gui/trace_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <zlib.h>

#include "sim/base/check.h"

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
  std::vector<TraceInstant> instants;
};

// Ids given as strings sort after none of the numbers a trace is likely to
// use, and keep their order of first appearance among themselves.
constexpr int64_t kStringIdBase = INT64_MIN / 2;

struct FlowPoint {
  int64_t pid = 0, tid = 0;
  double ts_us = 0;
};

// The fields of one trace event the Builder reads, as pointers to JSON values:
// into a parsed document, or into the streaming parser's per-event slots.
// find()/end() mirror a JSON object's, so the Builder reads either the same way.
struct EventView {
  static constexpr const char* kKeys[] = {"ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "bind_id", "args", "s"};
  static constexpr int kFields = static_cast<int>(std::size(kKeys));
  const json* field[kFields] = {};
  const json* not_object = nullptr;  // the element itself when it is not an object

  static int slot(std::string_view key) {
    for (int k = 0; k < kFields; ++k) {
      if (key == kKeys[k]) return k;
    }
    return -1;
  }
  static EventView of(const json& e) {
    EventView v;
    if (!e.is_object()) {
      v.not_object = &e;
      return v;
    }
    for (auto it = e.begin(); it != e.end(); ++it) {
      const int k = slot(it.key());
      if (k >= 0) v.field[k] = &*it;
    }
    return v;
  }
  const json* find(const char* key) const {
    const int k = slot(key);
    return k >= 0 ? field[k] : nullptr;
  }
  const json* end() const { return nullptr; }
  bool is_object() const { return not_object == nullptr; }
};

struct Builder {
  const std::string& path;
  std::map<int64_t, std::pair<int64_t, std::string>> processes;  // pid -> (sort index, name)
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, std::string>> threads;
  std::map<std::pair<int64_t, int64_t>, RowBuild> rows;
  std::map<std::string, int> category_ids, op_ids, op_class_ids;
  std::vector<std::string> ops, op_classes;
  std::map<std::string, int64_t> string_ids;  // pids/tids given as strings
  std::map<int64_t, std::string> string_names;  // and back
  std::vector<std::string> categories;
  std::map<std::pair<int64_t, std::string>, CounterTrack> counters;
  std::map<std::string, FlowPoint> flow_last;  // flow id -> its latest point
  std::vector<std::pair<FlowPoint, FlowPoint>> flows;
  int64_t n_instants = 0;

  std::string where(size_t i, const char* field) const {
    return "/traceEvents/" + std::to_string(i) + (field[0] ? "/" : "") + field;
  }

  int64_t id(const EventView& e, const char* field, size_t i) {
    auto it = e.find(field);
    if (it == e.end()) return 0;  // viewers put id-less events in process/thread 0
    if (it->is_number_integer()) return it->get<int64_t>();
    if (it->is_number()) return static_cast<int64_t>(it->get<double>());
    if (it->is_string()) {
      auto [s, added] = string_ids.emplace(it->get<std::string>(), kStringIdBase + static_cast<int64_t>(string_ids.size()));
      if (added) string_names[s->second] = s->first;
      return s->second;
    }
    throw UserError(path, where(i, field), "a number or a string", kind_of(*it));
  }

  double number(const EventView& e, const char* field, size_t i) {
    auto it = e.find(field);
    if (it == e.end()) throw UserError(path, where(i, field), "a number (microseconds)", "nothing");
    if (!it->is_number()) throw UserError(path, where(i, field), "a number (microseconds)", kind_of(*it));
    return it->get<double>();
  }

  // Consecutive events mostly share a row and a category: the last lookup is kept.
  RowBuild& row(int64_t pid, int64_t tid) {
    if (last_row_ == nullptr || last_pid_ != pid || last_tid_ != tid) {
      last_row_ = &rows[{pid, tid}];  // std::map: the reference stays valid
      last_pid_ = pid;
      last_tid_ = tid;
    }
    return *last_row_;
  }

  int category(const EventView& e) {
    auto it = e.find("cat");
    static const std::string kNone;
    const std::string& c = it != e.end() && it->is_string() ? it->get_ref<const std::string&>() : kNone;
    if (last_category_ >= 0 && categories[last_category_] == c) return last_category_;
    auto [s, added] = category_ids.emplace(c, static_cast<int>(categories.size()));
    if (added) categories.push_back(c);
    last_category_ = s->second;
    return s->second;
  }
  RowBuild* last_row_ = nullptr;
  int64_t last_pid_ = 0, last_tid_ = 0;
  int last_category_ = -1;

  static int intern(const json& args, const char* key, std::map<std::string, int>& ids, std::vector<std::string>& names) {
    auto it = args.find(key);
    if (it == args.end() || !it->is_string()) return -1;
    auto [s, added] = ids.emplace(it->get<std::string>(), static_cast<int>(names.size()));
    if (added) names.push_back(s->first);
    return s->second;
  }

  TraceEvent slice(const EventView& e, size_t i, double start_us) {
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
      ev.op = intern(*args, "op", op_ids, ops);
      ev.op_class = intern(*args, "op_class", op_class_ids, op_classes);
      // The CPU profiler's older name for it.
      if (ev.op_class < 0) ev.op_class = intern(*args, "class", op_class_ids, op_classes);
      auto step = args->find("step");
      if (step != args->end() && step->is_number_integer()) ev.step = static_cast<int>(step->get<int64_t>());
    }
    // The simulator names a step's tasks "step<N>.<...>".
    if (ev.step < 0 && ev.name.size() > 5 && ev.name.compare(0, 4, "step") == 0 &&
        std::isdigit(static_cast<unsigned char>(ev.name[4]))) {
      ev.step = std::atoi(ev.name.c_str() + 4);
    }
    return ev;
  }

  void metadata_event(const EventView& e, size_t i, int64_t pid, int64_t tid) {
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

  void event(const EventView& e, size_t i) {
    if (!e.is_object()) throw UserError(path, where(i, ""), "an event object", kind_of(*e.not_object));
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
      row(pid, tid).events.push_back(std::move(ev));
      return;
    }
    if (ph == "B") {
      row(pid, tid).open.push_back(slice(e, i, number(e, "ts", i)));
      return;
    }
    if (ph == "E") {
      RowBuild& r = row(pid, tid);
      if (r.open.empty()) return;  // an end without a begin: nothing to draw
      TraceEvent ev = std::move(r.open.back());
      r.open.pop_back();
      const double end_us = number(e, "ts", i);
      if (end_us < ev.start_us)
        throw UserError(path, where(i, "ts"), "an end time >= its begin (" + std::to_string(ev.start_us) + ")",
                        std::to_string(end_us));
      ev.dur_us = end_us - ev.start_us;
      r.events.push_back(std::move(ev));
      return;
    }
    if (ph == "i" || ph == "I") {
      TraceInstant in;
      in.ts_us = number(e, "ts", i);
      auto name = e.find("name");
      if (name != e.end() && name->is_string()) in.name = name->get<std::string>();
      in.category = category(e);
      row(pid, tid).instants.push_back(std::move(in));
      ++n_instants;
      return;
    }
    if (ph == "C") return counter_event(e, i, pid);
    if (ph == "s" || ph == "t" || ph == "f") return flow_event(e, i, ph, pid, tid);
    // Async events, samples, object snapshots: not drawn.
  }

  void counter_event(const EventView& e, size_t i, int64_t pid) {
    auto args = e.find("args");
    if (args == e.end() || !args->is_object()) return;
    auto name = e.find("name");
    const std::string n = name != e.end() && name->is_string() ? name->get<std::string>() : std::string("counter");
    CounterTrack& c = counters[{pid, n}];
    c.pid = pid;
    c.name = n;
    std::vector<double> row(c.series.size(), NAN);
    for (auto it = args->begin(); it != args->end(); ++it) {
      if (!it->is_number()) continue;
      auto at = std::find(c.series.begin(), c.series.end(), it.key());
      if (at == c.series.end()) {
        c.series.push_back(it.key());
        row.push_back(NAN);
        at = c.series.end() - 1;
      }
      row[static_cast<size_t>(at - c.series.begin())] = it->get<double>();
    }
    c.ts_us.push_back(number(e, "ts", i));
    c.values.push_back(std::move(row));
  }

  void flow_event(const EventView& e, size_t i, const std::string& ph, int64_t pid, int64_t tid) {
    auto idf = e.find("id");
    if (idf == e.end()) idf = e.find("bind_id");
    if (idf == e.end()) return;
    auto cat = e.find("cat");
    const std::string key = (cat != e.end() && cat->is_string() ? cat->get<std::string>() : std::string()) + "#" +
                            (idf->is_string() ? idf->get<std::string>() : idf->dump());
    const FlowPoint here{pid, tid, number(e, "ts", i)};
    if (ph == "s") {
      flow_last[key] = here;
      return;
    }
    auto from = flow_last.find(key);
    if (from == flow_last.end()) return;  // a flow end without a start: nothing to connect
    flows.emplace_back(from->second, here);
    if (ph == "t") from->second = here;
    else flow_last.erase(from);
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

// "name (x64)": 64 identical GPUs drawn as one process (sim/des.cpp export_trace).
int64_t copies_in(const std::string& process_name) {
  const size_t open = process_name.rfind("(x");
  if (open == std::string::npos || process_name.back() != ')') return 1;
  const std::string digits = process_name.substr(open + 2, process_name.size() - open - 3);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return 1;
  return std::max<int64_t>(1, std::stoll(digits));
}

// One GPU's time from t0 to t1, swept as sim/des.cpp gpu_exposure does:
// compute when any compute slice runs, else exposed (split evenly between
// the categories running), else idle.
GpuBreakdown gpu_breakdown(const TraceModel& m, const std::vector<const TraceRow*>& rows, double t0, double t1) {
  struct Point {
    double t;
    int delta;  // +1 start, -1 end
    int cat;    // -1: compute
  };
  std::vector<Point> pts;
  for (const TraceRow* r : rows) {
    for (const TraceEvent& e : r->events) {
      if (e.dur_us <= 0) continue;
      const int c = r->compute ? -1 : e.category;
      pts.push_back({e.start_us, +1, c});
      pts.push_back({e.start_us + e.dur_us, -1, c});
    }
  }
  std::sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) {
    if (a.t != b.t) return a.t < b.t;
    return a.delta < b.delta;  // ends before starts at the same instant
  });
  GpuBreakdown g;
  g.exposed_us_by_category.assign(m.categories.size(), 0);
  std::vector<int> active(m.categories.size(), 0);
  int compute = 0, kinds = 0;
  double prev = t0;
  auto account = [&](double until) {
    const double dt = until - prev;
    if (dt <= 0) return;
    if (compute > 0) {
      g.compute_us += dt;
    } else if (kinds == 0) {
      g.idle_us += dt;
    } else {
      for (size_t c = 0; c < active.size(); ++c) {
        if (active[c] > 0) g.exposed_us_by_category[c] += dt / kinds;
      }
    }
  };
  for (const Point& p : pts) {
    account(p.t);
    prev = std::max(prev, p.t);
    if (p.cat < 0) {
      compute += p.delta;
      continue;
    }
    const int before = active[p.cat];
    active[p.cat] += p.delta;
    if (before == 0 && active[p.cat] > 0) ++kinds;
    if (before > 0 && active[p.cat] == 0) --kinds;
  }
  account(t1);
  for (double v : g.exposed_us_by_category) g.exposed_us += v;
  return g;
}

void find_gpu_breakdowns(TraceModel& m) {
  std::map<int64_t, std::vector<const TraceRow*>> by_pid;
  std::vector<int64_t> order;
  for (const TraceRow& r : m.rows) {
    if (!r.compute && !r.comm && !r.host) continue;
    auto [it, added] = by_pid.try_emplace(r.pid);
    if (added) order.push_back(r.pid);
    it->second.push_back(&r);
  }
  GpuBreakdown& avg = m.per_gpu;
  avg.exposed_us_by_category.assign(m.categories.size(), 0);
  avg.copies = 0;
  for (int64_t pid : order) {
    const auto& rows = by_pid[pid];
    GpuBreakdown g = gpu_breakdown(m, rows, m.t0_us, m.t1_us);
    g.pid = pid;
    g.process_name = rows.front()->process_name;
    g.copies = copies_in(g.process_name);
    const double w = static_cast<double>(g.copies);
    avg.copies += g.copies;
    avg.compute_us += w * g.compute_us;
    avg.exposed_us += w * g.exposed_us;
    avg.idle_us += w * g.idle_us;
    for (size_t c = 0; c < m.categories.size(); ++c) avg.exposed_us_by_category[c] += w * g.exposed_us_by_category[c];
    m.gpus.push_back(std::move(g));
  }
  if (avg.copies == 0) return;
  const double w = static_cast<double>(avg.copies);
  avg.compute_us /= w;
  avg.exposed_us /= w;
  avg.idle_us /= w;
  for (double& v : avg.exposed_us_by_category) v /= w;
}

// Nesting levels: a slice starting inside an open one goes one lane below it.
// Lanes beyond kMaxDepths share the last (a link row with hundreds of
// concurrent flows stays a few lanes tall).
constexpr int kMaxDepths = 6;
constexpr double kRoundingUs = 0.002;

void assign_depths(TraceRow& r) {
  std::vector<double> open_ends;
  int deepest = 0;
  for (TraceEvent& e : r.events) {
    // Writers round times (sim/base/trace.cpp: to the nanosecond, start and duration
    // apart), so back-to-back slices can overlap by a nanosecond: not nesting.
    while (!open_ends.empty() && open_ends.back() <= e.start_us + kRoundingUs) open_ends.pop_back();
    e.depth = std::min(static_cast<int>(open_ends.size()), kMaxDepths - 1);
    deepest = std::max(deepest, e.depth);
    open_ends.push_back(e.start_us + e.dur_us);
  }
  r.depths = deepest + 1;
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
    r.host = !r.compute && gpu != compute_by_pid.end() && is_host_name(r.thread_name);
    if (!r.comm) continue;
    r.exposed_us = subtract(intervals(r), gpu->second);
    r.exposed_total_us = total(r.exposed_us);
  }
}

// A category is communication when most of its time is on communication rows;
// slots number each kind's categories in order of first appearance.
void classify_categories(TraceModel& m) {
  std::vector<double> comm_us(m.categories.size(), 0), host_us(m.categories.size(), 0);
  for (const TraceRow& r : m.rows) {
    if (!r.comm && !r.host) continue;
    for (const TraceEvent& e : r.events) (r.comm ? comm_us : host_us)[e.category] += e.dur_us;
  }
  m.category_is_host.assign(m.categories.size(), 0);
  for (size_t c = 0; c < m.categories.size(); ++c) m.category_is_host[c] = host_us[c] > 0.5 * m.category_total_us[c];
  m.category_is_comm.assign(m.categories.size(), 0);
  m.category_slot.assign(m.categories.size(), 0);
  int slots[2] = {0, 0};
  for (size_t c = 0; c < m.categories.size(); ++c) {
    m.category_is_comm[c] = comm_us[c] > 0.5 * m.category_total_us[c] ? 1 : 0;
    m.category_slot[c] = slots[m.category_is_comm[c] ? 1 : 0]++;
  }
}

TraceModel finish_trace(Builder& b, TraceModel m, const std::string& events_path) {
  const std::string& path = b.path;
  auto id_name = [&](int64_t id, const char* what) {
    auto s = b.string_names.find(id);
    return s != b.string_names.end() ? s->second : std::string(what) + " " + std::to_string(id);
  };
  // Rows in viewer order: process sort index, then thread sort index.
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> order;
  for (auto& [key, rb] : b.rows) {
    if (rb.events.empty() && rb.instants.empty()) continue;
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
    r.process_name = p != b.processes.end() && !p->second.second.empty() ? p->second.second : id_name(pid, "pid");
    r.thread_name = t != b.threads.end() && !t->second.second.empty() ? t->second.second : id_name(tid, "tid");
    RowBuild& rb = b.rows[{pid, tid}];
    r.events = std::move(rb.events);
    r.instants = std::move(rb.instants);
    // Parents before their children: by start, then the longer first.
    std::stable_sort(r.events.begin(), r.events.end(), [](const TraceEvent& x, const TraceEvent& y) {
      return x.start_us < y.start_us || (x.start_us == y.start_us && x.dur_us > y.dur_us);
    });
    std::stable_sort(r.instants.begin(), r.instants.end(),
                     [](const TraceInstant& x, const TraceInstant& y) { return x.ts_us < y.ts_us; });
    assign_depths(r);
    for (const TraceInstant& in : r.instants) {
      t0 = std::min(t0, in.ts_us);
      t1 = std::max(t1, in.ts_us);
    }
    for (const TraceEvent& e : r.events) {
      r.max_dur_us = std::max(r.max_dur_us, e.dur_us);
      t0 = std::min(t0, e.start_us);
      t1 = std::max(t1, e.start_us + e.dur_us);
      m.category_total_us[e.category] += e.dur_us;
      m.n_critical += e.critical ? 1 : 0;
      if (e.critical) m.critical_us_by_category[e.category] += e.dur_us;
    }
    m.n_events += static_cast<int64_t>(r.events.size());
    m.rows.push_back(std::move(r));
  }
  m.n_instants = b.n_instants;
  // Counter tracks in process order; a missing series value keeps the last one.
  std::map<int64_t, size_t> process_rank;
  for (const auto& [psort, pid, tsort, tid] : order) process_rank.try_emplace(pid, process_rank.size());
  for (auto& [key, c] : b.counters) {
    auto p = b.processes.find(c.pid);
    c.process_name = p != b.processes.end() && !p->second.second.empty() ? p->second.second : id_name(c.pid, "pid");
    std::vector<size_t> idx(c.ts_us.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return c.ts_us[x] < c.ts_us[y]; });
    CounterTrack sorted = c;
    std::vector<double> last(c.series.size(), 0);
    bool first = true;
    for (size_t k = 0; k < idx.size(); ++k) {
      sorted.ts_us[k] = c.ts_us[idx[k]];
      std::vector<double> row = c.values[idx[k]];
      row.resize(c.series.size(), NAN);
      for (size_t s = 0; s < row.size(); ++s) {
        if (std::isnan(row[s])) row[s] = last[s];
        last[s] = row[s];
        sorted.max_value = first ? row[s] : std::max(sorted.max_value, row[s]);
        sorted.min_value = first ? row[s] : std::min(sorted.min_value, row[s]);
        first = false;
      }
      sorted.values[k] = std::move(row);
    }
    if (!sorted.ts_us.empty()) {
      t0 = std::min(t0, sorted.ts_us.front());
      t1 = std::max(t1, sorted.ts_us.back());
    }
    m.counters.push_back(std::move(sorted));
  }
  std::stable_sort(m.counters.begin(), m.counters.end(), [&](const CounterTrack& x, const CounterTrack& y) {
    auto rx = process_rank.find(x.pid), ry = process_rank.find(y.pid);
    const size_t ax = rx == process_rank.end() ? SIZE_MAX : rx->second, ay = ry == process_rank.end() ? SIZE_MAX : ry->second;
    return ax < ay;
  });
  if (m.rows.empty() && m.counters.empty())
    throw UserError(path, events_path, "at least one slice (\"ph\":\"X\" or a \"B\"/\"E\" pair)", "none");
  m.t0_us = t0;
  m.t1_us = t1 > t0 ? t1 : t0 + 1;
  // Flows between rows that exist.
  std::map<std::pair<int64_t, int64_t>, int> row_of;
  for (size_t i = 0; i < m.rows.size(); ++i) row_of[{m.rows[i].pid, m.rows[i].tid}] = static_cast<int>(i);
  for (const auto& [a, z] : b.flows) {
    auto ra = row_of.find({a.pid, a.tid}), rz = row_of.find({z.pid, z.tid});
    if (ra == row_of.end() || rz == row_of.end()) continue;
    m.flows.push_back({ra->second, rz->second, a.ts_us, z.ts_us});
  }
  find_exposed(m);
  classify_categories(m);
  find_gpu_breakdowns(m);
  return m;
}

TraceModel model_from(Builder& b, const json& doc, const std::string& events_path) {
  TraceModel m;
  m.path = b.path;
  m.categories = b.categories;
  m.ops = b.ops;
  m.op_classes = b.op_classes;
  m.category_total_us.assign(m.categories.size(), 0);
  m.critical_us_by_category.assign(m.categories.size(), 0);
  if (doc.is_object()) {
    auto md = doc.find("metadata");
    if (md != doc.end() && md->is_object()) {
      for (auto it = md->begin(); it != md->end(); ++it)
        m.metadata.emplace_back(it.key(), it->is_string() ? it->get<std::string>() : it->dump());
    }
    auto od = doc.find("otherData");
    if (od != doc.end() && od->is_object()) m.other_data_json = od->dump();
  }
  return finish_trace(b, std::move(m), events_path);
}

// Streams a trace: each event's fields go into slots (pid, ts, name, args...)
// read by the Builder and reused for the next event, so a file of millions of
// slices never exists as a JSON tree (several times the file's size in
// memory). Only an event's "args" and values of unknown keys are built as
// JSON; top-level values other than traceEvents (metadata, otherData) are kept
// whole, they are small.
class TraceSax : public nlohmann::json_sax<json> {
 public:
  TraceSax(Builder& b) : b_(b) {}
  json top = json::object();  // top-level values except traceEvents
  bool root_is_array = false, root_is_object = false, saw_events = false;

  bool null() override { return scalar(json()); }
  bool boolean(bool v) override { return scalar(json(v)); }
  bool number_integer(number_integer_t v) override { return scalar(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return scalar(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return scalar(json(v)); }
  bool string(string_t& v) override { return scalar(json(std::move(v))); }
  bool binary(binary_t&) override { return scalar(json()); }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    if (!stack_.empty()) key_ = k;
    else if (in_event_ && depth_ == event_depth_ + 1) field_ = EventView::slot(k);
    else if (depth_ == 1) top_key_ = k;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    throw UserError(b_.path, "", "valid JSON", "a syntax error at byte " + std::to_string(position));
  }

 private:
  // Inside the traceEvents array: its elements are events.
  bool in_events() const { return events_depth_ >= 0 && depth_ == events_depth_ + 1; }

  json* add(json v) {
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }

  // Where a value directly under the current event goes: its slot, or scratch for unknown keys.
  json* event_slot() {
    if (field_ < 0) return &scratch_;
    view_.field[field_] = &slots_[field_];
    return &slots_[field_];
  }

  bool scalar(json v) {
    if (!stack_.empty()) {
      add(std::move(v));
      return true;
    }
    if (in_event_ && depth_ == event_depth_ + 1) {
      if (field_ >= 0) *event_slot() = std::move(v);
      return true;
    }
    if (in_events()) {
      b_.event(EventView::of(v), index_++);  // not an object: the Builder names the error
      return true;
    }
    if (depth_ == 1 && root_is_object) top[top_key_] = std::move(v);
    return true;
  }

  bool open(bool object) {
    json v = object ? json::object() : json::array();
    if (!stack_.empty()) {
      stack_.push_back(add(std::move(v)));
    } else if (in_event_ && depth_ == event_depth_ + 1) {
      json* slot = event_slot();  // args, or a value a Builder check reports (a pid given as an object)
      *slot = std::move(v);
      stack_.push_back(slot);
    } else if (depth_ == 0) {
      root_is_array = !object;
      root_is_object = object;
      if (root_is_array) events_depth_ = 0, saw_events = true;
    } else if (in_events()) {
      if (object) {
        in_event_ = true;
        event_depth_ = depth_;
        for (int k = 0; k < EventView::kFields; ++k) view_.field[k] = nullptr;
      } else {
        element_ = std::move(v);
        stack_.push_back(&element_);
      }
    } else if (depth_ == 1 && root_is_object) {
      if (top_key_ == "traceEvents" && !object) {
        events_depth_ = 1;
        saw_events = true;
      } else {
        top_current_ = std::move(v);
        stack_.push_back(&top_current_);
      }
    }
    ++depth_;
    return true;
  }

  bool close() {
    --depth_;
    if (!stack_.empty()) {
      stack_.pop_back();
      if (!stack_.empty()) return true;
      if (in_event_) return true;  // a nested value of the event is complete
      if (in_events()) {
        b_.event(EventView::of(element_), index_++);  // an array where an event should be
        element_ = json();
      } else {
        top[top_key_] = std::move(top_current_);
      }
      return true;
    }
    if (in_event_ && depth_ == event_depth_) {
      in_event_ = false;
      b_.event(view_, index_++);
      return true;
    }
    if (events_depth_ >= 0 && depth_ == events_depth_) events_depth_ = -2;  // traceEvents ended
    return true;
  }

  Builder& b_;
  std::vector<json*> stack_;  // the value being built, innermost last
  std::string key_, top_key_;
  json element_, top_current_, scratch_;
  json slots_[EventView::kFields];
  EventView view_;
  bool in_event_ = false;
  int field_ = -1;
  int depth_ = 0, events_depth_ = -1, event_depth_ = -1;
  size_t index_ = 0;
};


}  // namespace

double TraceModel::per_gpu_exposed_comm_us() const {
  double s = 0;
  for (size_t c = 0; c < per_gpu.exposed_us_by_category.size(); ++c) {
    if (!category_is_host[c]) s += per_gpu.exposed_us_by_category[c];
  }
  return s;
}

double TraceModel::per_gpu_exposed_host_us() const { return per_gpu.exposed_us - per_gpu_exposed_comm_us(); }

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
  for (size_t i = 0; i < events->size(); ++i) b.event(EventView::of((*events)[i]), i);
  return model_from(b, doc.is_object() ? doc : json::object(), events_path);
}



std::string read_maybe_gzip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path, "", "a readable file", "it cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = std::move(ss).str();
  if (bytes.size() < 2 || static_cast<unsigned char>(bytes[0]) != 0x1f || static_cast<unsigned char>(bytes[1]) != 0x8b)
    return bytes;
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw UserError(path, "", "a gzip stream zlib can open", "an init failure");
  z.next_in = reinterpret_cast<Bytef*>(bytes.data());
  z.avail_in = static_cast<uInt>(bytes.size());
  std::string out;
  std::vector<char> buf(1 << 20);
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    z.next_out = reinterpret_cast<Bytef*>(buf.data());
    z.avail_out = static_cast<uInt>(buf.size());
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      inflateEnd(&z);
      throw UserError(path, "", "a complete gzip stream", std::string("a zlib error (") + (z.msg ? z.msg : "truncated") + ")");
    }
    out.append(buf.data(), buf.size() - z.avail_out);
    if (rc == Z_OK && z.avail_in == 0 && z.avail_out != 0) {
      inflateEnd(&z);
      throw UserError(path, "", "a complete gzip stream", "it ends early");
    }
  }
  inflateEnd(&z);
  return out;
}

TraceModel parse_trace_text(const std::string& text, const std::string& path) {
  Builder b{path};
  TraceSax sax(b);
  json::sax_parse(text, &sax);
  if (!sax.root_is_object && !sax.root_is_array)
    throw UserError(path, "", "a Chrome trace (an object with \"traceEvents\" or an array of events)",
                    "a JSON scalar");
  if (!sax.saw_events) {
    auto it = sax.top.find("traceEvents");
    if (it == sax.top.end())
      throw UserError(path, "/traceEvents", "a Chrome trace (an object with \"traceEvents\")", "no traceEvents");
    throw UserError(path, "/traceEvents", "an array of events", kind_of(*it));
  }
  return model_from(b, sax.top, sax.root_is_array ? "" : "/traceEvents");
}

bool looks_like_trace_text(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return false;
  if (text[first] == '[') return text.find("\"ph\"", first) != std::string::npos;
  return text.find("\"traceEvents\"") != std::string::npos;
}

TraceModel load_trace(const std::string& path) { return parse_trace_text(read_maybe_gzip(path), path); }

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
