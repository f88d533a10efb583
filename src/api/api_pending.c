/*
 * NCCL API entry points whose capability Braid does not have yet. Each is
 * exported (so programs linked against NCCL load) and returns
 * ncclInvalidUsage with a message that names what is missing; none pretends
 * to succeed. Each one moves to its own module when implemented.
 */
#include "abi/dev_api.h"
#include "runtime/comm.h"
#include "base/debug.h"

#define NCCL_API __attribute__((visibility("default")))
#define NCCL_ALIAS(ret, name, params) NCCL_API ret p##name params __attribute__((alias(#name)));

static ncclResult_t pending(const char* api, const char* what) {
  braid_err_clear();
  return braid_err(ncclInvalidUsage, "%s is not implemented in this version of Braid (%s)", api, what);
}

/* GPU-initiated networking (GIN) of nccl_device.h. */
NCCL_API ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, struct devapi_team team,
                                                      int nBarriers, void* outHandle,
                                                      void* outReq) {
  return pending("ncclGinBarrierCreateRequirement", "GPU-initiated networking (GIN)");
}
NCCL_ALIAS(ncclResult_t, ncclGinBarrierCreateRequirement,
           (ncclComm_t comm, struct devapi_team team, int nBarriers, void* outHandle, void* outReq))
