/*
 * Inside the graph module: the graph of one node (host) and the merged
 * topology of a communicator. Not for other modules: they use graph.h.
 *
 * A host is a `struct topo_system`: nodes (GPUs, PCI switches, NVSwitch,
 * CPUs/NUMA domains, NICs and their network ports) joined by directed links
 * with a bandwidth. Every link is added in both directions (full duplex), so
 * the search can charge each direction separately. It is built from NCCL's
 * topology XML (topo_xml.c), whether that XML came from a file or from
 * detection (topo_detect.c), so both paths share one set of rules.
 *
 * `struct braid_topo` (comm->topo) holds one system per host, the rank ->
 * GPU mapping, the rank-to-rank paths, the searched rings and trees and the
 * tuning model. Every rank builds it from the same exchanged XML, so every
 * rank computes the same result.
 */
#ifndef BRAID_GRAPH_TOPO_H
#define BRAID_GRAPH_TOPO_H

#include <stdint.h>

#include "graph/graph.h"
#include "graph/tune_table.h"
#include "graph/xml.h"

#define BRAID_MAX_RANKS_PER_HOST 128 /* GPUs of one host a communicator may use */

typedef enum {
  TOPO_GPU = 0,
  TOPO_PCI = 1, /* a PCIe switch (its upstream port) or bridge */
  TOPO_NVS = 2, /* the NVSwitch fabric, one node per host however many chips */
  TOPO_CPU = 3, /* a CPU socket / NUMA domain and its host bridge */
  TOPO_NIC = 4, /* a network adapter (PCI function) */
  TOPO_NET = 5, /* one network port of a NIC: what the net transport calls a device */
  TOPO_NODE_TYPES = 6
} topo_node_type_t;

/* Link types carry the path type they produce when traversed. */
typedef enum {
  TOPO_LINK_LOC = BRAID_PATH_LOC,
  TOPO_LINK_NVL = BRAID_PATH_NVL,
  TOPO_LINK_PCI = BRAID_PATH_PIX,
  TOPO_LINK_SYS = BRAID_PATH_SYS,
  TOPO_LINK_NET = BRAID_PATH_NET
} topo_link_type_t;

struct topo_link {
  int to;      /* node index in the same system */
  int type;    /* topo_link_type_t */
  float bw;    /* GB/s in this direction */
  float avail; /* what the search has not yet given to a channel */
};

struct topo_node {
  int type;   /* topo_node_type_t */
  int64_t id; /* bus id (GPU, PCI, NIC), NUMA id (CPU), device index (NET) */
  int line;   /* XML line it came from, for messages */
  int nlinks, cap_links;
  struct topo_link* links;
  union {
    struct {
      int dev, sm, gdr;
      int64_t mem_mib;
    } gpu;
    struct {
      int arch, vendor, model;
    } cpu;
    struct {
      uint64_t ids;
      float bw;
    } pci; /* vendor/device ids; bw of the link up */
    struct {
      char name[64];
      int dev, port, gdr, maxconn;
      float bw, latency;
      uint64_t guid;
    } net;
  } u;
};

/* A route between two nodes: the directed links it uses, in order. */
struct topo_path {
  int type;  /* braid_path_type_t */
  float bw;  /* bottleneck bandwidth, GB/s */
  int nhops; /* -1: not computed; 0 with type DIS: unreachable */
  int* hops; /* [2*nhops]: (node, link index in that node) pairs */
};

struct topo_system {
  char source[256]; /* file or "detected on <host>" */
  int p2p_disabled; /* BRAID_P2P_DISABLE: GPUs reach each other through host memory */
  int nnodes, cap_nodes;
  struct topo_node* nodes;
  struct topo_path* paths; /* [nnodes*nnodes], filled for GPU, NET and CPU sources */
};

/* ---- topo_system.c: the node graph ---- */
ncclResult_t topo_system_create(const char* source, struct topo_system** out);
void topo_system_free(struct topo_system* sys);
ncclResult_t topo_node_add(struct topo_system* sys, int type, int64_t id, int* index);
/* Index of the node of `type` with `id`, or -1. */
int topo_node_find(const struct topo_system* sys, int type, int64_t id);
/* Adds bw to the link a->b of `type` (creating it). One direction only. */
ncclResult_t topo_link_add(struct topo_system* sys, int a, int b, int type, float bw);
ncclResult_t topo_link_add_both(struct topo_system* sys, int a, int b, int type, float bw);
int topo_system_count(const struct topo_system* sys, int type);
/* The index of the n-th node of `type` in node order, or -1. */
int topo_system_nth(const struct topo_system* sys, int type, int n);
const char* topo_node_type_name(int type);
const char* topo_link_type_name(int type);
/* "GPU/0000:1b:00.0", "NET/mlx5_0", "CPU/0"... */
void topo_node_label(const struct topo_system* sys, int index, char* out, size_t size);

/* ---- topo_xml.c: NCCL topology XML <-> system ---- */
/* Builds a system from a parsed <system> document; errors name doc->source and the line. */
ncclResult_t topo_xml_to_system(const struct xml_doc* doc, struct topo_system** out);
/* Merges `src` into `dst`: elements matched by tag and key attribute, missing ones copied. */
ncclResult_t topo_xml_fuse(struct xml_doc* dst, const struct xml_doc* src);
/* Strict attribute readers: ncclInvalidUsage naming source, line, element and range. */
ncclResult_t topo_xml_int(const struct xml_doc* doc, const struct xml_node* node, const char* key,
                          int required, long long min, long long max, long long def,
                          long long* out);
ncclResult_t topo_xml_busid(const struct xml_doc* doc, const struct xml_node* node, const char* key,
                            int64_t* out);
/* Parses "dddd:bb:dd.f" or "bb:dd.f" (hex, any case); 0 on success. */
int topo_busid_parse(const char* text, int64_t* out);
/* The <gpu> under the <pci> of bus id `busid` anywhere under `node`, or NULL. */
struct xml_node* topo_xml_find_gpu(struct xml_node* node, int64_t busid);

/* ---- topo_paths.c: routes between nodes ---- */
/* Routes from every GPU and network port (and CPU) to every node; honors sys->p2p_disabled. */
ncclResult_t topo_paths_compute(struct topo_system* sys);
const struct topo_path* topo_path_get(const struct topo_system* sys, int from, int to);

/* ---- topo_detect.c: this process's view of its node, as NCCL topology XML ---- */
/* Adds the GPU at `busid` (CUDA device `cuda_dev`), its PCI chain, CPU, NVLinks and the NICs. */
ncclResult_t topo_detect_gpu(struct xml_doc* doc, const char* busid, int cuda_dev, int rank);
/* Every visible CUDA device, as one node (braid-info). */
ncclResult_t topo_detect_all(struct xml_doc** out, int* ngpus);

/* ---- the communicator's topology ---- */

/* Where the ring of a channel enters and leaves a host (multi-host only). */
struct topo_ring_net {
  int net; /* NET node index in the host's system, -1 when no NIC */
};

struct topo_host {
  struct topo_system* sys;
  int nranks;
  int* ranks;     /* global ranks on this host, ascending */
  uint64_t shape; /* hash of what the ring search reads from this host */
  int twin;       /* first host the search sees alike (itself if none): topo_twin.c */
};

struct braid_topo {
  int nranks;
  int nhosts;
  struct topo_host* hosts;
  int* rank_host;                 /* [nranks] */
  int* rank_gpu;                  /* [nranks] GPU node index in its host's system */
  float* rank_net_bw;             /* [nranks] GB/s from the rank's GPU to its best NIC */
  int min_sm;                     /* smallest SM version among the GPUs (90 for H100/H200) */
  int max_channels, min_channels; /* bounds the search honored */

  struct braid_rings rings;
  struct braid_trees trees;
  struct topo_ring_net* ring_nets;      /* [rings.nchannels * nhosts] */
  int ring_intra_type, ring_inter_type; /* worst path types the rings use */
  char search_why[1024];                /* one sentence: why this many channels */

  struct tune_model tune;
};

/* ---- topo_build.c ---- */
/* Channel bounds from the communicator's config (0 = none). */
struct topo_build_opts {
  int min_channels;
  int max_channels;
};
/*
 * Builds the topology from one merged XML document per host; `rank_busid`
 * gives each rank's GPU (NULL: the ranks of a host take its GPUs in `dev`
 * order). Takes nothing over: the caller still frees `docs`. `opts` may be NULL.
 */
ncclResult_t topo_build(struct xml_doc** docs, int nhosts, const int* rank_host,
                        const int64_t* rank_busid, int nranks, const struct topo_build_opts* opts,
                        struct braid_topo** out);

/* ---- topo_merge.c: per-rank descriptions -> one document per host ---- */
/*
 * Groups ranks into hosts by host_hash (hosts numbered in order of their
 * first rank) and merges each host's descriptions (texts[r], NCCL topology
 * XML) in rank order into docs[host], which the caller frees (docs has room
 * for nranks). hostnames (may be NULL) name the hosts in messages.
 */
ncclResult_t topo_merge_hosts(const char* const* texts, const uint64_t* host_hash,
                              const char* const* hostnames, int nranks, int* rank_host, int* nhosts,
                              struct xml_doc** docs);
/* BRAID_TOPO_DUMP_FILE: writes host `host`'s document, its GPUs marked with their ranks. */
ncclResult_t topo_dump_host(struct xml_doc* doc, int host, const int* rank_host,
                            const int64_t* rank_busid, int nranks, const char* path);

/* ---- topo_report.c / topo_compare.c: braid-info --topo ---- */
/*
 * The node braid-info studies, built as one communicator over all its GPUs:
 * `topo_file`, else (use_env) BRAID_TOPO_FILE, else detection; with use_env
 * also written to BRAID_TOPO_DUMP_FILE when that is set (saying so on `out`).
 */
ncclResult_t topo_node_load(FILE* out, const char* topo_file, int use_env,
                            struct braid_topo** topo);

/* ---- topo_twin.c ---- */
/* Sets every host's shape and twin; needs the hosts' systems, paths and rank_gpu. */
void topo_hosts_find_twins(struct braid_topo* topo);

/* ---- search_ring.c / search_tree.c ---- */
ncclResult_t search_rings(struct braid_topo* topo);
ncclResult_t search_trees(struct braid_topo* topo);
/* Binary tree over n positions (NCCL's layout); -1 where none. */
void search_btree(int n, int pos, int* up, int* down0, int* down1);
/* The two trees of the double binary tree, as positions 0..n-1. */
void search_dtree(int n, int pos, int* up0, int* d00, int* d01, int* up1, int* d10, int* d11);

/* ---- tune.c ---- */
ncclResult_t tune_model_init(struct braid_topo* topo);

#endif
