/*
 * The graph module's interface to the rest of Braid: what the machine looks
 * like, which rings and trees the channels follow, and what a collective of a
 * given size should use. Everything here is deterministic: every rank
 * computes the same answer from the same (exchanged) input.
 *
 * Ownership: the graph module owns comm->topo; topo_comm_init creates it,
 * topo_comm_free releases it. The structs returned by the accessors stay
 * valid until then.
 */
#ifndef BRAID_GRAPH_GRAPH_H
#define BRAID_GRAPH_GRAPH_H

#include <stddef.h>

#include "collectives/coll.h"
#include "nccl.h"

struct ncclComm;

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

/* The rings: `nchannels` permutations of the ranks; order[c * nranks + i] is the i-th rank of ring c. */
struct braid_rings {
  int nchannels;
  int nranks;
  int* order;
  float bw_per_channel; /* GB/s one ring channel can move */
};

/* The trees of channel c (double binary tree across nodes, chain inside). -1 = none. */
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

/*
 * Detects (or loads from BRAID_TOPO_FILE) this rank's node, exchanges it with
 * the other ranks through comm->bootstrap, merges the graphs per host,
 * computes paths and searches rings and trees. Collective over the comm;
 * needs comm->peers filled.
 */
ncclResult_t topo_comm_init(struct ncclComm* comm);
void topo_comm_free(struct ncclComm* comm);

const struct braid_rings* topo_comm_rings(const struct ncclComm* comm);
const struct braid_trees* topo_comm_trees(const struct ncclComm* comm);
/* Path type and bottleneck bandwidth (GB/s) between two ranks. */
braid_path_type_t topo_comm_path(const struct ncclComm* comm, int rank_a, int rank_b, float* bw);

/*
 * Chooses algorithm, protocol, channels and threads for `coll` moving `bytes`
 * (the per-rank message size as nccl-tests counts it). Honors BRAID_ALGO /
 * BRAID_PROTO. `available` masks (1 << algo) and (1 << proto) that the
 * caller can run.
 */
ncclResult_t tune_choose(const struct ncclComm* comm, braid_coll_t coll, size_t bytes,
                         unsigned algo_mask, unsigned proto_mask,
                         struct braid_tune_choice* out);

#endif
