/*
 * Inside the graph module: what the tuning model (tune.c) asks of a tuner
 * plugin (tune_plugin.c). The runtime opens and closes one with
 * tune_plugin_open / tune_plugin_close (graph.h).
 */
#ifndef BRAID_GRAPH_TUNE_PLUGIN_H
#define BRAID_GRAPH_TUNE_PLUGIN_H

#include <stddef.h>

#include "abi/coll.h"
#include "nccl.h"

/* One topology's instance of the process's tuner plugin. */
struct tune_plugin;

/* In the tables below: not a candidate (NCCL's NCCL_ALGO_PROTO_IGNORE). */
#define TUNE_PLUGIN_IGNORE (-1.0f)

/*
 * Hands the plugin `cost` (predicted µs per algorithm and protocol, Braid's
 * numbering; TUNE_PLUGIN_IGNORE where not a candidate) for `coll` moving
 * `bytes`, in NCCL's table layout, and reads back what it made of the
 * candidates: their costs (negative: no longer a candidate), *changed when
 * it changed any, and *nchannels (0 when it did not ask). What it sets
 * outside the candidates stays out: Direct (NCCL has no number for it, the
 * plugin cannot weigh it), algorithms Braid lacks (CollNet, NVLS, PAT), and
 * what the caller or BRAID_ALGO / BRAID_PROTO exclude; when such an entry
 * is the plugin's pick, one INFO per instance and entry says it was
 * ignored. A
 * failing plugin is reported once per instance; the caller keeps the
 * model's choice.
 */
ncclResult_t tune_plugin_cost(struct tune_plugin* tp, braid_coll_t coll, size_t bytes,
                              float cost[BRAID_ALGO_COUNT][BRAID_PROTO_COUNT], int* nchannels,
                              int* changed);
/* "name (v5)": the plugin's own name and the interface version it was loaded with. */
const char* tune_plugin_label(const struct tune_plugin* tp);

#endif
