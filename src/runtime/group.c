/*
 * Per-thread groups. ncclGroupEnd, at depth zero, does in order:
 *   1. the deferred inits, each on its own thread (they rendezvous with each
 *      other through the bootstrap, so they must run concurrently);
 *   2. the send/recv connections the pending operations need, in two phases
 *      across all communicators of the group (set up and send infos for
 *      all, then receive and connect for all; the copy-engine exchange adds
 *      a third, in which each rank learns whether its peer's setup worked),
 *      so one thread driving several GPUs never waits on itself;
 *   3. the launches, communicator by communicator, or side by side on helper threads when
 *      the communicators are on several GPUs (launch_pool.h).
 * The caller's current device is restored at the end.
 */
#include "runtime/group.h"
#include "runtime/register.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime.h>

#include "runtime/ce.h"
#include "runtime/ce_fan.h"
#include "runtime/check.h"
#include "runtime/comm.h"
#include "base/debug.h"
#include "runtime/enqueue.h"
#include "runtime/launch_pool.h"
#include "runtime/dev_state.h"
#include "base/param.h"
#include "base/utils.h"
#include "runtime/channels.h"

static __thread int depth;
static __thread ncclResult_t group_error;
static __thread struct ncclComm* group_comms;      /* communicators with pending operations */
static __thread struct braid_init_job* group_jobs; /* deferred inits */

int group_depth(void) { return depth; }

void group_fail(ncclResult_t res) {
  if (group_error == ncclSuccess) group_error = res;
}

ncclResult_t group_start(void) {
  depth++;
  return ncclSuccess;
}

ncclResult_t group_op_add(struct ncclComm* comm, const struct braid_op* op) {
  ncclResult_t res = ncclSuccess;
  struct braid_group_comm* g = comm->group;
  /* NCCL's groups are per thread too: another thread's open group would launch this one's op. */
  BRAID_CHECK(g == NULL || pthread_equal(g->owner, pthread_self()), ncclInvalidUsage,
              "rank %d: the communicator has operations in another thread's open group; a "
              "communicator's calls must come from one thread until that group ends",
              comm->rank);
  if (g == NULL) {
    /* The last group's state and its list, kept: a call outside a group is a group of its own. */
    if (comm->group_spare != NULL) {
      g = comm->group_spare;
      comm->group_spare = NULL;
    } else {
      BRAID_TRY(BRAID_CALLOC(&g, 1, "group state"));
    }
    g->owner = pthread_self();
    g->next = group_comms;
    group_comms = comm;
    comm->group = g;
  }
  if (g->nops == g->cap) {
    int cap = g->cap ? 2 * g->cap : 16;
    struct braid_op* ops = realloc(g->ops, (size_t)cap * sizeof *ops);
    BRAID_CHECK(ops != NULL, ncclSystemError, "out of host memory queueing %d operations", cap);
    g->ops = ops;
    g->cap = cap;
  }
  g->ops[g->nops++] = *op;
  return ncclSuccess;
fail:
  group_fail(res);
  return res;
}

int group_has_ops(const struct ncclComm* comm) {
  for (struct ncclComm* c = group_comms; c; c = c->group->next)
    if (c == comm) return 1;
  return 0;
}

int group_has_init(const struct ncclComm* comm) {
  for (struct braid_init_job* j = group_jobs; j; j = j->next)
    if (j->comm == comm) return 1;
  return 0;
}

static void group_comm_release(struct ncclComm* comm);

/* A deferred init that will never run: its parent stops waiting, its comm reads as failed. */
static void group_job_drop(struct braid_init_job* j, ncclResult_t res) {
  if (j->cancel) j->cancel(j);
  if (j->comm) comm_init_failed(j->comm, res);
  free(j->arg);
  free(j);
}

void group_forget(struct ncclComm* comm) {
  for (struct ncclComm** link = &group_comms; *link; link = &(*link)->group->next) {
    if (*link != comm) continue;
    *link = comm->group->next;
    group_comm_release(comm);
    break;
  }
  for (struct braid_init_job** link = &group_jobs; *link; link = &(*link)->next) {
    struct braid_init_job* j = *link;
    if (j->comm != comm) continue;
    *link = j->next;
    group_job_drop(j, ncclRemoteError); /* an abort */
    break;
  }
}

ncclResult_t group_init_add(struct braid_init_job* job) {
  job->next = group_jobs;
  group_jobs = job;
  return ncclSuccess;
}

/*
 * Runs a job on its own thread. Inits allocate memory, which CUDA refuses on
 * any thread while a user captures a stream in global mode (PyTorch's
 * default): this thread's capture mode is relaxed first.
 */
static ncclResult_t group_job_run(struct braid_init_job* job) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) (void)cudaGetLastError();
  return job->run(job);
}

/*
 * The threads of one group's inits start together: each waits at the gate until every one
 * exists, so a thread that cannot be made fails the group before any init has begun (none
 * is left waiting for a rank that never comes, none has joined a family or connected).
 */
struct group_gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int state; /* 0: wait, 1: run, -1: cancelled */
};

struct group_start {
  struct braid_init_job* job;
  struct group_gate* gate;
};

static void* group_job_main(void* arg) {
  struct group_start* s = arg;
  pthread_mutex_lock(&s->gate->lock);
  while (s->gate->state == 0) pthread_cond_wait(&s->gate->cond, &s->gate->lock);
  const int run = s->gate->state > 0;
  pthread_mutex_unlock(&s->gate->lock);
  if (!run) return NULL;
  for (struct braid_init_job* j = s->job; j; j = j->serial_next) j->result = group_job_run(j);
  return NULL;
}

/* A job that will never run: it fails with `res`, and its comm with it. */
static void group_job_never(struct braid_init_job* j, ncclResult_t res) {
  j->result = res;
  if (j->cancel) j->cancel(j);
  if (j->comm) comm_init_failed(j->comm, res); /* or its destroy waits forever */
}

ncclResult_t group_run_jobs(struct braid_init_job* jobs) {
  ncclResult_t res = ncclSuccess;
  int n = 0;
  for (struct braid_init_job* j = jobs; j; j = j->next) n++;
  pthread_t* threads = calloc((size_t)n, sizeof *threads);
  struct group_start* starts = calloc((size_t)n, sizeof *starts);
  struct braid_init_job** heads = calloc((size_t)n, sizeof *heads);
  struct braid_init_job** order = calloc((size_t)n, sizeof *order);
  if (threads == NULL || starts == NULL || heads == NULL || order == NULL) {
    free(threads);
    free(starts);
    free(heads);
    free(order);
    res = braid_err(ncclSystemError, "out of host memory starting %d init threads", n);
    for (struct braid_init_job* j = jobs; j; j = j->next) group_job_never(j, res);
    return res;
  }
  /*
   * Chains of jobs with one `serial` key, each led by the first added (the list holds the last
   * added first): a thread per chain and per job without a key.
   */
  int k = n, nheads = 0;
  for (struct braid_init_job* j = jobs; j; j = j->next) order[--k] = j;
  for (int i = 0; i < n; i++) {
    struct braid_init_job* j = order[i];
    struct braid_init_job* tail = NULL;
    j->serial_next = NULL;
    for (int h = 0; h < nheads && j->serial && !tail; h++)
      if (heads[h]->serial == j->serial) tail = heads[h];
    if (tail == NULL) {
      heads[nheads++] = j;
      continue;
    }
    while (tail->serial_next) tail = tail->serial_next;
    tail->serial_next = j;
  }
  free(order);
  struct group_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  int started = 0;
  for (; started < nheads; started++) {
    starts[started] = (struct group_start){heads[started], &gate};
    int err = pthread_create(&threads[started], NULL, group_job_main, &starts[started]);
    if (err != 0) {
      res = braid_err(ncclSystemError, "cannot start an init thread (%d of the group's %d): %s",
                      started + 1, nheads, strerror(err));
      break;
    }
  }
  pthread_mutex_lock(&gate.lock);
  gate.state = res == ncclSuccess ? 1 : -1;
  pthread_cond_broadcast(&gate.cond);
  pthread_mutex_unlock(&gate.lock);
  for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
  if (res != ncclSuccess) {
    for (struct braid_init_job* j = jobs; j; j = j->next) group_job_never(j, res);
  } else {
    for (struct braid_init_job* j = jobs; j; j = j->next)
      if (j->result != ncclSuccess && res == ncclSuccess) res = j->result;
  }
  free(heads);
  free(threads);
  free(starts);
  pthread_cond_destroy(&gate.cond);
  pthread_mutex_destroy(&gate.lock);
  return res;
}

static void* group_job_detached(void* arg) {
  struct braid_init_job* job = arg;
  job->result = group_job_run(job);
  if (job->result != ncclSuccess && job->comm == NULL)
    WARN("a nonblocking split this rank takes no part in failed: %s", braid_err_last());
  free(job->arg);
  free(job);
  return NULL;
}

ncclResult_t group_job_dispatch(struct braid_init_job* job, int blocking, const char* api) {
  if (depth > 0) return group_init_add(job);
  if (!blocking) {
    pthread_t thread;
    int err = pthread_create(&thread, NULL, group_job_detached, job);
    if (err != 0) {
      if (job->cancel) job->cancel(job);
      free(job->arg);
      free(job);
      return braid_err(ncclSystemError, "%s: cannot start the init thread: %s", api, strerror(err));
    }
    pthread_detach(thread);
    return ncclInProgress;
  }
  ncclResult_t res = job->run(job);
  free(job->arg);
  free(job);
  return res;
}

static ncclResult_t group_run_inits(void) {
  struct braid_init_job* jobs = group_jobs;
  group_jobs = NULL;
  if (jobs == NULL) return ncclSuccess;
  ncclResult_t res = group_run_jobs(jobs);
  while (jobs) {
    struct braid_init_job* next = jobs->next;
    free(jobs->arg);
    free(jobs);
    jobs = next;
  }
  return res;
}

/* The group failed before its end: its inits never run, and their comms read as failed. */
static void group_cancel_inits(ncclResult_t res) {
  struct braid_init_job* jobs = group_jobs;
  group_jobs = NULL;
  while (jobs) {
    struct braid_init_job* next = jobs->next;
    group_job_drop(jobs, res);
    jobs = next;
  }
}

static void group_comm_release(struct ncclComm* comm) {
  struct braid_group_comm* g = comm->group;
  comm->group = NULL;
  /* Staging copies of operations never launched (a failed or simulated group) go too. */
  for (int i = 0; i < g->nops; i++) {
    if (g->ops[i].scratch == NULL) continue;
    if (cudaSetDevice(comm->cuda_dev) != cudaSuccess ||
        cudaFreeAsync(g->ops[i].scratch, g->ops[i].stream) != cudaSuccess) {
      WARN("rank %d: cannot free the staging copy of an operation that did not run", comm->rank);
      (void)cudaGetLastError();
    }
  }
  g->nops = 0;
  g->next = NULL;
  if (comm->group_spare == NULL) {
    comm->group_spare = g;
    return;
  }
  free(g->ops);
  free(g);
}

void group_comm_free(struct ncclComm* comm) {
  struct braid_group_comm* g = comm->group_spare;
  comm->group_spare = NULL;
  if (g == NULL) return;
  free(g->ops);
  free(g);
}

/*
 * The caller's current context, asked of the driver: a thread-local read, where the runtime's
 * cudaGetDevice costs ~0.1-0.15 us next to a launch and a group end asked it three times
 * (docs/tuning.md, Host cost of a call). Without the entry points, the runtime's device calls.
 */
typedef CUresult (*group_ctx_get_fn)(CUcontext* ctx);
typedef CUresult (*group_ctx_set_fn)(CUcontext ctx);
static struct {
  pthread_once_t once;
  group_ctx_get_fn get;
  group_ctx_set_fn set;
} group_drv = {.once = PTHREAD_ONCE_INIT};

static void group_drv_load(void) {
  group_ctx_get_fn get = (group_ctx_get_fn)braid_driver_fn("cuCtxGetCurrent");
  group_ctx_set_fn set = (group_ctx_set_fn)braid_driver_fn("cuCtxSetCurrent");
  if (get != NULL && set != NULL) {
    group_drv.get = get;
    group_drv.set = set;
  }
}

/* What the caller had current when its group ended: put back by group_restore. */
struct group_saved {
  int by_ctx; /* ctx holds it (the driver's calls); else dev (the runtime's) */
  CUcontext ctx;
  int dev;
};

static void group_save(struct group_saved* s) {
  pthread_once(&group_drv.once, group_drv_load);
  s->ctx = NULL;
  s->dev = -1;
  s->by_ctx = group_drv.get != NULL && group_drv.get(&s->ctx) == CUDA_SUCCESS;
  if (!s->by_ctx && cudaGetDevice(&s->dev) != cudaSuccess) s->dev = -1;
}

static void group_restore(const struct group_saved* s) {
  if (s->by_ctx) {
    CUcontext cur = NULL;
    if (group_drv.get(&cur) != CUDA_SUCCESS || cur != s->ctx) (void)group_drv.set(s->ctx);
    return;
  }
  int cur = -1;
  if (s->dev >= 0 && (cudaGetDevice(&cur) != cudaSuccess || cur != s->dev))
    (void)cudaSetDevice(s->dev);
}

/*
 * Makes the comm's device's primary context current (the driver's launch works in it) unless
 * it is already: the context is learned at the first switch (a device's primary context is the
 * same for every thread of the process).
 */
static cudaError_t group_use_device(struct ncclComm* comm) {
  CUcontext cur = NULL;
  pthread_once(&group_drv.once, group_drv_load);
  CUcontext mine = (CUcontext)__atomic_load_n(&comm->cu_ctx, __ATOMIC_RELAXED);
  if (group_drv.get != NULL && mine != NULL && group_drv.get(&cur) == CUDA_SUCCESS && cur == mine)
    return cudaSuccess;
  cudaError_t err = cudaSetDevice(comm->cuda_dev);
  if (err == cudaSuccess && group_drv.get != NULL && group_drv.get(&cur) == CUDA_SUCCESS &&
      cur != NULL)
    __atomic_store_n(&comm->cu_ctx, (void*)cur, __ATOMIC_RELAXED);
  return err;
}

static ncclResult_t group_connect_p2p_all(struct ncclComm* comms) {
  ncclResult_t res = ncclSuccess;
  for (struct ncclComm* c = comms; c; c = c->group->next) {
    BRAID_CUDA_TRY(cudaSetDevice(c->cuda_dev));
    BRAID_TRY(channels_p2p_setup(c));
    BRAID_TRY(ce_setup(c));
    BRAID_TRY(fan_setup(c));
  }
  /*
   * The answers, copy-engine and send/recv (a late info: an offer to borrow that the peer did
   * not match, transport.c), for every comm whatever fails: a peer waits for them in the
   * third phase, which nothing else of this call may keep from it.
   */
  for (struct ncclComm* c = comms; c; c = c->group->next) {
    if (cudaSetDevice(c->cuda_dev) != cudaSuccess) {
      ncclResult_t r =
          braid_err(ncclUnhandledCudaError, "cannot make device %d current", c->cuda_dev);
      if (res == ncclSuccess) res = r;
      continue;
    }
    ncclResult_t r = ce_connect(c);
    if (res == ncclSuccess) res = r;
    r = fan_connect(c);
    if (res == ncclSuccess) res = r;
    r = channels_p2p_answer(c);
    if (res == ncclSuccess) res = r;
  }
  if (res != ncclSuccess) goto fail;
  for (struct ncclComm* c = comms; c; c = c->group->next) {
    BRAID_CUDA_TRY(cudaSetDevice(c->cuda_dev));
    BRAID_TRY(channels_p2p_connect(c));
  }
  for (struct ncclComm* c = comms; c; c = c->group->next) {
    BRAID_CUDA_TRY(cudaSetDevice(c->cuda_dev));
    BRAID_TRY(ce_agree(c));
    BRAID_TRY(fan_agree(c));
  }
  /* Registered buffers: every comm's word to its peer, then the answers (register.h). */
  for (struct ncclComm* c = comms; c; c = c->group->next) {
    BRAID_CUDA_TRY(cudaSetDevice(c->cuda_dev));
    BRAID_TRY(register_offer(c));
  }
  for (struct ncclComm* c = comms; c; c = c->group->next) {
    BRAID_CUDA_TRY(cudaSetDevice(c->cuda_dev));
    BRAID_TRY(register_accept(c));
  }
  return ncclSuccess;
fail:
  return res;
}

/*
 * Connect what the pending send/recv operations need, in phases across all
 * comms (group_connect_p2p_all). Connecting allocates and maps memory, which CUDA refuses on a
 * thread that is capturing a stream in global or thread-local mode: the
 * thread's capture mode is relaxed meanwhile (the allocations are ours, not
 * part of the user's graph).
 */
static ncclResult_t group_connect_p2p(struct ncclComm* comms) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  int pending = 0;
  for (struct ncclComm* c = comms; c; c = c->group->next) {
    comm_wait_splits(c);
    enqueue_p2p_needs(c);
    pending |= channels_p2p_pending(c) || ce_pending(c) || fan_pending(c) ||
               register_pending(c);
  }
  if (!pending) return ncclSuccess; /* the common case: every connection is up */
  ncclResult_t res = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess
                         ? group_connect_p2p_all(comms)
                         : braid_err(ncclUnhandledCudaError, "cannot relax the stream capture mode");
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  return res;
}

/*
 * The comms after `failed` in the group launch nothing: each keeps why as its last error
 * (their peers may wait for those operations; ncclGetLastError on them says what happened).
 */
static void group_note_dropped(struct ncclComm* failed) {
  for (struct ncclComm* d = failed->group->next; d; d = d->group->next)
    comm_error_note(d,
                    "rank %d (device %d): this group's operations on the communicator were dropped "
                    "unlaunched: the group failed first on rank %d's communicator (device %d): %s",
                    d->rank, d->cuda_dev, failed->rank, failed->cuda_dev, braid_err_last());
}

/* One comm's launch, on whichever thread runs it (group_launch_all, launch_pool.h). */
static ncclResult_t group_launch_one(struct ncclComm* c) {
  braid_log_context_set(c->rank, c->cuda_dev);
  cudaError_t cerr = group_use_device(c);
  ncclResult_t res = cerr == cudaSuccess
                         ? enqueue_launch(c)
                         : braid_err(ncclUnhandledCudaError, "rank %d: cannot make device %d current: %s",
                                     c->rank, c->cuda_dev, cudaGetErrorString(cerr));
  if (res != ncclSuccess) comm_error_record(c, res);
  return res;
}

/* The same on a helper: first the caller's stream capture mode (`ctx`), as its thread has it. */
static ncclResult_t group_launch_job(struct ncclComm* c, const void* ctx) {
  enum cudaStreamCaptureMode mode = *(const enum cudaStreamCaptureMode*)ctx;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) (void)cudaGetLastError();
  return group_launch_one(c);
}

/* A stream a helper thread may launch to as the caller would: a stream of its own handle. */
static int group_stream_handed(cudaStream_t s) {
  return s != NULL && s != cudaStreamLegacy && s != cudaStreamPerThread;
}

/*
 * The group's launches may go out side by side (launch_pool.h): BRAID_LAUNCH_THREADS, 2 to
 * LAUNCH_POOL_MAX_JOBS comms on distinct devices, a CPU for each besides the caller's (they
 * spin while the call is out), each op on a stream of its own handle (the per-thread default
 * stream is the caller's alone), none capturing (a capture's order is the capturing thread's).
 * Returns the number of comms, else 0.
 */
static int group_parallel_count(struct ncclComm* comms) {
  if (comms == NULL || comms->group->next == NULL || braid_param_int(BRAID_P_LAUNCH_THREADS) == 0)
    return 0;
  int n = 0, devs[LAUNCH_POOL_MAX_JOBS];
  for (struct ncclComm* c = comms; c; c = c->group->next) {
    if (n == LAUNCH_POOL_MAX_JOBS) return 0;
    for (int j = 0; j < n; j++)
      if (devs[j] == c->cuda_dev) return 0;
    devs[n++] = c->cuda_dev;
    for (int i = 0; i < c->group->nops; i++) {
      cudaStream_t s = c->group->ops[i].stream;
      if (!group_stream_handed(s) || !dev_state_stream_eager(s)) return 0;
    }
  }
  return n < launch_pool_cpus() ? n : 0;
}

/*
 * Every comm launched, each on its device's helper (the first on this thread). A failure
 * leaves the others launched (they went out at once): each failed comm keeps its message, the
 * first one's is this thread's, and each comm that did launch is told which failed (its
 * kernels may wait for that rank's).
 */
static ncclResult_t group_launch_parallel(struct ncclComm* comms, int n) {
  struct launch_job jobs[LAUNCH_POOL_MAX_JOBS];
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  int i = 0;
  for (struct ncclComm* c = comms; c; c = c->group->next) jobs[i++].comm = c;
  /* Read by swapping in any mode and back: the helpers take the caller's. */
  enum cudaStreamCaptureMode back;
  if (cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess) {
    back = mode;
    (void)cudaThreadExchangeStreamCaptureMode(&back);
  } else {
    (void)cudaGetLastError();
    mode = cudaStreamCaptureModeGlobal; /* CUDA's default for every thread */
  }
  launch_pool_run(jobs, n, group_launch_job, &mode);
  int first = -1;
  for (i = 0; i < n && first < 0; i++)
    if (jobs[i].res != ncclSuccess) first = i;
  if (first < 0) return ncclSuccess;
  const struct ncclComm* f = jobs[first].comm;
  for (i = 0; i < n; i++)
    if (jobs[i].res == ncclSuccess)
      comm_error_note(jobs[i].comm,
                      "rank %d (device %d): this group's operations on the communicator were "
                      "launched, but the launch on rank %d's communicator (device %d) of the same "
                      "group failed; kernels that wait for that rank will not finish (abort the "
                      "communicators): %s",
                      jobs[i].comm->rank, jobs[i].comm->cuda_dev, f->rank, f->cuda_dev,
                      jobs[first].msg);
  braid_err_restore(jobs[first].msg);
  return jobs[first].res;
}

/* On failure *failed is the comm whose launch failed, when the comms after it launched nothing. */
static ncclResult_t group_launch_all(struct ncclComm* comms, struct ncclComm** failed) {
  *failed = NULL;
  const int n = group_parallel_count(comms);
  if (n > 1) return group_launch_parallel(comms, n);
  for (struct ncclComm* c = comms; c; c = c->group->next) {
    ncclResult_t res = group_launch_one(c);
    if (res != ncclSuccess) {
      *failed = c;
      return res;
    }
  }
  return ncclSuccess;
}

/*
 * The outermost end of a group, first half: takes the group's communicators
 * and runs its deferred inits; returns the first error of the group so far.
 */
static void group_mark_busy(struct ncclComm* comms);

static ncclResult_t group_close(struct ncclComm** comms, struct group_saved* saved) {
  *comms = group_comms;
  group_comms = NULL;
  group_mark_busy(*comms); /* before the inits, which may take long */
  group_save(saved);
  ncclResult_t res = group_error;
  group_error = ncclSuccess;
  if (res != ncclSuccess) { /* as NCCL: a failed group runs nothing, its inits included */
    group_cancel_inits(res);
    return res;
  }
  return group_run_inits();
}

/*
 * Second half: lets go of the communicators' pending lists (and of group_close's mark that
 * this thread uses them), restores the caller's device.
 */
static void group_finish(struct ncclComm* comms, const struct group_saved* saved) {
  while (comms) {
    struct ncclComm* next = comms->group->next;
    group_comm_release(comms);
    /* The last touch of the comm: an abort on another thread may free it from here on. */
    __atomic_fetch_sub(&comms->in_group_end, 1, __ATOMIC_RELEASE);
    comms = next;
  }
  group_restore(saved);
}

/* Marks the comms as in use by this thread's group end (ncclCommAbort waits for it). */
static void group_mark_busy(struct ncclComm* comms) {
  for (struct ncclComm* c = comms; c; c = c->group->next)
    __atomic_fetch_add(&c->in_group_end, 1, __ATOMIC_ACQUIRE);
}

ncclResult_t group_end(void) {
  ncclResult_t res = ncclSuccess;
  if (depth == 0)
    return braid_err(ncclInvalidUsage, "ncclGroupEnd called without a matching ncclGroupStart");
  if (--depth > 0) return ncclSuccess;

  struct ncclComm *comms = NULL, *failed = NULL;
  struct group_saved saved;
  res = group_close(&comms, &saved);
  if (res == ncclSuccess && comms) {
    res = group_connect_p2p(comms);
    if (res == ncclSuccess && check_enabled()) res = check_group(comms);
    if (res == ncclSuccess) res = group_launch_all(comms, &failed);
  }
  /* As NCCL: a failed group is the async error of each of its nonblocking comms. */
  for (struct ncclComm* c = comms; c && res != ncclSuccess && res != ncclInProgress;
       c = c->group->next)
    if (!c->config.blocking) comm_fail_async(c, res);
  if (failed) group_note_dropped(failed); /* after: comm_fail_async keeps the group's message */
  group_finish(comms, &saved);
  return res;
}

__attribute__((visibility("default"))) ncclResult_t ncclGroupStart(void) {
  braid_err_clear();
  return group_start();
}
__attribute__((visibility("default"))) ncclResult_t pncclGroupStart(void)
    __attribute__((alias("ncclGroupStart")));

__attribute__((visibility("default"))) ncclResult_t ncclGroupEnd(void) {
  braid_err_clear();
  return group_end();
}
__attribute__((visibility("default"))) ncclResult_t pncclGroupEnd(void)
    __attribute__((alias("ncclGroupEnd")));

#define SIM_INFO_MAGIC 0x74685283u /* NCCL_SIM_INFO_INITIALIZER's */

static ncclResult_t group_sim_check(const ncclSimInfo_t* sim) {
  if (sim->magic != SIM_INFO_MAGIC || sim->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float))
    return braid_err(ncclInvalidArgument,
                     "ncclGroupSimulateEnd: simInfo is not initialized (size %zu, magic 0x%x); "
                     "assign NCCL_SIM_INFO_INITIALIZER first",
                     sim->size, sim->magic);
  return ncclSuccess;
}

/*
 * ncclGroupEnd without the launches: the deferred inits run (the estimate
 * needs their topology), then every communicator's operations are priced by
 * the tuning model and dropped. The communicators of one group run side by
 * side, so the group takes as long as its slowest communicator; the
 * operations of one communicator run one after another.
 */
__attribute__((visibility("default"))) ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  ncclResult_t res = ncclSuccess;
  braid_err_clear();
  if (depth == 0)
    return braid_err(ncclInvalidUsage, "ncclGroupSimulateEnd called without a matching ncclGroupStart");
  if (simInfo == NULL) return group_end(); /* as NCCL: no estimate wanted, a plain group end */
  res = group_sim_check(simInfo);
  if (res != ncclSuccess) { /* the group ends all the same, as a failed one: nothing runs */
    group_fail(res);
    (void)group_end(); /* returns the group's first error, this one, and keeps its message */
    return res;
  }
  if (--depth > 0) return ncclSuccess; /* an inner group: the outermost end estimates */
  struct ncclComm* comms = NULL;
  struct group_saved saved;
  res = group_close(&comms, &saved);
  float slowest_us = 0.0f;
  for (struct ncclComm* c = comms; c && res == ncclSuccess; c = c->group->next) {
    float us = 0.0f;
    res = enqueue_estimate(c, &us);
    if (us > slowest_us) slowest_us = us;
  }
  group_finish(comms, &saved);
  if (res == ncclSuccess) simInfo->estimatedTime = slowest_us;
  return res;
}
__attribute__((visibility("default"))) ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo)
    __attribute__((alias("ncclGroupSimulateEnd")));
