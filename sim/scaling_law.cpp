#include "sim/scaling_law.h"

#include <cmath>

namespace rackstep::sim {

double ScalingLaw::compute_efficiency(double tokens, double active_params) const {
  const double r = tokens / (active_params * optimal_tokens_per_active_param);
  const double beta = -std::log10(overtrain_10x_efficiency);
  return r >= 1.0 ? std::pow(r, -beta) : std::pow(r, beta);
}

double ScalingLaw::forecast(double training_flops, double tokens, double active_params) const {
  const double c_eff = training_flops * compute_efficiency(tokens, active_params);
  return e + a * std::pow(c_eff, -alpha);
}

ScalingLaw parse_scaling_law(JsonReader r) {
  ScalingLaw s;
  s.e = r.number("E", s.e, {.min = 0.0});
  s.a = r.number("A", s.a, {.min_exclusive = 0.0});
  s.alpha = r.number("alpha", s.alpha, {.min_exclusive = 0.0, .max = 1.0});
  s.optimal_tokens_per_active_param =
      r.number("optimal_tokens_per_active_param", s.optimal_tokens_per_active_param, {.min_exclusive = 0.0});
  s.overtrain_10x_efficiency = r.number("overtrain_10x_efficiency", s.overtrain_10x_efficiency,
                                        {.min_exclusive = 0.0, .max = 1.0});
  r.ignore("source");
  r.finish();
  return s;
}

nlohmann::json scaling_law_json(const ScalingLaw& s) {
  return {{"E", s.e},
          {"A", s.a},
          {"alpha", s.alpha},
          {"optimal_tokens_per_active_param", s.optimal_tokens_per_active_param},
          {"overtrain_10x_efficiency", s.overtrain_10x_efficiency}};
}

}  // namespace rackstep::sim
