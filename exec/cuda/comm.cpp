#include "exec/cuda/comm.h"

#include <utility>

#include "exec/cuda/check.h"
#include "exec/dist.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {

void check_nccl(ncclResult_t status, const char* call, const char* file, int line) {
  if (status != ncclSuccess) fail_call("NCCL", call, ncclGetErrorString(status), file, line);
}

#if defined(RACKSTEP_HAVE_MPI)
NcclComm NcclComm::from_mpi(MPI_Comm mpi, int device) {
  int rank = 0, size = 1;
  MPI_Comm_rank(mpi, &rank);
  MPI_Comm_size(mpi, &size);
  ncclUniqueId id;
  if (rank == 0) RS_NCCL_CHECK(ncclGetUniqueId(&id));
  const int rc = MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi);
  RS_CHECK(rc == MPI_SUCCESS, "MPI_Bcast of the NCCL unique id failed");
  return from_unique_id(id, rank, size, device);
}
#endif

NcclComm NcclComm::from_unique_id(const ncclUniqueId& id, int rank, int size, int device) {
  RS_CUDA_CHECK(cudaSetDevice(device));
  ncclComm_t comm = nullptr;
  RS_NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  return NcclComm(comm, rank, size);
}

NcclComm NcclComm::single(int device) {
  ncclComm_t comm = nullptr;
  RS_NCCL_CHECK(ncclCommInitAll(&comm, 1, &device));
  return NcclComm(comm, 0, 1);
}

NcclComm::NcclComm(NcclComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)), rank_(other.rank_), size_(other.size_) {}

NcclComm::~NcclComm() {
  if (comm_) ncclCommDestroy(comm_);
}

void NcclComm::all_reduce(float* buf, size_t n, cudaStream_t stream) {
  RS_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm_, stream));
}

void NcclComm::reduce_scatter(float* out, const float* in, size_t n, cudaStream_t stream) {
  RS_NCCL_CHECK(ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, comm_, stream));
}

void NcclComm::all_gather(float* out, const float* in, size_t n, cudaStream_t stream) {
  RS_NCCL_CHECK(ncclAllGather(in, out, n, ncclFloat32, comm_, stream));
}

void NcclComm::reduce_scatter_v(float* shard, const float* in, const std::vector<int64_t>& offsets,
                                const std::vector<int64_t>& counts, cudaStream_t stream) {
  RS_CHECK(offsets.size() == size_t(size_) && counts.size() == size_t(size_), "reduce_scatter_v: one range per rank");
  const int64_t even = even_part_floats(offsets, counts);
  if (even > 0) {  // every rank sees the same counts, so every rank takes the same path
    reduce_scatter(shard, in + offsets[0], size_t(even), stream);
    return;
  }
  RS_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {  // recvbuff is read only on the root, the range's owner
    if (counts[r] == 0) continue;     // every rank skips the same ones
    RS_NCCL_CHECK(ncclReduce(in + offsets[r], shard, size_t(counts[r]), ncclFloat32, ncclSum, r, comm_, stream));
  }
  RS_NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::all_gather_v(float* buf, const std::vector<int64_t>& offsets, const std::vector<int64_t>& counts,
                            cudaStream_t stream) {
  RS_CHECK(offsets.size() == size_t(size_) && counts.size() == size_t(size_), "all_gather_v: one range per rank");
  RS_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < size_; ++r) {
    float* range = buf + offsets[r];
    RS_NCCL_CHECK(ncclBroadcast(range, range, size_t(counts[r]), ncclFloat32, r, comm_, stream));
  }
  RS_NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::all_to_all(void* recv, const void* send, size_t bytes_per_peer, cudaStream_t stream) {
  RS_NCCL_CHECK(ncclGroupStart());
  for (int p = 0; p < size_; ++p) {
    RS_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + p * bytes_per_peer, bytes_per_peer, ncclUint8, p, comm_,
                           stream));
    RS_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + p * bytes_per_peer, bytes_per_peer, ncclUint8, p, comm_,
                           stream));
  }
  RS_NCCL_CHECK(ncclGroupEnd());
}

void NcclComm::all_to_all_v(void* recv, const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offset,
                            const void* send, const std::vector<size_t>& send_bytes,
                            const std::vector<size_t>& send_offset, cudaStream_t stream) {
  const auto peers = static_cast<size_t>(size_);
  RS_CHECK(recv_bytes.size() == peers && recv_offset.size() == peers && send_bytes.size() == peers &&
               send_offset.size() == peers,
           "all_to_all_v: one count and offset per peer");
  RS_NCCL_CHECK(ncclGroupStart());
  for (int p = 0; p < size_; ++p) {
    if (send_bytes[p] > 0)
      RS_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + send_offset[p], send_bytes[p], ncclUint8, p, comm_,
                             stream));
    if (recv_bytes[p] > 0)
      RS_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + recv_offset[p], recv_bytes[p], ncclUint8, p, comm_, stream));
  }
  RS_NCCL_CHECK(ncclGroupEnd());
}

namespace {

// Rank `ranks.rank()`'s ZeRO collectives; see make_nccl_collectives.
class NcclCollectives final : public BackendCollectives {
 public:
  NcclCollectives(NcclComm comm, std::vector<int64_t> offsets, std::vector<int64_t> counts, cudaStream_t compute)
      : comm_(std::move(comm)), offsets_(std::move(offsets)), counts_(std::move(counts)), compute_(compute) {
    RS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    RS_CUDA_CHECK(cudaEventCreateWithFlags(&to_comm_, cudaEventDisableTiming));
    RS_CUDA_CHECK(cudaEventCreateWithFlags(&to_compute_, cudaEventDisableTiming));
  }
  ~NcclCollectives() override {
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(to_compute_);
    cudaEventDestroy(to_comm_);
    cudaStreamDestroy(stream_);
  }
  NcclCollectives(const NcclCollectives&) = delete;
  NcclCollectives& operator=(const NcclCollectives&) = delete;

  void start_reduce_scatter(float* shard, const float* grads, int64_t begin, int64_t end) override {
    wait(stream_, compute_, to_comm_);  // the backward has written the range's gradients
    const RangeParts p = range_parts(offsets_, counts_, begin, end);
    timed("reduce_scatter", [&] {
      comm_.reduce_scatter_v(shard + p.shard_offsets[size_t(comm_.rank())], grads, p.offsets, p.counts, stream_);
    });
  }
  void wait_reduce_scatter() override { wait(compute_, stream_, to_compute_); }  // the optimizer reads the shard
  void set_brackets(CollectiveBrackets* brackets) override { brackets_ = brackets; }
  void all_gather(float* params) override {
    wait(stream_, compute_, to_comm_);  // the owner's step has landed
    timed("all_gather", [&] { comm_.all_gather_v(params, offsets_, counts_, stream_); });
    wait(compute_, stream_, to_compute_);  // the next forward reads every range
  }

 private:
  // Queues a collective on stream_ inside the profiler's brackets, where set.
  template <typename Queue>
  void timed(const char* name, Queue&& queue) {
    if (brackets_) brackets_->begin_collective(name, stream_);
    queue();
    if (brackets_) brackets_->end_collective(stream_);
  }
  // `waiter` runs nothing queued after this before `signaller`'s work so far.
  static void wait(cudaStream_t waiter, cudaStream_t signaller, cudaEvent_t event) {
    RS_CUDA_CHECK(cudaEventRecord(event, signaller));
    RS_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
  }

  NcclComm comm_;
  std::vector<int64_t> offsets_, counts_;  // (ranks) float ranges of the arena
  cudaStream_t compute_;                   // the backend's
  cudaStream_t stream_ = nullptr;          // the collectives'
  cudaEvent_t to_comm_ = nullptr, to_compute_ = nullptr;
  CollectiveBrackets* brackets_ = nullptr;  // the profiler's, while it profiles
};

}  // namespace

std::unique_ptr<BackendCollectives> make_nccl_collectives(const Comm& ranks, std::vector<int64_t> offsets,
                                                          std::vector<int64_t> counts, cudaStream_t compute) {
  const auto n = static_cast<size_t>(ranks.size());
  RS_CHECK(offsets.size() == n && counts.size() == n, "make_nccl_collectives: one float range per rank");
  ncclUniqueId id{};
  if (ranks.root()) RS_NCCL_CHECK(ncclGetUniqueId(&id));
  ranks.broadcast(&id, static_cast<int>(sizeof id), 0);
  int device = 0;
  RS_CUDA_CHECK(cudaGetDevice(&device));
  return std::make_unique<NcclCollectives>(NcclComm::from_unique_id(id, ranks.rank(), ranks.size(), device),
                                           std::move(offsets), std::move(counts), compute);
}

}  // namespace rackstep::exec::cuda
