/*
 * The binary interface of NCCL's tuner plugins, as NCCL 2.28 loads them:
 * the exported symbols ncclTunerPlugin_v5 down to ncclTunerPlugin_v2, each
 * a struct of a name and three functions. Declared here from NCCL's public
 * plugin headers (src/include/plugin/tuner/tuner_v2.h ... tuner_v5.h and
 * nccl_tuner.h); only tune_plugin.c reads them. Enumerations passed by
 * value are plain ints, as the C ABI passes them.
 */
#ifndef BRAID_GRAPH_TUNE_PLUGIN_ABI_H
#define BRAID_GRAPH_TUNE_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* ncclFunc_t: the collectives a tuner is asked about (send/receive never is). */
enum {
  TUNER_FUNC_BROADCAST = 0,
  TUNER_FUNC_REDUCE = 1,
  TUNER_FUNC_ALLGATHER = 2,
  TUNER_FUNC_REDUCESCATTER = 3,
  TUNER_FUNC_ALLREDUCE = 4
};

/* The cost table NCCL hands getCollInfo: float[algorithm][protocol], µs, NCCL's numbering. */
enum {
  TUNER_ALGO_TREE = 0,
  TUNER_ALGO_RING = 1,
  TUNER_ALGO_COLLNET_DIRECT = 2,
  TUNER_ALGO_COLLNET_CHAIN = 3,
  TUNER_ALGO_NVLS = 4,
  TUNER_ALGO_NVLS_TREE = 5,
  TUNER_ALGO_PAT = 6,
  TUNER_NUM_ALGOS = 7
};
enum { TUNER_PROTO_LL = 0, TUNER_PROTO_LL128 = 1, TUNER_PROTO_SIMPLE = 2, TUNER_NUM_PROTOS = 3 };
/* NCCL_ALGO_PROTO_IGNORE: an entry that is not a candidate. Selection takes entries >= 0. */
#define TUNER_COST_IGNORE (-1.0f)

/* ncclDebugLogger_t; level: 0 none, 1 version, 2 warn, 3 info, 4 abort, 5 trace. */
typedef void (*tuner_logger_t)(int level, unsigned long flags, const char* file, int line,
                               const char* fmt, ...);
/* NCCL's subsystem flags past the ones Braid numbers alike (INIT 0x1 ... PROXY 0x400). */
#define TUNER_LOG_SAME_BITS 0x7fful
#define TUNER_LOG_BOOTSTRAP 0x1000ul
#define TUNER_LOG_REG 0x2000ul

/* ncclNvlDomainInfo_v5_t */
typedef struct {
  int n_nvl_domains;
  int min_ranks_per_nvl_domain;
  int max_ranks_per_nvl_domain;
} tuner_nvl_domain_info_v5_t;

/* ncclTunerConstants_v5_t: NCCL's model constants, [hw link][algorithm][protocol] etc. */
#define TUNER_NUM_HW_LINKS 3 /* NVLink, PCI, network */
#define TUNER_NUM_COMPCAPS 4
#define TUNER_NUM_SCALES 3
typedef struct {
  double base_latencies[TUNER_NUM_ALGOS][TUNER_NUM_PROTOS];
  double hw_latencies[TUNER_NUM_HW_LINKS][TUNER_NUM_ALGOS][TUNER_NUM_PROTOS];
  double ll_max_bws[TUNER_NUM_COMPCAPS][TUNER_NUM_SCALES];
  double per_ch_max_ring_ll128_bws[TUNER_NUM_COMPCAPS][TUNER_NUM_SCALES];
  double per_ch_max_tree_ll128_bws[TUNER_NUM_COMPCAPS][TUNER_NUM_SCALES];
  double per_ch_max_tree_bws[TUNER_NUM_COMPCAPS][TUNER_NUM_SCALES];
  double per_ch_max_nvls_tree_bws[TUNER_NUM_COMPCAPS][TUNER_NUM_SCALES];
} tuner_constants_v5_t;
_Static_assert(sizeof(tuner_constants_v5_t) == 1152, "ncclTunerConstants_v5_t is 1152 bytes");

/* ncclTuner_v5_t: init gets the comm id, NVLink domains and the constants; finalize ends. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t comm_id, size_t nranks, size_t nnodes,
                       tuner_logger_t log, tuner_nvl_domain_info_v5_t* nvl_domains,
                       tuner_constants_v5_t* constants);
  ncclResult_t (*get_coll_info)(void* ctx, int coll, size_t bytes, int num_pipe_ops,
                                float** cost_table, int num_algo, int num_proto, int reg_buff,
                                int* nchannels);
  ncclResult_t (*finalize)(void* ctx);
} tuner_v5_t;

/* ncclTuner_v4_t: init(nRanks, nNodes, logger, &ctx); the same getCollInfo; destroy. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nranks, size_t nnodes, tuner_logger_t log, void** ctx);
  ncclResult_t (*get_coll_info)(void* ctx, int coll, size_t bytes, int num_pipe_ops,
                                float** cost_table, int num_algo, int num_proto, int reg_buff,
                                int* nchannels);
  ncclResult_t (*destroy)(void* ctx);
} tuner_v4_t;

/* ncclTuner_v3_t: as v4 without regBuff. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nranks, size_t nnodes, tuner_logger_t log, void** ctx);
  ncclResult_t (*get_coll_info)(void* ctx, int coll, size_t bytes, int num_pipe_ops,
                                float** cost_table, int num_algo, int num_proto, int* nchannels);
  ncclResult_t (*destroy)(void* ctx);
} tuner_v3_t;

/* ncclTuner_v2_t: getCollInfo names an algorithm and protocol instead of editing a table. */
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nranks, size_t nnodes, tuner_logger_t log, void** ctx);
  ncclResult_t (*get_coll_info)(void* ctx, int coll, size_t bytes, int collnet_support,
                                int nvls_support, int num_pipe_ops, int* algorithm, int* protocol,
                                int* nchannels);
  ncclResult_t (*destroy)(void* ctx);
} tuner_v2_t;

#endif
