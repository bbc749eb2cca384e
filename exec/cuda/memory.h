// Device allocations of the CUDA backend, counted: every cudaMalloc /
// cudaMallocAsync of exec/cuda/ goes through these, so the backend knows its
// high-water mark of allocated bytes (exec/high_water.h) and, sampled with
// cudaMemGetInfo whenever that mark rises, the device's used bytes at the
// peak (context, cuBLAS, memory pools and other processes included). The
// profiler writes them (exec/profiler.h: "peak_device_bytes",
// "device_used_at_peak_bytes").
//
//   float* p = nullptr;
//   device_malloc(&p, n * sizeof(float));          // RS_CUDA_CHECK'd, counted
//   device_free(p);                                // uncounted; nullptr is a no-op
//   device_malloc_async(&q, bytes, stream);  device_free_async(q, stream);
//   DeviceMemory m = device_memory_report();       // name, peak, used at peak, total
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace rackstep::exec {
struct DeviceMemory;  // exec/backend.h
}  // namespace rackstep::exec

namespace rackstep::exec::cuda {

void* device_malloc_bytes(size_t bytes);
void* device_malloc_async_bytes(size_t bytes, cudaStream_t stream);
void device_free(void* p);
void device_free_async(void* p, cudaStream_t stream);

template <typename T>
void device_malloc(T** p, size_t bytes) {
  *p = static_cast<T*>(device_malloc_bytes(bytes));
}
template <typename T>
void device_malloc_async(T** p, size_t bytes, cudaStream_t stream) {
  *p = static_cast<T*>(device_malloc_async_bytes(bytes, stream));
}

// The current device's name (cudaGetDeviceProperties), the high-water mark of
// the bytes allocated through the functions above since the process began,
// the device's used bytes when the mark was last raised, and its total.
DeviceMemory device_memory_report();

}  // namespace rackstep::exec::cuda
