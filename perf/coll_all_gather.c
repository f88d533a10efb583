/*
 * all_gather_perf: rank q's share lands at offset q * share on every rank.
 * The size column is the gathered buffer; algbw counts it whole, and
 * busbw = algbw * (n-1)/n, since each rank already holds its own share.
 */
#include "common.h"

static void all_gather_counts(size_t count, size_t type_size, int nranks, perf_counts_t* c) {
  size_t share = perf_rank_share(count, type_size, nranks);
  c->send_count = share;
  c->recv_count = share * (size_t)nranks;
  c->param_count = share;
  c->send_inplace_offset = share; /* in place, a rank sends from its own slot */
  c->recv_inplace_offset = 0;
}

static void all_gather_bandwidth(size_t count, size_t type_size, double sec, int nranks,
                                 double* algbw, double* busbw) {
  *algbw = perf_gbps((double)count * type_size * nranks, sec);
  *busbw = *algbw * (nranks - 1) / nranks;
}

static size_t all_gather_input_count(const perf_counts_t* c, int rank, int root) {
  return c->send_count;
}

static int all_gather_expected(const perf_counts_t* c, int nranks, int rank, int root,
                               perf_segment_t* seg) {
  for (int q = 0; q < nranks; q++)
    seg[q] = (perf_segment_t){(size_t)q * c->param_count, c->param_count, q, 0};
  return nranks;
}

static ncclResult_t all_gather_run(const perf_coll_call_t* k) {
  return ncclAllGather(k->send, k->recv, k->count, k->type, k->comm, k->stream);
}

const perf_coll_ops_t perf_coll_all_gather = {
    .size = sizeof(perf_coll_ops_t),
    .name = "all_gather",
    .uses_op = 0,
    .uses_root = 0,
    .in_place_checked = 1,
    .counts = all_gather_counts,
    .bandwidth = all_gather_bandwidth,
    .input_count = all_gather_input_count,
    .expected = all_gather_expected,
    .run = all_gather_run,
};
