/*
 * Faults, one suite each, run alone (they leave the world's communicator
 * aborted): the modes of one process per rank.
 *
 * deadpeer: a rank killed with SIGKILL in the middle of collectives (the
 * runner takes that death as planned): every survivor's
 * communicator must turn to an error within seconds, with a message in
 * ncclGetLastError, and ncclCommAbort must then return within a second
 * while its kernels were waiting on the dead rank. The figures are printed:
 *
 *   deadpeer [rank 0]: ncclRemoteError 0.41 s after the SIGKILL; ncclCommAbort took 0.012 s
 *
 * hang (Braid only, BRAID_TIMEOUT=3 unless set): the last rank skips an
 * AllReduce the others call (hangsend: two ranks, it skips the receive of
 * rank 0's 64 MB Send). SIGUSR1 after a second prints a verdict and
 * leaves the communicator alone (and the process alive); after
 * BRAID_TIMEOUT the watchdog fails it with ncclRemoteError and the verdict
 * "rank 0 waits in AllReduce #2 ... for rank 1, whose last op is AllReduce
 * #1" in ncclGetLastError; ncclCommAbort then returns within a second:
 *
 *   hang [rank 0]: verdict 3.05 s after the call: "rank 0 waits in ..."; abort 0.004 s
 */
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_test.h"
#include "mp_runner.h"

#define DEAD_COUNT (16 << 20) /* floats per AllReduce: 64 MB, tens of ms over sockets */
#define DEAD_CALLS 200        /* issued by the survivors without waiting */
#define DEAD_LIMIT_S 60.0     /* a survivor that sees no error by then fails */
#define DEAD_ABORT_S 1.0      /* the bar for ncclCommAbort */
#define DEAD_PEER_ABORT_S 10.0 /* a peer's abort seen as an error by then (BRAID_TIMEOUT: 600) */

#define FAULT_PROCS_WHY \
  "needs one process per rank (--mode procs, hosts, sharegpu, isolated or mixed), 2 ranks or more"
#define FAULT_BRAID_WHY "Braid's watchdog only (this libnccl is not Braid)"

/*
 * The SHM transport's files in /dev/shm made by process `pid` ("braid-<pid namespace>-<pid>-..."):
 * their count, the first name in `first`. Each is removed as soon as both ends hold it.
 */
static int fault_shm_files(int pid, char* first, size_t first_size) {
  int n = 0;
  DIR* d = opendir("/dev/shm");
  if (d == NULL) return 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    unsigned long long ns = 0;
    int who = 0;
    if (sscanf(e->d_name, "braid-%llx-%d-", &ns, &who) != 2 || who != pid) continue;
    if (n++ == 0) snprintf(first, first_size, "%s", e->d_name);
  }
  closedir(d);
  return n;
}

/* Fails the case when /dev/shm holds a file of process `pid` (`when`: for the message). */
static void fault_no_shm_files(struct gpu_world* w, int pid, const char* when) {
  char first[256] = "";
  int n = fault_shm_files(pid, first, sizeof first);
  if (n > 0)
    world_case_fail(w, "%s: %d file(s) of process %d in /dev/shm (/dev/shm/%s ...)", when, n, pid,
                    first);
}

/* A fault case's end: the comm aborted if it is still there (the suites run alone), buf freed. */
static void fault_case_end(struct gpu_world* w, float* buf) {
  if (w->comm[0]) {
    world_nccl(w, ncclCommAbort(w->comm[0]), NULL, "ncclCommAbort");
    w->comm[0] = NULL;
  }
  if (buf) cudaFree(buf);
  world_case_end(w);
}

/*
 * The start of the peer-fault cases: a buffer, one AllReduce completed everywhere (the
 * connections are up before anything goes wrong), then a stream of AllReduces issued without
 * waiting (three on the victim, which then fails in its own way). 0 when all went out.
 */
static int fault_stream_calls(struct gpu_world* w, int victim, float** buf) {
  *buf = NULL;
  if (world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") ||
      world_cuda(w, cudaMalloc((void**)buf, DEAD_COUNT * sizeof(float)), "cudaMalloc") ||
      world_cuda(w, cudaMemset(*buf, 0, DEAD_COUNT * sizeof(float)), "cudaMemset") ||
      world_nccl(w, ncclAllReduce(*buf, *buf, DEAD_COUNT, ncclFloat, ncclSum, w->comm[0],
                                  w->stream[0]),
                 w->comm[0], "ncclAllReduce (warm-up)") ||
      world_sync(w))
    return -1;
  int calls = w->rank0 == victim ? 3 : DEAD_CALLS;
  for (int i = 0; i < calls; i++)
    if (world_nccl(w, ncclAllReduce(*buf, *buf, DEAD_COUNT, ncclFloat, ncclSum, w->comm[0],
                                    w->stream[0]),
                   w->comm[0], "ncclAllReduce"))
      return -1;
  return 0;
}

/* A survivor polls its comm's async error until it is one, or DEAD_LIMIT_S: 0, or -1. */
static int fault_wait_error(struct gpu_world* w, ncclResult_t* async) {
  *async = ncclSuccess;
  for (double start = world_now(); world_now() - start < DEAD_LIMIT_S;) {
    if (world_nccl(w, ncclCommGetAsyncError(w->comm[0], async), w->comm[0],
                   "ncclCommGetAsyncError"))
      return -1;
    if (*async != ncclSuccess && *async != ncclInProgress) break;
    mp_sleep(0.001);
  }
  return 0;
}

void suite_deadpeer(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Dead peer: the last rank SIGKILLed mid-AllReduce mode=%s",
           w->opts->mode);
  if (!world_case_fits(w, name, w->nlocal < w->nranks && w->nranks >= 2, FAULT_PROCS_WHY) ||
      !world_case_begin(w, name))
    return;
  int victim = w->nranks - 1, me = w->rank0;
  volatile double* killed_at = world_stamp(w, 0);
  volatile double* victim_pid = world_stamp(w, 2);
  float* buf = NULL;
  if (me == victim) *victim_pid = (double)getpid();
  if (fault_stream_calls(w, victim, &buf)) goto out;
  if (me == victim) {
    mp_sleep(0.2); /* in the middle of the survivors' stream of calls */
    *killed_at = world_now();
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    raise(SIGKILL);
  }
  ncclResult_t async = ncclSuccess;
  if (fault_wait_error(w, &async)) goto out;
  double seen = world_now();
  if (async == ncclSuccess || async == ncclInProgress) {
    world_case_fail(w, "no error %.0f s after the peer's death", DEAD_LIMIT_S);
    goto out;
  }
  const char* msg = ncclGetLastError(w->comm[0]);
  double t0 = *killed_at;
  double abort_start = world_now();
  ncclResult_t res = ncclCommAbort(w->comm[0]);
  double abort_s = world_now() - abort_start;
  w->comm[0] = NULL; /* gone, whatever the result */
  printf("deadpeer [rank %d]: %s %.2f s after the SIGKILL (\"%s\"); ncclCommAbort took %.3f s\n", me,
         ncclGetErrorString(async), t0 > 0 ? seen - t0 : -1.0, msg ? msg : "", abort_s);
  if (msg == NULL || msg[0] == '\0') world_case_fail(w, "ncclGetLastError says nothing");
  if (res != ncclSuccess) world_nccl(w, res, NULL, "ncclCommAbort");
  if (abort_s > DEAD_ABORT_S) world_case_fail(w, "ncclCommAbort took %.3f s", abort_s);
  /* The stream must drain: the kernels left when the comm aborted. */
  world_cuda(w, cudaStreamSynchronize(w->stream[0]), "cudaStreamSynchronize after the abort");
  /* Shared-memory connections (BRAID_P2P_DISABLE=1): nothing of either process in /dev/shm. */
  fault_no_shm_files(w, (int)getpid(), "after the abort");
  if (*victim_pid > 0) fault_no_shm_files(w, (int)*victim_pid, "the killed rank's, after its death");
out:
  fault_case_end(w, buf);
}

/*
 * shmfiles: with the communicator alive and its connections made (an AllReduce completed on
 * every rank, so every end has connected), /dev/shm holds no file of this process: the SHM
 * transport removes each name as soon as both ends hold the file (under BRAID_P2P_DISABLE=1 it
 * carries the collectives; elsewhere there are none to find either).
 */
void suite_shm_files(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "SHM files: none in /dev/shm while the communicator lives mode=%s",
           w->opts->mode);
  if (!world_case_begin(w, name)) return;
  float* buf[GPU_MAX_RANKS] = {NULL};
  for (int l = 0; l < w->nlocal; l++)
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaMalloc((void**)&buf[l], 4096 * sizeof(float)), "cudaMalloc") ||
        world_cuda(w, cudaMemset(buf[l], 0, 4096 * sizeof(float)), "cudaMemset"))
      goto out;
  if (world_group_start(w)) goto out;
  for (int l = 0; l < w->nlocal; l++)
    world_nccl(w, ncclAllReduce(buf[l], buf[l], 4096, ncclFloat, ncclSum, w->comm[l], w->stream[l]),
               w->comm[l], "ncclAllReduce");
  if (world_group_end(w) || world_sync(w)) goto out;
  fault_no_shm_files(w, (int)getpid(), "with the communicator alive");
out:
  for (int l = 0; l < w->nlocal; l++)
    if (buf[l]) cudaFree(buf[l]);
  world_case_end(w);
}

/* A host function that holds its stream until *release is set (the test's stuck work). */
static void CUDART_CB stuck_hold(void* arg) {
  volatile int* release = arg;
  while (!__atomic_load_n(release, __ATOMIC_ACQUIRE)) usleep(1000);
}

/*
 * abortstuck (Braid only): rank 0's AllReduce is queued behind a host function that never ends
 * (until the case releases it), so its kernel cannot start and the abort flag cannot reach it:
 * work that never exits. ncclCommAbort must still return within a second, keeping the memory
 * that work may touch (one WARN) instead of waiting in cudaFree. Then the hold is released: the
 * kernel runs, reads the kept memory and the raised flag, leaves, and the stream drains.
 */
void suite_abort_stuck(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Abort with a launch that never starts mode=%s", w->opts->mode);
  if (!world_case_fits(w, name, w->nlocal < w->nranks && w->nranks >= 2, FAULT_PROCS_WHY) ||
      !world_case_fits(w, name, dlsym(RTLD_DEFAULT, "braidGetVersionString") != NULL,
                       FAULT_BRAID_WHY) ||
      !world_case_begin(w, name))
    return;
  volatile double* done = world_stamp(w, 1);
  static volatile int release;
  float* buf = NULL;
  release = 0;
  if (world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") ||
      world_cuda(w, cudaMalloc((void**)&buf, 4096 * sizeof(float)), "cudaMalloc") ||
      world_cuda(w, cudaMemset(buf, 0, 4096 * sizeof(float)), "cudaMemset") ||
      world_nccl(w, ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, w->comm[0], w->stream[0]),
                 w->comm[0], "ncclAllReduce (warm-up)") ||
      world_sync(w))
    goto out;
  if (w->rank0 != 0) {
    for (double t0 = world_now(); *done == 0 && world_now() - t0 < DEAD_LIMIT_S;) mp_sleep(0.01);
    goto out;
  }
  if (world_cuda(w, cudaLaunchHostFunc(w->stream[0], stuck_hold, (void*)&release),
                 "cudaLaunchHostFunc") ||
      world_nccl(w, ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, w->comm[0], w->stream[0]),
                 w->comm[0], "ncclAllReduce (behind the hold)")) {
    release = 1;
    goto out;
  }
  mp_sleep(0.2);
  double a0 = world_now();
  ncclResult_t res = ncclCommAbort(w->comm[0]);
  double abort_s = world_now() - a0;
  w->comm[0] = NULL;
  printf("abortstuck [rank 0]: ncclCommAbort took %.3f s with its launch stuck\n", abort_s);
  if (res != ncclSuccess) world_nccl(w, res, NULL, "ncclCommAbort");
  if (abort_s > DEAD_ABORT_S) world_case_fail(w, "ncclCommAbort took %.3f s", abort_s);
  __atomic_store_n(&release, 1, __ATOMIC_RELEASE);
  world_cuda(w, cudaStreamSynchronize(w->stream[0]), "cudaStreamSynchronize after the release");
  *done = 1;
out:
  fault_case_end(w, buf);
}

/* A waiting rank polls its comm's async error until it is one, or DEAD_LIMIT_S; -1 on a failed
 * call. */
static int hang_wait(struct gpu_world* w, double t0, ncclResult_t* async) {
  while (world_now() - t0 < DEAD_LIMIT_S && *async == ncclSuccess) {
    mp_sleep(0.005);
    if (world_nccl(w, ncclCommGetAsyncError(w->comm[0], async), w->comm[0],
                   "ncclCommGetAsyncError"))
      return -1;
  }
  return 0;
}

/* After the verdict: ncclCommAbort within DEAD_ABORT_S, the stream drains, rank 0 says done. */
static void hang_abort(struct gpu_world* w, const char* tag, ncclResult_t async, double verdict_s,
                       const char* msg, volatile double* done) {
  double a0 = world_now();
  ncclResult_t res = ncclCommAbort(w->comm[0]);
  double abort_s = world_now() - a0;
  w->comm[0] = NULL;
  printf("%s [rank %d]: %s %.2f s after the call: \"%s\"; ncclCommAbort took %.3f s\n", tag,
         w->rank0, ncclGetErrorString(async), verdict_s, msg, abort_s);
  if (res != ncclSuccess) world_nccl(w, res, NULL, "ncclCommAbort");
  if (abort_s > DEAD_ABORT_S) world_case_fail(w, "ncclCommAbort took %.3f s", abort_s);
  world_cuda(w, cudaStreamSynchronize(w->stream[0]), "cudaStreamSynchronize after the abort");
  if (w->rank0 == 0) *done = 1;
}

/*
 * The last rank skips an operation: the second, an AllReduce the others call; or (`send`, two
 * ranks) the third, the receive of rank 0's 64 MB Send, which fills any connection's buffer or
 * the copy-engine exchange's slots and then waits for a receiver that never comes. (The second
 * is the same Send received, so its connection is made: connecting needs both ranks.)
 */
static void hang_case(struct gpu_world* w, int send) {
  char name[160];
  snprintf(name, sizeof name, "Hang verdict: the last rank skips %s mode=%s",
           send ? "the receive of a 64 MB Send" : "an AllReduce", w->opts->mode);
  if (!world_case_fits(w, name, w->nlocal < w->nranks && w->nranks >= 2, FAULT_PROCS_WHY) ||
      !world_case_fits(w, name, !send || w->nranks == 2, "needs exactly 2 ranks") ||
      !world_case_fits(w, name, dlsym(RTLD_DEFAULT, "braidGetVersionString") != NULL,
                       FAULT_BRAID_WHY) ||
      !world_case_begin(w, name))
    return;
  int skipper = w->nranks - 1, me = w->rank0;
  const size_t count = send ? DEAD_COUNT : 4096;
  const char* op = send ? "Send" : "AllReduce";
  volatile double* done = world_stamp(w, 1);
  float* buf = NULL;
  if (world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") ||
      world_cuda(w, cudaMalloc((void**)&buf, count * sizeof(float)), "cudaMalloc") ||
      world_cuda(w, cudaMemset(buf, 0, count * sizeof(float)), "cudaMemset") ||
      world_nccl(w, ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, w->comm[0], w->stream[0]),
                 w->comm[0], "ncclAllReduce #1"))
    goto out;
  if (send &&
      world_nccl(w,
                 me == 0 ? ncclSend(buf, count, ncclFloat, skipper, w->comm[0], w->stream[0])
                         : ncclRecv(buf, count, ncclFloat, 0, w->comm[0], w->stream[0]),
                 w->comm[0], me == 0 ? "ncclSend #2" : "ncclRecv #2"))
    goto out;
  if (world_sync(w)) goto out;
  if (me == skipper) {
    /* Alive and idle (its watchdog answers), until the others are done. */
    for (double t0 = world_now(); *done == 0 && world_now() - t0 < DEAD_LIMIT_S;) mp_sleep(0.01);
  } else {
    double t0 = world_now();
    ncclResult_t async = ncclSuccess;
    ncclResult_t res =
        send ? ncclSend(buf, count, ncclFloat, skipper, w->comm[0], w->stream[0])
             : ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, w->comm[0], w->stream[0]);
    if (world_nccl(w, res, w->comm[0], send ? "ncclSend #3" : "ncclAllReduce #2")) goto out;
    mp_sleep(1.0);
    if (me == 0) raise(SIGUSR1); /* a report only: the process lives on, the comm too */
    mp_sleep(0.2);
    if (world_nccl(w, ncclCommGetAsyncError(w->comm[0], &async), w->comm[0], "ncclCommGetAsyncError"))
      goto out;
    if (async != ncclSuccess) {
      world_case_fail(w, "after SIGUSR1 the communicator reads %s", ncclGetErrorString(async));
      goto out;
    }
    if (hang_wait(w, t0, &async)) goto out;
    double verdict_s = world_now() - t0;
    const char* msg = ncclGetLastError(w->comm[0]);
    char want_wait[64], want_blame[96];
    snprintf(want_wait, sizeof want_wait, "rank %d waits in %s #%d", me, op, send ? 3 : 2);
    snprintf(want_blame, sizeof want_blame, "for rank %d, whose last op is %s", skipper,
             send ? "Recv #2" : "AllReduce #1");
    if (async != ncclRemoteError || strstr(msg, want_wait) == NULL || strstr(msg, want_blame) == NULL)
      world_case_fail(w, "after %.1f s: %s, \"%s\"", verdict_s, ncclGetErrorString(async), msg);
    hang_abort(w, "hang", async, verdict_s, msg, done);
  }
out:
  fault_case_end(w, buf);
}

/*
 * abortpeer (hosts mode: the network path): the last rank calls ncclCommAbort in the middle of
 * collectives and stays alive. Its connections close without the goodbye of a clean close, so
 * every survivor's communicator turns to an error within seconds (not after BRAID_TIMEOUT).
 */
void suite_abort_peer(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Peer aborts mid-AllReduce mode=%s", w->opts->mode);
  if (!world_case_fits(w, name, strcmp(w->opts->mode, "hosts") == 0 && w->nranks >= 2,
                       "needs --mode hosts (the network path), 2 ranks or more") ||
      !world_case_begin(w, name))
    return;
  int victim = w->nranks - 1, me = w->rank0;
  volatile double* aborted_at = world_stamp(w, 0);
  volatile double* done = world_stamp(w, 1);
  float* buf = NULL;
  if (fault_stream_calls(w, victim, &buf)) goto out;
  if (me == victim) {
    mp_sleep(0.2); /* in the middle of the survivors' stream of calls */
    *aborted_at = world_now();
    world_nccl(w, ncclCommAbort(w->comm[0]), NULL, "ncclCommAbort (the victim)");
    w->comm[0] = NULL;
    for (double t0 = world_now(); *done == 0 && world_now() - t0 < DEAD_LIMIT_S;)
      mp_sleep(0.01); /* alive: its process must not be what the survivors notice */
    goto out;
  }
  ncclResult_t async = ncclSuccess;
  if (fault_wait_error(w, &async)) goto out;
  double seen_s = world_now() - *aborted_at;
  printf("abortpeer [rank %d]: %s %.2f s after the peer's abort (\"%s\")\n", me,
         ncclGetErrorString(async), *aborted_at > 0 ? seen_s : -1.0, ncclGetLastError(w->comm[0]));
  if (async != ncclRemoteError || seen_s > DEAD_PEER_ABORT_S)
    world_case_fail(w, "%s %.1f s after the peer's abort", ncclGetErrorString(async), seen_s);
  double a0 = world_now();
  ncclResult_t res = ncclCommAbort(w->comm[0]);
  double abort_s = world_now() - a0;
  w->comm[0] = NULL;
  if (res != ncclSuccess) world_nccl(w, res, NULL, "ncclCommAbort");
  if (abort_s > DEAD_ABORT_S) world_case_fail(w, "ncclCommAbort took %.3f s", abort_s);
  world_cuda(w, cudaStreamSynchronize(w->stream[0]), "cudaStreamSynchronize after the abort");
  *done = 1;
out:
  fault_case_end(w, buf);
}

struct abort_later {
  ncclComm_t comm;
  double delay_s, took_s;
  ncclResult_t res;
};

static void* abort_later_main(void* arg) {
  struct abort_later* a = arg;
  mp_sleep(a->delay_s);
  double t0 = world_now();
  a->res = ncclCommAbort(a->comm);
  a->took_s = world_now() - t0;
  return NULL;
}

/*
 * abortwait (two ranks): rank 0's main thread is inside ncclSend, connecting to rank 1, which
 * never takes part, while another thread aborts the communicator half a second later. The
 * send must come back with an error and the abort within a second, freeing nothing under the
 * thread still inside.
 */
void suite_abort_wait(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Abort from another thread while ncclSend waits to connect mode=%s",
           w->opts->mode);
  if (!world_case_fits(w, name, w->nlocal < w->nranks && w->nranks == 2,
                       "needs one process per rank (--mode procs, hosts, sharegpu, isolated or "
                       "mixed), 2 ranks") ||
      !world_case_begin(w, name))
    return;
  volatile double* done = world_stamp(w, 1);
  float* buf = NULL;
  if (world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") ||
      world_cuda(w, cudaMalloc((void**)&buf, 4096 * sizeof(float)), "cudaMalloc") ||
      world_nccl(w, ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, w->comm[0], w->stream[0]),
                 w->comm[0], "ncclAllReduce (warm-up)") ||
      world_sync(w))
    goto out;
  if (w->rank0 == 1) {
    for (double t0 = world_now(); *done == 0 && world_now() - t0 < DEAD_LIMIT_S;) mp_sleep(0.01);
  } else {
    struct abort_later a = {.comm = w->comm[0], .delay_s = 0.5};
    pthread_t th;
    if (pthread_create(&th, NULL, abort_later_main, &a) != 0) {
      world_case_fail(w, "pthread_create failed");
      goto out;
    }
    double t0 = world_now();
    ncclResult_t res = ncclSend(buf, 4096, ncclFloat, 1, w->comm[0], w->stream[0]);
    double send_s = world_now() - t0;
    pthread_join(th, NULL);
    w->comm[0] = NULL; /* the other thread aborted it */
    printf("abortwait [rank 0]: ncclSend returned %s after %.2f s; ncclCommAbort took %.3f s\n",
           ncclGetErrorString(res), send_s, a.took_s);
    if (res == ncclSuccess) world_case_fail(w, "ncclSend succeeded though rank 1 never received");
    if (a.res != ncclSuccess) world_nccl(w, a.res, NULL, "ncclCommAbort");
    if (a.took_s > DEAD_ABORT_S) world_case_fail(w, "ncclCommAbort took %.3f s", a.took_s);
    if (send_s > a.delay_s + DEAD_ABORT_S) world_case_fail(w, "ncclSend took %.2f s", send_s);
    *done = 1;
  }
out:
  fault_case_end(w, buf);
}

void suite_hang(struct gpu_world* w) { hang_case(w, 0); }

void suite_hang_send(struct gpu_world* w) { hang_case(w, 1); }

/*
 * hanggraph: every rank captures an AllReduce into a graph and replays it three times (the last
 * rank a second late), then idles past BRAID_TIMEOUT (finished replays must give no verdict);
 * then the last rank skips the next replay: the others' watchdogs must fail their comms naming
 * the captured AllReduce, not before BRAID_TIMEOUT.
 */
void suite_hang_graph(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Hang verdict: the last rank skips a graph replay mode=%s",
           w->opts->mode);
  if (!world_case_fits(w, name, w->nlocal < w->nranks && w->nranks >= 2, FAULT_PROCS_WHY) ||
      !world_case_fits(w, name, dlsym(RTLD_DEFAULT, "braidGetVersionString") != NULL,
                       FAULT_BRAID_WHY) ||
      !world_case_begin(w, name))
    return;
  const size_t count = 4096;
  int skipper = w->nranks - 1, me = w->rank0;
  volatile double* done = world_stamp(w, 1);
  float* buf = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  ncclResult_t async = ncclSuccess;
  if (world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") ||
      world_cuda(w, cudaMalloc((void**)&buf, count * sizeof(float)), "cudaMalloc") ||
      world_cuda(w, cudaMemset(buf, 0, count * sizeof(float)), "cudaMemset") ||
      world_nccl(w, ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, w->comm[0], w->stream[0]),
                 w->comm[0], "ncclAllReduce (eager)") ||
      world_sync(w) ||
      world_cuda(w, cudaStreamBeginCapture(w->stream[0], cudaStreamCaptureModeThreadLocal),
                 "cudaStreamBeginCapture"))
    goto out;
  ncclResult_t issued =
      ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, w->comm[0], w->stream[0]);
  if (world_cuda(w, cudaStreamEndCapture(w->stream[0], &graph), "cudaStreamEndCapture") ||
      world_nccl(w, issued, w->comm[0], "ncclAllReduce (captured)") ||
      world_cuda(w, cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate"))
    goto out;
  /* The first replays with the ranks a second apart: a replay waiting for a slow peer right
     after its capture is no hang (the replay words' clock starts with their first read). */
  if (me == skipper) mp_sleep(1.0);
  for (int i = 0; i < 3; i++)
    if (world_cuda(w, cudaGraphLaunch(exec, w->stream[0]), "cudaGraphLaunch")) goto out;
  if (world_sync(w)) goto out;
  mp_sleep(4.5); /* past BRAID_TIMEOUT=3 with every replay finished */
  if (world_nccl(w, ncclCommGetAsyncError(w->comm[0], &async), w->comm[0],
                 "ncclCommGetAsyncError") ||
      async != ncclSuccess) {
    world_case_fail(w, "idle after finished replays, the communicator reads %s: %s",
                    ncclGetErrorString(async), ncclGetLastError(w->comm[0]));
    goto out;
  }
  if (me == skipper) {
    for (double t0 = world_now(); *done == 0 && world_now() - t0 < DEAD_LIMIT_S;) mp_sleep(0.01);
    goto out;
  }
  double t0 = world_now();
  if (world_cuda(w, cudaGraphLaunch(exec, w->stream[0]), "cudaGraphLaunch (the skipped one)"))
    goto out;
  if (hang_wait(w, t0, &async)) goto out;
  double verdict_s = world_now() - t0;
  const char* msg = ncclGetLastError(w->comm[0]);
  char want[64];
  snprintf(want, sizeof want, "rank %d waits in a CUDA graph replay", me);
  /* Not before BRAID_TIMEOUT=3 (less a poll of the replay words), and naming the launch. */
  if (async != ncclRemoteError || verdict_s < 2.5 || strstr(msg, want) == NULL ||
      strstr(msg, "AllReduce") == NULL || strstr(msg, "float count=4096") == NULL)
    world_case_fail(w, "after %.1f s: %s, \"%s\"", verdict_s, ncclGetErrorString(async), msg);
  hang_abort(w, "hanggraph", async, verdict_s, msg, done);
out:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  fault_case_end(w, buf);
}
