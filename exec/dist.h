// Multi-process training: data parallelism with ZeRO-sharded optimizer state,
// and expert parallelism with the real fixed-capacity transports (MPI).
//
// Data parallel. Every rank reads the same global batch and trains on its own
// contiguous slice of sequences (sequence_slice), so the global batch, the data
// position and the results do not depend on the rank count. The loss is
// normalised by the global batch's target count, so per-rank gradients simply
// add. Gradients are reduced with MPI_Ireduce_scatter into each rank's shard,
// by ranges of the arena begun as the backward finishes them (range_parts;
// --grad-bucket-mb), so the exchange overlaps the rest of the backward; the
// owner applies the optimizer to its shard, and MPI_Allgatherv brings every
// rank the updated parameters (ZeRO stage 1/2). Shards are WHOLE TENSORS
// (partition_tensors in exec/arena.h): MuonH orthogonalises a whole matrix
// (Newton–Schulz needs all of it), so a matrix — or a stack of expert matrices
// — has one owner rank, which holds its momentum (and Adam moments) and no
// other rank does. Because arena tensors start on 16-float boundaries, a
// shard's own arena (the layout of just its tensors) is byte-for-byte the
// range [offset(begin), offset(end)) of the full arena: reduce-scatter and
// all-gather move plain float ranges. Checkpoints gather the shards on rank 0
// into the single-process format, so any rank count can load them.
//
// Expert parallel. Ranks form EP groups of `ep` consecutive ranks; rank g of a
// group owns experts [g*E/ep, (g+1)*E/ep). Each MoE layer ships its routed
// rows to the experts' owners and back (MpiExperts, an ExpertBackend of
// exec/model.h) in host memory: pooled = W waves of MPI_Alltoall of fixed
// blocks; ragged = one MPI_Alltoall of row counts, then MPI_Alltoallv. A row
// is a header (the local expert id, -1 = empty; on the way back 1 = computed)
// followed by L floats. Where each row goes and which rows are dropped is
// decided by exec/ep_plan.h (EpLayerPlan), which the NCCL transport of the
// CUDA backend shares: the decisions are made locally by sender and receiver,
// as on a real machine; with verification on, every layer also all-gathers
// its group's assignments, runs sim::dispatch and checks that exactly the same
// assignments were dropped (verify_against_dispatch).
//
// Limits: expert weights stay replicated in every rank's parameter arena (the
// arena is one layout per model); a rank computes, and has gradients for, only
// its own experts, and the reduce-scatter sums the owners' gradients.
//
//   Comm world = Comm::world();                 // MPI_Init when started by mpirun
//   ShardPlan plan = make_shard_plan(layout, world.size());
//   auto [b0, b1] = sequence_slice(global_batch, world.size(), world.rank());
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/arena.h"
#include "exec/ep_plan.h"
#include "exec/model.h"
#include "sim/base/dispatch.h"

namespace rackstep::exec {

// True when this binary was built with MPI (RACKSTEP_HAVE_MPI).
bool mpi_available();
// Rank count announced by an MPI launcher's environment (OMPI_COMM_WORLD_SIZE,
// PMI_SIZE), 1 when none.
int launcher_world_size();
// This process's rank among those on its node (OMPI_COMM_WORLD_LOCAL_RANK,
// SLURM_LOCALID, MPI_LOCALRANKID), 0 when none: which GPU it drives.
int launcher_local_rank();

// A communicator: MPI_COMM_WORLD (or a split of it), or a single process
// without MPI. Every collective is a plain copy on one rank.
class Comm {
 public:
  // The world. Initialises MPI (MPI_THREAD_FUNNELED) when the launcher
  // started more than one rank; UserError when it did and MPI is not
  // compiled in. Finalises MPI when the last world Comm is destroyed.
  static Comm world();
  Comm();  // one process
  Comm(Comm&&) noexcept;
  Comm& operator=(Comm&&) noexcept;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool root() const { return rank_ == 0; }

  // Ranks with the same color form a new communicator, ordered by rank.
  Comm split(int color) const;

  void allreduce_sum(double* x, int n) const;
  void allreduce_sum(int64_t* x, int n) const;
  void allreduce_max(double* x, int n) const;
  // recv (counts[rank]) = the sum over ranks of send's range [displs[rank], +counts[rank]).
  void reduce_scatter_sum(const float* send, float* recv, const std::vector<int>& counts) const;
  // reduce_scatter_sum begun and not waited for (MPI_Ireduce_scatter): recv
  // holds its sum once wait_started() returns, and send and recv stay
  // untouched until then, so the caller's work overlaps the exchange. MPI
  // moves a non-blocking collective on inside MPI calls, so this also tests
  // the ones begun before. Open MPI 4.1 (coll/libnbc) reduces to rank 0 over
  // a binomial tree fixed by the rank count, then scatters: each element gets
  // the same sum whatever range it is sent in.
  void start_reduce_scatter_sum(const float* send, float* recv, const std::vector<int>& counts) const;
  // Waits for every collective begun on this communicator (MPI_Waitall).
  void wait_started() const;
  // recv (sum counts) = every rank's send (counts[r]) at displs (prefix sums).
  void allgatherv(const float* send, float* recv, const std::vector<int>& counts) const;
  // Like allgatherv, to rank 0 only (recv unused elsewhere).
  void gatherv(const float* send, float* recv, const std::vector<int>& counts) const;
  void gatherv(const double* send, double* recv, const std::vector<int>& counts) const;
  void allgather(const int32_t* send, int count, int32_t* recv) const;
  // bytes (n) = root's bytes on every rank (a communicator's bootstrap id).
  void broadcast(void* bytes, int n, int root) const;
  // Fixed blocks of `count` floats to every rank.
  void alltoall(const float* send, float* recv, int count) const;
  void alltoall(const int32_t* send, int32_t* recv, int count) const;
  // Variable blocks: send_counts[r] floats to rank r, recv_counts[r] from it.
  void alltoallv(const float* send, const std::vector<int>& send_counts, float* recv,
                 const std::vector<int>& recv_counts) const;
  void barrier() const;
  [[noreturn]] void abort(int code) const;

 private:
  struct Started;  // the requests of begun collectives, and the counts they read

  int rank_ = 0, size_ = 1;
  void* comm_ = nullptr;     // MPI_Comm* when MPI is in use
  bool owns_world_ = false;  // finalise MPI in the destructor
  mutable std::unique_ptr<Started> started_;
};

// --- data parallel ------------------------------------------------------------------

// Rows [first, second) of a global batch of `batch` sequences for `rank`.
// UserError unless `world` divides the batch.
std::pair<int64_t, int64_t> sequence_slice(int64_t batch, int world, int rank);

// Which rank owns (and updates) which parameter tensors.
struct ParamShard {
  size_t begin = 0, end = 0;          // tensor range [begin, end)
  int64_t offset = 0, floats = 0;     // float range in the params arena
  int64_t v_offset = 0, v_floats = 0; // float range in the Adam second-moment arena
  int64_t w0_offset = 0, w0_count = 0;// entries of OptimizerState::w0_norm
};
struct ShardPlan {
  std::vector<ParamShard> shards;  // (world)
  std::vector<int> floats() const;    // per rank, for the collectives
  std::vector<int> v_floats() const;
  std::vector<int> w0_counts() const;
  // Each rank's float range in the params (and gradient) arena, for collectives
  // in a backend's memory (exec/backend.h, BackendCollectives).
  std::vector<int64_t> float_offsets() const;
  std::vector<int64_t> float_counts() const;
};
ShardPlan make_shard_plan(const ArenaLayout& layout, int world);
// A reduce-scatter of the arena's float range [begin, end) over ranges that
// tile the arena in rank order ((offsets, counts): ShardPlan::float_offsets,
// float_counts): rank r's part is the intersection of the two, counts[r]
// floats from offsets[r] (0 for the ranks whose range it misses), which land
// at shard_offsets[r] of r's shard. The parts tile [begin, end) in rank order.
struct RangeParts {
  std::vector<int64_t> offsets, counts, shard_offsets;  // (ranks)
};
RangeParts range_parts(const std::vector<int64_t>& offsets, const std::vector<int64_t>& counts, int64_t begin,
                       int64_t end);
// The floats every rank's part holds when parts (offsets, counts: a
// RangeParts') split evenly over the ranks (all counts equal and nonzero):
// then the parts are one contiguous
// (ranks, n) block from offsets[0], a plain reduce-scatter of n per rank
// (NCCL's ncclReduceScatter); 0 when they do not (a part of another size, an
// empty one), which goes rooted at each part's owner instead.
int64_t even_part_floats(const std::vector<int64_t>& offsets, const std::vector<int64_t>& counts);
// The layout of just one shard's tensors (its own arena and optimizer state).
std::shared_ptr<const ArenaLayout> shard_layout(const ArenaLayout& layout, const ParamShard& shard);

// --- expert parallel ---------------------------------------------------------------------
// The transports' decisions (SendPlan, RecvPlan, EpLayerPlan, transport_decisions)
// are exec/ep_plan.h's, shared with the NCCL transport (exec/cuda/experts.h).

// --verify-dispatch: all-gathers the group's assignments of one layer
// (expert: (A) this rank's, host memory), runs sim::dispatch on them and
// RS_CHECKs that this rank's transport kept exactly what it keeps (sent_kept,
// (A) assignment order) and dropped as many (drops). Every rank of `group` calls it.
void verify_against_dispatch(const Comm& group, const sim::DispatchConfig& config, const int32_t* expert, int A,
                             const std::vector<uint8_t>& sent_kept, const sim::DropCounts& drops);

// --- expert parallel: the MPI backend ------------------------------------------------------

class MpiExperts : public ExpertBackend {
 public:
  // `group`: the EP group (its size is the EP degree). `verify`: check every
  // layer's decisions against sim::dispatch (an all-gather per layer).
  MpiExperts(Comm group, sim::DispatchConfig config, bool verify);
  void forward(const ExpertLayer& l, const float* xs, float* ys, uint8_t* keep, sim::DropCounts& drops) override;
  void backward(const ExpertLayer& l, const float* dys, float* dxs) override;
  int64_t verified_layers() const override { return verified_; }

 private:
  struct LayerState {
    EpLayerPlan plan;
    std::vector<float> xs, a1, a3, h;  // (R, L), (R, F) x3: the computed rows, kept for backward
  };
  void exchange(const EpLayerPlan& plan, const float* send, float* recv, int width, bool back) const;

  Comm group_;
  sim::DispatchConfig cfg_;
  bool verify_ = false;
  int64_t verified_ = 0;
  std::vector<LayerState> layers_;  // by MoE layer
  std::vector<float> send_;         // (send rows, L + 1) dispatch; (send rows, L) gradients
  std::vector<float> recv_;         // (received rows, L + 1) / (received rows, L)
  std::vector<float> scratch_;      // (experts_scratch_floats(R, L, F))
  std::vector<float> ys_local_;     // (R, L) local experts' outputs, R = computed rows
  std::vector<float> dys_local_;    // (R, L)
  std::vector<float> dxs_local_;    // (R, L)
};

}  // namespace rackstep::exec
