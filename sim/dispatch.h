// Exact expert-parallel dispatch: which routed assignments an EP group keeps.
//
// The predictor (sim/drops.h) and the executor (exec/) call this same code, so
// a token dropped in a prediction is the token the training engine drops. Three
// transports, all reporting sender, receiver and padding drops separately, as
// the Marin trainer logs them (MoeDispatchCounts):
//
//   pooled    fixed-capacity "pooled waves" (spec/marin-architecture.md, EP
//             dispatch; levanter grug _moe/ep_fixed_pooled_wave_all_to_all.py):
//             a sender pool per destination GPU per wave of
//             ceil(sender_cf * A / (S * W)) rows; an assignment's rank r within
//             its destination picks wave r mod W and slot r div W; slots past the
//             logical pool limit are sender drops. Each receiver holds per local
//             expert per wave ceil(receiver_cf * A / (local_experts * W)) rows and
//             grants them round-robin over source GPUs (slot-major, then source);
//             rows past the logical limit are receiver drops. Logical limits are
//             the same formulas on the *valid* assignment counts (the sender's own
//             for pools, the EP group's total for receivers), clamped to
//             [1, physical].
//   ragged    variable-size all-to-all, no sender pools; one receiver gate of
//             ceil(receiver_cf * group_valid / S) rows per GPU, split across
//             `ragged_chunks` contiguous chunks of local experts in proportion to
//             their size; inside a chunk capacity goes to earlier experts first,
//             then earlier source GPUs, then earlier positions (prefix capacity).
//   capacity  GShard / Megatron per-expert capacity on each GPU's own tokens:
//             ceil(receiver_cf * valid_assignments / n_experts) rows per expert,
//             granted by position or by router probability. Counted as receiver
//             drops (the expert buffer overflows); sender_cf is unused.
//
// Padding drops are the assignments of tokens marked invalid (sequence padding).
// Drop fraction = dropped / (tokens * k) over the group (spec: "Drop fraction").
//
//   rackstep::sim::DispatchConfig cfg{.n_experts = 384, .top_k = 8};
//   std::vector<rackstep::sim::GpuAssignments> gpus(64);   // one per EP rank
//   gpus[g].experts = {...};                               // (tokens, k)
//   auto r = rackstep::sim::dispatch(cfg, gpus);
//   bool kept = r.keep[g][t * 8 + j];  r.counts.fraction();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rackstep::sim {

// The EP transport, one enum for the dispatch library, layouts (sim/layout.h:
// Layout::ep_transport, pooled or ragged) and `rackstep train`.
enum class Transport { pooled, ragged, capacity };
// Order in which the capacity transport grants expert capacity.
enum class CapacityPriority { position, router_prob };

Transport parse_transport(const std::string& name);  // UserError on anything else
std::string transport_name(Transport t);

// The dispatch settings' defaults, written once: the hero's pooled waves
// (spec/marin-architecture.md, EP dispatch: W = 3, sender cf 1.10, receiver cf
// 1.15) and the ragged receiver gate split over two expert chunks. DispatchConfig,
// Layout (sim/layout.h) and the drop model (sim/drops.h) start from these.
inline constexpr double kDefaultSenderCf = 1.10;
inline constexpr double kDefaultReceiverCf = 1.15;
inline constexpr int kDefaultWaves = 3;
inline constexpr int kDefaultRaggedChunks = 2;

struct DispatchConfig {
  int64_t n_experts = 384;
  int top_k = 8;
  Transport transport = Transport::pooled;
  double sender_cf = kDefaultSenderCf;      // pooled only: sender pool capacity factor
  double receiver_cf = kDefaultReceiverCf;  // receiver buffer / gate / per-expert capacity factor
  int waves = kDefaultWaves;                // pooled only: W
  int ragged_chunks = kDefaultRaggedChunks; // ragged only: receiver gate split across expert chunks
  CapacityPriority priority = CapacityPriority::position;  // capacity only
};

// Throws UserError for a configuration no transport can run: cf <= 0, k > experts,
// an EP size that does not divide the experts, waves or chunks < 1.
void validate(const DispatchConfig& cfg, int64_t ep);

// One GPU's routing for one MoE layer.
struct GpuAssignments {
  std::vector<int32_t> experts;     // (tokens, k) global expert ids, row-major
  std::vector<float> probs;         // (tokens, k) router probabilities; may be empty
  std::vector<uint8_t> token_valid; // (tokens) 1 = real token; empty = all valid
  int64_t tokens(int k) const { return static_cast<int64_t>(experts.size()) / k; }
};

struct DropCounts {
  int64_t assignments = 0;  // tokens * k, padding included
  int64_t sender = 0;
  int64_t receiver = 0;
  int64_t padding = 0;
  int64_t dropped() const { return sender + receiver + padding; }
  int64_t kept() const { return assignments - dropped(); }
  double fraction() const { return assignments ? double(dropped()) / double(assignments) : 0.0; }
  DropCounts& operator+=(const DropCounts& o);
};

// Physical buffer sizes (rows) for A = tokens_per_gpu * k assignments per GPU.
struct CapacityRows {
  int64_t sender_pool = 0;      // pooled: per destination per wave
  int64_t receiver_buffer = 0;  // pooled: per local expert per wave; ragged: per GPU gate;
                                // capacity: per expert
};
CapacityRows physical_capacity(const DispatchConfig& cfg, int64_t ep, int64_t tokens_per_gpu);

struct DispatchResult {
  std::vector<std::vector<uint8_t>> keep;  // per GPU (tokens, k): 1 = the expert computes it
  DropCounts counts;                       // whole EP group
  std::vector<DropCounts> per_gpu;         // by the GPU that owns the token
};

// Decides every assignment's fate. gpus.size() is the EP size S; every GPU must
// hold the same number of tokens (static buffer shapes). Bad ids or shapes are
// UserErrors (the assignments may come from a file).
DispatchResult dispatch(const DispatchConfig& cfg, const std::vector<GpuAssignments>& gpus);

// ceil(value * cf / divisor) computed in double, as the reference does, clamped
// to [1, maximum]: the logical capacity for `value` valid assignments.
int64_t scaled_capacity(int64_t value, double cf, int64_t divisor, int64_t maximum);

}  // namespace rackstep::sim
