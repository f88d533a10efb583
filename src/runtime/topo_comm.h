/*
 * A communicator's topology and tuning: the runtime's side of the graph
 * module (graph/graph.h), which knows nothing of communicators. The comm
 * owns comm->topo; topo_comm_init creates it, topo_comm_free releases it.
 */
#ifndef BRAID_RUNTIME_TOPO_COMM_H
#define BRAID_RUNTIME_TOPO_COMM_H

#include "graph/graph.h"
#include "nccl.h"

struct ncclComm;

/*
 * Detects (or loads from BRAID_TOPO_FILE) this rank's node, exchanges it with
 * the other ranks through comm->bootstrap, merges the graphs per host,
 * computes paths and searches rings and trees. Collective over the comm;
 * needs comm->peers (bus_id, host_hash, hostname) and comm->config filled.
 * Honors BRAID_MIN/MAX_NCHANNELS, config.minCTAs/maxCTAs, BRAID_P2P_DISABLE,
 * BRAID_ALGO/PROTO, BRAID_NTHREADS; rank 0 writes BRAID_TOPO_DUMP_FILE and
 * BRAID_GRAPH_DUMP_FILE. Fails (ncclInvalidUsage) if ranks disagree on the
 * result, which only differing environments can cause.
 */
ncclResult_t topo_comm_init(struct ncclComm* comm);
void topo_comm_free(struct ncclComm* comm);

/* tune_choose_topo on the comm's topology (an internal error before topo_comm_init). */
ncclResult_t tune_choose(const struct ncclComm* comm, braid_coll_t coll, size_t bytes,
                         unsigned algo_mask, unsigned proto_mask,
                         struct braid_tune_choice* out);
/* Whether BRAID_PROTO names the protocols of `coll` (a force, not the model's choice). */
int tune_proto_named(const struct ncclComm* comm, braid_coll_t coll);

#endif
