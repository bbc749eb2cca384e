// The CPU backend dressed as a device, for testing the driver's device path on
// a machine without one (tests/exec_model.cpp, tests/exec_train.cpp): its
// memory is not the host's as far as the driver knows, so parameters and
// gradients live in "backend" arenas the driver keeps coherent with the host's
// by explicit copies, and routing state and the QB histogram cross by copies.
// With `resident`, it also offers an optimizer in its memory
// (Backend::make_optimizer), exec::Optimizer run over its own copies of the
// state: what the CUDA backend's does on the GPU, here bitwise the host's, so
// a resident run must train bitwise like the CPU one. With `collectives`
// (resident too), it offers data-parallel collectives in its memory
// (Backend::make_collectives) on exec::Comm's MPI calls: the trainer's
// backend-collectives path (the one NCCL takes on the GPU) checked on the CPU;
// with `collectives` it also offers expert parallelism in its memory
// (Backend::make_experts: NotHostExperts), the path of the GPU's NCCL transport.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/backend.h"
#include "exec/dist.h"
#include "exec/model.h"
#include "exec/optim.h"
#include "sim/base/check.h"

namespace rackstep::exec::testing {

class NotHostOptimizer final : public BackendOptimizer {
 public:
  NotHostOptimizer(const OptimizerConfig& config, std::shared_ptr<const ArenaLayout> layout)
      : opt_(config), params_(layout), grads_(layout) {}
  void load_state(const OptimizerState& host) override { state_ = host; }  // its own copy, as a device's
  void save_state(OptimizerState& host) override {
    copy(host.momentum, state_.momentum);
    copy(host.second_moment, state_.second_moment);
    host.w0_norm = state_.w0_norm;
  }
  GroupNorms grad_norms(const float* grads) override {
    std::copy_n(grads, grads_.total_floats(), grads_.data());
    return group_norms(grads_);
  }
  void step(float* params, const float* grads, int64_t step) override {
    std::copy_n(params, params_.total_floats(), params_.data());
    std::copy_n(grads, grads_.total_floats(), grads_.data());
    state_.step = step;
    opt_.step(params_, grads_, state_);
    std::copy_n(params_.data(), params_.total_floats(), params);
  }

 private:
  static void copy(Arena& to, const Arena& from) {
    RS_CHECK(to.layout().fingerprint() == from.layout().fingerprint(), "optimizer state of another layout");
    std::copy_n(from.data(), from.total_floats(), to.data());
  }
  Optimizer opt_;
  Arena params_, grads_;
  OptimizerState state_;
};

// BackendCollectives on exec::Comm: MPI_Ireduce_scatter of each range's parts
// and MPI_Allgatherv of the ranges, as the trainer's host path calls them.
class CommCollectives final : public BackendCollectives {
 public:
  CommCollectives(const Comm& ranks, std::vector<int64_t> offsets, std::vector<int64_t> counts)
      : ranks_(ranks), offsets_(std::move(offsets)), counts_(std::move(counts)) {
    int64_t at = 0;
    for (size_t r = 0; r < counts_.size(); ++r) {
      RS_CHECK(offsets_[r] == at, "collectives: ranges must tile the arena in rank order");
      at += counts_[r];
    }
  }
  void start_reduce_scatter(float* shard, const float* grads, int64_t begin, int64_t end) override {
    const RangeParts p = range_parts(offsets_, counts_, begin, end);
    const std::vector<int> counts(p.counts.begin(), p.counts.end());
    bracket("reduce_scatter",
            [&] { ranks_.start_reduce_scatter_sum(grads + begin, shard + p.shard_offsets[me()], counts); });
  }
  void wait_reduce_scatter() override { ranks_.wait_started(); }
  void all_gather(float* params) override {
    const std::vector<float> mine(params + offsets_[me()], params + offsets_[me()] + counts_[me()]);
    const std::vector<int> counts(counts_.begin(), counts_.end());
    bracket("all_gather", [&] { ranks_.allgatherv(mine.data(), params, counts); });
  }
  // The profiler's collectives lane, as NCCL's (the host has one queue: the clock times it as its own).
  void set_brackets(CollectiveBrackets* brackets) override { brackets_ = brackets; }

 private:
  template <typename Queue>
  void bracket(const char* name, Queue&& queue) {
    if (brackets_) brackets_->begin_collective(name, nullptr);
    queue();
    if (brackets_) brackets_->end_collective(nullptr);
  }
  size_t me() const { return static_cast<size_t>(ranks_.rank()); }
  const Comm& ranks_;  // the trainer's, which outlives this
  std::vector<int64_t> offsets_, counts_;
  CollectiveBrackets* brackets_ = nullptr;
};

// Expert parallelism "in its memory" (Backend::make_experts): the MPI
// transport (exec/dist.h MpiExperts) over the EP group, reporting a memory that
// is not the host's, so the trainer takes the path the CUDA backend's NCCL
// transport takes (one process with ep 1 included) and the shared plan's
// results can be checked against the simulated dispatch bit for bit.
class NotHostExperts final : public ExpertBackend {
 public:
  NotHostExperts(Comm group, const sim::DispatchConfig& config, bool verify)
      : mpi_(std::move(group), config, verify) {}
  void forward(const ExpertLayer& l, const float* xs, float* ys, uint8_t* keep, sim::DropCounts& drops) override {
    mpi_.forward(l, xs, ys, keep, drops);
  }
  void backward(const ExpertLayer& l, const float* dys, float* dxs) override { mpi_.backward(l, dys, dxs); }
  bool uses_host_memory() const override { return false; }
  int64_t verified_layers() const override { return mpi_.verified_layers(); }

 private:
  MpiExperts mpi_;
};

class NotHostBackend final : public Backend {
 public:
  explicit NotHostBackend(bool resident = false, bool collectives = false)
      : resident_(resident || collectives), collectives_(collectives) {}
  std::string name() const override {
    if (collectives_) return "cpu-collectives";
    return resident_ ? "cpu-resident" : "cpu-as-device";
  }
  std::unique_ptr<BackendCollectives> make_collectives(const Comm& ranks, const std::vector<int64_t>& offsets,
                                                       const std::vector<int64_t>& counts, std::string& why) override {
    if (!collectives_) return Backend::make_collectives(ranks, offsets, counts, why);
    return std::make_unique<CommCollectives>(ranks, offsets, counts);
  }
  std::unique_ptr<ExpertBackend> make_experts(Comm group, const sim::DispatchConfig& config,
                                              const ExpertTransportOptions& options, std::string& why) override {
    if (!collectives_) return Backend::make_experts(std::move(group), config, options, why);
    return std::make_unique<NotHostExperts>(std::move(group), config, options.verify);
  }
  std::unique_ptr<Buffer> allocate(size_t bytes) override { return cpu_->allocate(bytes); }
  void copy_to_backend(void* dst, const void* src, size_t bytes) override { cpu_->copy_to_backend(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { cpu_->copy_to_host(dst, src, bytes); }
  bool uses_host_memory() const override { return false; }
  void synchronize() override {}
  std::unique_ptr<BackendOptimizer> make_optimizer(const OptimizerConfig& config,
                                                   std::shared_ptr<const ArenaLayout> layout) override {
    if (!resident_) return nullptr;
    return std::make_unique<NotHostOptimizer>(config, std::move(layout));
  }
  OpResult forward(const OpCall& c) override { return cpu_->forward(c); }
  void backward(const OpCall& c) override { cpu_->backward(c); }
  double aux_loss(const OpCall& c) override { return cpu_->aux_loss(c); }
  void copy_columns(float* y, int64_t wy, const float* x, int64_t wx, int64_t rows, bool acc) override {
    cpu_->copy_columns(y, wy, x, wx, rows, acc);
  }
  void assemble_key(float* k, const float* kn, const float* kr, int64_t N, int64_t H, int64_t hd, int64_t r) override {
    cpu_->assemble_key(k, kn, kr, N, H, hd, r);
  }
  void split_key_grad(float* dn, bool an, float* dr, bool ar, const float* dk, int64_t N, int64_t H, int64_t hd,
                      int64_t r) override {
    cpu_->split_key_grad(dn, an, dr, ar, dk, N, H, hd, r);
  }
  void fill_zero(float* x, int64_t n) override { cpu_->fill_zero(x, n); }
  bool all_finite(const float* x, int64_t n) override { return cpu_->all_finite(x, n); }
  void update_balancing_bias(float* bias, int64_t* hist, int E, int k, int bins, float lo, float hi) override {
    cpu_->update_balancing_bias(bias, hist, E, k, bins, lo, hi);
  }

 private:
  bool resident_ = false, collectives_ = false;
  std::unique_ptr<Backend> cpu_ = make_backend("cpu");
};

// Registers the three in exec/backend.h's registry (idempotent).
inline void register_not_host_backends() {
  register_backend("cpu-as-device", [] { return std::make_unique<NotHostBackend>(false); });
  register_backend("cpu-resident", [] { return std::make_unique<NotHostBackend>(true); });
  register_backend("cpu-collectives", [] { return std::make_unique<NotHostBackend>(true, true); });
}

}  // namespace rackstep::exec::testing
