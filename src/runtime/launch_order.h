/*
 * The order of a communicator's launches across streams and stream captures (enqueue.c's
 * launches and copy-engine exchanges go through it).
 *
 * A comm's kernels share its connections, so they run one after another whatever stream each
 * goes to: eagerly, each waits for the event recorded after the one before (when it went to
 * another stream); in a stream capture, each depends on the capture's kernel of this comm
 * before it (a graph edge added to its stream's capture). With graph mixing
 * (NCCL_GRAPH_MIXING_SUPPORT, on by default) a capture's first kernel also waits for the eager
 * event (an external wait node), and its last records it (a record node, enq_order_capture): a
 * replay then runs after whatever the host launched on this comm before it (an eager call,
 * another replay), and what the host launches after waits for the replay; from the first such
 * capture on, every eager launch waits for the event, whatever its stream.
 */
#ifndef BRAID_RUNTIME_LAUNCH_ORDER_H
#define BRAID_RUNTIME_LAUNCH_ORDER_H

#include <cuda_runtime.h>

#include "nccl.h"

struct ncclComm;
struct braid_capture;

struct enq_order {
  unsigned long long stream_id, cap_id;
  int capturing;
  struct braid_capture* cap; /* capturing: the capture's slot, NULL for its first kernel */
};

/*
 * Before a launch on `stream` (`capturing`: the stream is capturing): makes it wait for the
 * comm's previous launch where another stream or a capture holds it; fills *o for the record.
 */
ncclResult_t enq_order_wait(struct ncclComm* comm, cudaStream_t stream, int capturing,
                            struct enq_order* o);
/* After the launch: it becomes the one the next waits for (eagerly: an event; captured: a node). */
ncclResult_t enq_order_record(struct ncclComm* comm, cudaStream_t stream,
                              const struct enq_order* o);

#endif
