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
#include <stdio.h>
#include <string.h>

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

struct err_case {
  const char* name;
  ncclResult_t want;
  err_call_fn call;
  int other_gpu; /* needs a second GPU */
};

static const struct err_case err_cases[] = {
    {"AllReduce with a NULL sendbuff", ncclInvalidArgument, call_null_send, 0},
    {"AllReduce with a NULL recvbuff", ncclInvalidArgument, call_null_recv, 0},
    {"AllReduce with datatype ncclNumTypes", ncclInvalidArgument, call_type_too_large, 0},
    {"AllGather with datatype -1", ncclInvalidArgument, call_type_negative, 0},
    {"AllReduce with an operator never created", ncclInvalidArgument, call_op_never_created, 0},
    {"AllReduce with a PreMulSum operator of another type", ncclInvalidArgument,
     call_premul_wrong_type, 0},
    {"Broadcast with root = nranks", ncclInvalidArgument, call_broadcast_root_nranks, 0},
    {"Reduce with root -1", ncclInvalidArgument, call_reduce_root_negative, 0},
    {"Gather with root = nranks", ncclInvalidArgument, call_gather_root_nranks, 0},
    {"Scatter with root = nranks", ncclInvalidArgument, call_scatter_root_nranks, 0},
    {"Send to peer = nranks", ncclInvalidArgument, call_send_peer_nranks, 0},
    {"Recv from peer -1", ncclInvalidArgument, call_recv_peer_negative, 0},
    {"AllReduce on a NULL communicator", ncclInvalidArgument, call_null_comm, 0},
    {"AllReduce with sendbuff on the other GPU", ncclInvalidArgument, call_send_other_gpu, 1},
    {"AllReduce with recvbuff on the other GPU", ncclInvalidArgument, call_recv_other_gpu, 1},
    {"ncclGroupEnd without ncclGroupStart", ncclInvalidUsage, call_group_end_unmatched, 0},
    {"ncclRedOpDestroy of ncclSum", ncclInvalidArgument, call_destroy_builtin_op, 0},
    {"ncclRedOpDestroy twice", ncclInvalidArgument, call_destroy_op_twice, 0},
};

/* Checks that `got` is `want` and that a refusal left a message; comm may be NULL. */
static void err_expect(struct gpu_world* w, ncclResult_t got, ncclResult_t want, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  if (got != want)
    world_case_fail(w, "returned %d (%s), expected %d (%s); ncclGetLastError: %s", (int)got,
                    ncclGetErrorString(got), (int)want, ncclGetErrorString(want),
                    last && *last ? last : "(empty)");
  else if (want != ncclSuccess && (last == NULL || *last == '\0'))
    world_case_fail(w, "returned %s as it should, but ncclGetLastError is empty",
                    ncclGetErrorString(got));
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
  if (c->other_gpu && e->other_dev < 0)
    fprintf(stderr, "note: '%s' needs a second GPU; not run\n", c->name);
  else
    err_expect(w, c->call(e), c->want, c->call == call_null_comm ? NULL : e->comm);
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
    err_expect(w, call_null_send(e), ncclInvalidArgument, e->comm);
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
    err_expect(w, ncclCommDestroy(e->comm), ncclInvalidUsage, e->comm);
    if (world_group_end(w) == 0 &&
        world_cuda(w, cudaStreamSynchronize(e->stream), "cudaStreamSynchronize") == 0 &&
        world_cuda(w, cudaMemcpy(host, e->recv, sizeof host, cudaMemcpyDeviceToHost),
                   "cudaMemcpy") == 0 &&
        host[ERR_COUNT - 1] != (float)ERR_COUNT)
      world_case_fail(w, "the pending AllReduce did not run after the refused destroy");
  }
  world_case_end(w);
}

static void err_still_works(struct gpu_world* w, struct err_env* env) {
  struct err_env* e = err_begin(w, env, "the communicator still works after the refused calls");
  if (e == NULL) return;
  err_valid_call(w, e, 0);
  world_case_end(w);
}

void suite_errors(struct gpu_world* w) {
  struct err_env env;
  memset(&env, 0, sizeof env);
  for (size_t i = 0; i < ARRAY_LEN(err_cases); i++) err_simple(w, &env, &err_cases[i]);
  err_in_group(w, &env);
  err_destroy_in_group(w, &env);
  err_still_works(w, &env);
  err_env_teardown(w, &env);
}
