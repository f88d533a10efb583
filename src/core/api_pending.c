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

NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                    ncclConfig_t* config) {
  if (newcomm) *newcomm = NULL;
  return pending("ncclCommSplit", "communicator split");
}
NCCL_ALIAS(ncclResult_t, ncclCommSplit, (ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
           ncclConfig_t* config))

NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                     ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  if (newcomm) *newcomm = NULL;
  return pending("ncclCommShrink", "communicator shrink");
}
NCCL_ALIAS(ncclResult_t, ncclCommShrink, (ncclComm_t comm, int* excludeRanksList,
           int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags))

NCCL_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return pending("ncclCommRevoke", "revoking in-flight operations");
}
NCCL_ALIAS(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))

NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (handle) *handle = NULL;
  return pending("ncclCommRegister", "zero-copy buffer registration");
}
NCCL_ALIAS(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle))

NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return pending("ncclCommDeregister", "zero-copy buffer registration");
}
NCCL_ALIAS(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle))

NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                             ncclWindow_t* win, int winFlags) {
  if (win) *win = NULL;
  return pending("ncclCommWindowRegister", "symmetric memory windows");
}
NCCL_ALIAS(ncclResult_t, ncclCommWindowRegister, (ncclComm_t comm, void* buff, size_t size,
           ncclWindow_t* win, int winFlags))

NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return pending("ncclCommWindowDeregister", "symmetric memory windows");
}
NCCL_ALIAS(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))

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
