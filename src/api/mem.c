/*
 * ncclMemAlloc / ncclMemFree: device memory for the caller's buffers. As in
 * NCCL, a cuMem allocation on the current device, mapped for every GPU of the
 * process that can reach it, with a shareable handle (transport/ipc.c);
 * cudaMalloc when NCCL_CUMEM_ENABLE=0 or the driver cannot.
 */
#include <cuda_runtime.h>

#include "base/debug.h"
#include "base/error.h"
#include "transport/ipc.h"

#define NCCL_API __attribute__((visibility("default")))

NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  braid_err_clear();
  if (ptr == NULL) return braid_err(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  *ptr = NULL;
  if (size == 0) return braid_err(ncclInvalidArgument, "ncclMemAlloc: size is 0");
  return ipc_user_alloc(ptr, size);
}
NCCL_API ncclResult_t pncclMemAlloc(void** ptr, size_t size) __attribute__((alias("ncclMemAlloc")));

NCCL_API ncclResult_t ncclMemFree(void* ptr) {
  braid_err_clear();
  if (ptr == NULL) return ncclSuccess;
  return ipc_user_free(ptr);
}
NCCL_API ncclResult_t pncclMemFree(void* ptr) __attribute__((alias("ncclMemFree")));
