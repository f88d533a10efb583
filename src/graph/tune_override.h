/*
 * BRAID_ALGO / BRAID_PROTO (NCCL_ALGO / NCCL_PROTO): which algorithms and
 * protocols the user allows, per collective.
 */
#ifndef BRAID_GRAPH_TUNE_OVERRIDE_H
#define BRAID_GRAPH_TUNE_OVERRIDE_H

#include "graph/tune_table.h"
#include "nccl.h"

/*
 * Fills m->algo_override / m->proto_override (~0u where the user said
 * nothing). Accepted, case-insensitive:
 *   "Ring"  "ring,tree"  "^tree" (all but)  "allreduce:tree,ring;allgather:ring"
 * NCCL's algorithm names Braid does not implement (CollNetDirect,
 * CollNetChain, NVLS, NVLSTree, PAT) are accepted and ignored. Anything else
 * is ncclInvalidUsage, naming the variable and the word.
 */
ncclResult_t tune_override_parse(struct tune_model* m);

#endif
