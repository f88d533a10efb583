/*
 * The copy-engine all-gather of 3 to 8 ranks of one host into registered buffers.
 *
 * With every rank's buffers registered (runtime/register.c maps each peer's output here), each
 * rank copies its part into every peer's output with the copy engine, one peer after another
 * on one copy stream: rank r writes to r + 1, r + 2, ... in turn, so while the ranks keep
 * pace each GPU writes to one peer and is written by one, and each copy runs at the link's
 * full rate. Copies to several peers at once on parallel streams contend and run slower
 * (docs/tuning.md, BRAID_CE_FAN_MIN_BYTES). The SMs only place the rank's own part.
 *
 * Each rank has a flag page (ce_args.h's braid_ce_fan_flags) that every peer maps.
 * Operations are numbered alike on every rank (v = 1, 2, ...). For operation v:
 *   the kernel on the user's stream: writes v into every peer's ready[me] (its output may be
 *     written: the stream has reached the operation), copies its own part, then waits until
 *     every peer's arrived[p] >= v and its own sent >= v, and reports to the op ledger;
 *   the copy stream, after what the user's stream holds: a step waits until every peer's
 *     ready[p] >= v (every output is free), the copies follow back to back, then a step
 *     publishes every peer's arrived[me] = v and this rank's sent = v.
 * A step is a one-block kernel (ce.h), as the pair exchange's (runtime/ce.c says why not the
 * driver's stream memory operations); every wait sees the abort flag. Two steps, not one
 * around each copy: each switch between a kernel and a copy on one stream costs about ten
 * microseconds, and a step per copy put an 80 us floor under every size (docs/tuning.md,
 * BRAID_CE_FAN_MIN_BYTES). The user's stream joins the copy stream at the end, so the input
 * may be reused once the stream passes.
 *
 * Not under stream capture (replays would repeat one number).
 */
#include "runtime/ce_fan.h"

#include <cuda.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/ce_args.h"
#include "abi/kernel_table.h"
#include "base/debug.h"
#include "base/param.h"
#include "base/utils.h"
#include "bootstrap/bootstrap.h"
#include "runtime/comm.h"
#include "runtime/dev_state.h"
#include "runtime/window.h"
#include "transport/ipc.h"

#define FAN_TAG 0x32000000 /* beside the pair exchange's 0x3000000x and registration's 0x31... */

typedef CUresult (*fan_copy_fn)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);

/* NONE -> SENT (fan_setup) -> AGREEING (fan_connect) -> READY or UNUSABLE (fan_agree). */
enum fan_state { FAN_NONE = 0, FAN_SENT, FAN_AGREEING, FAN_READY, FAN_UNUSABLE, FAN_BROKEN };

struct braid_ce_fan {
  enum fan_state state;
  int usable;    /* this rank can: kernels, the driver's copy, its flag page */
  int mapped_ok; /* this rank mapped every peer's flag page and made its stream */
  ipc_kind_t kind;
  struct ipc_mem own; /* the flag page */
  struct braid_ce_fan_flags* flags;
  struct ipc_map map[BRAID_CE_FAN_MAX];
  struct braid_ce_fan_flags* peer_flags[BRAID_CE_FAN_MAX]; /* NULL: this rank */
  cudaStream_t copy, aux;
  cudaEvent_t fork, join;
  const void* kernel;
  const void* step_kernel;
  fan_copy_fn copy_fn;
  uint32_t seq; /* operations so far */
};

struct fan_info {
  int32_t usable;
  int32_t kind;
  struct ipc_desc flags;
};

int fan_nblocks(void) { return 16; }

int fan_candidate(const struct ncclComm* comm, size_t bytes) {
  int64_t min = braid_param_int(BRAID_P_CE_FAN_MIN_BYTES);
  if (min < 0 || bytes < (size_t)min || comm->nranks < 3 || comm->nranks > BRAID_CE_FAN_MAX)
    return 0;
  if (braid_param_int(BRAID_P_LOCAL_REGISTER) == 0) return 0;
  int size = 1, rank = 0;
  window_lsa((struct ncclComm*)comm, &size, &rank);
  return size == comm->nranks;
}

int fan_on(const struct ncclComm* comm, int capturing) {
  return !capturing && comm->ce_fan && comm->ce_fan->state == FAN_READY;
}

int fan_pending(const struct ncclComm* comm) {
  return comm->ce_wanted && comm->nranks > 2 &&
         (comm->ce_fan == NULL || comm->ce_fan->state == FAN_SENT ||
          comm->ce_fan->state == FAN_AGREEING);
}

int fan_ipc_kind(const struct ncclComm* comm) {
  return comm->ce_fan && comm->ce_fan->state == FAN_READY ? (int)comm->ce_fan->kind : IPC_NONE;
}

/*
 * How every peer maps this rank's memory: all of them alike, each in this process (LOCAL) or
 * each in another (CUMEM); else IPC_NONE, `why` saying why.
 */
static ipc_kind_t fan_kind(const struct ncclComm* comm, char* why, size_t why_size) {
  ipc_kind_t kind = IPC_NONE;
  for (int p = 0; p < comm->nranks; p++) {
    if (p == comm->rank) continue;
    ipc_kind_t k = comm->peers[p].pid_hash == comm->peers[comm->rank].pid_hash
                       ? IPC_LOCAL
                       : ipc_choose_fd(&comm->peers[p], &comm->peers[comm->rank], why, why_size);
    if (k != IPC_LOCAL && k != IPC_CUMEM) {
      if (k != IPC_NONE) snprintf(why, why_size, "rank %d maps its memory as %s", p, ipc_kind_name(k));
      return IPC_NONE;
    }
    if (kind != IPC_NONE && k != kind) {
      snprintf(why, why_size, "some peers share this process and some do not");
      return IPC_NONE;
    }
    kind = k;
  }
  return kind;
}

ncclResult_t fan_setup(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct fan_info info;
  char why[512] = "";
  if (!comm->ce_wanted || comm->nranks < 3 || comm->ce_fan != NULL) return ncclSuccess;
  BRAID_TRY(BRAID_CALLOC(&comm->ce_fan, 1, "copy-engine fan state"));
  struct braid_ce_fan* f = comm->ce_fan;
  memset(&info, 0, sizeof info);
  f->kernel = braid_ce_fan_kernel();
  f->step_kernel = braid_ce_fan_step_kernel();
  f->copy_fn = (fan_copy_fn)braid_driver_fn("cuMemcpyDtoDAsync");
  f->usable = f->kernel != NULL && f->step_kernel != NULL && f->copy_fn != NULL &&
              comm->nranks <= BRAID_CE_FAN_MAX;
  if (f->usable && (f->kind = fan_kind(comm, why, sizeof why)) == IPC_NONE) {
    INFO(BRAID_LOG_INIT, "rank %d: copy-engine all-gather off: %s", comm->rank, why);
    f->usable = 0;
  }
  if (f->usable) {
    struct cudaFuncAttributes attr;
    /* Loaded now, not at a first launch that could wait behind a peer's spinning kernel. */
    if (cudaFuncGetAttributes(&attr, f->kernel) != cudaSuccess ||
        cudaFuncGetAttributes(&attr, f->step_kernel) != cudaSuccess ||
        cudaStreamCreateWithFlags(&f->aux, cudaStreamNonBlocking) != cudaSuccess ||
        ipc_mem_alloc(f->kind, comm->rank, BRAID_CE_FLAGS_BYTES, &f->own, &info.flags) !=
            ncclSuccess) {
      WARN("rank %d: copy-engine all-gather left off, its flag page could not be set up: %s",
           comm->rank, braid_err_last());
      (void)cudaGetLastError();
      ipc_mem_free(&f->own);
      f->usable = 0;
    } else {
      f->flags = (struct braid_ce_fan_flags*)f->own.ptr;
    }
  }
  info.usable = f->usable;
  info.kind = (int32_t)f->kind;
  for (int p = 0; p < comm->nranks; p++)
    if (p != comm->rank)
      BRAID_TRY(bootstrap_send(comm->bootstrap, p, FAN_TAG, &info, sizeof info));
  f->state = FAN_SENT;
  return ncclSuccess;
fail:
  return res;
}

/*
 * A peer's setup message: as long as it takes (a peer may come late), saying so every 10 s: a
 * rank that never comes broke NCCL's rule (every rank registers an all-gather's buffers or
 * none does, so every rank asks for the setup at the same group).
 */
static ncclResult_t fan_recv(struct ncclComm* comm, int peer, int tag, void* data, size_t size) {
  for (int waited = 0;; waited += 10) {
    int late = 0;
    ncclResult_t res = bootstrap_recv_until(comm->bootstrap, peer, tag, data, size,
                                            braid_time_sec() + 10.0, &late);
    if (!late) return res;
    WARN("rank %d has waited %d s for rank %d to set up the copy-engine all-gather of "
         "registered buffers: NCCL's rule is that every rank passes registered buffers to an "
         "operation or none does",
         comm->rank, waited + 10, peer);
  }
}

ncclResult_t fan_connect(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_ce_fan* f = comm->ce_fan;
  struct fan_info theirs[BRAID_CE_FAN_MAX];
  if (f == NULL || f->state != FAN_SENT) return ncclSuccess;
  f->state = FAN_UNUSABLE;
  int all = f->usable, who = comm->rank;
  for (int p = 0; p < comm->nranks; p++) {
    if (p == comm->rank) continue;
    BRAID_TRY(fan_recv(comm, p, FAN_TAG, &theirs[p], sizeof theirs[p]));
    if (!theirs[p].usable && all) {
      all = 0;
      who = p;
    }
  }
  if (!all) {
    /* Every rank concludes the same from the same infos, with no more messages. */
    INFO(BRAID_LOG_INIT, "copy-engine all-gather off: rank %d cannot run it", who);
    return ncclSuccess;
  }
  int32_t ok = 1;
  for (int p = 0; p < comm->nranks && ok; p++) {
    if (p == comm->rank) continue;
    if (ipc_mem_map(&theirs[p].flags, comm->rank, comm->abort_flag, &f->map[p]) != ncclSuccess)
      ok = 0;
    else
      f->peer_flags[p] = (struct braid_ce_fan_flags*)f->map[p].ptr;
  }
  if (ok && (cudaStreamCreateWithFlags(&f->copy, cudaStreamNonBlocking) != cudaSuccess ||
             cudaEventCreateWithFlags(&f->fork, cudaEventDisableTiming) != cudaSuccess ||
             cudaEventCreateWithFlags(&f->join, cudaEventDisableTiming) != cudaSuccess))
    ok = 0;
  if (!ok) {
    WARN("rank %d: copy-engine all-gather left off on every rank: %s", comm->rank,
         braid_err_last());
    (void)cudaGetLastError();
  }
  for (int p = 0; p < comm->nranks; p++)
    if (p != comm->rank)
      BRAID_TRY(bootstrap_send(comm->bootstrap, p, FAN_TAG + 1, &ok, sizeof ok));
  f->mapped_ok = ok;
  f->state = FAN_AGREEING;
  return ncclSuccess;
fail:
  return res;
}

/* Drops the mappings and the stream of a setup that some rank gave up. */
static void fan_release(struct braid_ce_fan* f) {
  for (int p = 0; p < BRAID_CE_FAN_MAX; p++) {
    ipc_mem_unmap(&f->map[p]);
    f->peer_flags[p] = NULL;
  }
  if (f->copy) (void)cudaStreamDestroy(f->copy);
  if (f->fork) (void)cudaEventDestroy(f->fork);
  if (f->join) (void)cudaEventDestroy(f->join);
  f->copy = NULL;
  f->fork = f->join = NULL;
  (void)cudaGetLastError();
}

ncclResult_t fan_agree(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_ce_fan* f = comm->ce_fan;
  if (f == NULL || f->state != FAN_AGREEING) return ncclSuccess;
  f->state = FAN_UNUSABLE;
  int all = f->mapped_ok, who = comm->rank;
  for (int p = 0; p < comm->nranks; p++) {
    int32_t theirs = 0;
    if (p == comm->rank) continue;
    BRAID_TRY(fan_recv(comm, p, FAN_TAG + 1, &theirs, sizeof theirs));
    if (!theirs && all) {
      all = 0;
      who = p;
    }
  }
  if (!all) {
    if (f->mapped_ok)
      INFO(BRAID_LOG_INIT, "copy-engine all-gather off: rank %d could not set it up", who);
    fan_release(f);
    return ncclSuccess;
  }
  f->state = FAN_READY;
  INFO(BRAID_LOG_INIT, "copy-engine all-gather of %d ranks ready (%s)", comm->nranks,
       ipc_kind_name(f->kind));
  return ncclSuccess;
fail:
  fan_release(f);
  return res;
}

/*
 * A step on the copy stream (ce_args.h's braid_ce_fan_step): `publish` 1 publishes operation
 * v's copies to every peer and this rank's sent word; 0 waits until every peer is ready.
 */
static ncclResult_t fan_step(struct ncclComm* comm, struct braid_ce_fan* f, int publish,
                             uint32_t v) {
  ncclResult_t res = ncclSuccess;
  struct braid_ce_fan_step st;
  memset(&st, 0, sizeof st);
  st.abort_flag = comm->dev->host.abort_flag;
  st.value = v;
  for (int p = 0; p < comm->nranks; p++) {
    if (p == comm->rank) continue;
    if (publish)
      st.publish[p] = &f->peer_flags[p]->arrived[comm->rank];
    else
      st.wait[p] = &f->flags->ready[p];
  }
  if (publish) st.sent = &f->flags->sent;
  void* params[] = {&st};
  dim3 one = {1, 1, 1}, threads = {BRAID_CE_FAN_MAX, 1, 1};
  BRAID_CUDA_TRY(cudaLaunchKernel(f->step_kernel, one, threads, params, 0, f->copy));
  return ncclSuccess;
fail:
  return res;
}

ncclResult_t fan_all_gather(struct ncclComm* comm, const struct fan_op* op, cudaStream_t stream,
                            uint64_t ledger_seq) {
  ncclResult_t res = ncclSuccess;
  struct braid_ce_fan* f = comm->ce_fan;
  const int me = comm->rank, n = comm->nranks;
  const uint32_t v = ++f->seq;
  struct braid_ce_fan_args a;
  memset(&a, 0, sizeof a);
  a.comm = comm->dev->comm;
  a.flags = f->flags;
  for (int p = 0; p < n; p++)
    if (p != me) a.peer_ready[p] = &f->peer_flags[p]->ready[me];
  char* mine = (char*)op->recv + (size_t)me * op->bytes;
  if (mine != op->send) { /* in place: already there */
    a.own = op->send;
    a.own_out = mine;
    a.own_bytes = op->bytes;
  }
  a.ledger_seq = ledger_seq;
  a.value = v;
  a.nranks = n;
  /* The copy stream starts after what the user's stream holds (the part to send is ready). */
  BRAID_CUDA_TRY(cudaEventRecord(f->fork, stream));
  BRAID_CUDA_TRY(cudaStreamWaitEvent(f->copy, f->fork, 0));
  {
    /* The kernel first: it must be running before the copy stream's waits are queued. */
    void* params[] = {&a};
    dim3 g = {(unsigned)fan_nblocks(), 1, 1}, b = {BRAID_CE_THREADS, 1, 1};
    BRAID_CUDA_TRY(cudaLaunchKernel(f->kernel, g, b, params, 0, stream));
  }
  BRAID_TRY(fan_step(comm, f, 0, v));
  for (int d = 1; d < n; d++) {
    const int p = (me + d) % n;
    CUresult r = f->copy_fn((CUdeviceptr)(uintptr_t)(op->peer_out[p] + (size_t)me * op->bytes),
                            (CUdeviceptr)(uintptr_t)op->send, op->bytes, (CUstream)f->copy);
    BRAID_CHECK(r == CUDA_SUCCESS, ncclUnhandledCudaError,
                "rank %d: cuMemcpyDtoDAsync of %zu bytes into rank %d's output failed "
                "(CUresult %d)", me, op->bytes, p, (int)r);
  }
  BRAID_TRY(fan_step(comm, f, 1, v));
  /* The user's stream goes on once this rank's part is out too (its buffer may be reused). */
  BRAID_CUDA_TRY(cudaEventRecord(f->join, f->copy));
  BRAID_CUDA_TRY(cudaStreamWaitEvent(stream, f->join, 0));
  TRACE(BRAID_LOG_COLL, "copy-engine all-gather %u: %zu bytes to each of %d peers", v, op->bytes,
        n - 1);
  return ncclSuccess;
fail:
  /* The peers' numbers move on without this rank's. */
  f->state = FAN_BROKEN;
  WARN("rank %d: a copy-engine all-gather failed half-way; this communicator is unusable", me);
  comm_fail_async(comm, res);
  return res;
}

void fan_fail(struct ncclComm* comm, ncclResult_t res) {
  if (comm->ce_fan == NULL || comm->ce_fan->state != FAN_READY) return;
  comm->ce_fan->state = FAN_BROKEN;
  WARN("rank %d: a group holding a copy-engine all-gather failed half-way; this communicator "
       "is unusable", comm->rank);
  comm_fail_async(comm, res);
}

ncclResult_t fan_check_intact(struct ncclComm* comm) {
  if (comm->ce_fan == NULL || comm->ce_fan->state != FAN_BROKEN) return ncclSuccess;
  ncclResult_t code = comm->async_error != ncclSuccess ? comm->async_error : ncclInvalidUsage;
  return braid_err(code,
                   "rank %d: a copy-engine all-gather failed half-way on this communicator (see "
                   "its async error), so its ranks no longer agree on what comes next; abort it",
                   comm->rank);
}

/*
 * The peers write this rank's flag page up to their last operation's end (their kernels' ready
 * words, their copy streams' arrived words); before the page goes, wait (briefly) for those
 * writes. An aborted communicator does not wait.
 */
static void fan_wait_peers_done(struct ncclComm* comm, struct braid_ce_fan* f) {
  struct braid_ce_fan_flags w;
  const double start = braid_time_sec();
  while (f->seq > 0 && !*comm->abort_flag && braid_time_sec() - start < 5.0) {
    if (cudaMemcpyAsync(&w, f->flags, sizeof w, cudaMemcpyDeviceToHost, f->aux) != cudaSuccess ||
        cudaStreamSynchronize(f->aux) != cudaSuccess)
      break;
    int done = 1;
    for (int p = 0; p < comm->nranks; p++)
      if (p != comm->rank && ((int32_t)(w.ready[p] - f->seq) < 0 ||
                              (int32_t)(w.arrived[p] - f->seq) < 0))
        done = 0;
    if (done) return;
    usleep(100);
  }
  (void)cudaGetLastError();
  if (!*comm->abort_flag && f->seq > 0)
    WARN("rank %d: a peer did not finish its last copy-engine all-gather within 5 s; freeing "
         "the flag page anyway", comm->rank);
}

void fan_quiesce(struct ncclComm* comm) {
  if (comm->ce_fan && comm->ce_fan->copy && cudaStreamSynchronize(comm->ce_fan->copy) != cudaSuccess)
    (void)cudaGetLastError();
}

void fan_free(struct ncclComm* comm) {
  struct braid_ce_fan* f = comm->ce_fan;
  if (f == NULL) return;
  if (f->copy) (void)cudaStreamSynchronize(f->copy);
  if (f->flags && f->state == FAN_READY) fan_wait_peers_done(comm, f);
  fan_release(f);
  ipc_mem_free(&f->own);
  if (f->aux) (void)cudaStreamDestroy(f->aux);
  (void)cudaGetLastError();
  free(f);
  comm->ce_fan = NULL;
}
