/*
 * The chaos test (braid_chaos): what its driver and its ranks share.
 *
 * One binary plays both parts. Run plainly it is the driver: for each iteration it starts one
 * rank process per GPU (the same binary, with --rank), lets them run a mixed stream of
 * collectives and send/receive pairs on a nonblocking communicator, gives one random rank one
 * fault (SIGKILL, SIGSTOP, or the loss of its TCP sockets), and checks that every other rank
 * returns an error within the bar, that ncclCommAbort then returns within a second, that
 * nothing hangs, and that neither /dev/shm nor the driver's descriptors keep anything.
 *
 *   chaos_driver.c  iterations, modes, faults, deadlines, leak checks, the report
 *   chaos_rank.c    one rank: init, the stream of calls, the error, the abort
 *
 * The two talk through one shared mapping (struct chaos_shared, a memfd the ranks inherit);
 * every time in it is CLOCK_MONOTONIC, which all processes of a host share.
 */
#ifndef BRAID_TESTS_CHAOS_H
#define BRAID_TESTS_CHAOS_H

#include <stdint.h>

#include "nccl.h"

#define CHAOS_MAX_RANKS 8
#define CHAOS_SKIP 77         /* CTest's skip code: fewer than two GPUs */
#define CHAOS_ABORT_BAR_S 1.0 /* ncclCommAbort must return within this */
#define CHAOS_GIVE_UP_S 10.0  /* a rank with no error by bar + this stops waiting and says so */

enum chaos_fault { CHAOS_KILL, CHAOS_STOP, CHAOS_SOCKET, CHAOS_NFAULTS };

/* One rank's account, written by the rank; `done` is set last. */
struct chaos_slot {
  volatile int ready; /* 1: initialized, and the first batch of calls completed */
  volatile int done;  /* 1: everything below is written */
  int result;         /* the first error's ncclResult_t; ncclSuccess: none was seen */
  int cuda_error;     /* a cudaError_t a stream query returned (0: none) */
  double err_at;      /* when the first error was seen */
  int early;          /* 1: the error came before the fault */
  double abort_s;     /* how long ncclCommAbort took; -1: not called */
  int abort_result;   /* what it returned */
  int sockets_shut;   /* sockets shut down by the socket fault (its victim only) */
  int batches;        /* batches of calls completed before the error */
  char where[128];    /* the call that reported the error */
  char msg[256];      /* ncclGetLastError's text */
};

struct chaos_shared {
  ncclUniqueId id;          /* written by rank 0 */
  volatile int id_ready;    /* 1 once `id` is written */
  volatile int victim;      /* the faulted rank, -1 before the fault */
  volatile double fault_at; /* when the fault was delivered; 0 before */
  double bar_s;             /* the bar of this iteration: an error within this after the fault */
  struct chaos_slot slot[CHAOS_MAX_RANKS];
};

/* CLOCK_MONOTONIC in seconds. */
double chaos_now(void);

/*
 * A rank's life: `shm_fd` holds struct chaos_shared, `ops_seed` seeds the stream of calls (the
 * same on every rank), `device` is the CUDA device to use. Returns the process's exit status.
 */
int chaos_rank_main(int rank, int nranks, int shm_fd, uint64_t ops_seed, int device);

#endif
