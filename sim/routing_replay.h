// Exact replay of a recorded routing trace (sim/base/routing_trace.h) through the
// dispatch library (sim/base/dispatch.h): the ground truth drop rate of that router
// under a layout, with no routing model in between.
//
// The trace's tokens, in run order, are one stream of packed documents (an
// evaluation trace is consecutive windows of the data split, so documents are
// whole). The replay cuts that stream into sequences of `context` tokens, as
// the trainer packs documents, shuffles them with the seed (the trainer's
// random window order), and deals them out: step s, GPU g gets tokens
// [(s*G + g) * T, (s*G + g + 1) * T) of the shuffled concatenation, so a GPU holds
// T / context whole sequences, or one sequence spans context / T consecutive GPUs
// (context parallel). Every EP group of every step and every recorded MoE layer
// goes through sim::dispatch; drop fraction = dropped / (tokens * k * layers).
//
// The routing was decided by the recorded run (its context, its weights); the
// replay changes only how those tokens are grouped into sequences, GPUs and steps.
//
//   RoutingTrace t = read_routing_trace("eval.rsrt");
//   DropScenario s;  s.dispatch = {.n_experts = 8, .top_k = 2};  s.ep = 4;
//   s.tokens_per_gpu = 2048;  s.context = 1024;
//   ReplayResult r = replay_drops(t, s, {.shuffles = 4});
#pragma once

#include <cstdint>

#include "sim/drops.h"
#include "sim/base/routing_trace.h"

namespace rackstep::sim {

struct ReplayOptions {
  int shuffles = 4;   // independent sequence orders, pooled
  uint64_t seed = 1;
};

struct ReplayResult {
  DropEstimate estimate;  // mean over steps (all shuffles) and a 95% CI over steps
  int64_t steps = 0;      // steps per shuffle
  int64_t tokens_per_step = 0;
  int64_t unused_tokens = 0;  // the stream's tail that fills no whole step
};

// UserError when the trace does not match the scenario's experts / top-k, or
// holds less than one step of tokens at this layout.
ReplayResult replay_drops(const RoutingTrace& trace, const DropScenario& s, const ReplayOptions& opt);

}  // namespace rackstep::sim
