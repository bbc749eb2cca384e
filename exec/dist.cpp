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

// MPI reads a non-blocking collective's count array until it completes: each
// request keeps its own (a vector's buffer stays put when the vector moves).
struct Comm::Started {
  std::vector<MPI_Request> requests;
  std::vector<std::vector<int>> counts;
};

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
  std::swap(started_, o.started_);
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

void Comm::start_reduce_scatter_sum(const float* send, float* recv, const std::vector<int>& counts) const {
  if (!comm_) {
    std::copy(send, send + counts[0], recv);
    return;
  }
  if (!started_) started_ = std::make_unique<Started>();
  Started& s = *started_;
  s.counts.push_back(counts);
  s.requests.emplace_back();
  RS_MPI_COLLECTIVE(
      MPI_Ireduce_scatter(send, recv, s.counts.back().data(), MPI_FLOAT, MPI_SUM, mpi(comm_), &s.requests.back()));
  int done = 0;
  RS_MPI(MPI_Testall(static_cast<int>(s.requests.size()), s.requests.data(), &done, MPI_STATUSES_IGNORE));
}

void Comm::wait_started() const {
  if (!started_ || started_->requests.empty()) return;
  Started& s = *started_;
  RS_MPI_COLLECTIVE(MPI_Waitall(static_cast<int>(s.requests.size()), s.requests.data(), MPI_STATUSES_IGNORE));
  s.requests.clear();
  s.counts.clear();
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

struct Comm::Started {};

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
  std::swap(started_, o.started_);
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
void Comm::start_reduce_scatter_sum(const float* send, float* recv, const std::vector<int>& counts) const {
  std::copy(send, send + counts[0], recv);
}
void Comm::wait_started() const {}
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

Comm::Comm() = default;  // where Started is complete

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

RangeParts range_parts(const std::vector<int64_t>& offsets, const std::vector<int64_t>& counts, int64_t begin,
                       int64_t end) {
  RS_CHECK(offsets.size() == counts.size() && begin <= end, "range_parts: one range per rank, begin <= end");
  RangeParts p;
  for (size_t r = 0; r < offsets.size(); ++r) {
    const int64_t from = std::max(begin, offsets[r]), to = std::min(end, offsets[r] + counts[r]);
    p.offsets.push_back(std::min(from, end));
    p.counts.push_back(std::max<int64_t>(to - from, 0));
    p.shard_offsets.push_back(std::clamp<int64_t>(from - offsets[r], 0, counts[r]));
  }
  return p;
}

int64_t even_part_floats(const std::vector<int64_t>& offsets, const std::vector<int64_t>& counts) {
  RS_CHECK(!counts.empty() && offsets.size() == counts.size(), "even_part_floats: one part per rank");
  const int64_t n = counts[0];
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] != n || n == 0) return 0;
    RS_CHECK(offsets[r] == offsets[0] + int64_t(r) * n, "even_part_floats: parts tile a range in rank order");
  }
  return n;
}

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

// --- expert parallel: MPI backend -------------------------------------------------------

MpiExperts::MpiExperts(Comm group, sim::DispatchConfig config, bool verify)
    : group_(std::move(group)), cfg_(config), verify_(verify) {
  check_ep_transport(cfg_, group_.size());
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
void MpiExperts::exchange(const EpLayerPlan& plan, const float* send, float* recv, int width, bool back) const {
  const int S = group_.size();
  if (plan.pooled()) {  // one fixed-size all-to-all per wave: P rows to every rank
    for (int w = 0; w < plan.phases(); ++w) {
      const ExchangeBlocks b = plan.blocks(w, back);
      group_.alltoall(send + b.send_at[0] * width, recv + b.recv_at[0] * width, static_cast<int>(b.send_rows[0] * width));
    }
    return;
  }
  const ExchangeBlocks b = plan.blocks(0, back);
  std::vector<int> sc(static_cast<size_t>(S)), rc(static_cast<size_t>(S));
  for (int r = 0; r < S; ++r) {
    sc[r] = static_cast<int>(b.send_rows[r] * width);
    rc[r] = static_cast<int>(b.recv_rows[r] * width);
  }
  group_.alltoallv(send, sc, recv, rc);
}

void MpiExperts::forward(const ExpertLayer& l, const float* xs, float* ys, uint8_t* keep, sim::DropCounts& drops) {
  const int64_t S = group_.size(), local = l.E / S, e0 = group_.rank() * local;
  const int64_t L = l.L, F = l.F, width = L + 1;
  RS_CHECK(l.E == cfg_.n_experts && l.k == cfg_.top_k, "the dispatch config names another MoE shape");
  if (layers_.size() <= static_cast<size_t>(l.moe)) layers_.resize(static_cast<size_t>(l.moe) + 1);
  LayerState& st = layers_[static_cast<size_t>(l.moe)];
  st.plan = EpLayerPlan(cfg_, S, l.expert, l.sorted_pos, l.tokens);
  EpLayerPlan& plan = st.plan;

  // Dispatch: header (local expert id) + the row, at the sender's slot.
  const int64_t send_rows = plan.send.rows;
  send_.assign(static_cast<size_t>(send_rows * width), 0.0f);
  for (int64_t r = 0; r < send_rows; ++r) {
    set_header(send_.data() + r * width, plan.send_header[r]);
    if (plan.send_source[r] < 0) continue;
    std::memcpy(send_.data() + r * width + 1, xs + int64_t(plan.send_source[r]) * L, sizeof(float) * L);
  }
  if (!plan.pooled()) {
    std::vector<int32_t> counts(static_cast<size_t>(S));
    group_.alltoall(plan.send.rows_to.data(), counts.data(), 1);
    plan.set_rows_from(counts.data());
  }
  const int64_t recv_rows = plan.recv_rows();
  recv_.assign(static_cast<size_t>(recv_rows * width), 0.0f);
  exchange(plan, send_.data(), recv_.data(), static_cast<int>(width), false);

  // Receiver: decide, then run the local experts on the kept rows.
  std::vector<int32_t> header(static_cast<size_t>(recv_rows));
  for (int64_t r = 0; r < recv_rows; ++r) header[r] = header_of(recv_.data() + r * width);
  plan.plan_receive(header.data());
  const int64_t R = static_cast<int64_t>(plan.recv.kept_rows.size());
  st.xs.resize(static_cast<size_t>(R * L));
  for (int64_t j = 0; j < R; ++j) {
    std::memcpy(st.xs.data() + j * L, recv_.data() + plan.recv.kept_rows[j] * width + 1, sizeof(float) * L);
  }
  st.a1.resize(static_cast<size_t>(R * F));
  st.a3.resize(static_cast<size_t>(R * F));
  st.h.resize(static_cast<size_t>(R * F));
  ys_local_.resize(static_cast<size_t>(R * L));
  if (R > 0) {
    experts_forward(ys_local_.data(), st.a1.data(), st.a3.data(), st.h.data(), st.xs.data(), plan.recv.offsets.data(),
                    nullptr, l.w1 + e0 * L * F, l.w3 + e0 * L * F, l.w2 + e0 * F * L, static_cast<int>(R),
                    static_cast<int>(local), static_cast<int>(L), static_cast<int>(F), local_expert_options(l, e0));
  }

  // Combine: each received row goes back to its slot, header 1 = computed.
  std::fill(recv_.begin(), recv_.end(), 0.0f);
  for (int64_t r = 0; r < recv_rows; ++r) set_header(recv_.data() + r * width, plan.recv_header[r]);
  for (int64_t j = 0; j < R; ++j) {
    std::memcpy(recv_.data() + plan.recv.kept_rows[j] * width + 1, ys_local_.data() + j * L, sizeof(float) * L);
  }
  exchange(plan, recv_.data(), send_.data(), static_cast<int>(width), true);

  std::vector<int32_t> returned(static_cast<size_t>(send_rows));
  for (int64_t r = 0; r < send_rows; ++r) returned[r] = header_of(send_.data() + r * width);
  plan.finish(returned.data(), keep, drops);
  const int64_t A = plan.assignments();
  for (int64_t a = 0; a < A; ++a) {  // ys by grouped row: the returned output, or 0 for a dropped assignment
    const int64_t pos = l.sorted_pos[a], row = plan.result_row[pos];
    float* y = ys + pos * L;
    if (row < 0) {
      std::fill(y, y + L, 0.0f);
      continue;
    }
    std::memcpy(y, send_.data() + row * width + 1, sizeof(float) * L);
  }
  if (!verify_) return;
  verify_against_dispatch(group_, cfg_, l.expert, static_cast<int>(A), plan.sent_kept, drops);
  ++verified_;
}

void MpiExperts::backward(const ExpertLayer& l, const float* dys, float* dxs) {
  const int64_t S = group_.size(), local = l.E / S, e0 = group_.rank() * local;
  const int64_t L = l.L, F = l.F;
  const LayerState& st = layers_[static_cast<size_t>(l.moe)];
  const EpLayerPlan& plan = st.plan;
  // The output gradients of computed rows travel like the dispatch.
  send_.assign(static_cast<size_t>(plan.send.rows * L), 0.0f);
  for (int64_t r = 0; r < plan.send.rows; ++r) {
    if (plan.grad_source[r] < 0) continue;
    std::memcpy(send_.data() + r * L, dys + int64_t(plan.grad_source[r]) * L, sizeof(float) * L);
  }
  const int64_t recv_rows = plan.recv_rows();
  recv_.assign(static_cast<size_t>(recv_rows * L), 0.0f);
  exchange(plan, send_.data(), recv_.data(), static_cast<int>(L), false);

  const int64_t R = static_cast<int64_t>(plan.recv.kept_rows.size());
  dys_local_.resize(static_cast<size_t>(R * L));
  dxs_local_.resize(static_cast<size_t>(R * L));
  for (int64_t j = 0; j < R; ++j) {
    std::memcpy(dys_local_.data() + j * L, recv_.data() + plan.recv.kept_rows[j] * L, sizeof(float) * L);
  }
  if (R > 0) {
    scratch_.resize(experts_scratch_floats(static_cast<int>(R), static_cast<int>(L), static_cast<int>(F)));
    experts_backward(dxs_local_.data(), l.dw1 + e0 * L * F, l.dw3 + e0 * L * F, l.dw2 + e0 * F * L,
                     dys_local_.data(), st.xs.data(), st.a1.data(), st.a3.data(), st.h.data(),
                     plan.recv.offsets.data(), nullptr, l.w1 + e0 * L * F, l.w3 + e0 * L * F, l.w2 + e0 * F * L,
                     scratch_.data(), static_cast<int>(R), static_cast<int>(local), static_cast<int>(L),
                     static_cast<int>(F), local_expert_options(l, e0));
  }
  // Input gradients go back like the combine.
  std::fill(recv_.begin(), recv_.end(), 0.0f);
  for (int64_t j = 0; j < R; ++j) {
    std::memcpy(recv_.data() + plan.recv.kept_rows[j] * L, dxs_local_.data() + j * L, sizeof(float) * L);
  }
  exchange(plan, recv_.data(), send_.data(), static_cast<int>(L), true);
  for (int64_t pos = 0; pos < plan.assignments(); ++pos) {
    float* dx = dxs + pos * L;
    const int64_t row = plan.result_row[pos];
    if (row < 0) {
      std::fill(dx, dx + L, 0.0f);
      continue;
    }
    std::memcpy(dx, send_.data() + row * L, sizeof(float) * L);
  }
}

// The shared dispatch library on the whole group's assignments must drop
// exactly what the transport dropped, assignment by assignment.
void verify_against_dispatch(const Comm& group, const sim::DispatchConfig& config, const int32_t* expert, int A,
                             const std::vector<uint8_t>& sent_kept, const sim::DropCounts& drops) {
  const int S = group.size(), me = group.rank();
  std::vector<int32_t> all(static_cast<size_t>(S) * A);
  group.allgather(expert, A, all.data());
  std::vector<sim::GpuAssignments> gpus(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) gpus[s].experts.assign(all.begin() + s * A, all.begin() + (s + 1) * A);
  const sim::DispatchResult r = sim::dispatch(config, gpus);
  RS_CHECK(r.keep[me] == sent_kept, "EP transport dropped other assignments than sim::dispatch");
  const sim::DropCounts& c = r.per_gpu[me];
  RS_CHECK(c.sender == drops.sender && c.receiver == drops.receiver && c.padding == 0,
           "EP transport drop counts differ from sim::dispatch");
}

}  // namespace rackstep::exec
