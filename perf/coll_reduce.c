/*
 * reduce_perf: the root ends with the reduction of all inputs; the other
 * ranks' receive buffers must be left as they were (bench.c checks what no
 * segment covers). busbw = algbw, as for broadcast.
 */
#include "common.h"

static void reduce_counts(size_t count, size_t type_size, int nranks, perf_counts_t* c) {
  c->send_count = c->recv_count = c->param_count = count;
  c->send_inplace_offset = c->recv_inplace_offset = 0;
}

static void reduce_bandwidth(size_t count, size_t type_size, double sec, int nranks,
                             double* algbw, double* busbw) {
  *algbw = perf_gbps((double)count * type_size, sec);
  *busbw = *algbw;
}

static size_t reduce_input_count(const perf_counts_t* c, int rank, int root) {
  return c->send_count;
}

static int reduce_expected(const perf_counts_t* c, int nranks, int rank, int root,
                           perf_segment_t* seg) {
  if (rank != root) return 0;
  seg[0] = (perf_segment_t){0, c->recv_count, PERF_SEG_REDUCE, 0};
  return 1;
}

static ncclResult_t reduce_run(const perf_coll_call_t* k) {
  return ncclReduce(k->send, k->recv, k->count, k->type, k->op, k->root, k->comm, k->stream);
}

const perf_coll_ops_t perf_coll_reduce = {
    .size = sizeof(perf_coll_ops_t),
    .name = "reduce",
    .uses_op = 1,
    .uses_root = 1,
    .in_place_checked = 1,
    .counts = reduce_counts,
    .bandwidth = reduce_bandwidth,
    .input_count = reduce_input_count,
    .expected = reduce_expected,
    .run = reduce_run,
};
