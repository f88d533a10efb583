/*
 * The copy-engine exchange of two ranks within a host.
 *
 * An SM kernel writing to a peer over NVLink tops out below the copy
 * engines (on 2x H100 NV18: 364 against 392 GB/s each way, both ways at
 * once; docs/tuning.md, BRAID_CE_MIN_BYTES), and every byte a kernel moves costs SM
 * time. For large operations of a two-rank communicator joined by P2P, each
 * rank here hands its data to the copy engines, chunk by chunk, into scratch
 * slots in the peer's memory, and runs one small kernel that takes the
 * peer's chunks as they land in its own slots: reduced with its own data
 * (all-reduce, reduce-scatter) or copied (all-gather, broadcast, send/receive). The
 * links carry the same bytes as the kernels'; the SMs only reduce or copy
 * within local memory.
 *
 * Each rank has one allocation: a flag page (ce_args.h's braid_ce_flags)
 * and `nslots` slots. Chunks are numbered over the communicator's life, in
 * each direction (a rank's send_seq is the peer's recv_seq: both chunk a
 * direction alike, from its size), so one side may send nothing; chunk g
 * goes to slot g % nslots, on copy stream g % 2 (two streams, so one copies
 * while the other steps). On chunk g's copy stream:
 *   step: publish the stream's previous chunk p (the peer's arrived[p's slot]
 *         = p + 1, and in place my sent[g % 2] = p + 1), then wait until my
 *         freed[slot] >= g - nslots + 1 (the peer is done with the slot's
 *         previous chunk)
 *   cudaMemcpyAsync(peer slot, my chunk)
 * and a last step on each stream publishes its last chunk. A step is a
 * one-thread kernel (ce.h): stream order makes the copy before it complete.
 * The kernel on the user's stream waits in every block for arrived[slot]
 * (and sent), takes its share of the chunk, and the last block through
 * writes the peer's freed[slot] = g + 1. Every wait compares sequence
 * numbers, so no word is ever reset.
 *
 * With registered buffers on both ranks (runtime/register.c) a chunk goes
 * straight to its place in the peer's buffer instead of a slot: each copy
 * stream's first step then waits for the peer's kernel to have started the
 * operation (the `ready` word it raises: its buffer is free from then on),
 * not for a free slot; the peer's kernel still raises `freed`, so both kinds
 * of chunk share one numbering. Landed copies of nothing to reduce go in two
 * chunks, one per copy stream.
 *
 * Every wait is a kernel's, never the driver's stream memory operations
 * (cuStreamWaitValue32): CUDA documents that the order they set up is
 * invisible to its scheduler, which may map two streams onto one hardware
 * queue so that such a wait blocks the very write it waits for; and only a
 * kernel sees the abort flag. The flags are written by the same kernels (a
 * step publishes its stream's copy before).
 *
 * Not used under stream capture (a graph would replay fixed sequence
 * numbers); ranks must then capture alike, as they must for NCCL.
 */
#include "runtime/ce.h"

#include <cuda.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi/ce_args.h"
#include "abi/kernel_table.h"
#include "runtime/comm.h"
#include "bootstrap/bootstrap.h"
#include "base/debug.h"
#include "runtime/dev_state.h"
#include "base/param.h"
#include "runtime/redop.h"
#include "base/utils.h"
#include "graph/tune_table.h"
#include "runtime/channels.h"
#include "transport/ipc.h"

#define CE_TAG 0x30000000 /* beside the transport's 0x4... and the checker's 0x2... tags */

/*
 * The slots begin 2 MB into the allocation, after the flag page and a gap: the copy engines
 * wrote slots 4 KB in at ~245 GB/s, 64 KB or 2 MB in at ~335 (2x H100, 16 MB chunks;
 * docs/tuning.md, Copy-engine slot offset).
 */
#define CE_SLOTS_OFFSET ((size_t)2 << 20)

typedef CUresult (*ce_copy_fn)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);

/*
 * NONE -> SENT (ce_setup) -> AGREEING (ce_connect) -> READY or UNUSABLE
 * (ce_agree); READY -> BROKEN when an exchange fails half-way.
 */
enum ce_state { CE_NONE = 0, CE_SENT, CE_AGREEING, CE_READY, CE_UNUSABLE, CE_BROKEN };

struct braid_ce {
  enum ce_state state;
  int usable;     /* this rank can: kernels, the driver's copy, its scratch allocated */
  int mapped_ok;  /* this rank mapped the peer's scratch and made its streams (ce_connect) */
  char* mem;      /* flag page, then the slots */
  char* peer_mem; /* the peer's, as mapped here */
  struct ipc_mem own;  /* `mem`'s allocation, shared with the peer */
  struct ipc_map map;  /* the peer's scratch as mapped here (`peer_mem`) */
  size_t slot_bytes;
  uint32_t nslots;
  uint64_t send_seq;    /* chunks sent so far (the peer's recv_seq) */
  uint64_t recv_seq;    /* chunks received so far (the peer's send_seq) */
  uint32_t land_out;    /* exchanges whose chunks this rank copied into the peer's buffer */
  uint32_t land_in;     /* exchanges whose chunks landed in this rank's (the peer's land_out) */
  cudaStream_t copy[2]; /* the copy engines' work: chunk g on copy[g % 2] */
  cudaStream_t aux;     /* reading the flag page at free */
  cudaEvent_t fork, join[2];
  const void* step_kernel;
  ce_copy_fn copy_fn; /* cuMemcpyDtoDAsync */
  /* BRAID_CE_TRACE=1 (measurement only): events around each copy, read back per operation. */
  int trace;
  cudaEvent_t* tev; /* 2 per chunk: before, after */
  int ntev;
};

#define CE_TRACE_CHUNKS 1024

struct ce_info {
  int usable;
  struct ipc_desc scratch;
  uint64_t slot_bytes;
  uint32_t nslots;
};

static size_t ce_slot_bytes(void) {
  int64_t v = braid_param_int(BRAID_P_CE_SLOT_BYTES);
  if (v < (1 << 20)) v = 1 << 20;
  if (v > (1ll << 30)) v = 1ll << 30;
  return BRAID_ALIGN_UP((size_t)v, 4096);
}

static uint32_t ce_nslots(void) {
  int64_t v = braid_param_int(BRAID_P_CE_NSLOTS);
  if (v < 2) v = 2;
  if (v > BRAID_CE_MAX_SLOTS) v = BRAID_CE_MAX_SLOTS;
  /* A power of two: the kernel's 32-bit chunk numbers then pick the host's 64-bit ones' slots. */
  uint32_t p = 2;
  while (p * 2 <= (uint64_t)v) p *= 2;
  return p;
}

int ce_nblocks(void) {
  int64_t v = braid_param_int(BRAID_P_CE_NBLOCKS);
  return v < 1 ? 1 : v > BRAID_MAX_GRID ? BRAID_MAX_GRID : (int)v;
}

int ce_candidate(const struct ncclComm* comm, int coll, size_t bytes) {
  int64_t min = braid_param_int(BRAID_P_CE_MIN_BYTES);
  if (min == 0 && coll >= 0 && coll < BRAID_COLL_COUNT) min = tune_table.ce_min_bytes[coll];
  if (min <= 0 || bytes < (size_t)min || comm->nranks != 2) return 0;
  if (comm->channels == NULL || comm->channels->nchannels == 0) return 0;
  return comm->channels->ring_send[0].transport == &braid_transport_p2p;
}

int ce_ready(const struct ncclComm* comm, int coll, size_t bytes, int capturing) {
  return ce_on(comm, capturing) && ce_candidate(comm, coll, bytes);
}

int ce_on(const struct ncclComm* comm, int capturing) {
  return !capturing && comm->ce && comm->ce->state == CE_READY;
}

void ce_want(struct ncclComm* comm) { comm->ce_wanted = 1; }

int ce_pending(const struct ncclComm* comm) {
  return comm->ce_wanted && comm->nranks == 2 &&
         (comm->ce == NULL || comm->ce->state == CE_SENT || comm->ce->state == CE_AGREEING);
}

/* Whether this rank can run the exchange at all (the peer says the same for itself). */
static int ce_usable_here(struct braid_ce* ce) {
  ce->step_kernel = braid_ce_step_kernel();
  /* The driver's device-to-device copy: both ends are device memory mapped here. */
  ce->copy_fn = (ce_copy_fn)braid_driver_fn("cuMemcpyDtoDAsync");
  return braid_ce_kernel_table[ncclUint8] != NULL && ce->step_kernel != NULL &&
         ce->copy_fn != NULL; /* else a host-only build */
}

/*
 * Loads every exchange kernel now: with CUDA's lazy loading a kernel's
 * module loads at its first launch, which can wait for other work on the
 * device, such as a peer's kernel spinning on this one (dev_state.c).
 */
static ncclResult_t ce_kernels_load(const void* step_kernel) {
  ncclResult_t res = ncclSuccess;
  struct cudaFuncAttributes step_attr;
  BRAID_CUDA_TRY(cudaFuncGetAttributes(&step_attr, step_kernel));
  for (int t = 0; t < ncclNumTypes; t++) {
    for (int op = 0; op < BRAID_DEVOP_COUNT; op++) {
      struct cudaFuncAttributes attr;
      BRAID_CUDA_TRY(cudaFuncGetAttributes(&attr, braid_ce_kernel_table[t][op]));
    }
  }
  return ncclSuccess;
fail:
  return res;
}

/*
 * This rank's scratch, exported. A failure here (out of device memory, say)
 * is not the caller's: the exchange is left off on both ranks (the peer
 * learns it from the info sent) and the kernels run instead.
 */
static ncclResult_t ce_scratch(struct ncclComm* comm, struct braid_ce* ce, struct ce_info* info) {
  ncclResult_t res = ncclSuccess;
  char why[512];
  size_t bytes = CE_SLOTS_OFFSET + ce->nslots * ce->slot_bytes;
  ipc_kind_t kind =
      ipc_choose(&comm->peers[1 - comm->rank], &comm->peers[comm->rank], why, sizeof why);
  BRAID_CHECK(kind != IPC_NONE, ncclInternalError, "%s", why);
  BRAID_TRY(ce_kernels_load(ce->step_kernel));
  BRAID_CUDA_TRY(cudaStreamCreateWithFlags(&ce->aux, cudaStreamNonBlocking));
  /* Zeroed before the peer learns the address (ipc_mem_alloc). */
  BRAID_TRY(ipc_mem_alloc(kind, comm->rank, bytes, &ce->own, &info->scratch));
  ce->mem = ce->own.ptr;
  INFO(BRAID_LOG_ALLOC, "copy-engine scratch: %u slots of %zu bytes at %p", ce->nslots,
       ce->slot_bytes, ce->mem);
  return ncclSuccess;
fail:
  return res;
}

ncclResult_t ce_setup(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct ce_info info;
  if (!comm->ce_wanted || comm->nranks != 2 || comm->ce != NULL) return ncclSuccess;
  BRAID_TRY(BRAID_CALLOC(&comm->ce, 1, "copy-engine state"));
  struct braid_ce* ce = comm->ce;
  memset(&info, 0, sizeof info);
  ce->slot_bytes = ce_slot_bytes();
  ce->nslots = ce_nslots();
  ce->usable = ce_usable_here(ce);
  /*
   * The copy engines write into a GPU this process cannot see (CUDA_VISIBLE_DEVICES) no faster
   * than the SMs do (about 367 GB/s each way on 2x H200, 390 with the GPU visible; docs/tuning.md,
   * BRAID_CE_MIN_BYTES), so the exchange would add only its own costs: the kernels move the
   * data. The peer learns it from the info below.
   */
  const struct braid_peer_info* peer_info = &comm->peers[1 - comm->rank];
  if (ce->usable && !ipc_sees_gpu(&comm->peers[comm->rank], peer_info->dev_bus_id)) {
    INFO(BRAID_LOG_INIT, "copy-engine exchange off: rank %d cannot see rank %d's GPU "
         "(CUDA_VISIBLE_DEVICES), the kernels move the data", comm->rank, 1 - comm->rank);
    ce->usable = 0;
  }
  if (ce->usable && ce_scratch(comm, ce, &info) != ncclSuccess) {
    WARN(
        "rank %d: copy-engine exchange left off, its scratch could not be set up (%u x %zu "
        "bytes): %s",
        comm->rank, ce->nslots, ce->slot_bytes, braid_err_last());
    (void)cudaGetLastError();
    ipc_mem_free(&ce->own);
    ce->mem = NULL;
    ce->usable = 0;
  }
  info.usable = ce->usable;
  info.slot_bytes = ce->slot_bytes;
  info.nslots = ce->nslots;
  BRAID_TRY(bootstrap_send(comm->bootstrap, 1 - comm->rank, CE_TAG, &info, sizeof info));
  ce->state = CE_SENT;
  return ncclSuccess;
fail:
  return res;
}

/* Maps the peer's scratch and makes the streams; a failure leaves what was made for ce_free. */
static ncclResult_t ce_map(struct ncclComm* comm, struct braid_ce* ce,
                           const struct ce_info* theirs) {
  ncclResult_t res = ncclSuccess;
  BRAID_CHECK(braid_param_int(BRAID_P_CE_FAIL_CONNECT) != comm->rank, ncclInternalError,
              "rank %d's copy-engine setup fails on purpose (BRAID_CE_FAIL_CONNECT)", comm->rank);
  /* Same process: peer access is on (the ring's P2P link); else the peer's export, mapped. */
  BRAID_TRY(ipc_mem_map(&theirs->scratch, comm->rank, comm->abort_flag, &ce->map));
  ce->peer_mem = ce->map.ptr;
  for (int i = 0; i < 2; i++) {
    BRAID_CUDA_TRY(cudaStreamCreateWithFlags(&ce->copy[i], cudaStreamNonBlocking));
    BRAID_CUDA_TRY(cudaEventCreateWithFlags(&ce->join[i], cudaEventDisableTiming));
  }
  BRAID_CUDA_TRY(cudaEventCreateWithFlags(&ce->fork, cudaEventDisableTiming));
  if (braid_param_int(BRAID_P_CE_TRACE) > 0) {
    BRAID_TRY(BRAID_CALLOC(&ce->tev, 2 * CE_TRACE_CHUNKS + 1, "copy-engine trace events"));
    for (; ce->ntev < 2 * CE_TRACE_CHUNKS + 1; ce->ntev++)
      BRAID_CUDA_TRY(cudaEventCreate(&ce->tev[ce->ntev]));
    ce->trace = 1;
  }
  return ncclSuccess;
fail:
  return res;
}

/*
 * Setup's second phase: the peer's info, then this rank's mapping of its
 * scratch, whose outcome goes to the peer (the third phase, ce_agree, reads
 * the peer's): a rank must not use the exchange while the other runs the
 * kernels, so either rank failing leaves it off on both.
 */
ncclResult_t ce_connect(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_ce* ce = comm->ce;
  struct ce_info theirs;
  const int peer = 1 - comm->rank;
  if (ce == NULL || ce->state != CE_SENT) return ncclSuccess;
  BRAID_TRY(bootstrap_recv(comm->bootstrap, peer, CE_TAG, &theirs, sizeof theirs));
  if (!ce->usable || !theirs.usable) {
    INFO(BRAID_LOG_INIT,
         "copy-engine exchange off: rank %d cannot run it (no kernels, no "
         "driver copy, or no scratch)",
         ce->usable ? peer : comm->rank);
    ce->state = CE_UNUSABLE; /* both ranks conclude the same, with no more messages */
    return ncclSuccess;
  }
  /* Both ranks check both sizes: a mismatch fails the call on both. */
  BRAID_CHECK(theirs.slot_bytes == ce->slot_bytes && theirs.nslots == ce->nslots, ncclInvalidUsage,
              "rank %d has %u copy-engine slots of %llu bytes but rank %d has %u of %zu; set the "
              "same BRAID_CE_SLOT_BYTES and BRAID_CE_NSLOTS on every rank",
              peer, theirs.nslots, (unsigned long long)theirs.slot_bytes, comm->rank, ce->nslots,
              ce->slot_bytes);
  int32_t ok = ce_map(comm, ce, &theirs) == ncclSuccess;
  if (!ok) {
    WARN(
        "rank %d: copy-engine exchange left off on both ranks (the error above); the kernels run "
        "instead",
        comm->rank);
    (void)cudaGetLastError();
  }
  BRAID_TRY(bootstrap_send(comm->bootstrap, peer, CE_TAG + 1, &ok, sizeof ok));
  ce->mapped_ok = ok;
  ce->state = CE_AGREEING;
  return ncclSuccess;
fail:
  ce->state = CE_UNUSABLE;
  return res;
}

/*
 * Drops what a setup that both ranks gave up made: nothing will run through
 * it. The scratch stays until ce_free: the peer may still have it mapped.
 */
static void ce_release(struct braid_ce* ce) {
  for (int i = 0; i < 2; i++) {
    if (ce->copy[i]) (void)cudaStreamDestroy(ce->copy[i]);
    if (ce->join[i]) (void)cudaEventDestroy(ce->join[i]);
    ce->copy[i] = NULL;
    ce->join[i] = NULL;
  }
  if (ce->fork) (void)cudaEventDestroy(ce->fork);
  ipc_mem_unmap(&ce->map);
  ce->fork = NULL;
  ce->peer_mem = NULL;
  (void)cudaGetLastError();
}

ncclResult_t ce_agree(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct braid_ce* ce = comm->ce;
  int32_t theirs = 0;
  const int peer = 1 - comm->rank;
  if (ce == NULL || ce->state != CE_AGREEING) return ncclSuccess;
  ce->state = CE_UNUSABLE; /* until both are known to be ready */
  BRAID_TRY(bootstrap_recv(comm->bootstrap, peer, CE_TAG + 1, &theirs, sizeof theirs));
  if (!ce->mapped_ok || !theirs) {
    if (ce->mapped_ok)
      INFO(BRAID_LOG_INIT, "copy-engine exchange off: rank %d could not set it up", peer);
    ce_release(ce);
    return ncclSuccess;
  }
  ce->state = CE_READY;
  INFO(BRAID_LOG_INIT, "copy-engine exchange with rank %d ready", peer);
  return ncclSuccess;
fail:
  ce_release(ce);
  return res;
}

#define CE_FREED(slot) (offsetof(struct braid_ce_flags, freed) + (slot) * sizeof(uint32_t))
#define CE_ARRIVED(slot) (offsetof(struct braid_ce_flags, arrived) + (slot) * sizeof(uint32_t))
#define CE_SENT(i) (offsetof(struct braid_ce_flags, sent) + (i) * sizeof(uint32_t))

void ce_fail(struct ncclComm* comm, ncclResult_t res) {
  if (comm->ce == NULL || comm->ce->state != CE_READY) return;
  comm->ce->state = CE_BROKEN;
  WARN("rank %d: an operation through the copy engines failed; this communicator is unusable",
       comm->rank);
  comm_fail_async(comm, res);
}

/* Bytes per chunk: a slot, or less for operations of a few slots (the pipeline fills sooner). */
static size_t ce_chunk_bytes(const struct braid_ce* ce, size_t bytes, int landed_copy) {
  /* Landed copies leave the kernel nothing to overlap: two chunks, one per copy stream. */
  if (landed_copy) return BRAID_MAX(BRAID_ALIGN_UP(bytes / 2, 1 << 20), (size_t)1 << 20);
  size_t want = BRAID_ALIGN_UP(bytes / 8, 1 << 20);
  if (want < (1 << 20)) want = 1 << 20;
  return want < ce->slot_bytes ? want : ce->slot_bytes;
}

static ncclResult_t ce_launch(const struct braid_ce_args* a, int dtype, int devop, int grid,
                              cudaStream_t stream) {
  ncclResult_t res = ncclSuccess;
  void* params[] = {(void*)a};
  dim3 g = {(unsigned)grid, 1, 1}, b = {BRAID_CE_THREADS, 1, 1};
  BRAID_CUDA_TRY(cudaLaunchKernel(braid_ce_kernel_table[dtype][devop], g, b, params, 0, stream));
  return ncclSuccess;
fail:
  return res;
}

/*
 * Sends `bytes` from `src` in chunks of `chunk` on the copy streams (top comment): into the
 * peer's slots, or with `dst` (the peer's registered buffer, mapped here) straight there, each
 * stream's first copy waiting until the peer's kernel has said so (ready >= ready_want).
 */
static ncclResult_t ce_send(struct ncclComm* comm, struct braid_ce* ce, const char* src,
                            size_t bytes, size_t chunk, char* dst, uint32_t ready_want) {
  ncclResult_t res = ncclSuccess;
  const uint64_t nchunks = bytes == 0 ? 0 : (bytes + chunk - 1) / chunk;
  /* Per copy stream, the chunk it copied last and has yet to publish (-1: none). */
  int64_t unpublished[2] = {-1, -1};
  for (uint64_t k = 0; k <= nchunks; k++) {
    const uint64_t g = ce->send_seq + k;
    for (int i = 0; i < 2; i++) {
      /* Before chunk g's copy on its stream; after the last chunk, on both streams. */
      if (k < nchunks && (uint64_t)i != (g & 1)) continue;
      struct braid_ce_step st;
      memset(&st, 0, sizeof st);
      st.abort_flag = comm->dev->host.abort_flag;
      if (unpublished[i] >= 0) {
        const uint64_t p = (uint64_t)unpublished[i];
        st.arrived = (uint32_t*)(ce->peer_mem + CE_ARRIVED(p % ce->nslots));
        st.sent =
            (uint32_t*)(ce->mem + CE_SENT(i)); /* always: a stale word could read as reached */
        st.value = (uint32_t)(p + 1);
      }
      if (k < nchunks && dst != NULL) {
        if (k < 2) { /* the stream's first copy into the peer's buffer */
          st.freed = (const uint32_t*)(ce->mem + offsetof(struct braid_ce_flags, ready));
          st.want = ready_want;
        }
      } else if (k < nchunks &&
                 g >= ce->nslots) { /* the slot held chunk g - nslots: the peer must be done */
        st.freed = (const uint32_t*)(ce->mem + CE_FREED(g % ce->nslots));
        st.want = (uint32_t)(g - ce->nslots + 1);
      }
      if (st.arrived || st.freed) {
        void* params[] = {&st};
        dim3 one = {1, 1, 1};
        BRAID_CUDA_TRY(cudaLaunchKernel(ce->step_kernel, one, one, params, 0, ce->copy[i]));
      }
      unpublished[i] = -1;
    }
    if (k == nchunks) break;
    const size_t len = bytes - k * chunk < chunk ? bytes - k * chunk : chunk;
    if (ce->trace && k < CE_TRACE_CHUNKS)
      BRAID_CUDA_TRY(cudaEventRecord(ce->tev[2 * k], ce->copy[g & 1]));
    char* to = dst ? dst + k * chunk
                   : ce->peer_mem + CE_SLOTS_OFFSET + (g % ce->nslots) * ce->slot_bytes;
    CUresult r = ce->copy_fn((CUdeviceptr)(uintptr_t)to, (CUdeviceptr)(uintptr_t)(src + k * chunk),
                             len, (CUstream)ce->copy[g & 1]);
    BRAID_CHECK(r == CUDA_SUCCESS, ncclUnhandledCudaError,
                "rank %d: cuMemcpyDtoDAsync of %zu bytes to rank %d's %s failed (CUresult %d)",
                comm->rank, len, 1 - comm->rank,
                dst ? "registered buffer" : "copy-engine slot", (int)r);
    if (ce->trace && k < CE_TRACE_CHUNKS)
      BRAID_CUDA_TRY(cudaEventRecord(ce->tev[2 * k + 1], ce->copy[g & 1]));
    unpublished[g & 1] = (int64_t)g;
  }
  ce->send_seq += nchunks;
  return ncclSuccess;
fail:
  return res;
}

/*
 * BRAID_CE_TRACE=1: after the operation's copies (synchronizing: measurement only), one line
 * with the copies' span, their summed time, the largest and summed gaps between a stream's
 * copies, and when the kernel ended after the last copy.
 */
static void ce_trace_report(struct ncclComm* comm, struct braid_ce* ce, uint64_t nsend,
                            size_t chunk, cudaEvent_t kernel_end) {
  uint64_t n = nsend < CE_TRACE_CHUNKS ? nsend : CE_TRACE_CHUNKS;
  if (n == 0 || cudaEventSynchronize(ce->tev[2 * n - 1]) != cudaSuccess ||
      cudaEventSynchronize(kernel_end) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  float copy_sum = 0, gap_sum = 0, gap_max = 0, span = 0, kend = 0, t;
  for (uint64_t k = 0; k < n; k++) {
    if (cudaEventElapsedTime(&t, ce->tev[2 * k], ce->tev[2 * k + 1]) == cudaSuccess) copy_sum += t;
    if (k >= 2 && cudaEventElapsedTime(&t, ce->tev[2 * (k - 2) + 1], ce->tev[2 * k]) == cudaSuccess) {
      gap_sum += t;
      if (t > gap_max) gap_max = t;
    }
  }
  (void)cudaEventElapsedTime(&span, ce->tev[0], ce->tev[2 * n - 1]);
  (void)cudaEventElapsedTime(&kend, ce->tev[2 * n - 1], kernel_end);
  (void)cudaGetLastError();
  INFO(BRAID_LOG_COLL,
       "rank %d copy-engine trace: %llu chunks of %zu B: span %.1f us (%.1f GB/s), copies %.1f us "
       "(%.1f us each), stream gaps %.1f us (largest %.1f), kernel ends %.1f us after the last copy",
       comm->rank, (unsigned long long)n, chunk, span * 1e3, (double)n * chunk / (span * 1e6),
       copy_sum * 1e3, copy_sum * 1e3 / n, gap_sum * 1e3, gap_max * 1e3, kend * 1e3);
}

ncclResult_t ce_exchange(struct ncclComm* comm, const struct braid_ce_op* op, cudaStream_t stream,
                         uint64_t ledger_seq) {
  ncclResult_t res = ncclSuccess;
  struct braid_ce* ce = comm->ce;
  const size_t esize = redop_type_size(op->dtype);
  const size_t send_bytes = op->send_count * esize, recv_bytes = op->count * esize;
  /* Both ends of a direction chunk it alike: from its size (1 MB multiples hold any type). */
  const size_t send_chunk =
      ce_chunk_bytes(ce, send_bytes, op->peer_out != NULL && !op->reduce) / esize * esize;
  const size_t recv_chunk =
      ce_chunk_bytes(ce, recv_bytes, op->landed && !op->reduce) / esize * esize;
  const uint64_t nrecv = recv_bytes == 0 ? 0 : (recv_bytes + recv_chunk - 1) / recv_chunk;
  const uint64_t nsend = send_bytes == 0 ? 0 : (send_bytes + send_chunk - 1) / send_chunk;
  struct braid_ce_args a;
  memset(&a, 0, sizeof a);
  a.comm = comm->dev->comm;
  a.flags = (struct braid_ce_flags*)ce->mem;
  a.peer_freed = ((struct braid_ce_flags*)ce->peer_mem)->freed;
  a.slots = ce->mem + CE_SLOTS_OFFSET;
  a.own = op->own;
  a.out = op->out;
  a.count = op->count;
  a.chunk_elems = recv_chunk / esize;
  a.slot_bytes = ce->slot_bytes;
  a.scalar = op->scalar;
  a.scalar_device = op->scalar_device;
  a.ledger_seq = ledger_seq;
  a.seq0 = (uint32_t)ce->recv_seq;
  a.nslots = ce->nslots;
  a.own_out = op->reduce ? NULL : op->own_out;
  a.mode = op->reduce ? BRAID_CE_REDUCE : BRAID_CE_COPY;
  a.mine_first = comm->rank == 0;
  if (op->landed && nrecv > 0) {
    a.landed = 1;
    a.ready_value = ++ce->land_in;
    a.peer_ready = (uint32_t*)(ce->peer_mem + offsetof(struct braid_ce_flags, ready));
  }
  uint32_t ready_want = 0;
  if (op->peer_out != NULL && nsend > 0) ready_want = ++ce->land_out;
  /*
   * The output is what goes out (in place, one size): chunk k may be written once this rank's
   * chunk k is copied out (both directions are chunked alike).
   */
  const char* send = op->send;
  void* staged = NULL;
  if (!op->landed && braid_ranges_overlap(op->send, send_bytes, op->out, recv_bytes)) {
    if (op->send == op->out && send_bytes == recv_bytes) {
      a.wait_sent = BRAID_CE_SENT_CHUNK;
      a.sent0 = (uint32_t)ce->send_seq;
    } else {
      /*
       * Any other overlap: send from a copy. Waiting for all of this rank's chunks to be out
       * before writing could deadlock (both ranks waiting on slots the other frees).
       */
      BRAID_CUDA_TRY(cudaMallocAsync(&staged, send_bytes, stream));
      BRAID_CUDA_TRY(
          cudaMemcpyAsync(staged, op->send, send_bytes, cudaMemcpyDeviceToDevice, stream));
      send = staged;
    }
  }
  int devop = op->reduce ? op->devop : 0;
  int dtype = op->reduce ? op->dtype : ncclUint8;
  if (!op->reduce) { /* a copy moves bytes, whatever the type */
    a.count = recv_bytes;
    a.chunk_elems = recv_chunk;
  }
  /* The report waits for each copy stream's last chunk of this operation (ce_args.h). */
  for (uint64_t g = ce->send_seq + (nsend > 2 ? nsend - 2 : 0); g < ce->send_seq + nsend; g++) {
    a.sent_last[g & 1] = (uint32_t)(g + 1);
    a.sent_wait |= 1 << (g & 1);
  }
  /* The copy streams start after what the user's stream holds (the data to send is ready). */
  BRAID_CUDA_TRY(cudaEventRecord(ce->fork, stream));
  for (int i = 0; i < 2; i++) BRAID_CUDA_TRY(cudaStreamWaitEvent(ce->copy[i], ce->fork, 0));
  /* The kernel first: it must be running before the copy streams' waits are queued. */
  if (nrecv > 0) BRAID_TRY(ce_launch(&a, dtype, devop, ce_nblocks(), stream));
  BRAID_TRY(ce_send(comm, ce, send, send_bytes, send_chunk, op->peer_out, ready_want));
  ce->recv_seq += nrecv;
  /* The user's stream goes on once this rank's data is out too (its buffer may be reused). */
  for (int i = 0; i < 2; i++) {
    BRAID_CUDA_TRY(cudaEventRecord(ce->join[i], ce->copy[i]));
    BRAID_CUDA_TRY(cudaStreamWaitEvent(stream, ce->join[i], 0));
  }
  if (ce->trace) {
    BRAID_CUDA_TRY(cudaEventRecord(ce->tev[2 * CE_TRACE_CHUNKS], stream));
    ce_trace_report(comm, ce, nsend, send_chunk, ce->tev[2 * CE_TRACE_CHUNKS]);
  }
  if (staged) BRAID_CUDA_TRY(cudaFreeAsync(staged, stream)); /* after the joins */
  /* Nothing received: the ledger hears from a kernel of no chunks once the sends are done. */
  if (nrecv == 0 && ledger_seq != 0)
    BRAID_TRY(ce_launch(&a, dtype, devop, ce_nblocks(), stream));
  TRACE(BRAID_LOG_COLL, "copy-engine exchange: %zu bytes out in %llu chunks%s, %zu in in %llu, %s",
        send_bytes, (unsigned long long)nsend, op->peer_out ? " (into the peer's buffer)" : "",
        recv_bytes, (unsigned long long)nrecv, op->reduce ? "reduced" : "copied");
  return ncclSuccess;
fail:
  /* The peer's chunk counts move on: this rank's no longer match them (ce_check_intact). */
  ce_fail(comm, res);
  if (staged) { /* best effort, behind whatever copies of it were queued */
    for (int i = 0; i < 2; i++)
      if (cudaEventRecord(ce->join[i], ce->copy[i]) == cudaSuccess)
        (void)cudaStreamWaitEvent(stream, ce->join[i], 0);
    (void)cudaFreeAsync(staged, stream);
    (void)cudaGetLastError();
  }
  return res;
}

ncclResult_t ce_ledger_report(struct ncclComm* comm, cudaStream_t stream, uint64_t ledger_seq) {
  ncclResult_t res = ncclSuccess;
  struct braid_ce_args a;
  if (ledger_seq == 0) return ncclSuccess;
  memset(&a, 0, sizeof a);
  a.comm = comm->dev->comm;
  a.flags = (struct braid_ce_flags*)comm->ce->mem;
  a.chunk_elems = 1; /* no chunks: the kernel only reports */
  a.ledger_seq = ledger_seq;
  BRAID_TRY(ce_launch(&a, ncclUint8, 0, 1, stream));
  return ncclSuccess;
fail:
  return res;
}

ncclResult_t ce_check_intact(struct ncclComm* comm) {
  if (comm->ce == NULL || comm->ce->state != CE_BROKEN) return ncclSuccess;
  ncclResult_t code = comm->async_error != ncclSuccess ? comm->async_error : ncclInvalidUsage;
  return braid_err(code,
                   "rank %d: a copy-engine exchange failed half-way on this communicator (see "
                   "its async error), so its ranks no longer agree on what comes next; abort it",
                   comm->rank);
}

/*
 * The peer's kernel writes this rank's freed words after its last chunks,
 * possibly after this rank is done; before the memory goes, wait (briefly)
 * for those writes. An aborted communicator does not wait.
 */
static void ce_wait_peer_done(struct ncclComm* comm, struct braid_ce* ce) {
  struct braid_ce_flags f;
  double start = braid_time_sec();
  while (ce->send_seq > 0 && !*comm->abort_flag && braid_time_sec() - start < 5.0) {
    if (cudaMemcpyAsync(&f, ce->mem, sizeof f, cudaMemcpyDeviceToHost, ce->aux) != cudaSuccess ||
        cudaStreamSynchronize(ce->aux) != cudaSuccess)
      break;
    int done = 1;
    for (uint64_t g = ce->send_seq > ce->nslots ? ce->send_seq - ce->nslots : 0; g < ce->send_seq;
         g++)
      if ((int32_t)(f.freed[g % ce->nslots] - (uint32_t)(g + 1)) < 0) done = 0;
    if (done) return;
    usleep(100);
  }
  if (!*comm->abort_flag)
    WARN(
        "rank %d: rank %d did not finish with this rank's last copy-engine chunks within 5 s; "
        "freeing the scratch anyway",
        comm->rank, 1 - comm->rank);
}

void ce_quiesce(struct ncclComm* comm) {
  if (comm->ce == NULL) return;
  for (int i = 0; i < 2; i++)
    if (comm->ce->copy[i] && cudaStreamSynchronize(comm->ce->copy[i]) != cudaSuccess)
      (void)cudaGetLastError();
}

void ce_free(struct ncclComm* comm) {
  struct braid_ce* ce = comm->ce;
  if (ce == NULL) return;
  for (int i = 0; i < 2; i++)
    if (ce->copy[i]) (void)cudaStreamSynchronize(ce->copy[i]);
  if (ce->mem && ce->state == CE_READY) ce_wait_peer_done(comm, ce);
  ipc_mem_unmap(&ce->map);
  ipc_mem_free(&ce->own);
  for (int i = 0; i < 2; i++) {
    if (ce->copy[i]) (void)cudaStreamDestroy(ce->copy[i]);
    if (ce->join[i]) (void)cudaEventDestroy(ce->join[i]);
  }
  if (ce->aux) (void)cudaStreamDestroy(ce->aux);
  for (int i = 0; i < ce->ntev; i++) (void)cudaEventDestroy(ce->tev[i]);
  free(ce->tev);
  if (ce->fork) (void)cudaEventDestroy(ce->fork);
  (void)cudaGetLastError();
  free(ce);
  comm->ce = NULL;
}
