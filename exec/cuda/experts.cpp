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
  NcclExperts(Comm group, const sim::DispatchConfig& config, const ExpertTransportOptions& options, Gemm& gemm,
              NcclComm nccl)
      : group_(std::move(group)),
        cfg_(config),
        options_(options),
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
    for (cudaEvent_t e : landed_) cudaEventDestroy(e);
    cudaFreeHost(header_pinned_);
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
  // One exchange phase's computed rows (plan.phase_rows), kept for backward.
  struct PhaseState {
    DeviceArray<float> xs, a1, a3, h;  // (n, L), (n, F) x3
  };
  struct LayerState {
    EpLayerPlan plan;
    std::vector<std::unique_ptr<PhaseState>> phases;  // (plan.phases())
  };

  // `waiter` runs nothing queued after this before `signaller`'s work so far.
  static void wait(cudaStream_t waiter, cudaStream_t signaller, cudaEvent_t event) {
    RS_CUDA_CHECK(cudaEventRecord(event, signaller));
    RS_CUDA_CHECK(cudaStreamWaitEvent(waiter, event, 0));
  }
  void to_comm() { wait(comm_, compute_, to_comm_); }        // an exchange reads what compute wrote
  void to_compute() { wait(compute_, comm_, to_compute_); }  // compute reads what every exchange delivered
  // host (n) -> a device array, on the compute stream (pageable: the host copy may change after the call).
  template <typename T>
  const T* upload(DeviceArray<T>& dev, const T* host, int64_t n) {
    T* d = dev.get(size_t(n), compute_);
    if (n > 0) RS_CUDA_CHECK(cudaMemcpyAsync(d, host, sizeof(T) * size_t(n), cudaMemcpyHostToDevice, compute_));
    return d;
  }
  template <typename T>
  const T* upload(DeviceArray<T>& dev, const std::vector<T>& host) {
    return upload(dev, host.data(), static_cast<int64_t>(host.size()));
  }
  // device (n) on the comm stream -> host, after the exchange that wrote it.
  void download(std::vector<int32_t>& host, const int32_t* dev, int64_t n) {
    host.resize(static_cast<size_t>(n));
    if (n > 0) {
      RS_CUDA_CHECK(cudaMemcpyAsync(host.data(), dev, sizeof(int32_t) * size_t(n), cudaMemcpyDeviceToHost, comm_));
    }
    RS_CUDA_CHECK(cudaStreamSynchronize(comm_));
  }
  void exchange(const EpLayerPlan& plan, int phase, const float* send, float* recv, int L, const int32_t* send_header,
                int32_t* recv_header, bool back);
  void exchange_counts(EpLayerPlan& plan);
  // Phase `phase` of a dispatch on the comm stream (the rows, the headers where given, and those to
  // header_pinned_), then landed_[phase] recorded after it.
  void dispatch(const EpLayerPlan& plan, int phase, const float* send, float* recv, int L, const int32_t* send_header,
                int32_t* recv_header);
  // The compute stream waits for phase `phase`'s dispatch only (not for a later phase's, queued since).
  void to_compute(int phase) { RS_CUDA_CHECK(cudaStreamWaitEvent(compute_, landed_[size_t(phase)], 0)); }
  // Pinned host memory for n headers and an event per phase, before a layer's exchanges are queued.
  void reserve(int64_t header_rows, int phases);

  Comm group_;
  sim::DispatchConfig cfg_;
  ExpertTransportOptions options_;
  int64_t verified_ = 0;
  Gemm& gemm_;            // the backend's: its stream is compute_
  cudaStream_t compute_;  // the backend's
  NcclComm nccl_;
  cudaStream_t comm_ = nullptr;  // the exchanges'
  cudaEvent_t to_comm_ = nullptr, to_compute_ = nullptr;
  std::vector<cudaEvent_t> landed_;  // (phases) recorded on comm_ after each phase's dispatch
  std::vector<std::unique_ptr<LayerState>> layers_;  // by MoE layer
  DeviceArray<float> send_, recv_;                   // (send rows, L), (received rows, L)
  DeviceArray<int32_t> send_header_, recv_header_;   // (send rows), (received rows)
  DeviceArray<int32_t> combine_header_;              // (received rows) the combine's: 1 = computed
  DeviceArray<int32_t> counts_;                      // (2 S) ragged: rows to each peer, then from each
  DeviceArray<int32_t> index_;                       // (rows) one gather's index
  DeviceArray<float> ys_local_, dys_local_, dxs_local_;  // (received rows, L) the local experts' rows, computed order
  DeviceArray<float> scratch_;                       // (experts_scratch_floats(n, L, F)) one phase's
  std::vector<int32_t> header_host_;                 // a header plane on the host
  int32_t* header_pinned_ = nullptr;                 // (header_pinned_rows_) received headers, pinned
  int64_t header_pinned_rows_ = 0;
};

// Phase `phase` of one exchange of (rows, L) floats [and their int32 headers], send layout -> receive
// layout (back: the reverse). Pooled: wave `phase`, one NCCL group of a uniform all-to-all of P rows per
// peer; ragged: the one group of variable sends. A header plane travels in the same group as its rows.
void NcclExperts::exchange(const EpLayerPlan& plan, int phase, const float* send, float* recv, int L,
                           const int32_t* send_header, int32_t* recv_header, bool back) {
  const auto peers = static_cast<size_t>(group_.size());
  // The buffers were sized from the same plan (send.rows, recv_rows(); swapped going back): a block
  // past either is a plan/buffer mismatch NCCL would turn into a silent out-of-bounds write.
  const int64_t send_cap = back ? plan.recv_rows() : plan.send.rows;
  const int64_t recv_cap = back ? plan.send.rows : plan.recv_rows();
  const ExchangeBlocks b = plan.blocks(phase, back);
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

void NcclExperts::dispatch(const EpLayerPlan& plan, int phase, const float* send, float* recv, int L,
                           const int32_t* send_header, int32_t* recv_header) {
  exchange(plan, phase, send, recv, L, send_header, recv_header, false);
  if (recv_header) {  // the receiver's decisions need this phase's headers on the host
    const int64_t r0 = plan.recv_phase_begin(phase), n = plan.recv_phase_begin(phase + 1) - r0;
    if (n > 0) {
      RS_CUDA_CHECK(cudaMemcpyAsync(header_pinned_ + r0, recv_header + r0, sizeof(int32_t) * size_t(n),
                                    cudaMemcpyDeviceToHost, comm_));
    }
  }
  RS_CUDA_CHECK(cudaEventRecord(landed_[size_t(phase)], comm_));
}

void NcclExperts::reserve(int64_t header_rows, int phases) {
  if (header_rows > header_pinned_rows_) {  // no copy into it is in flight: the last layer's were waited for
    RS_CUDA_CHECK(cudaFreeHost(header_pinned_));
    header_pinned_ = nullptr;
    RS_CUDA_CHECK(cudaMallocHost(&header_pinned_, sizeof(int32_t) * size_t(header_rows)));
    header_pinned_rows_ = header_rows;
  }
  while (landed_.size() < size_t(phases)) {
    cudaEvent_t e = nullptr;
    RS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    landed_.push_back(e);
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

// Phase by phase (a pooled wave; the ragged exchange is one phase): the dispatch
// of phase p + 1 is queued on the comm stream before phase p's experts on the
// compute stream, so it travels while they compute (options_.overlap; off: after
// phase p's combine, nothing overlapped). Either way every phase computes the
// same rows with the same calls in the same order, so the results are the same.
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
  const int phases = plan.phases();

  // 1. The send rows (send rows, L) from the grouped rows xs (A, L), and their headers.
  const int64_t send_rows = plan.send.rows;
  float* send = send_.get(size_t(send_rows) * L, s);
  gather_rows(send, xs, upload(index_, plan.send_source), send_rows, L, s);
  int32_t* send_header = send_header_.get(size_t(send_rows), s);
  if (send_rows > 0) {
    RS_CUDA_CHECK(cudaMemcpyAsync(send_header, plan.send_header.data(), sizeof(int32_t) * size_t(send_rows),
                                  cudaMemcpyHostToDevice, s));
  }
  // 2. Ragged: the count exchange.
  if (!plan.pooled()) exchange_counts(plan);
  // The layer's buffers, before the exchanges use them (allocated in compute order, hence to_comm after).
  const int64_t recv_rows = plan.recv_rows();
  float* recv = recv_.get(size_t(recv_rows) * L, s);
  int32_t* recv_header = recv_header_.get(size_t(recv_rows), s);
  int32_t* combine_header = combine_header_.get(size_t(recv_rows), s);
  float* ys_local = ys_local_.get(size_t(recv_rows) * L, s);  // at most every received row computed
  reserve(recv_rows, phases);
  st.phases.resize(size_t(phases));
  const size_t LF = size_t(L) * size_t(F);

  // 3-5, phase by phase: rows and headers to the experts' owners; the receiver's decisions for the
  // phase (host); its kept rows through the local experts; the combine: outputs back into the phase's
  // received slots, header 1 = computed, back to the senders.
  to_comm();
  dispatch(plan, 0, send, recv, L, send_header, recv_header);
  for (int p = 0; p < phases; ++p) {
    if (options_.overlap && p + 1 < phases) dispatch(plan, p + 1, send, recv, L, send_header, recv_header);
    RS_CUDA_CHECK(cudaEventSynchronize(landed_[size_t(p)]));
    plan.plan_receive_phase(p, header_pinned_);
    to_compute(p);
    const PhaseRows& pr = plan.phase_rows[size_t(p)];
    const int64_t n = pr.offsets.back();
    if (!st.phases[size_t(p)]) st.phases[size_t(p)] = std::make_unique<PhaseState>();
    PhaseState& ph = *st.phases[size_t(p)];
    float* xs_local = ph.xs.get(size_t(n) * L, s);
    float* a1 = ph.a1.get(size_t(n) * F, s);
    float* a3 = ph.a3.get(size_t(n) * F, s);
    float* h = ph.h.get(size_t(n) * F, s);
    gather_rows(xs_local, recv, upload(index_, plan.compute_rows.data() + pr.first, n), n, L, s);
    if (n > 0) {
      experts_forward(gemm_, ys_local + pr.first * L, a1, a3, h, xs_local, pr.offsets.data(), nullptr,
                      l.w1 + e0 * LF, l.w3 + e0 * LF, l.w2 + e0 * LF, static_cast<int>(n), static_cast<int>(local), L,
                      F, local_expert_options(l, e0));
    }
    const int64_t r0 = plan.recv_phase_begin(p), rows = plan.recv_phase_begin(p + 1) - r0;
    gather_rows(recv + r0 * L, ys_local, upload(index_, plan.compute_of_row.data() + r0, rows), rows, L, s);
    if (rows > 0) {
      RS_CUDA_CHECK(cudaMemcpyAsync(combine_header + r0, plan.recv_header.data() + r0, sizeof(int32_t) * size_t(rows),
                                    cudaMemcpyHostToDevice, s));
    }
    to_comm();
    exchange(plan, p, recv, send, L, combine_header, send_header, true);
    if (!options_.overlap && p + 1 < phases) dispatch(plan, p + 1, send, recv, L, send_header, recv_header);
  }
  download(header_host_, send_header, send_rows);
  to_compute();
  plan.finish(header_host_.data(), keep, drops);
  gather_rows(ys, send, upload(index_, plan.result_row), plan.assignments(), L, s);
  if (!options_.verify) return;
  verify_against_dispatch(group_, cfg_, l.expert, static_cast<int>(plan.assignments()), plan.sent_kept, drops);
  ++verified_;
}

// The forward's phases again: the output gradients of computed rows travel like the dispatch, the
// input gradients back like the combine (dropped assignments get 0); phase p + 1's gradients travel
// while phase p's experts run backward (options_.overlap). The weight gradients add phase by phase.
void NcclExperts::backward(const ExpertLayer& l, const float* dys, float* dxs) {
  const int64_t S = group_.size(), local = l.E / S, e0 = group_.rank() * local;
  const int L = l.L, F = l.F;
  RS_CHECK(static_cast<size_t>(l.moe) < layers_.size() && layers_[static_cast<size_t>(l.moe)],
           "an MoE layer's backward comes after its forward");
  LayerState& st = *layers_[static_cast<size_t>(l.moe)];
  const EpLayerPlan& plan = st.plan;
  const cudaStream_t s = compute_;
  const int phases = plan.phases();
  const int64_t send_rows = plan.send.rows, recv_rows = plan.recv_rows();
  float* send = send_.get(size_t(send_rows) * L, s);
  gather_rows(send, dys, upload(index_, plan.grad_source), send_rows, L, s);
  float* recv = recv_.get(size_t(recv_rows) * L, s);
  float* dys_local = dys_local_.get(size_t(recv_rows) * L, s);
  float* dxs_local = dxs_local_.get(size_t(recv_rows) * L, s);
  const size_t LF = size_t(L) * size_t(F);

  to_comm();
  dispatch(plan, 0, send, recv, L, nullptr, nullptr);
  for (int p = 0; p < phases; ++p) {
    if (options_.overlap && p + 1 < phases) dispatch(plan, p + 1, send, recv, L, nullptr, nullptr);
    to_compute(p);
    const PhaseRows& pr = plan.phase_rows[size_t(p)];
    const int64_t n = pr.offsets.back();
    const PhaseState& ph = *st.phases[size_t(p)];
    gather_rows(dys_local + pr.first * L, recv, upload(index_, plan.compute_rows.data() + pr.first, n), n, L, s);
    if (n > 0) {
      float* scratch = scratch_.get(experts_scratch_floats(static_cast<int>(n), L, F), s);
      experts_backward(gemm_, dxs_local + pr.first * L, l.dw1 + e0 * LF, l.dw3 + e0 * LF, l.dw2 + e0 * LF,
                       dys_local + pr.first * L, ph.xs.data(), ph.a1.data(), ph.a3.data(), ph.h.data(),
                       pr.offsets.data(), nullptr, l.w1 + e0 * LF, l.w3 + e0 * LF, l.w2 + e0 * LF, scratch,
                       static_cast<int>(n), static_cast<int>(local), L, F, local_expert_options(l, e0));
    }
    const int64_t r0 = plan.recv_phase_begin(p), rows = plan.recv_phase_begin(p + 1) - r0;
    gather_rows(recv + r0 * L, dxs_local, upload(index_, plan.compute_of_row.data() + r0, rows), rows, L, s);
    to_comm();
    exchange(plan, p, recv, send, L, nullptr, nullptr, true);
    if (!options_.overlap && p + 1 < phases) dispatch(plan, p + 1, send, recv, L, nullptr, nullptr);
  }
  to_compute();
  gather_rows(dxs, send, upload(index_, plan.result_row), plan.assignments(), L, s);
}

}  // namespace

std::unique_ptr<ExpertBackend> make_nccl_experts(Comm group, const sim::DispatchConfig& config,
                                                 const ExpertTransportOptions& options, Gemm& gemm) {
  check_ep_transport(config, group.size());  // before any collective: every rank refuses alike
  ncclUniqueId id{};
  if (group.root()) RS_NCCL_CHECK(ncclGetUniqueId(&id));
  group.broadcast(&id, static_cast<int>(sizeof id), 0);
  int device = 0;
  RS_CUDA_CHECK(cudaGetDevice(&device));
  NcclComm nccl = NcclComm::from_unique_id(id, group.rank(), group.size(), device);
  return std::make_unique<NcclExperts>(std::move(group), config, options, gemm, std::move(nccl));
}

}  // namespace rackstep::exec::cuda
