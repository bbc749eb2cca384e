// A parameter (or gradient, or optimizer-state) arena on the GPU with exactly
// the layout of an exec::Arena: one allocation of total_floats floats, tensors
// at the layout's offsets. Copies to and from a host Arena are whole-buffer
// memcpys, so a checkpoint written by the CPU engine loads onto the GPU and
// back bitwise, and a run can move between backends.
//
//   cuda::DeviceArena params(host_params.layout_ptr());
//   params.upload(host_params);            // fp32 master weights on the device
//   float* wq = params.tensor(layout.find("layers.0.attn.wq"));
//   params.download(host_params);          // for the checkpoint writer
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "exec/arena.h"

namespace rackstep::exec::cuda {

class DeviceArena {
 public:
  explicit DeviceArena(std::shared_ptr<const ArenaLayout> layout);  // zero-filled
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  const ArenaLayout& layout() const { return *layout_; }
  float* data() { return data_; }  // (total_floats) on the device
  size_t bytes() const { return static_cast<size_t>(layout_->total_floats()) * sizeof(float); }
  float* tensor(size_t i);         // the i-th tensor's first element on the device

  // Same layout required (fingerprint); synchronous.
  void upload(const Arena& host);
  void download(Arena& host) const;
  void zero(cudaStream_t stream);

 private:
  std::shared_ptr<const ArenaLayout> layout_;
  float* data_ = nullptr;
};

}  // namespace rackstep::exec::cuda
