/*
 * What window.c and devapi.c share inside the runtime: the records of windows and device
 * communicators, and the steps both take (window.h says what they are).
 */
#ifndef BRAID_RUNTIME_WINDOW_INTERNAL_H
#define BRAID_RUNTIME_WINDOW_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "abi/dev_api.h"
#include "nccl.h"

struct ncclComm;
struct braid_init_job;

#define WIN_MAGIC 0x4257494eU    /* "BWIN" */
#define DEVCOMM_MAGIC 0x4244434dU /* "BDCM" */
#define WIN_STRIDE_UNIT ((size_t)1 << 32) /* the inline code steps between ranks in 4 GiB */

/* One registered window, as this rank holds it. */
struct win {
  uint32_t magic;
  struct ncclComm* comm;
  void* user;   /* the buffer as the caller passed it */
  size_t size;
  int flags;
  int internal; /* a device communicator's resource window, not the caller's */
  struct devapi_window host;  /* what `dev` holds */
  struct devapi_window* dev;  /* device memory: the ncclWindow_t handed out */
  void* resv;   /* the address range of the whole team's mappings */
  size_t resv_bytes;
  int nmaps;
  void** map_va;     /* [team size]: where each member's allocation is mapped, or NULL */
  size_t* map_bytes;
  int slot;          /* its entry in the window table */
  int sym_ok;        /* every rank registered it NCCL_WIN_COLL_SYMMETRIC, of one size */
  struct win* next;
};

/* A device communicator: its resource window and the copy handed out. */
struct devcomm {
  uint32_t magic;
  struct win* res;
  void* res_mem; /* ncclMemAlloc'ed memory behind the resource window */
  struct devcomm* next;
};

/* The per-communicator state, made at the first need. */
struct braid_windows {
  pthread_mutex_t lock; /* the lists and the table */
  int lsa_size, lsa_rank;
  struct win* list;
  struct devcomm* devcomms;
  struct devapi_window_table** tables; /* device blocks, linked by `next` */
  int ntables;
  struct win** slots; /* [ntables * 32]: the window in each entry, or NULL */
  /* The symmetric all-reduce's barriers (device/sym.h): a window of zeroed words per rank. */
  struct win* sync;
  void* sync_mem;
};

/* The comm's window state, made at the first call (the comm ready); NULL only without memory. */
struct braid_windows* windows_of(struct ncclComm* comm);
/*
 * Lists `win` in the device window table (NULL: only makes sure a block exists). Called with
 * w->lock held.
 */
ncclResult_t table_put(struct braid_windows* w, struct win* win);
/*
 * The collective registration of `buff` (every rank of the comm takes part; `prep`: this
 * rank's failure so far, which the others learn). `internal`: the library's own window.
 */
ncclResult_t win_register(struct ncclComm* comm, void* buff, size_t size, int flags,
                          int internal, ncclResult_t prep, struct win** out);
/* Unlists and frees a window of `w` (a local step). */
void win_release(struct braid_windows* w, struct win* win);
/* Frees a device communicator: its resource window and memory. */
void devcomm_free(struct braid_windows* w, struct devcomm* dc);
/*
 * The calling thread's stream capture mode relaxed around allocations and copies (CUDA
 * refuses them while capturing in global mode), then restored.
 */
enum cudaStreamCaptureMode capture_relax(void);
void capture_restore(enum cudaStreamCaptureMode mode);
/*
 * Runs `run` with a copy of `arg` at the end of the caller's group, on a thread of its own (as
 * deferred inits: group.h's jobs), after the jobs deferred before it on `comm` (one thread
 * runs them in order: they all use its bootstrap).
 */
ncclResult_t defer_to_group_end(struct ncclComm* comm, ncclResult_t (*run)(struct braid_init_job*),
                                const void* arg, size_t bytes, const char* api);

#endif
