/*
 * The communicator object: allocation, the checks every API entry makes on
 * a handle, the init sequence (bootstrap -> peer info -> topology -> rings
 * -> device state) and teardown.
 */
#include "runtime/comm.h"

#include <stdint.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "bootstrap/bootstrap.h"
#include "runtime/ce.h"
#include "runtime/ce_fan.h"
#include "base/debug.h"
#include "runtime/dev_state.h"
#include "runtime/group.h"
#include "runtime/share.h"
#include "base/param.h"
#include "runtime/redop.h"
#include "runtime/register.h"
#include "runtime/window.h"
#include "base/utils.h"
#include "runtime/watchdog.h"
#include "runtime/topo_comm.h"
#include "runtime/profiler.h"
#include "transport/net.h"
#include "runtime/channels.h"
#include "transport/ipc.h"

/*
 * The live communicators: an open-addressing set of their addresses (linear
 * probing, deletion by backward shift). A handle the user destroyed, or never
 * had, is refused by looking it up here, never by reading through it: its
 * memory may be freed or reused.
 */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t* live_slots; /* 0 = empty */
static size_t live_cap;       /* a power of two, or 0 */
static size_t live_count;

static size_t live_home(uintptr_t p, size_t cap) {
  return (size_t)(((uint64_t)p >> 4) * 0x9E3779B97F4A7C15ULL >> 20) & (cap - 1);
}

/* The slot holding p, or the empty slot where it would go. Caller holds live_lock; live_cap > 0. */
static size_t live_find(uintptr_t p) {
  size_t i = live_home(p, live_cap);
  while (live_slots[i] != 0 && live_slots[i] != p) i = (i + 1) & (live_cap - 1);
  return i;
}

static int live_grow(void) {
  size_t cap = live_cap ? live_cap * 2 : 64;
  uintptr_t* old = live_slots;
  size_t old_cap = live_cap;
  uintptr_t* slots = calloc(cap, sizeof *slots);
  if (slots == NULL) return -1;
  live_slots = slots;
  live_cap = cap;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i] != 0) live_slots[live_find(old[i])] = old[i];
  free(old);
  return 0;
}

static ncclResult_t live_add(const struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&live_lock);
  if ((live_count + 1) * 2 > live_cap && live_grow() != 0)
    res = braid_err(ncclSystemError, "out of host memory for the table of live communicators");
  else {
    live_slots[live_find((uintptr_t)comm)] = (uintptr_t)comm;
    live_count++;
  }
  pthread_mutex_unlock(&live_lock);
  return res;
}

static void live_remove(const struct ncclComm* comm) {
  pthread_mutex_lock(&live_lock);
  size_t i = live_cap ? live_find((uintptr_t)comm) : 0;
  if (live_cap && live_slots[i] != 0) {
    live_slots[i] = 0;
    live_count--;
    /* Backward shift: move up each later entry of the run whose home is not in (i, j]. */
    for (size_t j = (i + 1) & (live_cap - 1); live_slots[j] != 0; j = (j + 1) & (live_cap - 1)) {
      size_t home = live_home(live_slots[j], live_cap);
      int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      live_slots[i] = live_slots[j];
      live_slots[j] = 0;
      i = j;
    }
  }
  pthread_mutex_unlock(&live_lock);
}

int comm_is_live(const struct ncclComm* comm) {
  if (comm == NULL) return 0;
  pthread_mutex_lock(&live_lock);
  int live = live_cap && live_slots[live_find((uintptr_t)comm)] != 0;
  pthread_mutex_unlock(&live_lock);
  return live;
}

ncclResult_t comm_check(const struct ncclComm* comm, const char* api) {
  if (comm == NULL)
    return braid_err(ncclInvalidArgument, "%s: comm is NULL", api);
  if (!comm_is_live(comm) || comm->magic != BRAID_COMM_MAGIC)
    return braid_err(ncclInvalidArgument,
                     "%s: comm %p is not a live communicator (destroyed, or never created)", api,
                     (const void*)comm);
  braid_log_context_set(comm->rank, comm->cuda_dev);
  return ncclSuccess;
}

int comm_host_peers(const struct ncclComm* comm) {
  int n = 0;
  for (int r = 0; r < comm->nranks; r++)
    n += r != comm->rank && comm->peers[r].host_hash == comm->peers[comm->rank].host_hash;
  return n;
}

int comm_fail_async(struct ncclComm* comm, ncclResult_t res) {
  return comm_fail_async_why(comm, res, braid_err_last());
}

int comm_fail_async_why(struct ncclComm* comm, ncclResult_t res, const char* why) {
  ncclResult_t none = ncclSuccess;
  /* During init async_error reads ncclInProgress: a failure then counts too (comm_init). */
  if (!__atomic_compare_exchange_n((ncclResult_t*)&comm->async_error, &none, res, 0,
                                   __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    if (none != ncclInProgress ||
        !__atomic_compare_exchange_n((ncclResult_t*)&comm->async_error, &none, res, 0,
                                     __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
      return 0;
  }
  pthread_mutex_lock(&comm->lock);
  snprintf(comm->fail_error, sizeof comm->fail_error, "%s", why);
  snprintf(comm->last_error, sizeof comm->last_error, "%s", why);
  pthread_mutex_unlock(&comm->lock);
  return 1;
}

void comm_stop(struct ncclComm* comm, const char* why) {
  if (comm->abort_flag) __atomic_store_n(comm->abort_flag, 1, __ATOMIC_SEQ_CST);
  share_break(comm, why); /* and every other member's: their kernels stop too */
}

ncclResult_t comm_check_usable(const struct ncclComm* comm, const char* api) {
  ncclResult_t res = comm_check_ready(comm, api);
  if (res != ncclSuccess) return res;
  ncclResult_t async = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
  if (async == ncclSuccess || async == ncclInProgress) return ncclSuccess;
  /* As NCCL: the comm's error, not a success whose kernels leave at once on the abort flag. */
  char why[BRAID_ERROR_MAX];
  pthread_mutex_lock((pthread_mutex_t*)&comm->lock);
  snprintf(why, sizeof why, "%s", comm->fail_error[0] ? comm->fail_error : "no message was recorded");
  pthread_mutex_unlock((pthread_mutex_t*)&comm->lock);
  return braid_err(async,
                   "%s: rank %d's communicator has failed (%s: %s); abort it, or shrink it without "
                   "the failed ranks",
                   api, comm->rank, ncclGetErrorString(async), why);
}

ncclResult_t comm_check_ready(const struct ncclComm* comm, const char* api) {
  ncclResult_t res = comm_check(comm, api);
  if (res != ncclSuccess) return res;
  switch (comm->state) {
    case BRAID_COMM_READY: return ncclSuccess;
    case BRAID_COMM_INITIALIZING: /* NCCL's code for this (ncclCommEnsureReady) */
      return braid_err(ncclInvalidArgument,
                       "%s: rank %d's communicator is still initializing; wait until "
                       "ncclCommGetAsyncError reports ncclSuccess",
                       api, comm->rank);
    case BRAID_COMM_FINALIZED:
      return braid_err(ncclInvalidUsage, "%s: rank %d's communicator was finalized", api,
                       comm->rank);
    case BRAID_COMM_REVOKED:
      return braid_err(ncclInvalidUsage,
                       "%s: rank %d's communicator was revoked; it can only be split, shrunk, "
                       "destroyed or aborted",
                       api, comm->rank);
    default:
      return braid_err(ncclInvalidUsage,
                       "%s: rank %d's communicator failed to initialize (result %d: %s); it can "
                       "only be destroyed or aborted",
                       api, comm->rank, (int)comm->async_error,
                       comm->init_error[0] ? comm->init_error : "no reason was recorded");
  }
}

void comm_error_record(struct ncclComm* comm, ncclResult_t res) {
  if (res == ncclSuccess || res == ncclInProgress || comm == NULL) return;
  /* Under live_lock: an abort on another thread cannot free the comm between look and write. */
  pthread_mutex_lock(&live_lock);
  if (live_cap && live_slots[live_find((uintptr_t)comm)] != 0) {
    pthread_mutex_lock(&comm->lock);
    snprintf(comm->last_error, sizeof comm->last_error, "%s", braid_err_last());
    pthread_mutex_unlock(&comm->lock);
  }
  pthread_mutex_unlock(&live_lock);
}

void comm_error_note(struct ncclComm* comm, const char* fmt, ...) {
  char msg[BRAID_ERROR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  WARN("%s", msg);
  pthread_mutex_lock(&live_lock);
  if (live_cap && live_slots[live_find((uintptr_t)comm)] != 0) {
    pthread_mutex_lock(&comm->lock);
    snprintf(comm->last_error, sizeof comm->last_error, "%s", msg);
    pthread_mutex_unlock(&comm->lock);
  }
  pthread_mutex_unlock(&live_lock);
}

ncclResult_t comm_alloc(struct ncclComm** out, int rank, int nranks, int cuda_dev,
                        const struct braid_config* config) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = NULL;
  BRAID_TRY(BRAID_CALLOC(&comm, 1, "communicator"));
  comm->magic = BRAID_COMM_MAGIC;
  comm->rank = rank;
  comm->nranks = nranks;
  comm->cuda_dev = cuda_dev;
  comm->config = *config;
  comm->state = BRAID_COMM_INITIALIZING;
  comm->async_error = ncclInProgress;
  pthread_mutex_init(&comm->lock, NULL);
  res = live_add(comm);
  if (res != ncclSuccess) {
    pthread_mutex_destroy(&comm->lock);
    goto fail;
  }
  *out = comm;
  return ncclSuccess;
fail:
  free(comm);
  return res;
}

/*
 * Pinned, device-mapped host memory for the abort flag (kernels poll it) and, on a line of
 * their own, the watchdog's copy of the kernels' ledger words.
 */
#define COMM_GRAPH_WORDS_BYTES sizeof(struct braid_graph_words)
#define COMM_PINNED_BYTES (64 + BRAID_MAX_GRID * sizeof(uint64_t) + COMM_GRAPH_WORDS_BYTES)
static ncclResult_t comm_abort_flag_alloc(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  BRAID_CUDA_TRY(cudaHostAlloc(&comm->abort_flag_mem, COMM_PINNED_BYTES,
                               cudaHostAllocMapped | cudaHostAllocPortable));
  memset(comm->abort_flag_mem, 0, COMM_PINNED_BYTES);
  comm->abort_flag = (volatile uint32_t*)comm->abort_flag_mem;
  comm->ledger_words = (uint64_t*)((char*)comm->abort_flag_mem + 64);
  comm->graph_words = (char*)comm->abort_flag_mem + 64 + BRAID_MAX_GRID * sizeof(uint64_t);
  return ncclSuccess;
fail:
  return res;
}

static ncclResult_t comm_peer_info_fill(struct ncclComm* comm, struct braid_peer_info* me) {
  ncclResult_t res = ncclSuccess;
  struct cudaDeviceProp prop;
  char busid[32];
  struct stat st;
  memset(me, 0, sizeof *me);
  me->rank = comm->rank;
  me->cuda_dev = comm->cuda_dev;
  me->host_hash = braid_host_hash();
  me->pid_hash = braid_pid_hash();
  me->pid = (int)getpid();
  me->start_time = braid_process_start(me->pid);
  BRAID_CUDA_TRY(cudaGetDeviceProperties(&prop, comm->cuda_dev));
  me->cuda_arch = prop.major * 100 + prop.minor * 10;
  memcpy(me->gpu_uuid, prop.uuid.bytes, sizeof me->gpu_uuid);
  BRAID_CUDA_TRY(cudaDeviceGetPCIBusId(busid, sizeof busid, comm->cuda_dev));
  me->dev_bus_id = braid_busid_to_int(busid);
  me->bus_id = me->dev_bus_id;
  const char* topo_busid = braid_param_str(BRAID_P_TOPO_BUSID);
  if (topo_busid && topo_busid[0]) {
    me->bus_id = braid_busid_to_int(topo_busid);
    BRAID_CHECK(me->bus_id >= 0, ncclInvalidUsage,
                "BRAID_TOPO_BUSID=%s is not a PCI bus id (domain:bus:device.function)", topo_busid);
    const char* file = braid_param_str(BRAID_P_TOPO_FILE);
    BRAID_CHECK(file && file[0], ncclInvalidUsage,
                "BRAID_TOPO_BUSID=%s needs BRAID_TOPO_FILE: a topology with a GPU at that bus id",
                topo_busid);
    INFO(BRAID_LOG_INIT | BRAID_LOG_ENV, "rank %d: GPU %d (%s) takes bus id %s in the topology "
         "(BRAID_TOPO_BUSID)", comm->rank, comm->cuda_dev, busid, topo_busid);
  }
  me->shm_dev = stat("/dev/shm", &st) == 0 ? (uint64_t)st.st_dev : 0;
  me->pid_ns = stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
  snprintf(me->hostname, sizeof me->hostname, "%s", braid_log_hostname());
  for (int i = 0; i < BRAID_PARAMS_AGREED; i++)
    me->agreed[i] = braid_param_int(braid_params_agreed[i]);
  comm->bus_id = me->bus_id;
  ipc_acquire(comm->cuda_dev, me); /* held to comm_free: the descriptor service */
  comm->ipc_held = 1;
  return ncclSuccess;
fail:
  return res;
}

/* Two ranks of one host on one GPU would corrupt each other's FIFOs: refuse. */
static ncclResult_t comm_check_duplicate_gpus(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < comm->nranks; i++) {
    for (int j = i + 1; j < comm->nranks; j++) {
      const struct braid_peer_info *a = &comm->peers[i], *b = &comm->peers[j];
      char busid[32];
      braid_busid_to_str(a->bus_id, busid, sizeof busid);
      BRAID_CHECK(a->host_hash != b->host_hash || a->bus_id != b->bus_id, ncclInvalidUsage,
                  "ranks %d and %d both use GPU %s on host %s; each rank needs its own GPU "
                  "(check CUDA_VISIBLE_DEVICES and the device each rank selects)",
                  i, j, busid, a->hostname);
    }
  }
  return ncclSuccess;
fail:
  return res;
}

/*
 * Parameters every rank must set alike (braid_params_agreed): a mix would split a message over
 * different channels, or pick different protocols, on the two ends of a connection, and hang.
 * Every rank sees the same table, so all of them refuse together.
 */
static ncclResult_t comm_check_agreed_params(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  const struct braid_peer_info* first = &comm->peers[0];
  for (int k = 0; k < BRAID_PARAMS_AGREED; k++) {
    for (int i = 1; i < comm->nranks; i++) {
      const struct braid_peer_info* p = &comm->peers[i];
      const braid_param_id_t id = braid_params_agreed[k];
      BRAID_CHECK(p->agreed[k] == first->agreed[k], ncclInvalidUsage,
                  "%s is %lld on rank 0 (%s) but %lld on rank %d (%s); every rank of a "
                  "communicator must use the same value (set it alike for all, or not at all)",
                  braid_param_name((int)id), (long long)first->agreed[k], first->hostname,
                  (long long)p->agreed[k], i, p->hostname);
    }
  }
  return ncclSuccess;
fail:
  return res;
}

/* A transport's report of a broken connection (a proxy thread's): the comm fails and stops. */
static void comm_transport_fail(void* owner, ncclResult_t res) {
  struct ncclComm* comm = owner;
  comm_fail_async(comm, res); /* the proxy's message, for ncclGetLastError(comm) */
  comm_stop(comm, "stopped by a failed network connection");
}

/* What the transports see of the comm: filled once, before the first connection. */
static void comm_transport_view_fill(struct ncclComm* comm) {
  struct braid_transport_comm* x = &comm->xport;
  x->rank = comm->rank;
  x->nranks = comm->nranks;
  x->cuda_dev = comm->cuda_dev;
  x->peers = comm->peers;
  x->bootstrap = comm->bootstrap;
  x->topo = comm->topo;
  x->abort_flag = comm->abort_flag;
  x->fail = comm_transport_fail;
  x->owner = comm;
  x->proxy_events = comm->profiler ? &profiler_proxy_events : NULL;
  x->proxy_events_ctx = comm->profiler;
}

/* The profiler plugin's instance for this comm, if there is a plugin (never fails the init). */
static void comm_profiler_open(struct ncclComm* comm) {
  int nnodes = 0;
  for (int i = 0; i < comm->nranks; i++) {
    int first = 1;
    for (int j = 0; j < i && first; j++) first = comm->peers[j].host_hash != comm->peers[i].host_hash;
    nnodes += first;
  }
  struct braid_profiler_args a = {.comm_hash = comm->comm_hash,
                                  .comm_name = comm->config.comm_name,
                                  .nnodes = nnodes,
                                  .nranks = comm->nranks,
                                  .rank = comm->rank,
                                  .net_lib = net_plugin_library_path()};
  comm->profiler = profiler_open(&a);
}

/* What follows the bootstrap, for every way a communicator is made: peers, topology, rings. */
static ncclResult_t comm_init_connect(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  BRAID_TRY(BRAID_CALLOC(&comm->peers, comm->nranks, "peer info"));
  BRAID_TRY(comm_peer_info_fill(comm, &comm->peers[comm->rank]));
  BRAID_TRY(bootstrap_allgather(comm->bootstrap, comm->peers, sizeof *comm->peers));
  BRAID_TRY(comm_check_agreed_params(comm));
  BRAID_TRY(comm_check_duplicate_gpus(comm));
  for (int i = 0; i < comm->nranks; i++)
    comm->local_ranks += comm->peers[i].host_hash == comm->peers[comm->rank].host_hash;
  BRAID_TRY(topo_comm_init(comm));
  comm_profiler_open(comm);
  comm_transport_view_fill(comm);
  BRAID_TRY(channels_rings_connect(comm));
  BRAID_TRY(dev_state_create(comm));
  BRAID_TRY(watchdog_start(comm));
  window_oneshot_prepare(comm); /* collective where BRAID_ONESHOT_MAX_BYTES asks; never fails */
  BRAID_TRY(bootstrap_barrier(comm->bootstrap));
  /* Every rank is through the exchanges: a failure from here on concerns this rank only. */
  bootstrap_init_done(comm->bootstrap);
  /* A connection's proxy may have failed the comm meanwhile (comm_fail_async): keep that. */
  ncclResult_t pending = ncclInProgress;
  if (!__atomic_compare_exchange_n((ncclResult_t*)&comm->async_error, &pending, ncclSuccess, 0,
                                   __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    res = braid_err(pending, "rank %d: a connection failed during init: %s", comm->rank,
                    comm->fail_error);
    goto fail;
  }
  char busid[32];
  braid_busid_to_str(comm->bus_id, busid, sizeof busid);
  INFO(BRAID_LOG_INIT, "comm %p rank %d nranks %d cudaDev %d busId %s commId 0x%llx - Init COMPLETE",
       (void*)comm, comm->rank, comm->nranks, comm->cuda_dev, busid,
       (unsigned long long)comm->comm_hash);
  /* Last: a teardown waiting for the init may free the comm as soon as it sees this. */
  __atomic_store_n(&comm->state, BRAID_COMM_READY, __ATOMIC_RELEASE);
  return ncclSuccess;
fail:
  return res;
}

void comm_init_failed(struct ncclComm* comm, ncclResult_t res) {
  comm->async_error = res;
  comm_error_record(comm, res);
  snprintf(comm->init_error, sizeof comm->init_error, "%s", braid_err_last());
  /* The other ranks would wait for this one's part of the next exchange until it closes. */
  if (comm->bootstrap) bootstrap_report_failure(comm->bootstrap, comm->init_error);
  __atomic_store_n(&comm->state, BRAID_COMM_FAILED, __ATOMIC_RELEASE); /* last, as above */
}

void comm_wait_splits(struct ncclComm* comm) {
  while (__atomic_load_n(&comm->children_pending, __ATOMIC_ACQUIRE) > 0) usleep(100);
}

ncclResult_t comm_init(struct ncclComm* comm, const ncclUniqueId* ids, int nids) {
  ncclResult_t res = ncclSuccess;
  braid_log_context_set(comm->rank, comm->cuda_dev);
  comm->comm_hash = bootstrap_id_hash(&ids[0]);
  BRAID_CUDA_TRY(cudaSetDevice(comm->cuda_dev));
  BRAID_TRY(comm_abort_flag_alloc(comm));
  BRAID_TRY(bootstrap_init(ids, nids, comm->rank, comm->nranks, comm->abort_flag,
                           &comm->bootstrap));
  BRAID_TRY(comm_init_connect(comm));
  return ncclSuccess;
fail:
  comm_init_failed(comm, res);
  return res;
}

ncclResult_t comm_init_split(struct ncclComm* comm, struct ncclComm* parent, const int* members,
                             int nmembers, int new_rank, int shrink) {
  ncclResult_t res = ncclSuccess;
  comm->rank = new_rank;
  comm->nranks = nmembers;
  braid_log_context_set(comm->rank, comm->cuda_dev);
  /* Every member derives the same id: the parent's and the member list. */
  uint64_t words[2] = {parent->comm_hash, braid_hash(members, (size_t)nmembers * sizeof *members)};
  comm->comm_hash = braid_hash(words, sizeof words);
  BRAID_CUDA_TRY(cudaSetDevice(comm->cuda_dev));
  BRAID_TRY(comm_abort_flag_alloc(comm));
  /* splitShare/shrinkShare: into the parent's family (its abort flag from here on). */
  BRAID_TRY(share_join(comm, parent, members, nmembers, shrink));
  BRAID_TRY(bootstrap_split(parent->bootstrap, members, nmembers, new_rank, comm->abort_flag,
                            &comm->bootstrap));
  BRAID_TRY(comm_init_connect(comm));
  return ncclSuccess;
fail:
  comm_init_failed(comm, res);
  return res;
}

/* How long kernels get to notice the abort flag (they poll it in every wait loop). */
#define COMM_DRAIN_TIMEOUT_S 10.0

ncclResult_t comm_quiesce(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  if (comm->abort_flag == NULL) return ncclSuccess;
  __atomic_store_n(comm->abort_flag, 1, __ATOMIC_SEQ_CST);
  /* The family's kernels stop too, mid-operation (the drain waits for theirs as well). */
  share_break(comm, "stopped (ncclCommRevoke, or ncclCommShrink with NCCL_SHRINK_ABORT)");
  BRAID_CUDA_TRY(cudaSetDevice(comm->cuda_dev));
  res = dev_state_drain(comm, COMM_DRAIN_TIMEOUT_S);
  watchdog_forget_pending(comm); /* the stopped launches will never report */
  /* A replay's blocks that left on the flag are still marked in it (graph_end skipped). */
  if (res == ncclSuccess && comm->dev && comm->dev->comm &&
      braid_cuda_zero(comm->dev->comm->graph.word, sizeof comm->dev->comm->graph.word) !=
          ncclSuccess)
    WARN("rank %d: cannot clear the graph replay words after a quiesce: %s", comm->rank,
         braid_err_last());
  if (res == ncclSuccess) __atomic_store_n(comm->abort_flag, 0, __ATOMIC_SEQ_CST);
fail:
  return res;
}

void comm_retire(struct ncclComm* comm) {
  live_remove(comm);
  watchdog_silence(comm); /* aborted: what it would judge is the abort, not a hang */
}

void comm_free(struct ncclComm* comm) {
  struct comm_free_times t;
  comm_free_timed(comm, &t);
}

/* What both teardowns free alike: the profiler, topology, bootstrap, operators, groups and
 * registrations (host memory no kernel reads). */
static void comm_free_host(struct ncclComm* comm) {
  profiler_close(comm->profiler);
  comm->profiler = NULL;
  topo_comm_free(comm);
  if (comm->bootstrap) bootstrap_close(comm->bootstrap);
  comm->bootstrap = NULL;
  redop_table_free(comm);
  group_comm_free(comm);
  register_free_all(comm);
}

/* The comm object itself, last (magic cleared: a later use is reported, not followed). */
static void comm_free_last(struct ncclComm* comm) {
  (void)cudaGetLastError();
  pthread_mutex_destroy(&comm->lock);
  comm->magic = 0;
  free(comm);
}

/*
 * The teardown of a comm whose kernels did not exit after the abort flag (dev_state_stuck):
 * cudaFree, cudaFreeHost, cudaHostUnregister and stream synchronizations would wait for them
 * without end, and they still read their FIFOs, their device state and the abort flag. So all
 * of that is kept (leaked, said once), while threads stop and descriptors close as in the
 * normal teardown. Only host memory no kernel reads is freed. The family (splitShare) stays
 * too: the departed members' connections it keeps would be freed with cudaFree.
 */
static void comm_free_stuck(struct ncclComm* comm, struct comm_free_times* t, double t0) {
  size_t kept = 0;
  double t1 = braid_time_sec();
  /* Its copies may wait behind the kernels: kept. */
  const int had_ce = comm->ce != NULL || comm->ce_fan != NULL;
  channels_free_keeping(comm, &kept);  /* the proxy's connections stop, FIFOs stay */
  double t2 = braid_time_sec();
  dev_state_keep(comm, &kept);
  kept += window_keep_all(comm); /* windows' records and mappings: kernels may read them */
  (void)share_leave(comm);
  if (comm->abort_flag_mem) kept += COMM_PINNED_BYTES; /* the kernels poll the flag there */
  WARN("rank %d: its kernels did not exit after the abort, so %zu bytes of device and pinned "
       "host memory they may still touch%s are left allocated (never freed: freeing would wait "
       "for those kernels without end); restart the process to reclaim them",
       comm->rank, kept, had_ce ? ", plus the copy engines' buffers and streams," : "");
  t->watchdog = t1 - t0;
  t->transport = t2 - t1;
  comm_free_host(comm);
  free(comm->peers);
  if (comm->ipc_held) ipc_release();
  comm_free_last(comm);
  t->rest = braid_time_sec() - t2;
}

void comm_free_timed(struct ncclComm* comm, struct comm_free_times* t) {
  memset(t, 0, sizeof *t);
  if (comm == NULL) return;
  double t0 = braid_time_sec();
  live_remove(comm); /* first: from here on the handle is refused */
  if (comm->cuda_dev >= 0) (void)cudaSetDevice(comm->cuda_dev);
  watchdog_stop(comm); /* first: its thread reads the connections */
  if (dev_state_stuck(comm)) {
    comm_free_stuck(comm, t, t0);
    return;
  }
  double t1 = braid_time_sec();
  ce_free(comm);       /* before dev_state: it may wait on the peer's last writes */
  fan_free(comm);      /* likewise, the peers' */
  register_unmap_all(comm); /* the peers' buffers its copies wrote into: all done now */
  double t2 = braid_time_sec();
  /* Before dev_state and channels: what others of its family may use stays in the family. */
  struct braid_share* family = share_leave(comm);
  dev_state_free(comm); /* its cudaFree calls wait for the whole device */
  double t3 = braid_time_sec();
  channels_free(comm); /* the proxy's connections and the peers' mappings */
  double t4 = braid_time_sec();
  t->watchdog = t1 - t0;
  t->ce = t2 - t1;
  t->dev_state = t3 - t2;
  t->transport = t4 - t3;
  comm_free_host(comm); /* after the channels: no proxy connection reports to the profiler */
  window_free_all(comm); /* before ipc_release: its mappings of other processes' memory */
  free(comm->peers);
  if (comm->abort_flag_mem) cudaFreeHost(comm->abort_flag_mem);
  share_free(family); /* the last of its family: what the departed members left, too */
  if (comm->ipc_held) ipc_release(); /* after every FIFO it may have exported is gone */
  comm_free_last(comm);
  t->rest = braid_time_sec() - t4;
}
