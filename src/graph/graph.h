/*
 * The graph module's interface to the rest of Braid: what the machine looks
 * like, which rings and trees the channels follow, and what a collective of a
 * given size should use. Everything here is deterministic: every rank
 * computes the same answer from the same (exchanged) input.
 *
 * The graph knows nothing of communicators: the runtime (runtime/topo_comm.h)
 * gathers the hosts' descriptions and calls topo_build, and owns the
 * struct braid_topo it returns; topo_free releases it. The structs returned
 * by the accessors stay valid until then.
 */
#ifndef BRAID_GRAPH_GRAPH_H
#define BRAID_GRAPH_GRAPH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "abi/coll.h"
#include "nccl.h"

struct braid_topo;

/* How two ranks are connected, best first. Values match NCCL's PATH_* order. */
typedef enum {
  BRAID_PATH_LOC = 0, /* same GPU */
  BRAID_PATH_NVL = 1, /* NVLink, direct or through NVSwitch */
  BRAID_PATH_NVB = 2, /* NVLink through a bridge GPU */
  BRAID_PATH_PIX = 3, /* one PCIe switch */
  BRAID_PATH_PXB = 4, /* several PCIe switches, no host bridge */
  BRAID_PATH_PHB = 5, /* through a PCIe host bridge (CPU) */
  BRAID_PATH_SYS = 6, /* across CPU sockets */
  BRAID_PATH_NET = 7, /* through the network */
  BRAID_PATH_DIS = 8  /* not connected */
} braid_path_type_t;

/*
 * The rings: `nchannels` permutations of the ranks; order[c * nranks + i] is
 * the i-th rank of ring c. The ranks of a host are contiguous in every ring
 * (hosts in order of their first rank); across hosts the ring goes through
 * the NIC topo_channel_net names.
 */
struct braid_rings {
  int nchannels;
  int nranks;
  int* order;
  float bw_per_channel; /* GB/s one ring channel can move */
};

/*
 * The trees of channel c (double binary tree across nodes, chain inside);
 * -1 = none. Inside a host the chain follows the channel's ring from the GPU
 * nearest its NIC; the chain head's up is the parent host's head; its down[]
 * holds first the next rank of its chain (when there is one), then the child
 * hosts' heads. Even channels use the first binary tree, odd channels the
 * second. The root (up = -1) is the head of host 0 in the first tree; in the
 * second, of the last host (even host counts) or of host 1 (odd ones).
 */
struct braid_tree_node {
  int up;
  int down[3];
};
struct braid_trees {
  int nchannels;
  int nranks;
  struct braid_tree_node* nodes; /* [nchannels * nranks] */
  float bw_per_channel;
};

/* What the tuning model decided for one call. */
struct braid_tune_choice {
  braid_algo_t algo;
  braid_proto_t proto;
  int nchannels;
  int nthreads;
  float time_us; /* predicted */
};

/* The previous and next rank of `rank` in ring `channel`. */
void topo_ring_neighbors(const struct braid_rings* rings, int channel, int rank, int* prev,
                         int* next);
/* "NVL", "PIX", ... */
const char* topo_path_type_name(braid_path_type_t type);

/*
 * A topology built from NCCL topology XML files, one per host (unit tests,
 * braid-info). Host h runs ranks_per_host[h] ranks, numbered host after
 * host; the ranks of a host take its GPUs in `dev` order. Honors the same
 * parameters as a communicator's (BRAID_MIN/MAX_NCHANNELS, BRAID_ALGO/PROTO,
 * BRAID_NTHREADS) as they are when it is called. No GPU, bootstrap or
 * socket is used.
 */
ncclResult_t topo_build_from_files(const char* const* files, int nhosts, const int* ranks_per_host,
                                   struct braid_topo** out);
void topo_free(struct braid_topo* topo);
const struct braid_rings* topo_rings(const struct braid_topo* topo);
const struct braid_trees* topo_trees(const struct braid_topo* topo);
/* Path type and bottleneck bandwidth (GB/s) between two ranks. */
braid_path_type_t topo_path(const struct braid_topo* topo, int rank_a, int rank_b, float* bw);
/*
 * The network device `rank`'s host uses on `channel` (the ring arrives
 * there and leaves from there): its index as the topology numbers network
 * ports, and its name ("mlx5_0", "eth0") in *name. -1 (and *name NULL) when
 * the channel stays on that host or the host has no known NIC.
 */
int topo_channel_net(const struct braid_topo* topo, int channel, int rank, const char** name);
/*
 * Path from `rank`'s GPU to the network port called `name` ("mlx5_0"):
 * PIX/PXB mean the NIC shares the GPU's PCIe switch (GPUDirect RDMA is
 * worthwhile), PHB/SYS that traffic crosses the CPU. DIS when the host has
 * no such port.
 */
braid_path_type_t topo_net_path(const struct braid_topo* topo, int rank, const char* name,
                                float* bw);
/* Whether BRAID_PROTO names the protocols of `coll` (a force, not the model's choice). */
int tune_proto_named_topo(const struct braid_topo* topo, braid_coll_t coll);
/*
 * Chooses algorithm, protocol, channels and threads for `coll` moving `bytes`
 * (the per-rank message size as nccl-tests counts it). Honors BRAID_ALGO /
 * BRAID_PROTO, and within them the tuner plugin opened for `topo` (not for
 * send/receive, as NCCL). The masks hold (1 << algo) and (1 << proto) that
 * the caller can run.
 */
ncclResult_t tune_choose_topo(const struct braid_topo* topo, braid_coll_t coll, size_t bytes,
                              unsigned algo_mask, unsigned proto_mask,
                              struct braid_tune_choice* out);
/*
 * NCCL tuner plugins (NCCL_TUNER_PLUGIN, docs/tuning.md): loads the
 * process's tuner when none is loaded yet (NCCL's search: the setting as a
 * name or path, libnccl-tuner-<name>.so; unset, libnccl-tuner.so; then the
 * net plugin's library) and starts an instance of it for `topo` with the
 * topology's rank and host counts. From then on tune_choose_topo lets it
 * edit the model's cost table for each collective. No tuner asked for and
 * none found: nothing changes. One asked for but missing or of no known
 * version: a WARN, and the model decides. Fails (ncclInternalError, nothing
 * left open) when the plugin's own init fails, as NCCL fails the
 * communicator then.
 */
struct tune_plugin_args {
  uint64_t comm_id;    /* given to v5 tuners' init */
  const char* net_lib; /* the loaded net plugin's library file, searched last; NULL: none */
};
ncclResult_t tune_plugin_open(struct braid_topo* topo, const struct tune_plugin_args* args);
/* Finalizes topo's tuner instance; the library closes with its last user. Safe without one. */
void tune_plugin_close(struct braid_topo* topo);
/* One sentence: why the rings have this many channels. */
const char* topo_explain(const struct braid_topo* topo);
/* Writes the rings and trees as NCCL's graph XML (NCCL_GRAPH_DUMP_FILE), seen from host `host`. */
ncclResult_t topo_dump_graphs(const struct braid_topo* topo, int host, const char* path);

/*
 * braid-info --topo [--topo-file F] [--dot FILE]: prints the machine (this
 * one's visible GPUs as the ranks of one node, or the node `topo_file`
 * describes; NULL: BRAID_TOPO_FILE when set), the path matrix, the rings
 * and trees with their bandwidths and why, and the tuning choices for a few
 * sizes; `dot_file` (may be NULL) receives a Graphviz picture of the node,
 * BRAID_TOPO_DUMP_FILE (when set) its topology XML. Without a GPU and
 * without a file it says so and returns ncclSystemError.
 */
ncclResult_t topo_report(FILE* out, const char* topo_file, const char* dot_file);
/*
 * braid-info --topo --expect FILE: compares the node topo_report would
 * study with the node FILE describes, both as a communicator over all their
 * GPUs. GPU count and SM versions, every GPU-to-GPU path (type, bandwidth
 * within 1%) and the rings (channels, bandwidth) must match; other devices
 * (NICs, sockets, PCIe switches) are only noted. Prints every difference on
 * `out`; ncclInvalidUsage, naming the first, when one must-match differs.
 */
ncclResult_t topo_compare(FILE* out, const char* topo_file, const char* expect_file);

#endif
