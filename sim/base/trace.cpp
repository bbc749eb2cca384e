// Chrome trace-event JSON writer; see sim/base/trace.h.
#include "sim/base/trace.h"

#include <cmath>
#include <cstdio>

#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::sim {

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

namespace {

// Whole nanoseconds, rounded once; NaN/inf never reach the file.
int64_t to_ns(double s) {
  RS_CHECK(std::isfinite(s), "trace times must be finite");
  return std::llround(s * 1e9);
}

// Microseconds with three exact decimals.
void append_us(std::string& out, int64_t ns) {
  char buf[40];
  const int64_t mag = ns < 0 ? -ns : ns;
  std::snprintf(buf, sizeof buf, "%s%lld.%03lld", ns < 0 ? "-" : "", static_cast<long long>(mag / 1000),
                static_cast<long long>(mag % 1000));
  out += buf;
}

void append_int(std::string& out, int64_t v) { out += std::to_string(v); }

}  // namespace

int TraceWriter::process(std::string_view name) {
  process_names_.emplace_back(name);
  thread_names_.emplace_back();
  return static_cast<int>(process_names_.size()) - 1;
}

int TraceWriter::thread(int pid, std::string_view name) {
  RS_CHECK(pid >= 0 && pid < static_cast<int>(thread_names_.size()), "thread of an undeclared process");
  thread_names_[pid].emplace_back(name);
  return static_cast<int>(thread_names_[pid].size()) - 1;
}

void TraceWriter::complete(int pid, int tid, std::string_view name, std::string_view category,
                           double start_s, double duration_s, const nlohmann::json& args) {
  RS_CHECK(duration_s >= 0, "a slice cannot have negative duration");
  slice(pid, tid, name, category, start_s, start_s + duration_s, args);
}

void TraceWriter::slice(int pid, int tid, std::string_view name, std::string_view category, double start_s,
                        double end_s, const nlohmann::json& args) {
  RS_CHECK(end_s >= start_s, "a slice cannot end before it starts");
  const int64_t b = to_ns(start_s);
  events_.push_back({'X', pid, tid, b, to_ns(end_s) - b, 0, std::string(name), std::string(category),
                     args.is_null() ? std::string() : args.dump()});
}

void TraceWriter::flow(int from_pid, int from_tid, double from_s, int to_pid, int to_tid, double to_s,
                       std::string_view name, std::string_view category) {
  int64_t id = next_flow_id_++;
  events_.push_back({'s', from_pid, from_tid, to_ns(from_s), 0, id, std::string(name),
                     std::string(category), {}});
  events_.push_back({'f', to_pid, to_tid, to_ns(to_s), 0, id, std::string(name),
                     std::string(category), {}});
}

void TraceWriter::counter(int pid, std::string_view name, double at_s, double value) {
  events_.push_back({'C', pid, 0, to_ns(at_s), 0, 0, std::string(name), "counter",
                     nlohmann::json{{"value", value}}.dump()});
}

void TraceWriter::metadata(std::string_view key, const nlohmann::json& value) {
  metadata_[std::string(key)] = value;
}

std::string TraceWriter::to_string() const {
  std::string out;
  out.reserve(160 * events_.size() + 4096);
  out += "{\"displayTimeUnit\":\"ms\",\"metadata\":";
  out += metadata_.dump();
  out += ",\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  // Names and display order: processes and threads appear in declaration order.
  for (size_t p = 0; p < process_names_.size(); ++p) {
    sep();
    out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":";
    append_int(out, static_cast<int64_t>(p));
    out += ",\"args\":{\"name\":";
    append_json_string(out, process_names_[p]);
    out += "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":";
    append_int(out, static_cast<int64_t>(p));
    out += ",\"args\":{\"sort_index\":";
    append_int(out, static_cast<int64_t>(p));
    out += "}}";
    for (size_t t = 0; t < thread_names_[p].size(); ++t) {
      out += ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":";
      append_int(out, static_cast<int64_t>(p));
      out += ",\"tid\":";
      append_int(out, static_cast<int64_t>(t));
      out += ",\"args\":{\"name\":";
      append_json_string(out, thread_names_[p][t]);
      out += "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":";
      append_int(out, static_cast<int64_t>(p));
      out += ",\"tid\":";
      append_int(out, static_cast<int64_t>(t));
      out += ",\"args\":{\"sort_index\":";
      append_int(out, static_cast<int64_t>(t));
      out += "}}";
    }
  }
  for (const Event& e : events_) {
    sep();
    out += "{\"ph\":\"";
    out += e.phase;
    out += "\",\"pid\":";
    append_int(out, e.pid);
    out += ",\"tid\":";
    append_int(out, e.tid);
    out += ",\"ts\":";
    append_us(out, e.ts_ns);
    if (e.phase == 'X') {
      out += ",\"dur\":";
      append_us(out, e.dur_ns);
    }
    if (e.phase == 's' || e.phase == 'f') {
      out += ",\"id\":";
      append_int(out, e.flow_id);
      if (e.phase == 'f') out += ",\"bp\":\"e\"";
    }
    out += ",\"name\":";
    append_json_string(out, e.name);
    out += ",\"cat\":";
    append_json_string(out, e.category);
    if (!e.args.empty()) {
      out += ",\"args\":";
      out += e.args;
    }
    out += '}';
  }
  out += "\n]}\n";
  return out;
}

void TraceWriter::write(const std::string& path) const { write_text_file_atomic(path, to_string()); }

}  // namespace rackstep::sim
