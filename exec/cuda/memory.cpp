#include "exec/cuda/memory.h"

#include <atomic>

#include "exec/backend.h"
#include "exec/cuda/check.h"
#include "exec/high_water.h"

namespace rackstep::exec::cuda {

namespace {

HighWater& counter() {
  static HighWater hw;
  return hw;
}
std::atomic<double> used_at_peak{-1.0};

void counted(void* p, size_t bytes) {
  if (!counter().add(p, bytes)) return;
  // A new mark: what the device holds now (one driver query; allocations
  // rise to their mark while the model and optimizer are set up, then stop).
  size_t free_bytes = 0, total_bytes = 0;
  RS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  used_at_peak.store(static_cast<double>(total_bytes - free_bytes));
}

}  // namespace

void* device_malloc_bytes(size_t bytes) {
  void* p = nullptr;
  RS_CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
  counted(p, bytes);
  return p;
}

void* device_malloc_async_bytes(size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  RS_CUDA_CHECK(cudaMallocAsync(&p, bytes > 0 ? bytes : 1, stream));
  counted(p, bytes);
  return p;
}

void device_free(void* p) {
  if (!p) return;
  counter().remove(p);
  // At process exit the runtime may be unloading before a static owner frees: nothing left to free.
  const cudaError_t status = cudaFree(p);  // waits for the device's work on p
  if (status != cudaErrorCudartUnloading) check_cuda(status, "cudaFree(p)", __FILE__, __LINE__);
}

void device_free_async(void* p, cudaStream_t stream) {
  if (!p) return;
  counter().remove(p);  // stream-ordered: the pool reuses it only after the work queued before this
  RS_CUDA_CHECK(cudaFreeAsync(p, stream));
}

DeviceMemory device_memory_report() {
  DeviceMemory m;
  int device = 0;
  RS_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  RS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  m.device = prop.name;
  m.total_bytes = static_cast<double>(prop.totalGlobalMem);
  m.peak_bytes = static_cast<double>(counter().peak());
  m.used_at_peak_bytes = used_at_peak.load();
  return m;
}

}  // namespace rackstep::exec::cuda
