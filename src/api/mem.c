/*
 * ncclMemAlloc / ncclMemFree: device memory for the caller's buffers. Today
 * this is cudaMalloc on the current device (which is also NCCL's fallback
 * where its cuMem path is unavailable); buffer registration will move it to
 * cuMem allocations that peers can map.
 */
#include <cuda_runtime.h>

#include "base/debug.h"
#include "base/error.h"

#define NCCL_API __attribute__((visibility("default")))

NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  braid_err_clear();
  if (ptr == NULL) return braid_err(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  *ptr = NULL;
  if (size == 0) return braid_err(ncclInvalidArgument, "ncclMemAlloc: size is 0");
  cudaError_t err = cudaMalloc(ptr, size);
  if (err != cudaSuccess) {
    (void)cudaGetLastError(); /* not left for the caller's next error check */
    *ptr = NULL;
    return braid_err(ncclUnhandledCudaError, "ncclMemAlloc: cudaMalloc of %zu bytes failed: %s",
                     size, cudaGetErrorString(err));
  }
  return ncclSuccess;
}
NCCL_API ncclResult_t pncclMemAlloc(void** ptr, size_t size) __attribute__((alias("ncclMemAlloc")));

NCCL_API ncclResult_t ncclMemFree(void* ptr) {
  braid_err_clear();
  if (ptr == NULL) return ncclSuccess;
  cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return braid_err(ncclUnhandledCudaError, "ncclMemFree(%p) failed: %s", ptr, cudaGetErrorString(err));
  }
  return ncclSuccess;
}
NCCL_API ncclResult_t pncclMemFree(void* ptr) __attribute__((alias("ncclMemFree")));
