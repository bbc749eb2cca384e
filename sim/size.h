// Sizing against a deadline — the main job. For each candidate of a scenario:
// search its layouts (sim/sweep.h), take the fastest that fits, turn its step
// time into days with the goodput Monte Carlo (sim/goodput.h), forecast its
// loss (sim/scaling_law.h), and rank the candidates by the scenario's utility.
//
//   Scenario s = default_scenario();
//   SizeResult r = size(s, [](const SizeProgress& p) { ... });
//   r.candidates[r.ranking[0]]  // the winner; r.winner_reason says why
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/goodput.h"
#include "sim/layout.h"
#include "sim/predict.h"
#include "sim/scenario.h"

namespace rackstep::sim {

struct CandidateResult {
  std::string name;
  std::string origin;
  models::ModelConfig model;
  double total_params = 0, active_params = 0;
  bool runnable = false;             // a valid layout fits
  std::string why_not;               // when not runnable: the dominant rejection reasons
  int64_t layouts_enumerated = 0, layouts_valid = 0;
  Layout layout;
  Prediction prediction;
  double tokens = 0;                 // token budget for this candidate
  double tokens_per_active_param = 0;
  double tokens_per_day = 0;         // at the predicted step time, no interruptions
  double ideal_days = 0;
  GoodputResult goodput;
  double training_flops = 0;         // Marin convention, whole run
  double forecast_loss = 0;
  double headroom_bytes = 0;
  bool meets_target_days = false;    // p50 within the planned training days
  // The best layout under the scenario's compare_stack (when it names one).
  bool compare_runnable = false;
  Layout compare_layout;
  Prediction compare_prediction;
  std::string verdict;
};

struct SizeResult {
  Scenario scenario;
  std::vector<CandidateResult> candidates;  // scenario order
  std::vector<size_t> ranking;              // indices, best first
  std::string winner_reason;
  double seconds = 0;                       // wall time of the sizing
};

struct SizeProgress {
  size_t index = 0, count = 0;
  std::string candidate;
  std::string stage;                        // "generating", "sweeping", "goodput"
};

SizeResult size(const Scenario& s, const std::function<void(const SizeProgress&)>& progress = {});

nlohmann::json size_result_json(const SizeResult& r);
std::string format_size_table(const SizeResult& r);
// Markdown report; `images` are relative paths of PNGs already written next to it (may be empty).
std::string format_size_report(const SizeResult& r, const std::vector<std::pair<std::string, std::string>>& images);

}  // namespace rackstep::sim
