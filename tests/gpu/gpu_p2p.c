/*
 * Send/receive patterns. A pattern is a list of transfers (source rank,
 * destination rank, count, type); every rank posts, in list order, an
 * ncclSend for each transfer it sources and an ncclRecv for each it receives,
 * all in one group. NCCL matches the sends from A to B with the receives on
 * B from A in the order they were posted, so the list order is also the
 * matching order (the "multi" pattern relies on it).
 *
 *   ring       rank r sends to r+1 and receives from r-1
 *   exchange   every rank sends to and receives from every other rank
 *   self       a rank sends to itself (a send and a receive in one group)
 *   multi      three sends to the same peer, different sizes, one group
 *   uneven     every rank sends to every other, 1 MiB from even ranks, 16 KiB from odd ones:
 *              with three or more ranks a rank's send to rank + d and its receive from
 *              rank - d may differ in size class (Braid places them on different channels)
 *   multi far  three messages to rank + 2, of sizes in an order that differs between rank r
 *              and rank r - 2 (four ranks): apart and paired placements on one connection
 *   ring+self  both at once
 *   alltoall+uneven  an AlltoAll of 4 MiB a peer and the uneven pattern in one group: with
 *              three or more ranks Braid places the AlltoAll's messages on their distance's
 *              channels and may pair them with the uneven pattern's messages, which it places
 *              elsewhere (p2p_work.c)
 *
 * Sizes from 0 to 64 MiB, odd counts, and unaligned buffers. Each received
 * buffer must equal what was sent, bit for bit, with the poisoned guard
 * bytes around it intact and the send buffer unchanged.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"
#include "mp_runner.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define P2P_MAX_XFERS (GPU_MAX_RANKS * GPU_MAX_RANKS + GPU_MAX_RANKS)
#define P2P_MAX_REPORTS 5

struct p2p_xfer {
  int src, dst;
  size_t count;
  ncclDataType_t type;
  int unaligned; /* send 3 elements, receive 1 element past the allocation */
};

struct p2p_run {
  int nx;
  struct p2p_xfer x[P2P_MAX_XFERS];
  void* in[P2P_MAX_XFERS];         /* what each transfer carries, on the host */
  char* send_alloc[P2P_MAX_XFERS]; /* on the source, when it is local */
  char* recv_alloc[P2P_MAX_XFERS]; /* on the destination, when it is local */
  size_t send_bytes[P2P_MAX_XFERS], recv_bytes[P2P_MAX_XFERS]; /* their sizes */
  void* send_reg[P2P_MAX_XFERS];   /* GPU_REGISTER=1: their registrations */
  void* recv_reg[P2P_MAX_XFERS];
  ncclComm_t send_comm[P2P_MAX_XFERS], recv_comm[P2P_MAX_XFERS];
  int issued[GPU_MAX_RANKS];
};

static size_t xfer_bytes(const struct p2p_xfer* x) { return x->count * ref_type(x->type)->size; }
static size_t xfer_send_off(const struct p2p_xfer* x) {
  return (x->unaligned ? 3 : 0) * ref_type(x->type)->size;
}
static size_t xfer_recv_off(const struct p2p_xfer* x) {
  return (x->unaligned ? 1 : 0) * ref_type(x->type)->size;
}

/* The local index of `rank` in this process, or -1. */
static int p2p_local(const struct gpu_world* w, int rank) {
  return rank >= w->rank0 && rank < w->rank0 + w->nlocal ? rank - w->rank0 : -1;
}

static int p2p_add(struct p2p_run* p, int src, int dst, size_t count, ncclDataType_t t,
                   int unaligned) {
  if (p->nx == P2P_MAX_XFERS) return -1;
  p->x[p->nx++] = (struct p2p_xfer){src, dst, count, t, unaligned};
  return 0;
}

/* Buffers of transfer k on whichever of its ends are local: poison, upload. */
static int p2p_alloc_xfer(struct gpu_world* w, struct p2p_run* p, int k) {
  const struct p2p_xfer* x = &p->x[k];
  size_t bytes = xfer_bytes(x);
  int ls = p2p_local(w, x->src), ld = p2p_local(w, x->dst);
  if (ls >= 0) {
    size_t alloc = xfer_send_off(x) + bytes + GPU_GUARD;
    p->send_bytes[k] = alloc;
    if (world_cuda(w, cudaSetDevice(w->dev[ls]), "cudaSetDevice") != 0 ||
        gpu_buf_alloc(w, &p->send_alloc[k], alloc) != 0 ||
        world_cuda(w, cudaMemset(p->send_alloc[k], GPU_POISON, alloc), "cudaMemset") != 0 ||
        world_cuda(w,
                   cudaMemcpy(p->send_alloc[k] + xfer_send_off(x), p->in[k], bytes,
                              cudaMemcpyHostToDevice),
                   "cudaMemcpy") != 0)
      return -1;
  }
  if (ld >= 0) {
    size_t alloc = xfer_recv_off(x) + bytes + GPU_GUARD;
    p->recv_bytes[k] = alloc;
    if (world_cuda(w, cudaSetDevice(w->dev[ld]), "cudaSetDevice") != 0 ||
        gpu_buf_alloc(w, &p->recv_alloc[k], alloc) != 0 ||
        world_cuda(w, cudaMemset(p->recv_alloc[k], GPU_POISON, alloc), "cudaMemset") != 0)
      return -1;
  }
  return 0;
}

/* Inputs for every transfer (every process computes all of them), then local buffers. */
static int p2p_prepare(struct gpu_world* w, struct p2p_run* p, uint64_t seed) {
  for (int k = 0; k < p->nx; k++) {
    p->in[k] = malloc(xfer_bytes(&p->x[k]) + 1);
    if (p->in[k] == NULL) {
      world_case_fail(w, "out of host memory");
      return -1;
    }
    ref_fill(p->x[k].type, GPU_OP_NONE, w->nranks, seed + 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1),
             p->in[k], p->x[k].count);
    if (p2p_alloc_xfer(w, p, k) != 0) return -1;
  }
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0 ||
        world_cuda(w, cudaDeviceSynchronize(), "cudaDeviceSynchronize") != 0)
      return -1;
  }
  return 0;
}

int p2p_issue(struct gpu_world* w, struct p2p_run* p, int l, ncclComm_t comm, cudaStream_t stream) {
  int rank = w->rank0 + l;
  char what[96];
  for (int k = 0; k < p->nx; k++) {
    const struct p2p_xfer* x = &p->x[k];
    if (x->src == rank && p->send_reg[k] == NULL && gpu_register_on()) {
      p->send_comm[k] = comm;
      if (gpu_buf_register(w, comm, p->send_alloc[k], p->send_bytes[k], &p->send_reg[k]) != 0)
        return -1;
    }
    if (x->dst == rank && p->recv_reg[k] == NULL && gpu_register_on()) {
      p->recv_comm[k] = comm;
      if (gpu_buf_register(w, comm, p->recv_alloc[k], p->recv_bytes[k], &p->recv_reg[k]) != 0)
        return -1;
    }
    if (x->src == rank) {
      snprintf(what, sizeof what, "ncclSend %d->%d (transfer %d)", x->src, x->dst, k);
      if (world_nccl(w,
                     ncclSend(p->send_alloc[k] + xfer_send_off(x), x->count, x->type, x->dst, comm,
                              stream),
                     comm, what) != 0)
        return -1;
    }
    if (x->dst == rank) {
      snprintf(what, sizeof what, "ncclRecv %d->%d (transfer %d)", x->src, x->dst, k);
      if (world_nccl(w,
                     ncclRecv(p->recv_alloc[k] + xfer_recv_off(x), x->count, x->type, x->src, comm,
                              stream),
                     comm, what) != 0)
        return -1;
    }
  }
  p->issued[l] = 1;
  return 0;
}

static void p2p_check_recv(struct gpu_world* w, const struct p2p_run* p, int k,
                           const unsigned char* host) {
  const struct p2p_xfer* x = &p->x[k];
  size_t off = xfer_recv_off(x), bytes = xfer_bytes(x), bad = 0;
  char why[256];
  for (size_t j = 0; j < x->count; j++) {
    int report = bad < P2P_MAX_REPORTS;
    if (ref_check_copied(x->type, p->in[k], j, host + off, j, report ? why : NULL, sizeof why))
      continue;
    if (report)
      world_case_fail(w, "transfer %d (%d->%d) element %zu: %s", k, x->src, x->dst, j, why);
    bad++;
  }
  if (bad > P2P_MAX_REPORTS)
    world_case_fail(w, "transfer %d (%d->%d): %zu of %zu elements wrong", k, x->src, x->dst, bad,
                    x->count);
  for (size_t i = 0; i < off + bytes + GPU_GUARD; i++) {
    if ((i >= off && i < off + bytes) || host[i] == GPU_POISON) continue;
    world_case_fail(
        w,
        "transfer %d (%d->%d): byte %zu of the receive allocation was written, outside [%zu, %zu)",
        k, x->src, x->dst, i, off, off + bytes);
    break;
  }
}

/* Receive side: data and guards; send side: the buffer is unchanged. */
static int p2p_check_xfer(struct gpu_world* w, const struct p2p_run* p, int k) {
  const struct p2p_xfer* x = &p->x[k];
  int ls = p2p_local(w, x->src), ld = p2p_local(w, x->dst);
  size_t bytes = xfer_bytes(x), alloc = xfer_recv_off(x) + bytes + GPU_GUARD;
  unsigned char* host = malloc(alloc);
  int rc = -1;
  if (host == NULL) return -1;
  if (ld >= 0 && p->issued[ld]) {
    if (world_cuda(w, cudaSetDevice(w->dev[ld]), "cudaSetDevice") != 0 ||
        world_cuda(w, cudaMemcpy(host, p->recv_alloc[k], alloc, cudaMemcpyDeviceToHost),
                   "cudaMemcpy") != 0)
      goto out;
    p2p_check_recv(w, p, k, host);
  }
  if (ls >= 0 && p->issued[ls]) {
    if (world_cuda(w, cudaSetDevice(w->dev[ls]), "cudaSetDevice") != 0 ||
        world_cuda(
            w, cudaMemcpy(host, p->send_alloc[k] + xfer_send_off(x), bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy") != 0)
      goto out;
    if (memcmp(host, p->in[k], bytes) != 0)
      world_case_fail(w, "transfer %d (%d->%d): the send buffer was modified", k, x->src, x->dst);
  }
  rc = 0;
out:
  free(host);
  return rc;
}

int p2p_check(struct gpu_world* w, struct p2p_run* p) {
  int rc = 0;
  for (int k = 0; k < p->nx; k++) rc |= p2p_check_xfer(w, p, k);
  return rc;
}

/* GPU_REGISTER=1: the transfers' registrations, dropped (p2p_release does it too). */
static void p2p_deregister(struct gpu_world* w, struct p2p_run* p) {
  for (int k = 0; p && k < p->nx; k++) {
    gpu_buf_deregister(w, p->send_comm[k], &p->send_reg[k]);
    gpu_buf_deregister(w, p->recv_comm[k], &p->recv_reg[k]);
  }
}

void p2p_release(struct gpu_world* w, struct p2p_run* p) {
  if (p == NULL) return;
  p2p_deregister(w, p);
  for (int k = 0; k < p->nx; k++) {
    int ls = p2p_local(w, p->x[k].src), ld = p2p_local(w, p->x[k].dst);
    if (ls >= 0 && p->send_alloc[k] && cudaSetDevice(w->dev[ls]) == cudaSuccess)
      gpu_buf_free(p->send_alloc[k]);
    if (ld >= 0 && p->recv_alloc[k] && cudaSetDevice(w->dev[ld]) == cudaSuccess)
      gpu_buf_free(p->recv_alloc[k]);
    free(p->in[k]);
  }
  free(p);
}

/* ---- patterns -------------------------------------------------------------------------------- */

/* Rank r sends to r + shift. */
static void pattern_ring(struct p2p_run* p, int n, int shift, ncclDataType_t t, size_t count,
                         int unaligned) {
  for (int r = 0; r < n; r++) p2p_add(p, r, (r + shift) % n, count, t, unaligned);
}

static void pattern_exchange(struct p2p_run* p, int n, ncclDataType_t t, size_t count) {
  for (int a = 0; a < n; a++)
    for (int b = 0; b < n; b++)
      if (a != b) p2p_add(p, a, b, count, t, 0);
}

static void pattern_self(struct p2p_run* p, int n, ncclDataType_t t, size_t count) {
  for (int r = 0; r < n; r++) p2p_add(p, r, r, count, t, 0);
}

/* Three messages to the same peer in one group, different sizes: matched in posting order. */
static void pattern_multi(struct p2p_run* p, int n) {
  static const size_t counts[] = {7, 4097, 1000};
  for (size_t i = 0; i < ARRAY_LEN(counts); i++) pattern_ring(p, n, 1, ncclFloat32, counts[i], 0);
}

static void pattern_uneven(struct p2p_run* p, int n) {
  for (int a = 0; a < n; a++)
    for (int d = 1; d < n; d++)
      p2p_add(p, a, (a + d) % n, a % 2 == 0 ? 262147 : 4099, ncclFloat32, d == 1);
}

static void pattern_multi_far(struct p2p_run* p, int n) {
  static const size_t counts[2][3] = {{262147, 7, 4099}, {4099, 262147, 7}};
  for (int i = 0; i < 3; i++)
    for (int a = 0; a < n; a++) p2p_add(p, a, (a + 2) % n, counts[(a / 2) % 2][i], ncclFloat32, 0);
}

struct p2p_run* p2p_ring_prepare(struct gpu_world* w, ncclDataType_t t, size_t count,
                                 uint64_t seed) {
  struct p2p_run* p = calloc(1, sizeof *p);
  if (p == NULL) return NULL;
  pattern_ring(p, w->nranks, 1, t, count, 0);
  if (p2p_prepare(w, p, seed) != 0) {
    p2p_release(w, p);
    return NULL;
  }
  return p;
}

/* One pattern as one case: prepare, one group over the local ranks, sync, check. */
static void p2p_case(struct gpu_world* w, const char* name, struct p2p_run* p, size_t index) {
  char full[sizeof w->case_name];
  snprintf(full, sizeof full, "%s mode=%s", name, w->opts->mode);
  if (!world_case_begin(w, full)) {
    free(p);
    return;
  }
  if (p2p_prepare(w, p, world_seed(w, SUITE_SENDRECV, index, 0)) == 0 &&
      world_group_start(w) == 0) {
    for (int l = 0; l < w->nlocal; l++) p2p_issue(w, p, l, w->comm[l], w->stream[l]);
    if (world_group_end(w) == 0 && world_sync(w) == 0) p2p_check(w, p);
  }
  p2p_release(w, p);
  world_case_end(w);
}

/* An AlltoAll (gpu_case.c's run) and pattern p in one group per local rank; both checked. */
static void p2p_case_with_alltoall(struct gpu_world* w, const char* name, struct p2p_run* p,
                                   size_t count, size_t index) {
  char full[sizeof w->case_name];
  struct gpu_run* a2a = calloc(1, sizeof *a2a);
  struct gpu_case c = {.coll = COLL_ALLTOALL, .type = ncclFloat32, .count = count, .root = -1};
  snprintf(full, sizeof full, "%s mode=%s", name, w->opts->mode);
  if (a2a == NULL || !world_case_begin(w, full)) {
    free(a2a);
    free(p);
    return;
  }
  if (run_prepare(w, a2a, &c, world_seed(w, SUITE_SENDRECV, index, 1)) == 0 &&
      p2p_prepare(w, p, world_seed(w, SUITE_SENDRECV, index, 0)) == 0 &&
      world_group_start(w) == 0) {
    for (int l = 0; l < w->nlocal; l++) {
      run_issue(w, a2a, l, w->comm[l], w->stream[l]);
      p2p_issue(w, p, l, w->comm[l], w->stream[l]);
    }
    if (world_group_end(w) == 0 && world_sync(w) == 0) {
      run_check(w, a2a);
      p2p_check(w, p);
    }
  }
  p2p_release(w, p);
  run_release(w, a2a);
  free(a2a);
  world_case_end(w);
}

static struct p2p_run* p2p_new(void) {
  struct p2p_run* p = calloc(1, sizeof *p);
  if (p == NULL) {
    fprintf(stderr, "gpu_coll: out of host memory\n");
    abort();
  }
  return p;
}

static void ring_cases(struct gpu_world* w, size_t* index) {
  static const ncclDataType_t types[] = {ncclInt8, ncclFloat16, ncclFloat32, ncclFloat64};
  static const size_t counts[] = {0, 1, 7, 4097, 1048579}, quick_counts[] = {0, 7, 4097};
  const size_t* cs = w->opts->quick ? quick_counts : counts;
  size_t nc = w->opts->quick ? ARRAY_LEN(quick_counts) : ARRAY_LEN(counts);
  char name[160];
  for (size_t t = 0; t < ARRAY_LEN(types); t++)
    for (size_t k = 0; k < nc; k++)
      for (int unaligned = 0; unaligned < 2; unaligned++) {
        struct p2p_run* p = p2p_new();
        pattern_ring(p, w->nranks, 1, types[t], cs[k], unaligned);
        snprintf(name, sizeof name, "SendRecv ring %s count=%zu%s", ref_type(types[t])->name, cs[k],
                 unaligned ? " unaligned" : "");
        p2p_case(w, name, p, (*index)++);
      }
  if (w->nranks > 2) { /* the other direction; the same as the ring with two ranks */
    struct p2p_run* p = p2p_new();
    pattern_ring(p, w->nranks, w->nranks - 1, ncclFloat32, 4097, 0);
    p2p_case(w, "SendRecv reverse-ring f32 count=4097", p, (*index)++);
  }
  if (w->opts->quick) return;
  /* 64 MiB, and an odd byte count just over it. */
  struct p2p_run* p = p2p_new();
  pattern_ring(p, w->nranks, 1, ncclFloat32, (size_t)16 << 20, 0);
  p2p_case(w, "SendRecv ring f32 count=16777216 (64 MiB)", p, (*index)++);
  p = p2p_new();
  pattern_ring(p, w->nranks, 1, ncclInt8, ((size_t)64 << 20) + 3, 1);
  p2p_case(w, "SendRecv ring i8 count=67108867 (64 MiB + 3) unaligned", p, (*index)++);
}

/* Holds the legacy stream it runs on for a second. */
static void CUDART_CB p2p_hold(void* arg) {
  (void)arg;
  mp_sleep(1.0);
}

/*
 * New send/recv connections (a new communicator) while every GPU's legacy stream is held for a
 * second by a host function. A FIFO zeroed on that stream (cudaMemset) would be zeroed only
 * after the peer's kernel, which starts once it has the FIFO's address, had written its first
 * steps there: they would be erased, tail included, and the receive would wait forever.
 */
static void p2p_legacy_held_case(struct gpu_world* w, size_t index) {
  char name[sizeof w->case_name];
  snprintf(name, sizeof name,
           "SendRecv ring f32 count=4097 on new connections, the legacy stream held mode=%s",
           w->opts->mode);
  if (!world_case_fits(w, name, w->nranks >= 2, "needs 2 ranks or more") ||
      !world_case_begin(w, name))
    return;
  ncclComm_t dup[GPU_MAX_RANKS] = {0};
  int held[GPU_MAX_RANKS] = {0}, rc = -1;
  struct p2p_run* p = p2p_new();
  pattern_ring(p, w->nranks, 1, ncclFloat32, 4097, 0);
  if (p2p_prepare(w, p, world_seed(w, SUITE_SENDRECV, index, 0)) != 0 || world_group_start(w) != 0)
    goto out;
  for (int l = 0; l < w->nlocal; l++)
    world_nccl(w, ncclCommSplit(w->comm[l], 0, w->rank0 + l, &dup[l], NULL), w->comm[l],
               "ncclCommSplit (copy)");
  if (world_group_end(w) != 0 || w->case_failed) goto out;
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0 ||
        world_cuda(w, cudaLaunchHostFunc(cudaStreamLegacy, p2p_hold, NULL),
                   "cudaLaunchHostFunc (the legacy stream)") != 0)
      goto out;
    held[l] = 1;
  }
  if (world_group_start(w) != 0) goto out;
  for (int l = 0; l < w->nlocal; l++) p2p_issue(w, p, l, dup[l], w->stream[l]);
  if (world_group_end(w) != 0) goto out;
  /* The hold's second, then as long again as any ring here takes with room to spare. */
  double until = world_now() + 21;
  int done = 1;
  for (int l = 0; l < w->nlocal; l++) {
    cudaError_t q;
    while ((q = cudaStreamQuery(w->stream[l])) == cudaErrorNotReady && world_now() < until)
      mp_sleep(0.001);
    if (q != cudaSuccess) {
      done = 0;
      world_case_fail(w,
                      "rank %d: the ring on new connections did not complete within 20 s of the "
                      "legacy stream's release (%s): were its first steps erased by a late "
                      "zeroing of the FIFO?",
                      w->rank0 + l, cudaGetErrorString(q));
    }
  }
  if (!done) { /* the stuck kernels leave on the abort */
    for (int l = 0; l < w->nlocal; l++) {
      world_nccl(w, ncclCommAbort(dup[l]), NULL, "ncclCommAbort");
      dup[l] = NULL;
    }
  }
  rc = world_sync(w);
  if (done && rc == 0) p2p_check(w, p);
out:
  for (int l = 0; l < w->nlocal; l++)
    if (held[l] && cudaSetDevice(w->dev[l]) == cudaSuccess)
      world_cuda(w, cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (legacy)");
  p2p_deregister(w, p); /* before the communicators that hold the registrations go */
  for (int l = 0; l < w->nlocal; l++)
    if (dup[l]) world_nccl(w, ncclCommDestroy(dup[l]), NULL, "ncclCommDestroy");
  p2p_release(w, p);
  world_case_end(w);
}

void suite_p2p(struct gpu_world* w) {
  static const size_t counts[] = {1, 4097, 1048579};
  size_t index = 0;
  char name[160];
  ring_cases(w, &index);
  for (size_t k = 0; k < ARRAY_LEN(counts); k++) {
    struct p2p_run* p = p2p_new();
    pattern_exchange(p, w->nranks, ncclFloat32, counts[k]);
    snprintf(name, sizeof name, "SendRecv exchange f32 count=%zu", counts[k]);
    p2p_case(w, name, p, index++);
    p = p2p_new();
    pattern_self(p, w->nranks, ncclInt8, counts[k]);
    snprintf(name, sizeof name, "SendRecv self i8 count=%zu", counts[k]);
    p2p_case(w, name, p, index++);
  }
  struct p2p_run* p = p2p_new();
  pattern_multi(p, w->nranks);
  p2p_case(w, "SendRecv multi (3 messages to one peer, matched in order) f32", p, index++);
  if (w->nranks > 2) {
    p = p2p_new();
    pattern_uneven(p, w->nranks);
    p2p_case(w, "SendRecv uneven (1 MiB from even ranks, 16 KiB from odd) f32", p, index++);
    p = p2p_new();
    pattern_uneven(p, w->nranks);
    p2p_case_with_alltoall(w, "SendRecv alltoall+uneven (AlltoAll f32 count=1048579 and the uneven "
                              "pattern in one group)", p, 1048579, index++);
    p = p2p_new();
    pattern_multi_far(p, w->nranks);
    p2p_case(w, "SendRecv multi far (3 messages to rank + 2, sizes in two orders) f32", p,
             index++);
  }
  p = p2p_new();
  pattern_ring(p, w->nranks, 1, ncclFloat32, 4097, 0);
  pattern_self(p, w->nranks, ncclFloat32, 4097);
  p2p_case(w, "SendRecv ring+self f32 count=4097", p, index++);
  p2p_legacy_held_case(w, index++);
}
