/*
 * A tuner plugin for Braid's tests, written against NCCL's tuner interface
 * (tuner_abi.h) and nothing of Braid's. Built once per interface version
 * (TUNER_VERSION 5, 4, 3 or 2) and in two kinds:
 *
 *   forcing (default): all-reduce -> Tree/LL (cost 0 where that entry is a
 *     candidate), all-gather -> Ring/Simple (cost 0 even where it is not
 *     one), reduce -> NVLS/Simple (an algorithm Braid lacks, cost 0 though
 *     NCCL marked it "ignore"); v2 names them instead. Broadcast -> every
 *     entry set to "ignore", reduce-scatter -> an error; v5 also raises one
 *     of the constants init gives it.
 *   TUNER_CHANNELS: the table untouched; all-reduce asks for 3 channels,
 *     all-gather for 1000.
 *
 * Every call checks its context and the table's shape (7 algorithms x 3
 * protocols, NVLS entries ignored) and fails when they are wrong; init and
 * finalize say what they got through the logger NCCL hands them. Init fails
 * for 3 ranks, so that tests see a failing init too.
 */
#include <stdio.h>
#include <stdlib.h>

#include "tuner_abi.h"

#ifndef TUNER_VERSION
#define TUNER_VERSION 5
#endif
#ifdef TUNER_CHANNELS
#define TUNER_KIND "channels"
#else
#define TUNER_KIND "force"
#endif

#define CTX_MAGIC 0x74756e65u

struct force_ctx {
  unsigned magic;
  int calls;
  ncclDebugLogger_t log;
};

static ncclResult_t force_start(size_t nranks, size_t nnodes, ncclDebugLogger_t log, void** ctx) {
  if (nranks == 3) return ncclInternalError; /* so that tests can see a failing init */
  struct force_ctx* c = calloc(1, sizeof *c);
  if (c == NULL) return ncclSystemError;
  c->magic = CTX_MAGIC;
  c->log = log;
  *ctx = c;
  if (log)
    log(NCCL_LOG_INFO, NCCL_TUNING, __FILE__, __LINE__, "%s tuner v%d: init nRanks %zu nNodes %zu",
        TUNER_KIND, TUNER_VERSION, nranks, nnodes);
  return ncclSuccess;
}

static ncclResult_t force_end(void* ctx) {
  struct force_ctx* c = ctx;
  if (c == NULL || c->magic != CTX_MAGIC) return ncclInternalError;
  if (c->log)
    c->log(NCCL_LOG_INFO, NCCL_TUNING, __FILE__, __LINE__, "%s tuner v%d: finalize after %d calls",
           TUNER_KIND, TUNER_VERSION, c->calls);
  c->magic = 0;
  free(c);
  return ncclSuccess;
}

#ifndef TUNER_CHANNELS
/* The forced entry for `coll`, or -1: NCCL's algorithm and protocol numbers. */
static int force_pick(ncclFunc_t coll, int* proto) {
  if (coll == ncclFuncAllReduce) return *proto = NCCL_PROTO_LL, NCCL_ALGO_TREE;
  if (coll == ncclFuncAllGather) return *proto = NCCL_PROTO_SIMPLE, NCCL_ALGO_RING;
  if (coll == ncclFuncReduce) return *proto = NCCL_PROTO_SIMPLE, NCCL_ALGO_NVLS;
  return *proto = -1, -1;
}
#endif

static void force_channels(ncclFunc_t coll, int* nchannels) {
#ifdef TUNER_CHANNELS
  if (coll == ncclFuncAllReduce) *nchannels = 3;
  if (coll == ncclFuncAllGather) *nchannels = 1000;
#else
  (void)coll;
  (void)nchannels;
#endif
}

#if TUNER_VERSION >= 3
static ncclResult_t force_table(void* ctx, ncclFunc_t coll, float** cost_table, int num_algo,
                                int num_proto, int* nchannels) {
  struct force_ctx* c = ctx;
  float(*table)[NCCL_NUM_PROTOCOLS] = (float(*)[NCCL_NUM_PROTOCOLS])cost_table;
  if (c == NULL || c->magic != CTX_MAGIC || num_algo != NCCL_NUM_ALGORITHMS ||
      num_proto != NCCL_NUM_PROTOCOLS ||
      table[NCCL_ALGO_NVLS][NCCL_PROTO_SIMPLE] != NCCL_ALGO_PROTO_IGNORE)
    return ncclInvalidArgument;
  c->calls++;
  force_channels(coll, nchannels);
#ifndef TUNER_CHANNELS
  int proto, algo = force_pick(coll, &proto);
  if (coll == ncclFuncReduceScatter) return ncclInternalError;
  if (coll == ncclFuncBroadcast)
    for (int a = 0; a < num_algo; a++)
      for (int p = 0; p < num_proto; p++) table[a][p] = NCCL_ALGO_PROTO_IGNORE;
  /* All-reduce as a careful plugin would; the others set their entry whatever it held. */
  if (algo >= 0 && (coll != ncclFuncAllReduce || table[algo][proto] != NCCL_ALGO_PROTO_IGNORE))
    table[algo][proto] = 0.0f;
#endif
  return ncclSuccess;
}
#endif

#if TUNER_VERSION == 5
static ncclResult_t force_init_v5(void** ctx, uint64_t comm_id, size_t nranks, size_t nnodes,
                                  ncclDebugLogger_t log, ncclNvlDomainInfo_v5_t* nvl,
                                  ncclTunerConstants_v5_t* constants) {
  ncclResult_t res = force_start(nranks, nnodes, log, ctx);
  if (res != ncclSuccess) return res;
  if (log)
    log(NCCL_LOG_INFO, NCCL_TUNING, __FILE__, __LINE__,
        "%s tuner v5: commId 0x%llx, %d NVLink domains of %d to %d ranks, Ring/Simple base "
        "latency %.1f us",
        TUNER_KIND, (unsigned long long)comm_id, nvl->nNvlDomains, nvl->minRanksPerNvlDomain,
        nvl->maxRanksPerNvlDomain, constants->baseLatencies[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE]);
#ifndef TUNER_CHANNELS
  constants->baseLatencies[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] += 1.0;
#endif
  return ncclSuccess;
}

static ncclResult_t force_get_v5(void* ctx, ncclFunc_t coll, size_t bytes, int num_pipe_ops,
                                 float** cost_table, int num_algo, int num_proto, int reg_buff,
                                 int* nchannels) {
  return force_table(ctx, coll, cost_table, num_algo, num_proto, nchannels);
}

__attribute__((visibility("default"))) const ncclTuner_v5_t ncclTunerPlugin_v5 = {
    .name = "Force", .init = force_init_v5, .getCollInfo = force_get_v5, .finalize = force_end};

#elif TUNER_VERSION == 4
static ncclResult_t force_get_v4(void* ctx, ncclFunc_t coll, size_t bytes, int num_pipe_ops,
                                 float** cost_table, int num_algo, int num_proto, int reg_buff,
                                 int* nchannels) {
  return force_table(ctx, coll, cost_table, num_algo, num_proto, nchannels);
}

__attribute__((visibility("default"))) const ncclTuner_v4_t ncclTunerPlugin_v4 = {
    .name = "Force", .init = force_start, .getCollInfo = force_get_v4, .destroy = force_end};

#elif TUNER_VERSION == 3
static ncclResult_t force_get_v3(void* ctx, ncclFunc_t coll, size_t bytes, int num_pipe_ops,
                                 float** cost_table, int num_algo, int num_proto, int* nchannels) {
  return force_table(ctx, coll, cost_table, num_algo, num_proto, nchannels);
}

__attribute__((visibility("default"))) const ncclTuner_v3_t ncclTunerPlugin_v3 = {
    .name = "Force", .init = force_start, .getCollInfo = force_get_v3, .destroy = force_end};

#elif TUNER_VERSION == 2
static ncclResult_t force_get_v2(void* ctx, ncclFunc_t coll, size_t bytes, int collnet, int nvls,
                                 int num_pipe_ops, int* algorithm, int* protocol, int* nchannels) {
  struct force_ctx* c = ctx;
  if (c == NULL || c->magic != CTX_MAGIC || collnet != 0 || nvls != 0) return ncclInvalidArgument;
  c->calls++;
  force_channels(coll, nchannels);
#ifndef TUNER_CHANNELS
  if (coll == ncclFuncReduceScatter) return ncclInternalError;
  *algorithm = force_pick(coll, protocol);
#endif
  return ncclSuccess;
}

__attribute__((visibility("default"))) const ncclTuner_v2_t ncclTunerPlugin_v2 = {
    .name = "Force", .init = force_start, .getCollInfo = force_get_v2, .destroy = force_end};
#endif
