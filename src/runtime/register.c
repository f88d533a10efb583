/*
 * ncclCommRegister / ncclCommDeregister, and registered buffers used in place (register.h).
 */
#include "runtime/register.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "base/debug.h"
#include "base/param.h"
#include "base/utils.h"
#include "bootstrap/bootstrap.h"
#include "runtime/ce.h"
#include "runtime/ce_fan.h"
#include "runtime/channels.h"
#include "runtime/comm.h"
#include "runtime/group.h"
#include "transport/ipc.h"
#include "transport/transport.h"

#define NCCL_API __attribute__((visibility("default")))
#define NCCL_ALIAS(ret, name, params) NCCL_API ret p##name params __attribute__((alias(#name)));

#define REG_MAGIC 0x4252474dU /* "BRGM" */
#define REG_TAG 0x31000000    /* beside the copy engines' 0x3000000x */
#define REG_WORD_MAGIC 0x52454757U

struct braid_reg {
  uint32_t magic;
  void* buff;
  size_t size;
  struct braid_reg* next;
  /* Its allocation offered to the peer, made at the first operation that wants it. */
  int export_state; /* 0: not yet; 1: offered (desc, offset); -1: cannot (why) */
  struct ipc_mem keep;
  struct ipc_desc desc;
  size_t offset;    /* where buff lies in the allocation */
  cudaEvent_t used; /* recorded after the last launch that used it in place, or NULL */
  char why[320];
};

/* A peer's allocation mapped here. */
struct reg_import {
  struct ipc_desc desc; /* as the peer offered it (its kind, start, size, token) */
  void* va;             /* where it is mapped here */
  size_t resv_bytes;
  struct reg_import* next;
};

/* What one rank tells the other about one operation. */
struct reg_word {
  uint32_t index;
  int32_t ok;          /* the peer may copy into `land`: registered, offered, overlapping nothing */
  uint64_t land_bytes;
  uint64_t offset;     /* land's offset in desc's allocation */
  struct ipc_desc desc;
};

struct reg_head {
  uint32_t magic;
  uint32_t n;
  uint64_t gen; /* the sender's deregistrations so far */
};

struct braid_reg_state {
  struct reg_want* wants;
  int nwants, cap;
  int sent;           /* register_offer sent this group's words */
  struct reg_word* words; /* ... these: register_accept decides from them */
  uint64_t gen;       /* this rank's deregistrations (under comm->lock) */
  uint64_t peer_gen[BRAID_CE_FAN_MAX]; /* each peer's, as last read */
  int peer_gen_known[BRAID_CE_FAN_MAX];
  struct reg_import* imports;
  struct braid_reg* used[64]; /* registrations this group uses in place */
  int nused;
};

/* The comm's state, made at its first use (under `lock`: deregistration reads its count). */
static struct braid_reg_state* reg_state(struct ncclComm* comm) {
  pthread_mutex_lock(&comm->lock);
  if (comm->reg_state == NULL) comm->reg_state = calloc(1, sizeof *comm->reg_state);
  pthread_mutex_unlock(&comm->lock);
  return comm->reg_state;
}

/* The buffer must be device (or managed) memory that the comm's GPU can address. */
static ncclResult_t reg_check_buffer(const struct ncclComm* comm, const void* buff, size_t size,
                                     const char* api) {
  if (buff == NULL) return braid_err(ncclInvalidArgument, "%s: buff is NULL", api);
  if (size == 0) return braid_err(ncclInvalidArgument, "%s: size is 0 (buff %p)", api, buff);
  struct cudaPointerAttributes attr;
  cudaError_t err = cudaPointerGetAttributes(&attr, buff);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return braid_err(ncclInvalidArgument, "%s: buff %p (%zu bytes) is not CUDA memory: %s", api,
                     buff, size, cudaGetErrorString(err));
  }
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    return braid_err(ncclInvalidArgument,
                     "%s: buff %p (%zu bytes) is host memory; only device memory can be "
                     "registered",
                     api, buff, size);
  if (attr.type == cudaMemoryTypeDevice && attr.device != comm->cuda_dev)
    return braid_err(ncclInvalidArgument,
                     "%s: buff %p lives on device %d but rank %d's communicator uses device %d",
                     api, buff, attr.device, comm->rank, comm->cuda_dev);
  return ncclSuccess;
}

NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  ncclResult_t res = ncclSuccess;
  struct braid_reg* reg = NULL;
  braid_err_clear();
  BRAID_TRY(comm_check_ready(comm, "ncclCommRegister"));
  BRAID_CHECK(handle != NULL, ncclInvalidArgument, "ncclCommRegister: handle is NULL");
  *handle = NULL;
  BRAID_TRY(reg_check_buffer(comm, buff, size, "ncclCommRegister"));
  BRAID_TRY(BRAID_CALLOC(&reg, 1, "a buffer registration"));
  reg->magic = REG_MAGIC;
  reg->buff = buff;
  reg->size = size;
  reg->keep.fd = -1;
  pthread_mutex_lock(&comm->lock);
  reg->next = comm->regs;
  comm->regs = reg;
  pthread_mutex_unlock(&comm->lock);
  INFO(BRAID_LOG_REG, "rank %d registered %p (%zu bytes)%s", comm->rank, buff, size,
       register_possible(comm) ? ""
       : comm->nranks == 2 && braid_param_int(BRAID_P_CE_REG_MIN_BYTES) < 0
           ? "; it goes the usual way (BRAID_CE_REG_MIN_BYTES is -1)"
           : "; it goes the usual way (registered buffers are used in place by two ranks "
             "joined by P2P, and by the all-gathers of 3 to 8 ranks that map each other's "
             "memory)");
  *handle = reg;
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void* buff, size_t size, void** handle))

static void reg_release(struct braid_reg* reg) {
  reg->magic = 0;
  if (reg->export_state == 1) ipc_mem_free(&reg->keep); /* the offer; the memory is the user's */
  if (reg->used) (void)cudaEventDestroy(reg->used);
  free(reg);
}

NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  ncclResult_t res = ncclSuccess;
  struct braid_reg** link;
  int busy = 0;
  braid_err_clear();
  BRAID_TRY(comm_check(comm, "ncclCommDeregister"));
  BRAID_CHECK(handle != NULL, ncclInvalidArgument, "ncclCommDeregister: handle is NULL");
  pthread_mutex_lock(&comm->lock);
  for (link = &comm->regs; *link && *link != handle; link = &(*link)->next) {
  }
  struct braid_reg* reg = *link;
  /* The peer's copy engines may still be writing into it, or the kernels reading it. */
  if (reg && reg->used && cudaEventQuery(reg->used) == cudaErrorNotReady) busy = 1;
  (void)cudaGetLastError();
  if (reg && !busy) {
    *link = reg->next;
    if (comm->reg_state) comm->reg_state->gen++;
  }
  pthread_mutex_unlock(&comm->lock);
  BRAID_CHECK(reg != NULL, ncclInvalidArgument,
              "ncclCommDeregister: handle %p is not a registration of rank %d's communicator "
              "(already deregistered, or made by another communicator)",
              handle, comm->rank);
  BRAID_CHECK(!busy, ncclInvalidUsage,
              "ncclCommDeregister: rank %d's buffer %p (%zu bytes) is still in use by an "
              "operation that reads or writes it in place; wait for its stream first (the "
              "registration is kept)",
              comm->rank, reg->buff, reg->size);
  reg_release(reg);
  return ncclSuccess;
fail:
  comm_error_record(comm, res);
  return res;
}
NCCL_ALIAS(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle))

int register_possible(const struct ncclComm* comm) {
  if (comm->nranks > 2) return fan_candidate(comm, SIZE_MAX);
  return comm->nranks == 2 && braid_param_int(BRAID_P_LOCAL_REGISTER) != 0 &&
         braid_param_int(BRAID_P_CE_REG_MIN_BYTES) >= 0 && comm->channels != NULL &&
         comm->channels->nchannels > 0 &&
         comm->channels->ring_send[0].transport == &braid_transport_p2p;
}

/* The registration holding [ptr, ptr + bytes), or NULL; under comm->lock. */
static struct braid_reg* reg_find_locked(struct ncclComm* comm, const void* ptr, size_t bytes) {
  const uintptr_t p = (uintptr_t)ptr;
  for (struct braid_reg* r = comm->regs; r; r = r->next) {
    const uintptr_t b = (uintptr_t)r->buff;
    if (p >= b && p - b <= r->size && bytes <= r->size - (p - b)) return r;
  }
  return NULL;
}

int register_covers(struct ncclComm* comm, const void* ptr, size_t bytes) {
  pthread_mutex_lock(&comm->lock);
  int found = reg_find_locked(comm, ptr, bytes) != NULL;
  pthread_mutex_unlock(&comm->lock);
  return found;
}

int register_want(struct ncclComm* comm, const struct reg_want* w) {
  struct braid_reg_state* st = reg_state(comm);
  if (st == NULL) return 0;
  if (st->nwants == st->cap) {
    int cap = st->cap ? 2 * st->cap : 8;
    struct reg_want* grown = realloc(st->wants, (size_t)cap * sizeof *grown);
    if (grown == NULL) return 0;
    st->wants = grown;
    st->cap = cap;
  }
  st->wants[st->nwants++] = *w;
  return 1;
}

void register_wants_clear(struct ncclComm* comm) {
  if (comm->reg_state) comm->reg_state->nwants = comm->reg_state->sent = 0;
}

int register_pending(const struct ncclComm* comm) {
  return comm->reg_state != NULL && comm->reg_state->nwants > 0;
}

/*
 * Offers reg's allocation to the peers, once (each maps it at its first use): to the one peer
 * of two ranks, or as the copy-engine all-gather's setup chose for every peer (ce_fan.c).
 */
static void reg_export(struct ncclComm* comm, struct braid_reg* reg) {
  if (reg->export_state != 0) return;
  const int peer = 1 - comm->rank;
  char why[192] = "no copy-engine all-gather";
  ipc_kind_t kind = comm->nranks > 2 ? (ipc_kind_t)fan_ipc_kind(comm)
                    : comm->peers[peer].pid_hash == comm->peers[comm->rank].pid_hash
                        ? IPC_LOCAL
                        : ipc_choose_fd(&comm->peers[peer], &comm->peers[comm->rank], why,
                                        sizeof why);
  if (kind != IPC_LOCAL && kind != IPC_CUMEM) {
    if (comm->nranks > 2)
      snprintf(reg->why, sizeof reg->why, "the peers cannot map this process's memory");
    else
      snprintf(reg->why, sizeof reg->why, "rank %d cannot map this process's cuMem memory: %s",
               peer, kind == IPC_NONE ? why : "cuMem sharing is off (NCCL_CUMEM_ENABLE=0?)");
    reg->export_state = -1;
    return;
  }
  if (ipc_win_export(kind, reg->buff, comm->rank, &reg->keep, &reg->desc, &reg->offset) !=
      ncclSuccess) {
    snprintf(reg->why, sizeof reg->why, "%s", braid_err_last());
    (void)cudaGetLastError();
    reg->export_state = -1;
    return;
  }
  if (reg->offset >= reg->desc.bytes || reg->size > reg->desc.bytes - reg->offset) {
    snprintf(reg->why, sizeof reg->why, "it runs past the cuMem allocation holding it");
    ipc_mem_free(&reg->keep);
    reg->export_state = -1;
    return;
  }
  reg->export_state = 1;
}

/* This rank's word on want `w`: may the peer's data land in w->land? */
static void reg_word_make(struct ncclComm* comm, const struct reg_want* w, uint32_t index,
                          struct reg_word* out, char* why, size_t why_size) {
  memset(out, 0, sizeof *out);
  out->index = index;
  out->land_bytes = w->land_bytes;
  why[0] = '\0';
  if (w->land_bytes == 0) { /* nothing lands here */
    out->ok = 1;
    return;
  }
  pthread_mutex_lock(&comm->lock);
  struct braid_reg* land = reg_find_locked(comm, w->land, w->land_bytes);
  struct braid_reg* send = w->send_bytes ? reg_find_locked(comm, w->send, w->send_bytes) : NULL;
  if (land == NULL || (w->send_bytes && send == NULL)) {
    snprintf(why, why_size, "its %s buffer is not registered",
             land == NULL ? "receive" : "send");
  } else if ((braid_ranges_overlap(w->land, w->land_bytes, w->send, w->send_bytes) &&
              w->send != w->in_place) ||
             braid_ranges_overlap(w->land, w->land_bytes, w->own, w->own_bytes)) {
    snprintf(why, why_size, "what it receives overlaps what it sends (in place)");
  } else {
    reg_export(comm, land);
    if (land->export_state == 1) {
      out->ok = 1;
      out->desc = land->desc;
      out->offset = land->offset + (uint64_t)((const char*)w->land - (const char*)land->buff);
    } else {
      snprintf(why, why_size, "%s", land->why);
    }
  }
  pthread_mutex_unlock(&comm->lock);
}

ncclResult_t register_offer(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_reg_state* st = comm->reg_state;
  struct reg_word* words = NULL;
  if (st == NULL || st->nwants == 0) return ncclSuccess;
  st->sent = 0;
  /* Every rank knows whether the copy engines are on (set up together): else none sends. */
  if (!(comm->nranks > 2 ? fan_on(comm, 0) : ce_on(comm, 0))) {
    st->nwants = 0;
    return ncclSuccess;
  }
  BRAID_TRY(BRAID_CALLOC(&words, (size_t)st->nwants, "registered-buffer words"));
  for (int i = 0; i < st->nwants; i++) {
    char why[400];
    reg_word_make(comm, &st->wants[i], (uint32_t)i, &words[i], why, sizeof why);
    if (!words[i].ok)
      INFO(BRAID_LOG_REG, "rank %d: operation %d of the group lands in no registered buffer of "
           "rank %d: %s; it goes the usual way", comm->rank, i, comm->rank, why);
  }
  struct reg_head head = {REG_WORD_MAGIC, (uint32_t)st->nwants, 0};
  pthread_mutex_lock(&comm->lock);
  head.gen = st->gen;
  pthread_mutex_unlock(&comm->lock);
  for (int peer = 0; peer < comm->nranks; peer++) {
    if (peer == comm->rank) continue;
    BRAID_TRY(bootstrap_send(comm->bootstrap, peer, REG_TAG, &head, sizeof head));
    BRAID_TRY(bootstrap_send(comm->bootstrap, peer, REG_TAG + 1, words,
                             (size_t)st->nwants * sizeof *words));
  }
  st->sent = 1;
  free(st->words);
  st->words = words;
  return ncclSuccess;
fail:
  free(words);
  st->nwants = 0;
  return res;
}

/* The peer's allocation `d`, mapped here (at its first use). */
static ncclResult_t reg_import(struct ncclComm* comm, const struct ipc_desc* d, void** va) {
  ncclResult_t res = ncclSuccess;
  struct braid_reg_state* st = comm->reg_state;
  struct reg_import* im = NULL;
  for (im = st->imports; im; im = im->next)
    if (im->desc.kind == d->kind && im->desc.ptr == d->ptr && im->desc.bytes == d->bytes &&
        memcmp(&im->desc.u, &d->u, sizeof d->u) == 0)
      break;
  if (im == NULL) {
    BRAID_TRY(BRAID_CALLOC(&im, 1, "a mapping of a peer's registered buffer"));
    im->desc = *d;
    BRAID_TRY(ipc_va_reserve((size_t)d->bytes, (size_t)d->align, &im->va));
    im->resv_bytes = (size_t)d->bytes;
    res = ipc_map_at(d, im->va, comm->rank, comm->abort_flag);
    if (res != ncclSuccess) {
      ipc_va_release(im->va, im->resv_bytes);
      goto fail;
    }
    im->next = st->imports;
    st->imports = im;
    INFO(BRAID_LOG_REG, "rank %d mapped rank %u's registered allocation (%llu bytes) at %p",
         comm->rank, d->owner_rank, (unsigned long long)d->bytes, im->va);
  }
  *va = im->va;
  return ncclSuccess;
fail:
  free(im);
  return res;
}

static void reg_import_free(struct reg_import* im) {
  ipc_unmap_at(im->va, im->resv_bytes);
  ipc_va_release(im->va, im->resv_bytes);
  free(im);
}

/* Unmaps what was mapped of `peer`'s allocations, once this rank's queued copies are done. */
static void reg_unmap_peer(struct ncclComm* comm, int peer) {
  struct braid_reg_state* st = comm->reg_state;
  ce_quiesce(comm);
  fan_quiesce(comm);
  for (struct reg_import** link = &st->imports; *link;) {
    struct reg_import* im = *link;
    if (im->desc.owner_rank != (uint32_t)peer) {
      link = &im->next;
      continue;
    }
    *link = im->next;
    reg_import_free(im);
  }
}

/* Waits for a peer's words: as long as it takes (a peer may come late), saying so. */
static ncclResult_t reg_recv(struct ncclComm* comm, int peer, int tag, void* data, size_t size) {
  for (int waited = 0;; waited += 10) {
    int late = 0;
    ncclResult_t res = bootstrap_recv_until(comm->bootstrap, peer, tag, data, size,
                                            braid_time_sec() + 10.0, &late);
    if (!late) return res;
    WARN("rank %d has waited %d s for rank %d's word on the registered buffers of this group's "
         "operations: NCCL's rule is that every rank passes registered buffers to an operation "
         "or none does",
         comm->rank, waited + 10, peer);
  }
}

/* Receives one peer's words on this group's `n` operations into `theirs`. */
static ncclResult_t reg_recv_words(struct ncclComm* comm, int peer, int n,
                                   struct reg_word* theirs) {
  ncclResult_t res = ncclSuccess;
  struct braid_reg_state* st = comm->reg_state;
  struct reg_head head;
  struct reg_word* got = NULL;
  BRAID_TRY(reg_recv(comm, peer, REG_TAG, &head, sizeof head));
  BRAID_CHECK(head.magic == REG_WORD_MAGIC, ncclInternalError,
              "rank %d: a garbled registered-buffer message from rank %d", comm->rank, peer);
  BRAID_TRY(BRAID_CALLOC(&got, head.n ? head.n : 1, "registered-buffer words"));
  BRAID_TRY(reg_recv(comm, peer, REG_TAG + 1, got, (size_t)head.n * sizeof *got));
  BRAID_CHECK(head.n == (uint32_t)n, ncclInvalidUsage,
              "rank %d passed registered buffers to %d operations of this group, rank %d to %u: "
              "every rank must pass registered buffers to an operation or none (NCCL's rule)",
              comm->rank, n, peer, head.n);
  memcpy(theirs, got, (size_t)n * sizeof *theirs);
  free(got);
  got = NULL;
  /*
   * The peer deregistered something since its last words: what this rank mapped of it may be
   * gone and its address reused (the same start and size in the same process), so its
   * mappings go before any lookup. Its deregistration came after its operations on that buffer
   * had finished, but this rank's copies into its other buffers may still be queued (this
   * rank's stream held back): those are waited for first.
   */
  if (st->peer_gen_known[peer] && head.gen != st->peer_gen[peer]) reg_unmap_peer(comm, peer);
  st->peer_gen[peer] = head.gen;
  st->peer_gen_known[peer] = 1;
  return ncclSuccess;
fail:
  free(got);
  return res;
}

ncclResult_t register_accept(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_reg_state* st = comm->reg_state;
  struct reg_word* mine = st ? st->words : NULL;
  struct reg_word* theirs = NULL; /* [peer][op]: every peer's words */
  if (st == NULL || !st->sent) return ncclSuccess;
  st->sent = 0;
  const int n = st->nwants, nr = comm->nranks;
  st->nwants = 0;
  BRAID_TRY(BRAID_CALLOC(&theirs, (size_t)nr * (size_t)(n ? n : 1), "registered-buffer words"));
  /* Every peer's words, whatever one of them says: each peer waits for this rank's reading. */
  for (int peer = 0; peer < nr; peer++) {
    if (peer == comm->rank) continue;
    ncclResult_t r = reg_recv_words(comm, peer, n, theirs + (size_t)peer * n);
    if (res == ncclSuccess) res = r;
  }
  BRAID_TRY(res);
  st->nused = 0;
  for (int i = 0; i < n; i++) {
    const struct reg_want* w = &st->wants[i];
    int all = mine[i].ok;
    for (int peer = 0; peer < nr; peer++)
      if (peer != comm->rank && !theirs[(size_t)peer * n + i].ok) all = 0;
    if (!all) continue; /* every rank concludes the same */
    char* peer_out[BRAID_CE_FAN_MAX] = {NULL};
    for (int peer = 0; peer < nr; peer++) {
      const struct reg_word* t = &theirs[(size_t)peer * n + i];
      if (peer == comm->rank) continue;
      /* Two ranks: what this one sends lands there; more: every output is the same size. */
      const uint64_t want = nr > 2 ? (uint64_t)w->land_bytes : (uint64_t)w->send_bytes;
      BRAID_CHECK(t->land_bytes == want, ncclInvalidUsage,
                  "rank %d %s %llu bytes in operation %d of this group but rank %d receives "
                  "%llu", comm->rank, nr > 2 ? "receives" : "sends", (unsigned long long)want, i,
                  peer, (unsigned long long)t->land_bytes);
      if (w->send_bytes > 0) {
        void* va = NULL;
        BRAID_TRY(reg_import(comm, &t->desc, &va));
        peer_out[peer] = (char*)va + t->offset;
      }
    }
    if (w->send_op) {
      w->send_op->reg_direct = 1;
      w->send_op->reg_peer_out = nr > 2 ? NULL : peer_out[1 - comm->rank];
      memcpy(w->send_op->reg_peer_outs, peer_out, sizeof peer_out);
    }
    if (w->recv_op) w->recv_op->reg_direct = 1;
    pthread_mutex_lock(&comm->lock);
    struct braid_reg* regs[2] = {
        w->land_bytes ? reg_find_locked(comm, w->land, w->land_bytes) : NULL,
        w->send_bytes ? reg_find_locked(comm, w->send, w->send_bytes) : NULL};
    for (int k = 0; k < 2; k++)
      if (regs[k] && st->nused < (int)(sizeof st->used / sizeof st->used[0]))
        st->used[st->nused++] = regs[k];
    pthread_mutex_unlock(&comm->lock);
  }
  free(theirs);
  return ncclSuccess;
fail:
  free(theirs);
  return res;
}

void register_mark_used(struct ncclComm* comm, cudaStream_t stream) {
  struct braid_reg_state* st = comm->reg_state;
  if (st == NULL || st->nused == 0) return;
  pthread_mutex_lock(&comm->lock);
  for (int i = 0; i < st->nused; i++) {
    struct braid_reg* reg = NULL;
    for (reg = comm->regs; reg && reg != st->used[i]; reg = reg->next) {
    }
    if (reg == NULL) continue; /* deregistered meanwhile */
    if (reg->used == NULL &&
        cudaEventCreateWithFlags(&reg->used, cudaEventDisableTiming) != cudaSuccess)
      reg->used = NULL;
    if (reg->used) (void)cudaEventRecord(reg->used, stream);
  }
  (void)cudaGetLastError();
  st->nused = 0;
  pthread_mutex_unlock(&comm->lock);
}

void register_free_all(struct ncclComm* comm) {
  while (comm->regs) {
    struct braid_reg* next = comm->regs->next;
    reg_release(comm->regs);
    comm->regs = next;
  }
  if (comm->reg_state) {
    /* Unmapped already (register_unmap_all) unless the kernels were stuck: then kept. */
    while (comm->reg_state->imports) {
      struct reg_import* next = comm->reg_state->imports->next;
      free(comm->reg_state->imports);
      comm->reg_state->imports = next;
    }
    free(comm->reg_state->words);
    free(comm->reg_state->wants);
    free(comm->reg_state);
    comm->reg_state = NULL;
  }
}

void register_unmap_all(struct ncclComm* comm) {
  struct braid_reg_state* st = comm->reg_state;
  if (st == NULL) return;
  while (st->imports) {
    struct reg_import* next = st->imports->next;
    reg_import_free(st->imports);
    st->imports = next;
  }
}
