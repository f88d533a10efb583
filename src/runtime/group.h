/*
 * Groups. Every operation goes through a group: calls between
 * ncclGroupStart and ncclGroupEnd are collected per communicator and issued
 * together at the end; a call outside a group is a group of one. Init calls
 * inside a group are deferred too and run in parallel at the end, which is
 * how one thread initialises the communicators of several GPUs.
 *
 * Group state is per thread. A communicator joins the calling thread's group
 * with its first operation (comm->group points at its pending list) and
 * leaves it at ncclGroupEnd.
 */
#ifndef BRAID_CORE_GROUP_H
#define BRAID_CORE_GROUP_H

#include <cuda_runtime.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "abi/ce_args.h"
#include "abi/coll.h"
#include "abi/dev_comm.h"
#include "nccl.h"

struct ncclComm;

/* One operation as the API received it, already validated. */
struct braid_op {
  braid_coll_t coll;
  int is_send;           /* SendRecv: 1 send, 0 receive */
  int peer;              /* SendRecv: the other rank */
  int root;
  ncclDataType_t dtype;
  braid_devop_t devop;
  uint64_t scalar;       /* PREMULSUM scalar bits, or device pointer with BRAID_WORK_SCALAR_DEVICE */
  uint8_t work_flags;
  int same_scalar;       /* PREMULSUM with the same scalar on every rank (ncclAvg) */
  const void* sendbuff;
  void* recvbuff;
  size_t count;          /* as the API counts it */
  cudaStream_t stream;
  void* scratch;         /* stream-ordered allocation to free once the op is launched, or NULL */
  int after_prev;        /* 1: starts a new launch (it reads what the previous op wrote) */
  int uniform;           /* SendRecv: a message of ncclAlltoAll (every rank in the same call,
                            every message of it the same size: p2p_work.c's placement) */
  /* In place through the copy engines (register.c's exchange at group end agreed on it). */
  int reg_direct;        /* this op's data moves that way (sends, lands, or both) */
  char* reg_peer_out;    /* where what it sends lands: the peer's registered buffer, mapped here */
  char* reg_peer_outs[BRAID_CE_FAN_MAX]; /* 3+ ranks: each peer's registered output (ce_fan.c) */
  /* The choice made at connect time (trees need their connections), kept for the launch. */
  struct {
    int valid, algo, proto, nchannels;
  } chosen;
};

/* A communicator's pending operations in the current group. */
struct braid_group_comm {
  struct braid_op* ops;
  int nops;
  int cap;
  struct ncclComm* next; /* next communicator in this thread's group */
  pthread_t owner;       /* the thread whose group it is */
};

/* A deferred communicator init; `run` is called on its own thread at group end. */
struct braid_init_job {
  struct ncclComm* comm;
  ncclResult_t (*run)(struct braid_init_job* job);
  void (*cancel)(struct braid_init_job* job); /* or NULL: called instead of run if it never runs */
  void* arg;             /* owned by the job: freed with free() after run */
  ncclResult_t result;
  /*
   * Jobs of one group with the same non-NULL `serial` (a comm whose bootstrap they all use)
   * run one after another on one thread, in the order they were added: two collective jobs
   * of one comm running side by side would interleave their exchanges differently on each rank.
   */
  const void* serial;
  struct braid_init_job* serial_next; /* group_run_jobs' chain of them */
  struct braid_init_job* next;
};

/*
 * For teardown: whether `comm` waits in the calling thread's open group, with operations
 * (group_has_ops) or its own init (group_has_init); group_forget drops both (an abort).
 */
int group_has_ops(const struct ncclComm* comm);
int group_has_init(const struct ncclComm* comm);
void group_forget(struct ncclComm* comm);
/* Frees what the comm's groups kept for the next one (comm_free). */
void group_comm_free(struct ncclComm* comm);

int group_depth(void);
ncclResult_t group_start(void);
ncclResult_t group_end(void);
/* Adds an operation for `comm` to the calling thread's group. */
ncclResult_t group_op_add(struct ncclComm* comm, const struct braid_op* op);
/* Defers an init to group end; the group owns `job` from here on. */
ncclResult_t group_init_add(struct braid_init_job* job);
/* Makes the group fail at ncclGroupEnd (an argument error inside the group). */
void group_fail(ncclResult_t res);

/*
 * Runs a job that makes a communicator (init, split, shrink) the way the
 * caller's mode asks: at the outer ncclGroupEnd inside a group (returns
 * ncclSuccess), on a detached thread for a nonblocking communicator
 * (ncclInProgress), or now (the job's result). Owns `job` and its arg from
 * the call on. job->comm may be NULL (a rank that takes part in a split but
 * gets no communicator).
 */
ncclResult_t group_job_dispatch(struct braid_init_job* job, int blocking, const char* api);

/* Runs `jobs` (a list) each on its own thread and waits; returns the first failure. */
ncclResult_t group_run_jobs(struct braid_init_job* jobs);

#endif
