// Layout search: enumerate every layout of a model on a cluster, predict each,
// drop those that cannot run, rank by step time, and keep the Pareto front of
// throughput vs memory headroom.
//
// The space: tp in {1,2,4,8} (inside a domain), cp in {1,2,4,8}, pp over the
// divisors of the layer count (with 1F1B, interleaved v=2, zero-bubble and
// DualPipeV schedules), data = GPUs / (tp·cp·pp), ep over the divisors of the
// expert count, fsdp in {1, ep, the domain, data}, micro-batches over the powers
// of two dividing a rank's sequences, recompute none / selective / full (+ carry
// offload), optimizer state on device / host, pooled / ragged EP transport; with a
// training stack (SweepOptions::stack), the ZeRO stages it runs and only what it runs.
// Work is split over std::thread workers (all cores by default); each outer
// combination (tp, cp, pp, ep, fsdp) is one work item.
//
//   Predictor p(graph, cluster);
//   SweepResult r = sweep(p, {.top = 10});
//   r.top[0].layout, r.top[0].prediction.step_time_s; r.pareto; r.rejected[Reason]
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/layout.h"
#include "sim/predict.h"
#include "sim/stack.h"

namespace rackstep::sim {

struct SweepOptions {
  int64_t tokens_per_step = 0;   // 0 = the model recipe's batch
  size_t top = 10;
  int threads = 0;               // 0 = std::thread::hardware_concurrency()
  // Only layouts this training stack runs (rejected as stack_support otherwise), and
  // its ZeRO stages for sharded layouts; nullptr = every layout, ZeRO-3 sharding.
  const Stack* stack = nullptr;
};

struct SweepEntry {
  Layout layout;
  Prediction prediction;
  double headroom_bytes = 0;     // HBM left per GPU
};

struct SweepResult {
  int64_t enumerated = 0;
  int64_t valid = 0;             // runnable (fits)
  std::array<int64_t, static_cast<size_t>(Reason::kCount)> rejected{};
  // One example per reason (the first met), with its explanation.
  std::array<std::string, static_cast<size_t>(Reason::kCount)> example{};
  std::vector<SweepEntry> top;   // fastest first
  std::vector<SweepEntry> pareto;  // by throughput descending; each has more headroom than any faster one
  int threads_used = 1;
};

SweepResult sweep(const Predictor& p, const SweepOptions& opt = {});

}  // namespace rackstep::sim
