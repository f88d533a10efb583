/*
 * The API's answers to wrong arguments, with a GPU. Each check is its own
 * case ("Errors: ...") so that a failure names what was wrongly accepted or
 * refused; a refusal must also leave a message for ncclGetLastError.
 *
 * They run on a one-rank communicator over the GPU of local rank 0
 * (ncclCommInitAll with one device): a wrong call the library accepted by
 * mistake then cannot leave a peer waiting. Buffers of "the other GPU" are
 * allocated on the next visible device. At the end, a valid call on the same
 * communicator must still work.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpu_test.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define ERR_COUNT 1024 /* floats in each buffer */

struct err_env {
  int ready;
  ncclComm_t comm; /* one rank, on `dev` */
  cudaStream_t stream;
  int dev, other_dev; /* other_dev: another visible GPU, or -1 */
  float* send;        /* ERR_COUNT floats on dev: 1, 2, 3, ... */
  float* recv;        /* ERR_COUNT floats on dev */
  float* other;       /* ERR_COUNT floats on other_dev */
};

/* ---- the environment ---------------------------------------------------------------------------
 */

static int err_env_setup(struct gpu_world* w, struct err_env* e) {
  float host[ERR_COUNT];
  int ndev = 0;
  e->ready = 1;
  e->dev = w->dev[0];
  e->other_dev = -1;
  if (world_cuda(w, cudaGetDeviceCount(&ndev), "cudaGetDeviceCount") != 0) return -1;
  if (ndev > 1) e->other_dev = (e->dev + 1) % ndev;
  for (int i = 0; i < ERR_COUNT; i++) host[i] = (float)(i + 1);
  if (world_nccl(w, ncclCommInitAll(&e->comm, 1, &e->dev), NULL, "ncclCommInitAll (one rank)") !=
          0 ||
      world_cuda(w, cudaSetDevice(e->dev), "cudaSetDevice") != 0 ||
      world_cuda(w, cudaStreamCreateWithFlags(&e->stream, cudaStreamNonBlocking),
                 "cudaStreamCreate") != 0 ||
      world_cuda(w, cudaMalloc((void**)&e->send, sizeof host), "cudaMalloc") != 0 ||
      world_cuda(w, cudaMalloc((void**)&e->recv, sizeof host), "cudaMalloc") != 0 ||
      world_cuda(w, cudaMemcpy(e->send, host, sizeof host, cudaMemcpyHostToDevice), "cudaMemcpy") !=
          0)
    return -1;
  if (e->other_dev >= 0 &&
      (world_cuda(w, cudaSetDevice(e->other_dev), "cudaSetDevice") != 0 ||
       world_cuda(w, cudaMalloc((void**)&e->other, sizeof host), "cudaMalloc") != 0 ||
       world_cuda(w, cudaSetDevice(e->dev), "cudaSetDevice") != 0))
    return -1;
  return 0;
}

/* The environment, created by the first case that runs; NULL when that failed. */
static struct err_env* err_env_get(struct gpu_world* w, struct err_env* e) {
  if (!e->ready) err_env_setup(w, e);
  return e->comm && e->stream && e->send && e->recv && (e->other_dev < 0 || e->other) ? e : NULL;
}

static void err_env_teardown(struct gpu_world* w, struct err_env* e) {
  if (!e->ready) return;
  if (e->other && cudaSetDevice(e->other_dev) == cudaSuccess) cudaFree(e->other);
  if (cudaSetDevice(e->dev) == cudaSuccess) {
    if (e->stream) cudaStreamSynchronize(e->stream);
    cudaFree(e->send);
    cudaFree(e->recv);
  }
  if (e->comm) ncclCommDestroy(e->comm);
  if (e->stream) cudaStreamDestroy(e->stream);
}

/* A valid AllReduce on the one-rank communicator: recv must equal send. 0 when it does. */
static int err_valid_call(struct gpu_world* w, struct err_env* e, int in_group) {
  float host[ERR_COUNT];
  if (world_cuda(w, cudaMemset(e->recv, GPU_POISON, sizeof host), "cudaMemset") != 0 ||
      world_cuda(w, cudaDeviceSynchronize(), "cudaDeviceSynchronize") != 0)
    return -1;
  if (in_group && world_group_start(w) != 0) return -1;
  int rc = world_nccl(
      w, ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, ncclSum, e->comm, e->stream),
      e->comm, "ncclAllReduce (valid)");
  if (in_group) rc |= world_group_end(w);
  if (rc != 0 || world_cuda(w, cudaStreamSynchronize(e->stream), "cudaStreamSynchronize") != 0 ||
      world_cuda(w, cudaMemcpy(host, e->recv, sizeof host, cudaMemcpyDeviceToHost), "cudaMemcpy") !=
          0)
    return -1;
  for (int i = 0; i < ERR_COUNT; i++) {
    if (host[i] == (float)(i + 1)) continue;
    world_case_fail(w, "valid AllReduce: element %d is %g, expected %d", i, (double)host[i], i + 1);
    return -1;
  }
  return 0;
}

/* ---- simple refusals
 * ----------------------------------------------------------------------------- */

typedef ncclResult_t (*err_call_fn)(struct err_env* e);

static ncclResult_t call_null_send(struct err_env* e) {
  return ncclAllReduce(NULL, e->recv, ERR_COUNT, ncclFloat32, ncclSum, e->comm, e->stream);
}
static ncclResult_t call_null_recv(struct err_env* e) {
  return ncclAllReduce(e->send, NULL, ERR_COUNT, ncclFloat32, ncclSum, e->comm, e->stream);
}
static ncclResult_t call_type_too_large(struct err_env* e) {
  return ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclNumTypes, ncclSum, e->comm, e->stream);
}
static ncclResult_t call_type_negative(struct err_env* e) {
  return ncclAllGather(e->send, e->recv, ERR_COUNT, (ncclDataType_t)-1, e->comm, e->stream);
}
static ncclResult_t call_op_never_created(struct err_env* e) {
  return ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, (ncclRedOp_t)(ncclNumOps + 100),
                       e->comm, e->stream);
}
static ncclResult_t call_broadcast_root_nranks(struct err_env* e) {
  return ncclBroadcast(e->send, e->recv, ERR_COUNT, ncclFloat32, 1, e->comm, e->stream);
}
static ncclResult_t call_reduce_root_negative(struct err_env* e) {
  return ncclReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, ncclSum, -1, e->comm, e->stream);
}
static ncclResult_t call_gather_root_nranks(struct err_env* e) {
  return ncclGather(e->send, e->recv, ERR_COUNT, ncclFloat32, 1, e->comm, e->stream);
}
static ncclResult_t call_scatter_root_nranks(struct err_env* e) {
  return ncclScatter(e->send, e->recv, ERR_COUNT, ncclFloat32, 1, e->comm, e->stream);
}
static ncclResult_t call_send_peer_nranks(struct err_env* e) {
  return ncclSend(e->send, ERR_COUNT, ncclFloat32, 1, e->comm, e->stream);
}
static ncclResult_t call_recv_peer_negative(struct err_env* e) {
  return ncclRecv(e->recv, ERR_COUNT, ncclFloat32, -1, e->comm, e->stream);
}
static ncclResult_t call_null_comm(struct err_env* e) {
  return ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, ncclSum, NULL, e->stream);
}
static ncclResult_t call_send_other_gpu(struct err_env* e) {
  return ncclAllReduce(e->other, e->recv, ERR_COUNT, ncclFloat32, ncclSum, e->comm, e->stream);
}
static ncclResult_t call_recv_other_gpu(struct err_env* e) {
  return ncclAllReduce(e->send, e->other, ERR_COUNT, ncclFloat32, ncclSum, e->comm, e->stream);
}
/* Buffers too small for the count: the second half of a buffer, asked for a whole buffer's worth. */
static ncclResult_t call_send_past_end(struct err_env* e) {
  return ncclAllReduce(e->send + ERR_COUNT / 2, e->recv, ERR_COUNT, ncclFloat32, ncclSum, e->comm,
                       e->stream);
}
static ncclResult_t call_recv_past_end(struct err_env* e) {
  return ncclAllGather(e->send, e->recv + ERR_COUNT / 2, ERR_COUNT, ncclFloat32, e->comm,
                       e->stream);
}
static ncclResult_t call_sendp2p_past_end(struct err_env* e) {
  return ncclSend(e->send + 1, ERR_COUNT, ncclFloat32, 0, e->comm, e->stream);
}
static ncclResult_t call_alltoall_past_end(struct err_env* e) {
  return ncclAlltoAll(e->send, e->recv + 1, ERR_COUNT, ncclFloat32, e->comm, e->stream);
}
/* Counts whose byte size overflows size_t. */
static ncclResult_t call_count_overflow(struct err_env* e) {
  return ncclAllReduce(e->send, e->recv, SIZE_MAX, ncclFloat32, ncclSum, e->comm, e->stream);
}
static ncclResult_t call_count_overflow_bytes(struct err_env* e) {
  return ncclReduceScatter(e->send, e->recv, SIZE_MAX / 4 + 1, ncclFloat32, ncclSum, e->comm,
                           e->stream);
}
static ncclResult_t call_gather_count_overflow(struct err_env* e) {
  return ncclGather(e->send, e->recv, SIZE_MAX / 2, ncclFloat64, 0, e->comm, e->stream);
}
static ncclResult_t call_bcast_null(struct err_env* e) {
  return ncclBcast(NULL, ERR_COUNT, ncclFloat32, 0, e->comm, e->stream);
}
static ncclResult_t call_scatter_recv_null(struct err_env* e) {
  return ncclScatter(e->send, NULL, ERR_COUNT, ncclFloat32, 0, e->comm, e->stream);
}
static ncclResult_t call_reduce_op_negative(struct err_env* e) {
  return ncclReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, (ncclRedOp_t)-1, 0, e->comm,
                    e->stream);
}
static ncclResult_t call_premul_null_scalar(struct err_env* e) {
  ncclRedOp_t op;
  return ncclRedOpCreatePreMulSum(&op, NULL, ncclFloat32, ncclScalarHostImmediate, e->comm);
}
static ncclResult_t call_premul_bad_type(struct err_env* e) {
  ncclRedOp_t op;
  float scalar = 1.0f;
  return ncclRedOpCreatePreMulSum(&op, &scalar, (ncclDataType_t)ncclNumTypes,
                                  ncclScalarHostImmediate, e->comm);
}
static ncclResult_t call_register_null_handle(struct err_env* e) {
  return ncclCommRegister(e->comm, e->send, sizeof(float) * ERR_COUNT, NULL);
}
static ncclResult_t call_register_zero_size(struct err_env* e) {
  void* handle;
  return ncclCommRegister(e->comm, e->send, 0, &handle);
}
static ncclResult_t call_register_other_gpu(struct err_env* e) {
  void* handle;
  return ncclCommRegister(e->comm, e->other, sizeof(float) * ERR_COUNT, &handle);
}
static ncclResult_t call_deregister_unknown(struct err_env* e) {
  int not_a_handle;
  return ncclCommDeregister(e->comm, &not_a_handle);
}
static ncclResult_t call_window_bad_flags(struct err_env* e) {
  ncclWindow_t win;
  return ncclCommWindowRegister(e->comm, e->send, sizeof(float) * ERR_COUNT, &win, 0x100);
}
static ncclResult_t call_split_null_newcomm(struct err_env* e) {
  return ncclCommSplit(e->comm, 0, 0, NULL, NULL);
}
static ncclResult_t call_shrink_rank_out_of_range(struct err_env* e) {
  int excluded = 5;
  ncclComm_t child;
  return ncclCommShrink(e->comm, &excluded, 1, &child, NULL, NCCL_SHRINK_DEFAULT);
}
static ncclResult_t call_revoke_bad_flags(struct err_env* e) { return ncclCommRevoke(e->comm, 7); }
static ncclResult_t call_query_null(struct err_env* e) { return ncclCommUserRank(e->comm, NULL); }
static ncclResult_t call_memfree_host(struct err_env* e) {
  static float host_memory[16];
  (void)e;
  return ncclMemFree(host_memory);
}
static ncclResult_t call_initall_no_such_device(struct err_env* e) {
  int count = 0, devs[1];
  ncclComm_t comms[1];
  if (cudaGetDeviceCount(&count) != cudaSuccess) return ncclInternalError;
  devs[0] = count; /* one past the last */
  (void)e;
  return ncclCommInitAll(comms, 1, devs);
}
static ncclResult_t call_initall_device_twice(struct err_env* e) {
  int devs[2] = {e->dev, e->dev};
  ncclComm_t comms[2];
  return ncclCommInitAll(comms, 2, devs);
}
static ncclResult_t call_init_bad_config(struct err_env* e) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclUniqueId id;
  ncclComm_t comm;
  (void)e;
  if (ncclGetUniqueId(&id) != ncclSuccess) return ncclInternalError;
  config.blocking = 2;
  return ncclCommInitRankConfig(&comm, 1, id, 0, &config);
}
static ncclResult_t call_init_id_not_braid(struct err_env* e) {
  ncclUniqueId id;
  ncclComm_t comm;
  (void)e;
  memset(&id, 0x5a, sizeof id);
  return ncclCommInitRank(&comm, 1, id, 0);
}

static ncclResult_t call_group_end_unmatched(struct err_env* e) {
  (void)e;
  return ncclGroupEnd();
}
static ncclResult_t call_destroy_builtin_op(struct err_env* e) {
  return ncclRedOpDestroy(ncclSum, e->comm);
}

/*
 * The next two need a valid operator first. When making it (or destroying it
 * the first time) fails, they return ncclInternalError, which no check
 * expects: the case fails and shows ncclGetLastError's text.
 */

/* An operator created for float, used with half. */
static ncclResult_t call_premul_wrong_type(struct err_env* e) {
  float scalar = 2.0f;
  ncclRedOp_t op;
  if (ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, e->comm) !=
      ncclSuccess)
    return ncclInternalError;
  ncclResult_t res =
      ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat16, op, e->comm, e->stream);
  if (ncclRedOpDestroy(op, e->comm) != ncclSuccess) return ncclInternalError;
  return res;
}

static ncclResult_t call_destroy_op_twice(struct err_env* e) {
  float scalar = 2.0f;
  ncclRedOp_t op;
  if (ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, e->comm) !=
          ncclSuccess ||
      ncclRedOpDestroy(op, e->comm) != ncclSuccess)
    return ncclInternalError;
  return ncclRedOpDestroy(op, e->comm);
}

/*
 * A refusal's message (ncclGetLastError) must name the function that refused and the argument
 * that is wrong: `fn` and `arg` must both appear in it. `arg` is the word the message uses for
 * the argument (the parameter's name, or what it is: "operator" for op); NULL where the function
 * takes no argument. `comm_less`: the call has no communicator to ask for its last error (or a
 * NULL one), so the message is the calling thread's (ncclGetLastError(NULL)).
 */
struct err_case {
  const char* name;
  ncclResult_t want;
  err_call_fn call;
  const char* fn;
  const char* arg;
  int other_gpu; /* needs a second GPU */
  int comm_less;
};

static const struct err_case err_cases[] = {
    {"AllReduce with a NULL sendbuff", ncclInvalidArgument, call_null_send, "ncclAllReduce",
     "sendbuff", 0, 0},
    {"AllReduce with a NULL recvbuff", ncclInvalidArgument, call_null_recv, "ncclAllReduce",
     "recvbuff", 0, 0},
    {"AllReduce with datatype ncclNumTypes", ncclInvalidArgument, call_type_too_large,
     "ncclAllReduce", "datatype", 0, 0},
    {"AllGather with datatype -1", ncclInvalidArgument, call_type_negative, "ncclAllGather",
     "datatype", 0, 0},
    {"AllReduce with an operator never created", ncclInvalidArgument, call_op_never_created,
     "ncclAllReduce", "operator", 0, 0},
    {"AllReduce with a PreMulSum operator of another type", ncclInvalidArgument,
     call_premul_wrong_type, "ncclAllReduce", "operator", 0, 0},
    {"Broadcast with root = nranks", ncclInvalidArgument, call_broadcast_root_nranks,
     "ncclBroadcast", "root", 0, 0},
    {"Reduce with root -1", ncclInvalidArgument, call_reduce_root_negative, "ncclReduce", "root", 0,
     0},
    {"Gather with root = nranks", ncclInvalidArgument, call_gather_root_nranks, "ncclGather",
     "root", 0, 0},
    {"Scatter with root = nranks", ncclInvalidArgument, call_scatter_root_nranks, "ncclScatter",
     "root", 0, 0},
    {"Send to peer = nranks", ncclInvalidArgument, call_send_peer_nranks, "ncclSend", "peer", 0, 0},
    {"Recv from peer -1", ncclInvalidArgument, call_recv_peer_negative, "ncclRecv", "peer", 0, 0},
    {"AllReduce on a NULL communicator", ncclInvalidArgument, call_null_comm, "ncclAllReduce",
     "comm is NULL", 0, 1},
    {"AllReduce with sendbuff on the other GPU", ncclInvalidArgument, call_send_other_gpu,
     "ncclAllReduce", "sendbuff", 1, 0},
    {"AllReduce with recvbuff on the other GPU", ncclInvalidArgument, call_recv_other_gpu,
     "ncclAllReduce", "recvbuff", 1, 0},
    {"AllReduce reading past the end of sendbuff's allocation", ncclInvalidArgument,
     call_send_past_end, "ncclAllReduce", "sendbuff", 0, 0},
    {"AllGather writing past the end of recvbuff's allocation", ncclInvalidArgument,
     call_recv_past_end, "ncclAllGather", "recvbuff", 0, 0},
    {"Send reading past the end of its buffer's allocation", ncclInvalidArgument,
     call_sendp2p_past_end, "ncclSend", "sendbuff", 0, 0},
    {"AlltoAll writing past the end of recvbuff's allocation", ncclInvalidArgument,
     call_alltoall_past_end, "ncclAlltoAll", "recvbuff", 0, 0},
    {"AllReduce with count SIZE_MAX", ncclInvalidArgument, call_count_overflow, "ncclAllReduce",
     "count", 0, 0},
    {"ReduceScatter whose byte count overflows size_t", ncclInvalidArgument,
     call_count_overflow_bytes, "ncclReduceScatter", "count", 0, 0},
    {"Gather whose byte count overflows size_t", ncclInvalidArgument, call_gather_count_overflow,
     "ncclGather", "count", 0, 0},
    /* ncclBcast's parameter is `buff`; the message may call it sendbuff or recvbuff. */
    {"Bcast with a NULL buffer", ncclInvalidArgument, call_bcast_null, "ncclBcast", "buff", 0, 0},
    {"Scatter with a NULL recvbuff", ncclInvalidArgument, call_scatter_recv_null, "ncclScatter",
     "recvbuff", 0, 0},
    {"Reduce with operator -1", ncclInvalidArgument, call_reduce_op_negative, "ncclReduce",
     "operator", 0, 0},
    {"ncclRedOpCreatePreMulSum with a NULL scalar", ncclInvalidArgument, call_premul_null_scalar,
     "ncclRedOpCreatePreMulSum", "scalar", 0, 0},
    {"ncclRedOpCreatePreMulSum with datatype ncclNumTypes", ncclInvalidArgument,
     call_premul_bad_type, "ncclRedOpCreatePreMulSum", "datatype", 0, 0},
    {"ncclCommRegister with a NULL handle", ncclInvalidArgument, call_register_null_handle,
     "ncclCommRegister", "handle", 0, 0},
    {"ncclCommRegister of 0 bytes", ncclInvalidArgument, call_register_zero_size,
     "ncclCommRegister", "size", 0, 0},
    {"ncclCommRegister of the other GPU's buffer", ncclInvalidArgument, call_register_other_gpu,
     "ncclCommRegister", "buff", 1, 0},
    {"ncclCommDeregister of a handle it never gave", ncclInvalidArgument, call_deregister_unknown,
     "ncclCommDeregister", "handle", 0, 0},
    {"ncclCommWindowRegister with unknown flags", ncclInvalidArgument, call_window_bad_flags,
     "ncclCommWindowRegister", "winFlags", 0, 0},
    {"ncclCommSplit with a NULL newcomm", ncclInvalidArgument, call_split_null_newcomm,
     "ncclCommSplit", "newcomm", 0, 0},
    /* One rank: a list of one is already too long (excludeRanksCount), whatever it holds. */
    {"ncclCommShrink excluding rank 5 of 1", ncclInvalidArgument, call_shrink_rank_out_of_range,
     "ncclCommShrink", "excludeRanks", 0, 0},
    {"ncclCommRevoke with unknown flags", ncclInvalidArgument, call_revoke_bad_flags,
     "ncclCommRevoke", "revokeFlags", 0, 0},
    {"ncclCommUserRank with a NULL rank", ncclInvalidArgument, call_query_null, "ncclCommUserRank",
     "rank", 0, 0},
    {"ncclMemFree of host memory", ncclUnhandledCudaError, call_memfree_host, "ncclMemFree", "ptr",
     0, 1},
    {"ncclCommInitAll on a device that does not exist", ncclInvalidArgument,
     call_initall_no_such_device, "ncclCommInitAll", "devlist", 0, 1},
    {"ncclCommInitAll with one device twice", ncclInvalidArgument, call_initall_device_twice,
     "ncclCommInitAll", "devlist", 0, 1},
    {"ncclCommInitRankConfig with blocking = 2", ncclInvalidArgument, call_init_bad_config,
     "ncclCommInitRankConfig", "blocking", 0, 1},
    {"ncclCommInitRank with an id not made by Braid", ncclInvalidArgument, call_init_id_not_braid,
     "ncclCommInitRank", "ncclUniqueId", 0, 1},
    {"ncclGroupEnd without ncclGroupStart", ncclInvalidUsage, call_group_end_unmatched,
     "ncclGroupEnd", NULL, 0, 1},
    {"ncclRedOpDestroy of ncclSum", ncclInvalidArgument, call_destroy_builtin_op,
     "ncclRedOpDestroy", "operator", 0, 0},
    {"ncclRedOpDestroy twice", ncclInvalidArgument, call_destroy_op_twice, "ncclRedOpDestroy",
     "operator", 0, 0},
};

/*
 * Checks that `got` is `want` and that a refusal left a message (ncclGetLastError(comm); comm
 * may be NULL) naming the function `fn` and the wrong argument `arg` (NULL: none to name).
 */
static void err_expect(struct gpu_world* w, ncclResult_t got, ncclResult_t want, ncclComm_t comm,
                       const char* fn, const char* arg) {
  const char* last = ncclGetLastError(comm);
  if (got != want)
    world_case_fail(w, "returned %d (%s), expected %d (%s); ncclGetLastError: %s", (int)got,
                    ncclGetErrorString(got), (int)want, ncclGetErrorString(want),
                    last && *last ? last : "(empty)");
  else if (want != ncclSuccess && (last == NULL || *last == '\0'))
    world_case_fail(w, "returned %s as it should, but ncclGetLastError is empty",
                    ncclGetErrorString(got));
  else if (want != ncclSuccess && (strstr(last, fn) == NULL || (arg && strstr(last, arg) == NULL)))
    world_case_fail(w, "returned %s as it should, but the message does not name %s%s%s: %s",
                    ncclGetErrorString(got), fn, arg ? " and " : "", arg ? arg : "", last);
  else if (w->opts->verbose)
    fprintf(stderr, "     ncclGetLastError: %s\n", last ? last : "(NULL)");
}

/* Begins the case "Errors: <what>"; returns the environment when it is to run. */
static struct err_env* err_begin(struct gpu_world* w, struct err_env* e, const char* what) {
  char name[sizeof w->case_name];
  snprintf(name, sizeof name, "Errors: %s mode=%s", what, w->opts->mode);
  if (!world_case_begin(w, name)) return NULL;
  if (err_env_get(w, e) != NULL) return e;
  world_case_fail(w, "no one-rank communicator to test with");
  world_case_end(w);
  return NULL;
}

static void err_simple(struct gpu_world* w, struct err_env* env, const struct err_case* c) {
  struct err_env* e = err_begin(w, env, c->name);
  if (e == NULL) return;
  if (c->other_gpu && e->other_dev < 0) {
    world_case_end_skipped(w, "needs a second GPU");
    return;
  }
  err_expect(w, c->call(e), c->want, c->comm_less ? NULL : e->comm, c->fn, c->arg);
  world_case_end(w);
}

/* ---- groups and teardown
 * --------------------------------------------------------------------------- */

/* A refused call inside a group makes ncclGroupEnd fail; the next group must work normally. */
static void err_in_group(struct gpu_world* w, struct err_env* env) {
  struct err_env* e =
      err_begin(w, env, "a refused call inside a group fails ncclGroupEnd; the next group works");
  if (e == NULL) return;
  if (world_group_start(w) == 0) {
    err_expect(w, call_null_send(e), ncclInvalidArgument, e->comm, "ncclAllReduce", "sendbuff");
    ncclResult_t end = ncclGroupEnd();
    if (end == ncclSuccess)
      world_case_fail(w, "ncclGroupEnd returned ncclSuccess after a refused call in its group");
    err_valid_call(w, e, 1);
  }
  world_case_end(w);
}

/* Destroying a communicator with a call pending in the open group is refused; the group still runs.
 */
static void err_destroy_in_group(struct gpu_world* w, struct err_env* env) {
  struct err_env* e = err_begin(w, env, "ncclCommDestroy inside an open group with a pending call");
  float host[ERR_COUNT];
  if (e == NULL) return;
  if (world_cuda(w, cudaMemset(e->recv, GPU_POISON, sizeof host), "cudaMemset") == 0 &&
      world_cuda(w, cudaDeviceSynchronize(), "cudaDeviceSynchronize") == 0 &&
      world_group_start(w) == 0) {
    world_nccl(w,
               ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, ncclSum, e->comm, e->stream),
               e->comm, "ncclAllReduce");
    err_expect(w, ncclCommDestroy(e->comm), ncclInvalidUsage, e->comm, "ncclCommDestroy",
               "open group");
    if (world_group_end(w) == 0 &&
        world_cuda(w, cudaStreamSynchronize(e->stream), "cudaStreamSynchronize") == 0 &&
        world_cuda(w, cudaMemcpy(host, e->recv, sizeof host, cudaMemcpyDeviceToHost),
                   "cudaMemcpy") == 0 &&
        host[ERR_COUNT - 1] != (float)ERR_COUNT)
      world_case_fail(w, "the pending AllReduce did not run after the refused destroy");
  }
  world_case_end(w);
}

/*
 * Checks that the call `what` returned `want`; when `text` is given, the message must name the
 * problem with `text` and the function: `what`'s first word ("ncclCommCount after destroy").
 */
static void err_expect_text(struct gpu_world* w, ncclResult_t got, ncclResult_t want,
                            ncclComm_t comm, const char* what, const char* text) {
  const char* last = ncclGetLastError(comm);
  char fn[64];
  snprintf(fn, sizeof fn, "%.*s", (int)strcspn(what, " "), what);
  if (got != want)
    world_case_fail(w, "%s returned %s, expected %s; ncclGetLastError: %s", what,
                    ncclGetErrorString(got), ncclGetErrorString(want), last ? last : "(NULL)");
  else if (text != NULL &&
           (last == NULL || strstr(last, text) == NULL || strstr(last, fn) == NULL))
    world_case_fail(w, "%s: the message does not say '%s' or does not name %s: %s", what, text,
                    fn, last ? last : "(NULL)");
}

/* A one-rank communicator of its own on the environment's GPU; NULL after a failure. */
static ncclComm_t err_new_comm(struct gpu_world* w, struct err_env* e) {
  ncclComm_t c = NULL;
  if (world_nccl(w, ncclCommInitAll(&c, 1, &e->dev), NULL, "ncclCommInitAll (one rank)") != 0)
    return NULL;
  return c;
}

#define STALE "not a live communicator"

/* Calls on a destroyed communicator, and destroying it twice, are refused without a crash. */
static void err_use_after_destroy(struct gpu_world* w, struct err_env* env) {
  struct err_env* e = err_begin(w, env, "use after ncclCommDestroy, and a second destroy");
  ncclComm_t c;
  int x;
  if (e == NULL) return;
  if ((c = err_new_comm(w, e)) != NULL) {
    err_expect_text(w, ncclCommDestroy(c), ncclSuccess, NULL, "ncclCommDestroy", NULL);
    err_expect_text(w,
                    ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, ncclSum, c, e->stream),
                    ncclInvalidArgument, c, "ncclAllReduce after destroy", STALE);
    err_expect_text(w, ncclSend(e->send, ERR_COUNT, ncclFloat32, 0, c, e->stream),
                    ncclInvalidArgument, c, "ncclSend after destroy", STALE);
    err_expect_text(w, ncclCommCount(c, &x), ncclInvalidArgument, c, "ncclCommCount after destroy",
                    STALE);
    err_expect_text(w, ncclCommDestroy(c), ncclInvalidArgument, c, "ncclCommDestroy again",
                    STALE);
    err_expect_text(w, ncclCommAbort(c), ncclInvalidArgument, c, "ncclCommAbort after destroy",
                    STALE);
  }
  world_case_end(w);
}

/* Abort frees the communicator as destroy does: a destroy after it is refused. */
static void err_destroy_after_abort(struct gpu_world* w, struct err_env* env) {
  struct err_env* e = err_begin(w, env, "ncclCommDestroy after ncclCommAbort");
  ncclComm_t c;
  if (e == NULL) return;
  if ((c = err_new_comm(w, e)) != NULL) {
    err_expect_text(w, ncclCommAbort(c), ncclSuccess, NULL, "ncclCommAbort", NULL);
    err_expect_text(w, ncclCommDestroy(c), ncclInvalidArgument, c, "ncclCommDestroy after abort",
                    STALE);
  }
  world_case_end(w);
}

/* A finalized communicator takes no more work; it can still be queried and destroyed. */
static void err_after_finalize(struct gpu_world* w, struct err_env* env) {
  struct err_env* e = err_begin(w, env, "collectives after ncclCommFinalize");
  ncclComm_t c;
  int n = 0;
  if (e == NULL) return;
  if ((c = err_new_comm(w, e)) != NULL) {
    err_expect_text(w, ncclCommFinalize(c), ncclSuccess, NULL, "ncclCommFinalize", NULL);
    err_expect_text(w, ncclCommFinalize(c), ncclInvalidArgument, NULL, "ncclCommFinalize again",
                    "finalized already");
    err_expect_text(w,
                    ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, ncclSum, c, e->stream),
                    ncclInvalidUsage, c, "ncclAllReduce after finalize", "finalized");
    err_expect_text(w, ncclCommCount(c, &n), ncclSuccess, c, "ncclCommCount after finalize", NULL);
    err_expect_text(w, ncclCommDestroy(c), ncclSuccess, NULL, "ncclCommDestroy after finalize",
                    NULL);
  }
  world_case_end(w);
}

/*
 * A communicator whose init failed: two nonblocking inits that disagree
 * about nranks. The rendezvous keeps the nranks of the first join and refuses
 * the other join alone (a stranger's join must not end the job): that handle
 * reports the error, refuses work and splits naming the failure, and is
 * destroyed. The first rank waits on for the ranks it was promised (until
 * BRAID_BOOTSTRAP_TIMEOUT), so it is still in progress, and an abort ends it.
 */
static void err_init_failed(struct gpu_world* w, struct err_env* env) {
  struct err_env* e = err_begin(w, env, "calls on a communicator whose nonblocking init failed");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t c[2] = {NULL, NULL}, child = NULL;
  ncclResult_t async[2] = {ncclInProgress, ncclInProgress};
  ncclUniqueId id;
  int refused = -1;
  if (e == NULL) return;
  config.blocking = 0;
  if (world_nccl(w, ncclGetUniqueId(&id), NULL, "ncclGetUniqueId") != 0) goto done;
  for (int i = 0; i < 2; i++) {
    ncclResult_t r = ncclCommInitRankConfig(&c[i], 2 + i, id, i, &config);
    if (r != ncclInProgress && r != ncclSuccess) /* a nonblocking init reports at the handle */
      world_case_fail(w, "nonblocking init %d returned %s; expected ncclInProgress", i,
                      ncclGetErrorString(r));
  }
  if (c[0] == NULL || c[1] == NULL) goto done;
  for (double start = world_now(); refused < 0 && world_now() - start < 30.0;) {
    for (int i = 0; i < 2 && refused < 0; i++)
      if (ncclCommGetAsyncError(c[i], &async[i]) != ncclSuccess || async[i] != ncclInProgress)
        refused = i;
    if (refused < 0) usleep(1000);
  }
  if (refused < 0) {
    world_case_fail(w, "neither init was refused within 30 s");
    goto done;
  }
  int waiting = 1 - refused;
  if (async[refused] != ncclInvalidArgument)
    world_case_fail(w, "rank %d's async error is %s, expected ncclInvalidArgument (%s)", refused,
                    ncclGetErrorString(async[refused]), ncclGetLastError(c[refused]));
  if (strstr(ncclGetLastError(c[refused]), "same nranks") == NULL)
    world_case_fail(w, "rank %d's last error does not say the ranks disagree: %s", refused,
                    ncclGetLastError(c[refused]));
  err_expect_text(w,
                  ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, ncclSum, c[refused],
                                e->stream),
                  ncclInvalidUsage, c[refused], "ncclAllReduce after a failed init", "same nranks");
  err_expect_text(w, ncclCommSplit(c[refused], 0, 0, &child, NULL), ncclInvalidUsage, c[refused],
                  "ncclCommSplit after a failed init", "failed");
  if (child != NULL) world_case_fail(w, "a refused split gave a communicator");
  if (ncclCommGetAsyncError(c[waiting], &async[waiting]) != ncclSuccess ||
      async[waiting] != ncclInProgress)
    world_case_fail(w, "the rank that joined first (%d) stopped waiting: %s (%s)", waiting,
                    ncclGetErrorString(async[waiting]), ncclGetLastError(c[waiting]));
  double t0 = world_now();
  err_expect_text(w, ncclCommAbort(c[waiting]), ncclSuccess, NULL,
                  "ncclCommAbort of an init waiting for its ranks", NULL);
  if (world_now() - t0 > 10.0)
    world_case_fail(w, "ncclCommAbort of a waiting init took %.1f s", world_now() - t0);
  c[waiting] = NULL;
done:
  for (int i = 0; i < 2; i++) {
    if (c[i] == NULL) continue;
    if (i == refused)
      err_expect_text(w, ncclCommDestroy(c[i]), ncclSuccess, NULL,
                      "ncclCommDestroy after a failed init", NULL);
    else /* still waiting for its ranks (a failed case above): a destroy would wait too */
      (void)ncclCommAbort(c[i]);
  }
  world_case_end(w);
}

static void err_still_works(struct gpu_world* w, struct err_env* env) {
  struct err_env* e = err_begin(w, env, "the communicator still works after the refused calls");
  if (e == NULL) return;
  err_valid_call(w, e, 0);
  world_case_end(w);
}

/*
 * As NCCL: a failed group is the async error of its nonblocking comms (a nonblocking caller
 * learns the outcome from ncclCommGetAsyncError); the blocking comm of the environment is not
 * touched by it (err_in_group: it works after such a group).
 */
static void err_group_nonblocking(struct gpu_world* w, struct err_env* env) {
  struct err_env* e =
      err_begin(w, env, "a failed group is the async error of its nonblocking communicator");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t nb = NULL;
  ncclUniqueId id;
  ncclResult_t async = ncclInProgress;
  if (e == NULL) return;
  config.blocking = 0;
  if (world_nccl(w, ncclGetUniqueId(&id), NULL, "ncclGetUniqueId") != 0) goto done;
  ncclResult_t r = ncclCommInitRankConfig(&nb, 1, id, 0, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    world_nccl(w, r, NULL, "ncclCommInitRankConfig (nonblocking, one rank)");
    goto done;
  }
  for (double start = world_now(); ncclCommGetAsyncError(nb, &async) == ncclSuccess &&
                                   async == ncclInProgress && world_now() - start < 30.0;)
    usleep(1000);
  if (world_nccl(w, async, nb, "the nonblocking init") != 0 || world_group_start(w) != 0) goto done;
  r = ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, ncclSum, nb, e->stream);
  if (r != ncclSuccess && r != ncclInProgress) world_nccl(w, r, nb, "ncclAllReduce (in the group)");
  err_expect(w, ncclAllReduce(NULL, e->recv, ERR_COUNT, ncclFloat32, ncclSum, nb, e->stream),
             ncclInvalidArgument, nb, "ncclAllReduce", "sendbuff");
  r = ncclGroupEnd();
  if (r != ncclInvalidArgument)
    world_case_fail(w, "ncclGroupEnd returned %s, expected ncclInvalidArgument",
                    ncclGetErrorString(r));
  if (ncclCommGetAsyncError(nb, &async) != ncclSuccess || async != ncclInvalidArgument)
    world_case_fail(w,
                    "the nonblocking comm's async error after the failed group is %s, "
                    "expected ncclInvalidArgument",
                    ncclGetErrorString(async));
  err_expect_text(w,
                  ncclAllReduce(e->send, e->recv, ERR_COUNT, ncclFloat32, ncclSum, nb, e->stream),
                  ncclInvalidArgument, nb, "ncclAllReduce after the failed group", "failed");
  if (ncclCommGetAsyncError(e->comm, &async) != ncclSuccess || async != ncclSuccess)
    world_case_fail(w, "the blocking comm's async error is %s", ncclGetErrorString(async));
done:
  if (nb != NULL) world_nccl(w, ncclCommAbort(nb), NULL, "ncclCommAbort");
  world_case_end(w);
}

/*
 * A buffer of this GPU that a call accepted, freed, and its addresses handed out again by the other
 * GPU's cudaMalloc: the library must not accept them from what it remembers of the first buffer.
 * Whether the driver reuses the addresses is its choice: when none of a few allocations lands on
 * them, there is nothing to check and the case ends skipped.
 */
#define ERR_REUSE_BYTES ((size_t)64 << 20)
#define ERR_REUSE_TRIES 8
static void err_reused_addresses(struct gpu_world* w, struct err_env* env) {
  struct err_env* e =
      err_begin(w, env, "AllReduce on the other GPU's buffer at a freed buffer's addresses");
  if (e == NULL) return;
  void* mine = NULL;
  void* tries[ERR_REUSE_TRIES] = {0};
  int reused = -1;
  size_t n = ERR_REUSE_BYTES / sizeof(float);
  const char* skip = NULL;
  if (e->other_dev < 0) {
    skip = "needs a second GPU";
    goto out;
  }
  if (world_cuda(w, cudaSetDevice(e->dev), "cudaSetDevice") ||
      world_cuda(w, cudaMalloc(&mine, ERR_REUSE_BYTES), "cudaMalloc") ||
      world_nccl(w, ncclAllReduce(mine, mine, n, ncclFloat32, ncclSum, e->comm, e->stream), e->comm,
                 "ncclAllReduce (this GPU's buffer)") ||
      world_cuda(w, cudaStreamSynchronize(e->stream), "cudaStreamSynchronize") ||
      world_cuda(w, cudaFree(mine), "cudaFree") ||
      world_cuda(w, cudaSetDevice(e->other_dev), "cudaSetDevice"))
    goto out;
  for (int i = 0; reused < 0 && i < ERR_REUSE_TRIES; i++) {
    if (world_cuda(w, cudaMalloc(&tries[i], ERR_REUSE_BYTES), "cudaMalloc (other GPU)")) break;
    if (tries[i] == mine) reused = i;
  }
  if (world_cuda(w, cudaSetDevice(e->dev), "cudaSetDevice")) goto out;
  if (reused < 0)
    skip = "the other GPU's allocations did not reuse the freed addresses: nothing to check";
  else
    err_expect(
        w,
        ncclAllReduce(tries[reused], e->recv, ERR_COUNT, ncclFloat32, ncclSum, e->comm, e->stream),
        ncclInvalidArgument, e->comm, "ncclAllReduce", "sendbuff");
out:
  for (int i = 0; i < ERR_REUSE_TRIES; i++)
    if (tries[i] != NULL && cudaSetDevice(e->other_dev) == cudaSuccess) cudaFree(tries[i]);
  cudaSetDevice(e->dev);
  if (skip)
    world_case_end_skipped(w, skip);
  else
    world_case_end(w);
}

void suite_errors(struct gpu_world* w) {
  struct err_env env;
  memset(&env, 0, sizeof env);
  for (size_t i = 0; i < ARRAY_LEN(err_cases); i++) err_simple(w, &env, &err_cases[i]);
  err_reused_addresses(w, &env);
  err_in_group(w, &env);
  err_group_nonblocking(w, &env);
  err_destroy_in_group(w, &env);
  err_use_after_destroy(w, &env);
  err_destroy_after_abort(w, &env);
  err_after_finalize(w, &env);
  err_init_failed(w, &env);
  err_still_works(w, &env);
  err_env_teardown(w, &env);
}
