// Tables and chart specs from result files, read defensively; see gui/result_charts.h.
#include "gui/result_charts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "sim/base/check.h"

namespace rackstep::gui {
namespace {

using json = nlohmann::ordered_json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip(const std::string& s, const std::string& suffix) {
  return ends_with(s, suffix) ? s.substr(0, s.size() - suffix.size()) : s;
}

std::string cell_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  // Counts such as parameters stay sortable as numbers but short: 5.35e+11.
  if (v.is_number_integer() && std::abs(v.get<double>()) < 1e7) return std::to_string(v.get<int64_t>());
  if (v.is_number()) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.4g", v.get<double>());
    return buf;
  }
  return v.dump();
}

double number_at(const json& obj, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    auto it = obj.find(k);
    if (it != obj.end() && it->is_number()) return it->get<double>();
  }
  return kNone;
}

// The first object (depth-first, a few levels) under a key that names memory.
const json* find_memory(const json& obj, std::string* key, int depth = 0) {
  if (!obj.is_object() || depth > 3) return nullptr;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (it->is_object() && it.key().find("memory") != std::string::npos) {
      *key = it.key();
      return &*it;
    }
  }
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (const json* m = find_memory(*it, key, depth + 1)) return m;
  }
  return nullptr;
}

bool is_total_name(const std::string& n) {
  for (const char* t : {"total", "peak", "capacity", "hbm", "headroom", "free", "limit", "fits", "available"}) {
    if (n.rfind(t, 0) == 0) return true;
  }
  return false;
}

// GiB from a memory entry: the key's unit suffix, else the parent's, else
// its size (byte counts of real memory are far above a million).
double to_gib(const std::string& key, const std::string& parent, double v) {
  if (ends_with(key, "_bytes")) return v / kGiB;
  if (ends_with(key, "_gib")) return v;
  if (ends_with(key, "_gb")) return v * 1e9 / kGiB;
  if (ends_with(parent, "_bytes")) return v / kGiB;
  if (ends_with(parent, "_gib")) return v;
  return v > 1e6 ? v / kGiB : v;
}

std::string part_name(const std::string& key) { return strip(strip(strip(key, "_bytes"), "_gib"), "_gb"); }

void read_memory(const json& c, SizingCandidate& out) {
  std::string key;
  const json* mem = find_memory(c, &key);
  if (mem != nullptr) {
    for (auto it = mem->begin(); it != mem->end(); ++it) {
      if (!it->is_number()) continue;
      const std::string part = part_name(it.key());
      const double gib = to_gib(it.key(), key, it->get<double>());
      if (part == "capacity" || part == "hbm" || part == "hbm_capacity" || part == "limit") {
        out.hbm_gib = gib;
        continue;
      }
      if (is_total_name(part)) continue;
      // Host memory (optimizer states offloaded to the CPU, say) is not on the GPU: never under the HBM line.
      if (part.rfind("host", 0) == 0) out.host_memory_gib.emplace_back(part, gib);
      else out.memory_gib.emplace_back(part, gib);
    }
  }
  if (!std::isfinite(out.hbm_gib)) {
    const double b = number_at(c, {"hbm_bytes", "hbm_capacity_bytes", "hbm_per_gpu_bytes"});
    out.hbm_gib = std::isfinite(b) ? b / kGiB : number_at(c, {"hbm_gib", "hbm_capacity_gib"});
  }
}

// Scalars become cells; small objects (a few scalars) are flattened one level
// ("best.mfu"); memory and large objects (a whole layout) are left to their own views.
void read_cells(const json& c, SizingCandidate& out, std::vector<std::string>& columns) {
  auto add = [&](const std::string& col, const json& v) {
    out.cells.emplace_back(col, column_text(col, v));
    if (std::find(columns.begin(), columns.end(), col) == columns.end()) columns.push_back(col);
  };
  for (auto it = c.begin(); it != c.end(); ++it) {
    if (it->is_primitive() && !it->is_null()) {
      add(it.key(), *it);
    } else if (it->is_object() && it->size() <= 4 && it.key().find("memory") == std::string::npos) {
      for (auto jt = it->begin(); jt != it->end(); ++jt) {
        if (jt->is_primitive() && !jt->is_null()) add(it.key() + "." + jt.key(), *jt);
      }
    }
  }
}

const json& candidate_list(const json& doc, const std::string& path) {
  if (doc.is_array()) return doc;
  for (const char* k : {"candidates", "results", "ranking"}) {
    auto it = doc.find(k);
    if (it != doc.end() && it->is_array()) return *it;
  }
  throw UserError(path, "/candidates", "an array of candidates", "none");
}

// The columns a reader looks at first, in this order; the rest follow in file order.
const char* const kFirstColumns[] = {"name", "verdict", "rank", "days_p50", "p_finish", "mfu", "step_time_s",
                                     "peak_memory_bytes", "headroom_bytes", "drop_fraction", "forecast_loss",
                                     "layout_summary"};

struct ColumnName {
  const char* key;
  const char* title;
};
const ColumnName kColumnNames[] = {
    {"name", "candidate"}, {"verdict", "verdict"}, {"rank", "rank"}, {"days_p50", "days to train, p50"},
    {"days_p10", "days, p10"}, {"days_p90", "days, p90"}, {"p_finish", "P(finish by deadline) (%)"},
    {"mfu", "MFU (%)"}, {"step_time_s", "step time (s)"}, {"peak_memory_bytes", "memory per GPU (GiB)"},
    {"headroom_bytes", "HBM headroom (GiB)"}, {"hbm_bytes", "HBM per GPU (GiB)"},
    {"drop_fraction", "token drops (%)"}, {"forecast_loss", "forecast loss"}, {"layout_summary", "layout"},
    {"total_params", "total params (B)"}, {"active_params", "active params (B)"},
    {"tokens_per_day", "tokens per day (B)"}, {"tokens", "tokens (B)"}, {"ideal_days", "days, no failures"},
    {"goodput_fraction", "goodput (%)"}, {"training_flops", "training FLOPs"}, {"ep_transport", "EP transport"},
    {"tokens_per_active_param", "tokens per active param"}, {"layouts_valid", "layouts that fit"},
    {"layouts_enumerated", "layouts tried"}, {"top_k", "top-k"}, {"d_model", "d_model"},
    {"why_not", "why not"}};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

bool is_fraction_key(const std::string& k) {
  return k == "p_finish" || k == "mfu" || ends_with(k, "_fraction") || k == "p_finish_by_deadline";
}

}  // namespace

std::string percent_text(double fraction) { return fmt("%.3f", 100.0 * fraction); }

std::string column_title(const std::string& key) {
  for (const ColumnName& c : kColumnNames) {
    if (key == c.key) return c.title;
  }
  std::string t = key;
  std::string unit;
  if (ends_with(t, "_bytes")) t = strip(t, "_bytes"), unit = " (GiB)";
  else if (ends_with(t, "_s")) t = strip(t, "_s"), unit = " (s)";
  else if (is_fraction_key(t)) unit = " (%)";
  for (char& ch : t) ch = ch == '_' ? ' ' : ch;
  return t + unit;
}

std::string column_text(const std::string& key, const json& v) {
  if (!v.is_number() || v.is_boolean()) return cell_text(v);
  const double x = v.get<double>();
  if (key == "rank" || key == "layers" || key == "experts" || key == "top_k" || key == "d_model" ||
      key.rfind("layouts_", 0) == 0)
    return cell_text(v);
  if (ends_with(key, "_bytes")) return fmt("%.1f", x / kGiB);
  if (key == "drop_fraction") return percent_text(x);
  if (is_fraction_key(key)) return fmt("%.1f", 100.0 * x);
  if (ends_with(key, "_params") || key == "tokens" || key == "tokens_per_day") return fmt("%.1f", x / 1e9);
  if (key.rfind("days", 0) == 0 || ends_with(key, "_days")) return fmt("%.1f", x);
  if (key == "forecast_loss") return fmt("%.4f", x);
  return cell_text(v);
}

double SizingCandidate::device_memory_gib() const {
  double s = 0;
  for (const auto& [part, gib] : memory_gib) s += gib;
  return s;
}

SizingResult parse_sizing(const json& doc, const std::string& path) {
  const json& list = candidate_list(doc, path);
  SizingResult s;
  std::vector<std::string> keys;
  std::string winner;
  if (doc.is_object()) {
    auto w = doc.find("winner");
    if (w != doc.end() && w->is_string()) winner = w->get<std::string>();
    if (w != doc.end() && w->is_object() && w->contains("name") && (*w)["name"].is_string())
      winner = (*w)["name"].get<std::string>();
    const auto deadline_keys = {"deadline_days", "training_days_available", "training_days", "days_budget"};
    s.deadline_days = number_at(doc, deadline_keys);
    auto sc = doc.find("scenario");
    if (!std::isfinite(s.deadline_days) && sc != doc.end() && sc->is_object())
      s.deadline_days = number_at(*sc, deadline_keys);
  }
  keys.push_back("name");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& c = list[i];
    if (!c.is_object())
      throw UserError(path, "/candidates/" + std::to_string(i), "a candidate object", std::string(c.type_name()));
    SizingCandidate out;
    for (const char* k : {"name", "candidate", "model"}) {
      auto it = c.find(k);
      if (it != c.end() && it->is_string()) {
        out.name = it->get<std::string>();
        break;
      }
    }
    if (out.name.empty()) out.name = "#" + std::to_string(i + 1);
    read_cells(c, out, keys);
    read_memory(c, out);
    out.days = number_at(c, {"days", "days_to_train", "train_days", "days_p50"});
    out.loss = number_at(c, {"forecast_loss", "loss"});
    out.p_finish = number_at(c, {"p_finish", "p_finish_by_deadline"});
    auto fd = c.find("finish_days");
    if (fd != c.end() && fd->is_array()) {
      for (const json& x : *fd) {
        if (x.is_number()) out.finish_days.push_back(x.get<double>());
      }
    }
    const double rank = number_at(c, {"rank"});
    auto w = c.find("winner");
    out.winner = out.name == winner || rank == 1 || (w != c.end() && w->is_boolean() && w->get<bool>());
    s.candidates.push_back(std::move(out));
  }
  // Only one winner is marked: the first that claims it.
  bool seen = false;
  for (auto& c : s.candidates) {
    c.winner = c.winner && !seen;
    seen = seen || c.winner;
  }
  // The columns a reader looks at first lead; the rest keep file order.
  for (const char* k : kFirstColumns) {
    if (std::find(keys.begin(), keys.end(), k) != keys.end()) s.column_keys.push_back(k);
  }
  for (const std::string& k : keys) {
    if (std::find(s.column_keys.begin(), s.column_keys.end(), k) == s.column_keys.end()) s.column_keys.push_back(k);
  }
  for (const std::string& k : s.column_keys) s.table.columns.push_back(column_title(k));
  for (const auto& c : s.candidates) {
    std::vector<std::string> row(s.column_keys.size());
    row[0] = c.name;
    for (const auto& [col, text] : c.cells) {
      const auto at = std::find(s.column_keys.begin(), s.column_keys.end(), col) - s.column_keys.begin();
      if (col != "name") row[at] = text;
    }
    s.table.rows.push_back(std::move(row));
  }
  return s;
}

StackedBarSpec memory_chart(const SizingResult& s) {
  StackedBarSpec spec;
  spec.title = "Memory per GPU by candidate";
  // Parts in first-seen order; a candidate without a part has 0 of it.
  for (const auto& c : s.candidates) {
    if (c.memory_gib.empty()) continue;
    spec.categories.push_back(c.name);
    for (const auto& [part, gib] : c.memory_gib) {
      auto it = std::find_if(spec.segments.begin(), spec.segments.end(), [&](const BarSegment& b) { return b.name == part; });
      if (it == spec.segments.end()) {
        spec.segments.push_back({part, {}});
        it = spec.segments.end() - 1;
      }
      it->values.resize(spec.categories.size() - 1, 0);
      it->values.push_back(gib);
    }
    if (!std::isfinite(spec.capacity) && std::isfinite(c.hbm_gib)) spec.capacity = c.hbm_gib;
  }
  for (auto& seg : spec.segments) seg.values.resize(spec.categories.size(), 0);
  return spec;
}

ScatterSpec days_loss_chart(const SizingResult& s) {
  ScatterSpec spec;
  spec.title = "Days to train vs forecast loss";
  spec.deadline_x = s.deadline_days;
  spec.deadline_label = "deadline";
  for (const auto& c : s.candidates) {
    if (std::isfinite(c.days) && std::isfinite(c.loss)) spec.points.push_back({c.name, c.days, c.loss, c.winner});
  }
  return spec;
}

HistogramSpec finish_chart(const SizingResult& s, int index) {
  HistogramSpec spec;
  spec.deadline_x = s.deadline_days;
  spec.deadline_label = "deadline";
  const SizingCandidate* pick = nullptr;
  if (index >= 0 && index < static_cast<int>(s.candidates.size())) {
    pick = &s.candidates[index];
    spec.title = "Days to finish: " + pick->name;
    if (pick->finish_days.empty()) spec.title += " (no finish-day samples)";
    spec.samples = pick->finish_days;
    return spec;
  }
  for (const auto& c : s.candidates) {
    if (c.finish_days.empty()) continue;
    if (pick == nullptr || c.winner) pick = &c;
    if (c.winner) break;
  }
  if (pick == nullptr) return spec;
  spec.title = "Days to finish: " + pick->name;
  spec.samples = pick->finish_days;
  return spec;
}

DropsResult parse_drops(const json& doc, const std::string& path) {
  DropsResult d;
  auto pts = doc.find("points");
  if (pts == doc.end() || !pts->is_array() || pts->empty())
    throw UserError(path, "/points", "a non-empty array of drop estimates", pts == doc.end() ? "none" : pts->dump().substr(0, 40));
  auto sw = doc.find("sweep");
  if (sw != doc.end() && sw->is_string()) d.sweep = sw->get<std::string>();
  auto sc = doc.find("scenario");
  if (sc != doc.end() && sc->is_object()) {
    for (auto it = sc->begin(); it != sc->end(); ++it) {
      if (it.key() == d.sweep || !it->is_primitive()) continue;
      d.scenario += (d.scenario.empty() ? "" : ", ") + it.key() + " " + cell_text(*it);
    }
  }
  const char* kinds[] = {"total", "sender", "receiver", "padding"};
  d.table.columns = {d.sweep.empty() ? "point" : d.sweep, "total %", "total ±95% %", "sender %", "receiver %", "padding %"};
  std::vector<std::string> xs;
  for (size_t i = 0; i < pts->size(); ++i) {
    const json& p = (*pts)[i];
    if (!p.is_object()) throw UserError(path, "/points/" + std::to_string(i), "an object", std::string(p.type_name()));
    auto v = d.sweep.empty() ? p.end() : p.find(d.sweep);
    xs.push_back(v != p.end() ? cell_text(*v) : std::to_string(i));
    std::vector<std::string> row = {xs.back()};
    for (const char* k : {"total", "total_ci95", "sender", "receiver", "padding"}) {
      const double f = number_at(p, {k});
      row.push_back(std::isfinite(f) ? percent_text(f) : "");
    }
    d.table.rows.push_back(std::move(row));
  }
  // Numeric sweeps get a value axis (log2 for sizes); others one slot per value.
  bool numeric = !d.sweep.empty();
  std::vector<double> xv;
  for (const auto& x : xs) {
    char* end = nullptr;
    const double v = std::strtod(x.c_str(), &end);
    numeric = numeric && end != x.c_str() && *end == '\0';
    xv.push_back(v);
  }
  LineSpec& chart = d.chart;
  chart.title = "EP token drops" + (d.sweep.empty() ? std::string() : " vs " + d.sweep);
  chart.x_label = d.sweep.empty() ? "point" : d.sweep;
  chart.y_label = "tokens dropped (%)";
  if (!numeric) {
    chart.x_categories = xs;
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<double>(i);
  } else {
    const bool sizes = d.sweep == "context" || d.sweep == "tokens-per-gpu" || d.sweep == "ep";
    chart.log2_x = sizes && *std::min_element(xv.begin(), xv.end()) > 0;
  }
  for (const char* k : kinds) {
    LineSeries s;
    s.name = k;
    for (size_t i = 0; i < pts->size(); ++i) {
      const double f = number_at((*pts)[i], {k});
      if (!std::isfinite(f)) continue;
      s.x.push_back(xv[i]);
      s.y.push_back(100.0 * f);
    }
    if (!s.x.empty()) chart.series.push_back(std::move(s));
  }
  if (chart.series.empty()) throw UserError(path, "/points/0/total", "drop fractions (total, sender, ...)", "none");
  return d;
}

}  // namespace rackstep::gui
