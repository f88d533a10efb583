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

#include "core/config.h"
#include "core/error.h"
#include "nccl.h"

#define BRAID_COMM_MAGIC 0x42524149444f4d4dULL /* "BRAIDCOMM" */

/* What each rank tells every other at init (exchanged by bootstrap_allgather). */
struct braid_peer_info {
  int rank;
  int cuda_dev;
  int64_t bus_id;        /* PCI domain:bus:device.function of the GPU */
  uint64_t host_hash;    /* same host <=> same value (BRAID_HOSTID overrides) */
  uint64_t pid_hash;     /* same process <=> same value */
  int pid;
  int cuda_arch;         /* major*100 + minor*10, e.g. 900 */
  uint64_t shm_dev;      /* st_dev of /dev/shm: equal means shared memory is shared */
  uint8_t gpu_uuid[16];
  char hostname[64];
};

/* States of a communicator (ncclCommGetAsyncError reports `async_error`). */
typedef enum {
  BRAID_COMM_INITIALIZING = 0,
  BRAID_COMM_READY = 1,
  BRAID_COMM_FINALIZED = 2,
  BRAID_COMM_FAILED = 3
} braid_comm_state_t;

struct bootstrap;
struct braid_topo;
struct braid_channels;
struct braid_dev_state;
struct braid_group_comm;
struct braid_redop_table;

struct ncclComm {
  uint64_t magic;
  int rank;
  int nranks;
  int cuda_dev;
  int64_t bus_id;
  uint64_t comm_hash;          /* digest of the unique id, for logs */
  struct braid_config config;

  struct bootstrap* bootstrap;       /* owned */
  struct braid_peer_info* peers;     /* [nranks], owned */
  int local_ranks;                   /* ranks on this host */
  struct braid_topo* topo;           /* owned by the graph module */
  struct braid_channels* channels;   /* owned by the transport module */
  struct braid_dev_state* dev;       /* owned by the enqueue module */
  struct braid_group_comm* group;    /* owned by the group module; NULL outside a group */
  struct braid_redop_table* redops;  /* user-defined reduction operators */

  volatile braid_comm_state_t state;
  volatile ncclResult_t async_error; /* ncclInProgress while a nonblocking init runs */
  volatile uint32_t* abort_flag;     /* host-mapped: kernels and waits poll it */
  void* abort_flag_mem;              /* allocation behind abort_flag */

  pthread_mutex_t lock;
  char last_error[BRAID_ERROR_MAX];  /* this comm's last error, for ncclGetLastError */
};

/* Validates a handle from the user: not NULL, not destroyed. Sets the log context. */
ncclResult_t comm_check(const struct ncclComm* comm, const char* api);
/* comm_check, and the communicator finished init successfully and was not finalized. */
ncclResult_t comm_check_ready(const struct ncclComm* comm, const char* api);
/* A new communicator object, state INITIALIZING; nothing is connected yet. */
ncclResult_t comm_alloc(struct ncclComm** out, int rank, int nranks, int cuda_dev,
                        const struct braid_config* config);
/* The init sequence: bootstrap, peer info, topology, rings, device state. Marks the comm FAILED on error. */
ncclResult_t comm_init(struct ncclComm* comm, const ncclUniqueId* ids, int nids);
/* Releases everything (kernels must be finished or aborted). */
void comm_free(struct ncclComm* comm);
/* Keeps the calling thread's last error as this comm's last error. */
void comm_error_record(struct ncclComm* comm, ncclResult_t res);

#endif
