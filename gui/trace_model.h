// A Chrome trace-event JSON file read for drawing: one row per (process,
// thread) — per GPU, per stream — with its slices sorted by start time, the
// slices on the critical path, and the communication that is exposed (runs
// while the same GPU's compute stream is idle).
//
// Reads what sim/base/trace.h writes (predicted timelines) and what profilers write
// (measured ones, PyTorch, Perfetto JSON): "ph":"X" complete slices and "B"/"E"
// begin/end pairs (nested slices get a depth: one lane per nesting level),
// "i"/"I"/"n" instants, "C" counters (one track per process and name), "s"/"f"/"t"
// flows, and "M" process/thread names and sort indices. Pids and tids may be
// numbers or strings; a file ending in .gz is gunzipped. Unknown fields and
// phases (async, samples) are ignored.
//
//   rackstep::gui::TraceModel m = rackstep::gui::load_trace("trace.json");
//   for (const auto& row : m.rows) printf("%s/%s: %zu slices\n",
//       row.process_name.c_str(), row.thread_name.c_str(), row.events.size());
//
// Conventions it relies on (sim/des.cpp export_trace follows them):
//   - a thread whose name contains "compute" is a compute stream; a process
//     with one is a GPU, and its other threads (comm, nvlink, nic, copy)
//     carry communication, except threads named like "host" or "cpu";
//   - a slice whose args hold "critical": true lies on the critical path.
// Malformed input throws rackstep::UserError naming the file and JSON path.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rackstep::gui {

struct TraceEvent {
  double start_us = 0;
  double dur_us = 0;
  std::string name;
  int category = 0;       // index into TraceModel::categories
  std::string args_json;  // the slice's "args" as JSON text, empty when none
  bool critical = false;  // args.critical == true
  int depth = 0;          // nesting level within its row: 0 outermost
  int op = -1;            // args.op (a layer-graph op name), index into TraceModel::ops; -1 when none
  int op_class = -1;      // args.op_class, index into TraceModel::op_classes; -1 when none
  int step = -1;          // args.step, or N of a name "stepN...."; -1 when unknown
};

struct TraceInstant {
  double ts_us = 0;
  std::string name;
  int category = 0;
};

// A counter track: "C" events of one process and name; each args key is a series.
struct CounterTrack {
  int64_t pid = 0;
  std::string process_name, name;
  std::vector<std::string> series;     // args keys, in first-seen order
  std::vector<double> ts_us;           // sample times, sorted
  std::vector<std::vector<double>> values;  // [sample][series], a missing key keeps its last value
  double max_value = 0, min_value = 0;
};

// A dependency arrow between two rows ("s" to "f"/"t" of one id).
struct TraceFlow {
  int from_row = -1, to_row = -1;
  double from_us = 0, to_us = 0;
};

// Where a GPU's time goes, computed as `rackstep timeline` does (sim/des.cpp
// summarize): its compute streams busy, else its other work (communication,
// copies, host) exposed, else idle. Exposed time is split evenly between the
// categories running at that instant.
struct GpuBreakdown {
  std::string process_name;
  int64_t pid = 0;
  int64_t copies = 1;  // "(xN)" in the process name: N identical GPUs drawn once
  double compute_us = 0, exposed_us = 0, idle_us = 0;
  std::vector<double> exposed_us_by_category;  // index: TraceModel::categories
};

struct TraceRow {
  int64_t pid = 0, tid = 0;
  std::string process_name, thread_name;
  bool compute = false;  // a compute stream
  bool comm = false;     // a communication row of a GPU
  std::vector<TraceEvent> events;  // sorted by start_us
  double max_dur_us = 0;           // longest slice, bounds the search for visible slices
  // Intervals (start_us, end_us) where this row's communication runs while
  // every compute stream of its process is idle; sorted, disjoint.
  std::vector<std::pair<double, double>> exposed_us;
  double exposed_total_us = 0;
  double busy_us = 0;  // union of this row's slices
  int depths = 1;      // nesting levels (lanes) drawn
  bool host = false;   // a host/CPU row of a GPU process
  std::vector<TraceInstant> instants;  // sorted by ts_us
};

struct TraceModel {
  std::string path;
  std::vector<TraceRow> rows;            // by process sort order, then thread sort order
  std::vector<std::string> categories;   // in order of first appearance
  std::vector<double> category_total_us; // summed slice time per category
  std::vector<char> category_is_comm;    // most of its time lies on communication rows
  std::vector<int> category_slot;        // rank among categories of the same kind (for colours)
  double t0_us = 0, t1_us = 0;           // earliest start, latest end
  int64_t n_events = 0, n_critical = 0;
  std::vector<double> critical_us_by_category;  // summed time of critical slices, per category
  std::vector<std::pair<std::string, std::string>> metadata;  // trace-level "metadata" object
  std::vector<CounterTrack> counters;   // by process order, then name
  std::vector<TraceFlow> flows;
  std::vector<std::string> ops, op_classes;  // interned args.op / args.op_class values
  int64_t n_instants = 0;
  std::string other_data_json;          // trace-level "otherData", as JSON text

  // Per GPU (process with a compute stream), and their average weighted by
  // copies: the figures `rackstep timeline` prints as "per GPU".
  std::vector<GpuBreakdown> gpus;
  GpuBreakdown per_gpu;                 // the weighted average; process_name empty
  std::vector<char> category_is_host;   // most of its time lies on host rows of a GPU
  // Exposed time per GPU that is communication (not host work), and host work.
  double per_gpu_exposed_comm_us() const;
  double per_gpu_exposed_host_us() const;

  // First slice index in `row` that may overlap [t_us, ...): slices before it end before t_us.
  size_t first_visible(const TraceRow& row, double t_us) const;
};

// Reads and parses a trace file (.json or .json.gz); throws rackstep::UserError on any problem.
TraceModel load_trace(const std::string& path);
// The bytes of a file, gunzipped when they start with the gzip magic; throws rackstep::UserError.
std::string read_maybe_gzip(const std::string& path);
// Parses a trace's text, streaming (no JSON tree of the whole file); `path` only names the source in errors.
TraceModel parse_trace_text(const std::string& text, const std::string& path);
// True when text looks like a Chrome trace (cheap: no parse).
bool looks_like_trace_text(const std::string& text);
// Parses an already-read JSON document (ordered: keys keep file order); `path` only names the source in errors.
TraceModel parse_trace(const nlohmann::ordered_json& doc, const std::string& path);

// True when the document looks like a Chrome trace (an object with
// "traceEvents", or an array whose first element has "ph").
bool looks_like_trace(const nlohmann::ordered_json& doc);

// Formats a duration in microseconds with a unit that suits it ("1.25 ms").
std::string format_us(double us);

}  // namespace rackstep::gui
