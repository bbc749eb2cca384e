// The CUDA calibration backend (exec/cuda/microbench.h).
#include "exec/cuda/microbench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "exec/cuda/backend.h"
#include "exec/cuda/check.h"
#include "exec/cuda/gemm.h"
#include "exec/cuda/layers.h"
#include "exec/cuda/ops.h"
#include "exec/model.h"
#include "exec/optim.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {
namespace {

using Clock = std::chrono::steady_clock;

// The model's ops bracketed on a backend clock: (op, phase) per interval, in order.
struct Brackets final : OpBrackets {
  explicit Brackets(std::unique_ptr<OpTiming> t) : timing(std::move(t)) {}
  void begin_op(size_t op, int phase) override {
    ops.emplace_back(op, phase);
    timing->begin();
  }
  void end_op(size_t, int) override { timing->end(); }
  std::unique_ptr<OpTiming> timing;
  std::vector<std::pair<size_t, int>> ops;
};

// Device floats, pseudo-random in [-1, 1) (never zeros: they time faster than data).
struct Floats {
  float* p = nullptr;
  explicit Floats(size_t n, uint32_t seed) {
    RS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(float)));
    std::vector<float> host(n);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& x : host) x = u(rng);
    RS_CUDA_CHECK(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  ~Floats() { cudaFree(p); }
  Floats(const Floats&) = delete;
  Floats& operator=(const Floats&) = delete;
};

// Seconds of fn on `stream` by CUDA events, the fastest of reps after one warm-up.
double best_seconds(cudaStream_t stream, int reps, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  RS_CUDA_CHECK(cudaEventCreate(&start));
  RS_CUDA_CHECK(cudaEventCreate(&stop));
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    RS_CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    RS_CUDA_CHECK(cudaEventRecord(stop, stream));
    RS_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    RS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r > 0) best = std::min(best, 1e-3 * ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

class CudaOpBackend final : public OpBackend {
 public:
  CudaOpBackend() : gemm_(stream_) {}
  ~CudaOpBackend() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "cuda"; }
  int threads() const override { return 1; }

  PassSeconds gemm(int64_t m, int64_t n, int64_t k, int reps) override {
    const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
    Floats x(size_t(m * k), 1), w(size_t(k * n), 2), y(size_t(m * n), 3), dx(size_t(m * k), 4), dw(size_t(k * n), 5);
    PassSeconds p;
    p.fwd_s = best_seconds(stream_, reps, [&] { linear_forward(gemm_, y.p, x.p, w.p, M, K, N); });
    p.bwd_s = best_seconds(stream_, reps, [&] { linear_backward(gemm_, dx.p, dw.p, y.p, x.p, w.p, M, K, N); });
    return p;
  }

  double stream_bytes_per_s(double bytes, int reps) override {
    const auto n = static_cast<size_t>(bytes / sizeof(float));
    Floats a(n, 6), b(n, 7), y(n, 8);
    const double s = best_seconds(stream_, reps, [&] { residual_forward<float>(y.p, a.p, b.p, n, stream_); });
    return 3.0 * static_cast<double>(n) * sizeof(float) / s;
  }

  // As the CPU backend's profile (exec/microbench.cpp): random tokens in
  // documents of 64..512, the fastest repetition of each pass and op; the
  // optimizer runs on the host arenas, as in `rackstep train --backend cuda`.
  ModelProfile profile(const models::LayerGraph& graph, int64_t batch, int64_t seq, int reps) override {
    Model model(graph, batch, seq, make_cuda_backend());
    model.init_params(1);
    const int64_t N = batch * seq;
    std::vector<int32_t> tokens, doc;
    make_profile_batch(graph, batch, seq, tokens, doc);
    const OptimizerConfig cfg = default_optimizer_config(1000, graph.model.d_model, N);
    Optimizer opt(cfg);
    OptimizerState state = init_optimizer_state(model.params());
    // Per op and phase, the fastest repetition's device time: the backend's clock
    // (CUDA events, exec/cuda/op_timing.h), read once per repetition, no sync per op.
    std::map<std::pair<size_t, int>, double> best_op;
    bool recording = false;
    Brackets brackets(model.backend().make_op_timing());
    model.set_op_brackets(&brackets);
    auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    ModelProfile p;
    p.forward_s = p.backward_s = p.optimizer_s = 1e30;
    for (int r = 0; r <= reps; ++r) {
      recording = r > 0;
      model.zero_grads();
      brackets.timing->begin_step();
      const auto t0 = Clock::now();
      model.forward(tokens.data(), tokens.data() + 1, doc.data());
      model.backend().synchronize();
      const auto t1 = Clock::now();
      model.backward();
      model.backend().synchronize();
      const auto t2 = Clock::now();
      const StepTiming times = brackets.timing->end_step();
      RS_CHECK(times.intervals.size() == brackets.ops.size(), "profile: the clock's intervals and the ops differ");
      for (size_t i = 0; recording && i < times.intervals.size(); ++i) {
        auto [it, fresh] = best_op.emplace(brackets.ops[i], times.intervals[i].duration_s);
        if (!fresh) it->second = std::min(it->second, times.intervals[i].duration_s);
      }
      brackets.ops.clear();
      opt.step(model.params(), model.grads(), state);
      const auto t3 = Clock::now();
      if (!recording) continue;
      p.forward_s = std::min(p.forward_s, seconds(t0, t1));
      p.backward_s = std::min(p.backward_s, seconds(t1, t2));
      p.optimizer_s = std::min(p.optimizer_s, seconds(t2, t3));
    }
    model.set_op_brackets(nullptr);
    p.cpu_share = 1;
    p.rss_bytes = current_rss_bytes();
    p.model_bytes = static_cast<double>(model.params().bytes() + model.grads().bytes() + model.activation_bytes() +
                                        state.momentum.bytes() + state.second_moment.bytes());
    std::map<size_t, OpSample> by_op;
    for (const auto& [key, t] : best_op) {
      OpSample& s = by_op[key.first];
      s.index = key.first;
      (key.second == 0 ? s.fwd_s : s.bwd_s) = t;
    }
    for (const auto& [i, s] : by_op) p.ops.push_back(s);
    return p;
  }

 private:
  static cudaStream_t make_stream() {
    cudaStream_t s = nullptr;
    RS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }
  cudaStream_t stream_ = make_stream();
  Gemm gemm_;
};

}  // namespace

std::unique_ptr<OpBackend> make_cuda_op_backend() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    return nullptr;
  }
  return std::make_unique<CudaOpBackend>();
}

}  // namespace rackstep::exec::cuda
