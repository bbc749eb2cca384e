// Expert parallelism's decisions, made on the host the same way by every
// transport: the MPI one in host memory (exec/dist.h, MpiExperts) and the NCCL
// one in device memory (exec/cuda/experts.h). A transport only moves rows
// between the steps of an EpLayerPlan; which assignment goes where, which slot
// a sender drops, and which row a receiver computes are decided here, so the
// transports drop the same assignments, and exactly those sim::dispatch drops
// (tests/exec_dist.cpp checks both).
//
// Ranks form EP groups of S consecutive ranks; rank g of a group owns experts
// [g*E/S, (g+1)*E/S). Per MoE layer and rank:
//   pooled  W waves of fixed blocks of P = sender pool rows per destination;
//           assignment rank r of its destination goes to wave r mod W, slot
//           r div W, and slots past the logical pool limit are dropped by the
//           sender; the receiver grants each local expert its per-wave
//           capacity slot-major, source-minor and drops the rest.
//   ragged  a count exchange, then every assignment (no sender pools), rows
//           ordered by (expert, position); the receiver gate is split across
//           expert chunks (sim/base/dispatch.h).
// Each row carries a header: the local expert id on the way out (-1 = empty
// slot), 1 = computed / 0 = dropped on the way back (the combine). Backward
// runs the same two exchanges on the gradients, without headers. Capacities and
// limits come from sim/base/dispatch.h (physical_capacity, scaled_capacity);
// every token counts as valid (the engine has no sequence padding).
//
//   EpLayerPlan plan(cfg, S, expert, sorted_pos, tokens);  // 1. send rows, send_header, send_source
//   if (!plan.pooled()) plan.set_rows_from(counts);    // 2. ragged: after the count exchange of rows_to
//   for (int w = 0; w < plan.phases(); ++w) exchange(plan.blocks(w, false), ...);
//   plan.plan_receive(received_header);                // 3. the receiver's decisions: recv.kept_rows ...
//                                                      //    (or plan_receive_phase(w, ...) as each phase lands)
//   ... compute the kept rows, send back recv.kept as the header ...
//   plan.finish(returned_header, keep, drops);         // 4. keep, drops, result_row
#pragma once

#include <cstdint>
#include <vector>

#include "exec/model.h"
#include "sim/base/dispatch.h"

namespace rackstep::exec {

// Where one rank's assignments go. pooled: rows = W * S * P, row
// ((w * S + d) * P + slot); ragged: rows grouped by destination in
// (expert, position) order, rows_to[d] of them for destination d.
struct SendPlan {
  std::vector<int64_t> row_of;  // (A) send-buffer row of assignment a, -1 = sender drop
  std::vector<int> rows_to;     // (S) rows for each destination
  int64_t rows = 0;             // rows in the send buffer
};
SendPlan plan_pooled_send(const int32_t* expert, int64_t A, int64_t S, int64_t local, int64_t waves,
                          int64_t pool_rows, int64_t pool_limit);
SendPlan plan_ragged_send(const int32_t* expert, int64_t A, int64_t S, int64_t local);

// What a receiver computes. `header` (rows): local expert id of each received
// row, -1 = empty slot. pooled rows are ((w * S + s) * P + slot); ragged rows
// come from source 0, 1, ... with rows_from[s] each.
struct RecvPlan {
  std::vector<int64_t> kept_rows;  // received rows computed, grouped by local expert
  std::vector<int32_t> offsets;    // (local + 1) into kept_rows
  std::vector<uint8_t> kept;       // (rows) 1 = computed
};
RecvPlan plan_pooled_receive(const int32_t* header, int64_t S, int64_t local, int64_t waves, int64_t pool_rows,
                             int64_t receiver_limit);
RecvPlan plan_ragged_receive(const int32_t* header, const std::vector<int>& rows_from, int64_t local, int chunks,
                             int64_t gate);

// Logical limits of an EP group of S ranks with `tokens` tokens each (all valid).
struct TransportLimits {
  sim::CapacityRows physical;
  int64_t pool_limit = 0;      // pooled: per destination per wave
  int64_t receiver_limit = 0;  // pooled: per local expert per wave; ragged: the gate
};
TransportLimits transport_limits(const sim::DispatchConfig& cfg, int64_t S, int64_t tokens);

// UserError unless `cfg` is a transport a group of S processes runs (pooled or
// ragged, valid for S: sim::validate).
void check_ep_transport(const sim::DispatchConfig& cfg, int64_t S);

// The rows one exchange phase moves between this rank and each peer, in rows
// of the buffers' layout: send rows [send_at[p], +send_rows[p]) go to peer p,
// and recv_rows[p] from it land at recv_at[p].
struct ExchangeBlocks {
  std::vector<int64_t> send_at, send_rows, recv_at, recv_rows;  // (S) each
};

// One exchange phase's kept rows in the device's compute order
// (EpLayerPlan::compute_rows): one grouped expert call.
struct PhaseRows {
  int64_t first = 0;             // its first row in compute_rows
  std::vector<int32_t> offsets;  // (local + 1) each local expert's rows, counted from `first`
};

// One MoE layer's exchange on one rank of an EP group of S. The send buffer
// holds send.rows rows, the receive buffer recv_rows() rows, in the layouts
// of SendPlan / RecvPlan; a "back" exchange (the combine, the input
// gradients) swaps the two.
class EpLayerPlan {
 public:
  // expert: (tokens, k) this rank's chosen experts; sorted_pos (tokens * k):
  // the grouped row of each assignment (the dispatch's); host memory.
  EpLayerPlan(const sim::DispatchConfig& cfg, int64_t S, const int32_t* expert, const int32_t* sorted_pos, int tokens);
  EpLayerPlan() = default;

  bool pooled() const { return pooled_; }
  int64_t assignments() const { return A_; }
  // Exchange phases: W pooled waves, or one ragged all-to-all.
  int phases() const { return pooled_ ? waves_ : 1; }
  ExchangeBlocks blocks(int phase, bool back) const;
  // Ragged: the rows each source sends this rank, from the count exchange of
  // send.rows_to (pooled: fixed, set by the constructor).
  void set_rows_from(const int32_t* counts);
  int64_t recv_rows() const;
  // The first received row of exchange phase `phase` (recv_phase_begin(phases()) = recv_rows()):
  // a pooled wave's rows are [w * S * P, (w + 1) * S * P), the ragged exchange's all of them.
  int64_t recv_phase_begin(int phase) const;
  // The receiver's decisions phase by phase, as each phase's rows arrive:
  // phase `phase`'s from `header` (recv_rows(): the receive buffer's header
  // plane, read only in that phase's rows), after phases 0 .. phase - 1. A
  // pooled wave's receiver capacity is its own, so its decisions need no
  // later wave's rows. Sets that phase's rows of recv_header and compute_of_row
  // and its PhaseRows; after the last phase, recv.
  void plan_receive_phase(int phase, const int32_t* header);
  // Every phase's decisions at once (header: every received row).
  void plan_receive(const int32_t* header);
  // The sender's results, from the headers the combine returned (send.rows:
  // 1 = computed). keep (A): per grouped row, 1 = computed; drops: this rank's counts.
  void finish(const int32_t* returned_header, uint8_t* keep, sim::DropCounts& drops);

  SendPlan send;
  std::vector<int32_t> send_header;   // (send.rows) local expert id of each send row, -1 = empty slot
  std::vector<int32_t> send_source;   // (send.rows) grouped row it carries, -1 = empty slot
  std::vector<int> rows_from;         // (S) rows received from each source
  RecvPlan recv;
  std::vector<int32_t> recv_header;   // (recv_rows()) the combine's header: 1 = computed, 0 = dropped
  // The order the device transport computes the kept rows in (exec/cuda/experts.cpp: phase by phase, so
  // that one phase's experts overlap the next phase's exchange): phase-major, then by local expert, then
  // as recv.kept_rows orders them. One phase (ragged, or one wave): recv.kept_rows' order.
  std::vector<int32_t> compute_rows;    // (R) the received row of each computed row
  std::vector<int32_t> compute_of_row;  // (recv_rows()) computed row of received row r, -1 = not computed
  std::vector<PhaseRows> phase_rows;    // (phases()) each phase's part of compute_rows
  std::vector<uint8_t> sent_kept;     // (A) assignment order: computed by its expert
  std::vector<int32_t> result_row;    // (A) by grouped row: the send row its output returns in, -1 = dropped
  std::vector<int32_t> grad_source;   // (send.rows) by send row: the grouped row whose gradient it carries, -1 = none

 private:
  bool pooled_ = true;
  int64_t S_ = 1, local_ = 1, A_ = 0, P_ = 0;
  int waves_ = 1, chunks_ = 1;
  int64_t receiver_limit_ = 0;
  std::vector<int32_t> sorted_pos_;  // (A)
  std::vector<std::vector<int64_t>> by_expert_;  // (local) kept rows of the phases planned so far
};

// The whole group's decisions made the way the ranks make them (an
// EpLayerPlan per rank, the exchanges' headers moved in memory), for tests
// against sim::dispatch. Returns keep per rank, (tokens, k) in assignment
// order, and the counts.
sim::DispatchResult transport_decisions(const sim::DispatchConfig& cfg,
                                        const std::vector<std::vector<int32_t>>& experts);

// The layer's expert variant for the experts e0, e0 + 1, ... a rank holds:
// their rows of the biases and bias gradients (nullptr where the layer has none).
ExpertOptions local_expert_options(const ExpertLayer& l, int64_t e0);

}  // namespace rackstep::exec
