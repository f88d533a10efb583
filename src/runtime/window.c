/*
 * Symmetric memory windows, the LSA team and the window table (window.h says
 * what they are; abi/dev_api.h how their structures are laid out).
 */
#include "runtime/window.h"
#include "runtime/window_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "abi/dev_api.h"
#include "abi/dev_comm.h"
#include "base/debug.h"
#include "base/param.h"
#include "base/utils.h"
#include "bootstrap/bootstrap.h"
#include "runtime/comm.h"
#include "runtime/group.h"
#include "transport/ipc.h"
#include "transport/transport.h"

#define NCCL_API __attribute__((visibility("default")))
#define NCCL_ALIAS(ret, name, params) NCCL_API ret p##name params __attribute__((alias(#name)));

static pthread_mutex_t windows_make_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * Host to device, complete on return: a plain cudaMemcpy from pageable memory may return
 * before the data lands, and a kernel on a non-blocking stream could then read the old bytes.
 */
static ncclResult_t win_copy_in(void* dst, const void* src, size_t bytes) {
  ncclResult_t res = ncclSuccess;
  cudaStream_t s = NULL;
  BRAID_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  BRAID_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  BRAID_CUDA_TRY(cudaStreamSynchronize(s));
fail:
  if (s != NULL && cudaStreamDestroy(s) != cudaSuccess && res == ncclSuccess)
    res = braid_err(ncclUnhandledCudaError, "cudaStreamDestroy: %s",
                    cudaGetErrorString(cudaGetLastError()));
  (void)cudaGetLastError();
  return res;
}

/*
 * The calls below allocate, copy and free device memory, which CUDA refuses on a thread
 * capturing a stream in global or thread-local mode (or breaks another thread's global
 * capture): the calling thread's mode is relaxed meanwhile, as for connections.
 */
enum cudaStreamCaptureMode capture_relax(void) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    (void)cudaGetLastError();
    mode = cudaStreamCaptureModeRelaxed;
  }
  return mode;
}
void capture_restore(enum cudaStreamCaptureMode mode) {
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) (void)cudaGetLastError();
}

/* ---------------------------------------------------------------- the LSA team */

static int gcd(int a, int b) {
  while (b) {
    int t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/*
 * Teams of g consecutive ranks, g the greatest common divisor of the lengths of the runs of
 * consecutive ranks on one host (so every team lies on one host, and every host holds whole
 * teams), every pair of every team close enough for P2P and sharing cuMem memory; else every
 * rank alone. Every rank computes the same from the peers' info and the topology.
 */
static void lsa_compute(const struct ncclComm* comm, int* size, int* rank) {
  *size = 1;
  *rank = 0;
  if (comm->peers == NULL || comm->nranks <= 1) return;
  int g = 0;
  for (int r = 0; r < comm->nranks;) {
    int end = r + 1;
    while (end < comm->nranks && comm->peers[end].host_hash == comm->peers[r].host_hash) end++;
    g = gcd(g, end - r);
    r = end;
  }
  if (g <= 1) return;
  char why[512];
  for (int first = 0; first < comm->nranks; first += g) {
    for (int a = first; a < first + g; a++) {
      for (int b = a + 1; b < first + g; b++) {
        ipc_kind_t kind = ipc_choose_fd(&comm->peers[a], &comm->peers[b], why, sizeof why);
        if (!p2p_pair_close(&comm->xport, a, b) || (kind != IPC_LOCAL && kind != IPC_CUMEM)) {
          INFO(BRAID_LOG_INIT | BRAID_LOG_REG, "every LSA team is one rank: ranks %d and %d "
               "cannot load and store each other's memory (%s)", a, b,
               kind == IPC_NONE ? why
               : kind == IPC_LEGACY ? "no cuMem sharing between them"
                                    : "their GPUs are not close enough for P2P");
          return;
        }
      }
    }
  }
  *size = g;
  *rank = comm->rank % g;
}

/* The comm's window state, made at the first call; NULL only when memory ran out. */
struct braid_windows* windows_of(struct ncclComm* comm) {
  struct braid_windows* w = __atomic_load_n(&comm->windows, __ATOMIC_ACQUIRE);
  if (w) return w;
  pthread_mutex_lock(&windows_make_lock);
  w = comm->windows;
  if (w == NULL && (w = calloc(1, sizeof *w)) != NULL) {
    pthread_mutex_init(&w->lock, NULL);
    lsa_compute(comm, &w->lsa_size, &w->lsa_rank);
    __atomic_store_n(&comm->windows, w, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&windows_make_lock);
  return w;
}

void window_lsa(struct ncclComm* comm, int* size, int* rank) {
  /* Kept once the comm is ready: before, the peers' info or the topology may be missing. */
  struct braid_windows* w = comm->state == BRAID_COMM_READY ? windows_of(comm) : NULL;
  if (w) {
    *size = w->lsa_size;
    *rank = w->lsa_rank;
  } else {
    lsa_compute(comm, size, rank);
  }
}

/* ---------------------------------------------------------------- the window table */

/*
 * ncclFindWindow (inline in NCCL's headers) walks the device communicator's
 * table: blocks of 32 entries {user buffer, size, window}, linked on the
 * device. An empty entry is all zeros. Called with w->lock held.
 */
ncclResult_t table_put(struct braid_windows* w, struct win* win) {
  ncclResult_t res = ncclSuccess;
  int slot = -1;
  for (int i = 0; i < w->ntables * DEVAPI_WINDOW_TABLE_SIZE && slot < 0; i++)
    if (w->slots[i] == NULL) slot = i;
  if (slot < 0) { /* a new block, linked after the last */
    struct devapi_window_table* block = NULL;
    struct devapi_window_table** tables = NULL;
    struct win** slots = NULL;
    const int n = w->ntables + 1;
    BRAID_CUDA_TRY(cudaMalloc((void**)&block, sizeof *block));
    tables = realloc(w->tables, (size_t)n * sizeof *tables);
    if (tables) w->tables = tables;
    slots = tables ? realloc(w->slots, (size_t)n * DEVAPI_WINDOW_TABLE_SIZE * sizeof *slots)
                   : NULL;
    if (slots) w->slots = slots;
    res = slots ? braid_cuda_zero(block, sizeof *block)
                : braid_err(ncclSystemError, "out of host memory for the window table");
    if (res != ncclSuccess) {
      (void)cudaFree(block);
      goto fail;
    }
    memset(slots + (size_t)w->ntables * DEVAPI_WINDOW_TABLE_SIZE, 0,
           DEVAPI_WINDOW_TABLE_SIZE * sizeof *slots);
    w->slots = slots;
    if (w->ntables > 0)
      if ((res = win_copy_in(&w->tables[w->ntables - 1]->next, &block, sizeof block)) !=
          ncclSuccess) {
        (void)cudaFree(block);
        goto fail;
      }
    w->tables[w->ntables++] = block;
    slot = (n - 1) * DEVAPI_WINDOW_TABLE_SIZE;
  }
  if (win) {
    struct devapi_window_table* block = w->tables[slot / DEVAPI_WINDOW_TABLE_SIZE];
    const int i = slot % DEVAPI_WINDOW_TABLE_SIZE;
    uintptr_t entry[3] = {(uintptr_t)win->user, (uintptr_t)win->size, (uintptr_t)win->dev};
    _Static_assert(sizeof entry == sizeof block->entries[0], "a table entry is three words");
    BRAID_TRY(win_copy_in(&block->entries[i], entry, sizeof entry));
    w->slots[slot] = win;
    win->slot = slot;
  }
  return ncclSuccess;
fail:
  (void)cudaGetLastError();
  return res;
}

/* Empties the window's entry (w->lock held). */
static void table_drop(struct braid_windows* w, struct win* win) {
  if (win->slot < 0 || win->slot >= w->ntables * DEVAPI_WINDOW_TABLE_SIZE) return;
  struct devapi_window_table* block = w->tables[win->slot / DEVAPI_WINDOW_TABLE_SIZE];
  uintptr_t zero[3] = {0, 0, 0};
  if (win_copy_in(&block->entries[win->slot % DEVAPI_WINDOW_TABLE_SIZE], zero, sizeof zero) !=
      ncclSuccess)
    WARN("clearing a window's table entry failed: %s", braid_err_last());
  w->slots[win->slot] = NULL;
  win->slot = -1;
}

/* ---------------------------------------------------------------- registration */

/* What each rank tells all the others about its buffer. */
struct win_offer {
  int32_t status; /* ncclResult_t of this rank's preparation */
  int32_t flags;  /* the caller's winFlags */
  uint64_t size;   /* the caller's size */
  uint64_t offset; /* where the buffer lies in its cuMem allocation */
  struct ipc_desc desc;
  char why[256];   /* status != 0: why */
};

/* After mapping: whether each rank mapped its team's buffers. */
struct win_verdict {
  int32_t status;
  char why[252];
};

static void win_unmap(struct win* win) {
  for (int i = 0; i < win->nmaps; i++) ipc_unmap_at(win->map_va ? win->map_va[i] : NULL,
                                                     win->map_bytes ? win->map_bytes[i] : 0);
  ipc_va_release(win->resv, win->resv_bytes);
  win->resv = NULL;
  free(win->map_va);
  free(win->map_bytes);
  win->map_va = NULL;
  win->map_bytes = NULL;
  win->nmaps = 0;
}

static void win_free(struct win* win) {
  if (win == NULL) return;
  win_unmap(win);
  if (win->dev && cudaFree(win->dev) != cudaSuccess)
    WARN("freeing a window's device record failed: %s", cudaGetErrorString(cudaGetLastError()));
  win->magic = 0;
  free(win);
}

/* The first rank whose entry failed, or -1. */
static int first_failed(const void* entries, size_t stride, int n) {
  for (int r = 0; r < n; r++)
    if (*(const int32_t*)((const char*)entries + (size_t)r * stride) != 0) return r;
  return -1;
}

ncclResult_t window_layout(const struct window_part* parts, int n, size_t* gran, size_t* lead,
                           size_t* stride) {
  ncclResult_t res = ncclSuccess;
  size_t tail = 0;
  *gran = 1;
  *lead = 0;
  for (int i = 0; i < n; i++)
    if (parts[i].align > *gran) *gran = parts[i].align;
  BRAID_CHECK((*gran & (*gran - 1)) == 0 && *gran <= WIN_STRIDE_UNIT, ncclInternalError,
              "a window's granule of %zu bytes is not a power of two up to 4 GiB", *gran);
  const size_t rem = parts[0].offset % *gran;
  for (int i = 0; i < n; i++) {
    BRAID_CHECK(parts[i].offset % *gran == rem && parts[i].offset < parts[i].bytes,
                ncclInvalidArgument,
                "ncclCommWindowRegister: the buffers of LSA ranks 0 and %d start at offsets %zu "
                "and %zu of their allocations, which differ modulo the %zu-byte granule: the "
                "window cannot map them at one stride (pass the start of an ncclMemAlloc buffer, "
                "or offsets that agree modulo %zu)", i, parts[0].offset, parts[i].offset, *gran,
                *gran);
    if (parts[i].offset > *lead) *lead = parts[i].offset;
    if (parts[i].bytes - parts[i].offset > tail) tail = parts[i].bytes - parts[i].offset;
  }
  *lead = BRAID_ALIGN_UP(*lead - rem, *gran) + rem; /* >= every offset, == rem modulo gran */
  *stride = BRAID_ALIGN_UP(*lead + tail, WIN_STRIDE_UNIT);
  return ncclSuccess;
fail:
  return res;
}

/*
 * Maps the team's offers (rank `first` of the team at index 0) as
 * window_layout places them.
 */
static ncclResult_t win_map_team(struct ncclComm* comm, struct win* win,
                                 const struct win_offer* offers, int first, int n) {
  ncclResult_t res = ncclSuccess;
  size_t gran, lead, stride;
  struct window_part* parts = calloc((size_t)n, sizeof *parts);
  BRAID_CHECK(parts != NULL, ncclSystemError, "out of host memory for a window's layout");
  for (int i = 0; i < n; i++) {
    parts[i].offset = (size_t)offers[first + i].offset;
    parts[i].bytes = (size_t)offers[first + i].desc.bytes;
    parts[i].align = (size_t)offers[first + i].desc.align;
  }
  res = window_layout(parts, n, &gran, &lead, &stride);
  free(parts);
  BRAID_TRY(res);
  win->resv_bytes = stride * (size_t)n;
  BRAID_TRY(ipc_va_reserve(win->resv_bytes, gran, &win->resv));
  BRAID_CHECK((win->map_va = calloc((size_t)n, sizeof *win->map_va)) != NULL &&
                  (win->map_bytes = calloc((size_t)n, sizeof *win->map_bytes)) != NULL,
              ncclSystemError, "out of host memory for a window's mappings");
  win->nmaps = n;
  char* base = (char*)win->resv + lead;
  for (int i = 0; i < n; i++) {
    const int r = first + i;
    struct ipc_desc d = offers[r].desc;
    /* Memory of this process is retained from its address; another process's, by descriptor. */
    if (comm->peers[r].pid_hash == comm->peers[comm->rank].pid_hash) d.kind = IPC_LOCAL;
    void* at = base + (size_t)i * stride - offers[r].offset;
    BRAID_TRY(ipc_map_at(&d, at, comm->rank, comm->abort_flag));
    win->map_va[i] = at;
    win->map_bytes[i] = (size_t)d.bytes;
  }
  win->host.lsa_flat_base = base;
  win->host.stride4g = (uint32_t)(stride / WIN_STRIDE_UNIT);
  return ncclSuccess;
fail:
  return res;
}

/* Unlinks and frees `win` (a window of `comm`'s list). */
void win_release(struct braid_windows* w, struct win* win) {
  pthread_mutex_lock(&w->lock);
  for (struct win** p = &w->list; *p; p = &(*p)->next) {
    if (*p == win) {
      *p = win->next;
      break;
    }
  }
  table_drop(w, win);
  pthread_mutex_unlock(&w->lock);
  win_free(win);
}

/* The window `handle` (a device pointer) names on `comm`, or NULL. */
static struct win* win_find(struct braid_windows* w, const void* handle) {
  struct win* found = NULL;
  pthread_mutex_lock(&w->lock);
  for (struct win* p = w->list; p && !found; p = p->next)
    if (p->dev == handle) found = p;
  pthread_mutex_unlock(&w->lock);
  return found;
}

/*
 * The collective registration: offers, mappings, verdicts. On success
 * *out is the window, in the table; on failure every rank returns an error
 * and nothing is left.
 */
ncclResult_t win_register(struct ncclComm* comm, void* buff, size_t size, int flags,
                                 int internal, ncclResult_t prep, struct win** out) {
  ncclResult_t res = ncclSuccess;
  struct braid_windows* w = windows_of(comm);
  struct win_offer* offers = NULL;
  struct win_verdict* verdicts = NULL;
  struct win* win = NULL;
  struct ipc_mem keep;
  memset(&keep, 0, sizeof keep);
  keep.fd = -1;
  *out = NULL;
  BRAID_CHECK(w != NULL, ncclSystemError, "out of host memory for the window state");
  const int n = w->lsa_size, first = comm->rank - w->lsa_rank;
  BRAID_CHECK((offers = calloc((size_t)comm->nranks, sizeof *offers)) != NULL &&
                  (verdicts = calloc((size_t)comm->nranks, sizeof *verdicts)) != NULL &&
                  (win = calloc(1, sizeof *win)) != NULL,
              ncclSystemError, "out of host memory for a window registration");
  win->magic = WIN_MAGIC;
  win->comm = comm;
  win->user = buff;
  win->size = size;
  win->flags = flags;
  win->internal = internal;
  win->slot = -1;

  /* This rank's offer: by descriptor when a member of its team lives in another process. */
  int other_process = 0;
  for (int r = first; r < first + n; r++)
    other_process |= comm->peers[r].pid_hash != comm->peers[comm->rank].pid_hash;
  struct win_offer* mine = &offers[comm->rank];
  mine->size = size;
  mine->flags = flags;
  if (prep == ncclSuccess)
    prep = ipc_win_export(other_process ? IPC_CUMEM : IPC_LOCAL, buff, comm->rank, &keep,
                          &mine->desc, (size_t*)&mine->offset);
  /* One cuMem allocation: a buffer running past it (allocations mapped side by side, as some
   * allocators do) would be mapped only in part, and kernels would fault past that part. */
  if (prep == ncclSuccess && (mine->offset >= mine->desc.bytes ||
                              size > mine->desc.bytes - mine->offset))
    prep = braid_err(ncclInvalidArgument, "buff %p (%zu bytes) runs past the cuMem allocation "
                     "that holds it (%llu bytes from %p): a window takes a buffer of one "
                     "allocation, as ncclMemAlloc makes", buff, size,
                     (unsigned long long)mine->desc.bytes, mine->desc.ptr);
  if (prep != ncclSuccess) {
    mine->status = (int32_t)prep;
    snprintf(mine->why, sizeof mine->why, "%s", braid_err_last());
  }
  comm_wait_splits(comm);
  BRAID_TRY(bootstrap_allgather(comm->bootstrap, offers, sizeof *offers));
  int bad = first_failed(offers, sizeof *offers, comm->nranks);
  BRAID_CHECK(bad < 0, bad >= 0 ? (ncclResult_t)offers[bad].status : ncclSuccess,
              "ncclCommWindowRegister(%p, %zu bytes): rank %d cannot offer its buffer: %s", buff,
              size, bad, bad >= 0 ? offers[bad].why : "");

  /* The symmetric all-reduce reads it only where every rank said symmetric, of one size. */
  win->sym_ok = 1;
  for (int r = 0; r < comm->nranks; r++)
    win->sym_ok &= (offers[r].flags & NCCL_WIN_COLL_SYMMETRIC) && offers[r].size == size;
  /* Map the team's buffers; then all ranks learn whether every rank could. */
  win->host.world_rank = comm->rank;
  win->host.lsa_rank = w->lsa_rank;
  win->host.win_host = win;
  ncclResult_t mapped = win_map_team(comm, win, offers, first, n);
  if (mapped == ncclSuccess && cudaMalloc((void**)&win->dev, sizeof *win->dev) != cudaSuccess) {
    mapped = braid_err(ncclUnhandledCudaError, "cudaMalloc of a window's %zu-byte record failed: %s",
                       sizeof *win->dev, cudaGetErrorString(cudaGetLastError()));
    win->dev = NULL;
  }
  if (mapped == ncclSuccess) mapped = win_copy_in(win->dev, &win->host, sizeof win->host);
  if (mapped == ncclSuccess) { /* listed before the verdicts: all that can fail is behind */
    pthread_mutex_lock(&w->lock);
    mapped = table_put(w, win);
    if (mapped == ncclSuccess) {
      win->next = w->list;
      w->list = win;
    }
    pthread_mutex_unlock(&w->lock);
  }
  if (mapped != ncclSuccess) {
    verdicts[comm->rank].status = (int32_t)mapped;
    snprintf(verdicts[comm->rank].why, sizeof verdicts[comm->rank].why, "%s", braid_err_last());
  }
  res = bootstrap_allgather(comm->bootstrap, verdicts, sizeof *verdicts);
  /* Every peer that maps this buffer has its own handle now: the descriptor can go. */
  ipc_mem_free(&keep);
  bad = res == ncclSuccess ? first_failed(verdicts, sizeof *verdicts, comm->nranks) : -1;
  if (res == ncclSuccess && bad >= 0)
    res = braid_err((ncclResult_t)verdicts[bad].status, "ncclCommWindowRegister(%p, %zu bytes): "
                    "rank %d could not map its LSA team's buffers: %s", buff, size, bad,
                    verdicts[bad].why);
  if (res != ncclSuccess) {
    if (mapped == ncclSuccess) win_release(w, win); /* listed: unlisted and freed */
    else win_free(win);
    win = NULL;
    goto fail;
  }
  INFO(BRAID_LOG_REG, "rank %d: window %p for %p (%zu bytes, flags 0x%x): LSA team of %d, "
       "stride %u x 4 GiB", comm->rank, (void*)win->dev, buff, size, flags, n, win->host.stride4g);
  free(offers);
  free(verdicts);
  *out = win;
  return ncclSuccess;
fail:
  ipc_mem_free(&keep);
  win_free(win);
  free(offers);
  free(verdicts);
  return res;
}

/*
 * The symmetric all-reduce's sync window, made with the comm's first window (every rank
 * registers that one, so every rank makes this with it): per rank, one inbox per block and
 * rank, one epoch per block, then the LL variant's slots (abi/dev_comm.h, device/sym.h),
 * zeroed. Only where the LSA team is the comm.
 */
static ncclResult_t sym_sync_make(struct ncclComm* comm) {
  struct braid_windows* w = windows_of(comm);
  if (w == NULL) return braid_err(ncclSystemError, "out of host memory for the window state");
  if (w->sync != NULL || w->lsa_size != comm->nranks || comm->nranks < 2) return ncclSuccess;
  void* mem = NULL;
  const size_t bytes = BRAID_SYM_SYNC_BYTES(w->lsa_size);
  ncclResult_t prep = ipc_user_alloc(&mem, bytes); /* zeroed */
  struct win* made = NULL;
  ncclResult_t res = win_register(comm, mem, bytes, NCCL_WIN_COLL_SYMMETRIC, 1, prep, &made);
  if (res != ncclSuccess) {
    if (mem) (void)ipc_user_free(mem);
    return res;
  }
  w->sync = made;
  w->sync_mem = mem;
  return ncclSuccess;
}

int window_sync(struct ncclComm* comm, struct window_sym* out) {
  struct braid_windows* w = __atomic_load_n(&comm->windows, __ATOMIC_ACQUIRE);
  if (w == NULL) return 0;
  pthread_mutex_lock(&w->lock);
  const int found = w->sync != NULL;
  if (found) {
    out->input = NULL;
    out->stride4g = 0;
    out->sync = w->sync->host.lsa_flat_base;
    out->sync_stride4g = w->sync->host.stride4g;
  }
  pthread_mutex_unlock(&w->lock);
  return found;
}

void window_oneshot_prepare(struct ncclComm* comm) {
  if (braid_param_int(BRAID_P_ONESHOT_MAX_BYTES) <= 0 || comm->nranks < 3) return;
  struct braid_windows* w = windows_of(comm);
  if (w == NULL || w->lsa_size != comm->nranks) {
    INFO(BRAID_LOG_INIT | BRAID_LOG_TUNING, "one-shot all-reduce off: %s",
         w == NULL ? "out of host memory for the window state"
                   : "the ranks are not one LSA team (one host, P2P between every pair, cuMem)");
    return;
  }
  if (sym_sync_make(comm) != ncclSuccess)
    INFO(BRAID_LOG_INIT | BRAID_LOG_TUNING, "one-shot all-reduce off: its sync window: %s",
         braid_err_last());
  else
    INFO(BRAID_LOG_INIT | BRAID_LOG_TUNING, "one-shot all-reduce on up to %lld bytes "
         "(BRAID_ONESHOT_MAX_BYTES): sync window of %zu bytes a rank",
         (long long)braid_param_int(BRAID_P_ONESHOT_MAX_BYTES),
         (size_t)BRAID_SYM_SYNC_BYTES(comm->nranks));
}

int window_sym_input(struct ncclComm* comm, const void* ptr, size_t bytes,
                     struct window_sym* out) {
  struct braid_windows* w = __atomic_load_n(&comm->windows, __ATOMIC_ACQUIRE);
  int found = 0;
  if (w == NULL || w->sync == NULL || bytes == 0) return 0;
  pthread_mutex_lock(&w->lock);
  for (struct win* p = w->list; p && !found; p = p->next) {
    if (p->internal || !p->sym_ok) continue;
    const uintptr_t at = (uintptr_t)ptr, base = (uintptr_t)p->user;
    if (at < base || at - base > p->size || bytes > p->size - (at - base)) continue;
    out->input = p->host.lsa_flat_base + (at - base);
    out->stride4g = p->host.stride4g;
    out->sync = w->sync->host.lsa_flat_base;
    out->sync_stride4g = w->sync->host.stride4g;
    found = 1;
  }
  pthread_mutex_unlock(&w->lock);
  return found;
}

/* The registration itself, with the argument checks done: *win set on success. */
static ncclResult_t win_register_now(struct ncclComm* comm, void* buff, size_t size, int flags,
                                     ncclWindow_t* win) {
  ncclResult_t res = ncclSuccess;
  struct win* made = NULL;
  BRAID_CUDA_TRY(cudaSetDevice(comm->cuda_dev));
  enum cudaStreamCaptureMode mode = capture_relax();
  res = sym_sync_make(comm);
  if (res == ncclSuccess) res = win_register(comm, buff, size, flags, 0, ncclSuccess, &made);
  capture_restore(mode);
  BRAID_TRY(res);
  *win = (ncclWindow_t)made->dev;
  return ncclSuccess;
fail:
  return res;
}

/*
 * Runs `run` with a copy of `arg` at the end of the caller's group, on a thread of its own (as
 * deferred inits: group.h's jobs). The job names no comm (its failure is not an init's), but
 * runs after the jobs deferred before it on `comm`.
 */
ncclResult_t defer_to_group_end(struct ncclComm* comm, ncclResult_t (*run)(struct braid_init_job*),
                                const void* arg, size_t bytes, const char* api) {
  void* a = malloc(bytes);
  struct braid_init_job* job = a ? calloc(1, sizeof *job) : NULL;
  if (job == NULL) {
    free(a);
    return braid_err(ncclSystemError, "%s: out of host memory for a call deferred to "
                     "ncclGroupEnd", api);
  }
  memcpy(a, arg, bytes);
  job->run = run;
  job->arg = a;
  job->serial = comm;
  return group_job_dispatch(job, 1, api);
}

/* A registration deferred to the end of the caller's group (group.h's jobs). */
struct win_job {
  struct ncclComm* comm;
  void* buff;
  size_t size;
  int flags;
  ncclWindow_t* out;
};

static ncclResult_t win_job_run(struct braid_init_job* job) {
  struct win_job* a = job->arg;
  ncclResult_t res = comm_check_ready(a->comm, "ncclCommWindowRegister"); /* still there? */
  if (res == ncclSuccess) res = win_register_now(a->comm, a->buff, a->size, a->flags, a->out);
  comm_error_record(a->comm, res);
  return res;
}

NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                             ncclWindow_t* win, int winFlags) {
  ncclResult_t res = ncclSuccess;
  braid_err_clear();
  BRAID_TRY(comm_check_ready(comm, "ncclCommWindowRegister"));
  BRAID_CHECK(win != NULL, ncclInvalidArgument, "ncclCommWindowRegister: win is NULL");
  *win = NULL;
  BRAID_CHECK(winFlags == NCCL_WIN_DEFAULT || winFlags == NCCL_WIN_COLL_SYMMETRIC,
              ncclInvalidArgument, "ncclCommWindowRegister: winFlags = 0x%x is not a known flag",
              (unsigned)winFlags);
  BRAID_CHECK(size > 0, ncclInvalidArgument, "ncclCommWindowRegister: size is 0 (buff %p)", buff);
  BRAID_CHECK(buff != NULL, ncclInvalidArgument, "ncclCommWindowRegister: buff is NULL");
  if (group_depth() > 0) {
    /* Collective: inside a group, one thread may drive several ranks, so each rank's part runs
     * on its own thread at the group's end, as deferred inits do (*win is set then). */
    struct win_job a = {.comm = comm, .buff = buff, .size = size, .flags = winFlags, .out = win};
    return defer_to_group_end(comm, win_job_run, &a, sizeof a, "ncclCommWindowRegister");
  }
  BRAID_TRY(win_register_now(comm, buff, size, winFlags, win));
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommWindowRegister, (ncclComm_t comm, void* buff, size_t size,
           ncclWindow_t* win, int winFlags))

NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  ncclResult_t res = ncclSuccess;
  braid_err_clear();
  BRAID_TRY(comm_check(comm, "ncclCommWindowDeregister"));
  if (win == NULL) return ncclSuccess; /* as NCCL: what a registration without support gives */
  struct braid_windows* w = __atomic_load_n(&comm->windows, __ATOMIC_ACQUIRE);
  struct win* found = w ? win_find(w, win) : NULL;
  BRAID_CHECK(found != NULL && !found->internal, ncclInvalidArgument,
              "ncclCommWindowDeregister: win %p is not a window of rank %d's communicator "
              "(deregistered already, or registered with another communicator)",
              (void*)win, comm->rank);
  BRAID_CUDA_TRY(cudaSetDevice(comm->cuda_dev));
  enum cudaStreamCaptureMode mode = capture_relax();
  win_release(w, found);
  capture_restore(mode);
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))

/* Frees the host records only: device memory, mappings and address ranges stay. */
static void windows_drop_host(struct braid_windows* w) {
  while (w->devcomms) {
    struct devcomm* dc = w->devcomms;
    w->devcomms = dc->next;
    free(dc);
  }
  while (w->list) {
    struct win* win = w->list;
    w->list = win->next;
    free(win->map_va);
    free(win->map_bytes);
    free(win);
  }
  free(w->tables);
  free(w->slots);
  pthread_mutex_destroy(&w->lock);
  free(w);
}

void window_free_all(struct ncclComm* comm) {
  struct braid_windows* w = comm->windows;
  if (w == NULL) return;
  while (w->devcomms) {
    struct devcomm* dc = w->devcomms;
    w->devcomms = dc->next;
    devcomm_free(w, dc);
  }
  while (w->list) win_release(w, w->list); /* the sync window among them */
  w->sync = NULL;
  if (w->sync_mem && ipc_user_free(w->sync_mem) != ncclSuccess)
    WARN("freeing the symmetric all-reduce's sync memory failed: %s", braid_err_last());
  w->sync_mem = NULL;
  for (int i = 0; i < w->ntables; i++)
    if (cudaFree(w->tables[i]) != cudaSuccess)
      WARN("freeing the window table failed: %s", cudaGetErrorString(cudaGetLastError()));
  w->ntables = 0;
  windows_drop_host(w);
  comm->windows = NULL;
}

size_t window_keep_all(struct ncclComm* comm) {
  struct braid_windows* w = comm->windows;
  size_t kept = 0;
  if (w == NULL) return 0;
  for (struct win* win = w->list; win; win = win->next) kept += sizeof *win->dev;
  for (struct devcomm* dc = w->devcomms; dc; dc = dc->next) kept += dc->res ? dc->res->size : 0;
  kept += (size_t)w->ntables * sizeof(struct devapi_window_table);
  windows_drop_host(w);
  comm->windows = NULL;
  return kept;
}
