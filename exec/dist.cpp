// Multi-process training: communicator, ZeRO shards, EP transports. See dist.h.
#include "exec/dist.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "exec/kernels.h"
#include "exec/watchdog.h"
#include "sim/base/check.h"
#include "sim/base/value_error.h"

#ifdef RACKSTEP_HAVE_MPI
#include <mpi.h>
#endif

namespace rackstep::exec {

// --- communicator ----------------------------------------------------------------------

bool mpi_available() {
#ifdef RACKSTEP_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {  // OpenMPI, MPICH (Hydra)
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n >= 1) return n;
    }
  }
  return 1;
}

int launcher_local_rank() {
  // OpenMPI, Slurm's srun, MPICH (Hydra)
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n >= 0) return n;
    }
  }
  return 0;
}

#ifdef RACKSTEP_HAVE_MPI

namespace {

// Wraps an MPI call: on failure, print the call and MPI's error string, then abort.
#define RS_MPI(call)                                                                       \
  do {                                                                                     \
    const int rs_mpi_rc = (call);                                                          \
    if (rs_mpi_rc != MPI_SUCCESS) {                                                        \
      char rs_mpi_msg[MPI_MAX_ERROR_STRING];                                               \
      int rs_mpi_len = 0;                                                                  \
      MPI_Error_string(rs_mpi_rc, rs_mpi_msg, &rs_mpi_len);                                \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, rs_mpi_msg); \
      MPI_Abort(MPI_COMM_WORLD, 3);                                                        \
    }                                                                                      \
  } while (0)

// A collective: RS_MPI under the watchdog's eye (exec/watchdog.h).
#define RS_MPI_COLLECTIVE(call)                \
  do {                                         \
    const CollectiveGuard rs_guard(#call);     \
    RS_MPI(call);                              \
  } while (0)

MPI_Comm mpi(void* c) { return *static_cast<MPI_Comm*>(c); }

std::vector<int> displacements(const std::vector<int>& counts) {
  std::vector<int> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

}  // namespace

Comm Comm::world() {
  Comm c;
  if (launcher_world_size() <= 1) return c;
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    RS_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    c.owns_world_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  c.comm_ = new MPI_Comm(MPI_COMM_WORLD);
  RS_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &c.rank_));
  RS_MPI(MPI_Comm_size(MPI_COMM_WORLD, &c.size_));
  return c;
}

Comm::Comm(Comm&& o) noexcept { *this = std::move(o); }

Comm& Comm::operator=(Comm&& o) noexcept {
  std::swap(rank_, o.rank_);
  std::swap(size_, o.size_);
  std::swap(comm_, o.comm_);
  std::swap(owns_world_, o.owns_world_);
  return *this;
}

Comm::~Comm() {
  if (!comm_) return;
  auto* c = static_cast<MPI_Comm*>(comm_);
  if (*c != MPI_COMM_WORLD) MPI_Comm_free(c);
  delete c;
  if (owns_world_) MPI_Finalize();
}

Comm Comm::split(int color) const {
  Comm c;
  if (!comm_) return c;
  auto* nc = new MPI_Comm;
  RS_MPI_COLLECTIVE(MPI_Comm_split(mpi(comm_), color, rank_, nc));
  c.comm_ = nc;
  RS_MPI(MPI_Comm_rank(*nc, &c.rank_));
  RS_MPI(MPI_Comm_size(*nc, &c.size_));
  return c;
}

void Comm::allreduce_sum(double* x, int n) const {
  if (comm_) RS_MPI_COLLECTIVE(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, mpi(comm_)));
}
void Comm::allreduce_sum(int64_t* x, int n) const {
  if (comm_) RS_MPI_COLLECTIVE(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_INT64_T, MPI_SUM, mpi(comm_)));
}
void Comm::allreduce_max(double* x, int n) const {
  if (comm_) RS_MPI_COLLECTIVE(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_MAX, mpi(comm_)));
}

void Comm::reduce_scatter_sum(const float* send, float* recv, const std::vector<int>& counts) const {
  if (!comm_) {
    std::copy(send, send + counts[0], recv);
    return;
  }
  RS_MPI_COLLECTIVE(MPI_Reduce_scatter(send, recv, counts.data(), MPI_FLOAT, MPI_SUM, mpi(comm_)));
}

void Comm::allgatherv(const float* send, float* recv, const std::vector<int>& counts) const {
  if (!comm_) {
    std::copy(send, send + counts[0], recv);
    return;
  }
  const std::vector<int> d = displacements(counts);
  RS_MPI_COLLECTIVE(MPI_Allgatherv(send, counts[rank_], MPI_FLOAT, recv, counts.data(), d.data(), MPI_FLOAT, mpi(comm_)));
}

void Comm::gatherv(const float* send, float* recv, const std::vector<int>& counts) const {
  if (!comm_) {
    std::copy(send, send + counts[0], recv);
    return;
  }
  const std::vector<int> d = displacements(counts);
  RS_MPI_COLLECTIVE(MPI_Gatherv(send, counts[rank_], MPI_FLOAT, recv, counts.data(), d.data(), MPI_FLOAT, 0, mpi(comm_)));
}

void Comm::gatherv(const double* send, double* recv, const std::vector<int>& counts) const {
  if (!comm_) {
    std::copy(send, send + counts[0], recv);
    return;
  }
  const std::vector<int> d = displacements(counts);
  RS_MPI_COLLECTIVE(MPI_Gatherv(send, counts[rank_], MPI_DOUBLE, recv, counts.data(), d.data(), MPI_DOUBLE, 0, mpi(comm_)));
}

void Comm::allgather(const int32_t* send, int count, int32_t* recv) const {
  if (!comm_) {
    std::copy(send, send + count, recv);
    return;
  }
  RS_MPI_COLLECTIVE(MPI_Allgather(send, count, MPI_INT32_T, recv, count, MPI_INT32_T, mpi(comm_)));
}

void Comm::broadcast(void* bytes, int n, int root) const {
  if (comm_) RS_MPI_COLLECTIVE(MPI_Bcast(bytes, n, MPI_BYTE, root, mpi(comm_)));
}

void Comm::alltoall(const float* send, float* recv, int count) const {
  if (!comm_) {
    std::copy(send, send + count, recv);
    return;
  }
  RS_MPI_COLLECTIVE(MPI_Alltoall(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, mpi(comm_)));
}

void Comm::alltoall(const int32_t* send, int32_t* recv, int count) const {
  if (!comm_) {
    std::copy(send, send + count, recv);
    return;
  }
  RS_MPI_COLLECTIVE(MPI_Alltoall(send, count, MPI_INT32_T, recv, count, MPI_INT32_T, mpi(comm_)));
}

void Comm::alltoallv(const float* send, const std::vector<int>& send_counts, float* recv,
                     const std::vector<int>& recv_counts) const {
  if (!comm_) {
    std::copy(send, send + send_counts[0], recv);
    return;
  }
  const std::vector<int> sd = displacements(send_counts), rd = displacements(recv_counts);
  RS_MPI_COLLECTIVE(MPI_Alltoallv(send, send_counts.data(), sd.data(), MPI_FLOAT, recv, recv_counts.data(), rd.data(), MPI_FLOAT,
                       mpi(comm_)));
}

void Comm::barrier() const {
  if (comm_) RS_MPI_COLLECTIVE(MPI_Barrier(mpi(comm_)));
}

void Comm::abort(int code) const {
  if (comm_) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

#else  // no MPI: one process; a launcher asking for more is a user error

Comm Comm::world() {
  const int n = launcher_world_size();
  if (n > 1) {
    throw UserError("train: started as " + std::to_string(n) +
                    " processes, but this rackstep was built without MPI (install OpenMPI and rebuild)");
  }
  return Comm();
}
Comm::Comm(Comm&& o) noexcept { *this = std::move(o); }
Comm& Comm::operator=(Comm&& o) noexcept {
  std::swap(rank_, o.rank_);
  std::swap(size_, o.size_);
  return *this;
}
Comm::~Comm() = default;
Comm Comm::split(int) const { return Comm(); }
void Comm::allreduce_sum(double*, int) const {}
void Comm::allreduce_sum(int64_t*, int) const {}
void Comm::allreduce_max(double*, int) const {}
void Comm::reduce_scatter_sum(const float* send, float* recv, const std::vector<int>& counts) const {
  std::copy(send, send + counts[0], recv);
}
void Comm::allgatherv(const float* send, float* recv, const std::vector<int>& counts) const {
  std::copy(send, send + counts[0], recv);
}
void Comm::gatherv(const float* send, float* recv, const std::vector<int>& counts) const {
  std::copy(send, send + counts[0], recv);
}
void Comm::gatherv(const double* send, double* recv, const std::vector<int>& counts) const {
  std::copy(send, send + counts[0], recv);
}
void Comm::allgather(const int32_t* send, int count, int32_t* recv) const { std::copy(send, send + count, recv); }
void Comm::broadcast(void*, int, int) const {}
void Comm::alltoall(const float* send, float* recv, int count) const { std::copy(send, send + count, recv); }
void Comm::alltoall(const int32_t* send, int32_t* recv, int count) const { std::copy(send, send + count, recv); }
void Comm::alltoallv(const float* send, const std::vector<int>& send_counts, float* recv,
                     const std::vector<int>&) const {
  std::copy(send, send + send_counts[0], recv);
}
void Comm::barrier() const {}
void Comm::abort(int code) const { std::exit(code); }

#endif

// --- data parallel ------------------------------------------------------------------

std::pair<int64_t, int64_t> sequence_slice(int64_t batch, int world, int rank) {
  RS_CHECK(world >= 1 && rank >= 0 && rank < world, "rank outside its world");
  if (batch % world != 0) {
    throw ValueError("train", "batch",
                     "sequences to split evenly over " + std::to_string(world) + " processes (a multiple of " +
                         std::to_string(world) + ")",
                     std::to_string(batch));
  }
  const int64_t per = batch / world;
  return {rank * per, (rank + 1) * per};
}

namespace {
std::vector<int> ints(const std::vector<ParamShard>& shards, int64_t ParamShard::*field) {
  std::vector<int> out;
  for (const ParamShard& s : shards) {
    RS_CHECK(s.*field <= INT32_MAX, "shard larger than one MPI message");
    out.push_back(static_cast<int>(s.*field));
  }
  return out;
}
}  // namespace

std::vector<int> ShardPlan::floats() const { return ints(shards, &ParamShard::floats); }
std::vector<int> ShardPlan::v_floats() const { return ints(shards, &ParamShard::v_floats); }
std::vector<int> ShardPlan::w0_counts() const { return ints(shards, &ParamShard::w0_count); }
std::vector<int64_t> ShardPlan::float_offsets() const {
  std::vector<int64_t> v;
  for (const ParamShard& s : shards) v.push_back(s.offset);
  return v;
}
std::vector<int64_t> ShardPlan::float_counts() const {
  std::vector<int64_t> v;
  for (const ParamShard& s : shards) v.push_back(s.floats);
  return v;
}

ShardPlan make_shard_plan(const ArenaLayout& layout, int world) {
  const auto parts = partition_tensors(layout, world);
  const auto v_layout = layout.subset({OptGroup::kAdamH, OptGroup::kAdam});
  auto offset_at = [&](size_t i) { return i < layout.size() ? layout.offset(i) : layout.total_floats(); };
  ShardPlan plan;
  int64_t v_at = 0, w0_at = 0;
  for (const auto& [begin, end] : parts) {
    ParamShard s;
    s.begin = begin;
    s.end = end;
    s.offset = offset_at(begin);
    s.floats = offset_at(end) - s.offset;
    s.v_offset = v_at;
    s.w0_offset = w0_at;
    for (size_t i = begin; i < end; ++i) {
      const TensorSpec& t = layout.spec(i);
      const int64_t n = numel(t.shape);
      if (t.group == OptGroup::kAdam || t.group == OptGroup::kAdamH) {
        s.v_floats += (n + ArenaLayout::kAlignFloats - 1) / ArenaLayout::kAlignFloats * ArenaLayout::kAlignFloats;
      }
      if (is_hyperball_group(t.group)) s.w0_count += t.shape.size() == 3 ? t.shape[0] : 1;
    }
    v_at += s.v_floats;
    w0_at += s.w0_count;
    plan.shards.push_back(s);
  }
  RS_CHECK(v_at == v_layout->total_floats(), "second-moment shards must tile the Adam arena");
  return plan;
}

std::shared_ptr<const ArenaLayout> shard_layout(const ArenaLayout& layout, const ParamShard& shard) {
  std::vector<TensorSpec> specs(layout.specs().begin() + static_cast<std::ptrdiff_t>(shard.begin),
                                layout.specs().begin() + static_cast<std::ptrdiff_t>(shard.end));
  auto l = std::make_shared<const ArenaLayout>(std::move(specs));
  RS_CHECK(l->total_floats() == shard.floats, "a shard's own arena must equal its range of the full arena");
  return l;
}

// --- expert parallel: decisions ---------------------------------------------------------

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

RecvPlan plan_pooled_receive(const int32_t* header, int64_t S, int64_t local, int64_t waves, int64_t pool_rows,
                             int64_t receiver_limit) {
  // Per wave, capacity per local expert goes slot-major, source-minor (sim/base/dispatch.cpp).
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(local));
  std::vector<int64_t> used(static_cast<size_t>(local));
  for (int64_t w = 0; w < waves; ++w) {
    std::fill(used.begin(), used.end(), 0);
    for (int64_t slot = 0; slot < pool_rows; ++slot) {
      for (int64_t s = 0; s < S; ++s) {
        const int64_t row = (w * S + s) * pool_rows + slot;
        const int32_t e = header[row];
        if (e < 0) continue;
        RS_CHECK(e < local, "a received row names an expert this rank does not hold");
        if (used[e]++ < receiver_limit) by_expert[e].push_back(row);  // else: receiver drop
      }
    }
  }
  return group_kept(by_expert, waves * S * pool_rows);
}

RecvPlan plan_ragged_receive(const int32_t* header, const std::vector<int>& rows_from, int64_t local, int chunks,
                             int64_t gate) {
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
  return group_kept(by_expert, at);
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

namespace {
void check_transport(const sim::DispatchConfig& cfg, int64_t S) {
  sim::validate(cfg, S);
  if (cfg.transport == sim::Transport::capacity) {
    throw UserError("train: expert parallelism across processes runs the pooled or ragged transport, found capacity");
  }
}
}  // namespace

sim::DispatchResult transport_decisions(const sim::DispatchConfig& cfg,
                                        const std::vector<std::vector<int32_t>>& experts) {
  const auto S = static_cast<int64_t>(experts.size());
  check_transport(cfg, S);
  const int64_t local = cfg.n_experts / S, A = static_cast<int64_t>(experts[0].size()), W = cfg.waves;
  const TransportLimits lim = transport_limits(cfg, S, A / cfg.top_k);
  const bool pooled = cfg.transport == sim::Transport::pooled;
  const int64_t P = lim.physical.sender_pool;
  std::vector<SendPlan> send;
  for (const auto& e : experts) {
    RS_CHECK(static_cast<int64_t>(e.size()) == A, "every rank holds the same number of assignments");
    send.push_back(pooled ? plan_pooled_send(e.data(), A, S, local, W, P, lim.pool_limit)
                          : plan_ragged_send(e.data(), A, S, local));
  }
  // The all-to-all, in memory: receiver d's header rows.
  std::vector<std::vector<int32_t>> header(static_cast<size_t>(S));
  std::vector<std::vector<int>> rows_from(static_cast<size_t>(S), std::vector<int>(static_cast<size_t>(S)));
  std::vector<std::vector<int64_t>> base(static_cast<size_t>(S), std::vector<int64_t>(static_cast<size_t>(S), 0));
  for (int64_t d = 0; d < S; ++d) {
    int64_t total = 0;
    for (int64_t s = 0; s < S; ++s) {
      rows_from[d][s] = send[s].rows_to[d];
      base[d][s] = total;  // ragged: where source s's rows start at d
      total += rows_from[d][s];
    }
    header[d].assign(static_cast<size_t>(total), -1);
  }
  // row_at[s][a]: the row assignment a of source s lands in at its destination.
  std::vector<std::vector<int64_t>> row_at(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    std::vector<int64_t> first_row(static_cast<size_t>(S), 0);  // ragged: source s's first send row for d
    for (int64_t d = 1; d < S; ++d) first_row[d] = first_row[d - 1] + send[s].rows_to[d - 1];
    row_at[s].assign(static_cast<size_t>(A), -1);
    for (int64_t a = 0; a < A; ++a) {
      const int64_t row = send[s].row_of[a];
      if (row < 0) continue;
      const int64_t d = experts[s][a] / local;
      const int64_t at = pooled ? ((row / (S * P)) * S + s) * P + row % P : base[d][s] + row - first_row[d];
      row_at[s][a] = at;
      header[d][at] = experts[s][a] % static_cast<int32_t>(local);
    }
  }
  std::vector<RecvPlan> recv;
  for (int64_t d = 0; d < S; ++d) {
    recv.push_back(pooled ? plan_pooled_receive(header[d].data(), S, local, W, P, lim.receiver_limit)
                          : plan_ragged_receive(header[d].data(), rows_from[d], local, cfg.ragged_chunks,
                                                lim.receiver_limit));
  }
  sim::DispatchResult r;
  r.keep.resize(static_cast<size_t>(S));
  r.per_gpu.resize(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    r.keep[s].assign(static_cast<size_t>(A), 0);
    r.per_gpu[s].assignments = A;
    for (int64_t a = 0; a < A; ++a) {
      if (row_at[s][a] < 0) {
        r.per_gpu[s].sender++;
        continue;
      }
      const int64_t d = experts[s][a] / local;
      if (recv[d].kept[row_at[s][a]]) {
        r.keep[s][a] = 1;
      } else {
        r.per_gpu[s].receiver++;
      }
    }
    r.counts += r.per_gpu[s];
  }
  return r;
}

// --- expert parallel: MPI backend -------------------------------------------------------

MpiExperts::MpiExperts(Comm group, sim::DispatchConfig config, bool verify)
    : group_(std::move(group)), cfg_(config), verify_(verify) {
  check_transport(cfg_, group_.size());
}

namespace {
int32_t header_of(const float* row) {
  int32_t h;
  std::memcpy(&h, row, sizeof h);
  return h;
}
void set_header(float* row, int32_t h) { std::memcpy(row, &h, sizeof h); }
}  // namespace

// Sends `send` (rows of `width` floats in the send layout) and receives into
// `recv` (receive layout); back = the reverse direction (combine).
void MpiExperts::exchange(const LayerState& st, const float* send, float* recv, int width, bool back) const {
  const int S = group_.size();
  if (cfg_.transport == sim::Transport::pooled) {
    // One fixed-size all-to-all per wave: P rows to every rank.
    const int64_t P = st.send.rows_to[0] / cfg_.waves;
    const int64_t wave_floats = S * P * width;
    for (int w = 0; w < cfg_.waves; ++w) {
      group_.alltoall(send + w * wave_floats, recv + w * wave_floats, static_cast<int>(P * width));
    }
    return;
  }
  std::vector<int> sc(static_cast<size_t>(S)), rc(static_cast<size_t>(S));
  for (int r = 0; r < S; ++r) {
    sc[r] = (back ? st.rows_from[r] : st.send.rows_to[r]) * width;
    rc[r] = (back ? st.send.rows_to[r] : st.rows_from[r]) * width;
  }
  group_.alltoallv(send, sc, recv, rc);
}

namespace {

// The layer's expert variant for this rank's experts e0, e0 + 1, ...: their rows of the biases.
ExpertOptions local_options(const ExpertLayer& l, int64_t e0) {
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

}  // namespace

void MpiExperts::forward(const ExpertLayer& l, const float* xs, float* ys, uint8_t* keep, sim::DropCounts& drops) {
  const int64_t S = group_.size(), local = l.E / S, e0 = group_.rank() * local;
  const int64_t A = static_cast<int64_t>(l.tokens) * l.k, L = l.L, F = l.F, width = L + 1;
  RS_CHECK(l.E == cfg_.n_experts && l.k == cfg_.top_k, "the dispatch config names another MoE shape");
  if (layers_.size() <= static_cast<size_t>(l.moe)) layers_.resize(static_cast<size_t>(l.moe) + 1);
  LayerState& st = layers_[static_cast<size_t>(l.moe)];
  const TransportLimits lim = transport_limits(cfg_, S, l.tokens);
  const bool pooled = cfg_.transport == sim::Transport::pooled;
  st.send = pooled ? plan_pooled_send(l.expert, A, S, local, cfg_.waves, lim.physical.sender_pool, lim.pool_limit)
                   : plan_ragged_send(l.expert, A, S, local);

  // Dispatch: header (local expert id) + the row, at the sender's slot.
  send_.assign(static_cast<size_t>(st.send.rows * width), 0.0f);
  for (int64_t r = 0; r < st.send.rows; ++r) set_header(send_.data() + r * width, -1);
  for (int64_t a = 0; a < A; ++a) {
    const int64_t row = st.send.row_of[a];
    if (row < 0) continue;
    float* dst = send_.data() + row * width;
    set_header(dst, static_cast<int32_t>(l.expert[a] % local));
    std::memcpy(dst + 1, xs + static_cast<int64_t>(l.sorted_pos[a]) * L, sizeof(float) * L);
  }
  st.rows_from.assign(static_cast<size_t>(S), st.send.rows_to[0]);
  if (!pooled) group_.alltoall(st.send.rows_to.data(), st.rows_from.data(), 1);
  const int64_t recv_rows = std::accumulate(st.rows_from.begin(), st.rows_from.end(), int64_t{0});
  recv_.assign(static_cast<size_t>(recv_rows * width), 0.0f);
  exchange(st, send_.data(), recv_.data(), static_cast<int>(width), false);

  // Receiver: decide, then run the local experts on the kept rows.
  std::vector<int32_t> header(static_cast<size_t>(recv_rows));
  for (int64_t r = 0; r < recv_rows; ++r) header[r] = header_of(recv_.data() + r * width);
  st.recv = pooled ? plan_pooled_receive(header.data(), S, local, cfg_.waves, lim.physical.sender_pool,
                                         lim.receiver_limit)
                   : plan_ragged_receive(header.data(), st.rows_from, local, cfg_.ragged_chunks, lim.receiver_limit);
  const int64_t R = static_cast<int64_t>(st.recv.kept_rows.size());
  st.xs.resize(static_cast<size_t>(R * L));
  for (int64_t j = 0; j < R; ++j) {
    std::memcpy(st.xs.data() + j * L, recv_.data() + st.recv.kept_rows[j] * width + 1, sizeof(float) * L);
  }
  st.a1.resize(static_cast<size_t>(R * F));
  st.a3.resize(static_cast<size_t>(R * F));
  st.h.resize(static_cast<size_t>(R * F));
  ys_local_.resize(static_cast<size_t>(R * L));
  if (R > 0) {
    experts_forward(ys_local_.data(), st.a1.data(), st.a3.data(), st.h.data(), st.xs.data(), st.recv.offsets.data(),
                    nullptr, l.w1 + e0 * L * F, l.w3 + e0 * L * F, l.w2 + e0 * F * L, static_cast<int>(R),
                    static_cast<int>(local), static_cast<int>(L), static_cast<int>(F), local_options(l, e0));
  }

  // Combine: each received row goes back to its slot, header 1 = computed.
  std::fill(recv_.begin(), recv_.end(), 0.0f);
  for (int64_t r = 0; r < recv_rows; ++r) set_header(recv_.data() + r * width, st.recv.kept[r]);
  for (int64_t j = 0; j < R; ++j) {
    std::memcpy(recv_.data() + st.recv.kept_rows[j] * width + 1, ys_local_.data() + j * L, sizeof(float) * L);
  }
  exchange(st, recv_.data(), send_.data(), static_cast<int>(width), true);

  drops = sim::DropCounts{};
  drops.assignments = A;
  st.sent_kept.assign(static_cast<size_t>(A), 0);
  for (int64_t a = 0; a < A; ++a) {
    const int64_t pos = l.sorted_pos[a], row = st.send.row_of[a];
    float* y = ys + pos * L;
    const bool kept = row >= 0 && header_of(send_.data() + row * width) == 1;
    keep[pos] = kept ? 1 : 0;
    st.sent_kept[a] = keep[pos];
    if (kept) {
      std::memcpy(y, send_.data() + row * width + 1, sizeof(float) * L);
      continue;
    }
    std::fill(y, y + L, 0.0f);
    (row < 0 ? drops.sender : drops.receiver)++;
  }
  if (verify_) verify(l, st, drops);
}

void MpiExperts::backward(const ExpertLayer& l, const float* dys, float* dxs) {
  const int64_t S = group_.size(), local = l.E / S, e0 = group_.rank() * local;
  const int64_t A = static_cast<int64_t>(l.tokens) * l.k, L = l.L, F = l.F;
  const LayerState& st = layers_[static_cast<size_t>(l.moe)];
  // The output gradients of computed rows travel like the dispatch.
  send_.assign(static_cast<size_t>(st.send.rows * L), 0.0f);
  for (int64_t a = 0; a < A; ++a) {
    if (!st.sent_kept[a]) continue;
    std::memcpy(send_.data() + st.send.row_of[a] * L, dys + static_cast<int64_t>(l.sorted_pos[a]) * L,
                sizeof(float) * L);
  }
  const int64_t recv_rows = std::accumulate(st.rows_from.begin(), st.rows_from.end(), int64_t{0});
  recv_.assign(static_cast<size_t>(recv_rows * L), 0.0f);
  exchange(st, send_.data(), recv_.data(), static_cast<int>(L), false);

  const int64_t R = static_cast<int64_t>(st.recv.kept_rows.size());
  dys_local_.resize(static_cast<size_t>(R * L));
  dxs_local_.resize(static_cast<size_t>(R * L));
  for (int64_t j = 0; j < R; ++j) {
    std::memcpy(dys_local_.data() + j * L, recv_.data() + st.recv.kept_rows[j] * L, sizeof(float) * L);
  }
  if (R > 0) {
    scratch_.resize(experts_scratch_floats(static_cast<int>(R), static_cast<int>(L), static_cast<int>(F)));
    experts_backward(dxs_local_.data(), l.dw1 + e0 * L * F, l.dw3 + e0 * L * F, l.dw2 + e0 * F * L,
                     dys_local_.data(), st.xs.data(), st.a1.data(), st.a3.data(), st.h.data(), st.recv.offsets.data(),
                     nullptr, l.w1 + e0 * L * F, l.w3 + e0 * L * F, l.w2 + e0 * F * L, scratch_.data(),
                     static_cast<int>(R), static_cast<int>(local), static_cast<int>(L), static_cast<int>(F),
                     local_options(l, e0));
  }
  // Input gradients go back like the combine.
  std::fill(recv_.begin(), recv_.end(), 0.0f);
  for (int64_t j = 0; j < R; ++j) {
    std::memcpy(recv_.data() + st.recv.kept_rows[j] * L, dxs_local_.data() + j * L, sizeof(float) * L);
  }
  exchange(st, recv_.data(), send_.data(), static_cast<int>(L), true);
  for (int64_t a = 0; a < A; ++a) {
    float* dx = dxs + static_cast<int64_t>(l.sorted_pos[a]) * L;
    if (!st.sent_kept[a]) {
      std::fill(dx, dx + L, 0.0f);
      continue;
    }
    std::memcpy(dx, send_.data() + st.send.row_of[a] * L, sizeof(float) * L);
  }
}

// The shared dispatch library on the whole group's assignments must drop
// exactly what the transport dropped, assignment by assignment.
void MpiExperts::verify(const ExpertLayer& l, const LayerState& st, const sim::DropCounts& drops) {
  const int S = group_.size(), me = group_.rank();
  const int A = l.tokens * l.k;
  std::vector<int32_t> all(static_cast<size_t>(S) * A);
  group_.allgather(l.expert, A, all.data());
  std::vector<sim::GpuAssignments> gpus(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) gpus[s].experts.assign(all.begin() + s * A, all.begin() + (s + 1) * A);
  const sim::DispatchResult r = sim::dispatch(cfg_, gpus);
  RS_CHECK(r.keep[me] == st.sent_kept, "EP transport dropped other assignments than sim::dispatch");
  const sim::DropCounts& c = r.per_gpu[me];
  RS_CHECK(c.sender == drops.sender && c.receiver == drops.receiver && c.padding == 0,
           "EP transport drop counts differ from sim::dispatch");
  ++verified_;
}

}  // namespace rackstep::exec
