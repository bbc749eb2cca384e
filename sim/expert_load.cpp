#include "sim/expert_load.h"

#include <algorithm>
#include <functional>
#include <random>

#include "sim/base/check.h"

namespace rackstep::sim {

ExpertLoad expert_load(const DropScenario& s, const RoutingGenerator& gen, const McOptions& opt) {
  s.validate();
  if (opt.samples < 1 || opt.samples > kMaxSamples)
    throw UserError("samples: expected 1.." + std::to_string(kMaxSamples) + ", found " + std::to_string(opt.samples));
  const int64_t E = s.dispatch.n_experts, S = s.ep, L = E / S, groups = s.step_gpus() / S;
  ExpertLoad out;
  out.samples = opt.samples;
  out.rank_sorted.assign(static_cast<size_t>(S), 0.0);
  std::vector<double> all;  // load / mean of every rank of every group and step
  std::vector<int32_t> counts;
  std::vector<double> load(static_cast<size_t>(S));
  double max_sum = 0;
  for (int i = 0; i < opt.samples; ++i) {
    std::seed_seq seq{opt.seed, uint64_t(i)};
    std::mt19937_64 rng(seq);
    gen.sample_counts(rng, counts);  // (gpus, experts)
    for (int64_t grp = 0; grp < groups; ++grp) {
      std::fill(load.begin(), load.end(), 0.0);
      double total = 0;
      for (int64_t g = 0; g < S; ++g) {
        const int32_t* c = &counts[static_cast<size_t>((grp * S + g) * E)];
        for (int64_t e = 0; e < E; ++e) load[static_cast<size_t>(e / L)] += c[e], total += c[e];
      }
      const double mean = total / double(S);
      for (auto& x : load) x /= mean;
      std::sort(load.begin(), load.end(), std::greater<double>());
      max_sum += load.front();
      for (int64_t r = 0; r < S; ++r) out.rank_sorted[static_cast<size_t>(r)] += load[static_cast<size_t>(r)];
      all.insert(all.end(), load.begin(), load.end());
    }
  }
  const double n = double(opt.samples) * double(groups);
  out.max_over_mean = max_sum / n;
  for (auto& x : out.rank_sorted) x /= n;
  std::sort(all.begin(), all.end());
  out.p95_over_mean = all[static_cast<size_t>(0.95 * double(all.size() - 1))];
  return out;
}

ExpertLoad expert_load_for_layout(const models::ModelConfig& model, const Layout& layout, const McOptions& opt) {
  if (model.moe.experts == 0 || layout.ep <= 1) return ExpertLoad{.rank_sorted = {1.0}};
  DropScenario s;
  s.dispatch.n_experts = model.moe.experts;
  s.dispatch.top_k = static_cast<int>(model.moe.top_k);
  s.dispatch.transport = layout.ep_transport;
  s.dispatch.sender_cf = layout.sender_cf;
  s.dispatch.receiver_cf = layout.receiver_cf;
  s.dispatch.waves = static_cast<int>(layout.waves);
  s.dispatch.ragged_chunks = static_cast<int>(layout.ragged_chunks);
  s.ep = layout.ep;
  s.tokens_per_gpu = layout.micro_batch_seqs * model.seq_len / std::max<int64_t>(1, layout.cp);
  // A folded EP rank routes its sequence-parallel share, gathered over the expert TP group (LayoutShape::ep_tokens_mb).
  if (layout.folded()) s.tokens_per_gpu = s.tokens_per_gpu * layout.expert_tp() / std::max<int64_t>(1, layout.tp);
  s.context = model.seq_len;
  const std::vector<RoutingModel> models = calibration_models(load_drop_calibration());
  RS_CHECK(!models.empty(), "a drop calibration holds at least one routing model");
  const RoutingGenerator gen(models.front(), s.routing_shape());
  return expert_load(s, gen, opt);
}

}  // namespace rackstep::sim
