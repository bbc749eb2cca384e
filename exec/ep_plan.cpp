// Expert parallelism's decisions on the host, shared by the MPI and NCCL transports. See ep_plan.h.
#include "exec/ep_plan.h"

#include <algorithm>
#include <numeric>

#include "sim/base/check.h"
#include "sim/base/value_error.h"

namespace rackstep::exec {

// --- the send and receive decisions -------------------------------------------------------

SendPlan plan_pooled_send(const int32_t* expert, int64_t A, int64_t S, int64_t local, int64_t waves,
                          int64_t pool_rows, int64_t pool_limit) {
  SendPlan p;
  p.row_of.assign(static_cast<size_t>(A), -1);
  p.rows_to.assign(static_cast<size_t>(S), static_cast<int>(waves * pool_rows));
  p.rows = waves * S * pool_rows;
  const int64_t rank_limit = pool_limit * waves;  // slot < pool_limit  <=>  rank < pool_limit * W
  std::vector<int64_t> rank(static_cast<size_t>(S), 0);
  for (int64_t a = 0; a < A; ++a) {
    const int64_t d = expert[a] / local;
    const int64_t r = rank[d]++;
    if (r >= rank_limit) continue;  // sender drop
    p.row_of[a] = ((r % waves) * S + d) * pool_rows + r / waves;
  }
  return p;
}

SendPlan plan_ragged_send(const int32_t* expert, int64_t A, int64_t S, int64_t local) {
  SendPlan p;
  p.row_of.assign(static_cast<size_t>(A), -1);
  p.rows_to.assign(static_cast<size_t>(S), 0);
  p.rows = A;
  // Counting sort by expert, stable in position: destinations in order, inside
  // one destination by local expert, then position.
  std::vector<int64_t> start(static_cast<size_t>(S * local + 1), 0);
  for (int64_t a = 0; a < A; ++a) start[expert[a] + 1]++;
  for (size_t e = 1; e < start.size(); ++e) start[e] += start[e - 1];
  for (int64_t a = 0; a < A; ++a) p.row_of[a] = start[expert[a]]++;
  for (int64_t a = 0; a < A; ++a) p.rows_to[expert[a] / local]++;
  return p;
}

namespace {
RecvPlan group_kept(const std::vector<std::vector<int64_t>>& by_expert, int64_t rows) {
  RecvPlan p;
  p.kept.assign(static_cast<size_t>(rows), 0);
  p.offsets.push_back(0);
  for (const auto& rows_of_e : by_expert) {
    for (int64_t r : rows_of_e) {
      p.kept_rows.push_back(r);
      p.kept[r] = 1;
    }
    p.offsets.push_back(static_cast<int32_t>(p.kept_rows.size()));
  }
  return p;
}
}  // namespace

namespace {

// Wave w's receiver decisions: its kept rows by local expert. Per wave, capacity per local expert goes
// slot-major, source-minor (sim/base/dispatch.cpp); a wave reads only its own rows' headers.
std::vector<std::vector<int64_t>> pooled_wave_receive(const int32_t* header, int64_t S, int64_t local, int64_t w,
                                                      int64_t pool_rows, int64_t receiver_limit) {
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(local));
  std::vector<int64_t> used(static_cast<size_t>(local), 0);
  for (int64_t slot = 0; slot < pool_rows; ++slot) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t row = (w * S + s) * pool_rows + slot;
      const int32_t e = header[row];
      if (e < 0) continue;
      RS_CHECK(e < local, "a received row names an expert this rank does not hold");
      if (used[e]++ < receiver_limit) by_expert[e].push_back(row);  // else: receiver drop
    }
  }
  return by_expert;
}

// The ragged receiver's kept rows by local expert.
std::vector<std::vector<int64_t>> ragged_receive(const int32_t* header, const std::vector<int>& rows_from,
                                                 int64_t local, int chunks, int64_t gate) {
  const int64_t S = static_cast<int64_t>(rows_from.size());
  // rows[e][s]: rows from source s for local expert e, in the sender's position order.
  std::vector<std::vector<std::vector<int64_t>>> rows(static_cast<size_t>(local),
                                                      std::vector<std::vector<int64_t>>(static_cast<size_t>(S)));
  int64_t at = 0;
  for (int64_t s = 0; s < S; ++s) {
    for (int i = 0; i < rows_from[s]; ++i, ++at) {
      RS_CHECK(header[at] >= 0 && header[at] < local, "a received row names an expert this rank does not hold");
      rows[header[at]][s].push_back(at);
    }
  }
  // The gate split across chunks of local experts in proportion to their size;
  // inside a chunk: earlier experts, then earlier sources, then earlier positions.
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(local));
  for (int c = 0; c < chunks; ++c) {
    const int64_t lo = c * local / chunks, hi = (c + 1) * local / chunks;
    const int64_t cap = sim::scaled_capacity(gate * (hi - lo), 1.0, local, gate);
    int64_t used = 0;
    for (int64_t e = lo; e < hi; ++e)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t r : rows[e][s])
          if (used++ < cap) by_expert[e].push_back(r);  // else: receiver drop
  }
  return by_expert;
}

}  // namespace

RecvPlan plan_pooled_receive(const int32_t* header, int64_t S, int64_t local, int64_t waves, int64_t pool_rows,
                             int64_t receiver_limit) {
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(local));
  for (int64_t w = 0; w < waves; ++w) {
    const auto wave = pooled_wave_receive(header, S, local, w, pool_rows, receiver_limit);
    for (int64_t e = 0; e < local; ++e) by_expert[e].insert(by_expert[e].end(), wave[e].begin(), wave[e].end());
  }
  return group_kept(by_expert, waves * S * pool_rows);
}

RecvPlan plan_ragged_receive(const int32_t* header, const std::vector<int>& rows_from, int64_t local, int chunks,
                             int64_t gate) {
  const int64_t rows = std::accumulate(rows_from.begin(), rows_from.end(), int64_t{0});
  return group_kept(ragged_receive(header, rows_from, local, chunks, gate), rows);
}

TransportLimits transport_limits(const sim::DispatchConfig& cfg, int64_t S, int64_t tokens) {
  TransportLimits t;
  t.physical = sim::physical_capacity(cfg, S, tokens);
  const int64_t A = tokens * cfg.top_k, group_valid = S * A;  // every token is valid
  if (cfg.transport == sim::Transport::pooled) {
    t.pool_limit = sim::scaled_capacity(A, cfg.sender_cf, S * cfg.waves, t.physical.sender_pool);
    t.receiver_limit =
        sim::scaled_capacity(group_valid, cfg.receiver_cf, cfg.n_experts * cfg.waves, t.physical.receiver_buffer);
  } else {
    t.receiver_limit = sim::scaled_capacity(group_valid, cfg.receiver_cf, S, t.physical.receiver_buffer);
  }
  return t;
}

void check_ep_transport(const sim::DispatchConfig& cfg, int64_t S) {
  sim::validate(cfg, S);
  if (cfg.transport == sim::Transport::capacity) {
    throw UserError("train: expert parallelism across processes runs the pooled or ragged transport, found capacity");
  }
}

// --- one layer on one rank ------------------------------------------------------------------

EpLayerPlan::EpLayerPlan(const sim::DispatchConfig& cfg, int64_t S, const int32_t* expert, const int32_t* sorted_pos,
                         int tokens)
    : pooled_(cfg.transport == sim::Transport::pooled),
      S_(S),
      local_(cfg.n_experts / S),
      A_(int64_t(tokens) * cfg.top_k),
      waves_(static_cast<int>(cfg.waves)),
      chunks_(static_cast<int>(cfg.ragged_chunks)),
      sorted_pos_(sorted_pos, sorted_pos + int64_t(tokens) * cfg.top_k) {
  check_ep_transport(cfg, S);
  const TransportLimits lim = transport_limits(cfg, S, tokens);
  P_ = lim.physical.sender_pool;
  receiver_limit_ = lim.receiver_limit;
  send = pooled_ ? plan_pooled_send(expert, A_, S, local_, waves_, P_, lim.pool_limit)
                 : plan_ragged_send(expert, A_, S, local_);
  send_header.assign(static_cast<size_t>(send.rows), -1);
  send_source.assign(static_cast<size_t>(send.rows), -1);
  for (int64_t a = 0; a < A_; ++a) {
    const int64_t row = send.row_of[a];
    if (row < 0) continue;  // sender drop
    send_header[row] = static_cast<int32_t>(expert[a] % local_);
    send_source[row] = sorted_pos_[a];
  }
  if (pooled_) rows_from.assign(static_cast<size_t>(S), send.rows_to[0]);  // W * P from every source
}

ExchangeBlocks EpLayerPlan::blocks(int phase, bool back) const {
  ExchangeBlocks b;
  const auto n = static_cast<size_t>(S_);
  b.send_at.resize(n);
  b.send_rows.resize(n);
  b.recv_at.resize(n);
  b.recv_rows.resize(n);
  if (pooled_) {  // wave `phase`: P rows to and from every peer, at ((w * S + p) * P)
    for (int64_t p = 0; p < S_; ++p) {
      b.send_at[p] = b.recv_at[p] = (phase * S_ + p) * P_;
      b.send_rows[p] = b.recv_rows[p] = P_;
    }
    return b;
  }
  RS_CHECK(rows_from.size() == n, "ragged: the count exchange comes before the rows");
  int64_t s_at = 0, r_at = 0;
  for (size_t p = 0; p < n; ++p) {
    b.send_rows[p] = back ? rows_from[p] : send.rows_to[p];
    b.recv_rows[p] = back ? send.rows_to[p] : rows_from[p];
    b.send_at[p] = s_at;
    b.recv_at[p] = r_at;
    s_at += b.send_rows[p];
    r_at += b.recv_rows[p];
  }
  return b;
}

void EpLayerPlan::set_rows_from(const int32_t* counts) { rows_from.assign(counts, counts + S_); }

int64_t EpLayerPlan::recv_rows() const { return std::accumulate(rows_from.begin(), rows_from.end(), int64_t{0}); }

int64_t EpLayerPlan::recv_phase_begin(int phase) const {
  RS_CHECK(phase >= 0 && phase <= phases(), "recv_phase_begin: a phase of the exchange, or the end");
  if (pooled_) return phase * S_ * P_;
  return phase == 0 ? 0 : recv_rows();
}

void EpLayerPlan::plan_receive_phase(int phase, const int32_t* header) {
  RS_CHECK(phase >= 0 && phase < phases(), "plan_receive_phase: a phase of the exchange");
  const int64_t rows = recv_rows();
  if (phase == 0) {
    by_expert_.assign(static_cast<size_t>(local_), {});
    recv_header.assign(static_cast<size_t>(rows), 0);
    compute_rows.clear();
    compute_of_row.assign(static_cast<size_t>(rows), -1);
    phase_rows.clear();
  }
  RS_CHECK(phase == static_cast<int>(phase_rows.size()), "plan_receive_phase: the phases in order");
  const std::vector<std::vector<int64_t>> mine =
      pooled_ ? pooled_wave_receive(header, S_, local_, phase, P_, receiver_limit_)
              : ragged_receive(header, rows_from, local_, chunks_, receiver_limit_);
  PhaseRows pr;
  pr.first = static_cast<int64_t>(compute_rows.size());
  pr.offsets.push_back(0);
  for (int64_t e = 0; e < local_; ++e) {
    for (int64_t r : mine[e]) {
      compute_of_row[r] = static_cast<int32_t>(compute_rows.size());
      compute_rows.push_back(static_cast<int32_t>(r));
      recv_header[r] = 1;
      by_expert_[e].push_back(r);
    }
    pr.offsets.push_back(static_cast<int32_t>(int64_t(compute_rows.size()) - pr.first));
  }
  phase_rows.push_back(std::move(pr));
  if (phase + 1 == phases()) recv = group_kept(by_expert_, rows);
}

void EpLayerPlan::plan_receive(const int32_t* header) {
  for (int p = 0; p < phases(); ++p) plan_receive_phase(p, header);
}

void EpLayerPlan::finish(const int32_t* returned_header, uint8_t* keep, sim::DropCounts& drops) {
  drops = sim::DropCounts{};
  drops.assignments = A_;
  sent_kept.assign(static_cast<size_t>(A_), 0);
  result_row.assign(static_cast<size_t>(A_), -1);
  grad_source.assign(static_cast<size_t>(send.rows), -1);
  for (int64_t a = 0; a < A_; ++a) {
    const int32_t pos = sorted_pos_[a];
    const int64_t row = send.row_of[a];
    const bool kept = row >= 0 && returned_header[row] == 1;
    keep[pos] = kept ? 1 : 0;
    sent_kept[a] = keep[pos];
    if (!kept) {
      (row < 0 ? drops.sender : drops.receiver)++;
      continue;
    }
    result_row[pos] = static_cast<int32_t>(row);
    grad_source[row] = pos;
  }
}

// --- the whole group in memory (tests) ------------------------------------------------------

namespace {

// to[d] (rows of d's receive buffer) = what every source's `from` sends d in phase `phase`.
template <typename T>
void exchange_in_memory(const std::vector<EpLayerPlan>& plans, const std::vector<std::vector<T>>& from,
                        std::vector<std::vector<T>>& to, bool back) {
  const auto S = static_cast<int64_t>(plans.size());
  for (int w = 0; w < plans[0].phases(); ++w) {
    for (int64_t s = 0; s < S; ++s) {
      const ExchangeBlocks bs = plans[s].blocks(w, back);
      for (int64_t d = 0; d < S; ++d) {
        const ExchangeBlocks bd = plans[d].blocks(w, back);
        RS_CHECK(bs.send_rows[d] == bd.recv_rows[s], "sender and receiver agree on a block's rows");
        std::copy_n(from[s].begin() + bs.send_at[d], bs.send_rows[d], to[d].begin() + bd.recv_at[s]);
      }
    }
  }
}

}  // namespace

sim::DispatchResult transport_decisions(const sim::DispatchConfig& cfg,
                                        const std::vector<std::vector<int32_t>>& experts) {
  const auto S = static_cast<int64_t>(experts.size());
  check_ep_transport(cfg, S);
  const auto A = static_cast<int64_t>(experts[0].size());
  std::vector<int32_t> identity(static_cast<size_t>(A));  // grouped row = assignment: keep comes back in a order
  std::iota(identity.begin(), identity.end(), 0);
  std::vector<EpLayerPlan> plans;
  for (const auto& e : experts) {
    RS_CHECK(static_cast<int64_t>(e.size()) == A, "every rank holds the same number of assignments");
    plans.emplace_back(cfg, S, e.data(), identity.data(), static_cast<int>(A / cfg.top_k));
  }
  // The count exchange (ragged), then the headers out and the combine's back.
  for (int64_t d = 0; d < S; ++d) {
    std::vector<int32_t> counts(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) counts[s] = plans[s].send.rows_to[d];
    plans[d].set_rows_from(counts.data());
  }
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(S)), in(static_cast<size_t>(S));
  for (int64_t r = 0; r < S; ++r) {
    out[r] = plans[r].send_header;
    in[r].assign(static_cast<size_t>(plans[r].recv_rows()), -1);
  }
  exchange_in_memory(plans, out, in, false);
  for (int64_t r = 0; r < S; ++r) {
    plans[r].plan_receive(in[r].data());
    in[r] = plans[r].recv_header;
    out[r].assign(out[r].size(), 0);
  }
  exchange_in_memory(plans, in, out, true);
  sim::DispatchResult res;
  res.keep.resize(static_cast<size_t>(S));
  res.per_gpu.resize(static_cast<size_t>(S));
  for (int64_t r = 0; r < S; ++r) {
    res.keep[r].assign(static_cast<size_t>(A), 0);
    plans[r].finish(out[r].data(), res.keep[r].data(), res.per_gpu[r]);
    res.counts += res.per_gpu[r];
  }
  return res;
}

ExpertOptions local_expert_options(const ExpertLayer& l, int64_t e0) {
  ExpertOptions o;
  o.act = l.act;
  const auto row = [](auto* bias, int64_t e, int64_t width) { return bias ? bias + e * width : nullptr; };
  o.b1 = row(l.b1, e0, l.F);
  o.b3 = row(l.b3, e0, l.F);
  o.b2 = row(l.b2, e0, l.L);
  o.db1 = row(l.db1, e0, l.F);
  o.db3 = row(l.db3, e0, l.F);
  o.db2 = row(l.db2, e0, l.L);
  return o;
}

}  // namespace rackstep::exec
