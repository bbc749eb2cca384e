// Loss forecasts from a compute scaling law, with a penalty for training far
// from the compute-optimal tokens per active parameter.
//
//   L(C) = E + A * C_eff^-alpha            (spec/calibration.md, "Sizing history")
//   C_eff = C * efficiency(r),  r = tokens / (active params * optimal_ratio)
//   efficiency(r) = r^-beta for r >= 1 and r^+beta below, beta fixed so that 10x
//   overtraining costs `overtrain_10x_efficiency` (0.5: "roughly 2x in compute
//   efficiency"): beta = -log10(overtrain_10x_efficiency).
//
// Defaults: the May-recipe fit L = 1.6 + 88.90 C^-0.0941, optimal ~60 tokens per
// active parameter. C is training FLOPs in Marin's convention (3 x forward).
//
//   ScalingLaw law;                                  // defaults above
//   double loss = law.forecast(2.696e24, 18e12, 22.762e9);
#pragma once

#include <nlohmann/json.hpp>

#include "sim/base/json_io.h"

namespace rackstep::sim {

struct ScalingLaw {
  double e = 1.6;
  double a = 88.90;
  double alpha = 0.0941;
  double optimal_tokens_per_active_param = 60.0;
  double overtrain_10x_efficiency = 0.5;

  double compute_efficiency(double tokens, double active_params) const;
  double forecast(double training_flops, double tokens, double active_params) const;
};

// Reads a "scaling_law" object (every key optional).
ScalingLaw parse_scaling_law(JsonReader r);
nlohmann::json scaling_law_json(const ScalingLaw& s);

}  // namespace rackstep::sim
