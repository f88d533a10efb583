/*
 * One rank of the chaos test: a nonblocking communicator (config.blocking = 0), then batches
 * of calls in a loop until the first error. A batch is CHAOS_BATCH calls spread over
 * CHAOS_STREAMS streams: AllReduce, AllGather, ReduceScatter, Broadcast and a send/receive pair
 * around the ring, of 4 B to 64 MiB, drawn from a generator seeded alike on every rank (every
 * rank issues the same calls in the same order). Between batches, and while one is in flight,
 * the host thread polls ncclCommGetAsyncError and the streams, so an error is seen as soon as
 * the library reports it, never behind a blocking wait.
 *
 * At the first error (a call's return, the comm's asynchronous error, or a stream's CUDA error)
 * the rank notes the time, its ncclGetLastError text, calls ncclCommAbort and times it, writes
 * its account into its slot and exits. A rank that sees no error by the bar plus
 * CHAOS_GIVE_UP_S after the fault writes that (result ncclSuccess) and aborts all the same.
 *
 * Every rank can be the victim of a socket fault: a thread waits for SIGUSR2 (blocked in every
 * other thread, the library's included) and then shuts down every TCP socket of the process,
 * which keeps running. SIGUSR1 is left alone: the library's watchdog answers it.
 */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "chaos.h"

#define CHAOS_STREAMS 3
#define CHAOS_BATCH 8
#define CHAOS_MAX_SHIFT 24 /* sizes 4 << 0 .. 4 << 24 bytes: 4 B .. 64 MiB */
#define CHAOS_BUF_BYTES ((size_t)4 << CHAOS_MAX_SHIFT)
#define CHAOS_INIT_S 120.0 /* the unique id and the init must come by then */

enum chaos_op { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_BROADCAST, OP_SENDRECV, OP_COUNT };
static const char* const op_names[OP_COUNT] = {"AllReduce", "AllGather", "ReduceScatter",
                                               "Broadcast", "Send/Recv"};

struct rank_state {
  int rank, nranks;
  struct chaos_shared* sh;
  struct chaos_slot* slot;
  ncclComm_t comm;
  cudaStream_t stream[CHAOS_STREAMS];
  float* send[CHAOS_STREAMS];
  float* recv[CHAOS_STREAMS];
  uint64_t rng;
  int failed; /* 1 once the first error is recorded */
};

double chaos_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Records the first error: its time, where, the result and the library's text. */
static void rank_fail(struct rank_state* st, ncclResult_t res, int cuda_error, const char* where) {
  if (st->failed) return;
  st->failed = 1;
  struct chaos_slot* s = st->slot;
  s->err_at = chaos_now();
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  s->early = st->sh->fault_at <= 0.0;
  s->result = (int)res;
  s->cuda_error = cuda_error;
  snprintf(s->where, sizeof s->where, "%s", where);
  const char* msg = st->comm ? ncclGetLastError(st->comm) : ncclGetLastError(NULL);
  snprintf(s->msg, sizeof s->msg, "%s", msg ? msg : "");
}

/* 1 when the rank should stop waiting: an error, or none by the bar plus CHAOS_GIVE_UP_S. */
static int rank_stop(struct rank_state* st) {
  if (st->failed) return 1;
  double fault_at = st->sh->fault_at;
  return fault_at > 0.0 && chaos_now() - fault_at > st->sh->bar_s + CHAOS_GIVE_UP_S;
}

/* The comm's asynchronous error: records it and returns 1 when it is one. */
static int rank_poll_async(struct rank_state* st, ncclResult_t* async) {
  ncclResult_t res = ncclCommGetAsyncError(st->comm, async);
  if (res != ncclSuccess) {
    rank_fail(st, res, 0, "ncclCommGetAsyncError's return");
    return 1;
  }
  if (*async != ncclSuccess && *async != ncclInProgress) {
    rank_fail(st, *async, 0, "ncclCommGetAsyncError");
    return 1;
  }
  return 0;
}

/*
 * A call's return on the nonblocking comm: an error is recorded; ncclInProgress is polled
 * until the comm is ready for the next call. 0 when the rank may go on.
 */
static int rank_check(struct rank_state* st, ncclResult_t res, const char* what) {
  if (res != ncclSuccess && res != ncclInProgress) {
    rank_fail(st, res, 0, what);
    return -1;
  }
  ncclResult_t async = res;
  while (async == ncclInProgress) {
    if (rank_poll_async(st, &async) || rank_stop(st)) return -1;
    if (async == ncclInProgress) usleep(100);
  }
  return 0;
}

/* Issues call `op` of `bytes` on stream `s`. 0 when it went out. */
static int rank_issue(struct rank_state* st, int op, size_t bytes, int root, int s) {
  size_t count = bytes / sizeof(float);
  size_t part = count / (size_t)st->nranks > 0 ? count / (size_t)st->nranks : 1;
  float* in = st->send[s];
  float* out = st->recv[s];
  cudaStream_t stream = st->stream[s];
  ncclComm_t comm = st->comm;
  switch (op) {
    case OP_ALLREDUCE:
      return rank_check(st, ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, stream),
                        "ncclAllReduce");
    case OP_ALLGATHER:
      return rank_check(st, ncclAllGather(in, out, part, ncclFloat, comm, stream), "ncclAllGather");
    case OP_REDUCESCATTER:
      return rank_check(st, ncclReduceScatter(in, out, part, ncclFloat, ncclSum, comm, stream),
                        "ncclReduceScatter");
    case OP_BROADCAST:
      return rank_check(st, ncclBroadcast(in, out, count, ncclFloat, root, comm, stream),
                        "ncclBroadcast");
    default: {
      int next = (st->rank + 1) % st->nranks, prev = (st->rank + st->nranks - 1) % st->nranks;
      if (rank_check(st, ncclGroupStart(), "ncclGroupStart") ||
          rank_check(st, ncclSend(in, count, ncclFloat, next, comm, stream), "ncclSend") ||
          rank_check(st, ncclRecv(out, count, ncclFloat, prev, comm, stream), "ncclRecv"))
        return -1;
      return rank_check(st, ncclGroupEnd(), "ncclGroupEnd");
    }
  }
}

/* Waits, polling, until every stream is idle. 0 when the batch completed. */
static int rank_drain(struct rank_state* st) {
  for (;;) {
    int busy = 0;
    for (int s = 0; s < CHAOS_STREAMS; s++) {
      cudaError_t e = cudaStreamQuery(st->stream[s]);
      if (e == cudaErrorNotReady) {
        busy = 1;
      } else if (e != cudaSuccess) {
        ncclResult_t async = ncclSuccess;
        (void)ncclCommGetAsyncError(st->comm, &async);
        rank_fail(st, async, (int)e, "cudaStreamQuery");
        return -1;
      }
    }
    ncclResult_t async = ncclSuccess;
    if (rank_poll_async(st, &async)) return -1;
    if (!busy) return 0;
    if (rank_stop(st)) return -1;
    usleep(100);
  }
}

/* One batch: CHAOS_BATCH calls, the same on every rank, then their completion. */
static int rank_batch(struct rank_state* st) {
  for (int i = 0; i < CHAOS_BATCH; i++) {
    int op = (int)(rng_next(&st->rng) % OP_COUNT);
    size_t bytes = (size_t)4 << (rng_next(&st->rng) % (CHAOS_MAX_SHIFT + 1));
    int root = (int)(rng_next(&st->rng) % (uint64_t)st->nranks);
    if (rank_issue(st, op, bytes, root, i % CHAOS_STREAMS)) {
      if (st->failed) {
        char where[sizeof st->slot->where];
        snprintf(where, sizeof where, "%.64s (%s, %zu B)", st->slot->where, op_names[op], bytes);
        snprintf(st->slot->where, sizeof st->slot->where, "%s", where);
      }
      return -1;
    }
  }
  return rank_drain(st);
}

/* The socket fault: every TCP socket of the process shut down (the descriptors stay open). */
static int rank_shut_sockets(void) {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    int fd = atoi(e->d_name);
    struct stat sb;
    int domain = 0, type = 0;
    socklen_t len = sizeof domain;
    if (e->d_name[0] == '.' || fd == dirfd(d) || fstat(fd, &sb) != 0 || !S_ISSOCK(sb.st_mode))
      continue;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) continue;
    len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) continue;
    if ((domain != AF_INET && domain != AF_INET6) || type != SOCK_STREAM) continue;
    if (shutdown(fd, SHUT_RDWR) == 0) n++;
  }
  closedir(d);
  return n;
}

static void* rank_socket_thread(void* arg) {
  struct chaos_slot* slot = arg;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR2);
  int sig = 0;
  if (sigwait(&set, &sig) == 0) slot->sockets_shut = rank_shut_sockets();
  return NULL;
}

/* The unique id (rank 0 makes it), then the nonblocking init. 0 when the comm is ready. */
static int rank_init(struct rank_state* st) {
  double deadline = chaos_now() + CHAOS_INIT_S;
  if (st->rank == 0) {
    if (rank_check(st, ncclGetUniqueId(&st->sh->id), "ncclGetUniqueId")) return -1;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    st->sh->id_ready = 1;
  }
  while (!st->sh->id_ready) {
    if (chaos_now() > deadline) {
      rank_fail(st, ncclInternalError, 0, "waiting for rank 0's unique id");
      return -1;
    }
    usleep(1000);
  }
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t res = ncclCommInitRankConfig(&st->comm, st->nranks, st->sh->id, st->rank, &config);
  if (res != ncclSuccess && res != ncclInProgress) {
    rank_fail(st, res, 0, "ncclCommInitRankConfig");
    return -1;
  }
  ncclResult_t async = ncclInProgress;
  while (async == ncclInProgress) {
    if (rank_poll_async(st, &async)) return -1;
    if (chaos_now() > deadline) {
      rank_fail(st, ncclInternalError, 0, "the init (still in progress)");
      return -1;
    }
    usleep(1000);
  }
  return 0;
}

static int rank_buffers(struct rank_state* st) {
  for (int s = 0; s < CHAOS_STREAMS; s++) {
    if (cudaStreamCreateWithFlags(&st->stream[s], cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void**)&st->send[s], CHAOS_BUF_BYTES) != cudaSuccess ||
        cudaMalloc((void**)&st->recv[s], CHAOS_BUF_BYTES) != cudaSuccess ||
        cudaMemset(st->send[s], 0, CHAOS_BUF_BYTES) != cudaSuccess) {
      cudaError_t e = cudaGetLastError();
      fprintf(stderr, "chaos rank %d: streams and buffers: %s\n", st->rank, cudaGetErrorString(e));
      rank_fail(st, ncclUnhandledCudaError, (int)e, "streams and buffers");
      return -1;
    }
  }
  return 0;
}

int chaos_rank_main(int rank, int nranks, int shm_fd, uint64_t ops_seed, int device) {
  struct chaos_shared* sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
  if (sh == MAP_FAILED) {
    fprintf(stderr, "chaos rank %d: mmap: %s\n", rank, strerror(errno));
    return 2;
  }
  close(shm_fd);
  struct rank_state st = {.rank = rank,
                          .nranks = nranks,
                          .sh = sh,
                          .slot = &sh->slot[rank],
                          .rng = ops_seed ? ops_seed : 1};
  st.slot->abort_s = -1.0;
  /* SIGUSR2 blocked before any thread exists, so only rank_socket_thread takes it. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR2);
  pthread_t thread;
  if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0 ||
      pthread_create(&thread, NULL, rank_socket_thread, st.slot) != 0) {
    fprintf(stderr, "chaos rank %d: the socket-fault thread could not start\n", rank);
    return 2;
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    rank_fail(&st, ncclUnhandledCudaError, (int)cudaGetLastError(), "cudaSetDevice");
  } else if (rank_buffers(&st) == 0 && rank_init(&st) == 0) {
    while (!st.failed && !rank_stop(&st)) {
      if (rank_batch(&st) == 0) {
        st.slot->batches++;
        st.slot->ready = 1;
      }
    }
  }
  if (st.comm) {
    double t0 = chaos_now();
    st.slot->abort_result = (int)ncclCommAbort(st.comm);
    st.slot->abort_s = chaos_now() - t0;
    st.comm = NULL;
  }
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  st.slot->done = 1;
  return 0;
}
