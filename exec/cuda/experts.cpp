// Expert parallelism on the GPU with NCCL (exec/cuda/experts.h): the MPI
// transport's steps (exec/dist.cpp, MpiExperts) with the rows in device memory.
// Every decision is an EpLayerPlan's (exec/ep_plan.h), made on the host; the
// device only gathers rows by the plan's indices (gather_rows) and NCCL moves
// them. Row buffers are (rows, L) floats with a separate int32 header plane
// (rows), exchanged in the same NCCL group as their rows.
#include "exec/cuda/experts.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/cuda/check.h"
#include "exec/cuda/memory.h"
#include "exec/cuda/comm.h"
#include "exec/cuda/experts_rows.h"
#include "exec/cuda/moe.h"
#include "exec/ep_plan.h"
#include "exec/kernels.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {
namespace {

// Device memory of n elements of T that grows on demand; the old allocation is
// freed in `stream` order, after the work already queued on it.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  ~DeviceArray() { device_free(data_); }  // cudaFree waits for the device's work
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get(size_t n, cudaStream_t stream) {
    if (n <= n_ && data_) return data_;
    device_free_async(data_, stream);
    device_malloc_async(&data_, sizeof(T) * std::max<size_t>(n, 1), stream);
    n_ = n;
    return data_;
  }
  T* data() const { return data_; }

 private:
  T* data_ = nullptr;
  size_t n_ = 0;
};

class NcclExperts final : public ExpertBackend {
 public:
  NcclExperts(Comm group, const sim::DispatchConfig& config, bool verify, Gemm& gemm, NcclComm nccl)
      : group_(std::move(group)),
        cfg_(config),
        verify_(verify),
        gemm_(gemm),
        compute_(gemm.stream()),
        nccl_(std::move(nccl)) {
    RS_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
    RS_CUDA_CHECK(cudaEventCreateWithFlags(&to_comm_, cudaEventDisableTiming));
    RS_CUDA_CHECK(cudaEventCreateWithFlags(&to_compute_, cudaEventDisableTiming));
  }
  ~NcclExperts() override {
    cudaStreamSynchronize(comm_);
    cudaStreamSynchronize(compute_);
    cudaEventDestroy(to_compute_);
    cudaEventDestroy(to_comm_);
    cudaStreamDestroy(comm_);
  }
  NcclExperts(const NcclExperts&) = delete;
  NcclExperts& operator=(const NcclExperts&) = delete;

  void forward(const ExpertLayer& l, const float* xs, float* ys, uint8_t* keep, sim::DropCounts& drops) override;
  void backward(const ExpertLayer& l, const float* dys, float* dxs) override;
  bool uses_host_memory() const override { return false; }
  int64_t verified_layers() const override { return verified_; }

 private:
  struct LayerState {
    EpLayerPlan plan;
    std::vector<int32_t> kept_rows;           // (R) plan.recv.kept_rows as gather indices
    DeviceArray<float> xs, a1, a3, h;         // (R, L), (R, F) x3: the computed rows, kept for backward
  };

  // `waiter` runs nothing queued after this before `signaller`'s work so far.
  static void wait(cudaStream_t waiter, cudaStream_t signaller, cudaEvent_t event) {
    RS_CUDA_CHECK(cudaEventRecord(event, signaller));
    RS_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
  }
  void to_comm() { wait(comm_, compute_, to_comm_); }        // an exchange reads what compute wrote
  void to_compute() { wait(compute_, comm_, to_compute_); }  // compute reads what an exchange delivered
  // host (n) -> a device array, on the compute stream (pageable: the host copy may change after the call).
  template <typename T>
  const T* upload(DeviceArray<T>& dev, const std::vector<T>& host) {
    T* d = dev.get(host.size(), compute_);
    if (!host.empty()) {
      RS_CUDA_CHECK(cudaMemcpyAsync(d, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice, compute_));
    }
    return d;
  }
  // device (n) on the comm stream -> host, after the exchange that wrote it.
  void download(std::vector<int32_t>& host, const int32_t* dev, int64_t n) {
    host.resize(static_cast<size_t>(n));
    if (n > 0) {
      RS_CUDA_CHECK(cudaMemcpyAsync(host.data(), dev, sizeof(int32_t) * size_t(n), cudaMemcpyDeviceToHost, comm_));
    }
    RS_CUDA_CHECK(cudaStreamSynchronize(comm_));
  }
  void exchange(const EpLayerPlan& plan, const float* send, float* recv, int L, const int32_t* send_header,
                int32_t* recv_header, bool back);
  void exchange_counts(EpLayerPlan& plan);

  Comm group_;
  sim::DispatchConfig cfg_;
  bool verify_ = false;
  int64_t verified_ = 0;
  Gemm& gemm_;            // the backend's: its stream is compute_
  cudaStream_t compute_;  // the backend's
  NcclComm nccl_;
  cudaStream_t comm_ = nullptr;  // the exchanges'
  cudaEvent_t to_comm_ = nullptr, to_compute_ = nullptr;
  std::vector<std::unique_ptr<LayerState>> layers_;  // by MoE layer
  DeviceArray<float> send_, recv_;                   // (send rows, L), (received rows, L)
  DeviceArray<int32_t> send_header_, recv_header_;   // (send rows), (received rows)
  DeviceArray<int32_t> counts_;                      // (2 S) ragged: rows to each peer, then from each
  DeviceArray<int32_t> index_;                       // (rows) one gather's index
  DeviceArray<float> ys_local_, dys_local_, dxs_local_;  // (R, L) the local experts' rows
  DeviceArray<float> scratch_;                       // (experts_scratch_floats(R, L, F))
  std::vector<int32_t> header_host_;                 // a header plane on the host
};

// One exchange of (rows, L) floats [and their int32 headers], send layout ->
// receive layout (back: the reverse). Pooled: per wave one NCCL group of a
// uniform all-to-all of P rows per peer; ragged: one group of variable
// sends. A header plane travels in the same group as its rows.
void NcclExperts::exchange(const EpLayerPlan& plan, const float* send, float* recv, int L,
                           const int32_t* send_header, int32_t* recv_header, bool back) {
  const auto peers = static_cast<size_t>(group_.size());
  // The buffers were sized from the same plan (send.rows, recv_rows(); swapped going back): a block
  // past either is a plan/buffer mismatch NCCL would turn into a silent out-of-bounds write.
  const int64_t send_cap = back ? plan.recv_rows() : plan.send.rows;
  const int64_t recv_cap = back ? plan.send.rows : plan.recv_rows();
  for (int w = 0; w < plan.phases(); ++w) {
    const ExchangeBlocks b = plan.blocks(w, back);
    for (size_t p = 0; p < peers; ++p) {
      RS_CHECK(b.send_at[p] >= 0 && b.send_rows[p] >= 0 && b.send_at[p] + b.send_rows[p] <= send_cap,
               "EP exchange: a send block past the send buffer");
      RS_CHECK(b.recv_at[p] >= 0 && b.recv_rows[p] >= 0 && b.recv_at[p] + b.recv_rows[p] <= recv_cap,
               "EP exchange: a receive block past the receive buffer");
      // Pooled: NcclComm::all_to_all sends P contiguous rows per peer from the wave's first block on.
      RS_CHECK(!plan.pooled() || (b.send_rows[p] == b.send_rows[0] && b.recv_rows[p] == b.send_rows[0] &&
                                  b.send_at[p] == b.send_at[0] + int64_t(p) * b.send_rows[0] &&
                                  b.recv_at[p] == b.recv_at[0] + int64_t(p) * b.send_rows[0]),
               "EP exchange: a pooled wave's blocks are not P contiguous rows per peer");
    }
    RS_NCCL_CHECK(ncclGroupStart());
    if (plan.pooled()) {  // the same P rows to and from every peer, from row (w * S) * P on
      const size_t P = static_cast<size_t>(b.send_rows[0]);
      nccl_.all_to_all(recv + b.recv_at[0] * L, send + b.send_at[0] * L, sizeof(float) * P * size_t(L), comm_);
      if (send_header) {
        nccl_.all_to_all(recv_header + b.recv_at[0], send_header + b.send_at[0], sizeof(int32_t) * P, comm_);
      }
    } else {
      std::vector<size_t> sb(peers), so(peers), rb(peers), ro(peers);
      const auto bytes = [&](size_t elem, int width) {
        for (size_t p = 0; p < peers; ++p) {
          sb[p] = elem * size_t(b.send_rows[p]) * size_t(width);
          so[p] = elem * size_t(b.send_at[p]) * size_t(width);
          rb[p] = elem * size_t(b.recv_rows[p]) * size_t(width);
          ro[p] = elem * size_t(b.recv_at[p]) * size_t(width);
        }
      };
      bytes(sizeof(float), L);
      nccl_.all_to_all_v(recv, rb, ro, send, sb, so, comm_);
      if (send_header) {
        bytes(sizeof(int32_t), 1);
        nccl_.all_to_all_v(recv_header, rb, ro, send_header, sb, so, comm_);
      }
    }
    RS_NCCL_CHECK(ncclGroupEnd());
  }
}

// Ragged: every peer learns how many rows this rank sends it (one int32 per peer).
void NcclExperts::exchange_counts(EpLayerPlan& plan) {
  const int64_t S = group_.size();
  int32_t* counts = counts_.get(size_t(2 * S), compute_);  // (S) to each peer, (S) from each
  RS_CUDA_CHECK(cudaMemcpyAsync(counts, plan.send.rows_to.data(), sizeof(int32_t) * size_t(S), cudaMemcpyHostToDevice,
                                compute_));
  to_comm();
  nccl_.all_to_all(counts + S, counts, sizeof(int32_t), comm_);
  download(header_host_, counts + S, S);
  plan.set_rows_from(header_host_.data());
}

void NcclExperts::forward(const ExpertLayer& l, const float* xs, float* ys, uint8_t* keep, sim::DropCounts& drops) {
  const int64_t S = group_.size(), local = l.E / S, e0 = group_.rank() * local;
  const int L = l.L, F = l.F;
  RS_CHECK(l.E == cfg_.n_experts && l.k == cfg_.top_k, "the dispatch config names another MoE shape");
  if (layers_.size() <= static_cast<size_t>(l.moe)) layers_.resize(static_cast<size_t>(l.moe) + 1);
  std::unique_ptr<LayerState>& slot = layers_[static_cast<size_t>(l.moe)];
  if (!slot) slot = std::make_unique<LayerState>();
  LayerState& st = *slot;
  st.plan = EpLayerPlan(cfg_, S, l.expert, l.sorted_pos, l.tokens);
  EpLayerPlan& plan = st.plan;
  const cudaStream_t s = compute_;

  // 1. The send rows (send rows, L) from the grouped rows xs (A, L), and their headers.
  const int64_t send_rows = plan.send.rows;
  float* send = send_.get(size_t(send_rows) * L, s);
  gather_rows(send, xs, upload(index_, plan.send_source), send_rows, L, s);
  const int32_t* send_header = upload(send_header_, plan.send_header);
  // 2. Ragged: the count exchange.
  if (!plan.pooled()) exchange_counts(plan);
  // 3. Rows and headers to the experts' owners; the headers to the host.
  const int64_t recv_rows = plan.recv_rows();
  float* recv = recv_.get(size_t(recv_rows) * L, s);
  int32_t* recv_header = recv_header_.get(size_t(recv_rows), s);
  to_comm();
  exchange(plan, send, recv, L, send_header, recv_header, false);
  download(header_host_, recv_header, recv_rows);
  to_compute();

  // 4. The receiver's decisions; the kept rows in local-expert order through the local experts.
  plan.plan_receive(header_host_.data());
  st.kept_rows.assign(plan.recv.kept_rows.begin(), plan.recv.kept_rows.end());
  const auto R = static_cast<int64_t>(st.kept_rows.size());
  float* xs_local = st.xs.get(size_t(R) * L, s);
  gather_rows(xs_local, recv, upload(index_, st.kept_rows), R, L, s);
  float* a1 = st.a1.get(size_t(R) * F, s);
  float* a3 = st.a3.get(size_t(R) * F, s);
  float* h = st.h.get(size_t(R) * F, s);
  float* ys_local = ys_local_.get(size_t(R) * L, s);
  const size_t LF = size_t(L) * size_t(F);
  if (R > 0) {
    experts_forward(gemm_, ys_local, a1, a3, h, xs_local, plan.recv.offsets.data(), nullptr, l.w1 + e0 * LF,
                    l.w3 + e0 * LF, l.w2 + e0 * LF, static_cast<int>(R), static_cast<int>(local), L, F,
                    local_expert_options(l, e0));
  }

  // 5. The combine: outputs back into the received slots, header 1 = computed; back to the senders.
  gather_rows(recv, ys_local, upload(index_, plan.local_of_row), recv_rows, L, s);
  const int32_t* kept_header = upload(recv_header_, plan.recv_header);
  to_comm();
  exchange(plan, recv, send, L, kept_header, send_header_.data(), true);
  download(header_host_, send_header_.data(), send_rows);
  to_compute();
  plan.finish(header_host_.data(), keep, drops);
  gather_rows(ys, send, upload(index_, plan.result_row), plan.assignments(), L, s);
  if (!verify_) return;
  verify_against_dispatch(group_, cfg_, l.expert, static_cast<int>(plan.assignments()), plan.sent_kept, drops);
  ++verified_;
}

void NcclExperts::backward(const ExpertLayer& l, const float* dys, float* dxs) {
  const int64_t S = group_.size(), local = l.E / S, e0 = group_.rank() * local;
  const int L = l.L, F = l.F;
  RS_CHECK(static_cast<size_t>(l.moe) < layers_.size() && layers_[static_cast<size_t>(l.moe)],
           "an MoE layer's backward comes after its forward");
  LayerState& st = *layers_[static_cast<size_t>(l.moe)];
  const EpLayerPlan& plan = st.plan;
  const cudaStream_t s = compute_;
  // The output gradients of computed rows travel like the dispatch.
  const int64_t send_rows = plan.send.rows, recv_rows = plan.recv_rows();
  float* send = send_.get(size_t(send_rows) * L, s);
  gather_rows(send, dys, upload(index_, plan.grad_source), send_rows, L, s);
  float* recv = recv_.get(size_t(recv_rows) * L, s);
  to_comm();
  exchange(plan, send, recv, L, nullptr, nullptr, false);
  to_compute();

  const auto R = static_cast<int64_t>(st.kept_rows.size());
  float* dys_local = dys_local_.get(size_t(R) * L, s);
  float* dxs_local = dxs_local_.get(size_t(R) * L, s);
  gather_rows(dys_local, recv, upload(index_, st.kept_rows), R, L, s);
  const size_t LF = size_t(L) * size_t(F);
  if (R > 0) {
    float* scratch = scratch_.get(experts_scratch_floats(static_cast<int>(R), L, F), s);
    experts_backward(gemm_, dxs_local, l.dw1 + e0 * LF, l.dw3 + e0 * LF, l.dw2 + e0 * LF, dys_local, st.xs.data(),
                     st.a1.data(), st.a3.data(), st.h.data(), plan.recv.offsets.data(), nullptr, l.w1 + e0 * LF,
                     l.w3 + e0 * LF, l.w2 + e0 * LF, scratch, static_cast<int>(R), static_cast<int>(local), L, F,
                     local_expert_options(l, e0));
  }
  // Input gradients go back like the combine; dropped assignments get 0.
  gather_rows(recv, dxs_local, upload(index_, plan.local_of_row), recv_rows, L, s);
  to_comm();
  exchange(plan, recv, send, L, nullptr, nullptr, true);
  to_compute();
  gather_rows(dxs, send, upload(index_, plan.result_row), plan.assignments(), L, s);
}

}  // namespace

std::unique_ptr<ExpertBackend> make_nccl_experts(Comm group, const sim::DispatchConfig& config, bool verify,
                                                 Gemm& gemm) {
  check_ep_transport(config, group.size());  // before any collective: every rank refuses alike
  ncclUniqueId id{};
  if (group.root()) RS_NCCL_CHECK(ncclGetUniqueId(&id));
  group.broadcast(&id, static_cast<int>(sizeof id), 0);
  int device = 0;
  RS_CUDA_CHECK(cudaGetDevice(&device));
  NcclComm nccl = NcclComm::from_unique_id(id, group.rank(), group.size(), device);
  return std::make_unique<NcclExperts>(std::move(group), config, verify, gemm, std::move(nccl));
}

}  // namespace rackstep::exec::cuda
