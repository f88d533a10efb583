/*
 * The device API's host side (nccl_device.h): teams, the requirements a device communicator is
 * made from, and ncclDevCommCreate/Destroy. A device communicator is a resource window (window.c)
 * and the structure NCCL's inline code reads (abi/dev_api.h); window.h says more.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "abi/dev_api.h"
#include "base/debug.h"
#include "base/utils.h"
#include "runtime/comm.h"
#include "runtime/group.h"
#include "runtime/window.h"
#include "runtime/window_internal.h"
#include "transport/ipc.h"

#define NCCL_API __attribute__((visibility("default")))
#define NCCL_ALIAS(ret, name, params) NCCL_API ret p##name params __attribute__((alias(#name)));

/* ---------------------------------------------------------------- teams */

static struct devapi_team team_of(ncclComm_t comm, int which) {
  struct devapi_team t = {0, 0, 1};
  if (comm_check(comm, "ncclTeam") != ncclSuccess || comm->state != BRAID_COMM_READY) return t;
  int lsa_size, lsa_rank;
  window_lsa(comm, &lsa_size, &lsa_rank);
  if (which == 0) t = (struct devapi_team){comm->nranks, comm->rank, 1};
  if (which == 1) t = (struct devapi_team){lsa_size, lsa_rank, 1};
  if (which == 2) t = (struct devapi_team){comm->nranks / lsa_size, comm->rank / lsa_size, lsa_size};
  return t;
}

NCCL_API struct devapi_team ncclTeamWorld(ncclComm_t comm) { return team_of(comm, 0); }
NCCL_ALIAS(struct devapi_team, ncclTeamWorld, (ncclComm_t comm))
NCCL_API struct devapi_team ncclTeamLsa(ncclComm_t comm) { return team_of(comm, 1); }
NCCL_ALIAS(struct devapi_team, ncclTeamLsa, (ncclComm_t comm))
NCCL_API struct devapi_team ncclTeamRail(ncclComm_t comm) { return team_of(comm, 2); }
NCCL_ALIAS(struct devapi_team, ncclTeamRail, (ncclComm_t comm))

NCCL_API int ncclTeamRankToWorld(ncclComm_t comm, struct devapi_team team, int rank) {
  return comm_check(comm, "ncclTeamRankToWorld") == ncclSuccess
             ? comm->rank + (rank - team.rank) * team.stride
             : -1;
}
NCCL_ALIAS(int, ncclTeamRankToWorld, (ncclComm_t comm, struct devapi_team team, int rank))

NCCL_API int ncclTeamRankToLsa(ncclComm_t comm, struct devapi_team team, int rank) {
  int lsa_size, lsa_rank;
  if (comm_check(comm, "ncclTeamRankToLsa") != ncclSuccess) return -1;
  window_lsa(comm, &lsa_size, &lsa_rank);
  return lsa_rank + (rank - team.rank) * team.stride;
}
NCCL_ALIAS(int, ncclTeamRankToLsa, (ncclComm_t comm, struct devapi_team team, int rank))

/* ---------------------------------------------------------------- requirements */

NCCL_API int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  return maxElts * ((maxEltSize + 7) / 8); /* a slot carries 8 bytes of payload */
}
NCCL_ALIAS(int, ncclLLA2ACalcSlots, (int maxElts, int maxEltSize))

NCCL_API ncclResult_t ncclLsaBarrierCreateRequirement(struct devapi_team team, int nBarriers,
                                                      struct devapi_lsa_barrier* outHandle,
                                                      struct devapi_resource_req* outReq) {
  ncclResult_t res = ncclSuccess;
  braid_err_clear();
  BRAID_CHECK(outHandle != NULL && outReq != NULL, ncclInvalidArgument,
              "ncclLsaBarrierCreateRequirement: %s is NULL", outHandle ? "outReq" : "outHandle");
  BRAID_CHECK(nBarriers >= 0 && team.nranks > 0, ncclInvalidArgument,
              "ncclLsaBarrierCreateRequirement: nBarriers = %d, team of %d ranks", nBarriers,
              team.nranks);
  memset(outReq, 0, sizeof *outReq);
  /* Per barrier: two epochs (multicast, unicast), a multicast inbox, one inbox per member. */
  outHandle->buf = 0;
  outHandle->nbarriers = nBarriers;
  outReq->buffer_size = (size_t)nBarriers * (3 + (size_t)team.nranks) * sizeof(uint32_t);
  outReq->buffer_align = DEVAPI_RESOURCE_UNIT;
  outReq->out_buffer_handle = &outHandle->buf;
  return ncclSuccess;
fail:
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclLsaBarrierCreateRequirement,
           (struct devapi_team team, int nBarriers, struct devapi_lsa_barrier* outHandle,
            struct devapi_resource_req* outReq))

NCCL_API ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots,
                                                 struct devapi_lla2a* outHandle,
                                                 struct devapi_resource_req* outReq) {
  ncclResult_t res = ncclSuccess;
  braid_err_clear();
  BRAID_CHECK(outHandle != NULL && outReq != NULL, ncclInvalidArgument,
              "ncclLLA2ACreateRequirement: %s is NULL", outHandle ? "outReq" : "outHandle");
  BRAID_CHECK(nBlocks >= 0 && nSlots >= 0, ncclInvalidArgument,
              "ncclLLA2ACreateRequirement: nBlocks = %d, nSlots = %d", nBlocks, nSlots);
  memset(outReq, 0, sizeof *outReq);
  /* Per block: one line for its epoch, then two generations of nSlots 16-byte lines. */
  outHandle->buf = 0;
  outHandle->nslots = (uint32_t)nSlots;
  outReq->buffer_size = (size_t)nBlocks * (1 + 2 * (size_t)nSlots) * 16;
  outReq->buffer_align = DEVAPI_RESOURCE_UNIT;
  outReq->out_buffer_handle = &outHandle->buf;
  return ncclSuccess;
fail:
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclLLA2ACreateRequirement,
           (int nBlocks, int nSlots, struct devapi_lla2a* outHandle,
            struct devapi_resource_req* outReq))

/* ---------------------------------------------------------------- device communicators */

/*
 * What Braid cannot give: GPU-initiated networking and multicast. Barriers across the rail
 * team are GIN's, except where the rail is this rank alone (every rank in the LSA team): there
 * they meet nobody, and their handles are made like the LSA ones (PyTorch asks for them on
 * any machine).
 */
static ncclResult_t devcomm_refused(const struct devapi_comm_req* q, int rail_size) {
  const char* field = NULL;
  if (q->rail_gin_barrier_count > 0 && rail_size > 1) field = "railGinBarrierCount (across hosts)";
  else if (q->gin_force_enable) field = "ginForceEnable";
  else if (q->gin_signal_count > 0) field = "ginSignalCount";
  else if (q->gin_counter_count > 0) field = "ginCounterCount";
  else if (q->barrier_count > 0 && rail_size > 1) field = "barrierCount (across hosts)";
  if (field == NULL)
    for (const struct devapi_resource_req* r = q->resource_requirements; r && !field; r = r->next)
      if (r->gin_signal_count > 0 || r->gin_counter_count > 0)
        field = "a resource requirement's ginSignalCount/ginCounterCount";
  if (field)
    return braid_err(ncclInvalidUsage, "ncclDevCommCreate: reqs->%s asks for GIN (GPU-initiated "
                     "networking), which Braid does not offer", field);
  if (q->lsa_multimem) field = "lsaMultimem";
  for (const struct devapi_team_req* t = q->team_requirements; t && !field; t = t->next)
    if (t->multimem) field = "a team requirement's multimem";
  if (field)
    return braid_err(ncclInvalidUsage, "ncclDevCommCreate: reqs->%s asks for multimem (NVLink "
                     "multicast), which Braid does not offer", field);
  return ncclSuccess;
}

static ncclResult_t devcomm_create(ncclComm_t comm, const struct devapi_comm_req* reqs,
                                   struct devapi_comm* outDevComm) {
  ncclResult_t res = ncclSuccess;
  struct devcomm* dc = NULL;
  void* mem = NULL;
  braid_err_clear();
  BRAID_TRY(comm_check_ready(comm, "ncclDevCommCreate"));
  BRAID_CHECK(reqs != NULL, ncclInvalidArgument, "ncclDevCommCreate: reqs is NULL");
  BRAID_CHECK(outDevComm != NULL, ncclInvalidArgument, "ncclDevCommCreate: outDevComm is NULL");
  BRAID_CHECK(reqs->lsa_barrier_count >= 0 && reqs->barrier_count >= 0, ncclInvalidArgument,
              "ncclDevCommCreate: reqs->lsaBarrierCount = %d, barrierCount = %d",
              reqs->lsa_barrier_count, reqs->barrier_count);
  struct braid_windows* w = windows_of(comm);
  BRAID_CHECK(w != NULL, ncclSystemError, "out of host memory for the window state");
  BRAID_TRY(devcomm_refused(reqs, comm->nranks / w->lsa_size));

  BRAID_CUDA_TRY(cudaSetDevice(comm->cuda_dev));

  /* The resource window: the caller's requirements in list order, then the LSA barriers. */
  size_t total = 0;
  for (const struct devapi_resource_req* r = reqs->resource_requirements; r; r = r->next) {
    size_t align = r->buffer_align > DEVAPI_RESOURCE_UNIT ? r->buffer_align
                                                             : DEVAPI_RESOURCE_UNIT;
    BRAID_CHECK((align & (align - 1)) == 0, ncclInvalidArgument,
                "ncclDevCommCreate: a resource requirement's bufferAlign = %zu is not a power of "
                "two", r->buffer_align);
    total = BRAID_ALIGN_UP(total, align) + BRAID_ALIGN_UP(r->buffer_size, DEVAPI_RESOURCE_UNIT);
  }
  const int nbarriers = reqs->lsa_barrier_count > reqs->barrier_count ? reqs->lsa_barrier_count
                                                                      : reqs->barrier_count;
  const size_t barrier_at = total;
  total += BRAID_ALIGN_UP((size_t)nbarriers * (3 + (size_t)w->lsa_size) * sizeof(uint32_t),
                          DEVAPI_RESOURCE_UNIT);
  /* The rail barriers' epochs, one word per GIN context each (a one-rank rail: see above); a
   * world barrier (barrierCount) uses the rail's handle too. */
  const int nrail = reqs->rail_gin_barrier_count > reqs->barrier_count
                        ? reqs->rail_gin_barrier_count
                        : reqs->barrier_count;
  const size_t rail_at = total;
  total += BRAID_ALIGN_UP((size_t)nrail * DEVAPI_GIN_MAX_CONTEXTS * sizeof(uint32_t),
                          DEVAPI_RESOURCE_UNIT);
  if (total == 0) total = DEVAPI_RESOURCE_UNIT;
  BRAID_CHECK(total / DEVAPI_RESOURCE_UNIT <= UINT32_MAX, ncclInvalidArgument,
              "ncclDevCommCreate: the requirements ask for %zu bytes of resources", total);
  /* Zeroed: the barriers' and LL all-to-all's epochs start from zero. A failure here still
   * takes part in the registration (as its reason), so that no other rank waits for this one. */
  ncclResult_t prep = ipc_user_alloc(&mem, total); /* zeroed */
  if (prep == ncclSuccess && (dc = calloc(1, sizeof *dc)) == NULL)
    prep = braid_err(ncclSystemError, "out of host memory for a device communicator");
  struct win* res_win = NULL;
  res = win_register(comm, mem, total, NCCL_WIN_COLL_SYMMETRIC, 1, prep, &res_win);
  if (res != ncclSuccess) goto fail;
  dc->magic = DEVCOMM_MAGIC;
  dc->res_mem = mem;
  dc->res = res_win;
  mem = NULL;

  size_t at = 0;
  for (const struct devapi_resource_req* r = reqs->resource_requirements; r; r = r->next) {
    size_t align = r->buffer_align > DEVAPI_RESOURCE_UNIT ? r->buffer_align
                                                             : DEVAPI_RESOURCE_UNIT;
    at = BRAID_ALIGN_UP(at, align);
    if (r->out_buffer_handle) *r->out_buffer_handle = (uint32_t)(at / DEVAPI_RESOURCE_UNIT);
    at += BRAID_ALIGN_UP(r->buffer_size, DEVAPI_RESOURCE_UNIT);
  }
  pthread_mutex_lock(&w->lock);
  if (w->ntables == 0) res = table_put(w, NULL); /* the table exists before any window */
  struct devapi_window_table* table = w->ntables ? w->tables[0] : NULL;
  pthread_mutex_unlock(&w->lock);
  BRAID_TRY(res);

  struct devapi_comm d;
  memset(&d, 0, sizeof d);
  d.rank = comm->rank;
  d.nranks = comm->nranks;
  d.nranks_rcp32 = devapi_rcp32((uint32_t)comm->nranks);
  d.lsa_rank = w->lsa_rank;
  d.lsa_size = w->lsa_size;
  d.lsa_size_rcp32 = devapi_rcp32((uint32_t)w->lsa_size);
  d.window_table = table;
  d.resource_window = dc->res->dev;
  d.resource_window_inlined = dc->res->host;
  d.lsa_barrier.buf = (uint32_t)(barrier_at / DEVAPI_RESOURCE_UNIT);
  d.lsa_barrier.nbarriers = nbarriers;
  if (nrail > 0) d.rail_gin_barrier.buf = (uint32_t)(rail_at / DEVAPI_RESOURCE_UNIT);
  *outDevComm = d;

  pthread_mutex_lock(&w->lock);
  dc->next = w->devcomms;
  w->devcomms = dc;
  pthread_mutex_unlock(&w->lock);
  INFO(BRAID_LOG_REG, "rank %d: device communicator with %zu bytes of resources, %d LSA "
       "barriers, LSA team of %d", comm->rank, total, nbarriers, w->lsa_size);
  return ncclSuccess;
fail:
  if (dc && dc->res) win_release(w, dc->res);
  if (dc && dc->res_mem) (void)ipc_user_free(dc->res_mem);
  else if (mem) (void)ipc_user_free(mem);
  free(dc);
  return res;
}

/* A device communicator deferred to the end of the caller's group, as a window registration. */
struct devcomm_job {
  struct ncclComm* comm;
  struct devapi_comm_req reqs; /* a copy; the lists it points to are read at the group's end */
  struct devapi_comm* out;
};

static ncclResult_t devcomm_job_run(struct braid_init_job* job) {
  struct devcomm_job* a = job->arg;
  ncclResult_t res = devcomm_create(a->comm, &a->reqs, a->out);
  comm_error_record(a->comm, res);
  return res;
}

NCCL_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, const struct devapi_comm_req* reqs,
                                        struct devapi_comm* outDevComm) {
  braid_err_clear();
  if (group_depth() > 0 && reqs != NULL && outDevComm != NULL &&
      comm_check_ready(comm, "ncclDevCommCreate") == ncclSuccess) {
    struct devcomm_job a = {.comm = comm, .reqs = *reqs, .out = outDevComm};
    return defer_to_group_end(comm, devcomm_job_run, &a, sizeof a, "ncclDevCommCreate");
  }
  enum cudaStreamCaptureMode mode = capture_relax();
  ncclResult_t res = devcomm_create(comm, reqs, outDevComm);
  capture_restore(mode);
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclDevCommCreate, (ncclComm_t comm, const struct devapi_comm_req* reqs,
           struct devapi_comm* outDevComm))

void devcomm_free(struct braid_windows* w, struct devcomm* dc) {
  if (dc->res) win_release(w, dc->res);
  if (dc->res_mem && ipc_user_free(dc->res_mem) != ncclSuccess)
    WARN("freeing a device communicator's resources failed: %s", braid_err_last());
  dc->magic = 0;
  free(dc);
}

NCCL_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const struct devapi_comm* devComm) {
  ncclResult_t res = ncclSuccess;
  struct devcomm* found = NULL;
  braid_err_clear();
  BRAID_TRY(comm_check(comm, "ncclDevCommDestroy"));
  BRAID_CHECK(devComm != NULL, ncclInvalidArgument, "ncclDevCommDestroy: devComm is NULL");
  if (devComm->resource_window == NULL) return ncclSuccess; /* never made: nothing to free */
  struct braid_windows* w = __atomic_load_n(&comm->windows, __ATOMIC_ACQUIRE);
  if (w) {
    pthread_mutex_lock(&w->lock);
    for (struct devcomm** p = &w->devcomms; *p; p = &(*p)->next) {
      if ((*p)->res && (*p)->res->dev == devComm->resource_window) {
        found = *p;
        *p = found->next;
        break;
      }
    }
    pthread_mutex_unlock(&w->lock);
  }
  BRAID_CHECK(found != NULL, ncclInvalidArgument,
              "ncclDevCommDestroy: devComm %p is not a device communicator of rank %d's "
              "communicator (destroyed already, or made by another communicator)",
              (const void*)devComm, comm->rank);
  BRAID_CUDA_TRY(cudaSetDevice(comm->cuda_dev));
  enum cudaStreamCaptureMode mode = capture_relax();
  devcomm_free(w, found);
  capture_restore(mode);
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclDevCommDestroy, (ncclComm_t comm, const struct devapi_comm* devComm))

