/*
 * gather_perf: rank q's share lands at offset q * share on the root
 * (ncclGather, NCCL 2.28). busbw = algbw * (n-1)/n, as nccl-tests.
 */
#include "common.h"

static void gather_counts(size_t count, size_t type_size, int nranks, perf_counts_t* c) {
  size_t share = perf_rank_share(count, type_size, nranks);
  c->send_count = share;
  c->recv_count = share * (size_t)nranks;
  c->param_count = share;
  c->send_inplace_offset = share;
  c->recv_inplace_offset = 0;
}

static void gather_bandwidth(size_t count, size_t type_size, double sec, int nranks,
                             double* algbw, double* busbw) {
  *algbw = perf_gbps((double)count * type_size * nranks, sec);
  *busbw = *algbw * (nranks - 1) / nranks;
}

static size_t gather_input_count(const perf_counts_t* c, int rank, int root) {
  return c->send_count;
}

static int gather_expected(const perf_counts_t* c, int nranks, int rank, int root,
                           perf_segment_t* seg) {
  if (rank != root) return 0;
  for (int q = 0; q < nranks; q++)
    seg[q] = (perf_segment_t){(size_t)q * c->param_count, c->param_count, q, 0};
  return nranks;
}

static ncclResult_t gather_run(const perf_coll_call_t* k) {
  return ncclGather(k->send, k->recv, k->count, k->type, k->root, k->comm, k->stream);
}

const perf_coll_ops_t perf_coll_gather = {
    .size = sizeof(perf_coll_ops_t),
    .name = "gather",
    .uses_op = 0,
    .uses_root = 1,
    .in_place_checked = 1,
    .counts = gather_counts,
    .bandwidth = gather_bandwidth,
    .input_count = gather_input_count,
    .expected = gather_expected,
    .run = gather_run,
};
