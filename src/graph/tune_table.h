/*
 * The numbers behind Braid's topology and tuning model, kept in one table
 * (tune_table.c) so that re-measuring a machine means editing one file.
 * Each value there says where it comes from.
 */
#ifndef BRAID_GRAPH_TUNE_TABLE_H
#define BRAID_GRAPH_TUNE_TABLE_H

#include "abi/coll.h"

/* Link classes the latency and efficiency tables are indexed by. */
typedef enum {
  TUNE_LINK_NVL = 0,
  TUNE_LINK_PCI = 1,
  TUNE_LINK_NET = 2,
  TUNE_LINK_CLASSES = 3
} tune_link_class_t;

struct tune_table {
  float loc_bw;              /* GB/s inside one GPU */
  float net_default_bw;      /* GB/s of a NIC whose speed is unknown */
  float chan_bw_max;         /* GB/s one channel (one CTA) is expected to move with Simple */
  int min_channels;          /* channels a communicator gets at least (rings are duplicated) */
  int net_min_channels;      /* channels rings that cross hosts get at least */
  int search_budget;         /* DFS steps the ring search may take, over all attempts */
  int search_segment_budget; /* DFS steps for one ring inside one host */
  float search_min_gain;     /* total a slower ring speed must beat a faster one by */
  float base_lat[BRAID_ALGO_COUNT][BRAID_PROTO_COUNT];   /* µs per call */
  float hop_lat[TUNE_LINK_CLASSES][BRAID_PROTO_COUNT];   /* µs per pipeline step over a hop */
  /* µs more per step of a ring of 3 or more ranks, where a rank forwards what it received */
  float ring_fwd_lat[TUNE_LINK_CLASSES][BRAID_PROTO_COUNT];
  float proto_eff[TUNE_LINK_CLASSES][BRAID_PROTO_COUNT]; /* achieved / modelled link bw */
  float tree_eff;                                        /* tree all-reduce vs its bw */
  float direct_peer_lat; /* µs each peer past the first adds to a direct all-reduce */
  int pair_chunks;       /* two-rank pair exchange over P2P: chunks per channel wanted */
  int pair_chunk_min;    /* ... each of at least this many bytes (at most a FIFO slot) */
  /*
   * Two ranks joined by P2P: smallest size (as nccl-tests counts it; send/receive: the larger
   * message of a pair) that goes through the copy-engine exchange (runtime/ce.c), by collective;
   * 0: never. BRAID_CE_MIN_BYTES set overrides it for every collective.
   */
  long long ce_min_bytes[BRAID_COLL_COUNT];
  int nthreads[BRAID_PROTO_COUNT];                       /* threads per CTA */
  int thread_bytes[BRAID_PROTO_COUNT]; /* bytes per thread below which a channel is not worth it */
  int proto_auto[BRAID_PROTO_COUNT];   /* 1: the model picks it on its own; 0: only when forced */
};

extern const struct tune_table tune_table;

/* Per-link NVLink bandwidth (GB/s) for a GPU of SM version `sm` (90 for Hopper). */
float tune_nvlink_bw(int sm);
/* Per-lane PCIe bandwidth (GB/s) for a sysfs link speed ("16.0 GT/s PCIe"); unknown -> Gen3. */
float tune_pcie_lane_bw(const char* link_speed);
/* Bandwidth (GB/s) between two CPU sockets of this kind (TUNE_CPU_* below). */
float tune_cpu_bw(int arch, int vendor, int model);

/* Speeds (GB/s per ring) the ring search tries, descending, ending with 0. */
extern const float tune_search_speeds[];

enum {
  TUNE_CPU_ARCH_UNKNOWN = 0,
  TUNE_CPU_ARCH_X86 = 1,
  TUNE_CPU_ARCH_ARM = 2,
  TUNE_CPU_ARCH_POWER = 3
};
enum {
  TUNE_CPU_VENDOR_UNKNOWN = 0,
  TUNE_CPU_VENDOR_INTEL = 1,
  TUNE_CPU_VENDOR_AMD = 2,
  TUNE_CPU_VENDOR_ZHAOXIN = 3
};
enum {
  TUNE_CPU_MODEL_UNKNOWN = 0,
  TUNE_CPU_MODEL_BDW = 1,
  TUNE_CPU_MODEL_SKL = 2,
  TUNE_CPU_MODEL_SRP = 3,
  TUNE_CPU_MODEL_ERP = 4
};

struct tune_plugin;

/* What the model derived from a communicator's topology (tune.c). */
struct tune_model {
  int nranks, nhosts;
  float lat[BRAID_COLL_COUNT][BRAID_ALGO_COUNT][BRAID_PROTO_COUNT]; /* µs */
  float busbw_ch[BRAID_COLL_COUNT][BRAID_ALGO_COUNT]
                [BRAID_PROTO_COUNT];               /* GB/s per channel, 0 = n/a */
  float ratio[BRAID_COLL_COUNT][BRAID_ALGO_COUNT]; /* algbw = busbw * ratio */
  int nchannels[BRAID_ALGO_COUNT];
  unsigned proto_topo_mask;                  /* protocols this topology supports */
  unsigned algo_override[BRAID_COLL_COUNT];  /* from BRAID_ALGO; ~0u = no override */
  unsigned proto_override[BRAID_COLL_COUNT]; /* from BRAID_PROTO */
  /* The names given positively ("ring,tree"); 0 for an exclusion ("^tree"), which only
     removes from what the model would pick, never adds what it would not. */
  unsigned algo_named[BRAID_COLL_COUNT];
  unsigned proto_named[BRAID_COLL_COUNT];
  int nthreads_override;                     /* BRAID_NTHREADS, 0 = automatic */
  struct tune_plugin* plugin;                /* the tuner plugin's instance, NULL: none */
};

#endif
