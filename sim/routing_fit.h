// Fits the routing model (sim/routing.h) to statistics measured from routing
// traces (sim/base/routing_trace.h), not to a drop number:
//
//   popularity      per MoE layer, each expert's long-run share of assignments
//                   (what quantile balancing leaves; with it, a step's documents
//                   move the global load: receiver drops).
//   affinity        per layer, how much a stretch of L tokens of one document
//                   prefers some experts beyond per-token noise:
//                     Y(L) = E[sum_e (X_e - L k p_e)^2 - L k p_e (1 - k p_e)] / k^2
//                   over chunks of L tokens inside one document (X_e = the chunk's
//                   assignments to expert e). Measured affinity fades along a
//                   document, so the model has a document-wide and a local part:
//                   Y(L) = A_doc L^2 + A_loc S2(L, ell), S2 = E[sum of squared pieces
//                   of ell tokens]. Fitted over L = 8, 16, ... up to `max_scale` by
//                   least squares in relative error (ell by search). The topic
//                   mixture gives A_doc = w^2 X, A_loc = (1 - w)^2 X, X = V /
//                   (concentration + 1), V = sum_e Var over topics of the expert
//                   share: w = persistent_share, then concentration = V / X - 1.
//   document lengths  lognormal fitted to the whole documents of the stream (an
//                   evaluation trace is consecutive windows; the first and last
//                   documents, cut by the trace's edges, are left out).
//   drift           (training traces with several steps) the affinity and the
//                   popularity spread of the first and the last third of the steps;
//                   reported, not used in predictions.
//
//   std::vector<RoutingTrace> traces = {read_routing_trace("eval.rsrt")};
//   TraceFit f = fit_routing(traces, {.max_scale = 512});
//   f.layers[0].model;   // a RoutingModel for layer 0, balance_each_step = false
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/routing.h"
#include "sim/base/routing_trace.h"

namespace rackstep::sim {

struct FitOptions {
  int64_t max_scale = 0;  // longest chunk L measured; 0 = the traces' sequence length
  RoutingModel base;      // topics, topic sharpness and seed to start from
};

struct ScalePoint {
  int64_t tokens = 0;   // L
  int64_t chunks = 0;   // single-document chunks measured
  double excess = 0;    // Y(L)
};

struct LayerFit {
  int32_t layer = 0;
  RoutingModel model;
  std::vector<ScalePoint> scales;
  double affinity = 0;          // X = V / (concentration + 1) = (sqrt(A_doc) + sqrt(A_loc))^2
  double affinity_document = 0; // A_doc: document-wide part of Y(L) / L^2
  double affinity_local = 0;    // A_loc: the part that fades after coherence_tokens
  double topic_variance = 0;    // V of the topic rows
  double popularity_cv = 0;     // coefficient of variation of the expert shares
  double drift_affinity_first = 0, drift_affinity_last = 0;  // training traces; 0 otherwise
  std::string note;             // where the model could not match a statistic
};

struct TraceFit {
  int64_t n_experts = 0;
  int top_k = 0;
  int64_t tokens = 0;
  int64_t documents = 0;      // whole documents used for the length fit
  DocLengths doc_lengths;
  std::vector<LayerFit> layers;
  std::vector<std::string> sources;
};

// UserError when traces disagree on experts, top-k or layers, or hold too few
// whole documents / chunks to measure.
TraceFit fit_routing(const std::vector<RoutingTrace>& traces, const FitOptions& opt);

}  // namespace rackstep::sim
