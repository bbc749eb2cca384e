#include "exec/cuda/device_arena.h"

#include <utility>

#include "exec/cuda/check.h"
#include "exec/cuda/memory.h"
#include "sim/base/check.h"

namespace rackstep::exec::cuda {

DeviceArena::DeviceArena(std::shared_ptr<const ArenaLayout> layout) : layout_(std::move(layout)) {
  RS_CHECK(layout_ != nullptr, "DeviceArena needs a layout");
  device_malloc(&data_, std::max<size_t>(bytes(), sizeof(float)));
  RS_CUDA_CHECK(cudaMemset(data_, 0, bytes()));
}

DeviceArena::~DeviceArena() {
  device_free(data_);
}

float* DeviceArena::tensor(size_t i) {
  RS_CHECK(i < layout_->size(), "DeviceArena::tensor: index out of range");
  return data_ + layout_->offset(i);
}

void DeviceArena::upload(const Arena& host) {
  RS_CHECK(host.layout().fingerprint() == layout_->fingerprint(), "DeviceArena::upload: arena of another layout");
  RS_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
}

void DeviceArena::download(Arena& host) const {
  RS_CHECK(host.layout().fingerprint() == layout_->fingerprint(), "DeviceArena::download: arena of another layout");
  RS_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
}

void DeviceArena::zero(cudaStream_t stream) { RS_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes(), stream)); }

}  // namespace rackstep::exec::cuda
