/*
 * sendrecv_perf: each rank sends its buffer to rank+1 and receives from
 * rank-1, in one group. busbw = algbw. As in nccl-tests the -o loop applies
 * (the op column shows it) though no reduction happens, and in place (send
 * and receive in one buffer) is timed but its result is N/A.
 */
#include "common.h"

static void sendrecv_counts(size_t count, size_t type_size, int nranks, perf_counts_t* c) {
  c->send_count = c->recv_count = c->param_count = count;
  c->send_inplace_offset = c->recv_inplace_offset = 0;
}

static void sendrecv_bandwidth(size_t count, size_t type_size, double sec, int nranks,
                               double* algbw, double* busbw) {
  *algbw = perf_gbps((double)count * type_size, sec);
  *busbw = *algbw;
}

static size_t sendrecv_input_count(const perf_counts_t* c, int rank, int root) {
  return c->send_count;
}

static int sendrecv_expected(const perf_counts_t* c, int nranks, int rank, int root,
                             perf_segment_t* seg) {
  seg[0] = (perf_segment_t){0, c->recv_count, (rank + nranks - 1) % nranks, 0};
  return 1;
}

/* Returns the first failure of the four calls, closing the group regardless. */
static ncclResult_t sendrecv_run(const perf_coll_call_t* k) {
  int next = (k->rank + 1) % k->nranks, prev = (k->rank + k->nranks - 1) % k->nranks;
  ncclResult_t res = ncclGroupStart();
  if (res != ncclSuccess) return res;
  res = ncclSend(k->send, k->count, k->type, next, k->comm, k->stream);
  if (res == ncclSuccess) res = ncclRecv(k->recv, k->count, k->type, prev, k->comm, k->stream);
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

const perf_coll_ops_t perf_coll_sendrecv = {
    .size = sizeof(perf_coll_ops_t),
    .name = "sendrecv",
    .uses_op = 1,
    .uses_root = 0,
    .in_place_checked = 0,
    .counts = sendrecv_counts,
    .bandwidth = sendrecv_bandwidth,
    .input_count = sendrecv_input_count,
    .expected = sendrecv_expected,
    .run = sendrecv_run,
};
