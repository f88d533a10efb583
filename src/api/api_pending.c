/*
 * NCCL API entry points whose capability comes in a later milestone of
 * Braid: the device-initiated API (nccl_device.h). Each is exported (so
 * programs linked against NCCL load); those that need the device API return
 * ncclInvalidUsage with a message that names what is missing, none pretends
 * to succeed; its host helpers that need none (teams, slot counts) answer.
 * Each one moves to its own module when implemented.
 */
#include "runtime/comm.h"
#include "base/debug.h"

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

/*
 * The host side of nccl_device.h that needs no device communicator: the
 * teams (as NCCL: the world; the LSA team, the ranks of this host when they
 * are consecutive and every host has as many, else this rank alone; the
 * rail, one rank per LSA team) and the LL all-to-all's slot count. They
 * answer truthfully; the requirements below need the device API and say so.
 */
struct braid_team {
  int nRanks, rank, stride; /* nccl_device/core.h's struct ncclTeam */
};

/* This rank's LSA team: its size and this rank's place in it. */
static void team_lsa(const struct ncclComm* comm, int* size, int* rank) {
  *size = 1;
  *rank = 0;
  const int n = comm->local_ranks;
  if (n <= 1 || comm->nranks % n != 0 || comm->peers == NULL) return;
  for (int r = 0; r < comm->nranks; r++) /* blocks of n consecutive ranks, one host each */
    if (comm->peers[r].host_hash != comm->peers[r - r % n].host_hash) return;
  *size = n;
  *rank = comm->rank % n;
}

static struct braid_team team_of(ncclComm_t comm, int which) {
  struct braid_team t = {0, 0, 1};
  if (comm_check(comm, "ncclTeam") != ncclSuccess || comm->state != BRAID_COMM_READY) return t;
  int lsa_size, lsa_rank;
  team_lsa(comm, &lsa_size, &lsa_rank);
  if (which == 0) t = (struct braid_team){comm->nranks, comm->rank, 1};
  if (which == 1) t = (struct braid_team){lsa_size, lsa_rank, 1};
  if (which == 2) t = (struct braid_team){comm->nranks / lsa_size, comm->rank / lsa_size, lsa_size};
  return t;
}

NCCL_API struct braid_team ncclTeamWorld(ncclComm_t comm) { return team_of(comm, 0); }
NCCL_ALIAS(struct braid_team, ncclTeamWorld, (ncclComm_t comm))
NCCL_API struct braid_team ncclTeamLsa(ncclComm_t comm) { return team_of(comm, 1); }
NCCL_ALIAS(struct braid_team, ncclTeamLsa, (ncclComm_t comm))
NCCL_API struct braid_team ncclTeamRail(ncclComm_t comm) { return team_of(comm, 2); }
NCCL_ALIAS(struct braid_team, ncclTeamRail, (ncclComm_t comm))

NCCL_API int ncclTeamRankToWorld(ncclComm_t comm, struct braid_team team, int rank) {
  return comm_check(comm, "ncclTeamRankToWorld") == ncclSuccess
             ? comm->rank + (rank - team.rank) * team.stride
             : -1;
}
NCCL_ALIAS(int, ncclTeamRankToWorld, (ncclComm_t comm, struct braid_team team, int rank))

NCCL_API int ncclTeamRankToLsa(ncclComm_t comm, struct braid_team team, int rank) {
  int lsa_size, lsa_rank;
  if (comm_check(comm, "ncclTeamRankToLsa") != ncclSuccess) return -1;
  team_lsa(comm, &lsa_size, &lsa_rank);
  return lsa_rank + (rank - team.rank) * team.stride;
}
NCCL_ALIAS(int, ncclTeamRankToLsa, (ncclComm_t comm, struct braid_team team, int rank))

NCCL_API int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  return maxElts * ((maxEltSize + 7) / 8); /* 8-byte slots, as NCCL */
}
NCCL_ALIAS(int, ncclLLA2ACalcSlots, (int maxElts, int maxEltSize))

NCCL_API ncclResult_t ncclLsaBarrierCreateRequirement(struct braid_team team, int nBarriers,
                                                      void* outHandle, void* outReq) {
  return pending("ncclLsaBarrierCreateRequirement", "the device-initiated communication API");
}
NCCL_ALIAS(ncclResult_t, ncclLsaBarrierCreateRequirement,
           (struct braid_team team, int nBarriers, void* outHandle, void* outReq))

NCCL_API ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, struct braid_team team,
                                                      int nBarriers, void* outHandle,
                                                      void* outReq) {
  return pending("ncclGinBarrierCreateRequirement", "the device-initiated communication API");
}
NCCL_ALIAS(ncclResult_t, ncclGinBarrierCreateRequirement,
           (ncclComm_t comm, struct braid_team team, int nBarriers, void* outHandle, void* outReq))

NCCL_API ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, void* outHandle,
                                                 void* outReq) {
  return pending("ncclLLA2ACreateRequirement", "the device-initiated communication API");
}
NCCL_ALIAS(ncclResult_t, ncclLLA2ACreateRequirement,
           (int nBlocks, int nSlots, void* outHandle, void* outReq))
