#include "exec/cuda/comm.h"

#include <utility>

#include "exec/cuda/check.h"
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
  RS_CUDA_CHECK(cudaSetDevice(device));
  ncclComm_t comm = nullptr;
  RS_NCCL_CHECK(ncclCommInitRank(&comm, size, id, rank));
  return NcclComm(comm, rank, size);
}
#endif

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

}  // namespace rackstep::exec::cuda
