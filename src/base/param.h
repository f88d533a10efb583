/*
 * Braid's configuration: every environment variable the library reads is one
 * row of the table in param.c (name, NCCL alias, type, default, help). Code
 * asks for a value by its id; nothing else calls getenv.
 *
 * Values are read from the environment once, on first use, and cached;
 * braid_param_reload() re-reads them (used by tests and ncclResetDebugInit).
 */
#ifndef BRAID_CORE_PARAM_H
#define BRAID_CORE_PARAM_H

#include <stdint.h>
#include <stdio.h>

typedef enum { BRAID_PARAM_INT, BRAID_PARAM_STRING } braid_param_type_t;

/* Where a parameter's current value came from. */
typedef enum {
  BRAID_PARAM_FROM_DEFAULT = 0,
  BRAID_PARAM_FROM_BRAID_ENV = 1, /* BRAID_<name> */
  BRAID_PARAM_FROM_NCCL_ENV = 2   /* the NCCL alias */
} braid_param_source_t;

/* One id per row of the table in param.c (rows are indexed by these ids). */
typedef enum {
  BRAID_P_DEBUG,
  BRAID_P_DEBUG_SUBSYS,
  BRAID_P_DEBUG_FILE,
  BRAID_P_SOCKET_IFNAME,
  BRAID_P_SOCKET_FAMILY,
  BRAID_P_SOCKET_KEEPALIVE_SEC,
  BRAID_P_COMM_ID,
  BRAID_P_COMM_SECRET,
  BRAID_P_BOOTSTRAP_TIMEOUT,
  BRAID_P_HOSTID,
  BRAID_P_TIMEOUT,
  BRAID_P_HANG_WARN,
  BRAID_P_CHECK,
  BRAID_P_ALGO,
  BRAID_P_PROTO,
  BRAID_P_TUNER_PLUGIN,
  BRAID_P_PROFILER_PLUGIN,
  BRAID_P_PROFILE_EVENT_MASK,
  BRAID_P_P2P_DISABLE,
  BRAID_P_P2P_READ,
  BRAID_P_P2P_LEVEL,
  BRAID_P_CUMEM_ENABLE,
  BRAID_P_IPC_FD_PASSING,
  BRAID_P_IPC_FABRIC,
  BRAID_P_SHM_DISABLE,
  BRAID_P_NET,
  BRAID_P_NET_PLUGIN,
  BRAID_P_IB_HCA,
  BRAID_P_IB_GID_INDEX,
  BRAID_P_IB_VERBS_LIB,
  BRAID_P_IB_DISABLE,
  BRAID_P_IB_TIMEOUT,
  BRAID_P_IB_RETRY_CNT,
  BRAID_P_IB_TC,
  BRAID_P_IB_SL,
  BRAID_P_IB_QPS_PER_CONNECTION,
  BRAID_P_IB_ADAPTIVE_ROUTING,
  BRAID_P_IB_AR_THRESHOLD,
  BRAID_P_IB_PCI_RELAXED_ORDERING,
  BRAID_P_CROSS_NIC,
  BRAID_P_NET_GDR_LEVEL,
  BRAID_P_SOCKET_NTHREADS,
  BRAID_P_NSOCKS_PERTHREAD,
  BRAID_P_NET_PAIR_MAX,
  BRAID_P_P2P_PAIR_MIN,
  BRAID_P_P2P_PAIR_MAX,
  BRAID_P_SYM_MAX_BYTES,
  BRAID_P_SYM_PULL,
  BRAID_P_ONESHOT_MAX_BYTES,
  BRAID_P_LL128_PAIR_MAX,
  BRAID_P_P2P_LL_MAX,
  BRAID_P_P2P_CHANNEL_BYTES,
  BRAID_P_P2P_SELF_CHANNEL_BYTES,
  BRAID_P_P2P_PEER_SPLIT,
  BRAID_P_CE_MIN_BYTES,
  BRAID_P_CE_SLOT_BYTES,
  BRAID_P_CE_NSLOTS,
  BRAID_P_CE_NBLOCKS,
  BRAID_P_CE_TRACE,
  BRAID_P_CE_FAIL_CONNECT,
  BRAID_P_CE_REG_MIN_BYTES,
  BRAID_P_CE_FAN_MIN_BYTES,
  BRAID_P_LOCAL_REGISTER,
  BRAID_P_OFI_PROVIDER,
  BRAID_P_OFI_HMEM,
  BRAID_P_TOPO_FILE,
  BRAID_P_TOPO_DUMP_FILE,
  BRAID_P_TOPO_BUSID,
  BRAID_P_GRAPH_DUMP_FILE,
  BRAID_P_MIN_NCHANNELS,
  BRAID_P_MAX_NCHANNELS,
  BRAID_P_NTHREADS,
  BRAID_P_SMALL_NTHREADS,
  BRAID_P_BUFFSIZE,
  BRAID_P_P2P_BUFFSIZE,
  BRAID_P_LL128_BUFFSIZE,
  BRAID_P_CHUNKSIZE,
  BRAID_P_SIMPLE_POST_WARP,
  BRAID_P_NVLS_ENABLE,
  BRAID_P_DETERMINISTIC,
  BRAID_P_LAUNCH_MODE,
  BRAID_P_LAUNCH_THREADS,
  BRAID_P_GRAPH_MIXING_SUPPORT,
  BRAID_P_MEM_SYNC_DOMAIN,
  BRAID_P_COMM_BLOCKING,
  BRAID_P_CGA_CLUSTER_SIZE,
  BRAID_P_MIN_CTAS,
  BRAID_P_MAX_CTAS,
  BRAID_P_COMM_SPLIT_SHARE_RESOURCES,
  BRAID_P_COMM_SHRINK_SHARE_RESOURCES,
  BRAID_P_CTA_POLICY,
  BRAID_P_NVLS_NCHANNELS,
  BRAID_P_NCHANNELS_PER_NET_PEER,
  BRAID_P_NVLINK_UTIL_CENTRIC_SCHED_ENABLE,
  BRAID_P_COUNT
} braid_param_id_t;

/*
 * Integer parameters that decide how ranks split, pace or route the data of a call: every rank
 * of a communicator must have the same values, or calls hang or corrupt data. Comm init compares
 * them across ranks and refuses a mix.
 */
#define BRAID_PARAMS_AGREED 16
extern const braid_param_id_t braid_params_agreed[BRAID_PARAMS_AGREED];

/* The value of an integer parameter. A malformed value falls back to the default with a WARN. */
int64_t braid_param_int(braid_param_id_t id);
/* The value of a string parameter, or NULL when unset and without default. Valid until reload. */
const char* braid_param_str(braid_param_id_t id);
/* Where the value came from. */
braid_param_source_t braid_param_source(braid_param_id_t id);
/* The variable it came from, for messages: the NCCL alias when that was set, else BRAID_<name>
 * (in a buffer of the calling thread, until its next call). */
const char* braid_param_var(braid_param_id_t id);
/* Re-read every parameter from the environment. Not thread-safe against concurrent readers. */
void braid_param_reload(void);

/* Reports each malformed environment value once (the logger calls this when it starts). */
void braid_param_report_malformed(void (*report)(const char* name, const char* text,
                                                 const char* def));

/* Table introspection, for braid-info --env. */
int braid_param_count(void);
const char* braid_param_name(int index);       /* "BRAID_DEBUG" */
const char* braid_param_alias(int index);      /* "NCCL_DEBUG" or NULL */
const char* braid_param_help(int index);
const char* braid_param_default(int index);    /* as text, NULL when none */
braid_param_type_t braid_param_type(int index);
/* Writes the table with current values and sources, one parameter per paragraph. */
void braid_param_print_all(FILE* out);

#endif
