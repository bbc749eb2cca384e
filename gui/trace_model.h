// A Chrome trace-event JSON file read for drawing: one row per (process,
// thread) — per GPU, per stream — with its slices sorted by start time, the
// slices on the critical path, and the communication that is exposed (runs
// while the same GPU's compute stream is idle).
//
// Reads what sim/trace.h writes (predicted timelines) and what profilers write
// (measured ones): "ph":"X" complete slices, "B"/"E" begin/end pairs, and
// "M" process/thread names and sort indices; other phases (flows, counters,
// instants) are skipped. Unknown fields are ignored.
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
  std::vector<std::pair<std::string, std::string>> metadata;  // trace-level "metadata" object

  // First slice index in `row` that may overlap [t_us, ...): slices before it end before t_us.
  size_t first_visible(const TraceRow& row, double t_us) const;
};

// Reads and parses a trace file; throws rackstep::UserError on any problem.
TraceModel load_trace(const std::string& path);
// Parses an already-read JSON document (ordered: keys keep file order); `path` only names the source in errors.
TraceModel parse_trace(const nlohmann::ordered_json& doc, const std::string& path);

// True when the document looks like a Chrome trace (an object with
// "traceEvents", or an array whose first element has "ph").
bool looks_like_trace(const nlohmann::ordered_json& doc);

// Formats a duration in microseconds with a unit that suits it ("1.25 ms").
std::string format_us(double us);

}  // namespace rackstep::gui
