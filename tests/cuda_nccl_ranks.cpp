// Expert parallelism's exchanges on NCCL against the MPI path of exec/dist.h
// (MpiExperts), one process per GPU:
//
//   mpirun -np 2 build/tests/test_cuda_nccl     (CTest: cuda_nccl, label gpu)
//
// Every rank routes its own tokens, builds the dispatch buffer exactly as
// MpiExperts::forward does (the transports' send plans, a header row with the
// local expert id, then the L floats), and exchanges it twice: through the MPI
// communicator (exec::Comm, MpiExperts's own calls) and through NCCL on the GPU
// (cuda::NcclComm: grouped ncclSend/ncclRecv per pooled wave; the ragged count
// exchange, then variable sends). The received buffers must be bitwise equal,
// the receivers' decisions (plan_*_receive) then are too, and the rows the
// group computes must be exactly what sim::dispatch keeps for the same
// assignments (transport_decisions). Pooled and ragged, with drops.
//
// NCCL runs one rank per GPU: with fewer GPUs than ranks (or one rank, or no
// MPI launcher) every rank prints why and exits 77, which CTest reports as
// skipped, never as passed.
#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "exec/cuda/check.h"
#include "exec/cuda/comm.h"
#include "exec/dist.h"
#include "sim/base/dispatch.h"
#include "tests/rank_test.h"

namespace {

using namespace rackstep;
using exec::Comm;

using exec::testing::expect;

void set_header(float* row, int32_t h) { std::memcpy(row, &h, sizeof h); }
int32_t header_of(const float* row) {
  int32_t h;
  std::memcpy(&h, row, sizeof h);
  return h;
}

// (tokens, k) distinct experts per token, skewed towards low ids so that
// capacities bind and both transports drop.
std::vector<int32_t> route(int rank, int tokens, int E, int k) {
  std::mt19937 rng(1000 + rank);
  std::vector<double> w(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) w[static_cast<size_t>(e)] = 1.0 / (1.0 + 0.25 * e);
  std::vector<int32_t> expert;
  for (int t = 0; t < tokens; ++t) {
    std::vector<double> left = w;
    for (int j = 0; j < k; ++j) {
      std::discrete_distribution<int> pick(left.begin(), left.end());
      const int e = pick(rng);
      left[static_cast<size_t>(e)] = 0.0;
      expert.push_back(e);
    }
  }
  return expert;
}

// One exchange of a (rows, width) float buffer on the GPU: per pooled wave a
// uniform all-to-all of P rows per peer, or the ragged variable sends.
std::vector<float> nccl_exchange(exec::cuda::NcclComm& nccl, const std::vector<float>& send, size_t recv_floats,
                                 bool pooled, int waves, int64_t P, int width, const std::vector<int>& rows_to,
                                 const std::vector<int>& rows_from, cudaStream_t stream) {
  float* d_send = nullptr;
  float* d_recv = nullptr;
  RS_CUDA_CHECK(cudaMalloc(&d_send, sizeof(float) * std::max<size_t>(1, send.size())));
  RS_CUDA_CHECK(cudaMalloc(&d_recv, sizeof(float) * std::max<size_t>(1, recv_floats)));
  RS_CUDA_CHECK(cudaMemcpy(d_send, send.data(), sizeof(float) * send.size(), cudaMemcpyHostToDevice));
  RS_CUDA_CHECK(cudaMemset(d_recv, 0xff, sizeof(float) * std::max<size_t>(1, recv_floats)));  // poison
  const int S = nccl.size();
  if (pooled) {
    const size_t wave_floats = size_t(S) * size_t(P) * size_t(width);
    for (int w = 0; w < waves; ++w)
      nccl.all_to_all(d_recv + w * wave_floats, d_send + w * wave_floats, sizeof(float) * size_t(P) * size_t(width),
                      stream);
  } else {
    const auto peers = static_cast<size_t>(S);
    std::vector<size_t> sb(peers), so(peers), rb(peers), ro(peers);
    size_t s_at = 0, r_at = 0;
    for (int p = 0; p < S; ++p) {
      sb[size_t(p)] = sizeof(float) * size_t(rows_to[size_t(p)]) * size_t(width);
      rb[size_t(p)] = sizeof(float) * size_t(rows_from[size_t(p)]) * size_t(width);
      so[size_t(p)] = s_at;
      ro[size_t(p)] = r_at;
      s_at += sb[size_t(p)];
      r_at += rb[size_t(p)];
    }
    nccl.all_to_all_v(d_recv, rb, ro, d_send, sb, so, stream);
  }
  RS_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<float> recv(recv_floats);
  RS_CUDA_CHECK(cudaMemcpy(recv.data(), d_recv, sizeof(float) * recv_floats, cudaMemcpyDeviceToHost));
  cudaFree(d_send);
  cudaFree(d_recv);
  return recv;
}

void check_transport(sim::Transport transport, const Comm& world, exec::cuda::NcclComm& nccl, cudaStream_t stream) {
  const int S = world.size(), rank = world.rank();
  sim::DispatchConfig cfg;
  cfg.n_experts = 8 * S;
  cfg.top_k = 4;
  cfg.transport = transport;
  cfg.sender_cf = 1.0;
  cfg.receiver_cf = 1.0;
  cfg.waves = 3;
  const bool pooled = transport == sim::Transport::pooled;
  const std::string name = pooled ? "pooled" : "ragged";
  const int tokens = 240, k = cfg.top_k, L = 24, width = L + 1;
  const int64_t A = int64_t(tokens) * k, local = cfg.n_experts / S;
  const std::vector<int32_t> expert = route(rank, tokens, static_cast<int>(cfg.n_experts), k);

  // The send buffer as MpiExperts::forward builds it (rows of `xs` stand in for the grouped activations).
  const exec::TransportLimits lim = exec::transport_limits(cfg, S, tokens);
  const exec::SendPlan plan =
      pooled ? exec::plan_pooled_send(expert.data(), A, S, local, cfg.waves, lim.physical.sender_pool, lim.pool_limit)
             : exec::plan_ragged_send(expert.data(), A, S, local);
  std::vector<float> send(static_cast<size_t>(plan.rows * width), 0.0f);
  for (int64_t r = 0; r < plan.rows; ++r) set_header(send.data() + r * width, -1);
  std::mt19937 rng(2000 + rank);
  std::normal_distribution<float> normal;
  for (int64_t a = 0; a < A; ++a) {
    const int64_t row = plan.row_of[static_cast<size_t>(a)];
    if (row < 0) continue;
    set_header(send.data() + row * width, static_cast<int32_t>(expert[static_cast<size_t>(a)] % local));
    for (int c = 0; c < L; ++c) send[static_cast<size_t>(row * width + 1 + c)] = normal(rng);
  }

  // Row counts: fixed for pooled; the ragged count exchange, over MPI and over NCCL.
  std::vector<int> rows_from(static_cast<size_t>(S), plan.rows_to[0]);
  if (!pooled) {
    world.alltoall(plan.rows_to.data(), rows_from.data(), 1);
    int32_t* d_counts = nullptr;
    RS_CUDA_CHECK(cudaMalloc(&d_counts, 2 * sizeof(int32_t) * size_t(S)));
    RS_CUDA_CHECK(cudaMemcpy(d_counts, plan.rows_to.data(), sizeof(int32_t) * size_t(S), cudaMemcpyHostToDevice));
    nccl.all_to_all(d_counts + S, d_counts, sizeof(int32_t), stream);
    RS_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<int> nccl_from(static_cast<size_t>(S));
    RS_CUDA_CHECK(cudaMemcpy(nccl_from.data(), d_counts + S, sizeof(int32_t) * size_t(S), cudaMemcpyDeviceToHost));
    cudaFree(d_counts);
    expect(nccl_from == rows_from, name + ": the NCCL count exchange differs from MPI's", rank);
  }
  const int64_t recv_rows = std::accumulate(rows_from.begin(), rows_from.end(), int64_t{0});
  const size_t recv_floats = static_cast<size_t>(recv_rows * width);

  // MPI, as MpiExperts::exchange.
  std::vector<float> recv_mpi(recv_floats, 0.0f);
  if (pooled) {
    const int64_t P = plan.rows_to[0] / cfg.waves;
    const int64_t wave_floats = S * P * width;
    for (int w = 0; w < cfg.waves; ++w)
      world.alltoall(send.data() + w * wave_floats, recv_mpi.data() + w * wave_floats, static_cast<int>(P * width));
  } else {
    std::vector<int> sc(static_cast<size_t>(S)), rc(static_cast<size_t>(S));
    for (int r = 0; r < S; ++r) {
      sc[static_cast<size_t>(r)] = plan.rows_to[static_cast<size_t>(r)] * width;
      rc[static_cast<size_t>(r)] = rows_from[static_cast<size_t>(r)] * width;
    }
    world.alltoallv(send.data(), sc, recv_mpi.data(), rc);
  }
  const std::vector<float> recv_nccl = nccl_exchange(nccl, send, recv_floats, pooled, cfg.waves,
                                                     plan.rows_to[0] / cfg.waves, width, plan.rows_to, rows_from,
                                                     stream);
  expect(std::memcmp(recv_mpi.data(), recv_nccl.data(), sizeof(float) * recv_floats) == 0,
         name + ": NCCL delivered other bytes than MPI", rank);

  // The receivers' decisions on what NCCL delivered, against sim::dispatch for the whole group.
  std::vector<int32_t> header(static_cast<size_t>(recv_rows));
  for (int64_t r = 0; r < recv_rows; ++r) header[static_cast<size_t>(r)] = header_of(recv_nccl.data() + r * width);
  const exec::RecvPlan recv =
      pooled ? exec::plan_pooled_receive(header.data(), S, local, cfg.waves, lim.physical.sender_pool,
                                         lim.receiver_limit)
             : exec::plan_ragged_receive(header.data(), rows_from, local, cfg.ragged_chunks, lim.receiver_limit);
  int64_t kept = static_cast<int64_t>(recv.kept_rows.size());
  world.allreduce_sum(&kept, 1);
  std::vector<int32_t> all(static_cast<size_t>(A) * size_t(S));
  world.allgather(expert.data(), static_cast<int>(A), all.data());
  std::vector<std::vector<int32_t>> per_rank;
  for (int r = 0; r < S; ++r) per_rank.emplace_back(all.begin() + r * A, all.begin() + (r + 1) * A);
  const sim::DispatchResult want = exec::transport_decisions(cfg, per_rank);
  expect(kept == want.counts.kept(), name + ": rows computed " + std::to_string(kept) + ", sim::dispatch keeps " +
                                         std::to_string(want.counts.kept()), rank);
  expect(want.counts.dropped() > 0, name + ": the case drops nothing (capacities do not bind)", rank);
  if (rank == 0) {
    std::printf("cuda_nccl %s: %d ranks, %lld assignments, %lld kept (sim::dispatch: %lld), received bytes equal\n",
                name.c_str(), S, static_cast<long long>(A * S), static_cast<long long>(kept),
                static_cast<long long>(want.counts.kept()));
  }
}

}  // namespace

int main() {
  const int ranks = exec::launcher_world_size();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (ranks < 2 || devices < ranks) {
    std::printf("test_cuda_nccl: skipped: needs >= 2 ranks under mpirun and a GPU per rank (ranks %d, GPUs %d)\n",
                ranks, devices);
    return 77;
  }
  Comm world = Comm::world();
  auto nccl = exec::cuda::NcclComm::from_mpi(MPI_COMM_WORLD, world.rank() % devices);
  cudaStream_t stream = nullptr;
  RS_CUDA_CHECK(cudaStreamCreate(&stream));
  check_transport(sim::Transport::pooled, world, nccl, stream);
  check_transport(sim::Transport::ragged, world, nccl, stream);
  RS_CUDA_CHECK(cudaStreamDestroy(stream));
  const bool passed = exec::testing::all_passed(world);
  if (world.root()) std::printf("test_cuda_nccl: %s\n", passed ? "passed" : "FAILED");
  return passed ? 0 : 1;
}
