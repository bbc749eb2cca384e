// The viewer's figures as JSON; see gui/figures.h.
#include "gui/figures.h"

#include "gui/compare.h"
#include "gui/result_files.h"

namespace rackstep::gui {

using json = nlohmann::ordered_json;

json trace_figures(const TraceModel& m) {
  json j;
  j["kind"] = is_compare_trace(m) ? "compare" : "trace";
  j["slices"] = m.n_events;
  j["rows"] = m.rows.size();
  j["span_s"] = (m.t1_us - m.t0_us) * 1e-6;
  j["critical_slices"] = m.n_critical;
  j["gpus"] = m.per_gpu.copies;
  j["gpu_processes"] = m.gpus.size();
  // Seconds, named as `rackstep timeline --json` names them.
  j["compute_busy_s"] = m.per_gpu.compute_us * 1e-6;
  j["bubble_s"] = m.per_gpu.idle_us * 1e-6;
  j["exposed_communication_s"] = m.per_gpu_exposed_comm_us() * 1e-6;
  j["exposed_host_s"] = m.per_gpu_exposed_host_us() * 1e-6;
  json kinds = json::object();
  for (size_t c = 0; c < m.categories.size(); ++c) {
    if (c < m.per_gpu.exposed_us_by_category.size() && m.per_gpu.exposed_us_by_category[c] > 0)
      kinds[m.categories[c]] = m.per_gpu.exposed_us_by_category[c] * 1e-6;
  }
  j["exposed_s_by_kind"] = kinds;
  json critical = json::object();
  for (size_t c = 0; c < m.categories.size(); ++c) {
    if (m.critical_us_by_category[c] > 0) critical[m.categories[c]] = m.critical_us_by_category[c] * 1e-6;
  }
  j["critical_path_s_by_category"] = critical;
  j["counters"] = m.counters.size();
  j["instants"] = m.n_instants;
  j["flows"] = m.flows.size();
  if (is_compare_trace(m)) {
    const CompareSummary c = compare_summary(m);
    json classes = json::array();
    for (const CompareLine& k : c.classes)
      classes.push_back({{"class", k.name}, {"predicted_s", k.predicted_us * 1e-6}, {"measured_s", k.measured_us * 1e-6}});
    j["classes"] = classes;
  }
  return j;
}

json figures_json(const std::string& path) {
  const std::string text = read_maybe_gzip(path);
  json j;
  if (looks_like_trace_text(text)) {
    j = trace_figures(parse_trace_text(text, path));
    j["path"] = path;
    return j;
  }
  const json doc = parse_json_text(text, path);
  switch (detect_kind(doc, path)) {
    case FileKind::trace: j = trace_figures(parse_trace(doc, path)); break;
    case FileKind::sizing: {
      const SizingResult s = parse_sizing(doc, path);
      j["kind"] = "sizing";
      json cands = json::array();
      for (const SizingCandidate& c : s.candidates) {
        double host = 0;
        for (const auto& [part, gib] : c.host_memory_gib) host += gib;
        json e = {{"name", c.name}, {"device_memory_gib", c.device_memory_gib()}, {"host_memory_gib", host}};
        if (std::isfinite(c.hbm_gib)) e["over_hbm"] = c.device_memory_gib() > c.hbm_gib;
        cands.push_back(e);
      }
      j["candidates"] = cands;
      j["columns"] = s.table.columns;
      break;
    }
    case FileKind::drops: {
      const DropsResult d = parse_drops(doc, path);
      j["kind"] = "drops";
      j["columns"] = d.table.columns;
      j["rows"] = d.table.rows;
      break;
    }
  }
  j["path"] = path;
  return j;
}

}  // namespace rackstep::gui
