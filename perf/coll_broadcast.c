/*
 * broadcast_perf: every rank ends with the root's buffer. busbw = algbw:
 * a pipelined broadcast moves each byte over each link once.
 */
#include "common.h"

static void broadcast_counts(size_t count, size_t type_size, int nranks, perf_counts_t* c) {
  c->send_count = c->recv_count = c->param_count = count;
  c->send_inplace_offset = c->recv_inplace_offset = 0;
}

static void broadcast_bandwidth(size_t count, size_t type_size, double sec, int nranks,
                                double* algbw, double* busbw) {
  *algbw = perf_gbps((double)count * type_size, sec);
  *busbw = *algbw;
}

/* Only the root's send buffer is read. */
static size_t broadcast_input_count(const perf_counts_t* c, int rank, int root) {
  return rank == root ? c->send_count : 0;
}

static int broadcast_expected(const perf_counts_t* c, int nranks, int rank, int root,
                              perf_segment_t* seg) {
  seg[0] = (perf_segment_t){0, c->recv_count, root, 0};
  return 1;
}

static ncclResult_t broadcast_run(const perf_coll_call_t* k) {
  return ncclBroadcast(k->send, k->recv, k->count, k->type, k->root, k->comm, k->stream);
}

const perf_coll_ops_t perf_coll_broadcast = {
    .size = sizeof(perf_coll_ops_t),
    .name = "broadcast",
    .uses_op = 0,
    .uses_root = 1,
    .in_place_checked = 1,
    .counts = broadcast_counts,
    .bandwidth = broadcast_bandwidth,
    .input_count = broadcast_input_count,
    .expected = broadcast_expected,
    .run = broadcast_run,
};
