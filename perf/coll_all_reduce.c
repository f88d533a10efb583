/*
 * all_reduce_perf: every rank ends with the reduction of all ranks' inputs.
 * busbw = algbw * 2(n-1)/n, the bytes each rank must move in a ring
 * (reduce-scatter then all-gather) relative to the buffer size.
 */
#include "common.h"

static void all_reduce_counts(size_t count, size_t type_size, int nranks, perf_counts_t* c) {
  c->send_count = c->recv_count = c->param_count = count;
  c->send_inplace_offset = c->recv_inplace_offset = 0;
}

static void all_reduce_bandwidth(size_t count, size_t type_size, double sec, int nranks,
                                 double* algbw, double* busbw) {
  *algbw = perf_gbps((double)count * type_size, sec);
  *busbw = *algbw * 2.0 * (nranks - 1) / nranks;
}

static size_t all_reduce_input_count(const perf_counts_t* c, int rank, int root) {
  return c->send_count;
}

static int all_reduce_expected(const perf_counts_t* c, int nranks, int rank, int root,
                               perf_segment_t* seg) {
  seg[0] = (perf_segment_t){0, c->recv_count, PERF_SEG_REDUCE, 0};
  return 1;
}

static ncclResult_t all_reduce_run(const perf_coll_call_t* k) {
  return ncclAllReduce(k->send, k->recv, k->count, k->type, k->op, k->comm, k->stream);
}

const perf_coll_ops_t perf_coll_all_reduce = {
    .size = sizeof(perf_coll_ops_t),
    .name = "all_reduce",
    .uses_op = 1,
    .uses_root = 0,
    .in_place_checked = 1,
    .counts = all_reduce_counts,
    .bandwidth = all_reduce_bandwidth,
    .input_count = all_reduce_input_count,
    .expected = all_reduce_expected,
    .run = all_reduce_run,
};
