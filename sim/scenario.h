// A sizing scenario: the cluster, the calendar, the token budget, the goodput
// model, the scaling law and the candidate models (zoo files, inline configs,
// shapes generated from size targets, or a grid of targets).
//
//   Scenario s = load_scenario("sim/scenarios/marin-july-2026.json");
//   Scenario d = default_scenario();   // the embedded "Sizing history" situation
//
// Schema (every key but cluster, candidates and a deadline rule optional):
//   {"name": str, "cluster": {"file": path, "domains": n, "healthy_gpus_per_domain": n},
//    "start_date": "YYYY-MM-DD", "deadline": "YYYY-MM-DD" | "training_days": d,
//    "bringup_days": d, "target_training_days": d,
//    "token_budget": tokens | "tokens_per_active_param": r,
//    "unique_tokens": tokens, "max_epochs": e, "tokens_per_step": n,
//    "goodput": {sim/goodput_defaults.json keys}, "goodput_runs": n, "seed": n,
//    "scaling_law": {"E", "A", "alpha", "optimal_tokens_per_active_param", "overtrain_10x_efficiency"},
//    "rank_by": "lowest_loss" | "fastest" | "highest_mfu", "min_p_finish": p,
//    "stack": name | path (sim/stacks/; the layouts searched are those it runs),
//    "compare_stack": name | path (a second, separate best layout under it),
//    "candidates": [{"model": path} | {"inline": {model}} |
//                   {"generate": {"name", "total_params", "active_params", "attention"}} |
//                   {"grid": {"total_params": [..], "active_params": [..], "attention"}}]}
// Paths are relative to the scenario file, then to the source tree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/model.h"
#include "sim/goodput.h"
#include "sim/scaling_law.h"
#include "topologies/topology.h"

namespace rackstep::sim {

enum class RankBy { kLowestLoss, kFastest, kHighestMfu };

struct CandidateSpec {
  std::string name;
  std::string origin;            // "zoo file ...", "generated ...", "inline"
  models::ModelConfig model;     // ready when not generated
  bool generate = false;
  double target_total = 0, target_active = 0;
  std::string attention = "gqa";
};

struct Scenario {
  std::string name;
  std::string file;
  topologies::Cluster cluster;
  int64_t start_day = 0;         // days since 1970-01-01
  int64_t deadline_day = 0;
  std::string start_date, deadline_date;
  double bringup_days = 0;
  double target_training_days = 0;  // planned training days (0 = none)
  double token_budget = 0;       // tokens; 0 = tokens_per_active_param rule
  double tokens_per_active_param = 0;
  double unique_tokens = 0;      // 0 = unknown
  double max_epochs = 1;
  int64_t tokens_per_step = 0;   // 0 = each model's recipe
  GoodputConfig goodput;
  int64_t goodput_runs = 400;
  uint64_t seed = 1;
  ScalingLaw law;
  RankBy rank_by = RankBy::kLowestLoss;
  double min_p_finish = 0.8;
  std::string stack;             // training stack (sim/stack.h); empty = every layout, default calibration
  std::string compare_stack;     // optional: also the best layout under this stack, as its own column
  std::vector<CandidateSpec> candidates;
  std::vector<std::string> warnings;

  double training_days_available() const {
    return static_cast<double>(deadline_day - start_day) - bringup_days;
  }
  double tokens_for(double active_params) const {
    return token_budget > 0 ? token_budget : tokens_per_active_param * active_params;
  }
};

Scenario load_scenario(const std::string& path);
Scenario parse_scenario(const nlohmann::json& doc, const std::string& file);
// sim/scenarios/marin-july-2026.json from the source tree.
Scenario default_scenario();
std::string default_scenario_path();

// "2026-07-15" -> days since 1970-01-01; -1 when malformed.
int64_t parse_date(const std::string& s);
std::string format_date(int64_t day);
const char* to_string(RankBy r);

}  // namespace rackstep::sim
