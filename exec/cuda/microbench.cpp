#include "exec/cuda/microbench.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "exec/cuda/check.h"
#include "exec/cuda/gemm.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {

namespace {

// A device buffer of `bytes`, filled with 0x3c bytes (bf16 0x3c3c ~ 0.0115: no
// zeros or denormals the hardware could shortcut).
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    RS_CUDA_CHECK(cudaMalloc(&p, bytes));
    RS_CUDA_CHECK(cudaMemset(p, 0x3c, bytes));
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Seconds of what `enqueue` puts on `stream`, by CUDA events (device time: a
// shared host does not stretch it).
template <class F>
double device_seconds(cudaStream_t stream, F enqueue) {
  cudaEvent_t a, b;
  RS_CUDA_CHECK(cudaEventCreate(&a));
  RS_CUDA_CHECK(cudaEventCreate(&b));
  RS_CUDA_CHECK(cudaEventRecord(a, stream));
  enqueue();
  RS_CUDA_CHECK(cudaEventRecord(b, stream));
  RS_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  RS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  RS_CUDA_CHECK(cudaEventDestroy(a));
  RS_CUDA_CHECK(cudaEventDestroy(b));
  return 1e-3 * ms;
}

class CudaOpBackend final : public OpBackend {
 public:
  CudaOpBackend() {
    RS_CUDA_CHECK(cudaStreamCreate(&stream_));
    gemm_ = std::make_unique<Gemm>(stream_);
  }
  ~CudaOpBackend() override {
    gemm_.reset();
    cudaStreamDestroy(stream_);
  }
  std::string name() const override { return "cuda"; }
  int threads() const override { return 1; }
  bool can_profile() const override { return false; }

  // y(m, n) = x(m, k)·W(k, n); backward dx = dy·Wᵀ and dW += xᵀ·dy, bf16 in and out.
  PassSeconds gemm(int64_t m, int64_t n, int64_t k, int reps) override {
    const size_t e = sizeof(__nv_bfloat16);
    DeviceBuffer x(static_cast<size_t>(m * k) * e), w(static_cast<size_t>(k * n) * e), y(static_cast<size_t>(m * n) * e);
    DeviceBuffer dx(static_cast<size_t>(m * k) * e), dw(static_cast<size_t>(k * n) * e);
    const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
    double f = 1e30, b = 1e30;
    for (int r = 0; r <= reps; ++r) {  // the first run warms the algorithm cache
      const double tf = device_seconds(stream_, [&] { gemm_->run({.m = M, .n = N, .k = K}, DType::kBF16, y.p, x.p, w.p); });
      const double tb = device_seconds(stream_, [&] {
        gemm_->run({.m = M, .n = K, .k = N, .trans_b = true}, DType::kBF16, dx.p, y.p, w.p);
        gemm_->run({.m = K, .n = N, .k = M, .trans_a = true, .beta = 1.0f}, DType::kBF16, dw.p, x.p, y.p);
      });
      if (r == 0) continue;
      f = std::min(f, tf);
      b = std::min(b, tb);
    }
    return {f, b, 1.0};
  }

  // Bytes moved per second (read + write) of a device-to-device copy of `bytes`.
  double stream_bytes_per_s(double bytes, int reps) override {
    const auto n = static_cast<size_t>(bytes);
    DeviceBuffer a(n), c(n);
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {
      const double t = device_seconds(stream_, [&] { RS_CUDA_CHECK(cudaMemcpyAsync(c.p, a.p, n, cudaMemcpyDeviceToDevice, stream_)); });
      if (r > 0) best = std::min(best, t);
    }
    return 2.0 * bytes / best;
  }

  ModelProfile profile(const models::LayerGraph&, int64_t, int64_t, int) override {
    throw UserError("calibrate --backend cuda: layer-graph op profiles need the CUDA model driver (exec/backend.h)");
  }

 private:
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
};

}  // namespace

std::unique_ptr<OpBackend> make_cuda_op_backend() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    throw UserError("calibrate: --backend cuda: expected a CUDA device, found none (cudaGetDeviceCount)");
  }
  return std::make_unique<CudaOpBackend>();
}

}  // namespace rackstep::exec::cuda
