#include "sim/size.h"

#include "sim/stack.h"
#include "models/source_dir.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "models/layer_graph.h"
#include "sim/generate.h"
#include "sim/sweep.h"

namespace rackstep::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

// The most frequent rejection reasons of a sweep, as one phrase.
std::string why_no_layout(const SweepResult& sr) {
  std::vector<std::pair<int64_t, size_t>> counts;
  for (size_t i = 0; i < sr.rejected.size(); ++i) {
    if (sr.rejected[i] > 0) counts.emplace_back(sr.rejected[i], i);
  }
  std::sort(counts.rbegin(), counts.rend());
  // Layouts that were valid but too big say more than structural misfits.
  for (Reason r : {Reason::kHostMemory, Reason::kDeviceMemory}) {
    auto it = std::find_if(counts.begin(), counts.end(),
                           [r](const auto& c) { return c.second == static_cast<size_t>(r); });
    if (it != counts.end()) std::rotate(counts.begin(), it, it + 1);
  }
  std::string s = "no layout fits:";
  for (size_t i = 0; i < std::min<size_t>(2, counts.size()); ++i) {
    const size_t r = counts[i].second;
    s += (i ? "; " : " ") + std::to_string(counts[i].first) + " x " + to_string(static_cast<Reason>(r));
    if (!sr.example[r].empty()) s += " (e.g. " + sr.example[r] + ")";
  }
  return s;
}

void evaluate(const Scenario& s, CandidateResult& c, size_t index) {
  const models::LayerGraph g = models::build_layer_graph(c.model);
  const auto p = models::count_params(g);
  c.total_params = p.total;
  c.active_params = p.active;
  c.tokens = s.tokens_for(p.active);
  c.tokens_per_active_param = c.tokens / p.active;

  // Under the scenario's stack: its overheads, and only the layouts it runs.
  Stack stack;
  if (!s.stack.empty()) stack = load_stack(stack_path(s.stack));
  const Predictor predictor(g, s.cluster, s.stack.empty() ? default_calibration() : stack_calibration(stack));
  SweepOptions opt;
  opt.tokens_per_step = s.tokens_per_step;
  opt.top = 1;
  opt.stack = s.stack.empty() ? nullptr : &stack;
  const SweepResult sr = sweep(predictor, opt);
  if (!s.compare_stack.empty()) {
    const Stack other = load_stack(stack_path(s.compare_stack));
    const Predictor po(g, s.cluster, stack_calibration(other));
    SweepOptions oo = opt;
    oo.stack = &other;
    const SweepResult so = sweep(po, oo);
    c.compare_runnable = !so.top.empty();
    if (c.compare_runnable) {
      c.compare_layout = so.top[0].layout;
      c.compare_prediction = so.top[0].prediction;
    }
  }
  c.layouts_enumerated = sr.enumerated;
  c.layouts_valid = sr.valid;
  if (sr.top.empty()) {
    c.runnable = false;
    c.why_not = why_no_layout(sr);
    c.verdict = "cannot run on " + std::to_string(s.cluster.gpus()) + " GPUs: " + c.why_not;
    return;
  }
  c.runnable = true;
  c.layout = sr.top[0].layout;
  c.prediction = sr.top[0].prediction;
  c.headroom_bytes = sr.top[0].headroom_bytes;
  const double tokens_per_step = c.prediction.tokens_per_step;
  c.tokens_per_day = c.prediction.tokens_per_s * 86400.0;
  c.ideal_days = c.tokens / c.tokens_per_day;
  c.training_flops = c.prediction.model_flops_per_token * c.tokens;
  c.forecast_loss = s.law.forecast(c.training_flops, c.tokens, c.active_params);

  GoodputRequest req;
  req.step_time_s = c.prediction.step_time_s;
  req.tokens_per_step = tokens_per_step;
  req.tokens = c.tokens;
  req.gpus = s.cluster.gpus();
  req.total_params = c.total_params;
  req.deadline_days = s.training_days_available();
  req.runs = s.goodput_runs;
  req.seed = s.seed + index;
  GoodputConfig cfg = s.goodput;
  // The predicted step already carries the GC pauses (breakdown.host_stall_s).
  if (c.prediction.breakdown.host_stall_s > 0) cfg.gc_stall_fraction = 0;
  c.goodput = simulate_goodput(req, cfg);
  c.meets_target_days = s.target_training_days <= 0 || c.goodput.p50_days <= s.target_training_days;
}

std::string verdict(const Scenario& s, const CandidateResult& c) {
  if (!c.runnable) return c.verdict;
  std::string v = fmt("fits (%.0f GiB headroom), ", c.headroom_bytes / kGiB);
  v += fmt("p50 %.0f d", c.goodput.p50_days) + fmt(" of %.0f available, ", s.training_days_available());
  v += fmt("P(finish) %.2f", c.goodput.p_finish_by_deadline);
  if (c.goodput.p_finish_by_deadline < s.min_p_finish) {
    v += fmt(" < %.2f: too slow for the deadline", s.min_p_finish);
  } else if (!c.meets_target_days) {
    v += fmt("; over the %.0f planned days", s.target_training_days);
  }
  return v;
}

double utility(const Scenario& s, const CandidateResult& c) {
  switch (s.rank_by) {
    case RankBy::kLowestLoss: return c.forecast_loss;
    case RankBy::kFastest: return c.goodput.p50_days;
    case RankBy::kHighestMfu: return -c.prediction.mfu;
  }
  return 0;
}

void rank(SizeResult& r) {
  const Scenario& s = r.scenario;
  auto& cs = r.candidates;
  r.ranking.resize(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) r.ranking[i] = i;
  auto eligible = [&](const CandidateResult& c) {
    return c.runnable && c.goodput.p_finish_by_deadline >= s.min_p_finish;
  };
  std::stable_sort(r.ranking.begin(), r.ranking.end(), [&](size_t a, size_t b) {
    const auto& ca = cs[a];
    const auto& cb = cs[b];
    if (eligible(ca) != eligible(cb)) return eligible(ca);
    if (ca.runnable != cb.runnable) return ca.runnable;
    if (!ca.runnable) return false;
    if (!eligible(ca) && ca.goodput.p_finish_by_deadline != cb.goodput.p_finish_by_deadline) {
      return ca.goodput.p_finish_by_deadline > cb.goodput.p_finish_by_deadline;
    }
    return utility(s, ca) < utility(s, cb);
  });
  if (cs.empty()) return;
  const auto& w = cs[r.ranking[0]];
  if (!eligible(w)) {
    r.winner_reason = w.runnable
                          ? "no candidate reaches P(finish) >= " + fmt("%.2f", s.min_p_finish) + "; " + w.name +
                                " comes closest (" + fmt("%.2f", w.goodput.p_finish_by_deadline) + ")"
                          : "no candidate can run on this cluster";
    return;
  }
  std::string why = w.name + " wins: ";
  switch (s.rank_by) {
    case RankBy::kLowestLoss: why += "lowest forecast loss " + fmt("%.3f", w.forecast_loss); break;
    case RankBy::kFastest: why += "fastest, p50 " + fmt("%.1f days", w.goodput.p50_days); break;
    case RankBy::kHighestMfu: why += "highest MFU " + fmt("%.1f%%", 100 * w.prediction.mfu); break;
  }
  why += " among candidates with P(finish by " + s.deadline_date + ") >= " + fmt("%.2f", s.min_p_finish);
  if (r.ranking.size() > 1 && eligible(cs[r.ranking[1]])) {
    const auto& second = cs[r.ranking[1]];
    why += "; runner-up " + second.name + " (" +
           (s.rank_by == RankBy::kLowestLoss ? "loss " + fmt("%.3f", second.forecast_loss)
                                              : "p50 " + fmt("%.1f d", second.goodput.p50_days)) +
           ")";
  }
  r.winner_reason = why;
}

// A Markdown table cell: pipes would end the cell.
std::string md_cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

SizeResult size(const Scenario& s, const std::function<void(const SizeProgress&)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  SizeResult r;
  r.scenario = s;
  models::ModelConfig family;
  bool family_loaded = false;
  for (size_t i = 0; i < s.candidates.size(); ++i) {
    const CandidateSpec& spec = s.candidates[i];
    CandidateResult c;
    c.name = spec.name;
    c.origin = spec.origin;
    c.model = spec.model;
    if (spec.generate) {
      if (progress) progress({i, s.candidates.size(), spec.name, "generating"});
      if (!family_loaded) {
        family = models::load_model(std::string(rackstep::source_dir()) + "/models/zoo/marin-535b-a23b.json");
        family_loaded = true;
      }
      ShapeTarget t;
      t.name = spec.name;
      t.total_params = spec.target_total;
      t.active_params = spec.target_active;
      t.attention = spec.attention;
      c.model = generate_shape(t, family).model;
    }
    if (progress) progress({i, s.candidates.size(), spec.name, "sweeping"});
    evaluate(s, c, i);
    c.verdict = verdict(s, c);
    r.candidates.push_back(std::move(c));
  }
  rank(r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

nlohmann::json size_result_json(const SizeResult& r) {
  const Scenario& s = r.scenario;
  nlohmann::json j;
  j["scenario"] = {{"name", s.name},
                   {"cluster", s.cluster.name},
                   {"gpus", s.cluster.gpus()},
                   {"start_date", s.start_date},
                   {"deadline", s.deadline_date},
                   {"bringup_days", s.bringup_days},
                   {"training_days_available", s.training_days_available()},
                   {"target_training_days", s.target_training_days},
                   {"rank_by", to_string(s.rank_by)},
                   {"min_p_finish", s.min_p_finish},
                   {"stack", s.stack},
                   {"compare_stack", s.compare_stack},
                   {"scaling_law", scaling_law_json(s.law)},
                   {"warnings", s.warnings}};
  nlohmann::json cands = nlohmann::json::array();
  for (size_t rank_i = 0; rank_i < r.ranking.size(); ++rank_i) {
    const auto& c = r.candidates[r.ranking[rank_i]];
    nlohmann::json e = {{"rank", rank_i + 1},
                        {"name", c.name},
                        {"origin", c.origin},
                        {"total_params", c.total_params},
                        {"active_params", c.active_params},
                        {"d_model", c.model.d_model},
                        {"layers", c.model.layers},
                        {"experts", c.model.moe.experts},
                        {"top_k", c.model.moe.top_k},
                        {"runnable", c.runnable},
                        {"layouts_enumerated", c.layouts_enumerated},
                        {"layouts_valid", c.layouts_valid},
                        {"verdict", c.verdict}};
    if (c.runnable) {
      nlohmann::json mem = nlohmann::json::object();
      for (const auto& [k, v] : c.prediction.memory.lines()) mem[k] = v;
      e.update({{"layout", layout_to_json(c.layout)},
                {"layout_summary", describe(c.layout)},
                {"mfu", c.prediction.mfu},
                {"step_time_s", c.prediction.step_time_s},
                {"tokens_per_day", c.tokens_per_day},
                {"tokens", c.tokens},
                {"tokens_per_active_param", c.tokens_per_active_param},
                {"ideal_days", c.ideal_days},
                {"days_p10", c.goodput.p10_days},
                {"days_p50", c.goodput.p50_days},
                {"days_p90", c.goodput.p90_days},
                {"goodput_fraction", c.goodput.goodput_fraction},
                {"p_finish", c.goodput.p_finish_by_deadline},
                {"finish_days", c.goodput.days},
                {"peak_memory_bytes", c.prediction.memory.device_total},
                {"hbm_bytes", c.prediction.memory.device_capacity},
                {"headroom_bytes", c.headroom_bytes},
                {"memory_bytes", mem},
                {"drop_fraction", c.prediction.drop_fraction},
                {"ep_transport", c.layout.ep > 1 ? transport_name(c.layout.ep_transport) : "none"},
                {"training_flops", c.training_flops},
                {"forecast_loss", c.forecast_loss}});
    } else {
      e["why_not"] = c.why_not;
    }
    if (!s.compare_stack.empty()) {
      nlohmann::json cmp{{"stack", s.compare_stack}, {"runnable", c.compare_runnable}};
      if (c.compare_runnable) {
        cmp.update({{"layout", layout_to_json(c.compare_layout)},
                    {"layout_summary", describe(c.compare_layout)},
                    {"mfu", c.compare_prediction.mfu},
                    {"step_time_s", c.compare_prediction.step_time_s},
                    {"peak_memory_bytes", c.compare_prediction.memory.device_total}});
      }
      e["compare"] = cmp;
    }
    cands.push_back(e);
  }
  j["candidates"] = cands;
  j["winner"] = r.ranking.empty() ? "" : r.candidates[r.ranking[0]].name;
  j["winner_reason"] = r.winner_reason;
  j["seconds"] = r.seconds;
  return j;
}

std::string format_size_table(const SizeResult& r) {
  const Scenario& s = r.scenario;
  std::ostringstream o;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Scenario %s: %lld GPUs (%s), start %s, deadline %s, %.0f days for training after %.0f of bring-up\n",
                s.name.c_str(), static_cast<long long>(s.cluster.gpus()), s.cluster.name.c_str(), s.start_date.c_str(),
                s.deadline_date.c_str(), s.training_days_available(), s.bringup_days);
  o << buf;
  for (const auto& w : s.warnings) o << "warning: " << w << "\n";
  o << "training stack: " << (s.stack.empty() ? "any (every layout, sim/calibration.json)" : s.stack) << "\n\n";
  std::snprintf(buf, sizeof buf, "%-4s %-16s %7s %7s %6s %7s %8s %6s %6s %6s %7s %7s %6s %6s  %s\n", "rank", "candidate",
                "total", "active", "MFU", "step_s", "Ttok/day", "days", "p90", "P(fin)", "mem_GiB", "head", "drop",
                "loss", "layout");
  o << buf;
  for (size_t i = 0; i < r.ranking.size(); ++i) {
    const auto& c = r.candidates[r.ranking[i]];
    if (!c.runnable) {
      std::snprintf(buf, sizeof buf, "%-4zu %-16s %6.0fB %6.1fB  %s\n", i + 1, c.name.c_str(), c.total_params / 1e9,
                    c.active_params / 1e9, c.why_not.c_str());
      o << buf;
      continue;
    }
    std::snprintf(buf, sizeof buf,
                  "%-4zu %-16s %6.0fB %6.1fB %5.1f%% %7.2f %8.3f %6.1f %6.1f %6.2f %7.1f %7.1f %5.2f%% %6.3f  %s\n", i + 1,
                  c.name.c_str(), c.total_params / 1e9, c.active_params / 1e9, 100 * c.prediction.mfu,
                  c.prediction.step_time_s, c.tokens_per_day / 1e12, c.goodput.p50_days, c.goodput.p90_days,
                  c.goodput.p_finish_by_deadline, c.prediction.memory.device_total / kGiB, c.headroom_bytes / kGiB,
                  100 * c.prediction.drop_fraction, c.forecast_loss, describe(c.layout).c_str());
    o << buf;
  }
  if (!s.compare_stack.empty()) {
    o << "\nThe best layout under " << s.compare_stack << " (a separate column: what that stack would buy)\n";
    std::snprintf(buf, sizeof buf, "%-4s %-16s %6s %7s %7s  %s\n", "rank", "candidate", "MFU", "step_s", "speedup",
                  "layout");
    o << buf;
    for (size_t i = 0; i < r.ranking.size(); ++i) {
      const auto& c = r.candidates[r.ranking[i]];
      if (!c.compare_runnable) {
        std::snprintf(buf, sizeof buf, "%-4zu %-16s  no layout fits\n", i + 1, c.name.c_str());
        o << buf;
        continue;
      }
      const double speedup = c.runnable ? c.prediction.step_time_s / c.compare_prediction.step_time_s : 0.0;
      std::snprintf(buf, sizeof buf, "%-4zu %-16s %5.1f%% %7.2f %6.2fx  %s\n", i + 1, c.name.c_str(),
                    100 * c.compare_prediction.mfu, c.compare_prediction.step_time_s, speedup,
                    describe(c.compare_layout).c_str());
      o << buf;
    }
  }
  o << "\nVerdicts:\n";
  for (size_t i = 0; i < r.ranking.size(); ++i) {
    const auto& c = r.candidates[r.ranking[i]];
    o << "  " << c.name << " (" << c.origin << "): " << c.verdict << "\n";
  }
  o << "\n" << r.winner_reason << "\n";
  std::snprintf(buf, sizeof buf, "(sized %zu candidates in %.1f s; days include goodput losses; loss: L = %.2f + %.2f C_eff^-%.4f)\n",
                r.candidates.size(), r.seconds, s.law.e, s.law.a, s.law.alpha);
  o << buf;
  return o.str();
}

std::string format_size_report(const SizeResult& r, const std::vector<std::pair<std::string, std::string>>& images) {
  const Scenario& s = r.scenario;
  std::ostringstream o;
  char buf[512];
  o << "# Sizing report: " << s.name << "\n\n";
  std::snprintf(buf, sizeof buf,
                "%lld GPUs (%s). Start %s, deadline %s: %.0f days for training after %.0f days of bring-up. "
                "Ranked by %s with P(finish) >= %.2f.\n\n",
                static_cast<long long>(s.cluster.gpus()), s.cluster.name.c_str(), s.start_date.c_str(),
                s.deadline_date.c_str(), s.training_days_available(), s.bringup_days, to_string(s.rank_by),
                s.min_p_finish);
  o << buf;
  for (const auto& w : s.warnings) o << "> warning: " << w << "\n\n";
  o << "**" << r.winner_reason << "**\n\n";
  o << "| rank | candidate | total | active | layout | MFU | step (s) | p50 days | p90 days | P(finish) | peak GiB | "
       "drop | loss | verdict |\n";
  o << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (size_t i = 0; i < r.ranking.size(); ++i) {
    const auto& c = r.candidates[r.ranking[i]];
    if (!c.runnable) {
      std::snprintf(buf, sizeof buf, "| %zu | %s | %.0fB | %.1fB | — | | | | | | | | | %s |\n", i + 1, c.name.c_str(),
                    c.total_params / 1e9, c.active_params / 1e9, md_cell(c.verdict).c_str());
      o << buf;
      continue;
    }
    std::snprintf(buf, sizeof buf,
                  "| %zu | %s | %.0fB | %.1fB | %s | %.1f%% | %.2f | %.1f | %.1f | %.2f | %.1f | %.2f%% | %.3f | %s |\n",
                  i + 1, c.name.c_str(), c.total_params / 1e9, c.active_params / 1e9, md_cell(describe(c.layout)).c_str(),
                  100 * c.prediction.mfu, c.prediction.step_time_s, c.goodput.p50_days, c.goodput.p90_days,
                  c.goodput.p_finish_by_deadline, c.prediction.memory.device_total / kGiB,
                  100 * c.prediction.drop_fraction, c.forecast_loss, c.verdict.c_str());
    o << buf;
  }
  o << "\n";
  for (const auto& [title, path] : images) o << "## " << title << "\n\n![" << title << "](" << path << ")\n\n";
  if (images.empty()) o << "_Plots were not rendered: this build has no Qt 6 Charts._\n";
  return o.str();
}

}  // namespace rackstep::sim
