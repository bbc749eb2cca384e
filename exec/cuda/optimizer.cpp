// exec/optim.cpp's Optimizer::step over device arenas; see exec/cuda/optimizer.h.
#include "exec/cuda/optimizer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "exec/cuda/check.h"
#include "exec/cuda/memory.h"
#include "exec/cuda/detail.h"
#include "exec/cuda/device_arena.h"
#include "exec/cuda/gemm.h"
#include "exec/cuda/optim.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {
namespace {

// Device memory of n elements, freed with the object.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) { device_malloc(&data_, sizeof(T) * std::max<size_t>(n, 1)); }
  ~DeviceArray() { device_free(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
};

// A tensor of the layout as the optimizer sees it: `matrices` stacked (rows, cols).
TensorView shape_of(const ArenaLayout& layout, size_t i) {
  const TensorSpec& s = layout.spec(i);
  return TensorView{nullptr, &s, numel(s.shape)};
}

class DeviceOptimizer final : public BackendOptimizer {
 public:
  DeviceOptimizer(cudaStream_t stream, const OptimizerConfig& config, std::shared_ptr<const ArenaLayout> layout)
      : gemm_(stream),
        stream_(stream),
        schedule_(config),
        config_(config),
        layout_(std::move(layout)),
        momentum_(layout_),
        second_(layout_->subset({OptGroup::kAdamH, OptGroup::kAdam})),
        u_(max_floats(false)),
        o_(max_floats(true)),
        ns_work_(ns_work_floats()),
        sum_work_(sum_squares_work_doubles()),
        tensor_sums_(layout_->size()) {
    v_index_.assign(layout_->size(), -1);
    for (size_t i = 0; i < layout_->size(); ++i) v_index_[i] = second_.layout().find(layout_->spec(i).name);
  }

  void load_state(const OptimizerState& host) override {
    RS_CHECK(host.w0_index.size() == layout_->size(), "optimizer state of another model");
    RS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no queued update may still read the moments
    momentum_.upload(host.momentum);
    second_.upload(host.second_moment);
    w0_norm_ = host.w0_norm;
    w0_index_ = host.w0_index;
    // A pageable upload may return before its DMA lands; the backend's stream does not wait for the legacy one.
    RS_CUDA_CHECK(cudaDeviceSynchronize());
  }

  void save_state(OptimizerState& host) override {
    RS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the last update has landed
    momentum_.download(host.momentum);
    second_.download(host.second_moment);
    host.w0_norm = w0_norm_;
  }

  GroupNorms grad_norms(const float* grads) override {
    const size_t T = layout_->size();
    for (size_t i = 0; i < T; ++i) {
      sum_squares_async(tensor_sums_.get() + i, grads + layout_->offset(i), size_t(numel(layout_->spec(i).shape)),
                        sum_work_.get(), stream_);
    }
    std::vector<double> sums(T);
    RS_CUDA_CHECK(cudaMemcpyAsync(sums.data(), tensor_sums_.get(), sizeof(double) * T, cudaMemcpyDeviceToHost, stream_));
    RS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    GroupNorms n;
    for (size_t i = 0; i < T; ++i) n.by_group[static_cast<int>(layout_->spec(i).group)] += sums[i];
    for (double& v : n.by_group) v = std::sqrt(v);
    return n;
  }

  void step(float* params, const float* grads, int64_t step) override {
    RS_CHECK(!w0_index_.empty(), "device optimizer: load_state before the first step");
    for (size_t i = 0; i < layout_->size(); ++i) {
      const TensorView t = shape_of(*layout_, i);
      const int64_t off = layout_->offset(i);
      const double lr_now = schedule_.lr(t.spec->group, step);
      if (is_matrix_group(t.spec->group)) {
        step_muon(t, params + off, grads + off, momentum_.data() + off, i, lr_now);
        continue;
      }
      float* v = second_.tensor(static_cast<size_t>(v_index_[i]));
      step_adam(t, params + off, grads + off, momentum_.data() + off, v, i, step, lr_now);
    }
  }

 private:
  // exec/optim.cpp, Optimizer::step_muon.
  void step_muon(const TensorView& t, float* w, const float* g, float* m, size_t tensor, double lr_now) {
    const auto b1 = static_cast<float>(config_.beta1);
    const int64_t rows = t.rows(), cols = t.cols(), per = rows * cols;
    for (int64_t e = 0; e < t.matrices(); ++e) {
      const int64_t off = e * per;
      muon_momentum(u_.get(), g + off, m + off, size_t(per), b1, stream_);
      newton_schulz(gemm_, u_.get(), rows, cols, config_.ns_steps, o_.get(), ns_work_.get(), sum_work_.get());
      if (t.spec->group == OptGroup::kMuonH) {
        hyperball_update(w + off, o_.get(), size_t(per), lr_now, w0_norm_[size_t(w0_index_[tensor] + e)],
                         sum_work_.get(), stream_);
        continue;
      }
      const auto scaled = static_cast<float>(lr_now * std::sqrt(std::max(1.0, static_cast<double>(rows) / cols)));
      detail::axpy(w + off, o_.get(), size_t(per), -scaled, stream_);
    }
  }

  // exec/optim.cpp, Optimizer::step_adam.
  void step_adam(const TensorView& t, float* w, const float* g, float* m, float* v, size_t tensor, int64_t step,
                 double lr_now) {
    const double steps_done = static_cast<double>(step + 1);
    AdamScalars s;
    s.b1 = static_cast<float>(config_.beta1);
    s.b2 = static_cast<float>(config_.beta2);
    s.c1 = static_cast<float>(1.0 / (1.0 - std::pow(config_.beta1, steps_done)));
    s.c2 = static_cast<float>(1.0 / (1.0 - std::pow(config_.beta2, steps_done)));
    s.eps = static_cast<float>(config_.eps);
    const auto n = size_t(t.numel);
    if (t.spec->group == OptGroup::kAdamH) {
      adam_direction(u_.get(), g, m, v, n, s, stream_);
      hyperball_update(w, u_.get(), n, lr_now, w0_norm_[size_t(w0_index_[tensor])], sum_work_.get(), stream_);
      return;
    }
    s.lr = static_cast<float>(lr_now);
    s.decay = static_cast<float>(lr_now * config_.adam_weight_decay);
    adam_update(w, g, m, v, n, s, stream_);
  }

  // The largest update direction (every tensor) or Newton–Schulz output (one matrix).
  size_t max_floats(bool one_matrix) const {
    size_t n = 0;
    for (size_t i = 0; i < layout_->size(); ++i) {
      const TensorView t = shape_of(*layout_, i);
      const bool matrix = is_matrix_group(t.spec->group);
      if (one_matrix && !matrix) continue;
      n = std::max(n, size_t(matrix ? t.rows() * t.cols() : t.numel));
    }
    return n;
  }
  size_t ns_work_floats() const {
    size_t n = 0;
    for (size_t i = 0; i < layout_->size(); ++i) {
      const TensorView t = shape_of(*layout_, i);
      if (is_matrix_group(t.spec->group)) n = std::max(n, newton_schulz_work_floats(t.rows(), t.cols()));
    }
    return n;
  }

  Gemm gemm_;  // fp32 Newton–Schulz GEMMs on stream_
  cudaStream_t stream_;
  Optimizer schedule_;  // the host optimizer's LR schedule (lr(group, step)); it updates nothing here
  OptimizerConfig config_;
  std::shared_ptr<const ArenaLayout> layout_;
  DeviceArena momentum_;          // the parameters' layout: Adam first moment, Muon momentum
  DeviceArena second_;            // Adam and AdamH tensors only
  DeviceArray<float> u_;          // (largest tensor) update direction of one matrix / tensor
  DeviceArray<float> o_;          // (largest matrix) Newton–Schulz output
  DeviceArray<float> ns_work_;    // Newton–Schulz workspace of the largest matrix
  DeviceArray<double> sum_work_;  // Σ x² partials and total
  DeviceArray<double> tensor_sums_;  // (tensors) Σ g² per tensor
  std::vector<int64_t> v_index_;  // (tensors) index in second_, -1 if none
  std::vector<double> w0_norm_;   // ||W0|| per hyperball matrix (host scalars of the hyperball step)
  std::vector<int64_t> w0_index_;  // (tensors) first w0_norm_ entry, -1 if none
};

}  // namespace

std::unique_ptr<BackendOptimizer> make_device_optimizer(cudaStream_t stream, const OptimizerConfig& config,
                                                        std::shared_ptr<const ArenaLayout> layout) {
  return std::make_unique<DeviceOptimizer>(stream, config, std::move(layout));
}

}  // namespace rackstep::exec::cuda
