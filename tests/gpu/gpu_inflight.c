/*
 * Many calls in flight, and group semantics.
 *
 *   back to back   50 collectives on one communicator, no synchronization between them
 *   two comms      50 collectives alternating between two communicators over the same
 *                  GPUs, each on its own stream, no synchronization between them
 *   chain          AllReduce on stream 1, AllReduce of its result on stream 2, AllGather
 *                  of that on stream 1, one communicator, no events: correct only because
 *                  a communicator's kernels run in the order they were issued, whatever
 *                  the stream (NCCL and Braid both serialize them)
 *   two streams    one group with calls on two streams of one communicator; only the
 *                  second stream is waited for (a group blocks all its streams until done)
 *   mixed group    eight collectives of different types and operators in one group
 *   many in group  32 AllReduces in one group
 *   nested         groups inside a group, with send/receive among the collectives
 *
 * Every call of a batch gets its own buffers and inputs; all are checked
 * after one synchronization at the end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define INFLIGHT_OPS 50

/* ---- batches of collective calls --------------------------------------------------------------
 */

struct batch {
  int n, prepared;
  struct gpu_run* runs;
  int* second; /* per call: 1 to use the second communicator and stream */
};

/* Prepares every call of the batch; 0 on success. Each call's failures name it "[j] ...". */
static int batch_prepare(struct gpu_world* w, struct batch* b, const struct gpu_case* cases, int n,
                         size_t index0) {
  memset(b, 0, sizeof *b);
  b->runs = calloc((size_t)n, sizeof *b->runs);
  b->second = calloc((size_t)n, sizeof *b->second);
  if (b->runs == NULL || b->second == NULL) {
    world_case_fail(w, "out of host memory");
    return -1;
  }
  b->n = n;
  for (int j = 0; j < n; j++) {
    b->prepared = j + 1;
    if (run_prepare(w, &b->runs[j], &cases[j],
                    world_seed(w, SUITE_INFLIGHT, index0 + (size_t)j, 0)) != 0)
      return -1;
    snprintf(b->runs[j].label, sizeof b->runs[j].label, "[%d] %s: ", j, b->runs[j].name);
  }
  return 0;
}

static ncclComm_t batch_comm(const struct gpu_world* w, const struct batch* b, int j, int l) {
  return b->second[j] ? w->comm2[l] : w->comm[l];
}

static cudaStream_t batch_stream(const struct gpu_world* w, const struct batch* b, int j, int l) {
  return b->second[j] ? w->stream2[l] : w->stream[l];
}

static int batch_bind(struct gpu_world* w, struct batch* b) {
  for (int j = 0; j < b->n; j++)
    for (int l = 0; l < w->nlocal; l++)
      if (run_bind(w, &b->runs[j], l, batch_comm(w, b, j, l)) != 0) return -1;
  return 0;
}

/* Call j of every local rank (inside the caller's group, if any). */
static void batch_issue(struct gpu_world* w, struct batch* b, int j) {
  for (int l = 0; l < w->nlocal; l++)
    run_issue(w, &b->runs[j], l, batch_comm(w, b, j, l), batch_stream(w, b, j, l));
}

static void batch_check(struct gpu_world* w, struct batch* b) {
  for (int j = 0; j < b->n; j++) run_check(w, &b->runs[j]);
}

static void batch_release(struct gpu_world* w, struct batch* b) {
  for (int j = 0; j < b->prepared; j++) run_release(w, &b->runs[j]);
  free(b->runs);
  free(b->second);
  memset(b, 0, sizeof *b);
}

/* ---- back to back, two communicators ----------------------------------------------------------
 */

static struct gpu_case inflight_case(const struct gpu_world* w, int j) {
  static const struct gpu_case mix[] = {
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM},
      {.coll = COLL_ALLGATHER, .type = ncclInt8},
      {.coll = COLL_REDUCESCATTER, .type = ncclBfloat16, .op = GPU_OP_AVG},
      {.coll = COLL_BROADCAST, .type = ncclFloat64},
      {.coll = COLL_REDUCE, .type = ncclInt32, .op = GPU_OP_MAX},
      {.coll = COLL_ALLREDUCE, .type = ncclFloat16, .op = GPU_OP_PREMUL_DEV},
      {.coll = COLL_ALLTOALL, .type = ncclUint8},
      {.coll = COLL_ALLREDUCE, .type = ncclUint64, .op = GPU_OP_PROD},
      {.coll = COLL_GATHER, .type = ncclFloat32},
      {.coll = COLL_SCATTER, .type = ncclInt64},
      {.coll = COLL_ALLREDUCE, .type = ncclFloat8e4m3, .op = GPU_OP_PREMUL_HOST},
  };
  static const size_t counts[] = {1, 7, 4097, 65537, 262147};
  struct gpu_case c = mix[j % (int)ARRAY_LEN(mix)];
  c.count = counts[j % (int)ARRAY_LEN(counts)];
  c.inplace = (j / 3) % 2;
  c.root = coll_has_root(c.coll) ? j % w->nranks : -1;
  return c;
}

/* INFLIGHT_OPS calls, each its own group, no synchronization until the end. */
static void inflight_many(struct gpu_world* w, int two_comms, size_t index0) {
  char name[sizeof w->case_name];
  int n = w->opts->quick ? 10 : INFLIGHT_OPS;
  struct gpu_case cases[INFLIGHT_OPS];
  struct batch b = {0};
  snprintf(name, sizeof name, "Inflight %d collectives %s mode=%s", n,
           two_comms ? "alternating between two communicators and two streams"
                     : "back to back on one communicator",
           w->opts->mode);
  if (!world_case_begin(w, name)) return;
  for (int j = 0; j < n; j++) cases[j] = inflight_case(w, j);
  if ((!two_comms || world_comm2(w) == 0) && batch_prepare(w, &b, cases, n, index0) == 0) {
    for (int j = 0; j < n; j++) b.second[j] = two_comms && (j & 1);
    if (batch_bind(w, &b) == 0) {
      for (int j = 0; j < n; j++) {
        if (world_group_start(w) != 0) break;
        batch_issue(w, &b, j);
        if (world_group_end(w) != 0) break;
      }
      if (world_sync(w) == 0) batch_check(w, &b);
    }
  }
  batch_release(w, &b);
  world_case_end(w);
}

/* ---- groups -----------------------------------------------------------------------------------
 */

/* Every call in one group: for each local rank, all its calls. */
static void group_batch(struct gpu_world* w, const char* what, const struct gpu_case* cases, int n,
                        size_t index0) {
  char name[sizeof w->case_name];
  struct batch b = {0};
  snprintf(name, sizeof name, "Group %s mode=%s", what, w->opts->mode);
  if (!world_case_begin(w, name)) return;
  if (batch_prepare(w, &b, cases, n, index0) == 0 && batch_bind(w, &b) == 0 &&
      world_group_start(w) == 0) {
    for (int l = 0; l < w->nlocal; l++)
      for (int j = 0; j < n; j++) run_issue(w, &b.runs[j], l, w->comm[l], w->stream[l]);
    if (world_group_end(w) == 0 && world_sync(w) == 0) batch_check(w, &b);
  }
  batch_release(w, &b);
  world_case_end(w);
}

static void group_mixed(struct gpu_world* w, size_t index0) {
  int last = w->nranks - 1;
  const struct gpu_case cases[] = {
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM, .count = 4097, .root = -1},
      {.coll = COLL_ALLGATHER, .type = ncclInt8, .count = 7, .root = -1},
      {.coll = COLL_REDUCESCATTER,
       .type = ncclBfloat16,
       .op = GPU_OP_AVG,
       .count = 4097,
       .root = -1},
      {.coll = COLL_BROADCAST, .type = ncclFloat64, .count = 1048579, .root = last},
      {.coll = COLL_REDUCE, .type = ncclUint32, .op = GPU_OP_MAX, .count = 4097, .root = 0},
      {.coll = COLL_ALLTOALL, .type = ncclInt32, .count = 1000, .root = -1},
      {.coll = COLL_ALLREDUCE,
       .type = ncclFloat16,
       .op = GPU_OP_PREMUL_DEV,
       .count = 4097,
       .root = -1},
      {.coll = COLL_ALLREDUCE,
       .type = ncclFloat8e5m2,
       .op = GPU_OP_SUM,
       .count = 1048579,
       .root = -1,
       .inplace = 1},
  };
  group_batch(w, "of 8 collectives of different types and operators", cases, (int)ARRAY_LEN(cases),
              index0);
}

static void group_many(struct gpu_world* w, size_t index0) {
  struct gpu_case cases[32];
  for (int j = 0; j < 32; j++)
    cases[j] = (struct gpu_case){.coll = COLL_ALLREDUCE,
                                 .type = ncclFloat32,
                                 .op = GPU_OP_SUM,
                                 .count = (size_t)j * 997 + 1,
                                 .root = -1,
                                 .inplace = j & 1};
  group_batch(w, "of 32 AllReduce f32 sum", cases, 32, index0);
}

/*
 * Two streams, one group: NCCL blocks every stream of a group until the
 * group's work is done, so waiting for the second stream alone must be
 * enough to read the first call's result (the streams are non-blocking and
 * cudaMemcpy does not wait for them).
 */
static void group_two_streams(struct gpu_world* w, size_t index0) {
  const struct gpu_case cases[] = {
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM, .count = 1048579, .root = -1},
      {.coll = COLL_ALLGATHER, .type = ncclInt8, .count = 4097, .root = -1},
  };
  char name[sizeof w->case_name];
  struct batch b = {0};
  snprintf(name, sizeof name,
           "Group over two streams of one communicator, waiting for the second only mode=%s",
           w->opts->mode);
  if (!world_case_begin(w, name)) return;
  if (batch_prepare(w, &b, cases, 2, index0) == 0 && batch_bind(w, &b) == 0 &&
      world_group_start(w) == 0) {
    for (int l = 0; l < w->nlocal; l++) {
      run_issue(w, &b.runs[0], l, w->comm[l], w->stream[l]);
      run_issue(w, &b.runs[1], l, w->comm[l], w->stream2[l]);
    }
    int ok = world_group_end(w) == 0;
    for (int l = 0; ok && l < w->nlocal; l++)
      ok = world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") == 0 &&
           world_cuda(w, cudaStreamSynchronize(w->stream2[l]), "cudaStreamSynchronize") == 0;
    if (ok) batch_check(w, &b);
    world_sync(w);
  }
  batch_release(w, &b);
  world_case_end(w);
}

/* Groups in a group: AllReduce; (AllGather, (ReduceScatter)); a send/receive ring. */
static void group_nested(struct gpu_world* w, size_t index0) {
  const struct gpu_case cases[] = {
      {.coll = COLL_ALLREDUCE, .type = ncclFloat32, .op = GPU_OP_SUM, .count = 4097, .root = -1},
      {.coll = COLL_ALLGATHER, .type = ncclFloat16, .count = 4097, .root = -1},
      {.coll = COLL_REDUCESCATTER, .type = ncclInt64, .op = GPU_OP_MIN, .count = 4097, .root = -1},
  };
  char name[sizeof w->case_name];
  struct batch b = {0};
  struct p2p_run* ring = NULL;
  snprintf(name, sizeof name,
           "Group nested: AllReduce, (AllGather, (ReduceScatter)), send/recv ring mode=%s",
           w->opts->mode);
  if (!world_case_begin(w, name)) return;
  if (batch_prepare(w, &b, cases, 3, index0) == 0 && batch_bind(w, &b) == 0 &&
      (ring = p2p_ring_prepare(w, ncclFloat32, 4097,
                               world_seed(w, SUITE_INFLIGHT, index0 + 3, 0))) != NULL) {
    /* Every start and end is called whatever happens, so the nesting stays balanced. */
    world_group_start(w);
    world_group_start(w);
    batch_issue(w, &b, 0);
    world_group_end(w);
    world_group_start(w);
    batch_issue(w, &b, 1);
    world_group_start(w);
    batch_issue(w, &b, 2);
    world_group_end(w);
    world_group_end(w);
    world_group_start(w);
    for (int l = 0; l < w->nlocal; l++) p2p_issue(w, ring, l, w->comm[l], w->stream[l]);
    world_group_end(w);
    world_group_end(w); /* the outermost: everything starts here */
    if (!w->case_failed && world_sync(w) == 0) {
      batch_check(w, &b);
      p2p_check(w, ring);
    }
  }
  p2p_release(w, ring);
  batch_release(w, &b);
  world_case_end(w);
}

/* ---- a dependent chain across streams -----------------------------------------------------------
 */

struct chain {
  size_t count;
  int32_t* in[GPU_MAX_RANKS]; /* every rank's input X */
  int32_t* buf[GPU_MAX_RANKS]
              [4]; /* per local rank: X, A = AllReduce(X), B = AllReduce(A), C = AllGather(B) */
};

/* Compares `blocks` copies of mult * sum_r X_r with what came back. */
static void chain_compare(struct gpu_world* w, const struct chain* ch, const char* what, int rank,
                          const int32_t* got, int blocks, int32_t mult) {
  size_t bad = 0, first = 0;
  int32_t first_want = 0;
  for (size_t j = 0; j < ch->count * (size_t)blocks; j++) {
    int32_t want = 0;
    for (int r = 0; r < w->nranks; r++) want += ch->in[r][j % ch->count];
    want *= mult;
    if (got[j] == want) continue;
    if (bad++ == 0) {
      first = j;
      first_want = want;
    }
  }
  if (bad)
    world_case_fail(
        w, "rank %d %s: %zu of %zu elements wrong; first: element %zu got %d, expected %d", rank,
        what, bad, ch->count * (size_t)blocks, first, (int)got[first], (int)first_want);
}

static int chain_prepare(struct gpu_world* w, struct chain* ch, uint64_t seed) {
  size_t bytes = ch->count * sizeof(int32_t);
  for (int r = 0; r < w->nranks; r++) {
    ch->in[r] = malloc(bytes + 1);
    if (ch->in[r] == NULL) {
      world_case_fail(w, "out of host memory");
      return -1;
    }
    /* Values small enough for nranks * sum to fit: drawn as if for nranks^2 ranks. */
    ref_fill(ncclInt32, GPU_OP_SUM, w->nranks * w->nranks,
             seed + (uint64_t)r * 0x9e3779b97f4a7c15ull, ch->in[r], ch->count);
  }
  for (int l = 0; l < w->nlocal; l++) {
    if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0) return -1;
    for (int i = 0; i < 4; i++) {
      size_t size = i == 3 ? bytes * (size_t)w->nranks : bytes;
      if (world_cuda(w, cudaMalloc((void**)&ch->buf[l][i], size), "cudaMalloc") != 0 ||
          world_cuda(w, cudaMemset(ch->buf[l][i], GPU_POISON, size), "cudaMemset") != 0)
        return -1;
    }
    if (world_cuda(w,
                   cudaMemcpy(ch->buf[l][0], ch->in[w->rank0 + l], bytes, cudaMemcpyHostToDevice),
                   "cudaMemcpy") != 0 ||
        world_cuda(w, cudaDeviceSynchronize(), "cudaDeviceSynchronize") != 0)
      return -1;
  }
  return 0;
}

static void chain_issue(struct gpu_world* w, struct chain* ch) {
  world_group_start(w);
  for (int l = 0; l < w->nlocal; l++)
    world_nccl(w,
               ncclAllReduce(ch->buf[l][0], ch->buf[l][1], ch->count, ncclInt32, ncclSum,
                             w->comm[l], w->stream[l]),
               w->comm[l], "ncclAllReduce X->A on stream 1");
  world_group_end(w);
  world_group_start(w);
  for (int l = 0; l < w->nlocal; l++)
    world_nccl(w,
               ncclAllReduce(ch->buf[l][1], ch->buf[l][2], ch->count, ncclInt32, ncclSum,
                             w->comm[l], w->stream2[l]),
               w->comm[l], "ncclAllReduce A->B on stream 2");
  world_group_end(w);
  world_group_start(w);
  for (int l = 0; l < w->nlocal; l++)
    world_nccl(
        w,
        ncclAllGather(ch->buf[l][2], ch->buf[l][3], ch->count, ncclInt32, w->comm[l], w->stream[l]),
        w->comm[l], "ncclAllGather B->C on stream 1");
  world_group_end(w);
}

static void chain_check(struct gpu_world* w, struct chain* ch) {
  int32_t* host = malloc(ch->count * sizeof(int32_t) * (size_t)w->nranks + 1);
  static const char* const what[4] = {"X", "A = AllReduce(X)", "B = AllReduce(A)",
                                      "C = AllGather(B)"};
  if (host == NULL) return;
  for (int l = 0; l < w->nlocal; l++) {
    for (int i = 1; i < 4; i++) {
      int blocks = i == 3 ? w->nranks : 1;
      if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0 ||
          world_cuda(w,
                     cudaMemcpy(host, ch->buf[l][i], ch->count * sizeof(int32_t) * (size_t)blocks,
                                cudaMemcpyDeviceToHost),
                     "cudaMemcpy") != 0)
        break;
      chain_compare(w, ch, what[i], w->rank0 + l, host, blocks, i == 1 ? 1 : w->nranks);
    }
  }
  free(host);
}

static void chain_release(struct gpu_world* w, struct chain* ch) {
  for (int l = 0; l < w->nlocal; l++) {
    if (cudaSetDevice(w->dev[l]) != cudaSuccess) continue;
    for (int i = 0; i < 4; i++) cudaFree(ch->buf[l][i]);
  }
  for (int r = 0; r < GPU_MAX_RANKS; r++) free(ch->in[r]);
}

/* X -> A on stream 1, A -> B on stream 2, B -> C on stream 1, no events: see the top. */
static void inflight_chain(struct gpu_world* w, size_t index0) {
  struct chain ch = {.count = w->opts->quick ? 4097 : ((size_t)1 << 22) + 1};
  char name[sizeof w->case_name];
  snprintf(
      name, sizeof name,
      "Inflight chain on one communicator across two streams (AllReduce, AllReduce, AllGather) i32 "
      "count=%zu mode=%s",
      ch.count, w->opts->mode);
  if (!world_case_begin(w, name)) return;
  if (chain_prepare(w, &ch, world_seed(w, SUITE_INFLIGHT, index0, 0)) == 0) {
    chain_issue(w, &ch);
    if (!w->case_failed && world_sync(w) == 0) chain_check(w, &ch);
  }
  chain_release(w, &ch);
  world_case_end(w);
}

void suite_inflight(struct gpu_world* w) {
  inflight_many(w, 0, 0);
  inflight_many(w, 1, 100);
  group_mixed(w, 200);
  group_many(w, 300);
  group_two_streams(w, 400);
  group_nested(w, 500);
  inflight_chain(w, 600);
}
