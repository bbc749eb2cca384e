// NCCL communicators for the CUDA backend: one process per GPU, launched by
// mpirun or Slurm's srun; the NCCL unique id travels over MPI (rank 0
// broadcasts it), rank and size are the MPI communicator's. The collectives the
// training loop needs, in the CPU engine's terms (exec/dist.h): all-reduce,
// reduce-scatter and all-gather for data parallel with ZeRO shards, and the
// expert-parallel all-to-all as grouped ncclSend/ncclRecv — uniform (one
// pooled wave: the same bytes to every peer) or ragged (per-peer counts, after
// a count exchange). Every call is enqueued on the given stream (communication
// runs on its own streams to overlap compute).
//
//   auto comm = cuda::NcclComm::from_mpi(MPI_COMM_WORLD, local_device);
//   comm.reduce_scatter(grad_shard, grads, shard_floats, comm_stream);
//   comm.all_to_all(recv, send, bytes_per_peer, comm_stream);
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "exec/backend.h"

#if defined(RACKSTEP_HAVE_MPI)
#include <mpi.h>
#endif

namespace rackstep::exec::cuda {

void check_nccl(ncclResult_t status, const char* call, const char* file, int line);

class NcclComm {
 public:
#if defined(RACKSTEP_HAVE_MPI)
  // Every rank of `mpi` calls this with the GPU it drives.
  static NcclComm from_mpi(MPI_Comm mpi, int device);
#endif
  // Rank `rank` of `size` on `device`, every rank with rank 0's `id` (shared
  // by whatever the launcher offers: MPI_Bcast, exec::Comm::broadcast).
  static NcclComm from_unique_id(const ncclUniqueId& id, int rank, int size, int device);
  // A communicator of one rank on `device` (tests; a one-GPU run).
  static NcclComm single(int device);
  ~NcclComm();
  NcclComm(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // buf (n) = Σ_ranks buf.
  void all_reduce(float* buf, size_t n, cudaStream_t stream);
  // out (n) = Σ_ranks in[rank·n, (rank+1)·n); in is (size·n).
  void reduce_scatter(float* out, const float* in, size_t n, cudaStream_t stream);
  // out (size·n) = concatenation over ranks of in (n).
  void all_gather(float* out, const float* in, size_t n, cudaStream_t stream);
  // ZeRO shards of unequal sizes, ranges [offsets[r], +counts[r]) of one arena
  // in rank order (exec/dist.h ShardPlan): grouped ncclReduce / ncclBroadcast
  // rooted at each range's owner, so no range is padded (empty ones are skipped).
  // shard (counts[rank]) = Σ_ranks in[offsets[rank], +counts[rank]).
  // Ranges that split evenly over the ranks (exec/dist.h even_part_floats) go
  // as one ncclReduceScatter instead. The two paths may add the ranks'
  // values in different orders (NCCL picks ring or tree per call), so an
  // element's sum is not bitwise the same on both: a run is reproducible for
  // a given rank count and --grad-bucket-mb, which fix each range's path.
  void reduce_scatter_v(float* shard, const float* in, const std::vector<int64_t>& offsets,
                        const std::vector<int64_t>& counts, cudaStream_t stream);
  // buf[offsets[r], +counts[r]) = rank r's, for every r, in place.
  void all_gather_v(float* buf, const std::vector<int64_t>& offsets, const std::vector<int64_t>& counts,
                    cudaStream_t stream);
  // Uniform all-to-all (one pooled wave): send/recv are (size, bytes_per_peer).
  void all_to_all(void* recv, const void* send, size_t bytes_per_peer, cudaStream_t stream);
  // Ragged all-to-all: peer p gets send_bytes[p] from send + send_offset[p],
  // and recv_bytes[p] arrive at recv + recv_offset[p] (counts exchanged first).
  void all_to_all_v(void* recv, const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offset,
                    const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_offset,
                    cudaStream_t stream);

 private:
  NcclComm(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

// The CUDA backend's data-parallel collectives (exec/backend.h,
// BackendCollectives) over `ranks`: one NCCL communicator on the current
// device (its unique id broadcast over `ranks`; one rank: a one-rank
// communicator, the same code path), reduce_scatter_v / all_gather_v on a
// stream of their own. Each reduce-scatter range waits for an event recorded
// on `compute` when it is begun (after the range's last gradient op), so the
// backward queued after it overlaps it; `compute` waits for the collectives'
// stream at wait_reduce_scatter and after the all-gather.
std::unique_ptr<BackendCollectives> make_nccl_collectives(const Comm& ranks, std::vector<int64_t> offsets,
                                                          std::vector<int64_t> counts, cudaStream_t compute);

}  // namespace rackstep::exec::cuda

#define RS_NCCL_CHECK(call) ::rackstep::exec::cuda::check_nccl((call), #call, __FILE__, __LINE__)
