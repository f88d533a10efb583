/*
 * The measurement, as nccl-tests defines it, run by every thread on its
 * ranks: warm up at every size from the first, doubling (as nccl-tests since
 * its warm-up default became 1); then for each size, for
 * out of place and in place: one untimed call, a barrier, -n iterations of
 * -m grouped calls timed with the host clock from first enqueue to last
 * completion (or captured into a CUDA graph and replayed -G times), the time
 * combined across ranks by -a, and -c checked calls on freshly poisoned
 * outputs and freshly filled inputs.
 *
 * Each call shifts its buffers by one size within the max-size allocation,
 * as nccl-tests does, so back-to-back iterations do not reuse cache lines.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"
#include "driver.h"

/* verify.h spells NCCL's codes out so it needs no NCCL header; hold it to them. */
_Static_assert((int)PERF_T_E5M2 == (int)ncclFloat8e5m2 && (int)PERF_T_COUNT == (int)ncclNumTypes &&
                   (int)PERF_T_HALF == (int)ncclFloat16 && (int)PERF_T_BF16 == (int)ncclBfloat16,
               "verify.h type codes must be NCCL's");
_Static_assert((int)PERF_O_AVG == (int)ncclAvg && (int)PERF_O_MULSUM == PERF_OP_MULSUM,
               "verify.h op codes must be NCCL's");

_Static_assert(PERF_SEG_POISON == -2, "verify.h's perf_element_wrong spells PERF_SEG_POISON as -2");

/* What one series measures; counts change with the size. */
typedef struct perf_series {
  int type;
  int op;      /* ncclRedOp_t or PERF_OP_MULSUM */
  int root;    /* -1 for unrooted collectives */
  size_t type_size;
  perf_counts_t counts;
} perf_series_t;

static double perf_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static perf_value_desc_t perf_desc(const perf_thread_t* t, const perf_series_t* s, uint64_t seed) {
  perf_value_desc_t d = {s->type, s->op, t->job->nranks, seed};
  return d;
}

/* Buffers of one call of rank r: shifted by iteration, in place inside recv. */
static void perf_call_buffers(const perf_rank_t* r, const perf_series_t* s, int in_place,
                              size_t shift, void** send, void** recv) {
  char* sb = (char*)r->send + shift;
  char* rb = (char*)r->recv + shift;
  size_t rank = (size_t)r->rank;
  *send = in_place ? rb + s->counts.send_inplace_offset * rank * s->type_size : sb;
  *recv = in_place ? rb + s->counts.recv_inplace_offset * rank * s->type_size : rb;
}

static void perf_abort_comms(perf_thread_t* t) {
  for (int g = 0; g < t->job->args->ngpus; g++) {
    if (t->ranks[g].comm) ncclCommAbort(t->ranks[g].comm);
    t->ranks[g].comm = NULL;
  }
}

/* One look at rank r: 1 when its stream is idle, 0 while busy, -1 on a CUDA
   error or an asynchronous library error. */
static int perf_poll_rank(perf_rank_t* r) {
  cudaError_t e = cudaStreamQuery(r->stream);
  if (e == cudaSuccess) return 1;
  if (e != cudaErrorNotReady) return PERF_CUDA(r, e);
  ncclResult_t async = ncclSuccess;
  if (PERF_NCCL(r, ncclCommGetAsyncError(r->comm, &async))) return -1;
  if (async != ncclSuccess && async != ncclInProgress)
    return perf_nccl_failed(async, "asynchronous error (ncclCommGetAsyncError)", __FILE__,
                            __LINE__, r);
  return 0;
}

/* Waits for every stream of this thread, watching for the library's
   asynchronous errors and -T, as nccl-tests' testStreamSynchronize. On a
   failure it aborts this thread's communicators so no kernel spins on. */
static int perf_complete(perf_thread_t* t) {
  const perf_args_t* a = t->job->args;
  unsigned char done[1024] = {0};
  int remaining = a->ngpus;
  double start = perf_now();
  while (remaining > 0) {
    int progressed = 0;
    for (int g = 0; g < a->ngpus; g++) {
      if (done[g]) continue;
      int state = perf_poll_rank(&t->ranks[g]);
      if (state < 0) goto fail;
      if (state > 0) {
        done[g] = 1;
        remaining--;
        progressed = 1;
      }
    }
    if (remaining > 0 && a->timeout_s > 0 && perf_now() - start > a->timeout_s) {
      fprintf(stderr, "perf: rank %d on %s: the operation did not complete within %d s (-T); "
              "aborting this thread's communicators\n", t->ranks[0].rank, t->job->host, a->timeout_s);
      goto fail;
    }
    if (!progressed) sched_yield();
  }
  return 0;
fail:
  perf_abort_comms(t);
  return -1;
}

/* mulsum: each rank's own scalar, in the element type, read at creation. */
static int perf_premul_create(const perf_rank_t* r, const perf_series_t* s, ncclRedOp_t* op) {
  unsigned char scalar[8] = {0};
  uint64_t bits = perf_type_is_float(s->type)
                      ? perf_float_to_bits(s->type, perf_premul_float(r->rank))
                      : (uint64_t)perf_premul_int(r->rank);
  perf_store_bits(s->type, scalar, 0, bits);
  return PERF_NCCL(r, ncclRedOpCreatePreMulSum(op, scalar, (ncclDataType_t)s->type,
                                                ncclScalarHostImmediate, r->comm));
}

/* Enqueues one operation on every rank of this thread (a group when several). */
static int perf_start_coll(perf_thread_t* t, const perf_series_t* s, int in_place, int iter) {
  perf_job_t* job = t->job;
  const perf_args_t* a = job->args;
  const perf_counts_t* c = &s->counts;
  size_t total = (c->send_count > c->recv_count ? c->send_count : c->recv_count) * s->type_size;
  size_t steps = total ? job->max_bytes / total : 1;
  size_t shift = total * ((size_t)iter % (steps ? steps : 1));
  if (a->ngpus > 1 && PERF_NCCL(NULL, ncclGroupStart())) return -1;
  for (int g = 0; g < a->ngpus; g++) {
    perf_rank_t* r = &t->ranks[g];
    void *send, *recv;
    perf_call_buffers(r, s, in_place, shift, &send, &recv);
    perf_coll_call_t call = {send, recv, c->param_count, (ncclDataType_t)s->type,
                             (ncclRedOp_t)s->op, s->root, r->rank, job->nranks, r->comm, r->stream};
    if (s->op == PERF_OP_MULSUM && perf_premul_create(r, s, &call.op)) return -1;
    ncclResult_t res = job->coll->run(&call);
    if (res != ncclSuccess) {
      char what[160];
      snprintf(what, sizeof(what), "%s (count %zu, %s, root %d, %s)", job->coll->name,
               c->param_count, perf_type_name(s->type), s->root, in_place ? "in place" : "out of place");
      return perf_nccl_failed(res, what, __FILE__, __LINE__, r);
    }
    if (s->op == PERF_OP_MULSUM && PERF_NCCL(r, ncclRedOpDestroy(call.op, r->comm))) return -1;
  }
  if (a->ngpus > 1 && PERF_NCCL(NULL, ncclGroupEnd())) return -1;
  if (a->blocking) {
    if (perf_complete(t)) return -1;
    if (perf_team_barrier(t)) return -1;
  }
  return 0;
}

static int perf_graph_begin(perf_thread_t* t, enum cudaStreamCaptureMode mode) {
  for (int g = 0; g < t->job->args->ngpus; g++) {
    perf_rank_t* r = &t->ranks[g];
    if (PERF_CUDA(r, cudaStreamBeginCapture(r->stream, mode))) return -1;
  }
  return 0;
}

/* Ends every capture before instantiating any: instantiation is refused
   while this thread still captures another stream (-g > 1). */
static int perf_graph_end(perf_thread_t* t) {
  for (int g = 0; g < t->job->args->ngpus; g++) {
    perf_rank_t* r = &t->ranks[g];
    if (PERF_CUDA(r, cudaStreamEndCapture(r->stream, &r->graph))) return -1;
  }
  for (int g = 0; g < t->job->args->ngpus; g++) {
    perf_rank_t* r = &t->ranks[g];
    if (PERF_CUDA(r, cudaGraphInstantiate(&r->graph_exec, r->graph, 0))) return -1;
  }
  return 0;
}

static int perf_graph_launch(perf_thread_t* t) {
  for (int g = 0; g < t->job->args->ngpus; g++) {
    perf_rank_t* r = &t->ranks[g];
    if (PERF_CUDA(r, cudaGraphLaunch(r->graph_exec, r->stream))) return -1;
  }
  return 0;
}

static int perf_graph_destroy(perf_thread_t* t) {
  int rc = 0;
  for (int g = 0; g < t->job->args->ngpus; g++) {
    perf_rank_t* r = &t->ranks[g];
    if (r->graph_exec && PERF_CUDA(r, cudaGraphExecDestroy(r->graph_exec))) rc = -1;
    if (r->graph && PERF_CUDA(r, cudaGraphDestroy(r->graph))) rc = -1;
    r->graph_exec = NULL;
    r->graph = NULL;
  }
  return rc;
}

/*
 * -n iterations of -m grouped calls: seconds per call to completion in *sec, and to enqueue
 * (what -C reports) in *cpu_sec.
 */
static int perf_timed_loop(perf_thread_t* t, const perf_series_t* s, int in_place, double* sec,
                           double* cpu_sec) {
  const perf_args_t* a = t->job->args;
  int graph = a->graph_launches > 0;
  /* Thread-local capture: other threads keep calling CUDA while we capture,
     and a library may allocate while connecting inside the first capture. */
  if (graph && perf_graph_begin(t, cudaStreamCaptureModeThreadLocal)) return -1;
  double start = perf_now();
  for (int iter = 0; iter < a->iters; iter++) {
    if (a->agg_iters > 1 && PERF_NCCL(NULL, ncclGroupStart())) return -1;
    for (int k = 0; k < a->agg_iters; k++)
      if (perf_start_coll(t, s, in_place, iter * a->agg_iters + k)) return -1;
    if (a->agg_iters > 1 && PERF_NCCL(NULL, ncclGroupEnd())) return -1;
  }
  if (graph) {
    if (perf_graph_end(t) || perf_team_barrier(t)) return -1;
    start = perf_now();
    for (int l = 0; l < a->graph_launches; l++)
      if (perf_graph_launch(t)) return -1;
  }
  double calls = (double)a->iters * a->agg_iters;
  double cpu = (perf_now() - start) / calls; /* nccl-tests: not divided by -G */
  if (perf_complete(t)) return -1;
  *sec = (perf_now() - start) / calls / (graph ? a->graph_launches : 1);
  *cpu_sec = cpu;
  return graph ? perf_graph_destroy(t) : 0;
}

/* Poisons every output, fills the inputs of this thread's ranks. */
static int perf_init_data(perf_thread_t* t, const perf_series_t* s, int in_place, uint64_t seed) {
  perf_job_t* job = t->job;
  perf_value_desc_t desc = perf_desc(t, s, seed);
  for (int g = 0; g < job->args->ngpus; g++) {
    perf_rank_t* r = &t->ranks[g];
    void *send, *recv;
    perf_call_buffers(r, s, in_place, 0, &send, &recv);
    size_t inputs = job->coll->input_count(&s->counts, r->rank, s->root);
    if (PERF_CUDA(r, cudaSetDevice(r->device)) ||
        PERF_CUDA(r, cudaMemsetAsync(recv, perf_poison_byte(s->type),
                                     s->counts.recv_count * s->type_size, r->stream)) ||
        PERF_CUDA(r, perf_device_fill(send, inputs, desc, r->rank, 0, r->stream)) ||
        PERF_CUDA(r, cudaMemsetAsync(r->wrong, 0, sizeof(*r->wrong), r->stream)))
      return -1;
  }
  for (int g = 0; g < job->args->ngpus; g++)
    if (PERF_CUDA(&t->ranks[g], cudaStreamSynchronize(t->ranks[g].stream))) return -1;
  return 0;
}

/*
 * The elements of the receive buffer that no segment covers must be as the call found them,
 * as nccl-tests checks (a non-root rank's buffer in reduce and gather): the poison, or, in
 * place, this rank's input where its send buffer lies (`send_off` elements from the receive
 * buffer, `inputs` long). Appends their segments to seg[nseg...] (room for 3 * (nseg + 1)
 * more; `sorted` is scratch for nseg) and returns the new count.
 */
static int perf_untouched_segments(const perf_series_t* s, int rank, int in_place,
                                   ptrdiff_t send_off, size_t inputs, perf_segment_t* seg, int nseg,
                                   perf_segment_t* sorted) {
  memcpy(sorted, seg, (size_t)nseg * sizeof *seg);
  for (int i = 1; i < nseg; i++) /* a few segments, mostly in order already */
    for (int j = i; j > 0 && sorted[j - 1].dst_offset > sorted[j].dst_offset; j--) {
      perf_segment_t tmp = sorted[j];
      sorted[j] = sorted[j - 1];
      sorted[j - 1] = tmp;
    }
  /* The input, in receive-buffer elements: [a, b) (empty out of place). */
  const ptrdiff_t a = in_place ? send_off : 0, b = in_place ? send_off + (ptrdiff_t)inputs : 0;
  int n = nseg;
  size_t cur = 0;
  for (int i = 0; i <= nseg; i++) {
    const size_t next = i < nseg ? sorted[i].dst_offset : s->counts.recv_count;
    if (next > cur) { /* the gap [cur, next): poison, then the input, then poison */
      const ptrdiff_t lo = (ptrdiff_t)cur, hi = (ptrdiff_t)next;
      const ptrdiff_t in_lo = lo > a ? lo : a, in_hi = hi < b ? hi : b;
      const int has_input = in_lo < in_hi;
      const ptrdiff_t cut1 = has_input ? in_lo : hi, cut2 = has_input ? in_hi : hi;
      if (cut1 > lo)
        seg[n++] = (perf_segment_t){(size_t)lo, (size_t)(cut1 - lo), PERF_SEG_POISON, 0};
      if (has_input)
        seg[n++] =
            (perf_segment_t){(size_t)in_lo, (size_t)(in_hi - in_lo), rank, (size_t)(in_lo - a)};
      if (hi > cut2)
        seg[n++] = (perf_segment_t){(size_t)cut2, (size_t)(hi - cut2), PERF_SEG_POISON, 0};
    }
    if (i < nseg && sorted[i].dst_offset + sorted[i].count > cur)
      cur = sorted[i].dst_offset + sorted[i].count;
  }
  return n;
}

/* Wrong elements in this thread's outputs after a checked call. */
static int perf_count_wrong(perf_thread_t* t, const perf_series_t* s, int in_place, uint64_t seed,
                            int64_t* wrong) {
  perf_job_t* job = t->job;
  perf_value_desc_t desc = perf_desc(t, s, seed);
  /* The collective's segments (at most nranks), then the untouched ones, then scratch. */
  perf_segment_t* seg = calloc(5 * (size_t)job->nranks + 3, sizeof(*seg));
  if (!seg) return -1;
  int rc = 0;
  *wrong = 0;
  for (int g = 0; g < job->args->ngpus && rc == 0; g++) {
    perf_rank_t* r = &t->ranks[g];
    void *send, *recv;
    perf_call_buffers(r, s, in_place, 0, &send, &recv);
    int nseg = job->coll->expected(&s->counts, job->nranks, r->rank, s->root, seg);
    nseg = perf_untouched_segments(s, r->rank, in_place,
                                   ((char*)send - (char*)recv) / (ptrdiff_t)s->type_size,
                                   job->coll->input_count(&s->counts, r->rank, s->root), seg, nseg,
                                   seg + 4 * (size_t)job->nranks + 3);
    unsigned long long count = 0;
    rc = PERF_CUDA(r, cudaSetDevice(r->device));
    for (int i = 0; i < nseg && rc == 0; i++)
      rc = PERF_CUDA(r, perf_device_check(recv, seg[i], desc, r->wrong, r->stream));
    if (rc == 0)
      rc = PERF_CUDA(r, cudaMemcpyAsync(&count, r->wrong, sizeof(count), cudaMemcpyDeviceToHost,
                                        r->stream)) ||
           PERF_CUDA(r, cudaStreamSynchronize(r->stream));
    *wrong += (int64_t)count;
  }
  free(seg);
  return rc ? -1 : 0;
}

/* One checked call, captured and replayed once under -G like the timed loop. */
static int perf_checked_call(perf_thread_t* t, const perf_series_t* s, int in_place) {
  const perf_args_t* a = t->job->args;
  if (a->graph_launches == 0) return (perf_start_coll(t, s, in_place, 0) || perf_complete(t)) ? -1 : 0;
  enum cudaStreamCaptureMode mode =
      a->nthreads > 1 ? cudaStreamCaptureModeThreadLocal : cudaStreamCaptureModeGlobal;
  if (perf_graph_begin(t, mode) || perf_start_coll(t, s, in_place, 0) || perf_graph_end(t) ||
      perf_graph_launch(t) || perf_complete(t))
    return -1;
  return perf_graph_destroy(t);
}

/* -c checked calls; the sum over all ranks of the first wrong count. */
static int perf_checked_runs(perf_thread_t* t, const perf_series_t* s, int in_place, int64_t* wrong) {
  *wrong = 0;
  for (int c = 0; c < t->job->args->check; c++) {
    uint64_t seed = ++t->checks; /* every thread counts alike: one seed per call */
    int64_t mine = 0;
    if (perf_init_data(t, s, in_place, seed) || perf_team_barrier(t) ||
        perf_checked_call(t, s, in_place) || perf_count_wrong(t, s, in_place, seed, &mine))
      return -1;
    if (mine) t->errors++;
    *wrong = mine;
    if (perf_team_sum_int(t, wrong)) return -1;
    if (*wrong) break;
  }
  return 0;
}

/* One place of one row. */
static int perf_measure(perf_thread_t* t, const perf_series_t* s, int in_place, perf_result_t* out) {
  perf_job_t* job = t->job;
  const perf_args_t* a = job->args;
  if (a->check && perf_init_data(t, s, in_place, 0)) return -1;
  /* One untimed call: every rank is connected and here before the clock starts. */
  if (perf_start_coll(t, s, in_place, 0) || perf_complete(t) || perf_team_barrier(t)) return -1;
  double sec = 0, cpu = 0;
  if (perf_timed_loop(t, s, in_place, &sec, &cpu) || perf_team_reduce_double(t, &sec, a->average))
    return -1;
  /* -C changes the time column only, as in nccl-tests: bandwidths stay completion-based. */
  out->time_us = (a->report_cputime ? cpu : sec) * 1e6;
  job->coll->bandwidth(s->counts.param_count, s->type_size, sec, job->nranks, &out->algbw,
                       &out->busbw);
  if (perf_team_barrier(t)) return -1;
  out->wrong = -1;
  if (a->check && (!in_place || job->coll->in_place_checked) &&
      perf_checked_runs(t, s, in_place, &out->wrong))
    return -1;
  t->busbw_sum += out->busbw;
  t->busbw_count++;
  return 0;
}

static void perf_series_size(const perf_thread_t* t, perf_series_t* s, size_t bytes) {
  t->job->coll->counts(bytes / s->type_size, s->type_size, t->job->nranks, &s->counts);
}

static int perf_warmup(perf_thread_t* t, perf_series_t* s, size_t bytes) {
  perf_series_size(t, s, bytes);
  for (int iter = 0; iter < t->job->args->warmup_iters; iter++)
    if (perf_start_coll(t, s, 0, iter)) return -1;
  return perf_complete(t);
}

static int perf_series_run(perf_thread_t* t, int type, int op, int root) {
  perf_job_t* job = t->job;
  const perf_args_t* a = job->args;
  perf_series_t s = {.type = type, .op = op, .root = root, .type_size = (size_t)perf_type_size(type)};
  size_t first = a->min_bytes < job->max_bytes ? a->min_bytes : job->max_bytes;
  if (perf_team_barrier(t)) return -1;
  for (size_t b = first; b <= job->max_bytes; b = b == 0 ? 1 : b * 2) {
    if (perf_warmup(t, &s, b)) return -1;
    if (b > SIZE_MAX / 2) break;
  }
  for (int cycle = 0; a->run_cycles == 0 || cycle < a->run_cycles; cycle++) {
    size_t bytes = first;
    for (int more = 1; more && bytes <= job->max_bytes; more = perf_size_next(a, bytes, &bytes)) {
      perf_series_size(t, &s, bytes);
      const perf_counts_t* c = &s.counts;
      perf_row_t row = {.bytes = (c->send_count > c->recv_count ? c->send_count : c->recv_count) *
                                 s.type_size,
                        .count = c->param_count, .type = type, .op = op, .root = root};
      if (perf_measure(t, &s, 0, &row.place[0]) || perf_measure(t, &s, 1, &row.place[1])) return -1;
      if (perf_is_printer(t)) perf_report_row(job, &row);
    }
  }
  return 0;
}

int perf_bench_thread(perf_thread_t* t) {
  perf_job_t* job = t->job;
  int nops = job->coll->uses_op ? job->nops : 1;
  int first_root = job->coll->uses_root ? (job->roots_all ? 0 : job->args->root) : -1;
  int last_root = job->coll->uses_root ? (job->roots_all ? job->nranks - 1 : job->args->root) : -1;
  for (int ti = 0; ti < job->ntypes; ti++)
    for (int oi = 0; oi < nops; oi++)
      for (int root = first_root; root <= last_root; root++) {
        int op = job->coll->uses_op ? job->ops[oi] : ncclSum;
        if (perf_series_run(t, job->types[ti], op, root)) return -1;
      }
  return 0;
}
