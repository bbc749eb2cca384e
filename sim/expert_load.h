// Per-GPU expert load implied by the routing model: how many routed assignments
// each EP rank receives in a step, relative to the mean, so a step graph can make
// the most loaded rank's expert GEMMs (and its receive) take longer, not only
// count drops. Receive-side load before any drop (what a ragged transport moves
// and computes up to its gate); the pooled transport's sender pools cap it.
//
//   DropScenario s;  s.context = 16384;                  // the hero, 16k context
//   RoutingGenerator gen(load_drop_calibration().model, s.routing_shape());
//   ExpertLoad l = expert_load(s, gen, {.samples = 8});
//   double slowest = l.max_over_mean;                    // e.g. 1.12: the busiest rank does 12% more
#pragma once

#include <vector>

#include "models/model.h"
#include "sim/drops.h"
#include "sim/layout.h"
#include "sim/routing.h"

namespace rackstep::sim {

struct ExpertLoad {
  double max_over_mean = 1;        // E over steps of max_rank load / mean load, per EP group
  double p95_over_mean = 1;        // 95th percentile over ranks and steps of load / mean
  std::vector<double> rank_sorted; // (ep) expected load / mean of the busiest, 2nd busiest, ... rank
  int samples = 0;
};

// Monte Carlo over sampled steps (McOptions.samples, seed). UserError on
// impossible settings (DropScenario::validate).
ExpertLoad expert_load(const DropScenario& s, const RoutingGenerator& gen, const McOptions& opt);

// The expert load a layout's EP ranks see under the default drop calibration's
// routing model (the first MoE layer's model where the calibration has one per
// layer): tokens per GPU = micro_batch_seqs · seq / cp, the model's context,
// experts and top-k, the layout's transport, capacity factors and waves.
// A dense model or ep = 1 is balanced ({1}). `rackstep timeline --expert-load
// routing` feeds rank_sorted to the step graph: rank r's expert GEMMs take
// rank_sorted[r mod ep] times as long, so the busiest EP rank is slower in the
// timeline, not only a drop count.
ExpertLoad expert_load_for_layout(const models::ModelConfig& model, const Layout& layout, const McOptions& opt);

}  // namespace rackstep::sim
