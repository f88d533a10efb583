/*
 * Test buffers, registered or not. With GPU_REGISTER=1 in the environment the collective and
 * send/receive suites take their buffers from ncclMemAlloc and register each with the
 * communicator of the call (ncclCommRegister), deregistering and freeing them afterwards:
 * the same cases then run through whatever the library does with registered buffers (Braid on
 * two ranks joined by P2P: copies straight into the peer's buffer, BRAID_CE_REG_MIN_BYTES).
 */
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"

int gpu_register_on(void) {
  const char* v = getenv("GPU_REGISTER");
  return v != NULL && strcmp(v, "1") == 0;
}

int gpu_buf_alloc(struct gpu_world* w, char** p, size_t bytes) {
  if (!gpu_register_on()) return world_cuda(w, cudaMalloc((void**)p, bytes), "cudaMalloc");
  return world_nccl(w, ncclMemAlloc((void**)p, bytes), NULL, "ncclMemAlloc");
}

void gpu_buf_free(void* p) {
  if (p == NULL) return;
  if (gpu_register_on()) (void)ncclMemFree(p);
  else (void)cudaFree(p);
}

int gpu_buf_register(struct gpu_world* w, ncclComm_t comm, void* p, size_t bytes, void** handle) {
  *handle = NULL;
  if (!gpu_register_on() || p == NULL) return 0;
  if (world_nccl(w, ncclCommRegister(comm, p, bytes, handle), comm, "ncclCommRegister") != 0)
    return -1;
  if (*handle == NULL) {
    world_case_fail(w, "ncclCommRegister returned success and a NULL handle");
    return -1;
  }
  return 0;
}

void gpu_buf_deregister(struct gpu_world* w, ncclComm_t comm, void** handle) {
  if (*handle == NULL) return;
  world_nccl(w, ncclCommDeregister(comm, *handle), comm, "ncclCommDeregister");
  *handle = NULL;
}
