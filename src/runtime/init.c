/*
 * The NCCL API for communicator lifecycle and queries: unique ids, init (one
 * rank, all local GPUs, scalable), finalize, destroy, abort, and the small
 * accessors. Each entry checks its arguments and says precisely what is
 * wrong; the work itself is in comm.c.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "bootstrap/bootstrap.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "base/debug.h"
#include "runtime/dev_state.h"
#include "runtime/group.h"
#include "runtime/share.h"
#include "base/utils.h"

#define NCCL_API __attribute__((visibility("default")))
/* pnccl* are the same functions under the names profilers intercept. */
#define NCCL_ALIAS(ret, name, params) \
  NCCL_API ret p##name params __attribute__((alias(#name)));

static pthread_once_t banner_once = PTHREAD_ONCE_INIT;

static void init_banner(void) {
  if (braid_log_enabled(BRAID_LOG_VERSION, BRAID_LOG_INIT))
    braid_log_emit(BRAID_LOG_VERSION, BRAID_LOG_INIT, __FILE__, __LINE__, "%s",
                   braidGetVersionString());
}

NCCL_API const char* braidGetVersionString(void) {
  return "Braid " BRAID_VERSION_STRING " (NCCL API 2.28.9)";
}

NCCL_API ncclResult_t ncclGetVersion(int* version) {
  braid_err_clear();
  if (version == NULL) return braid_err(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
NCCL_ALIAS(ncclResult_t, ncclGetVersion, (int* version))

NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  braid_err_clear();
  pthread_once(&banner_once, init_banner);
  if (uniqueId == NULL) return braid_err(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  int found = 0;
  ncclResult_t res = bootstrap_id_from_env(uniqueId, &found);
  if (res != ncclSuccess || found) return res;
  return bootstrap_get_unique_id(uniqueId);
}
NCCL_ALIAS(ncclResult_t, ncclGetUniqueId, (ncclUniqueId* uniqueId))

/* ---- init -------------------------------------------------------------------------------- */

struct init_args {
  int nids;
  ncclUniqueId ids[]; /* nids of them */
};

static ncclResult_t init_job_run(struct braid_init_job* job) {
  struct init_args* args = job->arg;
  return comm_init(job->comm, args->ids, args->nids);
}

static ncclResult_t init_check_args(ncclComm_t* newcomm, int nranks, int rank, const char* api) {
  if (newcomm == NULL) return braid_err(ncclInvalidArgument, "%s: comm is NULL", api);
  *newcomm = NULL;
  if (nranks < 1)
    return braid_err(ncclInvalidArgument, "%s: nranks = %d; it must be at least 1", api, nranks);
  if (rank < 0 || rank >= nranks)
    return braid_err(ncclInvalidArgument, "%s: rank = %d is out of range [0, %d)", api, rank,
                     nranks);
  return ncclSuccess;
}

static ncclResult_t init_current_device(int* dev, const char* api) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0)
    return braid_err(ncclUnhandledCudaError, "%s: no usable CUDA device (%s)", api,
                     err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0");
  err = cudaGetDevice(dev);
  if (err != cudaSuccess)
    return braid_err(ncclUnhandledCudaError, "%s: cudaGetDevice failed: %s", api,
                     cudaGetErrorString(err));
  return ncclSuccess;
}

/*
 * Common body of the init entry points: allocate the comm, then run the init
 * now (blocking), on a thread (nonblocking), or at ncclGroupEnd (in a group).
 */
static ncclResult_t init_start(ncclComm_t* newcomm, int nranks, int rank, int nids,
                               const ncclUniqueId* ids, const ncclConfig_t* config,
                               const char* api) {
  ncclResult_t res = ncclSuccess;
  struct braid_config cfg;
  struct ncclComm* comm = NULL;
  struct braid_init_job* job = NULL;
  struct init_args* args = NULL;
  int dev = -1;
  pthread_once(&banner_once, init_banner);
  BRAID_TRY(init_check_args(newcomm, nranks, rank, api));
  BRAID_TRY(config_resolve_api(config, &cfg, api));
  BRAID_TRY(bootstrap_ids_validate(ids, nids, nranks, api));
  BRAID_TRY(init_current_device(&dev, api));
  BRAID_TRY(comm_alloc(&comm, rank, nranks, dev, &cfg));
  BRAID_TRY(BRAID_CALLOC(&job, 1, "init job"));
  BRAID_TRY(braid_calloc((void**)&args, 1, sizeof *args + (size_t)nids * sizeof(ncclUniqueId),
                         "init arguments"));
  args->nids = nids;
  memcpy(args->ids, ids, (size_t)nids * sizeof(ncclUniqueId));
  job->comm = comm;
  job->run = init_job_run;
  job->arg = args;
  *newcomm = comm;
  res = group_job_dispatch(job, cfg.blocking, api); /* owns job and args now */
  if (res != ncclSuccess && res != ncclInProgress) {
    comm_free(comm);
    *newcomm = NULL;
  }
  return res;
fail:
  free(args);
  free(job);
  if (comm) comm_free(comm);
  if (newcomm) *newcomm = NULL;
  if (group_depth() > 0) group_fail(res); /* the group's end fails too, and runs nothing */
  return res;
}

NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                             int rank, ncclConfig_t* config) {
  braid_err_clear();
  return init_start(comm, nranks, rank, 1, &commId, config, "ncclCommInitRankConfig");
}
NCCL_ALIAS(ncclResult_t, ncclCommInitRankConfig,
           (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config))

NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  braid_err_clear();
  return init_start(comm, nranks, rank, 1, &commId, NULL, "ncclCommInitRank");
}
NCCL_ALIAS(ncclResult_t, ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank))

NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                               ncclUniqueId* commIds, ncclConfig_t* config) {
  braid_err_clear();
  if (nId < 1 || nId > nranks)
    return braid_err(ncclInvalidArgument,
                     "ncclCommInitRankScalable: nId = %d; it must be in [1, nranks = %d]", nId, nranks);
  if (commIds == NULL)
    return braid_err(ncclInvalidArgument, "ncclCommInitRankScalable: commIds is NULL");
  return init_start(newcomm, nranks, myrank, nId, commIds, config, "ncclCommInitRankScalable");
}
NCCL_ALIAS(ncclResult_t, ncclCommInitRankScalable,
           (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
            ncclConfig_t* config))

static ncclResult_t init_all_check(ncclComm_t* comms, int ndev, const int* devlist) {
  int count = 0;
  if (comms == NULL) return braid_err(ncclInvalidArgument, "ncclCommInitAll: comm is NULL");
  if (ndev < 1)
    return braid_err(ncclInvalidArgument, "ncclCommInitAll: ndev = %d; it must be at least 1", ndev);
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return braid_err(ncclUnhandledCudaError, "ncclCommInitAll: no usable CUDA device (%s)",
                     cudaGetErrorString(err));
  if (devlist == NULL && ndev > count)
    return braid_err(ncclInvalidArgument,
                     "ncclCommInitAll: ndev = %d but only %d CUDA devices are visible", ndev, count);
  for (int i = 0; devlist && i < ndev; i++) {
    if (devlist[i] < 0 || devlist[i] >= count)
      return braid_err(ncclInvalidArgument,
                       "ncclCommInitAll: devlist[%d] = %d is not a device (%d visible)", i,
                       devlist[i], count);
    for (int j = 0; j < i; j++)
      if (devlist[j] == devlist[i])
        return braid_err(ncclInvalidArgument,
                         "ncclCommInitAll: devlist[%d] and devlist[%d] are both device %d", j, i,
                         devlist[i]);
  }
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  ncclResult_t res = ncclSuccess;
  ncclUniqueId id;
  int saved_dev = -1;
  braid_err_clear();
  BRAID_TRY(init_all_check(comms, ndev, devlist));
  for (int i = 0; i < ndev; i++) comms[i] = NULL; /* the failure path frees what was made */
  BRAID_TRY(ncclGetUniqueId(&id));
  BRAID_CUDA_TRY(cudaGetDevice(&saved_dev));
  BRAID_TRY(group_start());
  for (int i = 0; i < ndev; i++) {
    cudaError_t err = cudaSetDevice(devlist ? devlist[i] : i);
    res = err == cudaSuccess ? ncclCommInitRank(comms + i, ndev, id, i)
                             : braid_err(ncclUnhandledCudaError, "ncclCommInitAll: cannot use "
                                         "device %d: %s", devlist ? devlist[i] : i,
                                         cudaGetErrorString(err));
    if (res != ncclSuccess) {
      group_fail(res); /* the group still ends below: its depth goes back */
      break;
    }
  }
  res = group_end();
  cudaSetDevice(saved_dev);
  if (res != ncclSuccess) {
    for (int i = 0; i < ndev; i++) {
      if (comms[i]) comm_free(comms[i]);
      comms[i] = NULL;
    }
  }
  return res;
fail:
  if (saved_dev >= 0) cudaSetDevice(saved_dev);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommInitAll, (ncclComm_t * comms, int ndev, const int* devlist))

/* ---- teardown ---------------------------------------------------------------------------- */

/*
 * An init still running on its own thread (nonblocking mode) must finish
 * before teardown, and so must the splits still reading this comm as their
 * parent.
 */
static void teardown_wait_init(struct ncclComm* comm) {
  while (comm->state == BRAID_COMM_INITIALIZING ||
         __atomic_load_n(&comm->children_pending, __ATOMIC_ACQUIRE) > 0)
    usleep(100);
}

/*
 * An abort from another thread than one inside ncclGroupEnd with this comm (connecting over
 * the bootstrap, launching): the flags just raised make it leave soon; free nothing under it.
 */
#define TEARDOWN_GROUP_END_WAIT_S 10.0
/* 0 once no group end holds the comm; -1 if one still does after the wait (it must not go). */
static int teardown_wait_group_end(struct ncclComm* comm) {
  double start = braid_time_sec();
  while (__atomic_load_n(&comm->in_group_end, __ATOMIC_ACQUIRE) > 0) {
    if (braid_time_sec() - start > TEARDOWN_GROUP_END_WAIT_S) {
      WARN(
          "ncclCommAbort: rank %d: a thread is still inside ncclGroupEnd with this communicator "
          "after %.0f s; the handle is retired, but its memory is kept (not freed under that "
          "thread)",
          comm->rank, TEARDOWN_GROUP_END_WAIT_S);
      return -1;
    }
    usleep(100);
  }
  return 0;
}

static ncclResult_t teardown_check(struct ncclComm* comm, const char* api) {
  ncclResult_t res = comm_check(comm, api);
  if (res != ncclSuccess) return res;
  if (comm->group != NULL)
    return braid_err(ncclInvalidUsage,
                     "%s: rank %d's communicator has operations pending in an open group; call "
                     "ncclGroupEnd first",
                     api, comm->rank);
  if (group_has_init(comm)) /* its init runs at this thread's ncclGroupEnd: waiting would hang */
    return braid_err(ncclInvalidUsage,
                     "%s: rank %d's communicator is still to be initialized by this thread's open "
                     "group; call ncclGroupEnd first",
                     api, comm->rank);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  braid_err_clear();
  if (comm == NULL) return ncclSuccess; /* as NCCL's */
  BRAID_TRY(teardown_check(comm, "ncclCommFinalize"));
  teardown_wait_init(comm);
  BRAID_CHECK(comm->state != BRAID_COMM_FINALIZED, ncclInvalidArgument,
              "ncclCommFinalize: rank %d's communicator is finalized already", comm->rank);
  BRAID_CUDA_TRY(cudaSetDevice(comm->cuda_dev));
  BRAID_TRY(dev_state_wait_idle(comm));
  if (comm->state == BRAID_COMM_READY) comm->state = BRAID_COMM_FINALIZED;
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))

NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  int saved_dev = -1;
  braid_err_clear();
  if (comm == NULL) return ncclSuccess; /* NCCL accepts destroying a NULL communicator */
  BRAID_TRY(teardown_check(comm, "ncclCommDestroy"));
  teardown_wait_init(comm);
  cudaGetDevice(&saved_dev);
  BRAID_CUDA_TRY(cudaSetDevice(comm->cuda_dev));
  /* Our kernels must finish before our FIFOs go; peers never write into them afterwards. */
  res = dev_state_wait_idle(comm);
  INFO(BRAID_LOG_INIT, "comm %p rank %d nranks %d - Destroy COMPLETE", (void*)comm, comm->rank,
       comm->nranks);
  comm_free(comm);
  if (saved_dev >= 0) cudaSetDevice(saved_dev);
  return res;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))

/*
 * An abort slower than this says where its time went (WARN): the kernels' exit (drain), the
 * watchdog's thread, the device state's frees (cudaFree waits for the whole device), the
 * connections (the proxy's, the peers' mappings).
 */
#define TEARDOWN_ABORT_SLOW_S 0.5
/*
 * How long an abort waits for its kernels to leave on the abort flag. They poll it in every
 * wait loop, so they leave within microseconds of reading it; kernels still there after this
 * are stuck (a launch queued behind work that never ends), and waiting longer would only break
 * the promise that an abort returns within a second.
 */
#define TEARDOWN_ABORT_DRAIN_S 0.5

static void teardown_abort_report(int rank, int dev, const double t[4],
                                  const struct comm_free_times* f) {
  double total = t[3] - t[0];
  char text[384];
  snprintf(text, sizeof text,
           "ncclCommAbort: rank %d (device %d) took %.3f s: stopping, and waiting for its init "
           "and group ends, %.3f; its kernels' exit %.3f; freeing %.3f (watchdog %.3f, copy "
           "engines %.3f, device state %.3f, connections %.3f, the rest %.3f)",
           rank, dev, total, t[1] - t[0], t[2] - t[1], t[3] - t[2], f->watchdog, f->ce,
           f->dev_state, f->transport, f->rest);
  if (total > TEARDOWN_ABORT_SLOW_S)
    WARN("%s", text);
  else
    INFO(BRAID_LOG_INIT, "%s", text);
}

NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  int saved_dev = -1;
  double t[4];
  struct comm_free_times freed;
  braid_err_clear();
  if (comm == NULL) return ncclSuccess;
  BRAID_TRY(comm_check(comm, "ncclCommAbort"));
  t[0] = braid_time_sec();
  /* Every kernel wait loop and every bootstrap wait polls these. */
  cudaGetDevice(&saved_dev); /* before group_forget, which may switch devices */
  comm_stop(comm, "aborted");
  if (comm->bootstrap) bootstrap_abort(comm->bootstrap);
  /* In this thread's open group (its operations, or its init still to run): out of it first,
     or the group's end would find a freed comm, and the init wait below never end. */
  group_forget(comm); /* a pending init of it is dropped, the comm marked failed */
  teardown_wait_init(comm);
  if (teardown_wait_group_end(comm) != 0) {
    comm_retire(comm); /* refused from now on, like a freed one; a leak over a use after free */
    if (saved_dev >= 0) cudaSetDevice(saved_dev);
    return ncclSuccess;
  }
  t[1] = braid_time_sec();
  /* The kernels see the flag in their wait loops and exit; their buffers go after them. Those
     that do not within TEARDOWN_ABORT_DRAIN_S keep their buffers (comm_free: nothing that would
     wait for them is called), so the abort returns all the same. */
  if (cudaSetDevice(comm->cuda_dev) == cudaSuccess &&
      dev_state_drain(comm, TEARDOWN_ABORT_DRAIN_S) != ncclSuccess)
    WARN("%s", braid_err_last());
  t[2] = braid_time_sec();
  INFO(BRAID_LOG_INIT, "comm %p rank %d nranks %d - Abort COMPLETE", (void*)comm, comm->rank,
       comm->nranks);
  const int rank = comm->rank, dev = comm->cuda_dev;
  comm_free_timed(comm, &freed);
  t[3] = braid_time_sec();
  teardown_abort_report(rank, dev, t, &freed);
  if (saved_dev >= 0) cudaSetDevice(saved_dev);
  return ncclSuccess;
fail:
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommAbort, (ncclComm_t comm))

/* ---- queries ----------------------------------------------------------------------------- */

/* A refusal is recorded on the communicator too, for ncclGetLastError(comm). */
#define QUERY_CHECK(comm, out, api)                                         \
  do {                                                                      \
    ncclResult_t q_ = comm_check((comm), api);                              \
    if (q_ == ncclSuccess && (out) == NULL)                                 \
      q_ = braid_err(ncclInvalidArgument, "%s: %s is NULL", api, #out);     \
    if (q_ != ncclSuccess) {                                                \
      comm_error_record((comm), q_);                                        \
      return q_;                                                            \
    }                                                                       \
  } while (0)

NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  braid_err_clear();
  QUERY_CHECK(comm, count, "ncclCommCount");
  *count = comm->nranks;
  return ncclSuccess;
}
NCCL_ALIAS(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count))

NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  braid_err_clear();
  QUERY_CHECK(comm, device, "ncclCommCuDevice");
  *device = comm->cuda_dev;
  return ncclSuccess;
}
NCCL_ALIAS(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device))

NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  braid_err_clear();
  QUERY_CHECK(comm, rank, "ncclCommUserRank");
  *rank = comm->rank;
  return ncclSuccess;
}
NCCL_ALIAS(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank))

NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  braid_err_clear();
  QUERY_CHECK(comm, asyncError, "ncclCommGetAsyncError");
  ncclResult_t async = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
  /* The init clears async_error just before the comm turns READY: until then, still going. */
  if (async == ncclSuccess &&
      __atomic_load_n(&comm->state, __ATOMIC_ACQUIRE) == BRAID_COMM_INITIALIZING)
    async = ncclInProgress;
  *asyncError = async;
  return ncclSuccess;
}
NCCL_ALIAS(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t* asyncError))

NCCL_API const char* ncclGetErrorString(ncclResult_t result) { return braid_result_str(result); }
NCCL_ALIAS(const char*, ncclGetErrorString, (ncclResult_t result))

NCCL_API const char* ncclGetLastError(ncclComm_t comm) {
  if (comm_is_live(comm) && comm->last_error[0] != '\0')
    return comm->last_error;
  return braid_err_last();
}
NCCL_ALIAS(const char*, ncclGetLastError, (ncclComm_t comm))

NCCL_API void ncclResetDebugInit(void) { braid_log_reset(); }
NCCL_ALIAS(void, ncclResetDebugInit, (void))
