/*
 * The communicator. It is composed, not a god-struct: the bootstrap, the
 * topology, the channels and their connections, the device-side state and
 * the group/enqueue state each live in their own struct, owned by their
 * module; the comm holds pointers and the few facts every layer needs.
 *
 * Lifetime: comm_alloc() -> comm_init() (bootstrap, peer info, topology,
 * channels, device state) -> collectives -> comm_destroy() or comm_abort().
 * `magic` is cleared on destroy so that use after destroy is reported, not
 * followed.
 */
#ifndef BRAID_CORE_COMM_H
#define BRAID_CORE_COMM_H

#include <pthread.h>
#include <stdint.h>

#include "runtime/config.h"
#include "base/error.h"
#include "base/param.h"
#include "nccl.h"
#include "transport/transport.h"

#define BRAID_COMM_MAGIC 0x42524149444f4d4dULL /* "BRAIDCOMM" */

/* States of a communicator (ncclCommGetAsyncError reports `async_error`). */
typedef enum {
  BRAID_COMM_INITIALIZING = 0,
  BRAID_COMM_READY = 1,
  BRAID_COMM_FINALIZED = 2,
  BRAID_COMM_FAILED = 3,
  BRAID_COMM_REVOKED = 4 /* ncclCommRevoke: no more operations; destroy, split and shrink only */
} braid_comm_state_t;

struct bootstrap;
struct braid_topo;
struct braid_channels;
struct braid_dev_state;
struct braid_group_comm;
struct braid_redop_table;
struct braid_reg;
struct braid_reg_state;
struct braid_windows;
struct braid_watchdog;
struct braid_ce;
struct braid_ce_fan;
struct braid_share;
struct braid_lender;
struct braid_profiler;

struct ncclComm {
  uint64_t magic;
  int rank;
  int nranks;
  int cuda_dev;
  void* cu_ctx;                /* cuda_dev's primary context (CUcontext), learned at the first
                                  launch's switch (group.c); NULL until then (atomic) */
  int64_t bus_id;
  uint64_t comm_hash;          /* digest of the unique id, for logs */
  struct braid_config config;

  struct bootstrap* bootstrap;       /* owned */
  struct braid_peer_info* peers;     /* [nranks], owned */
  int local_ranks;                   /* ranks on this host */
  struct braid_topo* topo;           /* owned by the graph module */
  struct braid_transport_comm xport; /* what the transports see of this comm (comm.c) */
  struct braid_channels* channels;   /* owned by the channels module (channels.c) */
  struct braid_dev_state* dev;       /* owned by the enqueue module */
  struct braid_group_comm* group;    /* owned by the group module; NULL outside a group */
  struct braid_group_comm* group_spare; /* the last group's state, for the next (group.c) */
  struct braid_redop_table* redops;  /* user-defined reduction operators */
  struct braid_reg* regs;            /* ncclCommRegister'ed buffers (register.c), under `lock` */
  struct braid_reg_state* reg_state; /* their in-place use with the peer (register.c), or NULL */
  struct braid_windows* windows;     /* windows and device communicators (window.c), or NULL */
  volatile int children_pending;     /* split/shrink jobs still reading this comm (atomic) */
  int in_group_end;                  /* threads inside ncclGroupEnd with this comm (atomic) */
  uint32_t split_next, split_turn;   /* split jobs of this parent run one at a time, in call order */
  struct braid_watchdog* watchdog;   /* op ledger and hang verdicts (watchdog.c) */
  struct braid_ce* ce;               /* copy-engine exchange (ce.c), or NULL */
  struct braid_ce_fan* ce_fan;       /* copy-engine all-gather of 3+ ranks (ce_fan.c), or NULL */
  int ipc_held;                      /* ipc_acquire'd: ipc_release at free */
  int ce_wanted;                     /* an operation asked for it: set it up at the next connect */
  struct braid_share* share;         /* its family (share.c): kernel order, shared connections */
  struct braid_lender* lender;       /* a sharing child: the parent connections it may borrow */
  struct braid_profiler* profiler;   /* its profiler plugin instance (profiler.c), or NULL */

  volatile braid_comm_state_t state;
  volatile ncclResult_t async_error; /* ncclInProgress while a nonblocking init runs */
  volatile uint32_t* abort_flag;     /* host-mapped: kernels and waits poll it */
  uint64_t* ledger_words;            /* pinned: the watchdog's copy of the ledger words */
  void* graph_words;                 /* pinned: its copy of the graph replay words (dev_comm.h) */
  void* abort_flag_mem;              /* allocation behind abort_flag and ledger_words */

  pthread_mutex_t lock;
  char last_error[BRAID_ERROR_MAX];  /* this comm's last error, for ncclGetLastError */
  char init_error[BRAID_ERROR_MAX];  /* why init failed (state FAILED), for later refusals */
  char fail_error[BRAID_ERROR_MAX];  /* why async_error became an error (comm_fail_async), under `lock` */
};

/* Whether `comm` is a communicator that exists now (allocated, not yet freed); never reads *comm. */
int comm_is_live(const struct ncclComm* comm);
/* Validates a handle from the user: not NULL, not destroyed. Sets the log context. */
ncclResult_t comm_check(const struct ncclComm* comm, const char* api);
/* comm_check, and the communicator finished init successfully and was not finalized. */
ncclResult_t comm_check_ready(const struct ncclComm* comm, const char* api);
/*
 * The comm failed after (or during) init: a dead peer, a hang verdict, a broken exchange.
 * The first failure wins: sets async_error to `res` and keeps the thread's last error as the
 * reason; returns 1, or 0 when the comm had failed already.
 */
int comm_fail_async(struct ncclComm* comm, ncclResult_t res);
/* The other ranks of this comm on this rank's host (the only ones P2P/SHM connect). */
int comm_host_peers(const struct ncclComm* comm);
/* The same with `why` as the reason, the calling thread's last error left as it is. */
int comm_fail_async_why(struct ncclComm* comm, ncclResult_t res, const char* why);
/*
 * Raises the abort flag (its kernels leave their wait loops) after a failure, and those of its
 * family (share.h): the others of the family fail too, told `why` ("aborted", ...).
 */
void comm_stop(struct ncclComm* comm, const char* why);
/* comm_check_ready, and no asynchronous error (a failed peer, a hang verdict): for operations. */
ncclResult_t comm_check_usable(const struct ncclComm* comm, const char* api);
/* A new communicator object, state INITIALIZING; nothing is connected yet. */
ncclResult_t comm_alloc(struct ncclComm** out, int rank, int nranks, int cuda_dev,
                        const struct braid_config* config);
/* The init sequence: bootstrap, peer info, topology, rings, device state. Marks the comm FAILED on error. */
ncclResult_t comm_init(struct ncclComm* comm, const ncclUniqueId* ids, int nids);
/*
 * The same sequence for a communicator made from `parent` (split, shrink):
 * `members` lists the parent ranks in new-rank order, the same list on every
 * member, and this rank is member `new_rank`. Collective over the members.
 * With the config's splitShare (shrinkShare for a `shrink`), the new comm
 * joins the parent's family (share.h).
 */
ncclResult_t comm_init_split(struct ncclComm* comm, struct ncclComm* parent, const int* members,
                             int nmembers, int new_rank, int shrink);
/*
 * Waits for the split/shrink jobs still using this comm's bootstrap: the
 * caller's own use of it must not interleave with theirs, or ranks that
 * took the two in different orders would wait on each other.
 */
void comm_wait_splits(struct ncclComm* comm);
/* Marks a communicator whose init failed with `res`: FAILED, async error, last error kept. */
void comm_init_failed(struct ncclComm* comm, ncclResult_t res);
/*
 * Stops whatever this communicator's kernels are doing: raises the abort
 * flag, waits (bounded) for them to exit, lowers the flag. The connections'
 * step counters are left mid-operation, so the comm must not run another
 * operation afterwards (revoke, shrink with NCCL_SHRINK_ABORT).
 */
ncclResult_t comm_quiesce(struct ncclComm* comm);
/* The handle is refused from now on, as a freed one's, but nothing is freed (still in use). */
void comm_retire(struct ncclComm* comm);
/* Releases everything (kernels must be finished or aborted). */
void comm_free(struct ncclComm* comm);
/* Seconds comm_free_timed spent in each of its parts (ncclCommAbort reports a slow one). */
struct comm_free_times {
  double watchdog, ce, dev_state, transport, rest;
};
/* comm_free, with the time of each part in *t. */
void comm_free_timed(struct ncclComm* comm, struct comm_free_times* t);
/* Keeps the calling thread's last error as this comm's last error. */
void comm_error_record(struct ncclComm* comm, ncclResult_t res);
/* Logs (WARN) and keeps a message as this comm's last error; the thread's stays as it was. */
void comm_error_note(struct ncclComm* comm, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
