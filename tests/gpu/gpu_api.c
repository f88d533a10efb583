/*
 * The rest of the communicator API, as PyTorch and other frameworks use it.
 *
 *   split odd/even    colour rank % 2, keys reversing the order; collectives on the
 *                     children and the parent interleaved on one stream
 *   split by host     colour = the host (each rank its own in hosts mode, one otherwise)
 *   split nocolor     rank 0 passes NCCL_SPLIT_NOCOLOR and gets no communicator
 *   split nonblocking blocking = 0: the split returns at once, the child is polled ready
 *   split share       splitShare = 1: a child and a grandchild of a copy of the world's
 *                     comm, collectives and send/recv rings on all three interleaved, the
 *                     parent destroyed first, then the child; where the ranks share a host,
 *                     the shared split must take at least a ring FIFO (4 MiB) less device
 *                     memory than an unshared one; (Braid) aborting a sharing child fails
 *                     the parent
 *   init nonblocking  ncclCommInitRankConfig with blocking = 0, polled, then a collective
 *   init scalable     ncclCommInitRankScalable with 2 and with 4 unique ids (where there are
 *                     as many ranks), each made by the process of the first rank of its
 *                     block, then the collectives
 *   shrink            without the last rank; the parent still works afterwards
 *   shrink abort      the excluded rank leaves; the others shrink with NCCL_SHRINK_ABORT
 *   revoke            a revoked communicator refuses work and can still be shrunk
 *   graph             an AllReduce and a send/recv ring captured in a CUDA graph, replayed
 *                     1000 times (each replay feeds the next), eager calls mixed in
 *   graph a2a         three in-place AllToAlls captured in one graph (its staging copies
 *                     are stream-ordered allocations: memory nodes), replayed twice
 *   simulate          ncclGroupSimulateEnd estimates a group's time and launches nothing
 *   register          ncclMemAlloc, ncclCommRegister, a collective on the registered
 *                     buffer, ncclCommDeregister; ncclCommWindowRegister / Deregister
 *   teardown/groups   on one-rank comms: abort of a comm with operations or its init in
 *                     this thread's open group, an invalid init failing its group at once,
 *                     another thread's call on a comm in this thread's group refused
 *   current device    a group end puts the caller's current device back: another GPU than
 *                     the last comm's (its first comm's, or another one), and in a fresh thread
 *                     that set none; the AllReduces' results are checked
 *   check             (Braid, with BRAID_CHECK=1 only) ranks calling AllReduce with
 *                     different counts are refused with a message naming both, nothing
 *                     runs, and the communicator works afterwards
 *
 * Values are int64 so that every expected result is exact.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_test.h"
#include "mp_runner.h"

#define API_N 4097           /* elements per buffer: odd, several LL lines, one Simple chunk */
#define API_GRAPH_N 65537    /* the graph case: several chunks per replay */
#define API_REPLAYS 1000
#define API_POLL_S 120.0     /* how long a nonblocking call may stay in progress */
#define API_TWO_RANKS_WHY "needs 2 ranks or more"

static int api_rank(const struct gpu_world* w, int l) { return w->rank0 + l; }

static int64_t api_val(int rank, size_t i, int salt) {
  return (int64_t)(rank + 1) * 1000003 + (int64_t)i * 7 + salt * 131;
}

/* One int64 buffer of `n` elements per local rank. */
struct api_buf {
  int64_t* d[GPU_MAX_RANKS];
  size_t n;
};

static int buf_alloc(struct gpu_world* w, struct api_buf* b, size_t n) {
  memset(b, 0, sizeof *b);
  b->n = n;
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0 ||
        world_cuda(w, cudaMalloc((void**)&b->d[l], n * sizeof(int64_t)), "cudaMalloc") != 0 ||
        world_cuda(w, cudaMemset(b->d[l], GPU_POISON, n * sizeof(int64_t)), "cudaMemset") != 0 ||
        world_cuda(w, cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemset") != 0)
      return -1;
  }
  return 0;
}

static void buf_free(struct gpu_world* w, struct api_buf* b) {
  for (int l = 0; l < w->nlocal; l++) {
    if (b->d[l] == NULL) continue;
    cudaSetDevice(w->dev[l]);
    cudaFree(b->d[l]);
    b->d[l] = NULL;
  }
}

/*
 * Writes api_val(rank, i, salt) into local rank l's buffer, and waits until it
 * is there: a cudaMemcpy from pageable memory may return before its DMA lands,
 * and the collectives run on non-blocking streams that do not wait for the
 * legacy stream (without the wait, a peer sent the poison of its input's tail).
 */
static int buf_put(struct gpu_world* w, struct api_buf* b, int l, int rank, int salt) {
  int64_t* h = malloc(b->n * sizeof *h);
  if (h == NULL) {
    world_case_fail(w, "out of host memory");
    return -1;
  }
  for (size_t i = 0; i < b->n; i++) h[i] = api_val(rank, i, salt);
  int rc = world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
           world_cuda(w, cudaMemcpy(b->d[l], h, b->n * sizeof *h, cudaMemcpyHostToDevice),
                      "cudaMemcpy to the device") ||
           world_cuda(w, cudaDeviceSynchronize(), "cudaDeviceSynchronize after cudaMemcpy");
  free(h);
  return rc ? -1 : 0;
}

/* Compares local rank l's buffer with want[]; reports how many differ, the first and the last. */
static int buf_expect(struct gpu_world* w, struct api_buf* b, int l, const int64_t* want,
                      const char* what) {
  int64_t* h = malloc(b->n * sizeof *h);
  if (h == NULL) {
    world_case_fail(w, "out of host memory");
    return -1;
  }
  int rc = world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
           world_cuda(w, cudaMemcpy(h, b->d[l], b->n * sizeof *h, cudaMemcpyDeviceToHost),
                      "cudaMemcpy from the device");
  /* All wrong elements counted; the first and the last named (a pattern tells a cause). */
  size_t bad = 0, first = 0, last = 0;
  for (size_t i = 0; rc == 0 && i < b->n; i++) {
    if (h[i] == want[i]) continue;
    if (bad++ == 0) first = i;
    last = i;
  }
  if (bad) {
    int64_t poison;
    memset(&poison, GPU_POISON, sizeof poison);
    world_case_fail(w, "rank %d, %s: %zu of %zu elements wrong, %zu..%zu; element %zu is %lld "
                    "(poison %+lld), expected %lld; element %zu is %lld (poison %+lld), "
                    "expected %lld", api_rank(w, l), what, bad, b->n, first, last, first,
                    (long long)h[first], (long long)(h[first] - poison), (long long)want[first],
                    last, (long long)h[last], (long long)(h[last] - poison),
                    (long long)want[last]);
    rc = -1;
  }
  free(h);
  return rc ? -1 : 0;
}

/* want[i] = mult * sum over `ranks` of api_val(rank, i, salt). */
static int64_t* api_sum(size_t n, const int* ranks, int nranks, int salt, int64_t mult) {
  int64_t* want = calloc(n, sizeof *want);
  if (want == NULL) return NULL;
  for (size_t i = 0; i < n; i++) {
    for (int k = 0; k < nranks; k++) want[i] += api_val(ranks[k], i, salt);
    want[i] *= mult;
  }
  return want;
}

static int api_ok(ncclResult_t res) { return res == ncclSuccess || res == ncclInProgress; }

/* Waits until `comm` is no longer in progress; 0 when it ended in ncclSuccess. */
static int api_poll(struct gpu_world* w, ncclComm_t comm, const char* what) {
  ncclResult_t async = ncclInProgress;
  for (double waited = 0; waited < API_POLL_S; waited += 0.0005) {
    if (world_nccl(w, ncclCommGetAsyncError(comm, &async), comm, "ncclCommGetAsyncError") != 0)
      return -1;
    if (async != ncclInProgress) break;
    mp_sleep(0.0005);
  }
  if (async == ncclInProgress) {
    world_case_fail(w, "%s still in progress after %.0f s", what, API_POLL_S);
    return -1;
  }
  return world_nccl(w, async, comm, what);
}

/* One AllReduce (int64 sum) per local rank whose comms[l] is set, in one group. */
/* One sum all-reduce of send->n int64 elements, or with `gather` an all-gather into recv. */
static int api_collective(struct gpu_world* w, ncclComm_t* comms, struct api_buf* send,
                          struct api_buf* recv, int gather, const char* what) {
  int rc = world_group_start(w);
  for (int l = 0; rc == 0 && l < w->nlocal; l++) {
    if (comms[l] == NULL) continue;
    ncclResult_t res =
        gather ? ncclAllGather(send->d[l], recv->d[l], send->n, ncclInt64, comms[l], w->stream[l])
               : ncclAllReduce(send->d[l], recv->d[l], send->n, ncclInt64, ncclSum, comms[l],
                               w->stream[l]);
    if (!api_ok(res)) rc = world_nccl(w, res, comms[l], what);
  }
  ncclResult_t res = ncclGroupEnd();
  if (!api_ok(res)) rc |= world_nccl(w, res, NULL, "ncclGroupEnd");
  /* A nonblocking communicator takes no new call before the last one is through (NCCL). */
  for (int l = 0; rc == 0 && l < w->nlocal; l++)
    if (comms[l] != NULL) rc |= api_poll(w, comms[l], what);
  return rc ? -1 : 0;
}

static int api_allreduce(struct gpu_world* w, ncclComm_t* comms, struct api_buf* send,
                         struct api_buf* recv, const char* what) {
  return api_collective(w, comms, send, recv, 0, what);
}

/* Streams drained; every comm in comms[] (may hold NULLs) without an asynchronous error. */
static int api_sync(struct gpu_world* w, ncclComm_t* comms) {
  int rc = world_sync(w);
  for (int l = 0; comms && l < w->nlocal; l++)
    if (comms[l] != NULL) rc |= api_poll(w, comms[l], "the communicator's asynchronous error");
  return rc ? -1 : 0;
}

static void api_destroy(struct gpu_world* w, ncclComm_t* comms) {
  for (int l = 0; l < w->nlocal; l++) {
    if (comms[l] == NULL) continue;
    world_nccl(w, ncclCommDestroy(comms[l]), NULL, "ncclCommDestroy");
    comms[l] = NULL;
  }
}

/* ---- split ------------------------------------------------------------------------------------- */

/* The members of `rank`'s colour in new-rank order (by key, then rank); their count. */
static int api_members(int nranks, const int* color, const int* key, int rank, int* out) {
  int n = 0;
  if (color[rank] == NCCL_SPLIT_NOCOLOR) return 0;
  for (int r = 0; r < nranks; r++) {
    if (color[r] != color[rank]) continue;
    int i = n++;
    while (i > 0 && key[out[i - 1]] > key[r]) {
      out[i] = out[i - 1];
      i--;
    }
    out[i] = r;
  }
  return n;
}

/* Size and rank of each child as the colours and keys say (NULL where NOCOLOR). */
static int api_check_children(struct gpu_world* w, ncclComm_t* child, const int* color,
                              const int* key) {
  for (int l = 0; l < w->nlocal; l++) {
    int r = api_rank(w, l), members[GPU_MAX_RANKS];
    int n = api_members(w->nranks, color, key, r, members);
    if (n == 0) {
      if (child[l] != NULL) {
        world_case_fail(w, "rank %d passed NCCL_SPLIT_NOCOLOR but got a communicator", r);
        return -1;
      }
      continue;
    }
    int count = -1, me = -1;
    if (child[l] == NULL) {
      world_case_fail(w, "rank %d got no communicator from its split", r);
      return -1;
    }
    if (world_nccl(w, ncclCommCount(child[l], &count), child[l], "ncclCommCount") != 0 ||
        world_nccl(w, ncclCommUserRank(child[l], &me), child[l], "ncclCommUserRank") != 0)
      return -1;
    int want_me = 0;
    while (members[want_me] != r) want_me++;
    if (count != n || me != want_me) {
      world_case_fail(w, "rank %d: child has %d ranks and says rank %d; expected %d and %d", r,
                      count, me, n, want_me);
      return -1;
    }
  }
  return 0;
}

/*
 * Collectives on the children and the parent interleaved on one stream:
 * child A -> B, parent C -> D, child B -> B in place. B ends as
 * members * sum(A), D as the sum of every rank's C.
 */
static int api_interleave(struct gpu_world* w, ncclComm_t* child, const int* color,
                          const int* key) {
  struct api_buf a, b, c, d;
  int rc = -1;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  memset(&c, 0, sizeof c);
  memset(&d, 0, sizeof d);
  if (buf_alloc(w, &a, API_N) || buf_alloc(w, &b, API_N) || buf_alloc(w, &c, API_N) ||
      buf_alloc(w, &d, API_N))
    goto out;
  for (int l = 0; l < w->nlocal; l++)
    if (buf_put(w, &a, l, api_rank(w, l), 1) || buf_put(w, &c, l, api_rank(w, l), 2)) goto out;
  if (api_allreduce(w, child, &a, &b, "ncclAllReduce (child)") ||
      api_allreduce(w, w->comm, &c, &d, "ncclAllReduce (parent)") ||
      api_allreduce(w, child, &b, &b, "ncclAllReduce (child, in place)") || api_sync(w, child))
    goto out;
  int all[GPU_MAX_RANKS];
  for (int r = 0; r < w->nranks; r++) all[r] = r;
  rc = 0;
  for (int l = 0; l < w->nlocal; l++) {
    int members[GPU_MAX_RANKS];
    int n = api_members(w->nranks, color, key, api_rank(w, l), members);
    int64_t* want_d = api_sum(API_N, all, w->nranks, 2, 1);
    int64_t* want_b = n ? api_sum(API_N, members, n, 1, n) : NULL;
    if (want_d == NULL || (n && want_b == NULL)) {
      world_case_fail(w, "out of host memory");
      rc = -1;
    } else {
      rc |= buf_expect(w, &d, l, want_d, "parent AllReduce");
      if (n) rc |= buf_expect(w, &b, l, want_b, "child AllReduce, then in place");
    }
    free(want_d);
    free(want_b);
  }
out:
  buf_free(w, &a);
  buf_free(w, &b);
  buf_free(w, &c);
  buf_free(w, &d);
  return rc;
}

static void api_split_case(struct gpu_world* w, const char* name, const int* color, const int* key,
                           int blocking) {
  char full[160];
  snprintf(full, sizeof full, "Split %s mode=%s", name, w->opts->mode);
  if (!world_case_begin(w, full)) return;
  ncclComm_t child[GPU_MAX_RANKS] = {0};
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  if (blocking) {
    /* One thread driving several ranks must group their splits (they rendezvous). */
    if (world_group_start(w) != 0) goto out;
    for (int l = 0; l < w->nlocal; l++) {
      int r = api_rank(w, l);
      world_nccl(w, ncclCommSplit(w->comm[l], color[r], key[r], &child[l], NULL), w->comm[l],
                 "ncclCommSplit");
    }
    if (world_group_end(w) != 0) goto out;
  } else {
    /* Each call returns at once; the splits meet in the background. */
    for (int l = 0; l < w->nlocal; l++) {
      int r = api_rank(w, l);
      ncclResult_t res = ncclCommSplit(w->comm[l], color[r], key[r], &child[l], &cfg);
      if (!api_ok(res)) world_nccl(w, res, w->comm[l], "ncclCommSplit (nonblocking)");
    }
    for (int l = 0; l < w->nlocal && !w->case_failed; l++)
      if (child[l]) api_poll(w, child[l], "the nonblocking split");
  }
  if (w->case_failed || api_check_children(w, child, color, key) != 0) goto out;
  api_interleave(w, child, color, key);
out:
  api_destroy(w, child);
  world_case_end(w);
}

static void api_splits(struct gpu_world* w) {
  int color[GPU_MAX_RANKS], key[GPU_MAX_RANKS];
  int hosts = strcmp(w->opts->mode, "hosts") == 0;
  for (int r = 0; r < w->nranks; r++) {
    color[r] = r % 2;
    key[r] = -r;
  }
  api_split_case(w, "odd/even keys reversed", color, key, 1);
  for (int r = 0; r < w->nranks; r++) {
    color[r] = hosts ? r / w->opts->ranks_per_host : 0; /* hosts mode: consecutive blocks */
    key[r] = r;
  }
  api_split_case(w, "by host", color, key, 1);
  for (int r = 0; r < w->nranks; r++) {
    color[r] = r == 0 ? NCCL_SPLIT_NOCOLOR : 7;
    key[r] = 0; /* ties keep the parent's order */
  }
  api_split_case(w, "rank 0 NCCL_SPLIT_NOCOLOR", color, key, 1);
  for (int r = 0; r < w->nranks; r++) {
    color[r] = 0;
    key[r] = r;
  }
  api_split_case(w, "nonblocking", color, key, 0);
}

/* ---- nonblocking init -------------------------------------------------------------------------- */

static void api_init_nonblocking(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "InitRankConfig nonblocking mode=%s", w->opts->mode);
  if (!world_case_begin(w, name)) return;
  ncclComm_t nb[GPU_MAX_RANKS] = {0};
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclUniqueId id;
  void* probe = NULL;
  cfg.blocking = 0;
  int color[GPU_MAX_RANKS] = {0}, key[GPU_MAX_RANKS];
  for (int r = 0; r < w->nranks; r++) key[r] = r;
  if (world_id(w, 2, &id) != 0) goto out;
  /* Rank 0 makes a call on its comm before rank 1's init has begun: in one process by the
     order of the loop, across processes rank 1 waits for rank 0's stamp. */
  volatile double* checked = world_stamp(w, 3);
  if (w->rank0 > 0) {
    double until = world_now() + 60;
    while (*checked == 0 && world_now() < until) mp_sleep(0.001);
  }
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0) goto out;
    ncclResult_t res = ncclCommInitRankConfig(&nb[l], w->nranks, id, api_rank(w, l), &cfg);
    if (!api_ok(res)) {
      world_nccl(w, res, NULL, "ncclCommInitRankConfig (nonblocking)");
      goto out;
    }
    /* Rank 0's init cannot be through before rank 1's begins. A call on the comm is refused
       as NCCL refuses it (ncclInvalidArgument), and enqueues nothing. */
    if (api_rank(w, l) == 0 && w->nranks > 1) {
      int bad = res != ncclInProgress;
      if (bad) {
        world_case_fail(w, "rank 0's nonblocking init returned %s before rank 1's began",
                        ncclGetErrorString(res));
      } else if (world_cuda(w, cudaMalloc(&probe, 64), "cudaMalloc")) {
        bad = 1;
      } else {
        res = ncclAllReduce(probe, probe, 1, ncclInt8, ncclSum, nb[0], w->stream[0]);
        bad = res != ncclInvalidArgument || strstr(ncclGetLastError(nb[0]), "initializing") == NULL;
        if (bad)
          world_case_fail(w,
                          "ncclAllReduce on a communicator still initializing returned %s "
                          "(%s), expected ncclInvalidArgument",
                          ncclGetErrorString(res), ncclGetLastError(nb[0]));
      }
      *checked = world_now(); /* and the inits go on either way (a failure is recorded) */
    }
  }
  for (int l = 0; l < w->nlocal; l++)
    if (api_poll(w, nb[l], "the nonblocking init") != 0) goto out;
  if (api_check_children(w, nb, color, key) != 0) goto out;
  api_interleave(w, nb, color, key);
out:
  api_destroy(w, nb);
  if (probe != NULL) {
    cudaSetDevice(w->dev[0]);
    cudaFree(probe);
  }
  world_case_end(w);
}

/* ---- scalable init ----------------------------------------------------------------------------- */

/*
 * ncclCommInitRankScalable with `nids` ids in slots first_slot.., each made (ncclGetUniqueId) by
 * the process of the first rank of its block, as NCCL's documentation suggests, so that the
 * roots live in different processes; then the collectives of the split cases on it.
 */
static void api_init_scalable(struct gpu_world* w, int nids, int first_slot) {
  char name[128];
  snprintf(name, sizeof name, "InitRankScalable nId=%d mode=%s", nids, w->opts->mode);
  if (!world_case_fits(w, name, w->nranks >= nids, "needs as many ranks as ids (NCCL's rule)"))
    return;
  if (!world_case_begin(w, name)) return;
  ncclComm_t comms[GPU_MAX_RANKS] = {0};
  ncclUniqueId ids[4];
  int color[GPU_MAX_RANKS] = {0}, key[GPU_MAX_RANKS];
  for (int r = 0; r < w->nranks; r++) key[r] = r;
  for (int i = 0; i < nids; i++) {
    const int per = w->nranks / nids, extra = w->nranks % nids;
    const int maker = i * per + (i < extra ? i : extra);
    if (world_id_from(w, first_slot + i, maker, &ids[i]) != 0) goto out;
  }
  if (world_group_start(w) != 0) goto out;
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0) break;
    ncclResult_t res =
        ncclCommInitRankScalable(&comms[l], w->nranks, api_rank(w, l), nids, ids, NULL);
    if (!api_ok(res)) {
      world_nccl(w, res, NULL, "ncclCommInitRankScalable");
      break;
    }
  }
  if (world_group_end(w) != 0 || w->case_failed) goto out;
  if (api_check_children(w, comms, color, key) != 0) goto out;
  api_interleave(w, comms, color, key);
out:
  api_destroy(w, comms);
  world_case_end(w);
}

/* ---- shrink and revoke ------------------------------------------------------------------------- */

/*
 * Every local rank with a communicator in comms[] and not in the exclusion
 * list shrinks it (grouped); the children must match colours/keys and then
 * run the interleaved collectives. 0 on success.
 */
static int api_shrink_run(struct gpu_world* w, ncclComm_t* comms, int* excl, int nexcl, int flags,
                          ncclComm_t* child, const int* color, const int* key, const char* what) {
  if (world_group_start(w) != 0) return -1;
  for (int l = 0; l < w->nlocal; l++) {
    int skip = comms[l] == NULL;
    for (int i = 0; i < nexcl; i++) skip |= api_rank(w, l) == excl[i];
    if (!skip)
      world_nccl(w, ncclCommShrink(comms[l], excl, nexcl, &child[l], NULL, flags), comms[l], what);
  }
  if (world_group_end(w) != 0 || w->case_failed) return -1;
  if (api_check_children(w, child, color, key) != 0) return -1;
  return api_interleave(w, child, color, key);
}

static void api_shrink(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Shrink without the last rank mode=%s", w->opts->mode);
  if (!world_case_fits(w, name, w->nranks >= 2, API_TWO_RANKS_WHY) || !world_case_begin(w, name))
    return;
  ncclComm_t child[GPU_MAX_RANKS] = {0};
  int last = w->nranks - 1;
  int color[GPU_MAX_RANKS], key[GPU_MAX_RANKS];
  for (int r = 0; r < w->nranks; r++) {
    color[r] = r == last ? NCCL_SPLIT_NOCOLOR : 0;
    key[r] = r;
  }
  /* The interleaved collectives include the parent's, on every rank: it still works. */
  api_shrink_run(w, w->comm, &last, 1, NCCL_SHRINK_DEFAULT, child, color, key, "ncclCommShrink");
  api_destroy(w, child);
  world_case_end(w);
}

/* A copy of the world's communicator (split with one colour), for cases that spoil it. */
static int api_dup(struct gpu_world* w, ncclComm_t* dup) {
  if (world_group_start(w) != 0) return -1;
  for (int l = 0; l < w->nlocal; l++)
    world_nccl(w, ncclCommSplit(w->comm[l], 0, api_rank(w, l), &dup[l], NULL), w->comm[l],
               "ncclCommSplit (copy)");
  return world_group_end(w) != 0 || w->case_failed ? -1 : 0;
}

/* A collective on a revoked communicator must be refused, not run. */
static int api_expect_refused(struct gpu_world* w, ncclComm_t* comms, const char* what) {
  struct api_buf a;
  int rc = 0;
  if (buf_alloc(w, &a, API_N) != 0) return -1;
  for (int l = 0; l < w->nlocal; l++) {
    if (comms[l] == NULL) continue;
    ncclResult_t res =
        ncclAllReduce(a.d[l], a.d[l], a.n, ncclInt64, ncclSum, comms[l], w->stream[l]);
    if (res == ncclSuccess || res == ncclInProgress) {
      world_case_fail(w, "rank %d: an AllReduce on a %s communicator was accepted (%s)",
                      api_rank(w, l), what, ncclGetErrorString(res));
      rc = -1;
    }
  }
  world_sync(w);
  buf_free(w, &a);
  return rc;
}

/* ---- split share
 * --------------------------------------------------------------------------------- */

/*
 * The family of the split share cases: [0] a copy of the world's comm, [1] its child, [2] its
 * grandchild (both splitShare = 1, one colour: the world's ranks in order). Each has a stream
 * of its own per local rank ([0] the world's), so only the family's order of kernels keeps
 * their kernels off the shared connections at the same time.
 */
struct api_family {
  ncclComm_t comm[3][GPU_MAX_RANKS];
  cudaStream_t stream[3][GPU_MAX_RANKS];
};

static int api_family_init(struct gpu_world* w, struct api_family* f) {
  memset(f, 0, sizeof *f);
  for (int l = 0; l < w->nlocal; l++) {
    f->stream[0][l] = w->stream[l];
    for (int g = 1; g < 3; g++)
      if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
          world_cuda(w, cudaStreamCreateWithFlags(&f->stream[g][l], cudaStreamNonBlocking),
                     "cudaStreamCreateWithFlags"))
        return -1;
  }
  return 0;
}

static void api_family_free(struct gpu_world* w, struct api_family* f, int abort) {
  for (int g = 0; g < 3; g++)
    for (int l = 0; l < w->nlocal; l++) {
      if (f->comm[g][l]) {
        ncclResult_t res = abort ? ncclCommAbort(f->comm[g][l]) : ncclCommDestroy(f->comm[g][l]);
        world_nccl(w, res, NULL, abort ? "ncclCommAbort" : "ncclCommDestroy");
      }
      f->comm[g][l] = NULL;
      if (g > 0 && f->stream[g][l]) cudaStreamDestroy(f->stream[g][l]);
      f->stream[g][l] = NULL;
    }
}

/* Splits comms[] with one colour (the ranks in order) and the given splitShare. */
static int api_split_all(struct gpu_world* w, ncclComm_t* comms, int share, ncclComm_t* out) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.splitShare = share;
  if (world_group_start(w) != 0) return -1;
  for (int l = 0; l < w->nlocal; l++)
    world_nccl(w, ncclCommSplit(comms[l], 0, api_rank(w, l), &out[l], &cfg), comms[l],
               share ? "ncclCommSplit (splitShare = 1)" : "ncclCommSplit (splitShare = 0)");
  return world_group_end(w) != 0 || w->case_failed ? -1 : 0;
}

/* Device memory in use on local rank 0's GPU, once every rank is past its last call on `via`. */
static int api_mem_used(struct gpu_world* w, ncclComm_t* via, struct api_buf* a, size_t* used) {
  size_t free_b = 0, total = 0;
  if (api_allreduce(w, via, a, a, "ncclAllReduce (a barrier)") || api_sync(w, via) ||
      world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") ||
      world_cuda(w, cudaMemGetInfo(&free_b, &total), "cudaMemGetInfo"))
    return -1;
  *used = total - free_b;
  return 0;
}

/*
 * The sum over every rank of `mine` (each local rank contributes it), through an all-reduce on
 * `via`: how many ranks say yes, known alike to all. -1 on a failure (reported).
 */
static long api_count(struct gpu_world* w, ncclComm_t* via, int mine) {
  struct api_buf b;
  int64_t v = mine, sum = -1;
  long rc = -1;
  if (buf_alloc(w, &b, 1)) goto out;
  for (int l = 0; l < w->nlocal; l++)
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaMemcpy(b.d[l], &v, sizeof v, cudaMemcpyHostToDevice), "cudaMemcpy"))
      goto out;
  if (api_allreduce(w, via, &b, &b, "ncclAllReduce (a count)") || api_sync(w, via) ||
      world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") ||
      world_cuda(w, cudaMemcpy(&sum, b.d[0], sizeof sum, cudaMemcpyDeviceToHost), "cudaMemcpy"))
    goto out;
  rc = (long)sum;
out:
  buf_free(w, &b);
  return rc;
}

static const char* const api_family_name[3] = {"parent", "child", "grandchild"};

/*
 * One round on the live members of f ([0..nfam), destroyed ones skipped): on each in turn, on
 * its own stream, a send/recv ring of A (rank r to r + 1) and an AllReduce of A, with no
 * synchronization between members; then every member's results checked.
 */
static int api_share_round(struct gpu_world* w, struct api_family* f, int nfam, const char* when) {
  struct api_buf a, r[3], s[3];
  int rc = -1, all[GPU_MAX_RANKS];
  memset(r, 0, sizeof r);
  memset(s, 0, sizeof s);
  if (buf_alloc(w, &a, API_N)) goto out;
  for (int l = 0; l < w->nlocal; l++)
    if (buf_put(w, &a, l, api_rank(w, l), 5)) goto out;
  for (int g = 0; g < nfam; g++) {
    if (f->comm[g][0] == NULL) continue;
    if (buf_alloc(w, &r[g], API_N) || buf_alloc(w, &s[g], API_N) || world_group_start(w)) goto out;
    for (int l = 0; l < w->nlocal; l++) {
      int me = api_rank(w, l), n = w->nranks;
      ncclComm_t c = f->comm[g][l];
      cudaStream_t st = f->stream[g][l];
      if (world_nccl(w, ncclSend(a.d[l], a.n, ncclInt64, (me + 1) % n, c, st), c, "ncclSend") ||
          world_nccl(w, ncclRecv(r[g].d[l], a.n, ncclInt64, (me - 1 + n) % n, c, st), c,
                     "ncclRecv") ||
          world_nccl(w, ncclAllReduce(a.d[l], s[g].d[l], a.n, ncclInt64, ncclSum, c, st), c,
                     "ncclAllReduce"))
        break;
    }
    if (world_group_end(w)) goto out;
  }
  for (int g = 0; g < nfam; g++)
    for (int l = 0; l < w->nlocal && f->comm[g][0]; l++)
      if (world_cuda(w, cudaStreamSynchronize(f->stream[g][l]), "cudaStreamSynchronize")) goto out;
  for (int k = 0; k < w->nranks; k++) all[k] = k;
  int64_t* want_s = api_sum(API_N, all, w->nranks, 5, 1);
  rc = want_s ? 0 : -1;
  for (int g = 0; want_s && g < nfam; g++) {
    if (f->comm[g][0] == NULL) continue;
    for (int l = 0; l < w->nlocal; l++) {
      int prev = (api_rank(w, l) - 1 + w->nranks) % w->nranks;
      int64_t* want_r = api_sum(API_N, &prev, 1, 5, 1);
      char what[96];
      snprintf(what, sizeof what, "%s, %s's ring", when, api_family_name[g]);
      rc |= want_r ? buf_expect(w, &r[g], l, want_r, what) : -1;
      snprintf(what, sizeof what, "%s, %s's AllReduce", when, api_family_name[g]);
      rc |= buf_expect(w, &s[g], l, want_s, what);
      free(want_r);
    }
  }
  free(want_s);
  /* Wrong results with no error from the calls: a member stopped meanwhile says why here. */
  for (int g = 0; rc != 0 && g < nfam; g++)
    for (int l = 0; l < w->nlocal && f->comm[g][0]; l++) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(f->comm[g][l], &async) == ncclSuccess && async == ncclSuccess)
        continue;
      const char* msg = ncclGetLastError(f->comm[g][l]);
      world_case_fail(w, "rank %d, %s, %s: asynchronous error %s, \"%s\"", api_rank(w, l), when,
                      api_family_name[g], ncclGetErrorString(async), msg ? msg : "(null)");
    }
out:
  buf_free(w, &a);
  for (int g = 0; g < 3; g++) {
    buf_free(w, &r[g]);
    buf_free(w, &s[g]);
  }
  return rc;
}

static void api_split_share(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Split share: parent, child, grandchild mode=%s", w->opts->mode);
  if (!world_case_fits(w, name, w->nranks >= 2, API_TWO_RANKS_WHY) || !world_case_begin(w, name))
    return;
  struct api_family f;
  ncclComm_t own[GPU_MAX_RANKS] = {0};
  struct api_buf bar;
  size_t m0 = 0, m1 = 0, m2 = 0;
  memset(&bar, 0, sizeof bar);
  if (api_family_init(w, &f) || buf_alloc(w, &bar, 16) || api_dup(w, f.comm[0])) goto out;
  /* The parent's own send/recv connections first: the child's send/recv may borrow them. */
  if (api_share_round(w, &f, 1, "parent alone")) goto out;
  /* Ring FIFOs are device memory over P2P only (SHM's are host memory, NET is not shared). */
  int p2p = strcmp(w->opts->mode, "hosts") != 0 && getenv("BRAID_P2P_DISABLE") == NULL &&
            getenv("NCCL_P2P_DISABLE") == NULL;
  long shared_mib = 0, own_mib = 0;
  int impossible = 0;
  /*
   * cudaMemGetInfo counts every process on the GPU: under ctest -j another test's allocations
   * (a copy-engine scratch is 130-258 MB) land inside a measurement, or its frees. A reading
   * that cannot be true of this process alone (the unshared split under one ring FIFO, or
   * the shared split above the unshared one, which allocates everything the shared one does
   * and more) says nothing; one that shows no saving may be such a reading too. Until every
   * rank shows the saving, every rank measures again with fresh splits, five times at most;
   * each rank's last reading decides: no saving where the reading could be true fails; a
   * reading that could not be true leaves the case unchecked there.
   */
  for (int attempt = 1;; attempt++) {
    if (api_mem_used(w, f.comm[0], &bar, &m0) || api_split_all(w, f.comm[0], 1, f.comm[1]) ||
        api_mem_used(w, f.comm[0], &bar, &m1) || api_split_all(w, f.comm[0], 0, own) ||
        api_mem_used(w, f.comm[0], &bar, &m2))
      goto out;
    shared_mib = (long)((m1 > m0 ? m1 - m0 : 0) >> 20);
    own_mib = (long)((m2 > m1 ? m2 - m1 : 0) >> 20);
    impossible = own_mib < 4 || shared_mib > own_mib;
    long unsaved = api_count(w, f.comm[0], p2p && (impossible || own_mib - shared_mib < 4));
    if (unsaved < 0) goto out;
    if (unsaved == 0 || attempt == 5) break;
    if (w->rank0 == 0)
      fprintf(stderr, "INFO %s: attempt %d: splitShare = 1 %ld MiB, splitShare = 0 %ld MiB "
                      "(on %ld rank(s) no saving seen): measuring again\n",
              name, attempt, shared_mib, own_mib, unsaved);
    api_destroy(w, own);
    api_destroy(w, f.comm[1]);
  }
  if (api_split_all(w, f.comm[1], 1, f.comm[2])) goto out;
  if (api_share_round(w, &f, 3, "all three") || api_share_round(w, &f, 3, "all three again"))
    goto out;
  if (w->rank0 == 0)
    fprintf(stderr,
            "INFO %s: device memory taken by a split: splitShare = 1 %ld MiB, "
            "splitShare = 0 %ld MiB%s\n",
            name, shared_mib, own_mib, p2p ? "" : " (not checked: no P2P connections)");
  /* At least one ring FIFO (4 MiB of NCCL_BUFFSIZE) saved on this GPU. */
  if (p2p && impossible)
    fprintf(stderr, "INFO %s: not checked: the last reading (attempts stop at five) was moved "
                    "by other processes on the GPU\n", name);
  else if (p2p && own_mib - shared_mib < 4)
    world_case_fail(w,
                    "a shared split took %ld MiB of device memory, an unshared one %ld MiB "
                    "(expected at least a ring FIFO, 4 MiB, less)",
                    shared_mib, own_mib);
  api_destroy(w, own);
  /* The parent goes first: the child and grandchild keep its connections. */
  api_destroy(w, f.comm[0]);
  if (api_share_round(w, &f, 3, "parent destroyed")) goto out;
  api_destroy(w, f.comm[1]);
  api_share_round(w, &f, 3, "parent and child destroyed");
out:
  buf_free(w, &bar);
  api_destroy(w, own);
  api_family_free(w, &f, 0);
  world_case_end(w);
}

/*
 * Braid: aborting a sharing child stops the family; the parent then fails, saying why. Rank 0's
 * parent waits meanwhile in a receive nobody sends: the child's abort must end that kernel too.
 */
static void api_split_share_abort(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Split share: abort of the child fails the parent mode=%s",
           w->opts->mode);
  if (!world_case_fits(w, name, w->nranks >= 2, API_TWO_RANKS_WHY) ||
      !world_case_fits(w, name, dlsym(RTLD_DEFAULT, "braidGetVersionString") != NULL,
                       "Braid's semantics (this libnccl is not Braid)") ||
      !world_case_begin(w, name))
    return;
  struct api_family f;
  struct api_buf bar;
  memset(&bar, 0, sizeof bar);
  /*
   * The round, then a barrier on the world communicator (not in the family) before the abort:
   * a rank's send is complete once its data is in the connection's FIFO, and over the network
   * its proxy may not have put it on the wire yet (the connection may still be connecting);
   * aborting then drops it, as NCCL's abort does, and the receiver never gets it.
   */
  if (api_family_init(w, &f) || buf_alloc(w, &bar, 16) || api_dup(w, f.comm[0]) ||
      api_split_all(w, f.comm[0], 1, f.comm[1]) ||
      api_share_round(w, &f, 2, "before the abort") ||
      api_allreduce(w, w->comm, &bar, &bar, "ncclAllReduce (a barrier)") || api_sync(w, w->comm))
    goto out;
  int stuck = -1; /* the local rank waiting in a receive, or -1 (rank 0 is elsewhere) */
  struct api_buf r;
  memset(&r, 0, sizeof r);
  if (buf_alloc(w, &r, API_N)) goto out;
  for (int l = 0; l < w->nlocal; l++) {
    if (api_rank(w, l) != 0) continue;
    stuck = l;
    world_nccl(w, ncclRecv(r.d[l], r.n, ncclInt64, w->nranks - 1, f.comm[0][l], f.stream[0][l]),
               f.comm[0][l], "ncclRecv (never sent)");
  }
  for (int l = 0; l < w->nlocal; l++) {
    world_nccl(w, ncclCommAbort(f.comm[1][l]), NULL, "ncclCommAbort (the child)");
    f.comm[1][l] = NULL;
  }
  if (stuck >= 0) {
    cudaError_t q = cudaErrorNotReady;
    double until = world_now() + 10;
    while ((q = cudaStreamQuery(f.stream[0][stuck])) == cudaErrorNotReady && world_now() < until)
      mp_sleep(0.001);
    if (q != cudaSuccess)
      world_case_fail(w,
                      "rank 0: the parent's receive still waits (%s) 10 s after its child's abort",
                      cudaGetErrorString(q));
  }
  buf_free(w, &r);
  api_expect_refused(w, f.comm[0], "sharing with an aborted child");
  for (int l = 0; l < w->nlocal; l++) {
    ncclResult_t async = ncclSuccess;
    world_nccl(w, ncclCommGetAsyncError(f.comm[0][l], &async), f.comm[0][l],
               "ncclCommGetAsyncError");
    const char* msg = ncclGetLastError(f.comm[0][l]);
    if (async != ncclRemoteError || msg == NULL || strstr(msg, "splitShare") == NULL)
      world_case_fail(w, "rank %d: after its sharing child's abort the parent reports %s, \"%s\"",
                      api_rank(w, l), ncclGetErrorString(async), msg ? msg : "(null)");
  }
out:
  buf_free(w, &bar);
  api_family_free(w, &f, 1);
  world_case_end(w);
}

static void api_shrink_abort(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Shrink NCCL_SHRINK_ABORT without rank 0 mode=%s", w->opts->mode);
  if (!world_case_fits(w, name, w->nranks >= 2, API_TWO_RANKS_WHY) || !world_case_begin(w, name))
    return;
  ncclComm_t dup[GPU_MAX_RANKS] = {0}, child[GPU_MAX_RANKS] = {0};
  int gone = 0;
  int color[GPU_MAX_RANKS], key[GPU_MAX_RANKS];
  for (int r = 0; r < w->nranks; r++) {
    color[r] = r == gone ? NCCL_SPLIT_NOCOLOR : 0;
    key[r] = r;
  }
  if (api_dup(w, dup) != 0) goto out;
  /* Rank 0 leaves (as a failed rank would); the others shrink it away. */
  for (int l = 0; l < w->nlocal; l++) {
    if (api_rank(w, l) != gone) continue;
    world_nccl(w, ncclCommDestroy(dup[l]), NULL, "ncclCommDestroy (the leaving rank)");
    dup[l] = NULL;
  }
  /* The child's collectives; every rank's parent AllReduce still goes to the world comm. */
  api_shrink_run(w, dup, &gone, 1, NCCL_SHRINK_ABORT, child, color, key, "ncclCommShrink (abort)");
out:
  api_destroy(w, child);
  api_destroy(w, dup);
  world_case_end(w);
}

typedef ncclResult_t (*revoke_fn)(ncclComm_t comm, int flags);

static void api_revoke(struct gpu_world* w) {
  char name[128];
  /* Looked up, not linked: not every NCCL 2.28 has it (2.28.3 does not), and this binary runs
   * on NCCL too. */
  revoke_fn revoke = (revoke_fn)dlsym(RTLD_DEFAULT, "ncclCommRevoke");
  snprintf(name, sizeof name, "Revoke then shrink mode=%s", w->opts->mode);
  if (!world_case_fits(w, name, revoke != NULL, "this libnccl has no ncclCommRevoke") ||
      !world_case_begin(w, name))
    return;
  ncclComm_t dup[GPU_MAX_RANKS] = {0}, child[GPU_MAX_RANKS] = {0};
  int color[GPU_MAX_RANKS] = {0}, key[GPU_MAX_RANKS];
  for (int r = 0; r < w->nranks; r++) key[r] = r;
  if (api_dup(w, dup) != 0) goto out;
  for (int l = 0; l < w->nlocal; l++) {
    ncclResult_t res = revoke(dup[l], NCCL_REVOKE_DEFAULT);
    if (!api_ok(res)) world_nccl(w, res, dup[l], "ncclCommRevoke");
    else if (api_poll(w, dup[l], "the revoke") != 0) break;
  }
  if (w->case_failed || api_expect_refused(w, dup, "revoked") != 0) goto out;
  api_shrink_run(w, dup, NULL, 0, NCCL_SHRINK_DEFAULT, child, color, key,
                 "ncclCommShrink (of the revoked communicator)");
out:
  api_destroy(w, child);
  api_destroy(w, dup);
  world_case_end(w);
}

/* ---- CUDA graphs ------------------------------------------------------------------------------- */

/*
 * The captured work: rank 0 sends its accumulator A, the others a constant
 * C, into an AllReduce whose result lands in A everywhere; then each rank
 * sends A to the next rank and receives the previous one's into R. Replay k
 * leaves A = A0 + k * S (S: the sum of the others' C) on every rank.
 */
static int api_graph_issue(struct gpu_world* w, struct api_buf* a, struct api_buf* c,
                           struct api_buf* r) {
  int rc = world_group_start(w);
  for (int l = 0; rc == 0 && l < w->nlocal; l++) {
    int64_t* send = api_rank(w, l) == 0 ? a->d[l] : c->d[l];
    rc = world_nccl(w, ncclAllReduce(send, a->d[l], a->n, ncclInt64, ncclSum, w->comm[l],
                                     w->stream[l]),
                    w->comm[l], "ncclAllReduce (captured)");
  }
  rc |= world_group_end(w);
  if (rc) return -1;
  rc = world_group_start(w);
  for (int l = 0; rc == 0 && l < w->nlocal; l++) {
    int me = api_rank(w, l), n = w->nranks;
    rc = world_nccl(w, ncclSend(a->d[l], a->n, ncclInt64, (me + 1) % n, w->comm[l], w->stream[l]),
                    w->comm[l], "ncclSend (captured)") ||
         world_nccl(w, ncclRecv(r->d[l], r->n, ncclInt64, (me - 1 + n) % n, w->comm[l],
                                w->stream[l]),
                    w->comm[l], "ncclRecv (captured)");
  }
  rc |= world_group_end(w);
  return rc ? -1 : 0;
}

static int api_graph_replay(struct gpu_world* w, cudaGraphExec_t* exec, int times) {
  for (int k = 0; k < times; k++)
    for (int l = 0; l < w->nlocal; l++)
      if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0 ||
          world_cuda(w, cudaGraphLaunch(exec[l], w->stream[l]), "cudaGraphLaunch") != 0)
        return -1;
  return world_sync(w);
}

/* A and R on every rank: mult * A0 + k * S. */
static int api_graph_check(struct gpu_world* w, struct api_buf* a, struct api_buf* r, int64_t mult,
                           int64_t k, const char* when) {
  int zero = 0, others[GPU_MAX_RANKS];
  for (int i = 1; i < w->nranks; i++) others[i - 1] = i;
  int64_t* want = api_sum(a->n, &zero, 1, 3, mult);
  int64_t* s = api_sum(a->n, others, w->nranks - 1, 4, k);
  int rc = 0;
  if (want == NULL || s == NULL) {
    world_case_fail(w, "out of host memory");
    rc = -1;
  }
  for (size_t i = 0; rc == 0 && i < a->n; i++) want[i] += s[i];
  char what[96];
  for (int l = 0; rc == 0 && l < w->nlocal; l++) {
    snprintf(what, sizeof what, "accumulator %s", when);
    rc |= buf_expect(w, a, l, want, what);
    snprintf(what, sizeof what, "received from the previous rank %s", when);
    rc |= buf_expect(w, r, l, want, what);
  }
  free(want);
  free(s);
  return rc;
}

/*
 * Ends the capture on every local rank's stream s[l] that is capturing, then instantiates the
 * graphs. One thread drives every local rank (threads mode): while any of its streams is still
 * capturing (thread-local mode), its cudaGraphInstantiate is refused, so every capture ends
 * before the first instantiation, also after a failure (a stream left capturing would refuse
 * every later case's allocations).
 */
static int api_capture_end(struct gpu_world* w, cudaStream_t* s, cudaGraph_t* graph,
                           cudaGraphExec_t* exec) {
  int rc = 0;
  for (int l = 0; l < w->nlocal; l++) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaSetDevice(w->dev[l]);
    if (world_cuda(w, cudaStreamIsCapturing(s[l], &st), "cudaStreamIsCapturing")) rc = -1;
    if (st != cudaStreamCaptureStatusNone &&
        world_cuda(w, cudaStreamEndCapture(s[l], &graph[l]), "cudaStreamEndCapture"))
      rc = -1;
  }
  for (int l = 0; rc == 0 && l < w->nlocal; l++) {
    cudaSetDevice(w->dev[l]);
    if (world_cuda(w, cudaGraphInstantiate(&exec[l], graph[l], 0), "cudaGraphInstantiate")) rc = -1;
  }
  return rc;
}

/* Every local rank's graph and its instance, where made. */
static void api_graphs_destroy(struct gpu_world* w, cudaGraph_t* graph, cudaGraphExec_t* exec) {
  for (int l = 0; l < w->nlocal; l++) {
    cudaSetDevice(w->dev[l]);
    if (exec[l]) cudaGraphExecDestroy(exec[l]);
    if (graph[l]) cudaGraphDestroy(graph[l]);
  }
}

static void api_graph(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Graph AllReduce+SendRecv %d replays, eager mixed mode=%s",
           API_REPLAYS, w->opts->mode);
  if (!world_case_begin(w, name)) return;
  struct api_buf a, c, r;
  cudaGraph_t graph[GPU_MAX_RANKS] = {0};
  cudaGraphExec_t exec[GPU_MAX_RANKS] = {0};
  memset(&a, 0, sizeof a);
  memset(&c, 0, sizeof c);
  memset(&r, 0, sizeof r);
  if (buf_alloc(w, &a, API_GRAPH_N) || buf_alloc(w, &c, API_GRAPH_N) ||
      buf_alloc(w, &r, API_GRAPH_N))
    goto out;
  for (int l = 0; l < w->nlocal; l++)
    if (buf_put(w, &a, l, 0, 3) || buf_put(w, &c, l, api_rank(w, l), 4)) goto out;
  int issued = 0;
  for (int l = 0; issued == 0 && l < w->nlocal; l++)
    issued = world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
             world_cuda(w, cudaStreamBeginCapture(w->stream[l], cudaStreamCaptureModeThreadLocal),
                        "cudaStreamBeginCapture");
  if (issued == 0) issued = api_graph_issue(w, &a, &c, &r);
  if (api_capture_end(w, w->stream, graph, exec) || issued != 0) goto out;
  if (api_graph_replay(w, exec, API_REPLAYS) ||
      api_graph_check(w, &a, &r, 1, API_REPLAYS, "after the replays"))
    goto out;
  /* An eager call on the same communicator between replays: A becomes nranks * A. */
  if (api_allreduce(w, w->comm, &a, &a, "ncclAllReduce (eager, in place)") || world_sync(w))
    goto out;
  if (api_graph_replay(w, exec, 10)) goto out;
  /* mult * A0 + k * S with A0 scaled by nranks and S by nranks * 1000 + 10. */
  {
    int zero = 0, others[GPU_MAX_RANKS];
    for (int i = 1; i < w->nranks; i++) others[i - 1] = i;
    int64_t* want = api_sum(a.n, &zero, 1, 3, w->nranks);
    int64_t* s = api_sum(a.n, others, w->nranks - 1, 4, (int64_t)w->nranks * API_REPLAYS + 10);
    if (want && s) {
      for (size_t i = 0; i < a.n; i++) want[i] += s[i];
      for (int l = 0; l < w->nlocal; l++) {
        buf_expect(w, &a, l, want, "accumulator after eager + 10 replays");
        buf_expect(w, &r, l, want, "received after eager + 10 replays");
      }
    } else {
      world_case_fail(w, "out of host memory");
    }
    free(want);
    free(s);
  }
out:
  api_graphs_destroy(w, graph, exec);
  buf_free(w, &a);
  buf_free(w, &c);
  buf_free(w, &r);
  world_case_end(w);
}

/*
 * Rank `rank`'s in-place all-to-all buffer: block j holds api_val(rank, j * bn + i); transposed,
 * api_val(j, rank * bn + i), the data rank j held for this rank.
 */
static void api_a2a_fill(int64_t* h, int nranks, size_t bn, int rank, int transposed) {
  for (int j = 0; j < nranks; j++)
    for (size_t i = 0; i < bn; i++)
      h[(size_t)j * bn + i] = transposed ? api_val(j, (size_t)rank * bn + i, 5)
                                         : api_val(rank, (size_t)j * bn + i, 5);
}

/*
 * In-place AllToAll stages its send data in a stream-ordered allocation (a memory node when
 * captured). Three calls captured in one graph: a replay transposes the blocks once (three
 * transposes), two replays give the input back. A graph with memory nodes refuses edge removal,
 * which the ordering of a capture's later kernels of one comm used (cudaErrorNotSupported).
 */
static void api_graph_a2a_in_place(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Graph in-place AllToAll x3, 2 replays mode=%s", w->opts->mode);
  if (!world_case_begin(w, name)) return;
  const size_t bn = 4099; /* per block: odd, several LL lines per thread */
  struct api_buf a;
  cudaGraph_t graph[GPU_MAX_RANKS] = {0};
  cudaGraphExec_t exec[GPU_MAX_RANKS] = {0};
  int64_t* want = malloc(bn * (size_t)w->nranks * sizeof *want);
  memset(&a, 0, sizeof a);
  if (want == NULL) {
    world_case_fail(w, "out of host memory");
    goto out;
  }
  if (buf_alloc(w, &a, bn * (size_t)w->nranks)) goto out;
  for (int l = 0; l < w->nlocal; l++) {
    api_a2a_fill(want, w->nranks, bn, api_rank(w, l), 0);
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaMemcpy(a.d[l], want, a.n * sizeof *want, cudaMemcpyHostToDevice),
                   "cudaMemcpy to the device"))
      goto out;
  }
  int issued = 0;
  for (int l = 0; issued == 0 && l < w->nlocal; l++)
    issued = world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
             world_cuda(w, cudaStreamBeginCapture(w->stream[l], cudaStreamCaptureModeThreadLocal),
                        "cudaStreamBeginCapture");
  for (int k = 0; issued == 0 && k < 3; k++) {
    issued = world_group_start(w);
    for (int l = 0; issued == 0 && l < w->nlocal; l++)
      issued = world_nccl(w, ncclAlltoAll(a.d[l], a.d[l], bn, ncclInt64, w->comm[l],
                                          w->stream[l]),
                          w->comm[l], "ncclAlltoAll (in place, captured)");
    issued |= world_group_end(w);
  }
  if (api_capture_end(w, w->stream, graph, exec) || issued != 0) goto out;
  for (int r = 1; r <= 2; r++) {
    if (api_graph_replay(w, exec, 1)) goto out;
    for (int l = 0; l < w->nlocal; l++) {
      api_a2a_fill(want, w->nranks, bn, api_rank(w, l), r == 1);
      buf_expect(w, &a, l, want, r == 1 ? "after one replay (transposed)" : "after two replays");
    }
  }
out:
  api_graphs_destroy(w, graph, exec);
  buf_free(w, &a);
  free(want);
  world_case_end(w);
}

/*
 * Graph mixing: graph G1 (an AllReduce into g, then one of g into h) replayed on the comm's
 * stream, graph G2 (into x)
 * on a second stream, and eager AllReduces (into e) on a third, interleaved with no
 * synchronization between them. They share the comm's connections, so each must run after the
 * one the host launched before it (NCCL_GRAPH_MIXING_SUPPORT); run together, they mix each
 * other's chunks or hang.
 */
#define API_MIX_N ((size_t)1 << 20) /* 8 MiB per buffer: the kernels run long enough to overlap */
#define API_MIX_ROUNDS 100

/* Captures AllReduce(in -> out) on s[], then, when out2 is set, AllReduce(out -> out2). */
static int api_mix_capture(struct gpu_world* w, cudaStream_t* s, struct api_buf* in,
                           struct api_buf* out, struct api_buf* out2, cudaGraph_t* graph,
                           cudaGraphExec_t* exec) {
  int issued = 0;
  for (int l = 0; issued == 0 && l < w->nlocal; l++)
    issued = world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
             world_cuda(w, cudaStreamBeginCapture(s[l], cudaStreamCaptureModeThreadLocal),
                        "cudaStreamBeginCapture");
  for (int k = 0; issued == 0 && k < (out2 != NULL ? 2 : 1); k++) {
    struct api_buf* from = k == 0 ? in : out;
    struct api_buf* to = k == 0 ? out : out2;
    issued = world_group_start(w);
    for (int l = 0; issued == 0 && l < w->nlocal; l++)
      issued = world_nccl(
          w, ncclAllReduce(from->d[l], to->d[l], in->n, ncclInt64, ncclSum, w->comm[l], s[l]),
          w->comm[l], "ncclAllReduce (captured)");
    issued |= world_group_end(w);
  }
  return api_capture_end(w, s, graph, exec) || issued ? -1 : 0;
}

static int api_mix_launch(struct gpu_world* w, cudaGraphExec_t* exec, cudaStream_t* s) {
  for (int l = 0; l < w->nlocal; l++)
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaGraphLaunch(exec[l], s[l]), "cudaGraphLaunch"))
      return -1;
  return 0;
}

/* Local rank l's buffer holds nranks * want[]. */
static int api_mix_expect_scaled(struct gpu_world* w, struct api_buf* b, int l, const int64_t* want,
                                 const char* what) {
  int64_t* scaled = malloc(b->n * sizeof *scaled);
  if (scaled == NULL) {
    world_case_fail(w, "out of host memory");
    return -1;
  }
  for (size_t i = 0; i < b->n; i++) scaled[i] = want[i] * w->nranks;
  int rc = buf_expect(w, b, l, scaled, what);
  free(scaled);
  return rc;
}

static void api_graph_mixing(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name,
           "Graph mixing: two graphs and eager calls on three streams, %d "
           "rounds, no sync mode=%s",
           API_MIX_ROUNDS, w->opts->mode);
  if (!world_case_begin(w, name)) return;
  struct api_buf c, g, h, x, e;
  cudaStream_t s2[GPU_MAX_RANKS] = {0}, s3[GPU_MAX_RANKS] = {0};
  cudaGraph_t g1[GPU_MAX_RANKS] = {0}, g2[GPU_MAX_RANKS] = {0};
  cudaGraphExec_t x1[GPU_MAX_RANKS] = {0}, x2[GPU_MAX_RANKS] = {0};
  int64_t* want = NULL;
  memset(&c, 0, sizeof c);
  memset(&g, 0, sizeof g);
  memset(&h, 0, sizeof h);
  memset(&x, 0, sizeof x);
  memset(&e, 0, sizeof e);
  if (buf_alloc(w, &c, API_MIX_N) || buf_alloc(w, &g, API_MIX_N) || buf_alloc(w, &h, API_MIX_N) ||
      buf_alloc(w, &x, API_MIX_N) || buf_alloc(w, &e, API_MIX_N))
    goto out;
  for (int l = 0; l < w->nlocal; l++)
    if (buf_put(w, &c, l, api_rank(w, l), 5) ||
        world_cuda(w, cudaStreamCreateWithFlags(&s2[l], cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags") ||
        world_cuda(w, cudaStreamCreateWithFlags(&s3[l], cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags"))
      goto out;
  if (api_mix_capture(w, w->stream, &c, &g, &h, g1, x1) ||
      api_mix_capture(w, s2, &c, &x, NULL, g2, x2))
    goto out;
  for (int k = 0; k < API_MIX_ROUNDS; k++) {
    if (api_mix_launch(w, x1, w->stream)) goto out;
    int rc = world_group_start(w);
    for (int l = 0; rc == 0 && l < w->nlocal; l++)
      rc = world_nccl(w, ncclAllReduce(c.d[l], e.d[l], c.n, ncclInt64, ncclSum, w->comm[l], s3[l]),
                      w->comm[l], "ncclAllReduce (eager, third stream)");
    if (world_group_end(w) || rc || api_mix_launch(w, x2, s2)) goto out;
  }
  for (int l = 0; l < w->nlocal; l++)
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_cuda(w, cudaStreamSynchronize(s2[l]), "cudaStreamSynchronize") ||
        world_cuda(w, cudaStreamSynchronize(s3[l]), "cudaStreamSynchronize"))
      goto out;
  if (api_sync(w, w->comm)) goto out;
  {
    int all[GPU_MAX_RANKS];
    for (int i = 0; i < w->nranks; i++) all[i] = i;
    want = api_sum(c.n, all, w->nranks, 5, 1);
  }
  if (want == NULL) {
    world_case_fail(w, "out of host memory");
    goto out;
  }
  for (int l = 0; l < w->nlocal; l++)
    if (buf_expect(w, &g, l, want, "first graph's output") ||
        buf_expect(w, &x, l, want, "second graph's output") ||
        api_mix_expect_scaled(w, &h, l, want, "first graph's second output") ||
        buf_expect(w, &e, l, want, "eager output"))
      break;
out:
  for (int l = 0; l < w->nlocal; l++) {
    cudaSetDevice(w->dev[l]);
    if (s2[l]) cudaStreamSynchronize(s2[l]);
    if (s3[l]) cudaStreamSynchronize(s3[l]);
    if (x1[l]) cudaGraphExecDestroy(x1[l]);
    if (x2[l]) cudaGraphExecDestroy(x2[l]);
    if (g1[l]) cudaGraphDestroy(g1[l]);
    if (g2[l]) cudaGraphDestroy(g2[l]);
    if (s2[l]) cudaStreamDestroy(s2[l]);
    if (s3[l]) cudaStreamDestroy(s3[l]);
  }
  free(want);
  buf_free(w, &c);
  buf_free(w, &g);
  buf_free(w, &h);
  buf_free(w, &x);
  buf_free(w, &e);
  world_case_end(w);
}

/* ---- simulate, register ------------------------------------------------------------------------ */

static void api_simulate(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "GroupSimulateEnd AllReduce mode=%s", w->opts->mode);
  if (!world_case_begin(w, name)) return;
  struct api_buf a, b;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  if (buf_alloc(w, &a, 1 << 20) || buf_alloc(w, &b, 1 << 20)) goto out;
  if (world_group_start(w) != 0) goto out;
  for (int l = 0; l < w->nlocal; l++)
    world_nccl(w, ncclAllReduce(a.d[l], b.d[l], a.n, ncclInt64, ncclSum, w->comm[l], w->stream[l]),
               w->comm[l], "ncclAllReduce (simulated)");
  if (world_nccl(w, ncclGroupSimulateEnd(&sim), NULL, "ncclGroupSimulateEnd") != 0) goto out;
  /* NCCL leaves the estimate undefined (-1) for a communicator of one rank; Braid gives a time. */
  if ((w->nranks > 1 || sim.estimatedTime != -1.0f) &&
      (!(sim.estimatedTime > 0.0f) || !isfinite(sim.estimatedTime))) {
    world_case_fail(w, "estimatedTime = %g; expected a positive time", (double)sim.estimatedTime);
    goto out;
  }
  if (w->rank0 == 0 && w->opts->verbose)
    fprintf(stderr, "  8 MB AllReduce estimated at %g\n", (double)sim.estimatedTime);
  if (world_sync(w) != 0) goto out;
  /* Nothing ran: the output is still poisoned. */
  for (int l = 0; l < w->nlocal; l++) {
    int64_t first = 0;
    cudaSetDevice(w->dev[l]);
    if (world_cuda(w, cudaMemcpy(&first, b.d[l], sizeof first, cudaMemcpyDeviceToHost),
                   "cudaMemcpy") == 0) {
      int64_t poison;
      memset(&poison, GPU_POISON, sizeof poison);
      if (first != poison)
        world_case_fail(w, "rank %d: the simulated AllReduce wrote its output", api_rank(w, l));
    }
  }
out:
  buf_free(w, &a);
  buf_free(w, &b);
  world_case_end(w);
}

static void api_register(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "MemAlloc+CommRegister+WindowRegister AllReduce mode=%s",
           w->opts->mode);
  if (!world_case_begin(w, name)) return;
  struct api_buf a; /* its pointers come from ncclMemAlloc, not cudaMalloc */
  void* handle[GPU_MAX_RANKS] = {0};
  ncclWindow_t win[GPU_MAX_RANKS] = {0};
  int windows = 0;
  memset(&a, 0, sizeof a);
  a.n = API_N;
  size_t bytes = a.n * sizeof(int64_t);
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_nccl(w, ncclMemAlloc((void**)&a.d[l], bytes), NULL, "ncclMemAlloc") ||
        buf_put(w, &a, l, api_rank(w, l), 5) ||
        world_nccl(w, ncclCommRegister(w->comm[l], a.d[l], bytes, &handle[l]), w->comm[l],
                   "ncclCommRegister"))
      goto out;
    if (handle[l] == NULL) {
      world_case_fail(w, "ncclCommRegister returned success and a NULL handle");
      goto out;
    }
  }
  /* Windows are collective: every rank, grouped when one thread drives several. */
  if (world_group_start(w) != 0) goto out;
  for (int l = 0; l < w->nlocal; l++)
    world_nccl(w, ncclCommWindowRegister(w->comm[l], a.d[l], bytes, &win[l], NCCL_WIN_DEFAULT),
               w->comm[l], "ncclCommWindowRegister");
  windows = 1;
  if (world_group_end(w) != 0 || w->case_failed) goto out;
  if (api_allreduce(w, w->comm, &a, &a, "ncclAllReduce (registered, in place)") || world_sync(w))
    goto out;
  int all[GPU_MAX_RANKS];
  for (int r = 0; r < w->nranks; r++) all[r] = r;
  int64_t* want = api_sum(a.n, all, w->nranks, 5, 1);
  for (int l = 0; want && l < w->nlocal; l++) buf_expect(w, &a, l, want, "registered AllReduce");
  free(want);
out:
  if (windows) {
    world_group_start(w);
    for (int l = 0; l < w->nlocal; l++)
      world_nccl(w, ncclCommWindowDeregister(w->comm[l], win[l]), w->comm[l],
                 "ncclCommWindowDeregister");
    world_group_end(w);
  }
  for (int l = 0; l < w->nlocal; l++) {
    if (handle[l])
      world_nccl(w, ncclCommDeregister(w->comm[l], handle[l]), w->comm[l], "ncclCommDeregister");
    if (a.d[l]) {
      cudaSetDevice(w->dev[l]);
      world_nccl(w, ncclMemFree(a.d[l]), NULL, "ncclMemFree");
    }
  }
  world_case_end(w);
}

static void CUDART_CB api_hold_stream(void* arg) {
  (void)arg;
  usleep(300 * 1000);
}

/*
 * Braid with registered buffers used in place (the gpu_reg_api and gpu_reg_fan_api entries):
 * two ranks with BRAID_CE_REG_MIN_BYTES set low run an all-reduce (through the copy engines
 * where the ranks are joined by P2P), three or more with BRAID_CE_FAN_MIN_BYTES set low an
 * all-gather (every rank's copy engine writes into every peer's buffer), held back on its
 * stream by a host function that sleeps 300 ms; deregistering its receive buffer meanwhile is
 * refused with ncclInvalidUsage on every rank whose call used it in place (the registration
 * stays), and accepted once the stream is done; the result is right.
 */
static void api_register_busy(struct gpu_world* w) {
  char name[128];
  const int gather = w->nranks > 2;
  const char* min = getenv(gather ? "BRAID_CE_FAN_MIN_BYTES" : "BRAID_CE_REG_MIN_BYTES");
  const long long limit = (long long)(API_N * sizeof(int64_t)) * (gather ? w->nranks : 1);
  snprintf(name, sizeof name, "Registered %s, deregistration while busy mode=%s",
           gather ? "AllGather" : "AllReduce", w->opts->mode);
  if (!world_case_fits(w, name, dlsym(RTLD_DEFAULT, "braidGetVersionString") != NULL,
                       "Braid's answers (this libnccl is not Braid)") ||
      !world_case_fits(w, name, w->nranks >= 2, "needs 2 ranks or more") ||
      !world_case_fits(w, name, min != NULL && atoll(min) >= 0 && atoll(min) <= limit,
                       gather ? "runs only with BRAID_CE_FAN_MIN_BYTES at most the output's size"
                              : "runs only with BRAID_CE_REG_MIN_BYTES at most 32776") ||
      !world_case_begin(w, name))
    return;
  struct api_buf s, r;
  void* sh[GPU_MAX_RANKS] = {0};
  void* rh[GPU_MAX_RANKS] = {0};
  memset(&s, 0, sizeof s);
  memset(&r, 0, sizeof r);
  s.n = API_N;
  r.n = API_N * (gather ? (size_t)w->nranks : 1);
  const size_t bytes = API_N * sizeof(int64_t), rbytes = r.n * sizeof(int64_t);
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") ||
        world_nccl(w, ncclMemAlloc((void**)&s.d[l], bytes), NULL, "ncclMemAlloc") ||
        world_nccl(w, ncclMemAlloc((void**)&r.d[l], rbytes), NULL, "ncclMemAlloc") ||
        buf_put(w, &s, l, api_rank(w, l), 9) ||
        world_nccl(w, ncclCommRegister(w->comm[l], s.d[l], bytes, &sh[l]), w->comm[l],
                   "ncclCommRegister") ||
        world_nccl(w, ncclCommRegister(w->comm[l], r.d[l], rbytes, &rh[l]), w->comm[l],
                   "ncclCommRegister") ||
        world_cuda(w, cudaLaunchHostFunc(w->stream[l], api_hold_stream, NULL),
                   "cudaLaunchHostFunc"))
      goto out;
  }
  if (api_collective(w, w->comm, &s, &r, gather,
                     gather ? "ncclAllGather (registered)" : "ncclAllReduce (registered)"))
    goto out;
  for (int l = 0; l < w->nlocal; l++) {
    ncclResult_t res = ncclCommDeregister(w->comm[l], rh[l]);
    if (res == ncclSuccess) {
      rh[l] = NULL;
      world_case_fail(w, "rank %d: ncclCommDeregister of a buffer its queued %s uses in place "
                      "returned success", api_rank(w, l), gather ? "all-gather" : "all-reduce");
    } else if (res != ncclInvalidUsage) {
      world_nccl(w, res, w->comm[l], "ncclCommDeregister (busy)");
    } else if (strstr(ncclGetLastError(w->comm[l]), "still in use") == NULL) {
      world_case_fail(w, "rank %d: the refusal does not say the buffer is in use: %s",
                      api_rank(w, l), ncclGetLastError(w->comm[l]));
    }
  }
  if (world_sync(w)) goto out;
  int all[GPU_MAX_RANKS];
  for (int k = 0; k < w->nranks; k++) all[k] = k;
  int64_t* want = gather ? malloc(rbytes) : api_sum(API_N, all, w->nranks, 9, 1);
  for (size_t i = 0; gather && want && i < r.n; i++)
    want[i] = api_val((int)(i / API_N), i % API_N, 9);
  for (int l = 0; want && l < w->nlocal; l++)
    buf_expect(w, &r, l, want, gather ? "registered AllGather" : "registered AllReduce");
  free(want);
out:
  for (int l = 0; l < w->nlocal; l++) {
    (void)cudaSetDevice(w->dev[l]);
    (void)cudaStreamSynchronize(w->stream[l]);
    if (sh[l])
      world_nccl(w, ncclCommDeregister(w->comm[l], sh[l]), w->comm[l], "ncclCommDeregister");
    if (rh[l])
      world_nccl(w, ncclCommDeregister(w->comm[l], rh[l]), w->comm[l], "ncclCommDeregister");
    if (s.d[l]) world_nccl(w, ncclMemFree(s.d[l]), NULL, "ncclMemFree");
    if (r.d[l]) world_nccl(w, ncclMemFree(r.d[l]), NULL, "ncclMemFree");
  }
  world_case_end(w);
}

/* BRAID_CHECK=1: AllReduce of 1024 elements on even ranks, 2048 on odd ones. */
static void api_check(struct gpu_world* w) {
  const char* env = getenv("BRAID_CHECK");
  char name[128];
  snprintf(name, sizeof name, "BRAID_CHECK mismatched counts refused mode=%s", w->opts->mode);
  if (!world_case_fits(w, name, env != NULL && atoi(env) != 0, "runs only with BRAID_CHECK=1") ||
      !world_case_fits(w, name, w->nranks >= 2, API_TWO_RANKS_WHY) || !world_case_begin(w, name))
    return;
  struct api_buf a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  if (buf_alloc(w, &a, 2048) || buf_alloc(w, &b, 2048)) goto out;
  ncclResult_t res = ncclGroupStart();
  for (int l = 0; res == ncclSuccess && l < w->nlocal; l++) {
    size_t count = api_rank(w, l) % 2 ? 2048 : 1024;
    res = ncclAllReduce(a.d[l], b.d[l], count, ncclInt64, ncclSum, w->comm[l], w->stream[l]);
  }
  ncclResult_t end = ncclGroupEnd();
  const char* msg = ncclGetLastError(w->comm[0]);
  if (res != ncclSuccess || end != ncclInvalidUsage || strstr(msg, "count=1024") == NULL ||
      strstr(msg, "count=2048") == NULL) {
    world_case_fail(w, "the mismatch gave %s / %s: %s", ncclGetErrorString(res),
                    ncclGetErrorString(end), msg);
    goto out;
  }
  if (w->rank0 == 0 && w->opts->verbose) fprintf(stderr, "  refused: %s\n", msg);
  if (world_sync(w) != 0) goto out;
  int64_t poison;
  memset(&poison, GPU_POISON, sizeof poison);
  for (int l = 0; l < w->nlocal; l++) {
    int64_t first = 0;
    cudaSetDevice(w->dev[l]);
    if (world_cuda(w, cudaMemcpy(&first, b.d[l], sizeof first, cudaMemcpyDeviceToHost),
                   "cudaMemcpy") == 0 &&
        first != poison)
      world_case_fail(w, "rank %d: the refused AllReduce ran", api_rank(w, l));
  }
  /* Matching calls go through, checked as usual. */
  int color[GPU_MAX_RANKS] = {0}, key[GPU_MAX_RANKS];
  for (int r = 0; r < w->nranks; r++) key[r] = r;
  api_interleave(w, w->comm, color, key);
out:
  buf_free(w, &a);
  buf_free(w, &b);
  world_case_end(w);
}

/* A one-rank communicator of this process on its first GPU (no other rank takes part). */
static int api_solo(struct gpu_world* w, ncclComm_t* c) {
  ncclUniqueId id;
  *c = NULL;
  return world_cuda(w, cudaSetDevice(w->dev[0]), "cudaSetDevice") ||
         world_nccl(w, ncclGetUniqueId(&id), NULL, "ncclGetUniqueId") ||
         world_nccl(w, ncclCommInitRank(c, 1, id, 0), NULL, "ncclCommInitRank (one rank)");
}

/* nccl_device.h's host team functions (its header is C++ only), with its struct's layout. */
struct api_team {
  int nRanks, rank, stride;
};
struct api_team ncclTeamWorld(ncclComm_t comm);
struct api_team ncclTeamRail(ncclComm_t comm);
int ncclTeamRankToWorld(ncclComm_t comm, struct api_team team, int rank);

struct api_other_thread {
  ncclComm_t comm;
  int64_t* buf;
  cudaStream_t stream;
  ncclResult_t res;
};

static void* api_other_thread_main(void* arg) {
  struct api_other_thread* t = arg;
  t->res = ncclAllReduce(t->buf, t->buf, 16, ncclInt64, ncclSum, t->comm, t->stream);
  return NULL;
}

/*
 * Teardown and groups, on one-rank communicators of each process: ncclCommAbort of a comm with
 * operations in this thread's open group (the group's end must not find it freed); destroy
 * refused and abort accepted for a comm whose init waits in this thread's open group; a group
 * whose second init is invalid fails at its end at once, running neither; another thread's
 * call on a comm in this thread's open group is refused.
 */
static void api_teardown_groups(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Abort/destroy of comms in open groups mode=%s", w->opts->mode);
  if (!world_case_fits(w, name, dlsym(RTLD_DEFAULT, "braidGetVersionString") != NULL,
                       "Braid's answers (this libnccl is not Braid)") ||
      !world_case_begin(w, name))
    return;
  ncclComm_t c = NULL, pending = NULL, half = NULL, bad = NULL;
  int64_t* buf = NULL;
  ncclUniqueId id;
  /* 0. The world team of the world's communicator, and a rail rank back to the world. */
  struct api_team world = ncclTeamWorld(w->comm[0]), rail = ncclTeamRail(w->comm[0]);
  if (world.nRanks != w->nranks || world.rank != api_rank(w, 0) || world.stride != 1 ||
      rail.nRanks < 1 || ncclTeamRankToWorld(w->comm[0], rail, rail.rank) != api_rank(w, 0))
    world_case_fail(w, "teams: world {%d, %d, %d}, rail {%d, %d, %d}", world.nRanks, world.rank,
                    world.stride, rail.nRanks, rail.rank, rail.stride);
  if (api_solo(w, &c) ||
      world_cuda(w, cudaMalloc((void**)&buf, 16 * sizeof(int64_t)), "cudaMalloc") ||
      world_cuda(w, cudaMemset(buf, 0, 16 * sizeof(int64_t)), "cudaMemset"))
    goto out;
  /* 1. Operations queued, then the comm aborted inside the group. */
  if (world_nccl(w, ncclGroupStart(), NULL, "ncclGroupStart") ||
      world_nccl(w, ncclAllReduce(buf, buf, 16, ncclInt64, ncclSum, c, w->stream[0]), c,
                 "ncclAllReduce (queued)") ||
      world_nccl(w, ncclCommAbort(c), NULL, "ncclCommAbort inside the group"))
    goto out;
  c = NULL;
  if (world_nccl(w, ncclGroupEnd(), NULL, "ncclGroupEnd after the abort")) goto out;
  /* 2. An init waiting in the open group: destroy refused (it would wait forever), abort drops it. */
  if (world_nccl(w, ncclGetUniqueId(&id), NULL, "ncclGetUniqueId") ||
      world_nccl(w, ncclGroupStart(), NULL, "ncclGroupStart") ||
      world_nccl(w, ncclCommInitRank(&pending, 1, id, 0), NULL, "ncclCommInitRank (deferred)"))
    goto out;
  ncclResult_t res = ncclCommDestroy(pending);
  if (res != ncclInvalidUsage || strstr(ncclGetLastError(NULL), "ncclGroupEnd") == NULL)
    world_case_fail(w, "destroying a comm whose init waits in the open group gave %s: %s",
                    ncclGetErrorString(res), ncclGetLastError(NULL));
  if (world_nccl(w, ncclCommAbort(pending), NULL, "ncclCommAbort of a pending init")) goto out;
  pending = NULL;
  if (world_nccl(w, ncclGroupEnd(), NULL, "ncclGroupEnd after dropping the init")) goto out;
  /* 3. A group with a valid and an invalid init: its end fails at once and runs neither. */
  if (world_nccl(w, ncclGetUniqueId(&id), NULL, "ncclGetUniqueId") ||
      world_nccl(w, ncclGroupStart(), NULL, "ncclGroupStart") ||
      world_nccl(w, ncclCommInitRank(&half, 2, id, 0), NULL, "ncclCommInitRank (rank 0 of 2)"))
    goto out;
  res = ncclCommInitRank(&bad, 2, id, 7);
  double t0 = world_now();
  ncclResult_t end = ncclGroupEnd();
  double end_s = world_now() - t0;
  ncclResult_t async = ncclSuccess;
  if (half) ncclCommGetAsyncError(half, &async);
  if (res != ncclInvalidArgument || end != ncclInvalidArgument || end_s > 5.0 || bad != NULL ||
      async == ncclSuccess || async == ncclInProgress)
    world_case_fail(w, "invalid init in a group: %s, group end %s after %.1f s, the valid one %s",
                    ncclGetErrorString(res), ncclGetErrorString(end), end_s,
                    ncclGetErrorString(async));
  if (half) world_nccl(w, ncclCommDestroy(half), NULL, "ncclCommDestroy of the never-run init");
  half = NULL;
  /* 4. Another thread's call on a comm in this thread's open group. */
  if (api_solo(w, &c) || world_nccl(w, ncclGroupStart(), NULL, "ncclGroupStart") ||
      world_nccl(w, ncclAllReduce(buf, buf, 16, ncclInt64, ncclSum, c, w->stream[0]), c,
                 "ncclAllReduce (queued)"))
    goto out;
  struct api_other_thread other = {.comm = c, .buf = buf, .stream = w->stream[0]};
  pthread_t th;
  if (pthread_create(&th, NULL, api_other_thread_main, &other) == 0) {
    pthread_join(th, NULL);
    if (other.res != ncclInvalidUsage)
      world_case_fail(w, "a call from another thread joined this thread's group: %s",
                      ncclGetErrorString(other.res));
  }
  if (world_nccl(w, ncclGroupEnd(), NULL, "ncclGroupEnd") ||
      world_cuda(w, cudaStreamSynchronize(w->stream[0]), "cudaStreamSynchronize"))
    goto out;
out:
  if (c) ncclCommDestroy(c);
  if (buf) cudaFree(buf);
  world_case_end(w);
}

/*
 * What the world communicator reports of itself: made by ncclCommInitAll over every GPU (threads)
 * or by ncclCommInitRank in each process (procs, hosts, sharegpu), each rank must see the world's
 * size, its own rank and the CUDA device it was made on. (Destroying it is checked where the world
 * ends: gpu_world.c fails the run on an error from ncclCommDestroy.)
 */
/* One AllReduce round over the world's comms; *before and *after: cudaGetDevice around it. */
struct api_dev_round {
  struct gpu_world* w;
  struct api_buf *send, *recv;
  const char* what;
  int set; /* the device to make current first, or -1 to leave the thread as it is */
  int before, after, rc;
};

static void* api_dev_round_main(void* arg) {
  struct api_dev_round* r = arg;
  struct gpu_world* w = r->w;
  r->before = r->after = -1;
  r->rc = -1;
  if (r->set >= 0 && world_cuda(w, cudaSetDevice(r->set), "cudaSetDevice")) return NULL;
  if (world_cuda(w, cudaGetDevice(&r->before), "cudaGetDevice before the group") ||
      api_allreduce(w, w->comm, r->send, r->recv, r->what) ||
      world_cuda(w, cudaGetDevice(&r->after), "cudaGetDevice after the group"))
    return NULL;
  if (r->after != r->before)
    world_case_fail(w, "%s: the current device was %d before the group and %d after it", r->what,
                    r->before, r->after);
  r->rc = r->after == r->before ? 0 : -1;
  return NULL;
}

static void api_current_device(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "Current device kept across a group end mode=%s", w->opts->mode);
  if (!world_case_begin(w, name)) return;
  struct api_buf a, b;
  int ndev = 0, all[GPU_MAX_RANKS];
  for (int r = 0; r < w->nranks; r++) all[r] = r;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  if (world_cuda(w, cudaGetDeviceCount(&ndev), "cudaGetDeviceCount") || buf_alloc(w, &a, API_N) ||
      buf_alloc(w, &b, API_N))
    goto out;
  /* Not the last comm's device (where the launches end): the first one's, or another GPU. */
  int other = w->nlocal > 1 ? w->dev[0] : (w->dev[0] + 1) % (ndev > 0 ? ndev : 1);
  for (int round = 0; round < 2; round++) {
    for (int l = 0; l < w->nlocal; l++)
      if (buf_put(w, &a, l, api_rank(w, l), round) != 0) goto out;
    struct api_dev_round r = {.w = w, .send = &a, .recv = &b, .set = round == 0 ? other : -1,
                              .what = round == 0 ? "AllReduce, the caller on another device"
                                                 : "AllReduce from a fresh thread"};
    if (round == 0) {
      api_dev_round_main(&r);
    } else {
      pthread_t t;
      if (pthread_create(&t, NULL, api_dev_round_main, &r) != 0) {
        world_case_fail(w, "cannot start a thread");
        goto out;
      }
      pthread_join(t, NULL);
    }
    if (r.rc != 0 || api_sync(w, w->comm)) goto out;
    int64_t* want = api_sum(API_N, all, w->nranks, round, 1);
    if (want == NULL) {
      world_case_fail(w, "out of host memory");
      goto out;
    }
    for (int l = 0; l < w->nlocal; l++) buf_expect(w, &b, l, want, r.what);
    free(want);
  }
out:
  buf_free(w, &a);
  buf_free(w, &b);
  world_case_end(w);
}

static void api_world_queries(struct gpu_world* w) {
  char name[128];
  snprintf(name, sizeof name, "World communicator: count, rank, device (%s) mode=%s",
           strcmp(w->opts->mode, "threads") == 0 ? "ncclCommInitAll" : "ncclCommInitRank",
           w->opts->mode);
  if (!world_case_begin(w, name)) return;
  for (int l = 0; l < w->nlocal; l++) {
    int count = -1, me = -1, dev = -1;
    if (world_nccl(w, ncclCommCount(w->comm[l], &count), w->comm[l], "ncclCommCount") ||
        world_nccl(w, ncclCommUserRank(w->comm[l], &me), w->comm[l], "ncclCommUserRank") ||
        world_nccl(w, ncclCommCuDevice(w->comm[l], &dev), w->comm[l], "ncclCommCuDevice"))
      break;
    if (count != w->nranks || me != api_rank(w, l) || dev != w->dev[l])
      world_case_fail(w,
                      "local rank %d: ncclCommCount %d, ncclCommUserRank %d, ncclCommCuDevice %d; "
                      "expected %d, %d, %d",
                      l, count, me, dev, w->nranks, api_rank(w, l), w->dev[l]);
  }
  world_case_end(w);
}

void suite_api(struct gpu_world* w) {
  api_world_queries(w);
  api_current_device(w);
  api_splits(w);
  api_split_share(w);
  api_split_share_abort(w);
  api_init_nonblocking(w);
  api_init_scalable(w, 2, 3);
  api_init_scalable(w, 4, 5);
  api_shrink(w);
  api_shrink_abort(w);
  api_revoke(w);
  api_graph(w);
  api_graph_a2a_in_place(w);
  api_graph_mixing(w);
  api_simulate(w);
  api_register(w);
  api_register_busy(w);
  api_check(w);
  api_teardown_groups(w);
}
