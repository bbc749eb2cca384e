// Chrome trace-event JSON writer (opens in Perfetto and chrome://tracing).
//
// Used by the simulator (sim/des.h export_trace) and by the executor's
// profiler, so predicted and measured timelines share one format:
// processes = GPUs (or switches, the fabric, hosts), threads = streams and
// resources, complete events = kernels / transfers, flows = dependencies.
// Times are given in seconds, rounded once each to whole nanoseconds and
// written in microseconds with three decimals (exact), as the format wants:
// a slice that starts where another ends shares its timestamp exactly.
//
//   rackstep::sim::TraceWriter w;
//   int gpu = w.process("gpu0");
//   int stream = w.thread(gpu, "compute");
//   w.complete(gpu, stream, "L0.fwd", "forward", 0.0, 1.5e-3, {{"mb", 0}});
//   int comm = w.thread(gpu, "comm");
//   w.complete(gpu, comm, "allgather", "fsdp", 1.5e-3, 0.5e-3);
//   w.flow(gpu, stream, 0.0, gpu, comm, 1.5e-3, "dep");
//   w.write("trace.json");   // atomic: temp file + rename
//
// Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
// ("ph":"X" complete, "ph":"M" metadata names, "ph":"s"/"f" flow start/end with "bp":"e").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace rackstep::sim {

class TraceWriter {
 public:
  // Declares a process; the returned pid orders processes in the viewer.
  int process(std::string_view name);
  // Declares a thread (a stream or resource) inside a process; returns its tid.
  int thread(int pid, std::string_view name);

  // A slice [start_s, start_s + duration_s) on (pid, tid).
  void complete(int pid, int tid, std::string_view name, std::string_view category,
                double start_s, double duration_s, const nlohmann::json& args = nullptr);
  // A slice [start_s, end_s): each end rounded once, so slices meeting at one
  // instant meet exactly (prefer it where the end time is known).
  void slice(int pid, int tid, std::string_view name, std::string_view category, double start_s, double end_s,
             const nlohmann::json& args = nullptr);
  // An arrow from the slice enclosing from_s on (from_pid, from_tid) to the
  // slice enclosing to_s on (to_pid, to_tid).
  void flow(int from_pid, int from_tid, double from_s, int to_pid, int to_tid, double to_s,
            std::string_view name = "dependency", std::string_view category = "dependency");
  // A counter track value (e.g. memory in use) on a process.
  void counter(int pid, std::string_view name, double at_s, double value);
  // A trace-wide key/value shown by viewers as metadata (model, layout, ...).
  void metadata(std::string_view key, const nlohmann::json& value);

  int64_t num_events() const { return static_cast<int64_t>(events_.size()); }
  // The whole trace as a JSON text.
  std::string to_string() const;
  // Writes atomically; a failure is a UserError naming the path.
  void write(const std::string& path) const;

 private:
  struct Event {
    char phase;  // 'X', 's', 'f', 'C'
    int pid, tid;
    int64_t ts_ns, dur_ns;
    int64_t flow_id;
    std::string name, category;
    std::string args;  // serialised JSON object, or empty
  };
  std::vector<std::string> process_names_;
  std::vector<std::vector<std::string>> thread_names_;  // per pid
  std::vector<Event> events_;
  nlohmann::json metadata_ = nlohmann::json::object();
  int64_t next_flow_id_ = 1;
};

// JSON string escaping for hand-written JSON (quotes included).
void append_json_string(std::string& out, std::string_view s);

}  // namespace rackstep::sim
