#include "sim/routing_replay.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "sim/base/check.h"

namespace rackstep::sim {

ReplayResult replay_drops(const RoutingTrace& t, const DropScenario& s, const ReplayOptions& opt) {
  s.validate();
  if (t.n_experts != s.dispatch.n_experts || t.top_k != s.dispatch.top_k)
    throw UserError("replay: the trace routes " + std::to_string(t.n_experts) + " experts top-" +
                    std::to_string(t.top_k) + "; the layout has " + std::to_string(s.dispatch.n_experts) +
                    " experts top-" + std::to_string(s.dispatch.top_k));
  if (opt.shuffles < 1 || opt.shuffles > 1000)
    throw UserError("replay shuffles: expected 1..1000 (at most 1000), found " + std::to_string(opt.shuffles));
  const int64_t C = s.context, T = s.tokens_per_gpu, G = s.step_gpus(), S = s.ep, k = s.dispatch.top_k;
  const int64_t n = t.token_count();
  const int64_t sequences = n / C;
  const int64_t step_tokens = G * T;
  const int64_t steps = sequences * C / step_tokens;
  if (steps < 1)
    throw UserError("replay: the trace holds " + std::to_string(n) + " tokens; one step at context " +
                    std::to_string(C) + " needs " + std::to_string(step_tokens) + " (GPUs x tokens per GPU, " +
                    "whole sequences): record more (rackstep train --eval-batches) or pick a smaller layout");

  ReplayResult out;
  out.steps = steps;
  out.tokens_per_step = step_tokens;
  out.unused_tokens = n - steps * step_tokens;
  std::vector<DropFractions> per_step;
  std::vector<int64_t> order(static_cast<size_t>(sequences));
  std::vector<GpuAssignments> gpus(static_cast<size_t>(S));
  for (auto& g : gpus) {
    g.experts.resize(static_cast<size_t>(T * k));
    g.probs.resize(static_cast<size_t>(T * k));
  }
  for (int sh = 0; sh < opt.shuffles; ++sh) {
    std::iota(order.begin(), order.end(), int64_t{0});
    std::seed_seq seq{opt.seed, uint64_t(sh)};
    std::mt19937_64 rng(seq);
    std::shuffle(order.begin(), order.end(), rng);
    // Stream token i of this shuffle is trace token order[i / C] * C + i % C.
    for (int64_t st = 0; st < steps; ++st) {
      DropCounts counts;
      for (int64_t grp = 0; grp < G / S; ++grp) {
        for (int64_t l = 0; l < t.layers(); ++l) {
          const uint16_t* ex = t.experts[static_cast<size_t>(l)].data();
          const float* sc = t.scores[static_cast<size_t>(l)].data();
          for (int64_t g = 0; g < S; ++g) {
            const int64_t first = (st * G + grp * S + g) * T;
            auto& a = gpus[static_cast<size_t>(g)];
            for (int64_t i = 0; i < T; ++i) {
              const int64_t pos = first + i;
              const int64_t tok = order[static_cast<size_t>(pos / C)] * C + pos % C;
              for (int64_t j = 0; j < k; ++j) {
                a.experts[static_cast<size_t>(i * k + j)] = ex[tok * k + j];
                a.probs[static_cast<size_t>(i * k + j)] = sc[tok * k + j];
              }
            }
          }
          counts += dispatch(s.dispatch, gpus).counts;
        }
      }
      const double total = double(counts.assignments);
      per_step.push_back({double(counts.sender) / total, double(counts.receiver) / total, double(counts.padding) / total});
    }
  }
  // Mean and a normal 95% interval over steps.
  DropEstimate& e = out.estimate;
  e.method = "replay";
  e.samples = static_cast<int>(per_step.size());
  const double m = double(per_step.size());
  auto stat = [&](auto get, double& mean, double& ci) {
    double sum = 0, sq = 0;
    for (const auto& f : per_step) sum += get(f);
    mean = sum / m;
    for (const auto& f : per_step) sq += (get(f) - mean) * (get(f) - mean);
    ci = m > 1 ? 1.96 * std::sqrt(sq / (m - 1) / m) : 0.0;
  };
  double total = 0;
  stat([](const DropFractions& f) { return f.sender; }, e.mean.sender, e.ci95.sender);
  stat([](const DropFractions& f) { return f.receiver; }, e.mean.receiver, e.ci95.receiver);
  stat([](const DropFractions& f) { return f.padding; }, e.mean.padding, e.ci95.padding);
  stat([](const DropFractions& f) { return f.total(); }, total, e.total_ci95);
  return out;
}

}  // namespace rackstep::sim
