/*
 * reduce_scatter_perf: rank r ends with share r of the reduction of all
 * inputs. The size column is the send buffer; busbw = algbw * (n-1)/n.
 */
#include "common.h"

static void reduce_scatter_counts(size_t count, size_t type_size, int nranks, perf_counts_t* c) {
  size_t share = perf_rank_share(count, type_size, nranks);
  c->send_count = share * (size_t)nranks;
  c->recv_count = share;
  c->param_count = share;
  c->send_inplace_offset = 0;
  c->recv_inplace_offset = share; /* in place, a rank receives into its own slot */
}

static void reduce_scatter_bandwidth(size_t count, size_t type_size, double sec, int nranks,
                                     double* algbw, double* busbw) {
  *algbw = perf_gbps((double)count * type_size * nranks, sec);
  *busbw = *algbw * (nranks - 1) / nranks;
}

static size_t reduce_scatter_input_count(const perf_counts_t* c, int rank, int root) {
  return c->send_count;
}

static int reduce_scatter_expected(const perf_counts_t* c, int nranks, int rank, int root,
                                   perf_segment_t* seg) {
  seg[0] = (perf_segment_t){0, c->param_count, PERF_SEG_REDUCE, (size_t)rank * c->param_count};
  return 1;
}

static ncclResult_t reduce_scatter_run(const perf_coll_call_t* k) {
  return ncclReduceScatter(k->send, k->recv, k->count, k->type, k->op, k->comm, k->stream);
}

const perf_coll_ops_t perf_coll_reduce_scatter = {
    .size = sizeof(perf_coll_ops_t),
    .name = "reduce_scatter",
    .uses_op = 1,
    .uses_root = 0,
    .in_place_checked = 1,
    .counts = reduce_scatter_counts,
    .bandwidth = reduce_scatter_bandwidth,
    .input_count = reduce_scatter_input_count,
    .expected = reduce_scatter_expected,
    .run = reduce_scatter_run,
};
