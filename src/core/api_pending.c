/*
 * NCCL API entry points whose capability comes in a later milestone of
 * Braid. Each is exported (so programs linked against NCCL load) and
 * returns ncclInvalidUsage with a message that names what is missing; none
 * pretends to succeed. Each one moves to its own module when implemented.
 */
#include "core/comm.h"
#include "core/debug.h"

#define NCCL_API __attribute__((visibility("default")))
#define NCCL_ALIAS(ret, name, params) NCCL_API ret p##name params __attribute__((alias(#name)));

static ncclResult_t pending(const char* api, const char* what) {
  braid_err_clear();
  return braid_err(ncclInvalidUsage, "%s is not implemented in this version of Braid (%s)", api, what);
}

/*
 * The device-initiated API of nccl_device.h. The argument types are opaque
 * here: only the symbols matter to programs that link them.
 */
NCCL_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm) {
  return pending("ncclDevCommCreate", "the device-initiated communication API");
}
NCCL_ALIAS(ncclResult_t, ncclDevCommCreate, (ncclComm_t comm, const void* reqs, void* outDevComm))

NCCL_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm) {
  return pending("ncclDevCommDestroy", "the device-initiated communication API");
}
NCCL_ALIAS(ncclResult_t, ncclDevCommDestroy, (ncclComm_t comm, const void* devComm))
