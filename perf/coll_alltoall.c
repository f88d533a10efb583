/*
 * alltoall_perf: block q of rank r's send buffer lands as block r of rank
 * q's receive buffer (ncclAlltoAll, NCCL 2.28). busbw = algbw * (n-1)/n: the
 * block a rank keeps never crosses a link. In place is timed, result N/A.
 */
#include "common.h"

static void alltoall_counts(size_t count, size_t type_size, int nranks, perf_counts_t* c) {
  size_t share = perf_rank_share(count, type_size, nranks);
  c->send_count = c->recv_count = share * (size_t)nranks;
  c->param_count = share;
  c->send_inplace_offset = c->recv_inplace_offset = 0;
}

static void alltoall_bandwidth(size_t count, size_t type_size, double sec, int nranks,
                               double* algbw, double* busbw) {
  *algbw = perf_gbps((double)count * type_size * nranks, sec);
  *busbw = *algbw * (nranks - 1) / nranks;
}

static size_t alltoall_input_count(const perf_counts_t* c, int rank, int root) {
  return c->send_count;
}

static int alltoall_expected(const perf_counts_t* c, int nranks, int rank, int root,
                             perf_segment_t* seg) {
  size_t share = c->param_count;
  for (int q = 0; q < nranks; q++)
    seg[q] = (perf_segment_t){(size_t)q * share, share, q, (size_t)rank * share};
  return nranks;
}

static ncclResult_t alltoall_run(const perf_coll_call_t* k) {
  return ncclAlltoAll(k->send, k->recv, k->count, k->type, k->comm, k->stream);
}

const perf_coll_ops_t perf_coll_alltoall = {
    .size = sizeof(perf_coll_ops_t),
    .name = "alltoall",
    .uses_op = 0,
    .uses_root = 0,
    .in_place_checked = 0,
    .counts = alltoall_counts,
    .bandwidth = alltoall_bandwidth,
    .input_count = alltoall_input_count,
    .expected = alltoall_expected,
    .run = alltoall_run,
};
