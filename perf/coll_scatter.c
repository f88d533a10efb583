/*
 * scatter_perf: share r of the root's buffer lands on rank r (ncclScatter,
 * NCCL 2.28). busbw = algbw * (n-1)/n, as nccl-tests.
 */
#include "common.h"

static void scatter_counts(size_t count, size_t type_size, int nranks, perf_counts_t* c) {
  size_t share = perf_rank_share(count, type_size, nranks);
  c->send_count = share * (size_t)nranks;
  c->recv_count = share;
  c->param_count = share;
  c->send_inplace_offset = 0;
  c->recv_inplace_offset = share;
}

static void scatter_bandwidth(size_t count, size_t type_size, double sec, int nranks,
                              double* algbw, double* busbw) {
  *algbw = perf_gbps((double)count * type_size * nranks, sec);
  *busbw = *algbw * (nranks - 1) / nranks;
}

/* Only the root's send buffer is read. */
static size_t scatter_input_count(const perf_counts_t* c, int rank, int root) {
  return rank == root ? c->send_count : 0;
}

static int scatter_expected(const perf_counts_t* c, int nranks, int rank, int root,
                            perf_segment_t* seg) {
  seg[0] = (perf_segment_t){0, c->param_count, root, (size_t)rank * c->param_count};
  return 1;
}

static ncclResult_t scatter_run(const perf_coll_call_t* k) {
  return ncclScatter(k->send, k->recv, k->count, k->type, k->root, k->comm, k->stream);
}

const perf_coll_ops_t perf_coll_scatter = {
    .size = sizeof(perf_coll_ops_t),
    .name = "scatter",
    .uses_op = 0,
    .uses_root = 1,
    .in_place_checked = 1,
    .counts = scatter_counts,
    .bandwidth = scatter_bandwidth,
    .input_count = scatter_input_count,
    .expected = scatter_expected,
    .run = scatter_run,
};
