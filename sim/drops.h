// Predicted expert-parallel token-drop fractions, split by kind.
//
// Two estimators over the routing model of sim/routing.h, cross-checked in tests:
//
//   Monte Carlo  samples whole steps (every GPU's per-expert counts) and applies
//                the exact drop rules of sim/dispatch.h at the count level, which is
//                exact for sender pools, ragged gates and per-expert capacity (their
//                drops depend only on counts). For pooled receivers, where drops
//                also depend on which wave each assignment lands in, it uses the
//                conditional expectation over wave placement: with exchangeable
//                order the per-source wave split is hypergeometric, and the sum over
//                S sources is taken as normal (Rao-Blackwellisation: no bias, less
//                noise). Reports a 95% confidence interval over samples.
//   analytic     closed-form moments of the per-GPU counts under the topic-mixture
//                model (Var = k^2 E[sum n_f^2] Var_t(phi)/(concentration + 1) plus
//                multinomial noise), then the normal overflow expectation
//                E[max(0, X - cap)] = s*pdf(z) + (m - cap)*(1 - cdf(z)), z = (cap-m)/s.
//                Microseconds; used inside the predictor's sweeps.
//
// Calibration, two kinds, both in the same JSON with their provenance:
//   - fitted to a drop number: fit_concentration() bisects the routing
//     concentration to a measured drop fraction; the default, fitted on the Marin
//     hero (2.67%, spec/calibration.md), lives in sim/drop_calibration.json.
//   - fitted to routing traces of a real router (sim/routing_fit.h: popularity,
//     document affinity and its fading, document lengths), one model per MoE
//     layer ("layer_models"); predictions average the layers. Checked out of
//     sample against exact replay (sim/routing_replay.h) by scripts/validate_drops.sh.
//
//   DropScenario s;                              // hero defaults: pooled, 1.10 / 1.15
//   s.context = 16384;
//   DropCalibration cal = load_drop_calibration();
//   RoutingGenerator gen(cal.model, s.routing_shape());
//   DropEstimate mc = estimate_drops_mc(s, gen, {.samples = 16});
//   double f = predict_drops(384, 8, 64, 65536, 16384, Transport::pooled, 1.10, 1.15).total();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/dispatch.h"
#include "sim/routing.h"

namespace rackstep::sim {

// Largest settings a drop estimate accepts (DropScenario::validate).
inline constexpr double kMaxCapacityFactor = 16;
inline constexpr int kMaxWaves = 64;
inline constexpr int64_t kMaxExperts = 65536;
inline constexpr int64_t kMaxTokensPerGpu = int64_t(1) << 22;
inline constexpr int64_t kMaxSequencesPerGpu = 4096;
inline constexpr int64_t kMaxGpus = 65536;
inline constexpr int64_t kMaxGpuExperts = int64_t(1) << 26;
inline constexpr int kMaxSamples = 100000;

struct DropScenario {
  DispatchConfig dispatch;  // experts, k, transport, capacity factors, waves, chunks
  int64_t ep = 64;
  int64_t tokens_per_gpu = 65536;
  int64_t context = 4096;
  int64_t gpus = 0;  // GPUs in the step (a multiple of ep); 0 = one EP group

  int64_t step_gpus() const { return gpus > 0 ? gpus : ep; }
  RoutingShape routing_shape() const;
  void validate() const;  // UserError on impossible settings
};

struct DropFractions {
  double sender = 0, receiver = 0, padding = 0;  // of tokens * k
  double total() const { return sender + receiver + padding; }
};

struct DropEstimate {
  DropFractions mean;
  DropFractions ci95;  // half-widths of 95% confidence intervals (0 for analytic)
  double total_ci95 = 0;
  int samples = 0;
  std::string method;  // "monte_carlo" or "analytic"
};

enum class Method { monte_carlo, analytic };

struct McOptions {
  int samples = 16;
  uint64_t seed = 1;
  int threads = 1;
};

// Drops of one sampled step from its per-(GPU, expert) counts (step_gpus, n_experts).
DropFractions drops_from_counts(const DropScenario& s, const std::vector<int32_t>& counts);
DropEstimate estimate_drops_mc(const DropScenario& s, const RoutingGenerator& gen, const McOptions& opt);
// Synthetic routing only (a histogram has no closed form): UserError otherwise.
DropEstimate estimate_drops_analytic(const DropScenario& s, const RoutingGenerator& gen);
DropEstimate estimate_drops(const DropScenario& s, const RoutingGenerator& gen, Method m, const McOptions& opt);

// Bisection on log(concentration) so the predicted total drop equals target.
// UserError when the target lies outside what the model can reach here.
double fit_concentration(const DropScenario& s, RoutingModel model, double target, Method m, const McOptions& opt);

// The fitted default routing model and the settings it was fitted at. A model
// fitted to routing traces (sim/routing_fit.h) holds one model per MoE layer;
// predictions average the layers' drops.
struct DropCalibration {
  RoutingModel model;
  std::vector<RoutingModel> layer_models;  // empty = `model` for every layer
  std::vector<int32_t> layers;             // (layer_models) model layer indices
  std::vector<std::string> traces;         // routing traces fitted to, if any
  nlohmann::json statistics;               // what was measured from them (sim/routing_fit.h)
  DropScenario scenario;
  double target_drop = 0;                  // 0 = not fitted to a drop number
  double achieved_drop = 0;
  std::string method = "monte_carlo";
  int samples = 0;
  uint64_t seed = 1;
  std::string source;
};
// The models predictions average over: layer_models, or {model}.
std::vector<RoutingModel> calibration_models(const DropCalibration& cal);
// Mean of per-layer estimates (CI half-widths combined as independent).
DropEstimate average_estimates(const std::vector<DropEstimate>& per_layer);
std::string default_drop_calibration_path();  // <source dir>/sim/drop_calibration.json
// The drop fraction the default calibration was fitted to (/fit/target_drop), read once;
// a UserError naming the file and field when it has none.
double default_drop_target();
DropCalibration load_drop_calibration(const std::string& path = default_drop_calibration_path());
void write_drop_calibration(const std::string& path, const DropCalibration& cal);

// The predictor's entry point: analytic estimate under the default calibration,
// cached per argument set (thread-safe). UserError on impossible settings.
DropFractions predict_drops(int64_t n_experts, int top_k, int64_t ep, int64_t tokens_per_gpu, int64_t context,
                            Transport transport, double sender_cf, double receiver_cf, int waves = kDefaultWaves,
                            int ragged_chunks = kDefaultRaggedChunks);

}  // namespace rackstep::sim
