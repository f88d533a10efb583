/*
 * ncclCommRegister / ncclCommDeregister (register.h says what they do today).
 */
#include "runtime/register.h"

#include <stdint.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#include "runtime/comm.h"
#include "base/debug.h"
#include "base/utils.h"

#define NCCL_API __attribute__((visibility("default")))
#define NCCL_ALIAS(ret, name, params) NCCL_API ret p##name params __attribute__((alias(#name)));

#define REG_MAGIC 0x4252474dU /* "BRGM" */

struct braid_reg {
  uint32_t magic;
  void* buff;
  size_t size;
  struct braid_reg* next;
};

/* The buffer must be device (or managed) memory that the comm's GPU can address. */
static ncclResult_t reg_check_buffer(const struct ncclComm* comm, const void* buff, size_t size,
                                     const char* api) {
  if (buff == NULL) return braid_err(ncclInvalidArgument, "%s: buff is NULL", api);
  if (size == 0) return braid_err(ncclInvalidArgument, "%s: size is 0 (buff %p)", api, buff);
  struct cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, buff);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return braid_err(ncclInvalidArgument, "%s: buff %p (%zu bytes) is not CUDA memory: %s", api,
                     buff, size, cudaGetErrorString(err));
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    return braid_err(ncclInvalidArgument,
                     "%s: buff %p (%zu bytes) is host memory; only device memory can be "
                     "registered",
                     api, buff, size);
  if (attr.type == cudaMemoryTypeDevice && attr.device != comm->cuda_dev)
    return braid_err(ncclInvalidArgument,
                     "%s: buff %p lives on device %d but rank %d's communicator uses device %d",
                     api, buff, attr.device, comm->rank, comm->cuda_dev);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  ncclResult_t res = ncclSuccess;
  struct braid_reg* reg = NULL;
  braid_err_clear();
  BRAID_TRY(comm_check_ready(comm, "ncclCommRegister"));
  BRAID_CHECK(handle != NULL, ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  *handle = NULL;
  BRAID_TRY(reg_check_buffer(comm, buff, size, "ncclCommRegister"));
  BRAID_TRY(BRAID_CALLOC(&reg, 1, "a buffer registration"));
  reg->magic = REG_MAGIC;
  reg->buff = buff;
  reg->size = size;
  pthread_mutex_lock(&comm->lock);
  reg->next = comm->regs;
  comm->regs = reg;
  pthread_mutex_unlock(&comm->lock);
  INFO(BRAID_LOG_REG, "rank %d registered %p (%zu bytes); it is copied through the FIFOs like any "
       "buffer (no in-place algorithm yet)", comm->rank, buff, size);
  *handle = reg;
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle))

NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  ncclResult_t res = ncclSuccess;
  struct braid_reg** link;
  braid_err_clear();
  BRAID_TRY(comm_check(comm, "ncclCommDeregister"));
  BRAID_CHECK(handle != NULL, ncclInvalidArgument, "ncclCommDeregister: handle is NULL");
  pthread_mutex_lock(&comm->lock);
  for (link = &comm->regs; *link && *link != handle; link = &(*link)->next) {
  }
  struct braid_reg* reg = *link;
  if (reg) *link = reg->next;
  pthread_mutex_unlock(&comm->lock);
  BRAID_CHECK(reg != NULL, ncclInvalidArgument,
              "ncclCommDeregister: handle %p is not a registration of rank %d's communicator "
              "(already deregistered, or made by another communicator)",
              handle, comm->rank);
  reg->magic = 0;
  free(reg);
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle))

void register_free_all(struct ncclComm* comm) {
  while (comm->regs) {
    struct braid_reg* next = comm->regs->next;
    comm->regs->magic = 0;
    free(comm->regs);
    comm->regs = next;
  }
}
