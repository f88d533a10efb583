/*
 * One collective call, from buffers to verdict: the layout of send and
 * receive buffers (in place as NCCL defines it, out of place, unaligned),
 * inputs and poison, the NCCL call itself, and the comparison of every
 * rank's receive buffer with the host reference.
 *
 * Besides the result, a check also requires that the poisoned bytes around a
 * receive buffer (GPU_GUARD after it, the unaligned offset before it) stay
 * poisoned, and that an out-of-place send buffer comes back unchanged.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"

#define CASE_MAX_REPORTS 5 /* mismatching elements printed per rank */

static const char* const coll_names[COLL_COUNT] = {"AllReduce", "AllGather", "ReduceScatter",
                                                   "Broadcast", "Reduce",    "AlltoAll",
                                                   "Gather",    "Scatter"};

const char* coll_name(gpu_coll_t c) { return coll_names[c]; }

int coll_is_reduction(gpu_coll_t c) {
  return c == COLL_ALLREDUCE || c == COLL_REDUCESCATTER || c == COLL_REDUCE;
}

int coll_has_root(gpu_coll_t c) {
  return c == COLL_BROADCAST || c == COLL_REDUCE || c == COLL_GATHER || c == COLL_SCATTER;
}

void case_format_name(const struct gpu_world* w, const struct gpu_case* c, char* out, size_t len) {
  char root[16] = "-";
  if (c->root >= 0) snprintf(root, sizeof root, "%d", c->root);
  snprintf(out, len, "%s %s%s%s count=%zu %s root=%s%s mode=%s", coll_names[c->coll],
           ref_type(c->type)->name, c->op == GPU_OP_NONE ? "" : " ",
           c->op == GPU_OP_NONE ? "" : ref_op_name(c->op), c->count,
           c->inplace ? "inplace" : "outofplace", root, c->unaligned ? " unaligned" : "",
           w->opts->mode);
}

/* ---- layout ---------------------------------------------------------------------------------- */

/* Elements each rank sends and receives for NCCL's `count` (the receive side of the root for
 * Gather, the send side of the root for Scatter). */
static void coll_sizes(const struct gpu_case* c, int n, size_t* send, size_t* recv) {
  size_t all = c->count * (size_t)n;
  *send = *recv = c->count;
  switch (c->coll) {
    case COLL_ALLGATHER:
    case COLL_GATHER:
      *recv = all;
      break;
    case COLL_REDUCESCATTER:
    case COLL_SCATTER:
      *send = all;
      break;
    case COLL_ALLTOALL:
      *send = *recv = all;
      break;
    default:
      break;
  }
}

/*
 * In place, send and receive buffers share one allocation; these are their
 * element offsets in it (NCCL's definitions): AllGather and Gather send from
 * recvbuff + rank * count, ReduceScatter and Scatter receive into sendbuff +
 * rank * count, the others use one pointer for both.
 */
static void coll_inplace_offsets(const struct gpu_case* c, int rank, size_t* soff, size_t* roff) {
  *soff = *roff = 0;
  if (c->coll == COLL_ALLGATHER || c->coll == COLL_GATHER) *soff = (size_t)rank * c->count;
  if (c->coll == COLL_REDUCESCATTER || c->coll == COLL_SCATTER) *roff = (size_t)rank * c->count;
}

/* Whether `rank`'s send buffer carries data (only the root's does for Broadcast and Scatter). */
static int coll_rank_sends(const struct gpu_case* c, int rank) {
  return (c->coll != COLL_BROADCAST && c->coll != COLL_SCATTER) || rank == c->root;
}

/* Whether `rank`'s receive buffer is defined afterwards (only the root's for Reduce and Gather). */
static int coll_rank_receives(const struct gpu_case* c, int rank) {
  return (c->coll != COLL_REDUCE && c->coll != COLL_GATHER) || rank == c->root;
}

/* Device buffers of local rank l: allocate, poison, upload its input. */
static int run_alloc_rank(struct gpu_world* w, struct gpu_run* run, int l) {
  const struct gpu_case* c = &run->c;
  struct gpu_rank_bufs* b = &run->b[l];
  int rank = w->rank0 + l;
  size_t size = ref_type(c->type)->size, send_bytes = run->send_elems * size;
  if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0) return -1;
  if (c->inplace) {
    size_t elems = run->send_elems > run->recv_elems ? run->send_elems : run->recv_elems;
    size_t base = (c->unaligned ? 1 : 0) * size, soff, roff;
    coll_inplace_offsets(c, rank, &soff, &roff);
    b->recv_alloc_bytes = base + elems * size + GPU_GUARD;
    b->used_begin = base;
    b->used_end = base + elems * size;
    if (gpu_buf_alloc(w, &b->recv_alloc, b->recv_alloc_bytes) != 0) return -1;
    b->send = b->recv_alloc + base + soff * size;
    b->recv = b->recv_alloc + base + roff * size;
  } else {
    size_t soff = (c->unaligned ? 3 : 0) * size, roff = (c->unaligned ? 1 : 0) * size;
    b->send_alloc_bytes = soff + send_bytes + GPU_GUARD;
    b->recv_alloc_bytes = roff + run->recv_elems * size + GPU_GUARD;
    b->used_begin = roff;
    b->used_end = roff + run->recv_elems * size;
    if (gpu_buf_alloc(w, &b->send_alloc, b->send_alloc_bytes) != 0 ||
        gpu_buf_alloc(w, &b->recv_alloc, b->recv_alloc_bytes) != 0 ||
        world_cuda(w, cudaMemset(b->send_alloc, GPU_POISON, b->send_alloc_bytes), "cudaMemset") !=
            0)
      return -1;
    b->send = b->send_alloc + soff;
    b->recv = b->recv_alloc + roff;
  }
  if (world_cuda(w, cudaMemset(b->recv_alloc, GPU_POISON, b->recv_alloc_bytes), "cudaMemset") != 0)
    return -1;
  if (coll_rank_sends(c, rank) &&
      world_cuda(w, cudaMemcpy(b->send, run->in[rank], send_bytes, cudaMemcpyHostToDevice),
                 "cudaMemcpy") != 0)
    return -1;
  if (c->op == GPU_OP_PREMUL_DEV) {
    unsigned char scalar[8];
    ref_premul_scalar(c->type, c->op, rank, scalar);
    if (world_cuda(w, cudaMalloc(&b->dev_scalar, size), "cudaMalloc") != 0 ||
        world_cuda(w, cudaMemcpy(b->dev_scalar, scalar, size, cudaMemcpyHostToDevice),
                   "cudaMemcpy") != 0)
      return -1;
  }
  /* The NCCL call runs on a non-blocking stream: the uploads must be done before it starts. */
  return world_cuda(w, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

int run_prepare(struct gpu_world* w, struct gpu_run* run, const struct gpu_case* c, uint64_t seed) {
  memset(run, 0, sizeof *run);
  run->c = *c;
  case_format_name(w, c, run->name, sizeof run->name);
  coll_sizes(c, w->nranks, &run->send_elems, &run->recv_elems);
  size_t size = ref_type(c->type)->size;
  for (int r = 0; r < w->nranks; r++) {
    run->in[r] = malloc(run->send_elems * size + 1);
    if (run->in[r] == NULL) {
      world_case_fail(w, "out of host memory for %zu elements", run->send_elems);
      return -1;
    }
    ref_fill(c->type, c->op, w->nranks, seed + 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1),
             run->in[r], run->send_elems);
  }
  for (int l = 0; l < w->nlocal; l++)
    if (run_alloc_rank(w, run, l) != 0) return -1;
  return 0;
}

/* ---- the call -------------------------------------------------------------------------------- */

int run_bind(struct gpu_world* w, struct gpu_run* run, int l, ncclComm_t comm) {
  static const ncclRedOp_t builtin[GPU_OP_COUNT] = {[GPU_OP_SUM] = ncclSum,
                                                    [GPU_OP_PROD] = ncclProd,
                                                    [GPU_OP_MAX] = ncclMax,
                                                    [GPU_OP_MIN] = ncclMin,
                                                    [GPU_OP_AVG] = ncclAvg};
  const struct gpu_case* c = &run->c;
  struct gpu_rank_bufs* b = &run->b[l];
  unsigned char host_scalar[8];
  ncclResult_t res;
  if (gpu_register_on() && b->reg_comm == NULL) {
    b->reg_comm = comm;
    if (gpu_buf_register(w, comm, b->send_alloc, b->send_alloc_bytes, &b->send_reg) != 0 ||
        gpu_buf_register(w, comm, b->recv_alloc, b->recv_alloc_bytes, &b->recv_reg) != 0)
      return -1;
  }
  if (!ref_op_is_premul(c->op)) {
    b->op = builtin[c->op];
    return 0;
  }
  if (c->op != GPU_OP_PREMUL_DEV) {
    /* Read before the call returns: a stack variable is enough. */
    ref_premul_scalar(c->type, c->op, w->rank0 + l, host_scalar);
    res = ncclRedOpCreatePreMulSum(&b->op, host_scalar, c->type, ncclScalarHostImmediate, comm);
  } else {
    res = ncclRedOpCreatePreMulSum(&b->op, b->dev_scalar, c->type, ncclScalarDevice, comm);
  }
  if (world_nccl(w, res, comm, "ncclRedOpCreatePreMulSum") != 0) return -1;
  b->op_comm = comm;
  return 0;
}

int run_issue(struct gpu_world* w, struct gpu_run* run, int l, ncclComm_t comm,
              cudaStream_t stream) {
  const struct gpu_case* c = &run->c;
  struct gpu_rank_bufs* b = &run->b[l];
  size_t n = c->count;
  ncclDataType_t t = c->type;
  ncclResult_t res = ncclSuccess;
  switch (c->coll) {
    case COLL_ALLREDUCE:
      res = ncclAllReduce(b->send, b->recv, n, t, b->op, comm, stream);
      break;
    case COLL_ALLGATHER:
      res = ncclAllGather(b->send, b->recv, n, t, comm, stream);
      break;
    case COLL_REDUCESCATTER:
      res = ncclReduceScatter(b->send, b->recv, n, t, b->op, comm, stream);
      break;
    case COLL_BROADCAST:
      res = c->inplace ? ncclBcast(b->recv, n, t, c->root, comm, stream)
                       : ncclBroadcast(b->send, b->recv, n, t, c->root, comm, stream);
      break;
    case COLL_REDUCE:
      res = ncclReduce(b->send, b->recv, n, t, b->op, c->root, comm, stream);
      break;
    case COLL_ALLTOALL:
      res = ncclAlltoAll(b->send, b->recv, n, t, comm, stream);
      break;
    case COLL_GATHER:
      res = ncclGather(b->send, b->recv, n, t, c->root, comm, stream);
      break;
    case COLL_SCATTER:
      res = ncclScatter(b->send, b->recv, n, t, c->root, comm, stream);
      break;
    default:
      break;
  }
  char what[256];
  snprintf(what, sizeof what, "%snccl%s on rank %d", run->label, coll_names[c->coll], w->rank0 + l);
  if (world_nccl(w, res, comm, what) != 0) return -1;
  b->issued = 1;
  return 0;
}

/* ---- checks ---------------------------------------------------------------------------------- */

/* Compares receive element j of `rank` with what the collective defines it to be. */
static int run_check_element(const struct gpu_run* run, const struct ref_ctx* ref, int rank,
                             const void* got, size_t j, char* why, size_t why_len) {
  const struct gpu_case* c = &run->c;
  const void* const* in = (const void* const*)run->in;
  size_t n = c->count, block = n ? j / n : 0, at = n ? j % n : 0;
  switch (c->coll) {
    case COLL_ALLREDUCE:
    case COLL_REDUCE:
      return ref_check_reduced(ref, in, j, got, j, why, why_len);
    case COLL_REDUCESCATTER:
      return ref_check_reduced(ref, in, (size_t)rank * n + j, got, j, why, why_len);
    case COLL_ALLGATHER:
    case COLL_GATHER:
      return ref_check_copied(c->type, in[block], at, got, j, why, why_len);
    case COLL_BROADCAST:
      return ref_check_copied(c->type, in[c->root], j, got, j, why, why_len);
    case COLL_ALLTOALL:
      return ref_check_copied(c->type, in[block], (size_t)rank * n + at, got, j, why, why_len);
    case COLL_SCATTER:
      return ref_check_copied(c->type, in[c->root], (size_t)rank * n + j, got, j, why, why_len);
    default:
      return 0;
  }
}

static void run_check_result(struct gpu_world* w, const struct gpu_run* run, int rank,
                             const char* host_recv) {
  struct ref_ctx ref;
  size_t bad = 0;
  char why[256];
  ref_ctx_init(&ref, run->c.type, run->c.op, w->nranks);
  for (size_t j = 0; j < run->recv_elems; j++) {
    int report = bad < CASE_MAX_REPORTS;
    if (run_check_element(run, &ref, rank, host_recv, j, report ? why : NULL, sizeof why)) continue;
    if (report) world_case_fail(w, "%srank %d element %zu: %s", run->label, rank, j, why);
    bad++;
  }
  if (bad > CASE_MAX_REPORTS)
    world_case_fail(w, "%srank %d: %zu of %zu elements wrong", run->label, rank, bad,
                    run->recv_elems);
}

/* Bytes outside [begin, end) of the allocation must still hold the poison. */
static void run_check_guards(struct gpu_world* w, const struct gpu_run* run, int rank,
                             const unsigned char* alloc, size_t bytes, size_t begin, size_t end) {
  for (size_t i = 0; i < bytes; i++) {
    if ((i >= begin && i < end) || alloc[i] == GPU_POISON) continue;
    world_case_fail(w,
                    "%srank %d: byte %zu of the receive allocation was written (0x%02x), outside "
                    "the buffer [%zu, %zu)",
                    run->label, rank, i, alloc[i], begin, end);
    return;
  }
}

static int run_check_rank(struct gpu_world* w, struct gpu_run* run, int l) {
  const struct gpu_case* c = &run->c;
  struct gpu_rank_bufs* b = &run->b[l];
  int rank = w->rank0 + l;
  size_t send_bytes = run->send_elems * ref_type(c->type)->size;
  unsigned char* host = malloc(b->recv_alloc_bytes > send_bytes ? b->recv_alloc_bytes : send_bytes);
  if (host == NULL) {
    world_case_fail(w, "out of host memory");
    return -1;
  }
  if (world_cuda(w, cudaSetDevice(w->dev[l]), "cudaSetDevice") != 0) goto fail;
  if (coll_rank_receives(c, rank)) {
    if (world_cuda(w, cudaMemcpy(host, b->recv_alloc, b->recv_alloc_bytes, cudaMemcpyDeviceToHost),
                   "cudaMemcpy") != 0)
      goto fail;
    run_check_result(w, run, rank, (const char*)host + (b->recv - b->recv_alloc));
    run_check_guards(w, run, rank, host, b->recv_alloc_bytes, b->used_begin, b->used_end);
  }
  if (!c->inplace && coll_rank_sends(c, rank)) {
    if (world_cuda(w, cudaMemcpy(host, b->send, send_bytes, cudaMemcpyDeviceToHost),
                   "cudaMemcpy") != 0)
      goto fail;
    if (memcmp(host, run->in[rank], send_bytes) != 0)
      world_case_fail(w, "%srank %d: the send buffer was modified", run->label, rank);
  }
  free(host);
  return 0;
fail:
  free(host);
  return -1;
}

int run_check(struct gpu_world* w, struct gpu_run* run) {
  int failed_before = w->case_failed;
  w->case_failed = 0;
  for (int l = 0; l < w->nlocal; l++)
    if (run->b[l].issued) run_check_rank(w, run, l);
  int failed = w->case_failed;
  w->case_failed |= failed_before;
  return failed ? -1 : 0;
}

void run_release(struct gpu_world* w, struct gpu_run* run) {
  for (int l = 0; l < w->nlocal; l++) {
    struct gpu_rank_bufs* b = &run->b[l];
    if (b->op_comm)
      world_nccl(w, ncclRedOpDestroy(b->op, b->op_comm), b->op_comm, "ncclRedOpDestroy");
    gpu_buf_deregister(w, b->reg_comm, &b->send_reg);
    gpu_buf_deregister(w, b->reg_comm, &b->recv_reg);
    if (cudaSetDevice(w->dev[l]) == cudaSuccess) {
      gpu_buf_free(b->send_alloc);
      gpu_buf_free(b->recv_alloc);
      cudaFree(b->dev_scalar);
    }
    memset(b, 0, sizeof *b);
  }
  for (int r = 0; r < GPU_MAX_RANKS; r++) {
    free(run->in[r]);
    run->in[r] = NULL;
  }
}

/* Prints "hash <case> rank <r> <fnv-1a of the bytes the call wrote>" for each local rank. */
static void run_print_hashes(struct gpu_world* w, struct gpu_run* run) {
  for (int l = 0; l < w->nlocal; l++) {
    const struct gpu_rank_bufs* b = &run->b[l];
    size_t n = b->used_end - b->used_begin;
    unsigned char* host = malloc(n ? n : 1);
    uint64_t h = 0xcbf29ce484222325ull;
    if (host == NULL ||
        world_cuda(w, cudaMemcpy(host, b->recv_alloc + b->used_begin, n, cudaMemcpyDeviceToHost),
                   "cudaMemcpy") != 0) {
      free(host);
      return;
    }
    for (size_t i = 0; i < n; i++) h = (h ^ host[i]) * 0x100000001b3ull;
    printf("hash %s rank %d %016llx\n", run->name, w->rank0 + l, (unsigned long long)h);
    fflush(stdout);
    free(host);
  }
}

static void run_case_do(struct gpu_world* w, const struct gpu_case* c, unsigned suite,
                        size_t index, int hashes) {
  char name[sizeof w->case_name];
  struct gpu_run run;
  case_format_name(w, c, name, sizeof name);
  if (!world_case_begin(w, name)) return;
  int ok = run_prepare(w, &run, c, world_seed(w, suite, index, 0)) == 0;
  for (int l = 0; ok && l < w->nlocal; l++) ok = run_bind(w, &run, l, w->comm[l]) == 0;
  if (ok && world_group_start(w) == 0) {
    for (int l = 0; l < w->nlocal; l++) run_issue(w, &run, l, w->comm[l], w->stream[l]);
    ok = world_group_end(w) == 0;
    if (ok && world_sync(w) == 0 && run_check(w, &run) == 0 && hashes) run_print_hashes(w, &run);
  }
  run_release(w, &run);
  world_case_end(w);
}

void run_case(struct gpu_world* w, const struct gpu_case* c, unsigned suite, size_t index) {
  run_case_do(w, c, suite, index, 0);
}

void run_case_hashed(struct gpu_world* w, const struct gpu_case* c, unsigned suite, size_t index) {
  run_case_do(w, c, suite, index, 1);
}
