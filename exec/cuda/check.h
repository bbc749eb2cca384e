// Check macros for every CUDA runtime, cuBLAS(Lt) and NCCL call of the CUDA
// backend: a failure prints the call as written, the library's error string,
// file and line, then aborts (like RS_CHECK: a failed device call is not a
// user error, and continuing would only report a later, unrelated failure).
//
//   RS_CUDA_CHECK(cudaMalloc(&p, bytes));
//   RS_CUBLAS_CHECK(cublasLtMatmul(handle, ...));
//   RS_NCCL_CHECK(ncclAllReduce(...));
//   RS_CUDNN_CHECK(cudnnSetStream(handle, stream));   // where the build has cuDNN (RACKSTEP_HAVE_CUDNN)
//   RS_CUDA_CHECK(cudaGetLastError());   // after a kernel launch
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#if defined(RACKSTEP_HAVE_CUDNN)
#include <cudnn.h>
#endif

namespace rackstep::exec::cuda {

[[noreturn]] void fail_call(const char* library, const char* call, const char* error, const char* file, int line);

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) fail_call("CUDA", call, cudaGetErrorString(status), file, line);
}
inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) fail_call("cuBLAS", call, cublasGetStatusString(status), file, line);
}

#if defined(RACKSTEP_HAVE_CUDNN)
inline void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS) fail_call("cuDNN", call, cudnnGetErrorString(status), file, line);
}
#endif

}  // namespace rackstep::exec::cuda

#define RS_CUDA_CHECK(call) ::rackstep::exec::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define RS_CUBLAS_CHECK(call) ::rackstep::exec::cuda::check_cublas((call), #call, __FILE__, __LINE__)
#if defined(RACKSTEP_HAVE_CUDNN)
#define RS_CUDNN_CHECK(call) ::rackstep::exec::cuda::check_cudnn((call), #call, __FILE__, __LINE__)
#endif
