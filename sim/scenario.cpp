#include "sim/scenario.h"
#include "sim/base/source_dir.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "sim/base/check.h"
#include "sim/base/json_io.h"

namespace rackstep::sim {

int64_t parse_date(const std::string& s) {
  int y = 0;
  unsigned m = 0, d = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%4d-%2u-%2u%c", &y, &m, &d, &tail) != 3) return -1;
  const std::chrono::year_month_day ymd{std::chrono::year{y}, std::chrono::month{m}, std::chrono::day{d}};
  if (!ymd.ok()) return -1;
  return std::chrono::sys_days{ymd}.time_since_epoch().count();
}

std::string format_date(int64_t day) {
  const std::chrono::year_month_day ymd{std::chrono::sys_days{std::chrono::days{day}}};
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02u", static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                static_cast<unsigned>(ymd.day()));
  return buf;
}

const char* to_string(RankBy r) {
  switch (r) {
    case RankBy::kLowestLoss: return "lowest_loss";
    case RankBy::kFastest: return "fastest";
    case RankBy::kHighestMfu: return "highest_mfu";
  }
  return "?";
}

namespace {

const NumberRange kPositive{.min_exclusive = 0.0};
const NumberRange kNonNegative{.min = 0.0};

// A path in a scenario: relative to the scenario file, else to the source tree.
std::string resolve(const std::string& scenario_file, const std::string& p) {
  namespace fs = std::filesystem;
  if (fs::path(p).is_absolute()) return p;
  const fs::path near = fs::path(scenario_file).parent_path() / p;
  std::error_code ec;  // over-long or looping names count as missing, never a filesystem_error
  if (fs::exists(near, ec)) return near.string();
  const fs::path tree = fs::path(rackstep::source_dir()) / p;
  if (fs::exists(tree, ec)) return tree.string();
  return p;
}

CandidateSpec target_spec(const std::string& name, double total, double active, const std::string& attention) {
  CandidateSpec c;
  c.name = name;
  c.generate = true;
  c.target_total = total;
  c.target_active = active;
  c.attention = attention;
  char buf[128];
  std::snprintf(buf, sizeof buf, "generated from %.0fB total / %.1fB active%s", total / 1e9, active / 1e9,
                attention == "mla" ? ", MLA" : "");
  c.origin = buf;
  return c;
}

void parse_candidates(JsonReader& r, Scenario& s) {
  auto list = r.object_list("candidates");
  if (list.empty()) r.fail("candidates", "at least one candidate", "[]");
  for (size_t i = 0; i < list.size(); ++i) {
    JsonReader& c = list[i];
    const int kinds = c.has("model") + c.has("inline") + c.has("generate") + c.has("grid");
    if (kinds != 1) c.fail("", "exactly one of model, inline, generate, grid", std::to_string(kinds) + " of them");
    if (c.has("model")) {
      const std::string path = resolve(s.file, c.string("model"));
      if (std::error_code ec; !std::filesystem::exists(path, ec)) c.fail("model", "an existing model file", "\"" + path + "\" (no such file)");
      CandidateSpec spec;
      spec.model = models::load_model(path);
      spec.name = c.string("name", spec.model.name);
      spec.model.name = spec.name;
      spec.origin = "zoo file " + std::filesystem::path(path).filename().string();
      s.candidates.push_back(std::move(spec));
    } else if (c.has("inline")) {
      CandidateSpec spec;
      spec.model = models::parse_model(c.raw().at("inline"), s.file + " " + c.path_of("inline"));
      c.ignore("inline");
      spec.name = c.string("name", spec.model.name);
      spec.model.name = spec.name;
      spec.origin = "inline config";
      s.candidates.push_back(std::move(spec));
    } else if (c.has("generate")) {
      JsonReader g = c.object("generate");
      const double total = g.number("total_params", {.min_exclusive = 0, .max = 1e15});
      const double active = g.number("active_params", {.min_exclusive = 0, .max = 1e15});
      // active = total: a dense candidate (sim/generate.h).
      if (active > total) g.fail("active_params", "at most total_params", std::to_string(active));
      const std::string att = g.choice("attention", {"gqa", "mla"}, "gqa");
      char def[64];
      std::snprintf(def, sizeof def, "%.0fb-a%.0fb%s", total / 1e9, active / 1e9, att == "mla" ? "-mla" : "");
      s.candidates.push_back(target_spec(g.string("name", def), total, active, att));
      g.finish();
    } else {
      JsonReader g = c.object("grid");
      std::vector<double> totals, actives;
      for (const auto& v : g.raw().at("total_params")) totals.push_back(v.get<double>());
      for (const auto& v : g.raw().at("active_params")) actives.push_back(v.get<double>());
      g.ignore("total_params");
      g.ignore("active_params");
      const std::string att = g.choice("attention", {"gqa", "mla"}, "gqa");
      g.finish();
      for (double t : totals) {
        for (double a : actives) {
          if (!(t > 0) || !(a > 0) || a >= t) continue;
          char name[64];
          std::snprintf(name, sizeof name, "grid-%.0fb-a%.0fb", t / 1e9, a / 1e9);
          s.candidates.push_back(target_spec(name, t, a, att));
        }
      }
    }
    c.ignore("name");
    c.finish();
  }
}

}  // namespace

Scenario parse_scenario(const nlohmann::json& doc, const std::string& file) {
  JsonReader r(doc, file);
  Scenario s;
  s.file = file;
  r.ignore("comment");
  s.name = r.string("name", std::filesystem::path(file).stem().string());

  JsonReader c = r.object("cluster");
  const std::string cfile = resolve(file, c.string("file"));
  if (std::error_code ec; !std::filesystem::exists(cfile, ec)) c.fail("file", "an existing system or cluster file", "\"" + cfile + "\" (no such file)");
  // Bounds on counts that drive time and memory (checked before any work).
  const int64_t domains = c.integer("domains", 0, {.min = 1, .max = 10000});
  const int64_t healthy = c.integer("healthy_gpus_per_domain", 0, {.min = 1, .max = 1 << 16});
  c.ignore("comment");
  c.finish();
  s.cluster = topologies::load_cluster(cfile, domains);
  if (healthy > 0) {
    if (healthy > s.cluster.system.domain.size) {
      c.fail("healthy_gpus_per_domain", "at most the domain size (" + std::to_string(s.cluster.system.domain.size) + ")",
             std::to_string(healthy));
    }
    s.cluster.gpus_per_domain = healthy;
  }

  s.start_date = r.string("start_date");
  s.start_day = parse_date(s.start_date);
  if (s.start_day < 0) r.fail("start_date", "a date YYYY-MM-DD", "\"" + s.start_date + "\"");
  s.bringup_days = r.number("bringup_days", 0.0, {.min = 0, .max = 36500});  // days become integer dates
  if (r.has("deadline") == r.has("training_days")) {
    r.fail("", "exactly one of deadline, training_days", r.has("deadline") ? "both" : "neither");
  }
  if (r.has("deadline")) {
    s.deadline_date = r.string("deadline");
    s.deadline_day = parse_date(s.deadline_date);
    if (s.deadline_day < 0) r.fail("deadline", "a date YYYY-MM-DD", "\"" + s.deadline_date + "\"");
    if (s.deadline_day <= s.start_day) {
      r.fail("deadline", "a date after start_date (" + s.start_date + ")", "\"" + s.deadline_date + "\"");
    }
  } else {
    const double days = r.number("training_days", {.min_exclusive = 0, .max = 36500});
    s.deadline_day = s.start_day + static_cast<int64_t>(std::ceil(days + s.bringup_days));
    s.deadline_date = format_date(s.deadline_day);
  }
  if (s.training_days_available() <= 0) {
    r.fail("bringup_days", "less than the days from start to deadline (" +
                               std::to_string(s.deadline_day - s.start_day) + ")",
           std::to_string(s.bringup_days));
  }
  s.target_training_days = r.number("target_training_days", 0.0, kNonNegative);
  if (r.has("token_budget") == r.has("tokens_per_active_param")) {
    r.fail("", "exactly one of token_budget, tokens_per_active_param", r.has("token_budget") ? "both" : "neither");
  }
  s.token_budget = r.number("token_budget", 0.0, kNonNegative);
  s.tokens_per_active_param = r.number("tokens_per_active_param", 0.0, kNonNegative);
  s.unique_tokens = r.number("unique_tokens", 0.0, kNonNegative);
  s.max_epochs = r.number("max_epochs", 1.0, kPositive);
  // The sweep behind each candidate takes time linear in it (~6 s per thread at 2^28).
  s.tokens_per_step = r.integer("tokens_per_step", 0, {.min = 0, .max = 1 << 28});
  s.goodput = default_goodput_config();
  if (r.has("goodput")) {
    apply_goodput_json(s.goodput, r.raw().at("goodput"), file, false);
    r.ignore("goodput");
  }
  s.goodput_runs = r.integer("goodput_runs", 400, {.min = 10, .max = 1000000});
  s.seed = static_cast<uint64_t>(r.integer("seed", 1, kNonNegative));
  s.law = parse_scaling_law(r.object_or_empty("scaling_law"));
  const std::string rank = r.choice("rank_by", {"lowest_loss", "fastest", "highest_mfu"}, "lowest_loss");
  s.rank_by = rank == "fastest" ? RankBy::kFastest : (rank == "highest_mfu" ? RankBy::kHighestMfu : RankBy::kLowestLoss);
  s.min_p_finish = r.number("min_p_finish", 0.8, {.min = 0.0, .max = 1.0});
  s.stack = r.string("stack", "");
  s.compare_stack = r.string("compare_stack", "");
  if (s.cluster.gpus() <= 0) r.fail("cluster", "at least one GPU", "0");
  parse_candidates(r, s);
  r.finish();
  if (s.unique_tokens > 0 && s.token_budget > s.unique_tokens * s.max_epochs) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "token budget %.3gT exceeds unique data x epochs (%.3gT x %.3g = %.3gT): later epochs repeat data",
                  s.token_budget / 1e12, s.unique_tokens / 1e12, s.max_epochs, s.unique_tokens * s.max_epochs / 1e12);
    s.warnings.push_back(buf);
  }
  return s;
}

Scenario load_scenario(const std::string& path) { return parse_scenario(load_json_file(path), path); }

std::string default_scenario_path() {
  return std::string(rackstep::source_dir()) + "/sim/scenarios/marin-july-2026.json";
}

Scenario default_scenario() { return load_scenario(default_scenario_path()); }

}  // namespace rackstep::sim
